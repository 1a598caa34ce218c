//! The two commands that look at a boot after the fact: `kiln-firstboot status` prints
//! status.json back ([`cmd_status`], [`StatusView`]); `kiln-firstboot report` diagnoses a
//! kubelet that died after boot and records it like a failed run ([`cmd_report`]).

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use crate::clock;
use crate::config;
use crate::console::Console;
use crate::contract::paths::NodePaths;
use crate::diagnose::{self, ReportOptions, UnitState};
use crate::json;
use crate::redact::{self, Redactor};
use crate::reporter::Reporter;
use crate::service;
use crate::signatures::registered_node;
use crate::wait;
use crate::Reason;

/// `kiln-firstboot status [--json]`: prints status.json as a short summary (or as is with
/// `json`). Exits 0 on success, the reason's exit code on failure, 8 while still running, and
/// 1 when there is no readable status.
/// The file was written redacted; it is redacted again on the way out (with the node's
/// credentials when this user can read them), since anyone may have written it.
pub fn cmd_status(root: &Path, json: bool) -> u8 {
    let paths = NodePaths::under(root);
    let mut redactor = Redactor::shapes_only();
    redactor.add_all(config::node_secrets(&paths).values());
    let path = paths.status_json;
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            redact::eprint(&redactor.redact(&format!(
                "kiln-firstboot: cannot read {}: {e}; has kiln-firstboot run on this boot? (systemctl status kiln-firstboot)",
                path.display()
            )));
            return 1;
        }
    };
    let status = match StatusView::parse(&text) {
        Ok(s) => s,
        Err(e) => {
            redact::eprint(&redactor.redact(&format!(
                "kiln-firstboot: {} is not a kiln status file: {e}",
                path.display()
            )));
            return 1;
        }
    };
    if json {
        let mut line = text.trim_end().to_string();
        line.push('\n');
        redact::print(&redactor.redact(&line));
    } else {
        redact::print(&redactor.redact(&status.summary()));
    }
    status.exit_code()
}

/// status.json read back: the fields `status` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusView {
    pub result: String,
    pub reason: Option<String>,
    pub message: Option<String>,
    pub hint: Option<String>,
    pub provider: Option<String>,
    pub node_name: Option<String>,
    pub image_id: Option<String>,
    /// `(name, result, duration_ms, reason)`, duration absent while running.
    pub phases: Vec<(String, String, Option<u64>, Option<String>)>,
    pub log: Vec<String>,
    /// The recorded unit states, one line each (`kubelet.service failed (result=…)`).
    pub units: Vec<String>,
    /// What `report` saw after the recorded failure (`CODE: message`).
    pub later: Vec<String>,
}

impl StatusView {
    /// Parses the text of a status.json.
    pub fn parse(text: &str) -> Result<StatusView, json::ParseError> {
        let v = json::parse(text)?;
        let s = |key: &str| {
            v.get(key)
                .and_then(json::Value::as_text)
                .map(str::to_string)
        };
        let result = s("result").ok_or(json::ParseError {
            offset: 0,
            message: "expected a \"result\" key",
        })?;
        let phases = v
            .get("phases")
            .and_then(json::Value::as_array)
            .unwrap_or(&[])
            .iter()
            .map(|p| {
                let f = |key: &str| p.get(key).and_then(json::Value::as_text).unwrap_or("");
                let start = p.get("start_ms").and_then(json::Value::as_u64);
                let end = p.get("end_ms").and_then(json::Value::as_u64);
                let dur = match (start, end) {
                    (Some(a), Some(b)) => Some(b.saturating_sub(a)),
                    _ => None,
                };
                let reason = p
                    .get("reason")
                    .and_then(json::Value::as_text)
                    .map(str::to_string);
                (f("name").to_string(), f("result").to_string(), dur, reason)
            })
            .collect();
        let texts = |key: &str| -> Vec<String> {
            v.get(key)
                .and_then(json::Value::as_array)
                .unwrap_or(&[])
                .iter()
                .filter_map(|l| l.as_text().map(str::to_string))
                .collect()
        };
        let log = texts("log");
        let later = texts("later");
        let units = v
            .get("units")
            .and_then(json::Value::as_array)
            .unwrap_or(&[])
            .iter()
            .map(|u| {
                let f = |k: &str| u.get(k).and_then(json::Value::as_text).unwrap_or("");
                UnitState {
                    name: f("name").to_string(),
                    active_state: f("active_state").to_string(),
                    result: f("result").to_string(),
                    exec_main_status: f("exec_main_status").parse().ok(),
                    restarts: f("restarts").parse().ok(),
                    main_start_us: None,
                }
                .describe()
            })
            .collect();
        Ok(StatusView {
            result,
            reason: s("reason"),
            message: s("message"),
            hint: s("hint"),
            provider: s("provider"),
            node_name: s("node_name"),
            image_id: s("image_id"),
            phases,
            log,
            units,
            later,
        })
    }

