//! Bad input and misbehaving metadata services, against the real binary: each gives its
//! documented exit code and reason within the deadline, names what was wrong, and leaves
//! no partially written file behind.

// These tests play systemctl, kubeadm and friends with /bin/sh stand-ins and check Unix
// modes; the Windows build is tested under Wine by tests/windows.rs (make test-windows).
#![cfg(unix)]

use crate::common;
#[path = "../../testkit/deadline.rs"]
mod deadline;
#[path = "../../testkit/optout.rs"]
mod optout;

use std::time::Duration;

use common::*;
use deadline::{bounded, ended_at_deadline};

/// Runs firstboot for AWS against `url` with a short deadline and a recording systemctl.
fn aws(root: &Root, url: &str, deadline: &str) -> Outcome {
    let systemctl = root.stub("systemctl", "exit 0");
    firstboot(
        root,
        &[
            "--provider",
            "aws",
            "--metadata-url",
            url,
            "--systemctl",
            &systemctl,
            "--deadline",
            deadline,
        ],
    )
}

/// IMDSv2 from fixtures, except that `fault` may answer a route first.
fn imds_with(fault: impl Fn(&Req) -> Option<Reply> + Send + Sync + 'static) -> Server {
    let base = fixtures().join("aws");
    Server::start(move |r| {
        if let Some(reply) = fault(r) {
            return reply;
        }
        if r.route() == "/latest/api/token" {
            return ok("TOKEN-abc");
        }
        fixture_reply(&base, &[], r)
    })
}

/// The failure left nothing under /run but its report (status.json and the failure files,
/// never the success sentinel) and never called the service manager.
fn nothing_written(root: &Root) {
    assert_eq!(
        root.run_files(),
        [
            "run/cluster-api/bootstrap-failure.reason",
            "run/kiln/failure",
            "run/kiln/status.json"
        ],
        "left behind: {:?}",
        root.run_files()
    );
    assert!(root
        .read("run/kiln/status.json")
        .contains("\"result\":\"failure\""));
    assert!(root.calls("systemctl").is_empty());
}

#[test]
fn token_put_401_is_the_hop_limit() {
    for code in [401u16, 403] {
        let root = Root::node("");
        let srv = Server::start(move |_| status(code));
        let out = aws(&root, &srv.url, "10");
        assert_eq!(out.code, 4, "{out:#?}");
        assert!(out.stderr.contains("METADATA_HOP_LIMIT"), "{}", out.stderr);
        assert!(
            out.stderr.contains(&format!("found HTTP {code}"))
                && out.stderr.contains("/latest/api/token"),
            "{}",
            out.stderr
        );
        assert!(
            out.stderr.contains("HttpPutResponseHopLimit"),
            "the hint: {}",
            out.stderr
        );
        assert_eq!(
            srv.requests()
                .iter()
                .filter(|r| r.route() == "/latest/api/token")
                .count(),
            1,
            "no retries on 401/403"
        );
        nothing_written(&root);
    }
}

#[test]
fn http_500_forever_ends_at_the_deadline() {
    let root = Root::node("");
    let srv = Server::start(|_| status(500));
    let out = aws(&root, &srv.url, "2");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_UNREACHABLE") && out.stderr.contains("answered HTTP 500"),
        "{}",
        out.stderr
    );
    ended_at_deadline(out.elapsed, 2);
    assert!(srv.requests().len() > 2, "transient errors are retried");
    nothing_written(&root);
}

#[test]
fn a_listener_that_never_answers_ends_at_the_deadline() {
    let root = Root::node("");
    let (_listener, url) = silent_listener();
    let out = aws(&root, &url, "2");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_UNREACHABLE") && out.stderr.contains("timed out"),
        "{}",
        out.stderr
    );
    bounded(out.elapsed, 2);
    nothing_written(&root);
}

