//! The reporter as `kiln-firstboot report` uses it, after the run: rebuilt from status.json,
//! then a diagnosis recorded, a later observation added, or a recovery.

use std::fmt::Write as _;

use super::*;

impl Reporter {
    /// Rebuilds a reporter from an existing status.json (for `report`), keeping its identity
    /// and phases. Gives the console back when the text is not a status file.
    pub fn resume(
        paths: &NodePaths,
        console: Console,
        text: &str,
    ) -> Result<Reporter, (json::ParseError, Console)> {
        let v = match json::parse(text) {
            Ok(v) => v,
            Err(e) => return Err((e, console)),
        };
        let mut r = Reporter::with_console(paths, console);
        let s = |key: &str| v.get(key).and_then(json::Value::as_text).unwrap_or("");
        r.identity(s("provider"), s("node_name"), s("image_id"));
        r.warnings = v
            .get("warnings")
            .and_then(json::Value::as_array)
            .unwrap_or(&[])
            .iter()
            .filter_map(json::Value::as_text)
            .map(str::to_string)
            .collect();
        let reason_of = |code: &str| Reason::ALL.into_iter().find(|r| r.code() == code);
        for p in v
            .get("phases")
            .and_then(json::Value::as_array)
            .unwrap_or(&[])
        {
            let name = p.get("name").and_then(json::Value::as_text).unwrap_or("");
            let Some(phase) = Phase::ALL.into_iter().find(|ph| ph.name() == name) else {
                continue;
            };
            let result = match p.get("result").and_then(json::Value::as_text) {
                Some("success") => PhaseResult::Success,
                Some("failure") => PhaseResult::Failure,
                Some("skipped") => PhaseResult::Skipped,
                _ => PhaseResult::Running,
            };
            r.phases.push(PhaseRecord {
                phase,
                start_ms: p.get("start_ms").and_then(json::Value::as_u64).unwrap_or(0),
                end_ms: p.get("end_ms").and_then(json::Value::as_u64),
                result,
                reason: p
                    .get("reason")
                    .and_then(json::Value::as_text)
                    .and_then(reason_of),
            });
        }
        Ok(r)
    }

    /// Records a diagnosis made after the run (by `report`) as the run's outcome, replacing an
    /// earlier one, and publishes it like [`Reporter::finish`].
    pub fn conclude(&mut self, diagnosis: &Diagnosis) {
        self.reason = Some(diagnosis.reason);
        self.message.clear();
        let message = self.redactor.redact(&diagnosis.message);
        push_capped(&mut self.message, message.as_str(), MESSAGE_CAP);
        self.set_log(&diagnosis.log);
        self.units = diagnosis.units.clone();
        let mut line = String::with_capacity(96);
        let _ = write!(
            line,
            "kiln-firstboot: report result=failure reason={}",
            diagnosis.reason.code()
        );
        self.console.line(&self.redactor.redact(&line));
        self.finish();
    }

    /// Records that kubelet is healthy and joined again after a failure `report` had
    /// recorded (or the run's own): the outcome becomes `success`, the reason, message, log
    /// and unit states of the failure are dropped, the failure files are removed and the
    /// success sentinel is written. The boot's phases stay as they were.
    pub fn recovered(&mut self, units: &[UnitState]) {
        self.reason = None;
        self.message.clear();
        self.log.clear();
        self.units = units.to_vec();
        self.outcome = Outcome::Success;
        self.console.line(
            &self
                .redactor
                .redact("kiln-firstboot: report result=success recovered"),
        );
        self.write_status();
        if let Err(e) = publish_outcome_files(
            &self.paths,
            Outcome::Success,
            Reason::Ok,
            "",
            &self.redactor,
        ) {
            self.warn_write(&e);
        }
        self.publish_final();
    }
}

/// Adds what `report` saw after the failure status.json keeps (`later`: `CODE: message`) to
/// the file's `text` as written, whose `later` entries are `later`, unless the newest of them
/// already says the same or `MAX_LATER` are there. Everything else stays as the run wrote
/// it: the first cause, `kept`, is the one to fix. Says whether it added one.
pub fn note_later(
    paths: &NodePaths,
    console: &mut Console,
    (text, later): (&str, &[String]),
    kept: Reason,
    diagnosis: &Diagnosis,
    redactor: &Redactor,
) -> Result<bool, WriteError> {
    let code = diagnosis.reason.code();
    let same = later
        .last()
        .is_some_and(|l| l.strip_prefix(code).is_some_and(|r| r.starts_with(':')));
    // `later` is rendered last, after all the run wrote: the document up to the list's `]`
    // (or to the object's `}` before there is one) is kept byte for byte.
    let body = text.trim_end().strip_suffix('}');
    let head = match later.is_empty() {
        true => body,
        false => body.and_then(|b| b.strip_suffix(']')),
    };
    let Some(head) = head.filter(|_| !same && later.len() < MAX_LATER) else {
        return Ok(false);
    };
    let mut entry = String::with_capacity(MESSAGE_CAP);
    entry.push_str(code);
    entry.push_str(": ");
    push_capped(
        &mut entry,
        redactor.redact(&diagnosis.message).as_str(),
        MESSAGE_CAP,
    );
    let mut out = String::with_capacity(head.len() + MESSAGE_CAP + 16);
    out.push_str(head);
    out.push_str(if later.is_empty() {
        ",\"later\":["
    } else {
        ","
    });
    json::write_str(&mut out, &entry);
    out.push_str("]}\n");
    write_atomic(&paths.status_json, &redactor.redact(&out), 0o644)?;
    let mut line = String::with_capacity(96);
    line.push_str("kiln-firstboot: report later=");
    line.push_str(code);
    line.push_str(" (the reason stays ");
    line.push_str(kept.code());
    line.push(')');
    console.line(&redactor.redact(&line));
    Ok(true)
}
