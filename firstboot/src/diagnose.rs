//! Failure diagnosis: asks the service manager about the kubelet and containerd units, reads
//! their logs, and matches them against ONE table of known failure signatures.
//!
//! It only turns unit states and logs into a [`Diagnosis`]; who records it is the caller's
//! business: the run loop when a wait phase times out or kubelet dies, and
//! `kiln-firstboot report` ([`crate::report`], kubelet's `ExecStopPost=` and `kiln-report.timer`) for a
//! kubelet that dies later.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::contract::status_json::{LOG_CAP, MESSAGE_CAP};
use crate::json;
use crate::redact::{self, Redactor};
use crate::service;
use crate::text::push_capped;
use crate::wait::DEFAULT_HEALTHZ_URL;
use crate::windows::{ServiceReport, ServiceState, ERROR_SERVICE_SPECIFIC_ERROR};
use crate::Reason;

pub use crate::signatures::{classify, match_line, Signature, SIGNATURES};

/// A unit's state as `systemctl show` reports it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UnitState {
    pub name: String,
    pub active_state: String,
    pub result: String,
    pub exec_main_status: Option<i32>,
    pub restarts: Option<u32>,
    /// `ExecMainStartTimestampMonotonic`: when the main process started, in microseconds of
    /// `CLOCK_MONOTONIC` (0 when it never ran). Not recorded in status.json.
    pub main_start_us: Option<u64>,
}

impl UnitState {
    /// The properties [`UnitState::parse_show`] reads, as `systemctl show -p` takes them.
    pub const SHOW_PROPERTIES: &'static str =
        "ActiveState,Result,ExecMainStatus,NRestarts,ExecMainStartTimestampMonotonic";