#[test]
fn a_server_that_accepts_and_hangs_ends_at_the_deadline() {
    let root = Root::node("");
    let srv = Server::start(|_| Reply::Hang);
    let out = aws(&root, &srv.url, "1");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_UNREACHABLE"),
        "{}",
        out.stderr
    );
    bounded(out.elapsed, 1);
    nothing_written(&root);
}

#[test]
fn nothing_listening_ends_at_the_deadline() {
    let root = Root::node("");
    let (l, url) = silent_listener();
    drop(l);
    let out = aws(&root, &url, "1");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_UNREACHABLE") && out.stderr.contains("cannot connect"),
        "{}",
        out.stderr
    );
    nothing_written(&root);
}

#[test]
fn a_slow_body_past_the_deadline_fails() {
    let root = Root::node("");
    let srv = imds_with(|r| {
        (r.route() == "/latest/meta-data/instance-id")
            .then(|| Reply::Slow(b"i-0abc123def4567890".to_vec(), Duration::from_millis(300)))
    });
    let out = aws(&root, &srv.url, "2");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_UNREACHABLE") && out.stderr.contains("instance-id"),
        "{}",
        out.stderr
    );
    bounded(out.elapsed, 2);
    nothing_written(&root);
}

#[test]
fn a_slow_body_within_the_deadline_succeeds() {
    let root = Root::node("");
    let srv = imds_with(|r| {
        (r.route() == "/latest/meta-data/instance-type")
            .then(|| Reply::Slow(b"m5.large".to_vec(), Duration::from_millis(20)))
    });
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(root
        .read("run/kiln/kubelet.env")
        .contains("INSTANCE_TYPE=m5.large\n"));
}

#[test]
fn truncated_bodies_are_retried_then_reported() {
    let root = Root::node("");
    let srv = imds_with(|r| {
        (r.route() == "/latest/meta-data/instance-id")
            .then(|| Reply::Raw(b"HTTP/1.1 200 OK\r\nContent-Length: 19\r\n\r\ni-0abc".to_vec()))
    });
    let out = aws(&root, &srv.url, "1");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr
            .contains("connection closed after 6 of 19 body bytes"),
        "{}",
        out.stderr
    );
    nothing_written(&root);
}

#[test]
fn oversized_answers_are_refused_at_once() {
    let root = Root::node("");
    let srv = imds_with(|r| {
        (r.route() == "/latest/meta-data/instance-id")
            .then(|| Reply::Http(200, vec![], vec![b'i'; 2 * 1024 * 1024]))
    });
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_INVALID")
            && out.stderr.contains("exceeds the 1048576-byte limit"),
        "{}",
        out.stderr
    );
    assert_eq!(
        srv.requests()
            .iter()
            .filter(|r| r.route() == "/latest/meta-data/instance-id")
            .count(),
        1,
        "not retried"
    );
    nothing_written(&root);

    let root = Root::node("");
    let huge_headers = format!("HTTP/1.1 200 OK\r\nX-Pad: {}\r\n\r\n", "p".repeat(20_000));
    let srv = imds_with(move |r| {
        (r.route() == "/latest/api/token").then(|| Reply::Raw(huge_headers.clone().into_bytes()))
    });
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(out.stderr.contains("headers exceed"), "{}", out.stderr);
}

#[test]
fn non_utf8_answers_name_the_byte() {
    let root = Root::node("");
    let srv = imds_with(|r| {
        (r.route() == "/latest/meta-data/instance-type")
            .then(|| Reply::Http(200, vec![], b"m5.\xfflarge".to_vec()))
    });
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_INVALID") && out.stderr.contains("byte 0xff at offset 3"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("/latest/meta-data/instance-type"),
        "{}",
        out.stderr
    );
    nothing_written(&root);
}

