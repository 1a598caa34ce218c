//! `kiln-firstboot report` after a boot, as the units run it (docs/contract.md, "Post-boot
//! reporting"): under kubelet's `ExecStopPost=` with systemd's `$SERVICE_RESULT`,
//! `$EXIT_CODE` and `$EXIT_STATUS`, and as `kiln-report.timer`'s quiet periodic check. A
//! crash loop after a successful join is recorded once, a repeat changes nothing, and a
//! kubelet that runs healthy and joined again is recorded as recovered.

#![cfg(unix)]

use crate::common;

use std::process::Command;

use common::{ok, Root, Server};

/// The status.json of a boot that joined, as the run wrote it.
const JOINED_BOOT: &str = "{\"kiln_contract\":1,\"kiln_version\":\"0.1.0\",\"provider\":\"qemu\",\"node_name\":\"n1\",\"result\":\"success\",\"phases\":[\
{\"name\":\"config\",\"start_ms\":2101,\"end_ms\":2102,\"result\":\"success\"},\
{\"name\":\"metadata\",\"start_ms\":2102,\"end_ms\":2109,\"result\":\"success\"},\
{\"name\":\"write\",\"start_ms\":2109,\"end_ms\":2110,\"result\":\"success\"},\
{\"name\":\"start-kubelet\",\"start_ms\":2110,\"end_ms\":2190,\"result\":\"success\"},\
{\"name\":\"wait-healthy\",\"start_ms\":2190,\"end_ms\":4100,\"result\":\"success\"},\
{\"name\":\"wait-joined\",\"start_ms\":4100,\"end_ms\":6100,\"result\":\"success\"}]}\n";

const CERT: &str = "var/lib/kubelet/pki/kubelet-client-current.pem";

/// A node after a joined boot, with systemctl and journalctl stand-ins whose answers are
/// files the test rewrites between calls (`kubelet.show`, `firstboot.show`).
struct Node {
    root: Root,
    systemctl: String,
    journalctl: String,
    healthz: Server,
}

impl Node {
    fn joined() -> Node {
        let root = Root::empty();
        root.write("run/kiln/status.json", JOINED_BOOT);
        root.write("run/cluster-api/bootstrap-success.complete", "success\n");
        root.write(
            CERT,
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        );
        // kubelet's last words carry no known signature: only systemd knows how it ended.
        root.write(
            "logs/kubelet.log",
            "I1123 21:00:00.000000    1 server.go:1] \"Starting kubelet\"\n\
             E1123 21:00:01.000000    1 run.go:72] \"command failed\" err=\"failed to run Kubelet: plugin exploded\"\n",
        );
        root.write("firstboot.show", "ActiveState=active\n");
        let d = root.dir.display().to_string();
        let systemctl = root.stub(
            "systemctl",
            &format!(
                "case \"$*\" in\n*kiln-firstboot.service*) cat '{d}/firstboot.show';;\n\
                 *kubelet.service*) cat '{d}/kubelet.show';;\n\
                 *containerd.service*) printf 'ActiveState=active\\nResult=success\\nExecMainStatus=0\\nNRestarts=0\\n';;\nesac\nexit 0"
            ),
        );
        let journalctl = root.stub(
            "journalctl",
            &format!(
                "case \"$*\" in\n*kubelet.service*) cat '{d}/logs/kubelet.log';;\nesac\nexit 0"
            ),
        );
        // kubelet's /healthz answers between crashes too: that alone must not flip anything.
        let healthz = Server::start(|_| ok("ok"));
        Node {
            root,
            systemctl,
            journalctl,
            healthz,
        }
    }

    fn kubelet(&self, active: &str, result: &str, status: i32, restarts: u32, start_us: u64) {
        self.root.write(
            "kubelet.show",
            &format!(
                "ActiveState={active}\nResult={result}\nExecMainStatus={status}\nNRestarts={restarts}\nExecMainStartTimestampMonotonic={start_us}\n"
            ),
        );
    }

    /// Runs `report` with `env` (systemd's variables) and extra `args`.
    fn report(&self, env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
        let mut c = Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"));
        c.arg("report")
            .args(["--systemctl", &self.systemctl])
            .args(["--journalctl", &self.journalctl])
            .args(["--console", self.root.path("console.log").to_str().unwrap()])
            .args(["--healthz-url", &format!("{}/healthz", self.healthz.url)])
            .arg("--root")
            .arg(&self.root.dir)
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin");
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    }

    fn read_or_empty(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.path(rel)).unwrap_or_default()
    }
}

const CRASH: &[(&str, &str)] = &[
    ("SERVICE_RESULT", "exit-code"),
    ("EXIT_CODE", "exited"),
    ("EXIT_STATUS", "1"),
];