    /// Parses the `KEY=value` lines of `systemctl show -p` [`UnitState::SHOW_PROPERTIES`].
    pub fn parse_show(name: &str, text: &str) -> UnitState {
        let mut u = UnitState {
            name: name.to_string(),
            ..UnitState::default()
        };
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            match k.trim() {
                "ActiveState" => u.active_state = v.trim().to_string(),
                "Result" => u.result = v.trim().to_string(),
                "ExecMainStatus" => u.exec_main_status = v.trim().parse().ok(),
                "NRestarts" => u.restarts = v.trim().parse().ok(),
                "ExecMainStartTimestampMonotonic" => u.main_start_us = v.trim().parse().ok(),
                _ => {}
            }
        }
        u
    }

    /// A Windows service as the SCM reports it, read as a unit state (`kubelet.service`
    /// keeps its Linux name, as the image names it):
    /// - running → `active`; start pending → `activating`; stop pending or paused →
    ///   `deactivating`;
    /// - stopped with exit code 0 → `inactive`, result `success`;
    /// - stopped with `ERROR_SERVICE_SPECIFIC_ERROR` → `failed`, result `exit-code`, status the
    ///   service's own code; any other Windows error → `failed`, status that error (1067
    ///   `ERROR_PROCESS_ABORTED`: the process ended without telling the SCM).
    ///
    /// The SCM does not count restarts: `restarts` stays unknown.
    pub fn from_service(name: &str, r: &ServiceReport) -> UnitState {
        let (active, result, status) = match r.state {
            ServiceState::Running => ("active", "success", None),
            ServiceState::StartPending => ("activating", "success", None),
            ServiceState::Other(_) => ("deactivating", "success", None),
            ServiceState::Stopped => match r.win32_exit_code {
                0 => ("inactive", "success", None),
                ERROR_SERVICE_SPECIFIC_ERROR => {
                    ("failed", "exit-code", Some(r.service_exit_code as i32))
                }
                code => ("failed", "exit-code", Some(code as i32)),
            },
        };
        UnitState {
            name: name.to_string(),
            active_state: active.to_string(),
            result: result.to_string(),
            exec_main_status: status,
            restarts: None,
            main_start_us: None,
        }
    }

    /// The unit is running (or starting) and has not restarted.
    pub fn is_healthy(&self) -> bool {
        matches!(
            self.active_state.as_str(),
            "active" | "reloading" | "activating"
        ) && self.restarts.unwrap_or(0) == 0
    }

    /// The main process has been running for at least `at_least` without a restart: the unit
    /// is `active` and its main process started that long ago by `CLOCK_MONOTONIC`
    /// (`now_us`). Unknown start times count as long enough (a service manager that does not
    /// say cannot be asked better).
    pub fn up_for(&self, at_least: Duration, now_us: Option<u64>) -> bool {
        if self.active_state != "active" {
            return false;
        }
        match (self.main_start_us, now_us) {
            (Some(start), Some(now)) if start > 0 => {
                now.saturating_sub(start) >= at_least.as_micros() as u64
            }
            _ => true,
        }
    }

    /// The unit has given up or is crash-looping: `failed`/`inactive`, or restarted at least
    /// `max_restarts` times.
    pub fn has_died(&self, max_restarts: u32) -> bool {
        matches!(self.active_state.as_str(), "failed" | "inactive")
            || self.restarts.unwrap_or(0) >= max_restarts
    }

    /// One line: `kubelet.service failed (result=exit-code, status=1, restarts=5)`.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} is {} (result={}",
            self.name,
            if self.active_state.is_empty() {
                "unknown"
            } else {
                &self.active_state
            },
            if self.result.is_empty() {
                "unknown"
            } else {
                &self.result
            }
        );
        if let Some(st) = self.exec_main_status {
            s.push_str(&format!(", status={st}"));
        }
        if let Some(n) = self.restarts {
            s.push_str(&format!(", restarts={n}"));
        }
        s.push(')');
        s
    }

    /// Appends this unit as a status.json object.
    pub fn render_json(&self, out: &mut String) {
        out.push_str("{\"name\":");
        json::write_str(out, &self.name);
        out.push_str(",\"active_state\":");
        json::write_str(out, &self.active_state);
        out.push_str(",\"result\":");
        json::write_str(out, &self.result);
        if let Some(st) = self.exec_main_status {
            out.push_str(&format!(",\"exec_main_status\":{st}"));
        }
        if let Some(n) = self.restarts {
            out.push_str(&format!(",\"restarts\":{n}"));
        }
        out.push('}');
    }
}

/// Where diagnosis looks. Every path is an argument so tests use stand-ins.
#[derive(Debug, Clone)]
pub struct ReportOptions {
    /// The `--root` prefix for `/run/kiln`, `/run/cluster-api` and log files.
    pub root: PathBuf,
    /// `systemctl`; `None` skips unit states (no systemd, Windows).
    pub systemctl: Option<PathBuf>,
    /// `journalctl`; `None` reads only `log_files`.
    pub journalctl: Option<PathBuf>,
    /// The console for the report's lines; `None` tries the default consoles.
    pub console: Option<PathBuf>,
    /// kubelet's unit name.
    pub kubelet_unit: String,
    /// The container runtime's unit name.
    pub containerd_unit: String,
    /// Log files read in addition to (or instead of) the journal: `(label, path)`, the path
    /// taken as is (not prefixed by `root`).
    pub log_files: Vec<(String, PathBuf)>,
    /// kubelet's health endpoint, asked by `report` before declaring a failure.
    pub healthz_url: String,
    /// How many journal lines per unit to read.
    pub journal_lines: u32,
    /// The limit for each `systemctl`/`journalctl` call.
    pub command_timeout: Duration,
    /// systemd's `$SERVICE_RESULT` when `report` runs as kubelet's `ExecStopPost=`: `success`
    /// means kubelet was stopped on purpose, which is nothing to report.
    pub service_result: Option<String>,
    /// systemd's `$EXIT_CODE` and `$EXIT_STATUS` beside `$SERVICE_RESULT` (`exited` and `1`,
    /// `killed` and `SEGV`, …): how the main process ended.
    pub exit_code: Option<String>,
    pub exit_status: Option<String>,
    /// The unit that runs `kiln-firstboot run`: while it is still starting, the run owns
    /// status.json and `report` leaves it alone.
    pub firstboot_unit: String,
    /// Print nothing when there is nothing to report (the periodic check).
    pub quiet: bool,
    /// Cleans every log line as it is read, and the warnings printed on the way.
    pub redactor: Redactor,
}

