//! JOIN_MODE=kubeadm with the real binary (issue 15): kubelet's command line is kubeadm's
//! systemd drop-in with kiln's node flags last, the node's KubeletConfiguration facts are in
//! kubeadm's patch before `kubeadm join` runs, a JoinConfiguration that would not apply that
//! patch is a warning, and kubeadm's failures and hangs are reported.

// kubeadm and systemctl are /bin/sh stand-ins here (tools/standin-kubeadm is the strict
// double, run in the `kubeadm_join` boot test).
#![cfg(unix)]

use crate::common;

use common::*;
use kiln_firstboot::json::{self, Value};
use kiln_firstboot::standin::aws_imdsv2;

/// IMDSv2 as EC2 enforces it (the same fixture as run_providers.rs).
fn imdsv2() -> Server {
    let base = fixtures().join("aws");
    let token = std::fs::read_to_string(base.join("latest/api/token")).unwrap();
    let hdrs = vec![
        ("Content-Type".to_string(), "text/plain".to_string()),
        ("Server".to_string(), "EC2ws".to_string()),
    ];
    Server::start(aws_imdsv2(token, move |r| fixture_reply(&base, &hdrs, r)))
}

fn start_ok(root: &Root, extra: &[&str], url: &str) -> Outcome {
    let systemctl = root.stub("systemctl", "exit 0");
    let mut args = vec![
        "--metadata-url",
        url,
        "--systemctl",
        &systemctl,
        "--deadline",
        "10",
    ];
    args.extend_from_slice(extra);
    let out = firstboot(root, &args);
    assert_eq!(out.code, 0, "{out:#?}");
    out
}

/// The JoinConfiguration `kiln render` writes names kiln's patch directory.
const RENDERED_JOIN: &str = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\n\
patches:\n  directory: \"/run/kiln/kubeadm-patches\"\n";

const PATCH: &str = "run/kiln/kubeadm-patches/kubeletconfiguration+strategic.json";

fn kubeadm_node(join_yaml: &str) -> Root {
    let root = Root::node("Amazon EC2");
    root.node_env(
        "JOIN_MODE=kubeadm\nNODE_LABELS=tier=web\nCLUSTER_DNS=10.96.0.10\nKUBELET_EXTRA_ARGS=--v=2\n",
    );
    std::fs::remove_file(root.path("etc/kiln/bootstrap-token")).unwrap();
    root.write_mode("etc/kiln/kubeadm-join.yaml", join_yaml, 0o600);
    root
}

