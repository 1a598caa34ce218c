//! `kiln-firstboot report` and `status` on the real binary: every named failure diagnosed from
//! log lines in the wording kubelet and containerd print (fixtures/logs, sources in its
//! README), unit states from a `systemctl show` stand-in, the report files, and the console.

// These tests play systemctl, kubeadm and friends with /bin/sh stand-ins and check Unix
// modes; the Windows build is tested under Wine by tests/windows.rs (make test-windows).
#![cfg(unix)]

use crate::common;

use std::path::Path;
use std::process::Command;

use common::{fixtures, ok, status, Outcome, Root, Server};

/// Runs the real binary with `args` (a subcommand first) and `--root`.
fn kiln(root: &Root, args: &[&str]) -> Outcome {
    Outcome::of(
        Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
            .args(args)
            .arg("--root")
            .arg(&root.dir),
    )
}

/// A journalctl stand-in that prints `dir/kubelet.log` or `dir/containerd.log` by `-u` unit.
fn journalctl(root: &Root, dir: &Path) -> String {
    root.stub(
        "journalctl",
        &format!(
            "case \"$*\" in\n*kubelet.service*) cat '{0}/kubelet.log' 2>/dev/null;;\n*containerd.service*) cat '{0}/containerd.log' 2>/dev/null;;\nesac\nexit 0",
            dir.display()
        ),
    )
}

/// A systemctl stand-in answering `show` with the given kubelet and containerd states.
fn systemctl(root: &Root, kubelet: &str, containerd: &str) -> String {
    let show = |s: &str| {
        let f: Vec<&str> = s.split(' ').collect();
        format!(
            "ActiveState={}\\nResult={}\\nExecMainStatus={}\\nNRestarts={}\\n",
            f[0], f[1], f[2], f[3]
        )
    };
    root.stub(
        "systemctl",
        &format!(
            "case \"$*\" in\nshow*kubelet.service*) printf '{}';;\nshow*containerd.service*) printf '{}';;\nesac\nexit 0",
            show(kubelet),
            show(containerd)
        ),
    )
}

const CRASHLOOP: &str = "activating exit-code 1 4";
const RUNNING: &str = "active success 0 0";

/// Runs `report` against a log fixture directory with kubelet crash-looping.
fn report(root: &Root, logs: &Path, kubelet: &str, containerd: &str, healthz: &str) -> Outcome {
    let j = journalctl(root, logs);
    let s = systemctl(root, kubelet, containerd);
    let console = root.path("console.log");
    kiln(
        root,
        &[
            "report",
            "--journalctl",
            &j,
            "--systemctl",
            &s,
            "--console",
            console.to_str().unwrap(),
            "--healthz-url",
            healthz,
        ],
    )
}

/// Checks the report files of a failure with `code` and returns status.json.
fn assert_failure_files(root: &Root, code: &str) -> String {
    let status_json = root.read("run/kiln/status.json");
    assert!(
        status_json.contains("\"result\":\"failure\"")
            && status_json.contains(&format!("\"reason\":\"{code}\"")),
        "{status_json}"
    );
    let failure = root.read("run/kiln/failure");
    let lines: Vec<&str> = failure.lines().collect();
    assert_eq!(lines.len(), 3, "{failure}");
    assert_eq!(lines[0], code);
    assert!(!lines[2].is_empty(), "no hint in {failure}");
    assert_eq!(
        root.read("run/cluster-api/bootstrap-failure.reason"),
        failure
    );
    assert!(!root.exists("run/cluster-api/bootstrap-success.complete"));
    // The console's last line carries exactly what status.json says.
    let console = root.read("console.log");
    let last = console.lines().last().unwrap_or("");
    assert_eq!(
        last.strip_prefix("KILN-STATUS "),
        Some(status_json.trim_end()),
        "{console}"
    );
    assert!(
        console.contains(&format!(
            "kiln-firstboot: report result=failure reason={code}"
        )),
        "{console}"
    );
    status_json
}

