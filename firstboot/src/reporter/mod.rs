//! Progress and outcome reporting: `/run/kiln/status.json`, console lines, sentinels.
//!
//! The run loop talks to one [`Reporter`]: `begin` a phase, then end it with `success`,
//! `failure` or `skipped`, and `finish` once. Every call rewrites status.json atomically, so a
//! crash at any point leaves a file that tells the truth about what had happened by then.
//! `kiln-firstboot status` reads the file back ([`crate::report::cmd_status`]).
//!
//! Every string the reporter takes in (messages, log lines, identity, details) is redacted
//! as it arrives, before it is capped or JSON-escaped, and every document it writes is
//! redacted again as a whole: the file, console and channel writers only take a
//! [`Redacted`](crate::redact::Redacted).

use std::fmt::Write as _;
use std::path::PathBuf;

use crate::clock;
use crate::console::{Console, STATUS_PREFIX};
use crate::contract;
use crate::contract::paths::NodePaths;
use crate::contract::status_json::MESSAGE_CAP;
use crate::diagnose::{Diagnosis, UnitState};
use crate::json;
use crate::provider::{self, Provider, ReportTarget};
use crate::redact::{self, Redactor, Secrets};
use crate::text::push_capped;
use crate::Reason;

pub mod after;
mod files;
pub mod model;

pub use files::{publish_outcome_files, write_atomic, WriteError};
pub use model::{Outcome, Phase, PhaseRecord, PhaseResult};
use model::{MAX_LATER, MAX_WARNINGS};

/// Collects the phases of one run and publishes them.
#[derive(Debug)]
pub struct Reporter {
    paths: NodePaths,
    console: Console,
    /// The platform whose report-back channel gets the final status, and where it is.
    report_back: Option<(Provider, ReportTarget)>,
    provider: String,
    node_name: String,
    image_id: String,
    phases: Vec<PhaseRecord>,
    outcome: Outcome,
    reason: Option<Reason>,
    message: String,
    log: Vec<String>,
    units: Vec<UnitState>,
    /// The `"sizing"` object, rendered, once decided.
    sizing: String,
    /// The `"sysctl"` array, rendered, once applied.
    sysctl: String,
    /// What did not fail the run but an operator should know, one sentence each: defaults
    /// that stood in for something the node should have had, an auto-detected `none`, a
    /// refused metadata address.
    warnings: Vec<String>,
    /// Warnings beyond [`MAX_WARNINGS`], counted, not kept or printed.
    warnings_dropped: usize,
    /// The `"doctor"` object (its warn and fail checks), rendered, when a failed run ran it.
    doctor: String,
    /// The status JSON as last written (redacted).
    buf: String,
    write_warned: bool,
    /// Shapes only until the run read its credentials ([`Reporter::add_secrets`]).
    redactor: Redactor,
}

impl Reporter {
    /// A reporter writing the node's status files (`paths`) and to `console`, or to the first
    /// default console that opens when `console` is `None`.
    pub fn new(paths: &NodePaths, console: Option<PathBuf>) -> Reporter {
        Reporter::with_console(paths, Console::open(console.as_deref()))
    }

    /// A reporter with an already opened (or absent) console.
    pub fn with_console(paths: &NodePaths, console: Console) -> Reporter {
        Reporter {
            // Its own copy, built from the same root: `under` is linked anyway, while a
            // clone of every path would be code of its own in the static binary.
            paths: NodePaths::under(&paths.root),
            console,
            report_back: None,
            provider: String::new(),
            node_name: String::new(),
            image_id: String::new(),
            phases: Vec::with_capacity(Phase::ALL.len()),
            outcome: Outcome::Running,
            reason: None,
            message: String::new(),
            log: Vec::new(),
            units: Vec::new(),
            sizing: String::new(),
            sysctl: String::new(),
            warnings: Vec::new(),
            warnings_dropped: 0,
            doctor: String::new(),
            buf: String::with_capacity(2048),
            write_warned: false,
            redactor: Redactor::shapes_only(),
        }
    }

    /// Teaches the redactor the secret values the run has read so far.
    pub fn add_secrets(&mut self, secrets: &Secrets) {
        self.redactor.add_all(secrets.values());
    }

    /// Replaces the redactor (`report` builds its own from the node's credentials).
    pub fn set_redactor(&mut self, redactor: Redactor) {
        self.redactor = redactor;
    }

    /// The run's redactor, for output that does not go through the reporter (stderr).
    pub fn redactor(&self) -> &Redactor {
        &self.redactor
    }

