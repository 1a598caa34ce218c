//! What a booted node reported: the unit that prints the node's files, unit states, facts
//! and doctor table on the console after kiln-firstboot, and the outcome parsed from it.

use std::collections::BTreeMap;

use crate::console::Line;
use crate::{Error, Result};

/// Files the report unit prints, one `KILN-TEST-FILE <path> <line>` per line.
pub const REPORTED_FILES: &[&str] = &[
    "/run/kiln/kubelet.env",
    "/run/kiln/failure",
    "/var/lib/kubelet/standin/args",
    "/var/lib/kubelet/standin/config.json",
    "/var/lib/kubelet/standin/flag-warnings",
    "/run/cluster-api/bootstrap-success.complete",
    "/run/cluster-api/bootstrap-failure.reason",
    crate::pod::REPORT,
];

/// The bash script of the report unit: after kiln-firstboot has finished, print the node's
/// files and unit states on the console, then `KILN-TEST-DONE`.
pub fn report_script() -> String {
    let files = [REPORTED_FILES, crate::kubeadm::REPORTED_FILES]
        .concat()
        .join(" ");
    // Ordering alone is not enough when the kiln units arrive in a sysext merged after
    // systemd loaded its units, so wait for firstboot's final result in status.json too, as
    // `kiln-firstboot status` reads it: a grep of the file for `"result":"success"` also
    // matches the finished phases of a run still in progress.
    format!(
        "for i in $(seq 600); do kiln-firstboot status 2>/dev/null | head -n 1 | grep -Eq '^kiln-firstboot: (success|failure)( |$)' && break; sleep 1; done
for f in {files}; do [ -f \"$f\" ] && sed \"s|^|KILN-TEST-FILE $f |\" \"$f\" && echo; done
for u in containerd kubelet kiln-firstboot; do echo \"KILN-TEST-UNIT $u $(systemctl is-active $u.service)\"; done
kiln-firstboot doctor >/run/kiln-test-doctor.txt 2>&1; echo \"KILN-TEST-DOCTOR-EXIT $?\"
sed 's/^/KILN-TEST-DOCTOR /' /run/kiln-test-doctor.txt
echo \"KILN-TEST-FACT uname-m $(uname -m)\"
for k in {SYSCTLS}; do echo \"KILN-TEST-FACT sysctl:$k $(cat /proc/sys/$k 2>/dev/null)\"; done
for u in {TIMED_UNITS}; do echo \"KILN-TEST-FACT unit-times:$u $(systemctl show -P InactiveExitTimestampMonotonic $u) $(systemctl show -P ActiveEnterTimestampMonotonic $u)\"; done
echo \"KILN-TEST-FACT kubelet-first-start $(journalctl -b -o short-monotonic --no-pager -u kubelet.service 2>/dev/null | grep -m1 ' Started ' | sed -E 's/^\\[ *([0-9.]+)\\].*/\\1/')\"
for b in kubelet containerd kiln-firstboot; do echo \"KILN-TEST-FACT elf-machine:/usr/bin/$b $(od -An -tu2 -j18 -N2 /usr/bin/$b 2>/dev/null | tr -d ' ')\"; done
echo \"KILN-TEST-FACT containerd-opt $(ls /opt/kiln-test/containerd-opt 2>/dev/null | tr '\\n' ' ')\"
echo \"KILN-TEST-FACT containerd-environ-config $(tr '\\0' '\\n' </proc/$(systemctl show -P MainPID containerd.service)/environ 2>/dev/null | grep -c '^KILN_CONTAINERD_CONFIG=')\"
echo \"KILN-TEST-FACT swaps $(tail -n +2 /proc/swaps | awk '{{print $1\":\"$3}}' | tr '\\n' ' ')\"
echo \"KILN-TEST-FACT sysext-link $(readlink /etc/extensions/kubernetes.raw 2>/dev/null)\"
echo \"KILN-TEST-FACT sysext-status $(systemd-sysext status 2>&1 | tr -s ' ' | tr '\\n' ';')\"
echo KILN-TEST-DONE"
    )
}

/// Units whose start the report unit prints from systemd's own record
/// (`unit-times:<unit> <left inactive, µs> <became active, µs>`, CLOCK_MONOTONIC, the node's
/// clock with no suspend): kubelet's is when its process started, whatever queued it.
pub const TIMED_UNITS: &str =
    "containerd.service kiln-images.service network-online.target kubelet.service";

/// Kernel parameters the report unit reads back from `/proc/sys` (`sysctl:<path> <value>`):
/// the ones `cloud_init` sets through node.toml's `[sysctl]`.
pub const SYSCTLS: &str = "net/core/somaxconn vm/max_map_count";

/// The outcome of one boot, parsed from the console.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The `KILN-STATUS` JSON.
    pub status: serde_json::Value,
    /// The console line that carried it (with its host time).
    pub status_line: Line,
    /// Files the report unit printed: path → lines.
    pub files: BTreeMap<String, Vec<String>>,
    /// Unit → `systemctl is-active` answer.
    pub units: BTreeMap<String, String>,
    /// `kiln-firstboot doctor`'s table, run on the node after firstboot: check → (verdict,
    /// detail).
    pub doctor: BTreeMap<String, (String, String)>,
    /// Its exit code.
    pub doctor_exit: Option<i32>,
    /// Facts the report unit printed (`KILN-TEST-FACT <key> <value>`): `uname-m`,
    /// `sysext-link` (where `/etc/extensions/kubernetes.raw` points), `sysext-status`
    /// (`systemd-sysext status`, lines joined by `;`), and
    /// `elf-machine:<path>`, the ELF `e_machine` of kubelet, containerd and kiln-firstboot
    /// as installed (62 x86-64, 183 aarch64).
    pub facts: BTreeMap<String, String>,
    /// kiln-firstboot's per-phase console lines.
    pub phase_lines: Vec<Line>,
}