#[test]
fn a_crash_loop_after_join_is_reported_once_then_recovered() {
    let node = Node::joined();
    let r = &node.root;

    // 1. kubelet exits 1; systemd runs ExecStopPost while the unit is deactivating.
    node.kubelet("deactivating", "exit-code", 1, 3, 1);
    let (code, _) = node.report(CRASH, &[]);
    assert_eq!(code, 7);
    let failed = r.read("run/kiln/status.json");
    assert!(
        failed.contains("\"result\":\"failure\",\"reason\":\"KUBELET_EXITED\",\"message\":\"kubelet.service exited: result=exit-code, exited=1, restarts=3\""),
        "{failed}"
    );
    // The boot's phases are kept, kubelet's own error line is the evidence.
    assert!(
        failed.contains(
            "{\"name\":\"wait-joined\",\"start_ms\":4100,\"end_ms\":6100,\"result\":\"success\"}"
        ),
        "{failed}"
    );
    assert!(failed.contains("plugin exploded"), "{failed}");
    assert!(r.read("run/kiln/failure").starts_with("KUBELET_EXITED\n"));
    assert!(r.exists("run/cluster-api/bootstrap-failure.reason"));
    assert!(!r.exists("run/cluster-api/bootstrap-success.complete"));
    let console = r.read("console.log");
    assert!(
        console.contains("kiln-firstboot: report result=failure reason=KUBELET_EXITED"),
        "{console}"
    );

    // 2. The next crash of the loop is the same failure: nothing is rewritten or printed.
    //    (kubelet's journal still gets the diagnosis on stdout.)
    node.kubelet("deactivating", "exit-code", 1, 4, 1);
    let (code, stdout) = node.report(CRASH, &[]);
    assert_eq!(code, 7);
    assert!(
        stdout.contains("still failing (KUBELET_EXITED), already recorded"),
        "{stdout}"
    );
    assert_eq!(r.read("run/kiln/status.json"), failed);
    assert_eq!(r.read("console.log"), console);

    // 3. The timer's check while kubelet is between crashes: it answers /healthz but its
    //    process started just now, so the failure stays and nothing is printed.
    node.kubelet("active", "success", 0, 5, u64::MAX / 2);
    let (code, stdout) = node.report(&[], &["--quiet"]);
    assert_eq!((code, stdout.as_str()), (0, ""));
    assert_eq!(r.read("run/kiln/status.json"), failed);

    // 4. Up long enough but its client certificate is gone: not joined, not recovered.
    node.kubelet("active", "success", 0, 5, 1);
    std::fs::remove_file(r.path(CERT)).unwrap();
    let (code, _) = node.report(&[], &["--quiet"]);
    assert_eq!(code, 0);
    assert_eq!(r.read("run/kiln/status.json"), failed);

    // 5. Healthy, up long enough, its certificate back, but no Node: the failure stays.
    r.write(
        CERT,
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    );
    let (code, _) = node.report(&[], &["--quiet"]);
    assert_eq!(code, 0);
    assert_eq!(r.read("run/kiln/status.json"), failed);

    // 6. kubelet then logs its registered line: joined, recorded as recovered.
    let log = r.read("logs/kubelet.log");
    r.write(
        "logs/kubelet.log",
        &format!("{log}{}\n", common::REGISTERED),
    );
    let (code, stdout) = node.report(&[], &["--quiet"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("kubelet recovered"), "{stdout}");
    let recovered = r.read("run/kiln/status.json");
    assert!(
        recovered.contains("\"result\":\"success\",\"phases\":["),
        "{recovered}"
    );
    assert!(!recovered.contains("\"reason\""), "{recovered}");
    assert!(!recovered.contains("plugin exploded"), "{recovered}");
    assert_eq!(
        r.read("run/cluster-api/bootstrap-success.complete"),
        "success\n"
    );
    assert!(!r.exists("run/kiln/failure"));
    assert!(!r.exists("run/cluster-api/bootstrap-failure.reason"));
    let console = r.read("console.log");
    assert!(
        console.contains("kiln-firstboot: report result=success recovered"),
        "{console}"
    );
    assert_eq!(
        console
            .lines()
            .last()
            .and_then(|l| l.strip_prefix("KILN-STATUS ")),
        Some(recovered.trim_end())
    );

    // 6. A later check of the healthy node changes nothing and says nothing.
    let (code, stdout) = node.report(&[], &["--quiet"]);
    assert_eq!((code, stdout.as_str()), (0, ""));
    assert_eq!(r.read("run/kiln/status.json"), recovered);

    // 7. A crash after the recovery is reported again.
    node.kubelet("deactivating", "signal", 0, 6, 1);
    let (code, _) = node.report(
        &[
            ("SERVICE_RESULT", "signal"),
            ("EXIT_CODE", "killed"),
            ("EXIT_STATUS", "SEGV"),
        ],
        &[],
    );
    assert_eq!(code, 7);
    let again = r.read("run/kiln/status.json");
    assert!(
        again.contains("kubelet.service exited: result=signal, killed=SEGV, restarts=6"),
        "{again}"
    );
    assert!(!r.exists("run/cluster-api/bootstrap-success.complete"));
}

#[test]
fn a_run_in_progress_owns_the_status_until_it_ends() {
    let node = Node::joined();
    let r = &node.root;
    let running = JOINED_BOOT
        .replace(
            "\"result\":\"success\",\"phases\"",
            "\"result\":\"running\",\"phases\"",
        )
        .replace(
            "{\"name\":\"wait-joined\",\"start_ms\":4100,\"end_ms\":6100,\"result\":\"success\"}",
            "{\"name\":\"wait-joined\",\"start_ms\":4100,\"result\":\"running\"}",
        );
    r.write("run/kiln/status.json", &running);
    std::fs::remove_file(r.path("run/cluster-api/bootstrap-success.complete")).unwrap();
    r.write("firstboot.show", "ActiveState=activating\n");
    node.kubelet("deactivating", "exit-code", 1, 1, 1);
    let (code, stdout) = node.report(CRASH, &[]);
    assert_eq!(code, 0);
    assert!(stdout.contains("still running"), "{stdout}");
    assert_eq!(r.read("run/kiln/status.json"), running);
    assert!(!r.exists("run/kiln/failure"));
    assert_eq!(node.read_or_empty("console.log"), "");
    // The run died without finishing (its unit failed): the crash is reported after all.
    r.write("firstboot.show", "ActiveState=failed\n");
    let (code, _) = node.report(CRASH, &[]);
    assert_eq!(code, 7);
    assert!(r.read("run/kiln/failure").starts_with("KUBELET_EXITED\n"));
}

#[test]
fn before_the_run_begins_there_is_nothing_to_report() {
    // A slow boot: kiln-report.timer's first tick (30 s after the timer started) comes while
    // kiln-firstboot.service still waits for network-online.target. No status.json exists and
    // kubelet, which only the run starts, has never run.
    let node = Node::joined();
    let r = &node.root;
    std::fs::remove_file(r.path("run/kiln/status.json")).unwrap();
    std::fs::remove_file(r.path("run/cluster-api/bootstrap-success.complete")).unwrap();
    node.kubelet("inactive", "success", 0, 0, 0);
    for state in ["inactive", "activating"] {
        r.write("firstboot.show", &format!("ActiveState={state}\n"));
        let (code, stdout) = node.report(&[], &["--quiet"]);
        assert_eq!(code, 0, "{state}: {stdout}");
        assert_eq!(stdout, "", "{state}");
        let (code, stdout) = node.report(&[], &[]);
        assert_eq!(code, 0, "{state}: {stdout}");
        assert!(stdout.contains("has not run on this boot yet"), "{stdout}");
        assert!(!r.exists("run/kiln/status.json"), "{state}");
        assert!(!r.exists("run/kiln/failure"), "{state}");
        assert_eq!(node.read_or_empty("console.log"), "", "{state}");
    }
    // A run that died before it wrote anything (its unit failed) is reported.
    r.write("firstboot.show", "ActiveState=failed\n");
    let (code, _) = node.report(&[], &["--quiet"]);
    assert_ne!(code, 0);
    assert!(r.exists("run/kiln/failure"));
    assert!(node
        .read_or_empty("console.log")
        .contains("kiln-firstboot: report result=failure"));
}

#[test]
fn under_exec_stop_post_a_journal_that_lags_the_exit_is_read_again() {
    // journald stores a dead process's last lines asynchronously: the first journal read under
    // ExecStopPost= has kubelet's earlier lines only, the line with the reason comes a moment
    // later. The report must name that reason, not KUBELET_EXITED.
    let node = Node::joined();
    let r = &node.root;
    let d = r.dir.display().to_string();
    r.write(
        "logs/late.log",
        "E1123 21:00:01.000000    1 run.go:72] \"command failed\" err=\"failed to validate kubelet configuration, error: invalid configuration: imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100, path: &{/etc/kiln/kubelet-config.yaml}\"\n",
    );
    let journalctl = r.stub(
        "journalctl-late",
        &format!(
            "case \"$*\" in\n*kubelet.service*)\n  cat '{d}/logs/kubelet.log'\n  \
             [ -e '{d}/journal-read' ] && cat '{d}/logs/late.log'\n  touch '{d}/journal-read';;\nesac\nexit 0"
        ),
    );
    let node = Node { journalctl, ..node };
    let r = &node.root;
    node.kubelet("deactivating", "exit-code", 1, 1, 1);
    let (code, _) = node.report(CRASH, &[]);
    let failed = r.read("run/kiln/status.json");
    assert!(
        failed.contains("\"reason\":\"KUBELET_CONFIG_INVALID\""),
        "{failed}"
    );
    assert_ne!(code, 0);
    assert!(r
        .read("console.log")
        .contains("kiln-firstboot: report result=failure reason=KUBELET_CONFIG_INVALID"));
}

#[test]
fn a_kubeadm_failure_stays_the_reason_when_the_timer_later_finds_kubelet_inactive() {
    // The run ended KUBEADM_FAILED; kubeadm never got kubelet going, so the timer then finds
    // kubelet.service inactive: that is added, not put in KUBEADM_FAILED's place.
    let node = Node::joined();
    let r = &node.root;
    std::fs::remove_file(r.path("run/cluster-api/bootstrap-success.complete")).unwrap();
    std::fs::remove_file(r.path(CERT)).unwrap();
    let failed = JOINED_BOOT
        .replace("\"result\":\"success\",\"phases\"", "\"result\":\"failure\",\"reason\":\"KUBEADM_FAILED\",\"message\":\"kubeadm join exited with status 1: error execution phase preflight: [ERROR SystemVerification]: missing required cgroups: cpu\",\"hint\":\"x\",\"phases\"");
    r.write("run/kiln/status.json", &failed);
    r.write("run/kiln/failure", "KUBEADM_FAILED\n");
    r.write("firstboot.show", "ActiveState=failed\n");
    node.kubelet("inactive", "success", 0, 0, 0);
    let (code, stdout) = node.report(&[], &["--quiet"]);
    assert_eq!(code, 6, "{stdout}");
    let status = r.read("run/kiln/status.json");
    let doc = kiln_firstboot::json::parse(&status).unwrap();
    let text = |k: &str| {
        doc.get(k)
            .and_then(|v| v.as_text())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(text("reason"), "KUBEADM_FAILED", "{status}");
    assert!(
        text("message").contains("[ERROR SystemVerification]"),
        "{status}"
    );
    let later: Vec<String> = doc
        .get("later")
        .and_then(|v| v.as_array())
        .unwrap_or_default()
        .iter()
        .filter_map(|v| v.as_text().map(str::to_string))
        .collect();
    assert_eq!(later.len(), 1, "{status}");
    assert!(later[0].starts_with("KUBELET_EXITED: "), "{later:?}");
    assert_eq!(
        r.read("run/kiln/failure").lines().next(),
        Some("KUBEADM_FAILED")
    );
    // The next tick sees the same: nothing more is written.
    let (code, _) = node.report(&[], &["--quiet"]);
    assert_eq!(code, 6);
    assert_eq!(r.read("run/kiln/status.json"), status);
    // `status` shows both.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
        .args(["status", "--root"])
        .arg(&r.dir)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        shown.contains("failure (KUBEADM_FAILED)") && shown.contains("seen since: KUBELET_EXITED"),
        "{shown}"
    );
}

#[test]
fn two_reports_at_once_record_and_print_the_failure_once() {
    // kubelet's ExecStopPost= and kiln-report.service (OnFailure=, or a timer tick) start
    // together when kubelet exits. A boot test saw both print the same failure 5 ms apart:
    // each had read status.json before the other wrote it. The journal read here takes a
    // second, so without one-at-a-time both would read the joined status first.
    let node = Node::joined();
    let r = &node.root;
    let d = r.dir.display().to_string();
    let journalctl = r.stub(
        "journalctl-slow",
        &format!("case \"$*\" in\n*kubelet.service*) sleep 1; cat '{d}/logs/kubelet.log';;\nesac\nexit 0"),
    );
    let node = Node { journalctl, ..node };
    node.kubelet("failed", "exit-code", 1, 1, 1);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| node.report(CRASH, &[]));
        let b = s.spawn(|| node.report(&[], &["--quiet"]));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!((a.0, b.0), (7, 7), "{a:?} {b:?}");
    let console = node.root.read("console.log");
    assert_eq!(
        console
            .matches("kiln-firstboot: report result=failure reason=KUBELET_EXITED")
            .count(),
        1,
        "{console}"
    );
    let status = node.root.read("run/kiln/status.json");
    assert!(status.contains("\"reason\":\"KUBELET_EXITED\""), "{status}");
    assert!(node.root.exists("run/kiln/report.lock"));
}