    /// Records who this node is, as soon as it is known.
    pub fn identity(&mut self, provider: &str, node_name: &str, image_id: &str) {
        self.provider = self.redactor.redact(provider).into_string();
        self.node_name = self.redactor.redact(node_name).into_string();
        self.image_id = self.redactor.redact(image_id).into_string();
    }

    /// Records what was decided about the node's size; each warning also goes to the console.
    pub fn sizing(&mut self, sizing: &crate::sizing::Sizing) {
        self.sizing.clear();
        sizing.render_json(&mut self.sizing);
        for w in &sizing.warnings {
            self.warn(w);
        }
    }

    /// Records the kernel parameters the run wrote: `(name, value, why not)`; each failure is
    /// also a warning.
    pub fn sysctl(&mut self, applied: &[(&str, &str, Option<String>)]) {
        let mut s = String::from("[");
        for (i, (k, v, err)) in applied.iter().enumerate() {
            if i > 0 {
                s.push(',');
            }
            s.push_str("{\"name\":");
            json::write_str(&mut s, k);
            s.push_str(",\"value\":");
            json::write_str(&mut s, v);
            s.push_str(if err.is_some() {
                ",\"result\":\"failed\"}"
            } else {
                ",\"result\":\"ok\"}"
            });
            if let Some(e) = err {
                self.warn(&format!("sysctl {k} was not applied: {e}"));
            }
        }
        s.push(']');
        self.sysctl = s;
    }

    /// Sets the platform whose report-back channel `finish` publishes the final status
    /// through ([`provider::MetadataSource::report_back`]).
    pub fn set_report_back(&mut self, provider: Provider, to: ReportTarget) {
        self.report_back = Some((provider, to));
    }

    /// Records a warning: on stderr, on the console, and in status.json's `warnings` (each
    /// at most 512 bytes, at most 8 kept).
    /// Beyond that, warnings are counted and the first one dropped says so, so metadata
    /// with thousands of unusable addresses cannot flood the console.
    pub fn warn(&mut self, text: &str) {
        let text = self.redactor.redact(text);
        let text = text.as_str();
        let mut line = String::with_capacity(32 + text.len().min(MESSAGE_CAP));
        line.push_str("kiln-firstboot: warning: ");
        if self.warnings.len() < MAX_WARNINGS {
            let mut w = String::with_capacity(text.len().min(MESSAGE_CAP));
            push_capped(&mut w, text, MESSAGE_CAP);
            line.push_str(&w);
            self.warnings.push(w);
        } else {
            self.warnings_dropped += 1;
            if self.warnings_dropped > 1 {
                return;
            }
            let _ = write!(
                line,
                "more than {MAX_WARNINGS} warnings: the rest are not shown"
            );
        }
        let line = self.redactor.redact(&line);
        redact::eprint(&line);
        self.console.line(&line);
    }

    /// Records a warning and writes status.json at once, for a run that will wait for long
    /// (an AWS warm pool) before its next phase would write it.
    pub fn warn_now(&mut self, text: &str) {
        self.warn(text);
        self.write_status();
    }

    /// The warnings recorded so far.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Starts a phase.
    pub fn begin(&mut self, phase: Phase) {
        self.phases.push(PhaseRecord {
            phase,
            start_ms: clock::now_ms(),
            end_ms: None,
            result: PhaseResult::Running,
            reason: None,
        });
        self.write_status();
    }

    /// Ends the current phase successfully; `detail` is a short `key=value` note for the console.
    pub fn success(&mut self, phase: Phase, detail: &str) {
        self.end(phase, PhaseResult::Success, None, detail);
    }

    /// Marks a phase as not run (for example the wait phases under `--no-start`).
    pub fn skipped(&mut self, phase: Phase, detail: &str) {
        if !self.phases.iter().any(|r| r.phase == phase) {
            let now = clock::now_ms();
            self.phases.push(PhaseRecord {
                phase,
                start_ms: now,
                end_ms: None,
                result: PhaseResult::Running,
                reason: None,
            });
        }
        self.end(phase, PhaseResult::Skipped, None, detail);
    }

