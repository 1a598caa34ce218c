//! After the join (issue 15): a kubelet that starts crash-looping on a joined node, and a
//! node behind an HTTP proxy. A module of the scenarios test binary, so it shares their
//! helpers: `cargo nextest run -p kiln-qemu-tests --test it kubelet_crash_loop`.
//! Both act on the guest once kiln-firstboot has recorded its result
//! (`kiln_qemu_tests::after_join`).

use std::time::Duration;

use kiln_qemu_tests::after_join::{self, lines_with, statuses, step, step_files, steps, Step};
use kiln_qemu_tests::expect_ok;
use kiln_qemu_tests::node::{boot_rootfs_node_edited, timeline, Metadata};

use super::{
    assert_pod_ran, assert_registered, assert_unknown_field_warned, deadline, spec, spec_with_pod,
    with_kubelet_config, UNKNOWN_FIELD,
};

/// The files that say how the node is doing, printed at each step.
const NODE_FILES: &str = "$status /run/kiln/failure /run/cluster-api/bootstrap-failure.reason \
                          /run/cluster-api/bootstrap-success.complete";

/// The kubelet config value the crash loop is made of: kubelet's validation refuses it
/// (`pkg/kubelet/apis/config/validation/validation.go`, enforced by the strict double:
/// tools/standin-kubelet/README.md, "How strict").
const BAD_CONFIG_LINE: &str = "imageGCHighThresholdPercent: 101";

/// The guest side of `kubelet_crash_loop`, after [`after_join::PRELUDE`]: an operator's edit
/// of the node's kubelet config that kubelet refuses, applied the usual way (restart
/// kubelet), then undone. Each wait is bounded.
fn crash_loop_script() -> String {
    format!(
        r#"config=/etc/kiln/kubelet-config.yaml
mkdir -p /run/kiln-test
cp -p $config /run/kiln-test/good.yaml
{{ cat /run/kiln-test/good.yaml; echo '{BAD_CONFIG_LINE}'; }} >$config.new && mv $config.new $config
step broke
systemctl restart kubelet.service
if wait_result failure 180 KUBELET_CONFIG_INVALID; then step failure-recorded; else step failure-not-recorded; fi
show failing {NODE_FILES}
from=$(prop kubelet.service NRestarts)
for i in $(seq 120); do [ "$(prop kubelet.service NRestarts)" -ge $((from + 2)) ] && break; sleep 1; done
step restarting from=$from to=$(prop kubelet.service NRestarts) state=$(prop kubelet.service ActiveState)
cp -p /run/kiln-test/good.yaml $config.new && mv $config.new $config
touch /run/kiln-test/fixed
step fixed
if wait_result success 300; then step recovery-recorded; else step recovery-not-recorded; fi
show recovered {NODE_FILES}
step end state=$(prop kubelet.service ActiveState) restarts=$(prop kubelet.service NRestarts)
"#
    )
}

/// kiln-report.timer's period in `kubelet_crash_loop`'s guest (30 s as baked), a test
/// setting: the recovery is recorded on the first tick after kubelet has been up for 30 s.
const REPORT_TICK: u64 = 10;

fn need<'a>(steps: &'a [Step], name: &str) -> &'a Step {
    step(steps, name).unwrap_or_else(|| panic!("no {name} step on the console: {steps:#?}"))
}

