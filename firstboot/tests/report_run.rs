//! Reporting during `kiln-firstboot run` on the real binary: status.json after every phase,
//! the wait phases against a loopback `/healthz` and a client certificate that appears (or
//! not), diagnosis on timeout and on kubelet's death, the console (present, missing, stuck),
//! the sentinel and failure files, and a crash between phases.

// These tests play systemctl, kubeadm and friends with /bin/sh stand-ins and check Unix
// modes; the Windows build is tested under Wine by tests/windows.rs (make test-windows).
#![cfg(unix)]

use crate::common;
#[path = "../../testkit/deadline.rs"]
mod deadline;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fixture_reply, fixtures, ok, status, Outcome, Reply, Root, Server};

const CERT: &str = "var/lib/kubelet/pki/kubelet-client-current.pem";

/// IMDSv2 from the aws fixtures.
fn imds() -> Server {
    let base = fixtures().join("aws");
    Server::start(move |r| {
        if r.route() == "/latest/api/token" {
            return ok("TOKEN-abc");
        }
        fixture_reply(&base, &[], r)
    })
}

/// `run` for AWS with `extra` flags; the only thing added is a kubelet journal holding its
/// registered line when the test names no `--journalctl`.
fn run(root: &Root, url: &str, extra: &[&str]) -> Outcome {
    let mut extra = extra.to_vec();
    let journalctl;
    if !extra.contains(&"--journalctl") {
        journalctl = common::registered_journal(root);
        extra.extend(["--journalctl", journalctl.as_str()]);
    }
    Outcome::of(
        Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
            .args(["run", "--provider", "aws", "--metadata-url", url])
            .arg("--root")
            .arg(&root.dir)
            .args(&extra),
    )
}

fn phases(json: &str) -> Vec<(String, String, u64, Option<u64>)> {
    let doc = kiln_firstboot::json::parse(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let Some(kiln_firstboot::json::Value::Array(ps)) = doc.get("phases") else {
        panic!("no phases in {json}")
    };
    ps.iter()
        .map(|p| {
            let t = |k: &str| p.get(k).and_then(|v| v.as_text()).unwrap_or("").to_string();
            (
                t("name"),
                t("result"),
                t("start_ms").parse().unwrap(),
                p.get("end_ms")
                    .and_then(|v| v.as_text())
                    .map(|v| v.parse().unwrap()),
            )
        })
        .collect()
}

#[test]
fn a_joining_node_reports_every_phase_and_the_sentinel() {
    let root = Root::node("Amazon EC2");
    let srv = imds();
    // kubelet gets healthy on the third probe; its TLS bootstrap completes 400 ms later.
    let cert = root.path(CERT);
    let probes = std::sync::atomic::AtomicUsize::new(0);
    let healthz = Server::start(move |_| {
        let n = probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if n < 3 {
            return status(503);
        }
        if n == 3 {
            let cert = cert.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(400));
                std::fs::create_dir_all(cert.parent().unwrap()).unwrap();
                std::fs::write(
                    &cert,
                    "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
                )
                .unwrap();
            });
        }
        ok("ok")
    });
    let systemctl = root.stub("systemctl", "exit 0");
    let console = root.path("console.log");
    let out = run(
        &root,
        &srv.url,
        &[
            "--systemctl",
            &systemctl,
            "--healthz-url",
            &format!("{}/healthz", healthz.url),
            "--console",
            console.to_str().unwrap(),
            "--deadline",
            "20",
        ],
    );
    assert_eq!(out.code, 0, "{out:#?}");
    let json = root.read("run/kiln/status.json");
    assert!(
        json.starts_with("{\"kiln_contract\":1,\"kiln_version\":\"0.1.0\",\"image_id\":\"sha256:3f0c1b2a3f0c1b2a3f0c1b2a3f0c1b2a\",\"provider\":\"aws\",\"node_name\":\"ip-10-0-3-7.eu-west-1.compute.internal\",\"result\":\"success\",\"phases\":["),
        "{json}"
    );
    let ps = phases(&json);
    let names: Vec<&str> = ps.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "config",
            "metadata",
            "write",
            "start-kubelet",
            "wait-healthy",
            "wait-joined"
        ]
    );
    let mut last = 0;
    for (name, result, start, end) in &ps {
        assert_eq!(result, "success", "{name}");
        let end = end.expect("ended");
        assert!(
            *start >= last && end >= *start,
            "{name}: {start}..{end} after {last}"
        );
        last = end;
    }
    // The join wait really waited for the certificate.
    let joined = &ps[5];
    assert!(joined.3.unwrap() - joined.2 >= 200, "{joined:?}");
    assert_eq!(
        root.read("run/cluster-api/bootstrap-success.complete"),
        "success\n"
    );
    assert!(!root.exists("run/kiln/failure"));
    assert!(!root.exists("run/cluster-api/bootstrap-failure.reason"));

    // One line per phase, then the whole status behind the fixed prefix.
    let con = root.read("console.log");
    let lines: Vec<&str> = con.lines().collect();
    assert_eq!(lines.len(), 7, "{con}");
    for (line, name) in lines.iter().zip(&names) {
        assert!(
            line.starts_with(&format!("kiln-firstboot: phase={name} result=success ms=")),
            "{line}"
        );
    }
    assert!(lines[1].ends_with(" provider=aws"), "{}", lines[1]);
    assert!(lines[4].ends_with(" polls=3"), "{}", lines[4]);
    assert_eq!(lines[6].strip_prefix("KILN-STATUS "), Some(json.trim_end()));
}

