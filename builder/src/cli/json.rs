//! `--json`: one schema for every command (docs/cli.md, "JSON output"). Each line is one
//! object with `event` (what the line is) and `level` (`info`, `warning` or `error`) beside
//! the command's own fields. The last line is `result` (the command ran to
//! its end: `command`, `exit`, `ok`) or `error` (it stopped: `command`, `exit`, `reason`,
//! `message`, `causes`), and its `exit` is the process's exit status. Human text (warnings,
//! which key is trusted) stays on stderr; stdout holds only these lines, except where a
//! command writes its product to stdout (`kiln render` without `--output`, `kiln
//! completions`): its events then go to stderr.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use serde_json::{Map, Value};

/// The command's name (`lock verify`), set once when `--json` is given.
static COMMAND: OnceLock<String> = OnceLock::new();
/// Whether the events go to stderr, stdout being the command's product.
static TO_STDERR: AtomicBool = AtomicBool::new(false);
/// Whether the final line (`result` or `error`) was written.
static ENDED: AtomicBool = AtomicBool::new(false);

/// Turns the schema on for `command`.
pub(crate) fn enable(command: String) {
    let _ = COMMAND.set(command);
}

/// Whether `--json` was given.
pub(crate) fn enabled() -> bool {
    COMMAND.get().is_some()
}

/// Sends every later event to stderr: stdout carries the command's product.
pub(crate) fn events_to_stderr() {
    TO_STDERR.store(true, Ordering::SeqCst);
}

/// A line's level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Level {
    /// Something that happened.
    Info,
    /// Something the reader should look at; the command goes on.
    Warning,
    /// A failure.
    Error,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }
}

/// One event line: `event` and `level` with `fields` (an object's keys; any other value as
/// `value`). An `event` or `level` key in `fields` is replaced.
pub(crate) fn line(event: &str, level: Level, fields: Value) -> String {
    let mut m = Map::new();
    m.insert("event".into(), event.into());
    m.insert("level".into(), level.name().into());
    match fields {
        Value::Object(f) => {
            for (k, v) in f {
                if k != "event" && k != "level" {
                    m.insert(k, v);
                }
            }
        }
        Value::Null => {}
        other => {
            m.insert("value".into(), other);
        }
    }
    Value::Object(m).to_string()
}

/// Writes one event line where events go (stdout, or stderr after [`events_to_stderr`]).
/// A closed stdout ends the command as `println!` does (`cli::main` exits 141).
pub(crate) fn emit(event: &str, level: Level, fields: Value) {
    let l = line(event, level, fields);
    if TO_STDERR.load(Ordering::SeqCst) {
        eprintln!("{l}");
    } else {
        println!("{l}");
    }
}

/// The final line, written without panicking: the command is over, whether or not anyone
/// still reads.
fn emit_final(event: &str, level: Level, fields: Value) {
    let l = line(event, level, fields);
    let _ = if TO_STDERR.load(Ordering::SeqCst) {
        writeln!(std::io::stderr(), "{l}")
    } else {
        writeln!(std::io::stdout(), "{l}")
    };
}

/// The command ends with no final line: its reader has gone (exit 141).
pub(crate) fn ended_quietly() {
    ENDED.store(true, Ordering::SeqCst);
}

/// An already-serialized event (a struct tagged `event`) given its `level`.
pub(crate) fn emit_serialized<T: serde::Serialize>(level: Level, value: &T) {
    let v = serde_json::to_value(value).unwrap_or(Value::Null);
    let event = v
        .get("event")
        .and_then(Value::as_str)
        .unwrap_or("data")
        .to_string();
    emit(&event, level, v);
}

/// The word for an exit status, as docs/cli.md's exit code table gives it.
pub(crate) fn reason(exit: u8) -> &'static str {
    match exit {
        0 => "success",
        2 => "usage",
        3 => "check_failed",
        4 => "source_failed",
        5 => "lock_behind",
        6 => "advisory",
        _ => "failure",
    }
}

/// The final `error` line of a command that stopped on `err` with `exit`.
pub(crate) fn error(err: &anyhow::Error, exit: u8) {
    if !enabled() || ENDED.swap(true, Ordering::SeqCst) {
        return;
    }
    let causes: Vec<String> = err.chain().skip(1).map(ToString::to_string).collect();
    emit_final(
        "error",
        Level::Error,
        serde_json::json!({
            "command": COMMAND.get(), "exit": exit, "reason": reason(exit),
            "message": err.to_string(), "causes": causes,
        }),
    );
}

/// The final `error` line of a command line clap refused (exit 2), when `--json` is among
/// the arguments.
pub(crate) fn usage_error(message: &str) {
    if ENDED.swap(true, Ordering::SeqCst) {
        return;
    }
    let first = message
        .lines()
        .next()
        .unwrap_or("")
        .trim_start_matches("error: ");
    emit_final(
        "error",
        Level::Error,
        serde_json::json!({"command": null, "exit": 2, "reason": "usage", "message": first, "causes": []}),
    );
    let _ = std::io::stdout().flush();
}

/// The final `result` line of a command that ran to its end with `exit` (which need not be
/// 0: `kiln diff` exits 1 for layers that differ, `kiln lock outdated` 5 for a lock behind).
pub(crate) fn result(exit: u8) {
    if !enabled() || ENDED.swap(true, Ordering::SeqCst) {
        return;
    }
    emit_final(
        "result",
        if exit == 0 { Level::Info } else { Level::Error },
        serde_json::json!({"command": COMMAND.get(), "exit": exit, "reason": reason(exit), "ok": exit == 0}),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_and_level_are_always_there_and_cannot_be_overridden() {
        let parse = |l: String| serde_json::from_str::<Value>(&l).unwrap();
        let l = line(
            "plan",
            Level::Warning,
            serde_json::json!({"event": "x", "level": "y", "a": 1}),
        );
        assert_eq!(
            parse(l),
            serde_json::json!({"event": "plan", "level": "warning", "a": 1})
        );
        assert_eq!(
            parse(line("n", Level::Info, serde_json::json!(3))),
            serde_json::json!({"event": "n", "level": "info", "value": 3})
        );
    }
}
