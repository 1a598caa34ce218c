//! node.env's proxy and the node's containerd configuration reach containerd (docs/contract.md,
//! "Proxies", "containerd configuration"): kiln-firstboot writes `/run/kiln/containerd.env`
//! (containerd.service's `EnvironmentFile=-`) and restarts the already running containerd
//! before kubelet is started, only when that file changed.

#![cfg(unix)]

use crate::common;

use common::{firstboot, Root};

/// Runs `kiln-firstboot run --provider none` with a systemctl stand-in that `fails` on
/// `restart` when asked to.
fn run(root: &Root, restart_fails: bool) -> common::Outcome {
    let body = if restart_fails {
        "case \"$1\" in restart) echo 'Job for containerd.service failed' >&2; exit 1;; esac\nexit 0"
    } else {
        "exit 0"
    };
    run_with(root, body)
}

/// Runs it with a systemctl stand-in whose script is `body`.
fn run_with(root: &Root, body: &str) -> common::Outcome {
    let systemctl = root.stub("systemctl", body);
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

const PROXY: &str = "HTTP_PROXY=http://proxy.example:3128\nHTTPS_PROXY=http://proxy.example:3128\n\
NO_PROXY=10.0.0.0/8,.cluster.local\n";

#[test]
fn a_proxy_is_written_for_containerd_and_containerd_restarted_before_kubelet() {
    let root = Root::node("");
    root.node_env(&format!("NODE_NAME=n1\nNODE_IP=10.0.0.5\n{PROXY}"));
    let out = run(&root, false);
    assert_eq!(out.code, 0, "{out:#?}");
    assert_eq!(
        root.read("run/kiln/containerd.env"),
        format!(
            "# Written by kiln-firstboot from /etc/kiln/node.env; see docs/contract.md.\n{PROXY}"
        )
    );
    // Only the proxy: nothing else of node.env reaches containerd.
    assert!(!root.read("run/kiln/containerd.env").contains("API_SERVER"));
    assert_eq!(
        root.calls("systemctl"),
        [
            "restart containerd.service",
            "start --no-block kubelet.service"
        ]
    );

    // A second run in the same boot finds containerd already has it: no restart.
    let out = run(&root, false);
    assert_eq!(out.code, 0, "{out:#?}");
    assert_eq!(
        root.calls("systemctl")[2..],
        ["start --no-block kubelet.service"]
    );

    // The proxy removed from node.env: the file goes, containerd restarts without it.
    root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\n");
    let out = run(&root, false);
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(!root.exists("run/kiln/containerd.env"));
    assert_eq!(
        root.calls("systemctl")[3..],
        [
            "restart containerd.service",
            "start --no-block kubelet.service"
        ]
    );
}

#[test]
fn no_proxy_no_file_and_no_restart() {
    let root = Root::node("");
    root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\n");
    let out = run(&root, false);
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(!root.exists("run/kiln/containerd.env"));
    assert_eq!(
        root.calls("systemctl"),
        ["start --no-block kubelet.service"]
    );
}

#[test]
fn a_failed_restart_stops_the_boot_before_kubelet() {
    let root = Root::node("");
    root.node_env(&format!("NODE_NAME=n1\nNODE_IP=10.0.0.5\n{PROXY}"));
    let out = run(&root, true);
    assert_eq!(out.code, 6, "{out:#?}");
    let status = root.read("run/kiln/status.json");
    assert!(status.contains("\"reason\":\"START_FAILED\""), "{status}");
    assert!(
        status.contains(
            "restarting containerd.service for the node's proxy or containerd configuration in /etc/kiln"
        ),
        "{status}"
    );
    assert_eq!(root.calls("systemctl"), ["restart containerd.service"]);
}

/// A layer with baked images has `kiln-images.service`, which nothing is ordered after: the
/// restart waits for the import (a blocking `start` of the unit) so that it cannot cut a
/// `ctr images import` short; a failed import does not stop the boot (the unit reports it).
#[test]
fn the_restart_waits_for_the_image_import_first() {
    for import_fails in [false, true] {
        let root = Root::node("");
        root.write("usr/lib/systemd/system/kiln-images.service", "[Service]\n");
        root.node_env(&format!("NODE_NAME=n1\nNODE_IP=10.0.0.5\n{PROXY}"));
        let body = if import_fails {
            "case \"$2\" in kiln-images.service) echo 'Job for kiln-images.service failed' >&2; exit 1;; esac\nexit 0"
        } else {
            "exit 0"
        };
        let out = run_with(&root, body);
        assert_eq!(out.code, 0, "{out:#?}");
        assert_eq!(
            root.calls("systemctl"),
            [
                "start kiln-images.service",
                "restart containerd.service",
                "start --no-block kubelet.service"
            ],
            "import fails: {import_fails}"
        );
    }
    // Without a proxy change there is no restart, and nothing waits for the import.
    let root = Root::node("");
    root.write("usr/lib/systemd/system/kiln-images.service", "[Service]\n");
    root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\n");
    let out = run(&root, false);
    assert_eq!(out.code, 0, "{out:#?}");
    // A `show` is only a look at kubelet's state (a loaded machine's kubelet stand-in may
    // not answer /healthz at the first try); what is started or restarted is the point.
    let acts: Vec<String> = root
        .calls("systemctl")
        .into_iter()
        .filter(|c| !c.starts_with("show "))
        .collect();
    assert_eq!(acts, ["start --no-block kubelet.service"]);
}

const FRAGMENT: &str = "etc/kiln/containerd/conf.d/provisioned.toml";

/// The image records the config version its containerd reads.
fn image_with_config_version(root: &Root, version: &str) {
    let env = root.read("usr/lib/kiln/image.env");
    root.write(
        "usr/lib/kiln/image.env",
        &format!("{env}CONTAINERD_CONFIG_VERSION={version}\n"),
    );
}

#[test]
fn the_node_containerd_configuration_restarts_containerd_once_and_again_when_it_changes() {
    let root = Root::node("");
    image_with_config_version(&root, "3");
    root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\n");
    root.write(
        FRAGMENT,
        "version = 3\n\n[plugins.'io.containerd.cri.v1.images']\n  max_concurrent_downloads = 5\n",
    );
    let out = run(&root, false);
    assert_eq!(out.code, 0, "{out:#?}");
    let env = root.read("run/kiln/containerd.env");
    let stamp = env
        .lines()
        .find_map(|l| l.strip_prefix("KILN_CONTAINERD_CONFIG="))
        .unwrap_or_else(|| panic!("no fingerprint in {env}"));
    assert_eq!(stamp.len(), 16, "{env}");
    // No proxy keys when node.env has none.
    assert!(!env.contains("PROXY"), "{env}");
    assert_eq!(
        root.calls("systemctl"),
        [
            "restart containerd.service",
            "start --no-block kubelet.service"
        ]
    );

    // Same file, same boot: containerd already has it.
    let out = run(&root, false);
    assert_eq!(out.code, 0, "{out:#?}");
    assert_eq!(
        root.calls("systemctl")[2..],
        ["start --no-block kubelet.service"]
    );

    // One value changed: a new fingerprint, a restart.
    root.write(
        FRAGMENT,
        "version = 3\n\n[plugins.'io.containerd.cri.v1.images']\n  max_concurrent_downloads = 6\n",
    );
    let out = run(&root, false);
    assert_eq!(out.code, 0, "{out:#?}");
    assert_ne!(root.read("run/kiln/containerd.env"), env);
    assert_eq!(
        root.calls("systemctl")[3..],
        [
            "restart containerd.service",
            "start --no-block kubelet.service"
        ]
    );

    // With a proxy too, both are in the one file.
    root.node_env(&format!("NODE_NAME=n1\nNODE_IP=10.0.0.5\n{PROXY}"));
    let out = run(&root, false);
    assert_eq!(out.code, 0, "{out:#?}");
    let env = root.read("run/kiln/containerd.env");
    assert!(
        env.contains("HTTPS_PROXY=") && env.contains("KILN_CONTAINERD_CONFIG="),
        "{env}"
    );
}

/// containerd 1.x skips a version-3 import without a word, and the image says which version
/// its containerd reads: a fragment of another version stops the run before anything is
/// written, naming the file, what was expected and what was found.
#[test]
fn a_fragment_of_another_config_version_is_refused_naming_both() {
    for (fragment, found) in [
        (
            "version = 2\n[plugins.'io.containerd.grpc.v1.cri']\n",
            "found `version = 2`",
        ),
        (
            "[plugins.'io.containerd.cri.v1.images']\nversion = 3\n",
            "found no version",
        ),
        ("", "found no version"),
    ] {
        let root = Root::node("");
        image_with_config_version(&root, "3");
        root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\n");
        root.write(FRAGMENT, fragment);
        let out = run(&root, false);
        assert_eq!(out.code, 3, "{fragment:?}: {out:#?}");
        for needle in [
            "etc/kiln/containerd/conf.d/provisioned.toml",
            "expected `version = 3`",
            "CONTAINERD_CONFIG_VERSION",
            found,
        ] {
            assert!(
                out.stderr.contains(needle),
                "{needle:?} not in {}",
                out.stderr
            );
        }
        assert!(!root.exists("run/kiln/containerd.env"));
        assert!(
            root.calls("systemctl").is_empty(),
            "{:?}",
            root.calls("systemctl")
        );
    }
    // An image that does not record its version (older than this contract key) is not
    // checked: containerd itself is the judge.
    let root = Root::node("");
    root.node_env("NODE_NAME=n1\nNODE_IP=10.0.0.5\n");
    root.write(FRAGMENT, "version = 2\n");
    assert_eq!(run(&root, false).code, 0);
}