#[test]
fn each_named_failure_is_diagnosed_from_real_wording() {
    // (fixture, reason, exit code, a piece of the matched line that must be the message)
    let cases = [
        ("api-dns", "API_DNS", 7, "no such host"),
        (
            "api-x509",
            "API_X509",
            7,
            "x509: certificate signed by unknown authority",
        ),
        (
            "api-unauthorized",
            "API_UNAUTHORIZED",
            7,
            "certificate signing request: Unauthorized",
        ),
        (
            "api-refused",
            "API_UNREACHABLE",
            7,
            "connect: connection refused",
        ),
        ("api-timeout", "API_UNREACHABLE", 7, "6443: i/o timeout"),
        (
            "metadata-hop-limit",
            "METADATA_HOP_LIMIT",
            4,
            "StatusCode: 401",
        ),
        ("disk-full", "DISK_FULL", 7, "no space left on device"),
        (
            "runtime-missing",
            "RUNTIME_UNAVAILABLE",
            7,
            "containerd.sock",
        ),
        (
            "cgroup-driver",
            "CGROUP_DRIVER_MISMATCH",
            7,
            "expected cgroupsPath",
        ),
        (
            "cgroup-driver-kubelet",
            "CGROUP_DRIVER_MISMATCH",
            7,
            "kubelet cgroup driver",
        ),
        (
            "swap",
            "SWAP_ENABLED",
            7,
            "running with swap on is not supported",
        ),
        (
            "kubelet-config-invalid",
            "KUBELET_CONFIG_INVALID",
            7,
            "maxPods (--max-pods) -1 must not be a negative number",
        ),
        (
            "kubelet-flag-unknown",
            "KUBELET_CONFIG_INVALID",
            7,
            "unknown flag: --container-runtime",
        ),
        (
            "kubelet-dropin-invalid",
            "KUBELET_CONFIG_INVALID",
            7,
            "50-kiln-provisioned.conf",
        ),
        (
            "kubelet-feature-gate",
            "KUBELET_CONFIG_INVALID",
            7,
            "cannot set feature gate NodeSwap to false",
        ),
    ];
    let unhealthy = Server::start(|_| status(503));
    for (case, code, exit, needle) in cases {
        let root = Root::empty();
        let logs = fixtures().join("logs").join(case);
        let out = report(
            &root,
            &logs,
            CRASHLOOP,
            RUNNING,
            &format!("{}/healthz", unhealthy.url),
        );
        assert_eq!(out.code, exit, "{case}: {out:#?}");
        assert!(out.stdout.contains(code), "{case}: {}", out.stdout);
        let json = assert_failure_files(&root, code);
        let message = json.split("\"message\":").nth(1).unwrap_or("");
        let message = message.split("\",\"hint\"").next().unwrap_or("");
        assert!(message.contains(needle), "{case}: message {message}");
        // The unit states and the matched log line are in the report.
        assert!(
            json.contains("\"units\":[{\"name\":\"kubelet.service\",\"active_state\":\"activating\",\"result\":\"exit-code\",\"exec_main_status\":1,\"restarts\":4}"),
            "{case}: {json}"
        );
        assert!(json.contains("\"log\":["), "{case}: {json}");
        // Both units were asked about, exactly as the contract says.
        let calls = root.calls("systemctl");
        assert!(
            calls.contains(
                &"show -p ActiveState,Result,ExecMainStatus,NRestarts,ExecMainStartTimestampMonotonic kubelet.service".to_string()
            ) && calls.contains(
                &"show -p ActiveState,Result,ExecMainStatus,NRestarts,ExecMainStartTimestampMonotonic containerd.service"
                    .to_string()
            ),
            "{calls:?}"
        );
        assert!(
            root.calls("journalctl")
                .contains(&"-u kubelet.service -b --no-pager -o cat -n 200".to_string()),
            "{:?}",
            root.calls("journalctl")
        );
    }
}