impl Outcome {
    /// Parses the console of a finished boot.
    pub fn parse(lines: &[Line]) -> Result<Outcome> {
        let status_line = lines
            .iter()
            .rev()
            .find(|l| l.text.starts_with("KILN-STATUS "))
            .cloned()
            .ok_or_else(|| Error::Missing {
                what: "a KILN-STATUS line on the console".into(),
                hint: format!(
                    "kiln-firstboot did not finish, or its line did not reach the console; \
                     its console and journal lines:\n{}",
                    firstboot_lines(lines)
                ),
            })?;
        let status: serde_json::Value =
            serde_json::from_str(&status_line.text["KILN-STATUS ".len()..]).map_err(|e| {
                Error::Command {
                    command: "parse KILN-STATUS".into(),
                    detail: format!("{e}: {}", status_line.text),
                }
            })?;
        let mut files: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut units = BTreeMap::new();
        let mut doctor = BTreeMap::new();
        let mut doctor_exit = None;
        let mut facts = BTreeMap::new();
        for l in lines {
            if let Some(code) = l.text.strip_prefix("KILN-TEST-DOCTOR-EXIT ") {
                doctor_exit = code.trim().parse().ok();
            } else if let Some(row) = l.text.strip_prefix("KILN-TEST-DOCTOR ") {
                // `NAME  VERDICT DETAIL`; the header, remedy lines and the summary are skipped.
                let mut parts = row.splitn(2, char::is_whitespace);
                let (name, rest) = (
                    parts.next().unwrap_or(""),
                    parts.next().unwrap_or("").trim_start(),
                );
                let (verdict, detail) = rest.split_once(' ').unwrap_or((rest, ""));
                if matches!(verdict, "ok" | "warn" | "fail" | "skip") && !name.is_empty() {
                    doctor.insert(
                        name.to_string(),
                        (verdict.to_string(), detail.trim().to_string()),
                    );
                }
            }
            if let Some(rest) = l.text.strip_prefix("KILN-TEST-FILE ") {
                let (path, line) = rest.split_once(' ').unwrap_or((rest, ""));
                files
                    .entry(path.to_string())
                    .or_default()
                    .push(line.to_string());
            } else if let Some(rest) = l.text.strip_prefix("KILN-TEST-FACT ") {
                let (k, v) = rest.split_once(' ').unwrap_or((rest, ""));
                facts.insert(k.to_string(), v.to_string());
            } else if let Some(rest) = l.text.strip_prefix("KILN-TEST-UNIT ") {
                if let Some((u, s)) = rest.split_once(' ') {
                    units.insert(u.to_string(), s.to_string());
                }
            }
        }
        let phase_lines = lines
            .iter()
            .filter(|l| l.text.starts_with("kiln-firstboot: phase="))
            .cloned()
            .collect();
        Ok(Outcome {
            status,
            status_line,
            files,
            units,
            doctor,
            doctor_exit,
            facts,
            phase_lines,
        })
    }