impl ReportOptions {
    /// The defaults for a real node, writing under `root`.
    pub fn new(root: &Path) -> ReportOptions {
        ReportOptions {
            root: root.to_path_buf(),
            // Windows has neither: the SCM answers for the services (`unit_states`).
            systemctl: (!cfg!(windows)).then(|| PathBuf::from("systemctl")),
            journalctl: (!cfg!(windows)).then(|| PathBuf::from("journalctl")),
            console: None,
            kubelet_unit: "kubelet.service".to_string(),
            containerd_unit: "containerd.service".to_string(),
            log_files: Vec::new(),
            healthz_url: DEFAULT_HEALTHZ_URL.to_string(),
            journal_lines: 200,
            command_timeout: Duration::from_secs(5),
            service_result: None,
            exit_code: None,
            exit_status: None,
            firstboot_unit: "kiln-firstboot.service".to_string(),
            quiet: false,
            redactor: Redactor::shapes_only(),
        }
    }
}

/// What diagnosis concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    pub reason: Reason,
    /// The matched log line, or a description of the unit states.
    pub message: String,
    /// The last relevant log lines, at most [`LOG_CAP`] bytes in total.
    pub log: Vec<String>,
    pub units: Vec<UnitState>,
}

/// Asks for the unit states of kubelet and containerd through `systemctl show` (on Windows,
/// the Service Control Manager: `windows::health`).
pub fn unit_states(opts: &ReportOptions) -> Vec<UnitState> {
    #[cfg(windows)]
    {
        // The SCM keeps no restart count; its 7031 events in the System log are one each.
        let units = [opts.kubelet_unit.as_str(), opts.containerd_unit.as_str()];
        let events = crate::windows::eventlog::this_boot(&units).ok();
        crate::windows::health::query(&units, &|m| warn(opts, m))
            .iter()
            .map(|(name, r)| UnitState {
                restarts: events.as_ref().and_then(|e| e.restarts_of(name)),
                ..UnitState::from_service(name, r)
            })
            .collect()
    }
    #[cfg(not(windows))]
    systemd_unit_states(opts)
}

#[cfg(not(windows))]
fn systemd_unit_states(opts: &ReportOptions) -> Vec<UnitState> {
    let Some(systemctl) = &opts.systemctl else {
        return Vec::new();
    };
    [&opts.kubelet_unit, &opts.containerd_unit]
        .into_iter()
        .filter(|unit| !unit.is_empty())
        .filter_map(|unit| {
            let args = ["show", "-p", UnitState::SHOW_PROPERTIES, unit.as_str()];
            match service::output(systemctl, &args, Instant::now() + opts.command_timeout) {
                // No ActiveState at all means the tool did not answer for this unit (systemd
                // itself says `inactive` for an unknown unit): record nothing rather than "".
                Ok(out) if out.success => Some(UnitState::parse_show(unit, &out.stdout_text()))
                    .filter(|u| !u.active_state.is_empty()),
                Ok(out) => {
                    redact::eprint(&opts.redactor.redact(&format!(
                        "kiln-firstboot: warning: {} show {unit} failed: {}",
                        systemctl.display(),
                        out.stderr_text().trim()
                    )));
                    None
                }
                Err(e) => {
                    warn(opts, e.message());
                    None
                }
            }
        })
        .collect()
}

/// kubelet's unit state alone, for the wait loop's "did it die?" check.
pub fn kubelet_state(opts: &ReportOptions) -> Option<UnitState> {
    let mut o = opts.clone();
    o.containerd_unit.clear();
    unit_states(&o)
        .into_iter()
        .find(|u| u.name == opts.kubelet_unit)
}