#[test]
fn a_404_on_an_optional_key_is_fine_and_on_a_required_key_is_not() {
    // placement/region is optional: the region comes from the zone.
    let root = Root::node("");
    let srv =
        imds_with(|r| (r.route() == "/latest/meta-data/placement/region").then(|| status(404)));
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(root
        .read("run/kiln/kubelet.env")
        .contains("ZONE=eu-west-1a\nREGION=eu-west-1\n"));

    let root = Root::node("");
    let srv = imds_with(|r| (r.route() == "/latest/meta-data/instance-id").then(|| status(404)));
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("METADATA_INVALID")
            && out
                .stderr
                .contains("instance-id: expected HTTP 200, found HTTP 404"),
        "{}",
        out.stderr
    );
    nothing_written(&root);
}

#[test]
fn a_503_then_200_is_retried_to_success() {
    let root = Root::node("");
    let hits = std::sync::atomic::AtomicUsize::new(0);
    let srv = imds_with(move |r| {
        (r.route() == "/latest/meta-data/instance-id"
            && hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2)
            .then(|| status(503))
    });
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 0, "{out:#?}");
    let n = srv
        .requests()
        .iter()
        .filter(|r| r.route() == "/latest/meta-data/instance-id")
        .count();
    assert_eq!(n, 3);
}

#[test]
fn redirects_to_another_host_are_refused() {
    let root = Root::node("");
    let srv = imds_with(|r| {
        (r.route() == "/latest/meta-data/instance-id").then(|| {
            Reply::Http(
                302,
                vec![("Location".into(), "http://127.0.0.2:1/steal".into())],
                vec![],
            )
        })
    });
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr.contains("refused redirect to another host"),
        "{}",
        out.stderr
    );
}

#[test]
fn a_same_host_redirect_is_followed() {
    let root = Root::node("");
    let srv = imds_with(|r| match r.route() {
        "/latest/meta-data/instance-id" => Some(Reply::Http(
            301,
            vec![("Location".into(), "/moved/instance-id".into())],
            vec![],
        )),
        "/moved/instance-id" => Some(ok("i-0moved")),
        _ => None,
    });
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(root
        .read("run/kiln/kubelet.env")
        .contains("INSTANCE_ID=i-0moved\n"));
}

#[test]
fn malformed_json_names_the_url_and_offset() {
    let root = Root::node("");
    let srv = Server::start(|_| ok("{\"compute\":{\"vmId\":\"x\",}"));
    let systemctl = root.stub("systemctl", "exit 0");
    let out = firstboot(
        &root,
        &[
            "--provider",
            "azure",
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
        ],
    );
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr
            .contains("/metadata/instance?api-version=2021-02-01: invalid JSON at byte 23"),
        "{}",
        out.stderr
    );
    nothing_written(&root);
}

#[test]
fn json_missing_a_field_names_it() {
    let root = Root::node("");
    let doc = std::fs::read_to_string(fixtures().join("azure/metadata/instance"))
        .unwrap()
        .replace("\"vmSize\"", "\"vmSizeX\"");
    let srv = Server::start(move |_| ok(&doc));
    let systemctl = root.stub("systemctl", "exit 0");
    let out = firstboot(
        &root,
        &[
            "--provider",
            "azure",
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
        ],
    );
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.stderr
            .contains("expected the field compute/vmSize, found none"),
        "{}",
        out.stderr
    );
}

// ---- configuration ----

fn config_run(root: &Root) -> Outcome {
    let systemctl = root.stub("systemctl", "exit 0");
    firstboot(
        root,
        &[
            "--provider",
            "none",
            "--systemctl",
            &systemctl,
            "--deadline",
            "5",
        ],
    )
}

fn expect_config(root: &Root, reason: &str, needles: &[&str]) {
    let out = config_run(root);
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(out.stderr.contains(reason), "{}", out.stderr);
    for n in needles {
        assert!(out.stderr.contains(n), "missing {n:?} in {}", out.stderr);
    }
    nothing_written(root);
}

