//! Shared helpers of the render tests: a real CA made by openssl in a temp dir, node.toml
//! fixtures, and the kiln binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// A bootstrap token used only by tests.
pub const TOKEN: &str = "07401b.f395accd246ae52d";

/// Runs a command, panicking with its stderr when it fails.
pub fn run(cmd: &mut Command) -> std::process::Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Makes a self-signed CA with the real openssl; `kind` is `ec` or `rsa`.
pub fn make_ca(dir: &Path, kind: &str) -> PathBuf {
    let cert = dir.join(format!("ca-{kind}.crt"));
    let key = dir.join(format!("ca-{kind}.key"));
    let newkey: &[&str] = match kind {
        "ec" => &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
        _ => &["-newkey", "rsa:2048"],
    };
    run(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=kiln-test-ca",
        ])
        .args(newkey)
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    cert
}

/// The CA public-key pin computed the way kubeadm's docs compute it:
/// `openssl x509 -pubkey | openssl pkey -pubin -outform der | sha256sum`.
pub fn openssl_spki_pin(cert: &Path) -> String {
    let pubkey = run(Command::new("openssl")
        .args(["x509", "-pubkey", "-noout", "-in"])
        .arg(cert))
    .stdout;
    let dir = cert.parent().unwrap();
    let pem = dir.join("pub.pem");
    std::fs::write(&pem, pubkey).unwrap();
    let der = run(Command::new("openssl")
        .args(["pkey", "-pubin", "-outform", "der", "-in"])
        .arg(&pem))
    .stdout;
    let der_path = dir.join("pub.der");
    std::fs::write(&der_path, der).unwrap();
    let sum = run(Command::new("sha256sum").arg(&der_path)).stdout;
    format!(
        "sha256:{}",
        String::from_utf8(sum)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
    )
}

/// A full node.toml exercising every section, with the CA at `ca.crt` beside it.
pub fn full_node_toml(join_mode: &str) -> String {
    format!(
        r#"# a worker in prod-eu1
api_server = "https://127.0.0.1:6443"
cluster_name = "prod-eu1"
join_mode = "{join_mode}"
provider = "aws"
deadline = 600

[ca]
file = "ca.crt"

[bootstrap]
token = "{TOKEN}"

[node]
name = "worker-1"
ip = "10.0.3.7"
labels = {{ "node.kubernetes.io/role" = "worker", tier = "web" }}
taints = [{{ key = "gpu", value = "true", effect = "NoSchedule" }}, {{ key = "dedicated", effect = "NoExecute" }}]
max_pods = 58

[kubelet]
extra_args = ["--v=2", "--serialize-image-pulls=false"]
cluster_dns = ["10.96.0.10"]

[proxy]
http = "http://proxy.internal:3128"
https = "http://proxy.internal:3128"
no_proxy = ["10.0.0.0/8", ".svc", "localhost", "169.254.169.254"]

[[containerd.registry]]
host = "registry.internal:5000"
mirrors = ["https://mirror-a.internal", {{ url = "http://cache.internal:5000/prefix", capabilities = ["pull"] }}]
ca = {{ file = "./ca.crt" }}

[[containerd.registry]]
host = "docker.io"
mirrors = ["https://hub-mirror.internal"]
"#
    )
}

/// A temp dir holding `node.toml` (from `toml`) and an EC CA as `ca.crt`.
pub fn node_dir(toml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let ca = make_ca(dir.path(), "ec");
    std::fs::copy(&ca, dir.path().join("ca.crt")).unwrap();
    std::fs::write(dir.path().join("node.toml"), toml).unwrap();
    dir
}

/// The kiln binary under test.
pub fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

/// Asserts kiln-firstboot's own contract reader accepts the `/etc/kiln/` tree under `root`
/// (with a minimal image.env beside it) and sees the values node.toml asked for.
pub fn firstboot_accepts(root: &Path, join_mode: &str) {
    let image = root.join("usr/lib/kiln");
    std::fs::create_dir_all(&image).unwrap();
    std::fs::write(
        image.join("image.env"),
        "KILN_CONTRACT=1\nKILN_IMAGE_ID=sha256:00\nKILN_IMAGE_NAME=test\nKILN_VERSION=0.1.0\n\
         KILN_OS=linux\nKILN_ARCH=amd64\nKUBERNETES_VERSION=v1.30.0-test\n",
    )
    .unwrap();
    let config = kiln_firstboot::config::load(
        &kiln_firstboot::contract::paths::NodePaths::under(root),
        None,
    )
    .unwrap_or_else(|e| panic!("kiln-firstboot refused what kiln render wrote: {e}"));
    assert_eq!(config.node.api_server, "https://127.0.0.1:6443");
    assert_eq!(
        config.node.node_labels,
        "node.kubernetes.io/role=worker,tier=web"
    );
    assert_eq!(
        config.node.kubelet_extra_args,
        "--v=2 --serialize-image-pulls=false"
    );
    assert_eq!(
        config.node.provider,
        Some(kiln_firstboot::contract::Provider::Aws)
    );
    assert_eq!(config.deadline_secs, 600);
    let inputs = config.sizing_inputs("m5.large", Err("no machine in this test"), None);
    let sized = kiln_firstboot::sizing::decide(&config.sizing, inputs);
    assert_eq!(sized.max_pods.value, 58);
    match join_mode {
        "kubeadm" => assert_eq!(
            config.credential,
            kiln_firstboot::config::Credential::KubeadmJoin
        ),
        _ => assert_eq!(
            config.credential,
            kiln_firstboot::config::Credential::Token(TOKEN.to_string())
        ),
    }
}

/// Debian 12's Ignition (2.14, package `ignition`): its real engine and its validator.
pub const IGNITION: &str = "/usr/lib/dracut/modules.d/30ignition/ignition";
pub const IGNITION_VALIDATE: &str = "/usr/bin/ignition-validate";

/// Runs real Ignition's `fetch-offline` (which must succeed) and `files` stages on `config`
/// into a fresh sysroot under `work`; returns the sysroot and the `files` stage's output.
pub fn run_ignition(work: &Path, config: &Path) -> (PathBuf, std::process::Output) {
    // A no-op stand-in for SELinux's `setfiles`: Debian builds Ignition with relabelling on,
    // and the temp sysroot has no policy to relabel with. Everything else is real Ignition.
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::write(bin.join("setfiles"), "#!/bin/sh\ncat >/dev/null\n").unwrap();
    std::fs::set_permissions(
        bin.join("setfiles"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sysroot = work.join("sysroot");
    std::fs::create_dir_all(sysroot.join("etc/selinux")).unwrap();
    std::fs::write(
        sysroot.join("etc/selinux/config"),
        "SELINUX=disabled\nSELINUXTYPE=targeted\n",
    )
    .unwrap();
    let stage = |stage: &str| {
        Command::new(IGNITION)
            .env("IGNITION_CONFIG_FILE", config)
            .env("PATH", &path)
            .args(["-platform", "file", "-log-to-stdout", "-stage", stage])
            .arg("-root")
            .arg(&sysroot)
            .arg("-config-cache")
            .arg(work.join("ignition.json"))
            .arg("-state-file")
            .arg(work.join("state"))
            .arg("-neednet")
            .arg(work.join("neednet"))
            .output()
            .expect("ignition is installed by scripts/deps.sh")
    };
    let fetch = stage("fetch-offline");
    assert!(fetch.status.success(), "fetch-offline: {fetch:?}");
    let files = stage("files");
    (sysroot, files)
}