/// Reads the logs: each unit's journal, then every log file, each line prefixed by its
/// source (`kubelet: …`), oldest first.
pub fn read_logs(opts: &ReportOptions) -> Vec<String> {
    let mut lines = Vec::new();
    // Windows: the SCM's failure events of this boot, or why the event log could not be read.
    #[cfg(windows)]
    match crate::windows::eventlog::this_boot(&[&opts.kubelet_unit, &opts.containerd_unit]) {
        Ok(e) => push_labelled(&mut lines, "eventlog", &e.lines.join("\n"), &opts.redactor),
        Err(note) => push_labelled(&mut lines, "eventlog", &note, &opts.redactor),
    }
    if let Some(journalctl) = &opts.journalctl {
        let n = opts.journal_lines.to_string();
        let units = [&opts.kubelet_unit, &opts.containerd_unit];
        for unit in units.into_iter().filter(|u| !u.is_empty()) {
            if let Err(e) = push_journal(&mut lines, opts, journalctl, unit, &n) {
                warn(opts, &e);
            }
        }
    }
    for (label, path) in &opts.log_files {
        match read_tail(path, 256 * 1024) {
            Ok(text) => push_labelled(&mut lines, label, &text, &opts.redactor),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => warn(opts, &format!("cannot read log {}: {e}", path.display())),
        }
    }
    lines
}

/// kubelet's journal for this boot as [`read_logs`] reads it: its newest `n` lines (`all`:
/// the first MiB, where its start-up lines are). `Err` without a journal or a read.
pub fn kubelet_log(opts: &ReportOptions, n: &str) -> Result<Vec<String>, String> {
    let journalctl = opts.journalctl.as_ref().ok_or("no journal to read")?;
    let mut v = Vec::new();
    push_journal(&mut v, opts, journalctl, &opts.kubelet_unit, n)?;
    Ok(v)
}

/// `unit`'s journal for this boot, its newest `n` lines, labelled and redacted onto `v`.
fn push_journal(
    v: &mut Vec<String>,
    o: &ReportOptions,
    jctl: &Path,
    unit: &str,
    n: &str,
) -> Result<(), String> {
    let args = ["-u", unit, "-b", "--no-pager", "-o", "cat", "-n", n];
    let out = service::output(jctl, &args, Instant::now() + o.command_timeout)
        .map_err(|e| e.message().to_string())?;
    let label = unit.strip_suffix(".service").unwrap_or(unit);
    push_labelled(v, label, &out.stdout_text(), &o.redactor);
    Ok(())
}

/// A warning on stderr, redacted.
fn warn(opts: &ReportOptions, what: &str) {
    redact::eprint(
        &opts
            .redactor
            .redact(&format!("kiln-firstboot: warning: {what}")),
    );
}

/// Appends each line of `text` as `label: line`, redacted: log lines end up in a
/// world-readable status file, on the console and in the cloud channels.
fn push_labelled(lines: &mut Vec<String>, label: &str, text: &str, redactor: &Redactor) {
    for l in text.lines().map(str::trim_end).filter(|l| !l.is_empty()) {
        if l.starts_with("-- ") && l.ends_with(" --") {
            // journalctl's "-- No entries --" / "-- Boot … --" markers.
            continue;
        }
        let l = redactor.redact(l);
        let mut s = String::with_capacity(label.len() + 2 + l.as_str().len());
        s.push_str(label);
        s.push_str(": ");
        s.push_str(l.as_str());
        lines.push(s);
    }
}

/// The last `max` bytes of a file, from the first full line.
fn read_tail(path: &Path, max: u64) -> std::io::Result<String> {
    use std::io::{Seek, SeekFrom};
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let start = len.saturating_sub(max);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = Vec::with_capacity((len - start) as usize);
    f.read_to_end(&mut buf)?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    Ok(if start > 0 {
        text.split_once('\n')
            .map_or(String::new(), |(_, r)| r.to_string())
    } else {
        text
    })
}