#[test]
fn unknown_failures_keep_the_last_log_lines_capped() {
    let root = Root::empty();
    let logs = root.path("logs");
    let mut text = String::new();
    for i in 0..300 {
        text.push_str(&format!(
            "E0115 10:12:{:02}.000000    1234 kubelet.go:100] \"Something else failed\" err=\"attempt {i}: the flux capacitor is misaligned\"\n",
            i % 60
        ));
    }
    root.write("logs/kubelet.log", &text);
    let unhealthy = Server::start(|_| status(503));
    let out = report(
        &root,
        &logs,
        CRASHLOOP,
        RUNNING,
        &format!("{}/healthz", unhealthy.url),
    );
    assert_eq!(out.code, 7, "{out:#?}");
    let json = assert_failure_files(&root, "KUBELET_EXITED");
    assert!(
        json.contains("kubelet.service is activating (result=exit-code, status=1, restarts=4)"),
        "{json}"
    );
    // The newest lines are kept, the total stays within 4 KiB.
    let doc = kiln_firstboot::json::parse(&json).unwrap();
    let Some(kiln_firstboot::json::Value::Array(lines)) = doc.get("log") else {
        panic!("no log in {json}")
    };
    let lines: Vec<&str> = lines.iter().map(|l| l.as_text().unwrap()).collect();
    let total: usize = lines.iter().map(|l| l.len()).sum();
    assert!(total <= 4096, "log is {total} bytes");
    assert!(
        total > 3000,
        "log is only {total} bytes: the cap should be nearly used"
    );
    assert!(lines.last().unwrap().contains("attempt 299:"), "{lines:?}");
    assert!(!lines.iter().any(|l| l.contains("attempt 0:")), "{lines:?}");
}

#[test]
fn a_stopped_runtime_without_log_lines_is_runtime_unavailable() {
    let root = Root::empty();
    let unhealthy = Server::start(|_| status(503));
    let out = report(
        &root,
        &root.path("no-logs"),
        CRASHLOOP,
        "failed exit-code 1 0",
        &format!("{}/healthz", unhealthy.url),
    );
    assert_eq!(out.code, 7, "{out:#?}");
    let json = assert_failure_files(&root, "RUNTIME_UNAVAILABLE");
    assert!(
        json.contains("containerd.service is failed (result=exit-code"),
        "{json}"
    );
}

#[test]
fn nothing_known_and_kubelet_running_is_a_join_timeout() {
    let root = Root::empty();
    let unhealthy = Server::start(|_| status(503));
    let logs = fixtures().join("logs/unknown");
    let out = report(
        &root,
        &logs,
        RUNNING,
        RUNNING,
        &format!("{}/healthz", unhealthy.url),
    );
    assert_eq!(out.code, 7, "{out:#?}");
    let json = assert_failure_files(&root, "JOIN_TIMEOUT");
    // The one error line is the relevant one.
    assert!(
        json.contains("the CSR was not approved within 10s"),
        "{json}"
    );
}

#[test]
fn a_clean_stop_under_exec_stop_post_is_not_a_failure() {
    let root = Root::empty();
    let unhealthy = Server::start(|_| status(503));
    let j = journalctl(&root, &fixtures().join("logs/swap"));
    let s = systemctl(&root, "deactivating success 0 0", RUNNING);
    let out = Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
        .args([
            "report",
            "--journalctl",
            &j,
            "--systemctl",
            &s,
            "--healthz-url",
        ])
        .arg(format!("{}/healthz", unhealthy.url))
        .arg("--root")
        .arg(&root.dir)
        .env_clear()
        .env("SERVICE_RESULT", "success")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("stopped cleanly"));
    assert!(root.run_files().is_empty());
    // The same stop after a crash is reported.
    let out = Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
        .args([
            "report",
            "--journalctl",
            &j,
            "--systemctl",
            &s,
            "--healthz-url",
        ])
        .arg(format!("{}/healthz", unhealthy.url))
        .args(["--console", root.path("console.log").to_str().unwrap()])
        .arg("--root")
        .arg(&root.dir)
        .env_clear()
        .env("SERVICE_RESULT", "exit-code")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_failure_files(&root, "SWAP_ENABLED");
}

#[test]
fn a_healthy_kubelet_is_not_reported_as_failed() {
    let root = Root::empty();
    let healthy = Server::start(|_| ok("ok"));
    let logs = fixtures().join("logs/api-refused");
    let out = report(
        &root,
        &logs,
        RUNNING,
        RUNNING,
        &format!("{}/healthz", healthy.url),
    );
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(out.stdout.contains("nothing to report"), "{}", out.stdout);
    // A transient error in the logs is mentioned, not recorded.
    assert!(out.stdout.contains("API_UNREACHABLE"), "{}", out.stdout);
    assert!(root.run_files().is_empty(), "{:?}", root.run_files());
}