    /// The exit code `kiln-firstboot status` returns for this status.
    pub fn exit_code(&self) -> u8 {
        match self.result.as_str() {
            "success" => 0,
            "running" => 8,
            _ => self
                .reason
                .as_deref()
                .and_then(|code| Reason::ALL.into_iter().find(|r| r.code() == code))
                .map_or(1, Reason::exit_code),
        }
    }

    /// A few lines for a human at a terminal.
    pub fn summary(&self) -> String {
        let mut o = String::with_capacity(512);
        let _ = write!(o, "kiln-firstboot: {}", self.result);
        if let Some(r) = &self.reason {
            let _ = write!(o, " ({r})");
        }
        if let Some(n) = &self.node_name {
            let _ = write!(o, " node {n}");
        }
        if let Some(p) = &self.provider {
            let _ = write!(o, " on {p}");
        }
        if let Some(i) = &self.image_id {
            let _ = write!(o, " image {i}");
        }
        o.push('\n');
        if let Some(m) = self.message.as_deref().filter(|m| !m.is_empty()) {
            let _ = writeln!(o, "  {m}");
        }
        if let Some(h) = self.hint.as_deref().filter(|h| !h.is_empty()) {
            let _ = writeln!(o, "  hint: {h}");
        }
        for (name, result, dur, reason) in &self.phases {
            let _ = write!(o, "  {name:<14} {result:<8}");
            if let Some(d) = dur {
                let _ = write!(o, " {d:>6} ms");
            }
            if let Some(r) = reason {
                let _ = write!(o, "  {r}");
            }
            o.push('\n');
        }
        for u in &self.units {
            let _ = writeln!(o, "  {u}");
        }
        for l in &self.later {
            let _ = writeln!(o, "  seen since: {l}");
        }
        if !self.log.is_empty() {
            o.push_str("  last log lines:\n");
            for l in &self.log {
                let _ = writeln!(o, "    {l}");
            }
        }
        o
    }
}

/// How long kubelet's main process must have run, healthy, before `report` records a
/// recovery: longer than a crash loop's cycle (kubelet.service's `RestartSec=5` plus the
/// seconds kubelet takes to fail), so a kubelet that answers `/healthz` between two crashes
/// does not flap the node to `success`.
pub const RECOVERY_UPTIME: Duration = Duration::from_secs(30);

/// How long `report` under `ExecStopPost=` waits before reading the logs a second time when
/// the first read matched no signature (journald may not have stored kubelet's last lines yet).
pub const JOURNAL_SETTLE: Duration = Duration::from_secs(1);

