//! `kiln-firstboot doctor`: the checks that break joins, run before kubelet logs them, each
//! with a verdict and a remedy. It reads only what firstboot may read (the contract files,
//! `/proc`, `/sys`, the metadata service, the API server's TLS greeting, containerd's CRI
//! socket) under `--root`, changes nothing, and is bounded in time: every network check has
//! its own short timeout. `run` calls it when a boot fails, so its findings reach
//! status.json and the serial console (docs/contract.md, "kiln-firstboot doctor").

mod certs;
mod cri;
mod host;
mod model;
pub mod net;
pub mod tls;
pub mod x509;

use crate::contract::paths::NodePaths;
use crate::json;

use model::Node;
pub use model::{Check, Options, Verdict};

/// Runs every check, in the table's order.
pub fn run(opts: &Options) -> Vec<Check> {
    let node = Node::load(opts);
    let mut out = Vec::with_capacity(16);
    out.push(net::clock(&node));
    out.push(host::swap(&node));
    out.push(host::cgroup_v2(&node));
    out.push(host::cgroup_driver(&node));
    out.extend(host::netfilter(&node));
    out.push(net::proxy(&node));
    out.extend(net::api_server(&node));
    out.push(certs::bootstrap_credential(&node));
    out.push(certs::kubelet_client(&node));
    out.push(certs::kubelet_serving(&node));
    out.push(host::cri(&node));
    out.push(host::disk(&node));
    out
}

/// The worst verdict of `checks`.
pub fn worst(checks: &[Check]) -> Verdict {
    checks
        .iter()
        .map(|c| c.verdict)
        .max()
        .unwrap_or(Verdict::Ok)
}

/// The table `doctor` prints: one line a check, the remedy under each warn or fail.
pub fn table(checks: &[Check]) -> String {
    let w = checks
        .iter()
        .map(|c| c.name.len())
        .max()
        .unwrap_or(5)
        .max(5);
    let mut out = format!("{:<w$}  {:<7} DETAIL\n", "CHECK", "VERDICT");
    for c in checks {
        out.push_str(&format!(
            "{:<w$}  {:<7} {}\n",
            c.name,
            c.verdict.name(),
            c.detail
        ));
        if !c.remedy.is_empty() {
            out.push_str(&format!("{:<w$}  {:<7} remedy: {}\n", "", "", c.remedy));
        }
    }
    let count = |v| checks.iter().filter(|c| c.verdict == v).count();
    out.push_str(&format!(
        "doctor: {} ok, {} warn, {} fail, {} skipped\n",
        count(Verdict::Ok),
        count(Verdict::Warn),
        count(Verdict::Fail),
        count(Verdict::Skip)
    ));
    out
}

/// The checks as one JSON object: `{"result":…,"checks":[{"name","verdict","detail","remedy"}]}`;
/// only the warn and fail ones with `only_problems`, each text cut at `cap` bytes.
pub fn to_json(checks: &[Check], only_problems: bool, cap: usize) -> String {
    let mut out = String::from("{\"result\":\"");
    out.push_str(worst(checks).name());
    out.push_str("\",\"checks\":[");
    let mut first = true;
    for c in checks {
        if only_problems && c.verdict < Verdict::Warn {
            continue;
        }
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str("{\"name\":\"");
        out.push_str(c.name);
        out.push_str("\",\"verdict\":\"");
        out.push_str(c.verdict.name());
        out.push_str("\",\"detail\":");
        let mut t = String::new();
        crate::text::push_capped(&mut t, &c.detail, cap);
        json::write_str(&mut out, &t);
        out.push_str(",\"remedy\":");
        t.clear();
        crate::text::push_capped(&mut t, &c.remedy, cap);
        json::write_str(&mut out, &t);
        out.push('}');
    }
    out.push_str("]}");
    out
}

/// Exit code of `doctor` when a check failed (0 otherwise); docs/contract.md, "Exit codes".
pub const EXIT_FAILED: u8 = 9;

/// `kiln-firstboot doctor [--json]`: prints the table (or the JSON) and returns the exit code.
pub fn cmd_doctor(opts: &Options, as_json: bool) -> u8 {
    let checks = run(opts);
    let secrets = crate::config::node_secrets(&NodePaths::under(&opts.root));
    let mut redactor = crate::redact::Redactor::shapes_only();
    redactor.add_all(secrets.values());
    let text = if as_json {
        let mut j = to_json(&checks, false, usize::MAX);
        j.push('\n');
        j
    } else {
        table(&checks)
    };
    crate::redact::print(&redactor.redact(&text));
    if worst(&checks) == Verdict::Fail {
        EXIT_FAILED
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_and_json_carry_every_field() {
        let checks = vec![
            Check::ok("swap", "no swap"),
            Check::fail(
                "api-server",
                "cannot connect to 10.0.0.1:6443",
                "open the port",
            ),
        ];
        let t = table(&checks);
        assert!(t.contains("swap        ok      no swap"), "{t}");
        assert!(t.contains("remedy: open the port"), "{t}");
        assert!(
            t.ends_with("doctor: 1 ok, 0 warn, 1 fail, 0 skipped\n"),
            "{t}"
        );
        let j = to_json(&checks, true, 512);
        let v = json::parse(&j).unwrap();
        assert_eq!(v.get("result").and_then(json::Value::as_text), Some("fail"));
        let a = v.get("checks").and_then(json::Value::as_array).unwrap();
        assert_eq!(a.len(), 1);
        assert_eq!(
            a[0].get("remedy").and_then(json::Value::as_text),
            Some("open the port")
        );
    }
}
