//! node.toml's `[[kubelet.credential_provider]]` on the node (docs/contract.md, "Image
//! credential providers"): with `/etc/kiln/credential-providers.json`, kubelet gets
//! `--image-credential-provider-config` and `--image-credential-provider-bin-dir` (the
//! image's `CREDENTIAL_PROVIDER_BIN_DIR`); a provider whose binary the image lacks stops the
//! run before anything is written, naming it (kubelet would exit 1 naming no path).

#![cfg(unix)]

use crate::common;

use common::{firstboot, Root};

const CONFIG: &str = r#"{"apiVersion":"kubelet.config.k8s.io/v1","kind":"CredentialProviderConfig","providers":[
{"name":"ecr-credential-provider","matchImages":["*.dkr.ecr.*.amazonaws.com"],"defaultCacheDuration":"12h","apiVersion":"credentialprovider.kubelet.k8s.io/v1"}]}"#;

fn run(root: &Root) -> common::Outcome {
    let systemctl = root.stub("systemctl", "exit 0");
    firstboot(
        root,
        &[
            "--provider",
            "none",
            "--systemctl",
            &systemctl,
            "--deadline",
            "10",
        ],
    )
}

fn kubelet_args(root: &Root) -> String {
    root.read("run/kiln/kubelet.env")
        .lines()
        .find(|l| l.starts_with("KUBELET_ARGS="))
        .unwrap()
        .to_string()
}

fn provider_binary(root: &Root, dir: &str, mode: u32) {
    root.write_mode(
        &format!("{dir}/ecr-credential-provider"),
        "#!/bin/sh\n",
        mode,
    );
}

#[test]
fn the_flags_name_the_config_and_the_image_bin_dir_only_when_configured() {
    let root = Root::node("");
    root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\nKUBELET_EXTRA_ARGS=\"--v=2\"\n");
    assert_eq!(run(&root).code, 0);
    assert!(
        !kubelet_args(&root).contains("credential"),
        "{}",
        kubelet_args(&root)
    );

    root.write_mode("etc/kiln/credential-providers.json", CONFIG, 0o600);
    provider_binary(&root, "usr/libexec/kiln/credential-providers", 0o755);
    let out = run(&root);
    assert_eq!(out.code, 0, "{out:#?}");
    let args = kubelet_args(&root);
    assert!(
        args.ends_with(
            " --image-credential-provider-config=/etc/kiln/credential-providers.json \
             --image-credential-provider-bin-dir=/usr/libexec/kiln/credential-providers --v=2\""
        ),
        "{args}"
    );

    // The image says where its providers are.
    let env = root.read("usr/lib/kiln/image.env");
    root.write(
        "usr/lib/kiln/image.env",
        &format!("{env}CREDENTIAL_PROVIDER_BIN_DIR=/opt/providers\n"),
    );
    provider_binary(&root, "opt/providers", 0o755);
    assert_eq!(run(&root).code, 0);
    assert!(
        kubelet_args(&root).contains("--image-credential-provider-bin-dir=/opt/providers "),
        "{}",
        kubelet_args(&root)
    );
}

#[test]
fn a_provider_the_image_does_not_carry_stops_the_run_naming_it() {
    for mode in [None, Some(0o644)] {
        let root = Root::node("");
        root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\n");
        root.write_mode("etc/kiln/credential-providers.json", CONFIG, 0o600);
        if let Some(m) = mode {
            provider_binary(&root, "usr/libexec/kiln/credential-providers", m);
        }
        let out = run(&root);
        assert_eq!(out.code, 3, "{mode:?}: {out:#?}");
        for needle in [
            "credential-providers.json: provider \"ecr-credential-provider\"",
            "expected its executable /usr/libexec/kiln/credential-providers/ecr-credential-provider",
            "CREDENTIAL_PROVIDER_BIN_DIR",
        ] {
            assert!(out.stderr.contains(needle), "{needle:?} not in {}", out.stderr);
        }
        assert!(!root.exists("run/kiln/kubelet.env"));
        assert!(root.calls("systemctl").is_empty());
    }
    // Not a config at all.
    let root = Root::node("");
    root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\n");
    root.write_mode(
        "etc/kiln/credential-providers.json",
        "{\"providers\": []}",
        0o600,
    );
    let out = run(&root);
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(
        out.stderr.contains("with `providers`, found none"),
        "{}",
        out.stderr
    );
}

/// The file is a secret (a provider's `env`): open to others, or a symlink, it is
/// `SECRET_MODE`, as the bootstrap credentials are.
#[test]
fn a_credential_provider_file_others_can_read_is_refused() {
    let root = Root::node("");
    root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\n");
    provider_binary(&root, "usr/libexec/kiln/credential-providers", 0o755);
    root.write_mode("etc/kiln/credential-providers.json", CONFIG, 0o644);
    let out = run(&root);
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(out.stderr.contains("SECRET_MODE"), "{}", out.stderr);
    assert!(
        out.stderr.contains("credential-providers.json"),
        "{}",
        out.stderr
    );
    assert!(!root.exists("run/kiln/kubelet.env"));
}