/// Concludes from unit states and log lines (the pure part of [`diagnose`]).
pub fn conclude(units: Vec<UnitState>, lines: &[String], kubelet_unit: &str) -> Diagnosis {
    let matched = classify(lines);
    let (reason, message) = if let Some((reason, i)) = matched {
        let mut m = String::with_capacity(MESSAGE_CAP);
        push_capped(&mut m, &lines[i], MESSAGE_CAP);
        (reason, m)
    } else if let Some(rt) = units.iter().find(|u| {
        u.name != kubelet_unit && !u.active_state.is_empty() && u.active_state != "active"
    }) {
        (Reason::RuntimeUnavailable, rt.describe())
    } else if let Some(k) = units
        .iter()
        .find(|u| u.name == kubelet_unit && !u.is_healthy() && !u.active_state.is_empty())
    {
        (Reason::KubeletExited, k.describe())
    } else {
        (
            Reason::JoinTimeout,
            "no known failure signature in the kubelet and containerd logs".to_string(),
        )
    };
    let log = relevant_lines(lines, matched.map(|(_, i)| i));
    Diagnosis {
        reason,
        message,
        log,
        units,
    }
}

/// The newest lines that look like errors (plus the matched line), oldest first, at most
/// [`LOG_CAP`] bytes; the newest lines of any kind when none look like errors.
fn relevant_lines(lines: &[String], matched: Option<usize>) -> Vec<String> {
    const LINE_CAP: usize = 512;
    let looks_bad = |l: &str| {
        let b = l.as_bytes();
        // klog's severity letter follows the "label: " prefix: E0301 / F0301 / W0301.
        let klog = l
            .split_once(": ")
            .map(|(_, r)| r.as_bytes())
            .is_some_and(|r| {
                r.len() > 5 && matches!(r[0], b'E' | b'F') && r[1..5].iter().all(u8::is_ascii_digit)
            });
        klog || contains_ci(b, b"error") || contains_ci(b, b"fail") || match_line(l).is_some()
    };
    let mut picked: Vec<usize> = (0..lines.len())
        .filter(|&i| Some(i) == matched || looks_bad(&lines[i]))
        .collect();
    if picked.is_empty() {
        picked = (0..lines.len()).collect();
    }
    let mut total = 0;
    let mut keep = Vec::new();
    // The matched line first, so it survives the cap, then newest to oldest.
    let order = matched
        .into_iter()
        .chain(picked.iter().rev().copied().filter(|&i| Some(i) != matched));
    for i in order {
        let mut l = String::new();
        push_capped(&mut l, &lines[i], LINE_CAP);
        if total + l.len() > LOG_CAP {
            break;
        }
        total += l.len();
        keep.push((i, l));
    }
    keep.sort_by_key(|(i, _)| *i);
    keep.into_iter().map(|(_, l)| l).collect()
}