#[test]
fn a_kubelet_that_never_gets_healthy_is_diagnosed_at_the_deadline() {
    let root = Root::node("Amazon EC2");
    let srv = imds();
    let healthz = Server::start(|_| status(503));
    let systemctl = root.stub("systemctl", "exit 0");
    let logs = fixtures().join("logs/api-x509");
    let journalctl = root.stub(
        "journalctl",
        &format!(
            "case \"$*\" in *kubelet.service*) cat '{}/kubelet.log';; esac",
            logs.display()
        ),
    );
    let console = root.path("console.log");
    let out = run(
        &root,
        &srv.url,
        &[
            "--systemctl",
            &systemctl,
            "--journalctl",
            &journalctl,
            "--healthz-url",
            &format!("{}/healthz", healthz.url),
            "--console",
            console.to_str().unwrap(),
            "--deadline",
            "3",
        ],
    );
    assert_eq!(out.code, 7, "{out:#?}");
    deadline::bounded(out.elapsed, 3);
    assert!(out.stderr.contains("API_X509"), "{}", out.stderr);
    let json = root.read("run/kiln/status.json");
    assert!(
        json.contains(
            "\"result\":\"failure\",\"reason\":\"API_X509\",\"message\":\"kubelet: E0115"
        ),
        "{json}"
    );
    let ps = phases(&json);
    assert_eq!(ps.len(), 5, "{json}");
    assert_eq!(
        (ps[4].0.as_str(), ps[4].1.as_str()),
        ("wait-healthy", "failure")
    );
    assert!(json.contains("{\"name\":\"wait-healthy\""), "{json}");
    assert!(
        json.contains("\"result\":\"failure\",\"reason\":\"API_X509\"}]"),
        "{json}"
    );
    assert_eq!(
        root.read("run/kiln/failure").lines().next(),
        Some("API_X509")
    );
    assert!(!root.exists("run/cluster-api/bootstrap-success.complete"));
    let con = root.read("console.log");
    assert!(
        con.contains("kiln-firstboot: phase=wait-healthy result=failure ms=")
            && con.contains(" reason=API_X509\n"),
        "{con}"
    );
}

#[test]
fn a_dead_kubelet_ends_the_wait_early() {
    let root = Root::node("Amazon EC2");
    let srv = imds();
    let healthz = Server::start(|_| status(503));
    // systemd's view: kubelet failed for good.
    let systemctl = root.stub(
        "systemctl",
        "case \"$*\" in show*kubelet*) printf 'ActiveState=failed\\nResult=exit-code\\nExecMainStatus=1\\nNRestarts=5\\n';;\nshow*containerd*) printf 'ActiveState=active\\nResult=success\\nExecMainStatus=0\\nNRestarts=0\\n';; esac; exit 0",
    );
    let logs = fixtures().join("logs/swap");
    let journalctl = root.stub(
        "journalctl",
        &format!(
            "case \"$*\" in *kubelet.service*) cat '{}/kubelet.log';; esac",
            logs.display()
        ),
    );
    let out = run(
        &root,
        &srv.url,
        &[
            "--systemctl",
            &systemctl,
            "--journalctl",
            &journalctl,
            "--healthz-url",
            &format!("{}/healthz", healthz.url),
            "--console",
            root.path("console.log").to_str().unwrap(),
            "--deadline",
            "600",
        ],
    );
    assert_eq!(out.code, 7, "{out:#?}");
    deadline::ended_early(out.elapsed, 600);
    let json = root.read("run/kiln/status.json");
    assert!(json.contains("\"reason\":\"SWAP_ENABLED\""), "{json}");
    assert!(
        json.contains("\"units\":[{\"name\":\"kubelet.service\",\"active_state\":\"failed\""),
        "{json}"
    );
}