/// `kiln-firstboot report`: checks kubelet after boot and records a change.
///
/// - Under kubelet's `ExecStopPost=` (`$SERVICE_RESULT` set): a clean stop is nothing to
///   report; any other exit is diagnosed at once.
/// - Otherwise (`OnFailure=`, `kiln-report.timer`, by hand): a kubelet that is `active` and
///   answers `/healthz` is fine; if a failure was recorded and kubelet has now run for
///   [`RECOVERY_UPTIME`] with its client certificate in place, the node is recorded as
///   recovered (`success`, failure files removed, sentinel written). A kubelet that is not
///   fine is diagnosed.
/// - While `kiln-firstboot run` is still in progress it owns status.json: nothing is written.
/// - A diagnosis equal to the failure already recorded changes nothing (a crash loop does
///   not print on the console every few seconds).
///
/// Exits 0 when kubelet is fine (or the run owns the status), else the reason's exit code.
/// Its output goes to the journal and the console, so it reads the node's credentials first
/// ([`config::node_secrets`]) and redacts everything with them.
#[allow(
    clippy::too_many_lines,
    reason = "the report timer's decision is one ordered list of cases (docs/contract.md, report); each case writes and returns, so the order is the specification"
)]
pub fn cmd_report(opts: &ReportOptions) -> u8 {
    let paths = NodePaths::under(&opts.root);
    let mut opts = opts.clone();
    opts.redactor.add_all(config::node_secrets(&paths).values());
    let opts = &opts;
    let say = |text: String| redact::print(&opts.redactor.redact(&text));
    let quiet = |text: String| {
        if !opts.quiet {
            say(text);
        }
    };
    if opts.service_result.as_deref() == Some("success") {
        quiet(format!(
            "kiln-firstboot: {} stopped cleanly; nothing to report\n",
            opts.kubelet_unit
        ));
        return 0;
    }
    let path = &paths.status_json;
    // kubelet's ExecStopPost= and kiln-report.service (its OnFailure= or the timer) can run
    // at the same moment; each reads status.json, then writes it and the console. One at a
    // time, so the second sees what the first recorded and does not report it again.
    let _one_at_a_time = report_lock(path, opts);
    let prior_text = std::fs::read_to_string(path).ok();
    let prior = prior_text
        .as_deref()
        .and_then(|t| StatusView::parse(t).ok());
    match prior.as_ref() {
        Some(p)
            if p.result == "running" && firstboot_state(opts).is_none_or(|s| s == "activating") =>
        {
            quiet(format!(
                "kiln-firstboot: {} is still running and reports kubelet itself; nothing to do\n",
                opts.firstboot_unit
            ));
            return 0;
        }
        // No status yet and the run has not ended: it has not begun (on a slow boot the
        // timer's first tick can come before network-online.target lets it start), or has not
        // written its first phase. kubelet, which only the run starts, is not ours to judge.
        None if matches!(
            firstboot_state(opts).as_deref(),
            Some("inactive" | "activating")
        ) =>
        {
            quiet(format!(
                "kiln-firstboot: {} has not run on this boot yet (no {}); nothing to do\n",
                opts.firstboot_unit,
                path.display()
            ));
            return 0;
        }
        _ => {}
    }
    let stopped = opts.service_result.is_some();
    if !stopped {
        let kubelet = diagnose::kubelet_state(opts);
        let up = kubelet.as_ref().is_none_or(|k| k.active_state == "active");
        if up && wait::probe_healthz(&opts.healthz_url, Duration::from_secs(2)).is_ok() {
            let failed_before = prior.as_ref().is_some_and(|p| p.result == "failure");
            let stable = kubelet
                .as_ref()
                .is_none_or(|k| k.up_for(RECOVERY_UPTIME, clock::monotonic_us()));
            let cert = paths
                .root
                .join(wait::DEFAULT_PKI_DIR)
                .join(wait::CLIENT_CERT);
            let joined = wait::check_client_cert(&cert).and_then(|()| registered(opts));
            match (failed_before, stable, joined) {
                (true, true, Ok(())) => {
                    let console = Console::open(opts.console.as_deref());
                    let text = prior_text.as_deref().unwrap_or_default();
                    let mut reporter = match Reporter::resume(&paths, console, text) {
                        Ok(r) => r,
                        Err((_, console)) => Reporter::with_console(&paths, console),
                    };
                    reporter.set_redactor(opts.redactor.clone());
                    let units = diagnose::unit_states(opts);
                    reporter.recovered(&units);
                    say(format!(
                        "kiln-firstboot: kubelet recovered: {} answers ok and {} holds a certificate; recorded as success\n",
                        opts.healthz_url,
                        cert.display()
                    ));
                }
                (true, false, _) => quiet(format!(
                    "kiln-firstboot: kubelet answers ok again; recorded as recovered once it has run for {} s\n",
                    RECOVERY_UPTIME.as_secs()
                )),
                (true, true, Err(e)) => quiet(format!(
                    "kiln-firstboot: kubelet answers ok but has not joined ({e}); the failure stays recorded\n"
                )),
                (false, ..) if !opts.quiet => {
                    say(format!(
                        "kiln-firstboot: kubelet is running and {} answers ok; nothing to report\n",
                        opts.healthz_url
                    ));
                    // Asked by hand: what the logs say is worth a line, not a record.
                    let diagnosis = diagnose::diagnose(opts);
                    if diagnosis.reason != Reason::JoinTimeout {
                        say(format!(
                            "  (its logs match {}: {})\n",
                            diagnosis.reason, diagnosis.message
                        ));
                    }
                }
                (false, ..) => {}
            }
            return 0;
        }
    }
    let mut diagnosis = diagnose::diagnose(opts);
    if stopped && diagnosis.reason == Reason::KubeletExited {
        // journald reads a dead process's last output from its stream asynchronously, so
        // under ExecStopPost= the line that says why may land a moment after the exit: when
        // no signature matched, the logs are read once more, a second later.
        std::thread::sleep(JOURNAL_SETTLE);
        diagnosis = diagnose::diagnose(opts);
    }
    if stopped && diagnosis.reason == Reason::KubeletExited {
        // systemd's own words for how the process ended say more than the unit state seen
        // in the middle of its stop.
        let mut m = format!(
            "{} exited: result={}",
            opts.kubelet_unit,
            opts.service_result.as_deref().unwrap_or("")
        );
        if let (Some(code), Some(status)) = (&opts.exit_code, &opts.exit_status) {
            let _ = write!(m, ", {code}={status}");
        }
        if let Some(k) = diagnosis.units.iter().find(|u| u.name == opts.kubelet_unit) {
            if let Some(n) = k.restarts {
                let _ = write!(m, ", restarts={n}");
            }
        }
        diagnosis.message = m;
    }
    let kept = prior
        .as_ref()
        .filter(|p| p.result == "failure")
        .and_then(|p| p.reason.as_deref())
        .and_then(|code| Reason::ALL.into_iter().find(|r| r.code() == code))
        .filter(|&r| r != diagnosis.reason && (!vague(r) || vague(diagnosis.reason)));
    if let (Some(kept), Some(text)) = (kept, prior_text.as_deref()) {
        // The first cause stays the reason (a kubeadm that failed leaves a kubelet that never
        // ran, which says nothing new); what came after it is added beside it.
        let mut console = Console::open(opts.console.as_deref());
        let later = prior.as_ref().map_or(&[][..], |p| &p.later[..]);
        let added = crate::reporter::after::note_later(
            &paths,
            &mut console,
            (text, later),
            kept,
            &diagnosis,
            &opts.redactor,
        )
        .unwrap_or_else(|e| {
            redact::eprint(
                &opts
                    .redactor
                    .redact(&format!("kiln-firstboot: warning: {e}")),
            );
            false
        });
        if added || !opts.quiet {
            say(format!(
                "kiln-firstboot: still failing ({kept}), recorded in {}; seen since: {} {}\n",
                path.display(),
                diagnosis.reason,
                diagnosis.message
            ));
        }
        return kept.exit_code();
    }
    if let Some(p) = prior.as_ref().filter(|p| p.result == "failure") {
        if p.reason.as_deref() == Some(diagnosis.reason.code()) {
            let mut text = format!(
                "kiln-firstboot: still failing ({}), already recorded in {}\n  {}\n  hint: {}\n",
                diagnosis.reason,
                path.display(),
                diagnosis.message,
                diagnosis.reason.hint()
            );
            if !diagnosis.log.is_empty() {
                text.push_str("  last log lines:\n");
                for l in &diagnosis.log {
                    let _ = writeln!(text, "    {l}");
                }
            }
            quiet(text);
            return diagnosis.reason.exit_code();
        }
    }
    let console = Console::open(opts.console.as_deref());
    let mut reporter = match prior_text {
        Some(text) => match Reporter::resume(&paths, console, &text) {
            Ok(r) => r,
            Err((e, console)) => {
                redact::eprint(&opts.redactor.redact(&format!(
                    "kiln-firstboot: warning: {} is not a kiln status file ({e}); starting a new one",
                    path.display()
                )));
                Reporter::with_console(&paths, console)
            }
        },
        None => Reporter::with_console(&paths, console),
    };
    reporter.set_redactor(opts.redactor.clone());
    reporter.conclude(&diagnosis);
    let summary = StatusView::parse(reporter.last_json())
        .map(|v| v.summary())
        .unwrap_or_default();
    say(summary);
    reporter.exit_code()
}