fn contains_ci(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Full diagnosis: unit states, logs, signatures.
pub fn diagnose(opts: &ReportOptions) -> Diagnosis {
    let units = unit_states(opts);
    let lines = read_logs(opts);
    conclude(units, &lines, &opts.kubelet_unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_signature_reason_is_a_join_failure() {
        for s in SIGNATURES {
            assert!(!s.needles.is_empty());
            assert_ne!(s.reason.exit_code(), 0);
        }
    }

    #[test]
    fn dns_wins_over_generic_dial_errors() {
        let l = "kubelet: dial tcp: lookup api.example.com on 10.0.0.2:53: read udp 10.0.0.5:40000->10.0.0.2:53: i/o timeout";
        assert_eq!(match_line(l), Some(Reason::ApiDns));
        let l = "kubelet: dial tcp 10.0.0.10:6443: i/o timeout";
        assert_eq!(match_line(l), Some(Reason::ApiUnreachable));
    }

    #[test]
    fn parse_show_reads_systemctl_output() {
        let u = UnitState::parse_show(
            "kubelet.service",
            "ActiveState=activating\nResult=exit-code\nExecMainStatus=1\nNRestarts=4\n",
        );
        assert_eq!(u.active_state, "activating");
        assert_eq!(u.result, "exit-code");
        assert_eq!(u.exec_main_status, Some(1));
        assert_eq!(u.restarts, Some(4));
        assert!(!u.is_healthy());
        assert!(u.has_died(3));
        assert!(!u.has_died(5));
        assert_eq!(u.main_start_us, None);
    }

    #[test]
    fn up_for_needs_an_active_unit_started_long_enough_ago() {
        let show = |state: &str, start: u64| {
            UnitState::parse_show(
                "kubelet.service",
                &format!("ActiveState={state}\nExecMainStartTimestampMonotonic={start}\n"),
            )
        };
        let min = Duration::from_secs(30);
        let now = Some(100_000_000);
        assert!(show("active", 60_000_000).up_for(min, now));
        assert!(show("active", 70_000_000).up_for(min, now));
        assert!(!show("active", 70_000_001).up_for(min, now));
        // A start time from the future (another clock) is not "up long enough".
        assert!(!show("active", 200_000_000).up_for(min, now));
        // Waiting out RestartSec is `activating` (sub-state auto-restart): not up.
        assert!(!show("activating", 1).up_for(min, now));
        assert!(!show("failed", 1).up_for(min, now));
        // Unknown start or clock: the state alone decides.
        assert!(show("active", 0).up_for(min, now));
        assert!(show("active", 200_000_000).up_for(min, None));
    }

    #[test]
    fn log_is_capped_and_keeps_the_match() {
        let mut lines: Vec<String> = (0..200)
            .map(|i| {
                format!(
                    "kubelet: E0101 00:00:00.000000 1 x.go:1] error number {i} {}",
                    "x".repeat(100)
                )
            })
            .collect();
        lines[3] = "kubelet: x509: certificate signed by unknown authority".to_string();
        let d = conclude(Vec::new(), &lines, "kubelet.service");
        assert_eq!(d.reason, Reason::ApiX509);
        let total: usize = d.log.iter().map(String::len).sum();
        assert!(total <= LOG_CAP, "{total}");
        assert!(d.log.contains(&lines[3]));
        assert_eq!(d.log.last(), Some(&lines[199]));
    }

    #[test]
    fn scm_states_read_as_unit_states() {
        let report = |state, win32, own| ServiceReport {
            state,
            win32_exit_code: win32,
            service_exit_code: own,
        };
        let u = UnitState::from_service("kubelet.service", &report(ServiceState::Running, 0, 0));
        assert!(u.is_healthy() && !u.has_died(3), "{u:?}");
        let u =
            UnitState::from_service("kubelet.service", &report(ServiceState::StartPending, 0, 0));
        assert_eq!(u.active_state, "activating");
        // kiln-firstboot's own service reports its run's exit code as service-specific.
        let u = UnitState::from_service(
            "kubelet.service",
            &report(ServiceState::Stopped, ERROR_SERVICE_SPECIFIC_ERROR, 3),
        );
        assert!(u.has_died(3));
        assert_eq!(
            u.describe(),
            "kubelet.service is failed (result=exit-code, status=3)"
        );
        // A process that ended without telling the SCM.
        let u = UnitState::from_service("kubelet.service", &report(ServiceState::Stopped, 1067, 0));
        assert_eq!(
            (u.active_state.as_str(), u.exec_main_status),
            ("failed", Some(1067))
        );
        // Stopped cleanly: inactive, which the wait loop gives a grace period.
        let u = UnitState::from_service("containerd.service", &report(ServiceState::Stopped, 0, 0));
        assert_eq!((u.active_state.as_str(), u.restarts), ("inactive", None));
    }
}