/// A node joins, then kubelet starts crash-looping: an operator appends a value kubelet's
/// validation refuses to the node's kubelet config (`/etc/kiln/kubelet-config.yaml`) and
/// restarts kubelet. The refusal is kubelet's own rule, enforced by the strict double, so a
/// real kubelet would crash-loop on the same file the same way; no test-only behaviour of
/// the double is involved. kiln must report it within its bound (docs/contract.md, "Post-boot
/// reporting"), keep kubelet restarting, and record the recovery once the file is fixed.
#[test]
fn kubelet_crash_loop() {
    let mut s = spec("kubelet_crash_loop", "success", Metadata::Aws, 240);
    s.timeout = Duration::from_secs(1200);
    let b = expect_ok(boot_rootfs_node_edited(&s, |root| {
        // The node's own kubelet config, the operator's file: at first the baked one.
        let baked = root.dir.join("usr/lib/kiln/kubelet-config.yaml");
        let text = std::fs::read_to_string(&baked).expect("the baked kubelet config");
        root.write("etc/kiln/kubelet-config.yaml", text, 0o644)?;
        // A test setting (docs/boot-tests.md, "Test settings"): kiln-report.timer ticks
        // every REPORT_TICK s instead of 30 s, so the recovery is recorded sooner; the
        // report it runs is the product's.
        root.write(
            "etc/systemd/system/kiln-report.timer.d/kiln-test-tick.conf",
            // Added to the baked 30 s (an empty assignment would reset every timer of the
            // unit, OnActiveSec= too); the earliest of the two elapses.
            format!("[Timer]\nOnUnitActiveSec={REPORT_TICK}s\n"),
            0o644,
        )?;
        after_join::install(
            root,
            &format!("{}{}", after_join::PRELUDE, crash_loop_script()),
        )
    }));
    eprintln!(
        "kubelet-crash-loop timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    let lines = &b.lines;
    let st = steps(lines);
    eprintln!("steps: {st:#?}");
    let all = statuses(lines);

    // 1. The boot itself: joined, with the operator's file as kubelet's config.
    let (_, first) = all.first().expect("a KILN-STATUS line");
    assert_eq!(first["result"], "success", "the run: {first}");
    assert!(
        b.outcome
            .kubelet_args()
            .iter()
            .any(|a| a == "--config=/etc/kiln/kubelet-config.yaml"),
        "{:?}",
        b.outcome.kubelet_args()
    );
    let joined = need(&st, "joined");
    assert_registered(&b.outcome);

    // 2. The crash: reported on the console, in status.json and the failure files, with
    // kubelet's own words, within the contract's bound (the report runs as kubelet's
    // ExecStopPost=: two journal reads of at most 5 s each, read again after 1 s when nothing
    // matched) plus testkit's slack.
    let broke = need(&st, "broke");
    assert!(broke.host_ms >= joined.host_ms);
    need(&st, "failure-recorded");
    let failed_lines = lines_with(
        lines,
        "kiln-firstboot: report result=failure reason=KUBELET_CONFIG_INVALID",
    );
    let report = failed_lines
        .iter()
        .find(|l| l.host_ms >= broke.host_ms)
        .expect("the failure on the console");
    let took = Duration::from_millis(report.host_ms - broke.host_ms);
    eprintln!("crash reported {took:?} after the restart");
    deadline::bounded(took, 21);
    let failing = step_files(lines, "failing");
    let status_text = failing["/run/kiln/status.json"].join("\n");
    let status: serde_json::Value = serde_json::from_str(&status_text).expect("status.json");
    assert_eq!(status["result"], "failure", "{status}");
    assert_eq!(status["reason"], "KUBELET_CONFIG_INVALID", "{status}");
    let refusal =
        "imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100";
    let message = status["message"].as_str().unwrap_or("");
    assert!(message.contains(refusal), "{message}");
    assert!(
        !status["hint"].as_str().unwrap_or("").is_empty(),
        "{status}"
    );
    // The boot's phases are kept as the run recorded them.
    assert_eq!(status["phases"], first["phases"], "{status}");
    for f in [
        "/run/kiln/failure",
        "/run/cluster-api/bootstrap-failure.reason",
    ] {
        let text = failing
            .get(f)
            .unwrap_or_else(|| panic!("no {f}: {failing:?}"));
        assert_eq!(text[0], "KUBELET_CONFIG_INVALID", "{f}: {text:?}");
        assert!(text[1].contains(refusal), "{f}: {text:?}");
    }
    assert!(
        !failing.contains_key("/run/cluster-api/bootstrap-success.complete"),
        "{failing:?}"
    );
    // The same KILN-STATUS went to the console.
    assert!(
        all.iter()
            .any(|(ms, v)| *ms >= broke.host_ms && v["reason"] == "KUBELET_CONFIG_INVALID"),
        "{all:?}"
    );

    // 3. systemd kept restarting kubelet (no start limit stops it), and kiln did not write
    // the console again for the same failure on every restart.
    let restarting = need(&st, "restarting");
    let (from, to) = (
        restarting.get("from").and_then(|v| v.parse::<u32>().ok()),
        restarting.get("to").and_then(|v| v.parse::<u32>().ok()),
    );
    assert!(
        matches!((from, to), (Some(f), Some(t)) if t >= f + 2),
        "{restarting:?}"
    );
    assert!(
        !matches!(restarting.get("state"), Some("failed" | "inactive")),
        "{restarting:?}"
    );
    let fixed = need(&st, "fixed");
    let during: Vec<_> = lines_with(lines, "kiln-firstboot: report result=failure")
        .into_iter()
        .filter(|l| l.host_ms >= broke.host_ms && l.host_ms <= fixed.host_ms)
        .collect();
    assert_eq!(during.len(), 1, "one report per failure: {during:#?}");

    // 4. Recovery: kubelet runs again on the fixed file; within the bound (restart 5 s, 30 s
    // of uptime, the next timer tick (REPORT_TICK s here, 30 s on a node), journal reads)
    // plus slack, kiln records success.
    need(&st, "recovery-recorded");
    let recovered = lines_with(lines, "kiln-firstboot: report result=success recovered");
    let recovered = recovered
        .iter()
        .find(|l| l.host_ms >= fixed.host_ms)
        .expect("the recovery on the console");
    let took = Duration::from_millis(recovered.host_ms - fixed.host_ms);
    eprintln!("recovery recorded {took:?} after the fix");
    deadline::bounded(took, 5 + 30 + REPORT_TICK + 10);
    let after = step_files(lines, "recovered");
    let status: serde_json::Value =
        serde_json::from_str(&after["/run/kiln/status.json"].join("\n")).expect("status.json");
    assert_eq!(status["result"], "success", "{status}");
    for gone in ["reason", "message", "log"] {
        assert!(status.get(gone).is_none(), "{gone} left in {status}");
    }
    assert!(
        after.contains_key("/run/cluster-api/bootstrap-success.complete"),
        "{after:?}"
    );
    for f in [
        "/run/kiln/failure",
        "/run/cluster-api/bootstrap-failure.reason",
    ] {
        assert!(!after.contains_key(f), "{f} left: {after:?}");
    }
    let (_, last) = all.last().expect("a KILN-STATUS line");
    assert_eq!(last["result"], "success", "{last}");
    // The recovered kubelet is still up at the end. (This boot runs no pod: the pod is
    // ubuntu_aws's and proxy_set's, on the same layer.)
    assert_eq!(need(&st, "end").get("state"), Some("active"), "{st:#?}");
    assert_eq!(b.outcome.result(), "success", "{}", b.outcome.status);
}

/// The proxy of the scenario's node.toml (`[proxy]`, rendered into node.env by
/// `kiln render`). Nothing listens there: the guest's network reaches only the metadata
/// forward, so anything that really went through the proxy would fail. `NO_PROXY` covers the
/// API server (`scenario::API_SERVER`, the guest's loopback) and the metadata address, as
/// doctor's `proxy` check asks.
const PROXY: &str = "http://proxy.kiln.invalid:3128";
const NO_PROXY: &str = "127.0.0.1,169.254.169.254,.cluster.local";

/// The guest side of `proxy_set`: containerd's real process environment and the timeline of
/// the processes that matter, once the node joined.
const PROXY_SCRIPT: &str = r#"pid=$(prop containerd.service MainPID)
tr '\0' '\n' </proc/$pid/environ >/run/kiln-test-containerd.environ
step processes containerd_pid=$pid containerd_us=$(prop containerd.service ExecMainStartTimestampMonotonic) containerd_restarts=$(prop containerd.service NRestarts) firstboot_us=$(prop kiln-firstboot.service ExecMainStartTimestampMonotonic) kubelet_us=$(prop kubelet.service ExecMainStartTimestampMonotonic) kubelet_restarts=$(prop kubelet.service NRestarts)
show proxy /run/kiln-test-containerd.environ /run/kiln/containerd.env /var/lib/kubelet/standin/env /etc/kiln/node.env
"#;

/// A node whose node.toml sets an HTTP proxy: containerd's running process holds
/// `HTTP_PROXY`/`HTTPS_PROXY`/`NO_PROXY` (read from `/proc/<pid>/environ`), that process
/// started before kubelet did and has not been replaced since, kubelet's environment holds
/// them too, and the pod still runs (its images are local; nothing is pulled through the
/// proxy).
///
/// The same boot carries the unknown-field scenario (formerly `kubelet_config_unknown_field`,
/// its own boot): the operator's `/etc/kiln/kubelet-config.yaml` is the baked config plus
/// [`UNKNOWN_FIELD`]. Both are successes on the ubuntu layer and neither assertion reads
/// what the other changes (docs/boot-tests.md, "Shared boots").
#[test]
fn proxy_set() {
    let mut s = spec_with_pod("proxy_set", "success", Metadata::Aws, 240);
    // The same boot carries node.toml's serverTLSBootstrap switch (docs/contract.md,
    // "Serving certificate"): a field of kiln's per-node drop-in, merged by the stand-in
    // with kubelet's rules, and the pending-CSR warning (the stand-in, like a cluster without
    // an approver, never gets one).
    s.node.extra = format!(
        "\n[kubelet]\nserver_tls_bootstrap = true\n\n[proxy]\nhttp = \"{PROXY}\"\nhttps = \"{PROXY}\"\nno_proxy = [{}]\n",
        NO_PROXY
            .split(',')
            .map(|e| format!("\"{e}\""))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let b = expect_ok(boot_rootfs_node_edited(&s, |root| {
        with_kubelet_config(UNKNOWN_FIELD)(root)?;
        after_join::install(root, &format!("{}{PROXY_SCRIPT}", after_join::PRELUDE))
    }));
    eprintln!(
        "proxy-set timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    let o = &b.outcome;
    assert_eq!(o.result(), "success", "status: {}", o.status);
    assert_registered(o);
    assert_pod_ran(o, "ubuntu");
    let kc = o.kubelet_config();
    assert_eq!(kc["serverTLSBootstrap"], true, "{kc}");
    assert!(
        !o.kubelet_args()
            .iter()
            .any(|a| a.starts_with("--rotate-server-certificates")),
        "{:?}",
        o.kubelet_args()
    );
    assert_eq!(o.kubelet_flag_warnings(), Vec::<String>::new());
    let warnings = o.status["warnings"].to_string();
    assert!(
        warnings.contains("serving certificate is not issued yet")
            && warnings.contains("kubelet-server-current.pem"),
        "{warnings}"
    );
    let want = [
        ("HTTP_PROXY", PROXY),
        ("HTTPS_PROXY", PROXY),
        ("NO_PROXY", NO_PROXY),
    ];
    let files = step_files(&b.lines, "proxy");
    // kiln render put the proxy in node.env: that is how the operator set it.
    let has_all = |what: &str, path: &str| {
        let lines = files
            .get(path)
            .unwrap_or_else(|| panic!("no {what} ({path}) on the console: {files:?}"));
        for (k, v) in want {
            let line = format!("{k}={v}");
            assert!(
                lines
                    .iter()
                    .any(|l| l == &line || l == &format!("{k}=\"{v}\"")),
                "{what} lacks {line}: {lines:#?}"
            );
        }
    };
    has_all("node.env", "/etc/kiln/node.env");
    has_all(
        "kiln-firstboot's containerd.env",
        "/run/kiln/containerd.env",
    );
    has_all(
        "containerd's process environment",
        "/run/kiln-test-containerd.environ",
    );
    has_all(
        "kubelet's process environment (the stand-in's record)",
        "/var/lib/kubelet/standin/env",
    );
    // The containerd process that has them started after kiln-firstboot did (it is
    // firstboot's restart, after the image import it waits for) and before kubelet, and
    // neither was replaced since: containerd held the proxy before kubelet could ask it for
    // anything.
    let st = steps(&b.lines);
    let p = need(&st, "processes");
    let us = |k: &str| -> u64 {
        p.get(k)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in {p:?}"))
    };
    assert!(
        us("firstboot_us") < us("containerd_us") && us("containerd_us") < us("kubelet_us"),
        "{p:?}"
    );
    assert_eq!(p.get("containerd_restarts"), Some("0"), "{p:?}");
    assert_eq!(p.get("kubelet_restarts"), Some("0"), "{p:?}");
    // doctor on the node agrees the proxy spares the API server and the metadata service.
    let (verdict, detail) = o
        .doctor
        .get("proxy")
        .unwrap_or_else(|| panic!("no proxy row in {:?}", o.doctor));
    assert_eq!(verdict, "ok", "{detail}");
    // And finds the serving certificate pending on the joined node.
    let (verdict, detail) = o
        .doctor
        .get("kubelet-serving-cert")
        .unwrap_or_else(|| panic!("no kubelet-serving-cert row in {:?}", o.doctor));
    assert_eq!(verdict, "warn", "{detail}");

    // From kubelet_config_unknown_field: the lenient decode joined and was warned about.
    assert_unknown_field_warned(o);
}