#[test]
fn missing_files_and_keys() {
    let root = Root::node("");
    std::fs::remove_file(root.path("etc/kiln/node.env")).unwrap();
    expect_config(
        &root,
        "CONFIG_MISSING",
        &["etc/kiln/node.env: required file not found"],
    );

    let root = Root::node("");
    root.write(
        "etc/kiln/node.env",
        "KILN_CONTRACT=1\nAPI_SERVER=https://127.0.0.1:6443\n",
    );
    expect_config(
        &root,
        "CONFIG_MISSING",
        &["required key CLUSTER_NAME is missing"],
    );

    let root = Root::node("");
    std::fs::remove_file(root.path("etc/kiln/bootstrap-token")).unwrap();
    expect_config(
        &root,
        "CONFIG_MISSING",
        &[
            "etc/kiln/bootstrap-kubeconfig or",
            "etc/kiln/bootstrap-token",
        ],
    );

    let root = Root::node("");
    std::fs::remove_file(root.path("etc/kiln/ca.crt")).unwrap();
    expect_config(
        &root,
        "CONFIG_MISSING",
        &["etc/kiln/ca.crt: required file not found"],
    );
}

#[test]
fn unknown_contract_versions() {
    let root = Root::node("");
    root.write(
        "etc/kiln/node.env",
        "KILN_CONTRACT=2\nAPI_SERVER=https://127.0.0.1:6443\nCLUSTER_NAME=t\n",
    );
    expect_config(
        &root,
        "CONTRACT_VERSION",
        &["etc/kiln/node.env: KILN_CONTRACT: expected 1, found \"2\""],
    );

    let root = Root::node("");
    let image = root
        .read("usr/lib/kiln/image.env")
        .replace("KILN_CONTRACT=1\n", "");
    root.write("usr/lib/kiln/image.env", &image);
    expect_config(
        &root,
        "CONTRACT_VERSION",
        &["usr/lib/kiln/image.env: KILN_CONTRACT: expected 1, found no such key"],
    );
}

#[test]
fn malformed_lines_name_file_and_line() {
    let root = Root::node("");
    root.node_env("NODE_LABELS = role=worker\n");
    expect_config(
        &root,
        "CONFIG_INVALID",
        &["etc/kiln/node.env: line 4: whitespace around '='"],
    );

    let root = Root::node("");
    root.node_env("MAX_PODS=many\n");
    expect_config(
        &root,
        "CONFIG_INVALID",
        &["MAX_PODS: expected a positive integer, found \"many\""],
    );

    let root = Root::node("");
    root.write_bytes("etc/kiln/node.env", b"KILN_CONTRACT=1\nCLUSTER_NAME=\xff\n");
    expect_config(&root, "CONFIG_INVALID", &["expected UTF-8 text"]);

    let root = Root::node("");
    root.write("usr/lib/kiln/max-pods.map", "m5.large twenty\n");
    expect_config(
        &root,
        "CONFIG_INVALID",
        &["max-pods.map: line 1: expected a positive pod count"],
    );
}