/// Holds an exclusive lock on `report.lock` beside status.json until dropped (waiting for
/// another `report` to finish). Without the directory (nothing has run yet) or the lock, the
/// report goes on unlocked, after a warning: a duplicate line is better than no report.
fn report_lock(status_json: &Path, opts: &ReportOptions) -> Option<std::fs::File> {
    let dir = status_json.parent()?;
    if !dir.is_dir() {
        return None;
    }
    let lock = dir.join("report.lock");
    let taken = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .and_then(|f| f.lock().map(|()| f));
    match taken {
        Ok(f) => Some(f),
        Err(e) => {
            redact::eprint(&opts.redactor.redact(&format!(
                "kiln-firstboot: warning: cannot lock {}: {e}; reporting without it",
                lock.display()
            )));
            None
        }
    }
}

/// A reason that names no cause, only what was seen: a later, specific diagnosis may take its
/// place as the run's reason; nothing else replaces a recorded one.
fn vague(r: Reason) -> bool {
    matches!(r, Reason::JoinTimeout | Reason::KubeletExited)
}

/// kubelet logged its registered line on this boot (`Ok` where there is no journal to ask:
/// the certificate is then the evidence).
fn registered(opts: &ReportOptions) -> Result<(), String> {
    match diagnose::kubelet_log(opts, "all") {
        Ok(lines) if lines.iter().any(|l| registered_node(l).is_some()) => Ok(()),
        Ok(_) => Err("kubelet has not logged \"Successfully registered node\"".to_string()),
        Err(_) if opts.journalctl.is_none() => Ok(()),
        Err(e) => Err(e),
    }
}

/// The `ActiveState` of kiln-firstboot's unit (`activating` while `kiln-firstboot run` is
/// still starting, `inactive` before it starts), or `None` without a service manager to ask
/// or an answer from it: then a status that says `running` is taken at its word, and a
/// missing status is reported on.
fn firstboot_state(opts: &ReportOptions) -> Option<String> {
    let systemctl = opts.systemctl.as_ref()?;
    let args = ["show", "-p", "ActiveState", opts.firstboot_unit.as_str()];
    match service::output(
        systemctl,
        &args,
        std::time::Instant::now() + opts.command_timeout,
    ) {
        Ok(out) if out.success => {
            Some(UnitState::parse_show(&opts.firstboot_unit, &out.stdout_text()).active_state)
        }
        _ => None,
    }
}