    /// `result` of the status.
    pub fn result(&self) -> &str {
        self.status["result"].as_str().unwrap_or("")
    }

    /// `reason` of the status.
    pub fn reason(&self) -> &str {
        self.status["reason"].as_str().unwrap_or("")
    }

    /// A `KEY=value` from `/run/kiln/kubelet.env` as reported.
    pub fn kubelet_env(&self, key: &str) -> Option<String> {
        self.files
            .get("/run/kiln/kubelet.env")?
            .iter()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .map(|v| v.trim_matches('"').to_string())
    }

    /// The stand-in kubelet's recorded arguments.
    pub fn kubelet_args(&self) -> Vec<String> {
        self.files
            .get("/var/lib/kubelet/standin/args")
            .cloned()
            .unwrap_or_default()
    }

    /// The KubeletConfiguration the stand-in kubelet ran with: `--config` with the
    /// `--config-dir` drop-ins merged over it, as kubelet merges them (before flags).
    pub fn kubelet_config(&self) -> serde_json::Value {
        self.files
            .get("/var/lib/kubelet/standin/config.json")
            .and_then(|l| serde_json::from_str(&l.concat()).ok())
            .unwrap_or(serde_json::Value::Null)
    }

    /// The deprecation warnings kubelet printed for its flags (pflag's `Flag --… has been
    /// deprecated`), as the stand-in recorded them.
    pub fn kubelet_flag_warnings(&self) -> Vec<String> {
        self.files
            .get("/var/lib/kubelet/standin/flag-warnings")
            .map(|l| l.iter().filter(|l| !l.is_empty()).cloned().collect())
            .unwrap_or_default()
    }

    /// A phase's (start_ms, end_ms, result) from the status.
    pub fn phase(&self, name: &str) -> Option<(u64, u64, String)> {
        self.status["phases"].as_array()?.iter().find_map(|p| {
            (p["name"] == name).then(|| {
                (
                    p["start_ms"].as_u64().unwrap_or(0),
                    p["end_ms"].as_u64().unwrap_or(0),
                    p["result"].as_str().unwrap_or("").to_string(),
                )
            })
        })
    }

    /// When `unit` left `inactive` and when it became active, in ms on the node's clock, as
    /// systemd recorded them (`None` for a unit that never did).
    pub fn unit_times(&self, unit: &str) -> Option<(u64, u64)> {
        let v = self.facts.get(&format!("unit-times:{unit}"))?;
        let mut it = v.split_whitespace().map(|n| n.parse::<u64>().ok());
        let (exit, enter) = (it.next()??, it.next().flatten().unwrap_or(0));
        (exit > 0).then_some((exit / 1000, enter / 1000))
    }