fn warnings(root: &Root) -> Vec<String> {
    let status = json::parse(&root.read("run/kiln/status.json")).unwrap();
    status
        .get("warnings")
        .and_then(Value::as_array)
        .unwrap_or_default()
        .iter()
        .map(|w| w.as_text().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn kubeadm_join_mode() {
    let root = kubeadm_node(RENDERED_JOIN);
    // kubeadm join reads the patch (so it must be there first) and leaves kubelet.conf behind,
    // as the real one does.
    let kubeadm = root.stub(
        "kubeadm",
        &format!(
            "test -f '{0}/{PATCH}' || exit 3; mkdir -p '{0}/etc/kubernetes' && touch '{0}/etc/kubernetes/kubelet.conf'",
            root.dir.display()
        ),
    );
    let srv = imdsv2();
    start_ok(&root, &["--kubeadm", &kubeadm], &srv.url);
    let join = root.path("etc/kiln/kubeadm-join.yaml");
    assert_eq!(
        root.calls("kubeadm"),
        [format!("join --config {}", join.display())]
    );
    // containerd first (kubeadm's preflight needs the runtime up); kubeadm starts kubelet.
    assert_eq!(
        root.calls("systemctl"),
        ["start containerd.service"],
        "kubeadm starts kubelet itself"
    );
    // kubeadm's drop-in (10-kubeadm.conf): its kubeconfig, bootstrap kubeconfig and config
    // file; then the flag-only facts learnt at boot, then node.env's extra args, last.
    let env = root.read("run/kiln/kubelet.env");
    let args = env
        .lines()
        .find_map(|l| l.strip_prefix("KUBELET_ARGS="))
        .unwrap_or_else(|| panic!("{env}"));
    assert_eq!(
        args,
        "\"--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf \
--kubeconfig=/etc/kubernetes/kubelet.conf --config=/var/lib/kubelet/config.yaml \
--config-dir=/run/kiln/kubelet.conf.d --hostname-override=ip-10-0-3-7.eu-west-1.compute.internal --node-ip=10.0.3.7 \
--node-labels=tier=web --v=2\""
    );
    // The KubeletConfiguration facts, for kubeadm to apply over the cluster's kubelet-config.
    let text = root.read(PATCH);
    let patch = json::parse(&text).unwrap();
    let field = |k: &str| patch.get(k).and_then(Value::as_text).unwrap_or_default();
    assert_eq!(
        field("apiVersion"),
        "kubelet.config.k8s.io/v1beta1",
        "{text}"
    );
    assert_eq!(field("kind"), "KubeletConfiguration");
    assert_eq!(
        field("containerRuntimeEndpoint"),
        "unix:///run/containerd/containerd.sock"
    );
    assert_eq!(field("providerID"), "aws:///eu-west-1a/i-0abc123def4567890");
    assert_eq!(patch.get("maxPods").and_then(Value::as_u64), Some(29));
    assert_eq!(
        patch.get("clusterDNS"),
        Some(&Value::Array(vec![Value::String("10.96.0.10".into())]))
    );
    // Only KubeletConfiguration fields: kubelet would refuse (strictly) anything else.
    let known = [
        "apiVersion",
        "kind",
        "containerRuntimeEndpoint",
        "providerID",
        "maxPods",
        "kubeReserved",
        "systemReserved",
        "evictionHard",
        "clusterDNS",
    ];
    let Value::Object(members) = &patch else {
        panic!("{text}")
    };
    for (k, _) in members {
        assert!(known.contains(&k.as_str()), "{k} in {text}");
    }
    assert!(warnings(&root).is_empty(), "{:?}", warnings(&root));

    // Already joined: the second run does not join again, it only starts kubelet (after the
    // first run's containerd start).
    start_ok(&root, &["--kubeadm", &kubeadm], &srv.url);
    assert_eq!(root.calls("kubeadm").len(), 1);
    assert_eq!(
        root.calls("systemctl"),
        [
            "start containerd.service",
            "start --no-block kubelet.service"
        ]
    );
}

#[test]
fn a_join_configuration_without_kilns_patch_directory_is_a_warning() {
    // Hand-written: kubeadm would write config.yaml without kiln's provider ID and max pods.
    let root = kubeadm_node("apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\n");
    let kubeadm = root.stub(
        "kubeadm",
        &format!(
            "mkdir -p '{0}/etc/kubernetes' && touch '{0}/etc/kubernetes/kubelet.conf'",
            root.dir.display()
        ),
    );
    let srv = imdsv2();
    let out = start_ok(&root, &["--kubeadm", &kubeadm], &srv.url);
    let w = warnings(&root);
    assert_eq!(w.len(), 1, "{w:?}");
    assert!(
        w[0].contains(
            "/etc/kiln/kubeadm-join.yaml names no patches.directory /run/kiln/kubeadm-patches"
        ) && w[0].contains("provider ID, max pods, reservations"),
        "{w:?}"
    );
    assert!(
        out.stderr.contains("names no patches.directory"),
        "{}",
        out.stderr
    );
    // Another directory is no better: kubeadm would not read kiln's file.
    let root = kubeadm_node(&RENDERED_JOIN.replace("/run/kiln/kubeadm-patches", "/etc/patches"));
    let kubeadm = root.stub(
        "kubeadm",
        &format!(
            "mkdir -p '{0}/etc/kubernetes' && touch '{0}/etc/kubernetes/kubelet.conf'",
            root.dir.display()
        ),
    );
    start_ok(&root, &["--kubeadm", &kubeadm], &srv.url);
    assert_eq!(warnings(&root).len(), 1, "{:?}", warnings(&root));
}

#[test]
fn kubelet_mode_writes_no_kubeadm_patch() {
    let root = Root::node("Amazon EC2");
    let srv = imdsv2();
    start_ok(&root, &[], &srv.url);
    assert!(!root.exists(PATCH));
    assert!(warnings(&root).is_empty(), "{:?}", warnings(&root));
    let env = root.read("run/kiln/kubelet.env");
    assert!(
        env.contains("--kubeconfig=/var/lib/kubelet/kubeconfig")
            && !env.contains("/etc/kubernetes/"),
        "{env}"
    );
}

#[test]
fn kubeadm_failure_is_reported_with_its_output() {
    let root = Root::node("Amazon EC2");
    root.node_env("JOIN_MODE=kubeadm\n");
    root.write_mode(
        "etc/kiln/kubeadm-join.yaml",
        "kind: JoinConfiguration\n",
        0o600,
    );
    let kubeadm = root.stub("kubeadm", "echo \"error execution phase preflight: couldn't validate the identity of the API Server\" >&2; exit 1");
    let systemctl = root.stub("systemctl", "exit 0");
    let srv = imdsv2();
    let out = firstboot(
        &root,
        &[
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
            "--kubeadm",
            &kubeadm,
            "--deadline",
            "10",
        ],
    );
    assert_eq!(out.code, 6, "{out:#?}");
    assert!(out.stderr.contains("KUBEADM_FAILED"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("exited with status 1: error execution phase preflight"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_kubeadm_that_outlives_the_deadline_is_stopped() {
    let root = Root::node("Amazon EC2");
    root.node_env("JOIN_MODE=kubeadm\n");
    std::fs::remove_file(root.path("etc/kiln/bootstrap-token")).unwrap();
    root.write_mode(
        "etc/kiln/kubeadm-join.yaml",
        "kind: JoinConfiguration\n",
        0o600,
    );
    let kubeadm = root.stub("kubeadm", "exec sleep 30");
    let systemctl = root.stub("systemctl", "exit 0");
    let srv = imdsv2();
    let out = firstboot(
        &root,
        &[
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
            "--kubeadm",
            &kubeadm,
            "--deadline",
            "2",
        ],
    );
    assert_eq!(out.code, 6, "{out:#?}");
    assert!(
        out.stderr.contains("KUBEADM_FAILED")
            && out.stderr.contains("still running at the deadline"),
        "{}",
        out.stderr
    );
    assert!(
        out.elapsed < std::time::Duration::from_secs(6),
        "{:?}",
        out.elapsed
    );
}

#[test]
fn kubeadm_errors_outlive_its_warnings_and_its_output_is_kept() {
    // As real kubeadm v1.36 on a bookworm guest: warnings enough to fill the cap, then the
    // preflight error.
    let root = Root::node("Amazon EC2");
    root.node_env("JOIN_MODE=kubeadm\n");
    root.write_mode(
        "etc/kiln/kubeadm-join.yaml",
        "kind: JoinConfiguration\n",
        0o600,
    );
    let warn = "W0115 10:00:00.000000    1234 checks.go:1] The fallback for runtimes without RuntimeConfig is deprecated and will be removed in 1.37. For more information see the kubelet docs";
    let script = format!(
        "echo '[preflight] Running pre-flight checks'; i=0; while [ $i -lt 6 ]; do echo '{warn}' >&2; i=$((i+1)); done; \
         printf 'error execution phase preflight: [preflight] Some fatal errors occurred:\\n\\t[ERROR SystemVerification]: missing required cgroups: cpu\\n[preflight] If you know what you are doing, you can make a check non-fatal with `--ignore-preflight-errors=...`\\nTo see the stack trace of this error execute with --v=5 or higher\\n' >&2; exit 1"
    );
    let kubeadm = root.stub("kubeadm", &script);
    let systemctl = root.stub("systemctl", "exit 0");
    let srv = imdsv2();
    let out = firstboot(
        &root,
        &[
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
            "--kubeadm",
            &kubeadm,
            "--deadline",
            "10",
        ],
    );
    assert_eq!(out.code, 6, "{out:#?}");
    let status = json::parse(&root.read("run/kiln/status.json")).unwrap();
    let text = |k: &str| {
        status
            .get(k)
            .and_then(Value::as_text)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(text("reason"), "KUBEADM_FAILED");
    let m = text("message");
    assert!(
        m.starts_with("kubeadm join exited with status 1: error execution phase preflight: [preflight] Some fatal errors occurred: | [ERROR SystemVerification]: missing required cgroups: cpu"),
        "{m}"
    );
    assert!(!m.contains("1.37"), "{m}");
    assert!(
        text("hint").contains("/run/kiln/kubeadm-join.log"),
        "{}",
        text("hint")
    );
    // The whole output, warnings too, readable by root alone.
    use std::os::unix::fs::PermissionsExt;
    let log = root.path("run/kiln/kubeadm-join.log");
    assert_eq!(
        std::fs::metadata(&log).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let saved = root.read("run/kiln/kubeadm-join.log");
    assert_eq!(saved.matches("removed in 1.37").count(), 6, "{saved}");
    assert!(
        saved.contains("[ERROR SystemVerification]")
            && saved.contains("[preflight] Running pre-flight checks"),
        "{saved}"
    );
}

/// `KUBELET_SERVER_TLS_BOOTSTRAP=true` (node.toml's `[kubelet] server_tls_bootstrap`) is one
/// behaviour in both join modes: kubeadm's patch sets `serverTLSBootstrap`, kubelet mode passes
/// the same setting as kubelet's flag; a serving certificate the cluster has not signed 10 s
/// after the join is a warning, one it has signed is none. Unset, neither is written (the
/// kubelet configuration decides).
#[test]
fn server_tls_bootstrap_is_one_switch_for_both_join_modes() {
    const SERVING: &str = "var/lib/kubelet/pki/kubelet-server-current.pem";
    let srv = imdsv2();
    // kubeadm mode, no approver: the patch asks for it and the join is followed by a warning.
    let root = kubeadm_node(RENDERED_JOIN);
    let mut env = root.read("etc/kiln/node.env");
    env.push_str("KUBELET_SERVER_TLS_BOOTSTRAP=true\n");
    root.write("etc/kiln/node.env", &env);
    let kubeadm = root.stub(
        "kubeadm",
        &format!(
            "mkdir -p '{0}/etc/kubernetes' && touch '{0}/etc/kubernetes/kubelet.conf'",
            root.dir.display()
        ),
    );
    start_ok(
        &root,
        &["--kubeadm", &kubeadm, "--deadline", "60"],
        &srv.url,
    );
    let patch = json::parse(&root.read(PATCH)).unwrap();
    assert_eq!(
        patch.get("serverTLSBootstrap"),
        Some(&Value::Bool(true)),
        "{}",
        root.read(PATCH)
    );
    let w = warnings(&root);
    assert!(
        w.len() == 1
            && w[0].contains("serving certificate is not issued yet")
            && w[0].contains("kubectl certificate approve"),
        "{w:?}"
    );

    // kubelet mode, an approver: the field in the node's drop-in (not the deprecated flag),
    // and no warning once the certificate exists.
    let root = Root::node("Amazon EC2");
    root.node_env("KUBELET_SERVER_TLS_BOOTSTRAP=true\nKUBELET_EXTRA_ARGS=--v=2\n");
    root.write(SERVING, "signed by the cluster\n");
    start_ok(&root, &[], &srv.url);
    let env = root.read("run/kiln/kubelet.env");
    let dropin = root.read("run/kiln/kubelet.conf.d/10-kiln-node.conf");
    assert!(
        dropin.ends_with(",\"serverTLSBootstrap\":true}\n")
            && !env.contains("--rotate-server-certificates")
            && env.contains("--v=2\""),
        "the switch in the drop-in: {env}\n{dropin}"
    );
    assert!(warnings(&root).is_empty(), "{:?}", warnings(&root));

    // Unset: kubelet's and the cluster's own configuration decide.
    let root = kubeadm_node(RENDERED_JOIN);
    start_ok(&root, &["--kubeadm", &kubeadm], &srv.url);
    assert_eq!(patch_field(&root, "serverTLSBootstrap"), None);
    let plain = Root::node("Amazon EC2");
    start_ok(&plain, &[], &srv.url);
    assert!(!plain
        .read("run/kiln/kubelet.env")
        .contains("rotate-server-certificates"));

    // Anything but true or false is refused, naming the key.
    let bad = Root::node("Amazon EC2");
    bad.node_env("KUBELET_SERVER_TLS_BOOTSTRAP=yes\n");
    let systemctl = bad.stub("systemctl", "exit 0");
    let out = firstboot(
        &bad,
        &["--metadata-url", &srv.url, "--systemctl", &systemctl],
    );
    assert_ne!(out.code, 0, "{out:#?}");
    let status = bad.read("run/kiln/status.json");
    assert!(
        status.contains("KUBELET_SERVER_TLS_BOOTSTRAP") && status.contains("true or false"),
        "{status}"
    );
}

fn patch_field(root: &Root, key: &str) -> Option<Value> {
    json::parse(&root.read(PATCH)).unwrap().get(key).cloned()
}