#[test]
fn report_after_a_successful_boot_keeps_the_phases_and_drops_the_sentinel() {
    let root = Root::empty();
    // A boot that succeeded, as the run wrote it.
    let boot = "{\"kiln_contract\":1,\"kiln_version\":\"0.1.0\",\"image_id\":\"sha256:3f0c\",\"provider\":\"aws\",\"node_name\":\"ip-10-0-3-7\",\"result\":\"success\",\"phases\":[\
{\"name\":\"config\",\"start_ms\":2101,\"end_ms\":2102,\"result\":\"success\"},\
{\"name\":\"metadata\",\"start_ms\":2102,\"end_ms\":2109,\"result\":\"success\"},\
{\"name\":\"write\",\"start_ms\":2109,\"end_ms\":2110,\"result\":\"success\"},\
{\"name\":\"start-kubelet\",\"start_ms\":2110,\"end_ms\":2190,\"result\":\"success\"},\
{\"name\":\"wait-healthy\",\"start_ms\":2190,\"end_ms\":4100,\"result\":\"success\"},\
{\"name\":\"wait-joined\",\"start_ms\":4100,\"end_ms\":6100,\"result\":\"success\"}]}\n";
    root.write("run/kiln/status.json", boot);
    root.write("run/cluster-api/bootstrap-success.complete", "success\n");
    let unhealthy = Server::start(|_| status(503));
    let logs = fixtures().join("logs/disk-full");
    let out = report(
        &root,
        &logs,
        "failed exit-code 1 5",
        RUNNING,
        &format!("{}/healthz", unhealthy.url),
    );
    assert_eq!(out.code, 7, "{out:#?}");
    let json = assert_failure_files(&root, "DISK_FULL");
    assert!(
        json.starts_with("{\"kiln_contract\":1,\"kiln_version\":\"0.1.0\",\"image_id\":\"sha256:3f0c\",\"provider\":\"aws\",\"node_name\":\"ip-10-0-3-7\",\"result\":\"failure\",\"reason\":\"DISK_FULL\""),
        "{json}"
    );
    assert!(
        json.contains(
            "{\"name\":\"wait-joined\",\"start_ms\":4100,\"end_ms\":6100,\"result\":\"success\"}]"
        ),
        "{json}"
    );
    // containerd's own line is in the log too.
    assert!(json.contains("containerd: time="), "{json}");
}

#[test]
fn status_prints_a_summary_and_the_json() {
    let root = Root::empty();
    let out = kiln(&root, &["status"]);
    assert_eq!(out.code, 1, "{out:#?}");
    assert!(
        out.stderr.contains("run/kiln/status.json"),
        "{}",
        out.stderr
    );

    let unhealthy = Server::start(|_| status(503));
    report(
        &root,
        &fixtures().join("logs/api-x509"),
        CRASHLOOP,
        RUNNING,
        &format!("{}/healthz", unhealthy.url),
    );
    let out = kiln(&root, &["status"]);
    assert_eq!(out.code, 7, "{out:#?}");
    let first = out.stdout.lines().next().unwrap();
    assert_eq!(
        first, "kiln-firstboot: failure (API_X509)",
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("  hint: the CA in /etc/kiln/ca.crt"),
        "{}",
        out.stdout
    );
    assert!(out
        .stdout
        .contains("x509: certificate signed by unknown authority"));
    assert!(
        out.stdout
            .contains("  kubelet.service is activating (result=exit-code, status=1, restarts=4)\n"),
        "{}",
        out.stdout
    );

    let out = kiln(&root, &["status", "--json"]);
    assert_eq!(out.code, 7);
    assert_eq!(out.stdout, root.read("run/kiln/status.json"));

    root.write("run/kiln/status.json", "{\"result\":");
    let out = kiln(&root, &["status"]);
    assert_eq!(out.code, 1);
    assert!(
        out.stderr.contains("is not a kiln status file"),
        "{}",
        out.stderr
    );
}