    /// Ends the current phase with a failure. `message` names the file, key or URL involved.
    /// The first failure of a run is the run's reason.
    pub fn failure(&mut self, phase: Phase, reason: Reason, message: &str) {
        if self.reason.is_none() {
            self.reason = Some(reason);
            self.message.clear();
            // Redacted before the cap, so the cap cannot cut a secret in two unmatched halves.
            let message = self.redactor.redact(message);
            push_capped(&mut self.message, message.as_str(), MESSAGE_CAP);
        }
        let mut detail = String::with_capacity(32);
        detail.push_str("reason=");
        detail.push_str(reason.code());
        self.end(phase, PhaseResult::Failure, Some(reason), &detail);
    }

    /// Ends `phase` with the outcome of a diagnosis: its reason, message, log lines and unit
    /// states all go into status.json.
    pub fn failure_diagnosed(&mut self, phase: Phase, diagnosis: &Diagnosis) {
        self.set_log(&diagnosis.log);
        self.units = diagnosis.units.clone();
        self.failure(phase, diagnosis.reason, &diagnosis.message);
    }

    /// Records what `doctor` found after a failure: its warn and fail checks go into
    /// status.json's `"doctor"` and one console line each, so the serial console carries them.
    pub fn doctor(&mut self, checks: &[crate::doctor::Check]) {
        self.doctor = crate::doctor::to_json(checks, true, MESSAGE_CAP);
        for c in checks
            .iter()
            .filter(|c| c.verdict >= crate::doctor::Verdict::Warn)
        {
            let mut line = format!("kiln-firstboot: doctor: {} {}: ", c.verdict.name(), c.name);
            push_capped(&mut line, &c.detail, MESSAGE_CAP);
            if !c.remedy.is_empty() {
                line.push_str(" (remedy: ");
                push_capped(&mut line, &c.remedy, MESSAGE_CAP);
                line.push(')');
            }
            let line = self.redactor.redact(&line);
            self.console.line(&line);
        }
    }

    /// Publishes the final outcome: status.json, the success sentinel or the failure files, the
    /// final console line and the cloud channels.
    pub fn finish(&mut self) {
        let failed =
            self.reason.is_some() || self.phases.iter().any(|r| r.result == PhaseResult::Failure);
        if failed && self.reason.is_none() {
            // A phase failed without a reason: that is a bug in the caller, say so.
            self.reason = Some(Reason::Internal);
            self.message = "a phase failed without a reason code".to_string();
        }
        // A phase left running at finish is one the run abandoned.
        let now = clock::now_ms();
        for rec in self.phases.iter_mut().filter(|r| r.end_ms.is_none()) {
            rec.end_ms = Some(now);
            rec.result = if failed {
                PhaseResult::Failure
            } else {
                PhaseResult::Skipped
            };
        }
        self.outcome = if failed {
            Outcome::Failure
        } else {
            Outcome::Success
        };
        self.write_status();
        // The sentinel says "bootstrap complete": only a run that saw kubelet join may write
        // it (a `--no-start` run succeeds without it).
        let joined = self
            .phases
            .iter()
            .any(|r| r.phase == Phase::WaitJoined && r.result == PhaseResult::Success);
        let outcome_files = match self.outcome {
            Outcome::Success if !joined => Ok(()),
            outcome => publish_outcome_files(
                &self.paths,
                outcome,
                self.reason.unwrap_or(Reason::Ok),
                &self.message,
                &self.redactor,
            ),
        };
        if let Err(e) = outcome_files {
            self.warn_write(&e);
        }
        self.publish_final();
    }

    /// The final `KILN-STATUS` console line and the cloud channel.
    fn publish_final(&mut self) {
        let mut line = String::with_capacity(STATUS_PREFIX.len() + self.buf.len());
        line.push_str(STATUS_PREFIX);
        line.push_str(self.buf.trim_end());
        self.console.line(&self.redactor.redact(&line));
        #[cfg(windows)]
        crate::windows::eventlog::publish(self.reason, &self.message, &line, &self.redactor);
        if let Some((p, to)) = &self.report_back {
            let json = self.redactor.redact(self.buf.trim_end());
            if let Err(err) = provider::source(*p).report_back(to, &json) {
                redact::eprint(
                    &self
                        .redactor
                        .redact(&format!("kiln-firstboot: warning: {err}")),
                );
            }
        }
    }

    fn set_log(&mut self, log: &[String]) {
        self.log = log
            .iter()
            .map(|l| self.redactor.redact(l).into_string())
            .collect();
    }

    /// The overall result so far.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// The run's reason: `OK` on success or while running without a failure.
    pub fn reason(&self) -> Reason {
        self.reason.unwrap_or(Reason::Ok)
    }

    /// The process exit code for the run as reported.
    pub fn exit_code(&self) -> u8 {
        self.reason().exit_code()
    }