    /// When kubelet's process first started on the node's clock: systemd's first "Started"
    /// message for the unit in this boot's journal (`kubelet-first-start`, seconds), else
    /// systemd's record of the unit's last start, else, for a boot whose report has neither,
    /// the end of kiln-firstboot's `start-kubelet` phase (which queues the start job without
    /// waiting for it).
    pub fn kubelet_started_ms(&self) -> Option<u64> {
        self.facts
            .get("kubelet-first-start")
            .and_then(|s| s.trim().parse::<f64>().ok())
            .map(|s| (s * 1000.0) as u64)
            .or_else(|| self.unit_times("kubelet.service").map(|t| t.0))
            .or_else(|| {
                self.phase("start-kubelet")
                    .filter(|p| p.2 == "success")
                    .map(|p| p.1)
            })
    }

    /// Milliseconds kiln-firstboot itself worked: every phase but the two waits for kubelet.
    pub fn firstboot_own_ms(&self) -> u64 {
        ["config", "metadata", "write", "start-kubelet"]
            .iter()
            .filter_map(|p| self.phase(p))
            .map(|(s, e, _)| e.saturating_sub(s))
            .sum()
    }
}

/// The console lines kiln-firstboot wrote or the journal echoed for it (at most the last 40),
/// for a failure message.
fn firstboot_lines(lines: &[Line]) -> String {
    let ours: Vec<&str> = lines
        .iter()
        .map(|l| l.text.as_str())
        .filter(|t| t.contains("kiln-firstboot") || t.contains("KILN-STATUS"))
        .collect();
    ours[ours.len().saturating_sub(40)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_is_read_off_the_console() {
        let lines: Vec<Line> = [
            "kiln-firstboot: phase=config result=success ms=1",
            "KILN-TEST-FILE /run/kiln/kubelet.env NODE_IP=10.0.3.7",
            "KILN-TEST-FILE /run/kiln/kubelet.env KUBELET_ARGS=\"--max-pods=29\"",
            "KILN-TEST-UNIT containerd active",
            "KILN-TEST-DOCTOR-EXIT 9",
            "KILN-TEST-DOCTOR CHECK                 VERDICT DETAIL",
            "KILN-TEST-DOCTOR swap                  ok      no swap in /proc/swaps",
            "KILN-TEST-DOCTOR api-server            fail    https://127.0.0.1:6443: cannot connect",
            "KILN-TEST-DOCTOR                               remedy: check the route",
            "KILN-TEST-DOCTOR doctor: 1 ok, 0 warn, 1 fail, 0 skipped",
            "KILN-TEST-FACT uname-m aarch64",
            "KILN-TEST-FACT elf-machine:/usr/bin/kubelet 183",
            r#"KILN-STATUS {"result":"success","reason":"OK","phases":[{"name":"config","start_ms":10,"end_ms":12,"result":"success"},{"name":"wait-joined","start_ms":12,"end_ms":900,"result":"success"}]}"#,
        ]
        .iter()
        .enumerate()
        .map(|(i, t)| Line { host_ms: i as u64, text: t.to_string() })
        .collect();
        let o = Outcome::parse(&lines).unwrap();
        assert_eq!(o.result(), "success");
        assert_eq!(o.doctor_exit, Some(9));
        assert_eq!(o.doctor.len(), 2, "{:?}", o.doctor);
        assert_eq!(
            o.doctor["swap"],
            ("ok".to_string(), "no swap in /proc/swaps".to_string())
        );
        assert_eq!(o.doctor["api-server"].0, "fail");
        assert_eq!(o.kubelet_env("NODE_IP").as_deref(), Some("10.0.3.7"));
        assert_eq!(
            o.kubelet_env("KUBELET_ARGS").as_deref(),
            Some("--max-pods=29")
        );
        assert_eq!(o.units["containerd"], "active");
        assert_eq!(o.facts["uname-m"], "aarch64");
        assert_eq!(o.facts["elf-machine:/usr/bin/kubelet"], "183");
        assert_eq!(o.firstboot_own_ms(), 2);
        assert_eq!(o.phase_lines.len(), 1);
        let missing = Outcome::parse(&lines[..2]).unwrap_err().to_string();
        assert!(
            missing.contains("phase=config result=success") && !missing.contains("NODE_IP"),
            "{missing}"
        );
    }
}