#[test]
fn secrets_must_be_private_and_are_never_printed() {
    let root = Root::node("");
    std::fs::set_permissions(
        root.path("etc/kiln/bootstrap-token"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    expect_config(
        &root,
        "SECRET_MODE",
        &["bootstrap-token: expected mode 0600, found 0644"],
    );

    let root = Root::node("");
    root.write_mode(
        "etc/kiln/bootstrap-token",
        "ABCDEF.secretsecretsecret\n",
        0o600,
    );
    let out = config_run(&root);
    assert_eq!(out.code, 3);
    assert!(
        out.stderr.contains("the value is not printed") && !out.stderr.contains("secretsecret"),
        "{}",
        out.stderr
    );
}

#[test]
fn usage_errors_exit_2() {
    let root = Root::empty();
    for args in [
        &["--bogus"][..],
        &["--deadline", "0"],
        &["--provider", "ec2"],
    ] {
        let out = firstboot(&root, args);
        assert_eq!(out.code, 2, "{args:?}: {out:#?}");
        assert!(out.stderr.contains("--help"), "{}", out.stderr);
    }
}

#[test]
fn help_and_version() {
    let bin = env!("CARGO_BIN_EXE_kiln-firstboot");
    let out = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    for flag in [
        "--root",
        "--provider",
        "--metadata-url",
        "--systemctl",
        "--console",
        "--no-start",
        "--deadline",
    ] {
        assert!(text.contains(flag), "{flag}");
    }
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("kiln-firstboot {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn an_unwritable_run_dir_is_write_failed() {
    // /run/kiln is a file, not a directory: nothing under it can be written, whoever we are.
    let root = Root::node("QEMU");
    root.write(
        "sys/firmware/qemu_fw_cfg/by_name/opt/kiln/instance-id/raw",
        "q1",
    );
    root.write("run/kiln", "not a directory\n");
    let out = config_run_with(&root, &["--provider", "qemu"]);
    assert_eq!(out.code, 5, "{out:#?}");
    assert!(
        out.stderr.contains("WRITE_FAILED") && out.stderr.contains("run/kiln/"),
        "{}",
        out.stderr
    );
    assert!(root.calls("systemctl").is_empty());
    assert_eq!(root.read("run/kiln"), "not a directory\n");
}

#[test]
fn the_deadline_comes_from_node_env_unless_the_flag_says_otherwise() {
    let root = Root::node("");
    root.node_env("KILN_DEADLINE=1\n");
    let (_listener, url) = silent_listener();
    let systemctl = root.stub("systemctl", "exit 0");
    let out = firstboot(
        &root,
        &[
            "--provider",
            "aws",
            "--metadata-url",
            &url,
            "--systemctl",
            &systemctl,
        ],
    );
    assert_eq!(out.code, 4, "{out:#?}");
    // The default deadline is 300 s: ending within 1 s + SLACK shows node.env's was used.
    bounded(out.elapsed, 1);

    let out = firstboot(
        &root,
        &[
            "--provider",
            "aws",
            "--metadata-url",
            &url,
            "--systemctl",
            &systemctl,
            "--deadline",
            "2",
        ],
    );
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(
        out.elapsed >= Duration::from_millis(1900),
        "--deadline 2 wins: {:?}",
        out.elapsed
    );
}

#[test]
fn a_429_is_retried() {
    let root = Root::node("");
    let hits = std::sync::atomic::AtomicUsize::new(0);
    let srv = imds_with(move |r| {
        (r.route() == "/latest/api/token"
            && hits.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 1)
            .then(|| status(429))
    });
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 0, "{out:#?}");
    let puts = srv.requests().iter().filter(|r| r.method == "PUT").count();
    assert_eq!(puts, 2);
}

fn config_run_with(root: &Root, extra: &[&str]) -> Outcome {
    let systemctl = root.stub("systemctl", "exit 0");
    let mut args = vec!["--systemctl", systemctl.as_str(), "--deadline", "5"];
    args.extend_from_slice(extra);
    firstboot(root, &args)
}

#[test]
fn a_secret_owned_by_someone_else_is_refused() {
    let root = Root::node("");
    let token = root.path("etc/kiln/bootstrap-token");
    match std::os::unix::fs::chown(&token, Some(4242), None) {
        Ok(()) => {}
        // Only root can give a file away; as anyone else this case cannot be set up.
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return optout::cannot_run("root", &format!("chown needs root ({e})"));
        }
        Err(e) => panic!("chown {}: {e}", token.display()),
    }
    expect_config(
        &root,
        "SECRET_MODE",
        &["bootstrap-token: expected to be owned by root, found owner uid 4242"],
    );
}

#[test]
fn chunked_answers_are_read() {
    let root = Root::node("");
    let srv = imds_with(|r| {
        (r.route() == "/latest/meta-data/local-hostname").then(|| {
            Reply::Raw(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nip-10\r\n6;ext=1\r\n-0-3-7\r\n0\r\n\r\n"
                    .to_vec(),
            )
        })
    });
    let out = aws(&root, &srv.url, "10");
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(root
        .read("run/kiln/kubelet.env")
        .contains("NODE_NAME=ip-10-0-3-7\n"));
}