    /// The phases recorded so far.
    pub fn phases(&self) -> &[PhaseRecord] {
        &self.phases
    }

    /// The status JSON as last written (empty before the first write).
    pub fn last_json(&self) -> &str {
        self.buf.trim_end()
    }

    fn end(&mut self, phase: Phase, result: PhaseResult, reason: Option<Reason>, detail: &str) {
        let now = clock::now_ms();
        let Some(rec) = self.phases.iter_mut().rev().find(|r| r.phase == phase) else {
            return;
        };
        rec.end_ms = Some(now);
        rec.result = result;
        rec.reason = reason;
        let ms = now.saturating_sub(rec.start_ms);
        let mut line = String::with_capacity(96 + detail.len());
        let _ = write!(
            line,
            "kiln-firstboot: phase={} result={} ms={ms}",
            phase.name(),
            result.name()
        );
        if !detail.is_empty() {
            line.push(' ');
            line.push_str(detail);
        }
        self.console.line(&self.redactor.redact(&line));
        self.write_status();
    }

    /// Renders status.json into `self.buf` and replaces the file atomically.
    fn write_status(&mut self) {
        let mut buf = std::mem::take(&mut self.buf);
        buf.clear();
        self.render(&mut buf);
        // The parts were redacted as they came in; the whole is redacted once more, because
        // only a `Redacted` can be written.
        let doc = self.redactor.redact(&buf);
        let written = write_atomic(&self.paths.status_json, &doc, 0o644);
        self.buf = doc.into_string();
        if let Err(e) = written {
            self.warn_write(&e);
        }
    }

    fn warn_write(&mut self, e: &WriteError) {
        if !self.write_warned {
            redact::eprint(
                &self
                    .redactor
                    .redact(&format!("kiln-firstboot: warning: {e}")),
            );
            self.write_warned = true;
        }
    }

    /// The status JSON, keys in the contract's order, one line, newline-terminated.
    fn render(&self, out: &mut String) {
        let _ = write!(
            out,
            "{{\"kiln_contract\":{},\"kiln_version\":\"{}\"",
            contract::VERSION,
            env!("CARGO_PKG_VERSION")
        );
        for (key, value) in [
            ("image_id", &self.image_id),
            ("provider", &self.provider),
            ("node_name", &self.node_name),
        ] {
            if !value.is_empty() {
                out.push_str(",\"");
                out.push_str(key);
                out.push_str("\":");
                json::write_str(out, value);
            }
        }
        out.push_str(",\"result\":\"");
        out.push_str(self.outcome.name());
        out.push('"');
        if let Some(reason) = self.reason {
            out.push_str(",\"reason\":\"");
            out.push_str(reason.code());
            out.push_str("\",\"message\":");
            json::write_str(out, &self.message);
            out.push_str(",\"hint\":");
            json::write_str(out, reason.hint());
        }
        out.push_str(",\"phases\":[");
        for (i, rec) in self.phases.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(
                out,
                "{{\"name\":\"{}\",\"start_ms\":{}",
                rec.phase.name(),
                rec.start_ms
            );
            if let Some(end) = rec.end_ms {
                let _ = write!(out, ",\"end_ms\":{end}");
            }
            out.push_str(",\"result\":\"");
            out.push_str(rec.result.name());
            out.push('"');
            if let Some(reason) = rec.reason {
                out.push_str(",\"reason\":\"");
                out.push_str(reason.code());
                out.push('"');
            }
            out.push('}');
        }
        out.push(']');
        if !self.sizing.is_empty() {
            out.push_str(",\"sizing\":");
            out.push_str(&self.sizing);
        }
        if !self.sysctl.is_empty() {
            out.push_str(",\"sysctl\":");
            out.push_str(&self.sysctl);
        }
        if !self.warnings.is_empty() {
            out.push_str(",\"warnings\":[");
            for (i, w) in self.warnings.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json::write_str(out, w);
            }
            out.push(']');
        }
        if !self.log.is_empty() {
            out.push_str(",\"log\":[");
            for (i, line) in self.log.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json::write_str(out, line);
            }
            out.push(']');
        }
        if !self.doctor.is_empty() {
            out.push_str(",\"doctor\":");
            out.push_str(&self.doctor);
        }
        if !self.units.is_empty() {
            out.push_str(",\"units\":[");
            for (i, u) in self.units.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                u.render_json(out);
            }
            out.push(']');
        }
        out.push_str("}\n");
    }
}