#[test]
fn a_missing_console_is_skipped_with_a_warning() {
    let root = Root::node("Amazon EC2");
    let srv = imds();
    let healthz = Server::start(|_| ok("ok"));
    root.write(
        CERT,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    let systemctl = root.stub("systemctl", "exit 0");
    let out = run(
        &root,
        &srv.url,
        &[
            "--systemctl",
            &systemctl,
            "--healthz-url",
            &format!("{}/healthz", healthz.url),
            "--console",
            root.path("no/such/dir/ttyS0").to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(
        out.stderr.contains("warning: console") && out.stderr.contains("no/such/dir/ttyS0"),
        "{}",
        out.stderr
    );
    assert!(root
        .read("run/kiln/status.json")
        .contains("\"result\":\"success\""));
}

#[cfg(target_os = "linux")]
#[test]
fn a_stuck_console_never_blocks_the_boot() {
    use std::os::unix::fs::OpenOptionsExt;
    let root = Root::node("Amazon EC2");
    let srv = imds();
    let healthz = Server::start(|_| ok("ok"));
    root.write(
        CERT,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    let systemctl = root.stub("systemctl", "exit 0");
    let fifo = root.path("console.fifo");
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // A reader that never reads, and a pipe already full: every write would block.
    let _reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(0o4000)
        .open(&fifo)
        .unwrap();
    let mut filler = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(0o4000)
        .open(&fifo)
        .unwrap();
    let chunk = [b'x'; 4096];
    while filler.write(&chunk).is_ok() {}
    let out = run(
        &root,
        &srv.url,
        &[
            "--systemctl",
            &systemctl,
            "--healthz-url",
            &format!("{}/healthz", healthz.url),
            "--console",
            fifo.to_str().unwrap(),
            "--deadline",
            "600",
        ],
    );
    assert_eq!(out.code, 0, "{out:#?}");
    // A console write that blocked would hold the run until its deadline.
    deadline::ended_early(out.elapsed, 600);
    assert!(
        out.stderr
            .contains("did not take a line (took nothing for 2 s)"),
        "{}",
        out.stderr
    );
    // Warned once, not once per line.
    assert_eq!(
        out.stderr.matches("did not take a line").count(),
        1,
        "{}",
        out.stderr
    );
}

#[test]
fn a_crash_between_phases_leaves_a_true_status() {
    let root = Root::node("Amazon EC2");
    // The metadata service takes the token request and then never answers.
    let srv = Server::start(|r| {
        if r.route() == "/latest/api/token" {
            ok("TOKEN-abc")
        } else {
            Reply::Hang
        }
    });
    let systemctl = root.stub("systemctl", "exit 0");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
        .args(["run", "--provider", "aws", "--metadata-url", &srv.url])
        .arg("--root")
        .arg(&root.dir)
        .args(["--systemctl", &systemctl, "--deadline", "60", "--console"])
        .arg(root.path("console.log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let path = root.path("run/kiln/status.json");
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        if text.contains("{\"name\":\"metadata\"") {
            break;
        }
        assert!(Instant::now() < until, "metadata phase never began: {text}");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Power cut in the middle of the metadata phase.
    child.kill().unwrap();
    child.wait().unwrap();
    let json = root.read("run/kiln/status.json");
    assert!(json.contains("\"result\":\"running\""), "{json}");
    let ps = phases(&json);
    assert_eq!(ps.len(), 2, "{json}");
    assert_eq!((ps[0].0.as_str(), ps[0].1.as_str()), ("config", "success"));
    assert_eq!(
        (ps[1].0.as_str(), ps[1].1.as_str(), ps[1].3),
        ("metadata", "running", None)
    );
    assert!(!root.exists("run/cluster-api/bootstrap-success.complete"));
    // `status` reads it back and says the run never finished.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
        .args(["status", "--root"])
        .arg(&root.dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(8));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("kiln-firstboot: running"), "{text}");
    assert!(text.contains("  metadata       running"), "{text}");
}

#[test]
fn no_start_succeeds_without_claiming_a_join() {
    let root = Root::node("Amazon EC2");
    let srv = imds();
    let out = run(
        &root,
        &srv.url,
        &[
            "--no-start",
            "--console",
            root.path("console.log").to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, 0, "{out:#?}");
    let json = root.read("run/kiln/status.json");
    let ps = phases(&json);
    let results: Vec<(&str, &str)> = ps.iter().map(|p| (p.0.as_str(), p.1.as_str())).collect();
    assert_eq!(
        results,
        [
            ("config", "success"),
            ("metadata", "success"),
            ("write", "success"),
            ("start-kubelet", "skipped"),
            ("wait-healthy", "skipped"),
            ("wait-joined", "skipped")
        ]
    );
    assert!(!root.exists("run/cluster-api/bootstrap-success.complete"));
}

#[test]
fn a_config_kubelet_decoded_leniently_is_a_warning_in_the_status() {
    // kubelet 1.36 with a config field it does not know: it logs the strict decoding error,
    // goes on with the lenient result (k8s.io/kubelet codec) and joins. The run succeeds and
    // says so in status.json's warnings and on the console.
    let root = Root::node("Amazon EC2");
    let srv = imds();
    let systemctl = root.stub("systemctl", "exit 0");
    let journalctl = root.stub(
        "journalctl",
        &format!(
            r#"case "$*" in *kubelet.service*) echo 'I0115 10:12:01.104223    1234 codec.go:82] "Using lenient decoding as strict decoding failed" err="strict decoding error: unknown field \"maxPod\""'; echo '{}';; esac"#,
            common::REGISTERED
        ),
    );
    let out = common::firstboot(
        &root,
        &[
            "--provider",
            "aws",
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
            "--journalctl",
            &journalctl,
            "--deadline",
            "20",
        ],
    );
    assert_eq!(out.code, 0, "{out:#?}");
    let doc = kiln_firstboot::json::parse(&root.read("run/kiln/status.json")).unwrap();
    assert_eq!(doc.get("result").and_then(|v| v.as_text()), Some("success"));
    let warnings: Vec<&str> = doc
        .get("warnings")
        .and_then(|w| w.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_text()).collect())
        .unwrap_or_default();
    let w = warnings
        .iter()
        .find(|w| w.contains("lenient decoding"))
        .unwrap_or_else(|| panic!("no lenient-decoding warning in {warnings:?}"));
    assert!(w.contains("unknown field \"maxPod\""), "{w}");
    assert!(w.contains("/usr/lib/kiln/kubelet-config.yaml"), "{w}");
    assert!(
        root.read("console.log").contains("unknown field"),
        "the console lacks it"
    );
}

/// A journalctl stand-in whose kubelet journal is `lines`.
fn journal(root: &Root, lines: &[&str]) -> String {
    root.write("logs/kubelet.log", &(lines.join("\n") + "\n"));
    let log = root.path("logs/kubelet.log");
    root.stub(
        "journalctl",
        &format!(
            "case \"$*\" in *kubelet.service*) cat '{}';; esac",
            log.display()
        ),
    )
}

/// `run` with a healthy kubelet (its `/healthz` ok, systemd's answers empty) and `journal`.
fn run_healthy(root: &Root, journalctl: &str, deadline: &str) -> Outcome {
    let srv = imds();
    let healthz = Server::start(|_| ok("ok"));
    let systemctl = root.stub("systemctl", "exit 0");
    run(
        root,
        &srv.url,
        &[
            "--systemctl",
            &systemctl,
            "--journalctl",
            journalctl,
            "--healthz-url",
            &format!("{}/healthz", healthz.url),
            "--console",
            root.path("console.log").to_str().unwrap(),
            "--deadline",
            deadline,
        ],
    )
}

const X509_RETRY: &str = "E0115 10:12:03.312008    1234 certificate_manager.go:562] kubernetes.io/kube-apiserver-client-kubelet: Failed while requesting a signed certificate from the control plane: cannot create certificate signing request: Post \"https://10.0.0.10:6443/apis/certificates.k8s.io/v1/certificatesigningrequests\": tls: failed to verify certificate: x509: certificate signed by unknown authority";

#[test]
fn a_running_kubelet_that_keeps_retrying_a_wrong_ca_is_diagnosed_within_the_bound() {
    // kubelet 1.36 with a wrong CA stays up, answers /healthz and retries its CSR.
    let root = Root::node("Amazon EC2");
    let retry2 = X509_RETRY.replace("03.312008", "05.312011");
    let journalctl = journal(&root, &[X509_RETRY, &retry2]);
    let out = run_healthy(&root, &journalctl, "300");
    assert_eq!(out.code, 7, "{out:#?}");
    assert!(
        out.elapsed < Duration::from_secs(35),
        "diagnosed after {:?}, not within the bound",
        out.elapsed
    );
    let json = root.read("run/kiln/status.json");
    assert!(
        json.contains("\"reason\":\"API_X509\",\"message\":\"kubelet is running and has retried this for 25 s: kubelet: E0115"),
        "{json}"
    );
    assert!(json.contains("{\"name\":\"wait-healthy\""), "{json}");
    assert!(
        json.contains("\"name\":\"wait-joined\"") && json.contains("\"reason\":\"API_X509\"}]"),
        "{json}"
    );
    assert!(!root.exists("run/cluster-api/bootstrap-success.complete"));
}

#[test]
fn a_refused_node_registration_is_a_named_failure_without_the_sentinel() {
    // The bootstrap worked (a certificate), but an admission policy refuses the Node.
    let root = Root::node("Amazon EC2");
    root.write(
        CERT,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    let refused = "E0115 10:12:09.100000    1234 kubelet_node_status.go:108] \"Unable to register node with API server\" err=\"nodes \\\"n1\\\" is forbidden: ValidatingAdmissionPolicy 'deny-nodes' with binding 'deny-nodes' denied request: failed expression: false\" node=\"n1\"";
    let again = refused.replace("09.100000", "09.300000");
    let journalctl = journal(&root, &[refused, &again]);
    let out = run_healthy(&root, &journalctl, "300");
    assert_eq!(out.code, 7, "{out:#?}");
    assert!(out.elapsed < Duration::from_secs(35), "{:?}", out.elapsed);
    let json = root.read("run/kiln/status.json");
    assert!(
        json.contains("\"result\":\"failure\",\"reason\":\"NODE_REGISTRATION_REFUSED\""),
        "{json}"
    );
    assert!(
        json.contains("is forbidden: ValidatingAdmissionPolicy"),
        "{json}"
    );
    assert!(!root.exists("run/cluster-api/bootstrap-success.complete"));
    assert_eq!(
        root.read("run/kiln/failure").lines().next(),
        Some("NODE_REGISTRATION_REFUSED")
    );
}

#[test]
fn a_client_certificate_without_a_registered_node_is_not_joined() {
    let root = Root::node("Amazon EC2");
    root.write(
        CERT,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    let journalctl = journal(&root, &["I0115 10:12:01.104223    1234 server.go:530] \"Kubelet version\" kubeletVersion=\"v1.36.2\""]);
    let out = run_healthy(&root, &journalctl, "3");
    assert_eq!(out.code, 7, "{out:#?}");
    let json = root.read("run/kiln/status.json");
    assert!(json.contains("\"reason\":\"JOIN_TIMEOUT\""), "{json}");
    assert!(
        json.contains("kubelet has not logged \\\"Successfully registered node\\\""),
        "{json}"
    );
    assert!(!root.exists("run/cluster-api/bootstrap-success.complete"));
    // Once kubelet logs it, the same node joins, and the console names the node.
    let journalctl = journal(&root, &[common::REGISTERED]);
    let out = run_healthy(&root, &journalctl, "10");
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(root.exists("run/cluster-api/bootstrap-success.complete"));
    assert!(
        root.read("console.log")
            .contains(" node=ip-10-0-3-7.eu-west-1.compute.internal\n"),
        "{}",
        root.read("console.log")
    );
}
