//! `kubeadm join` for `JOIN_MODE=kubeadm`: its whole output is kept in
//! [`KUBEADM_JOIN_LOG`](crate::contract::paths::KUBEADM_JOIN_LOG) and a failure's message
//! keeps kubeadm's own error lines, which its warnings would otherwise crowd out of the cap.

use std::path::Path;
use std::time::Instant;

use crate::contract::paths::NodePaths;
use crate::contract::status_json::MESSAGE_CAP;
use crate::error::Error;
use crate::redact::Redactor;
use crate::text::push_capped;
use crate::{config, fsutil, service, Reason};

/// Runs `kubeadm join --config CONFIG` to its end or the deadline. Its output (stderr, then
/// stdout) goes to the log file, redacted, mode 0600, whatever the outcome.
pub fn join(
    kubeadm: &str,
    config: &str,
    paths: &NodePaths,
    deadline: Instant,
) -> Result<(), Error> {
    let failed = |message: String| Error::start(Reason::KubeadmFailed, message);
    let out = service::output(kubeadm, &["join", "--config", config], deadline)
        .map_err(|e| failed(e.message().to_string()))?;
    let (stderr, stdout) = (out.stderr_text(), out.stdout_text());
    let mut redactor = Redactor::shapes_only();
    redactor.add_all(config::node_secrets(paths).values());
    let mut all = String::with_capacity(stderr.len() + stdout.len() + 1);
    all.push_str(&stderr);
    all.push('\n');
    all.push_str(&stdout);
    let saved = save(&paths.kubeadm_join_log, redactor.redact(&all).as_str());
    if out.success {
        return Ok(());
    }
    let how = match out.code {
        Some(c) => "kubeadm join exited with status ".to_string() + &c.to_string(),
        None => "kubeadm join was killed by a signal".to_string(),
    };
    // An unsaved log is not fatal: the hint's pointer then leads to the journal alone.
    let _ = saved;
    let message = failure_message(&how, &all);
    Err(failed(message))
}

fn save(path: &Path, text: &str) -> std::io::Result<()> {
    fsutil::write_atomic(path, text.as_bytes(), 0o600)
}

/// kubeadm's error lines first: `error execution phase …` (`cmd/kubeadm/app/cmd/phases/
/// workflow/runner.go` wraps a phase's error in it) and preflight's `[ERROR Name]: …` lines
/// (`cmd/kubeadm/app/preflight/checks.go`), then its other lines, leaving out its warnings
/// (`[WARNING Name]: …` and klog's `W0115 …` lines) and the stack-trace advice, joined by
/// ` | ` within [`MESSAGE_CAP`].
pub fn failure_message(how: &str, output: &str) -> String {
    let lines: Vec<&str> = output
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let error = |l: &str| l.starts_with("error execution phase") || l.contains("[ERROR ");
    let warning = |l: &str| {
        let b = l.as_bytes();
        l.contains("[WARNING ")
            || l.starts_with("To see the stack trace")
            || (b.len() > 5 && b[0] == b'W' && b[1..5].iter().all(u8::is_ascii_digit))
    };
    let mut m = String::with_capacity(MESSAGE_CAP);
    m.push_str(how);
    let mut sep = ": ";
    let picked = lines
        .iter()
        .filter(|l| error(l))
        .chain(lines.iter().filter(|l| !error(l) && !warning(l)));
    for l in picked {
        if m.len() + sep.len() >= MESSAGE_CAP {
            break;
        }
        m.push_str(sep);
        push_capped(&mut m, l, MESSAGE_CAP);
        sep = " | ";
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_come_first_and_warnings_are_dropped() {
        let warn = "W0115 10:00:00.000000 1 checks.go:1] the fallback for runtimes without RuntimeConfig will be removed in 1.37. For more information see the docs and this line is long enough to matter";
        let mut out = String::new();
        for _ in 0..8 {
            out.push_str(warn);
            out.push('\n');
        }
        out.push_str("[preflight] Running pre-flight checks\n\t[WARNING SystemVerification]: cgroups v1 support is in maintenance mode\n");
        out.push_str("error execution phase preflight: [preflight] Some fatal errors occurred:\n\t[ERROR SystemVerification]: missing required cgroups: cpu\n[preflight] If you know what you are doing, you can make a check non-fatal with `--ignore-preflight-errors=...`\nTo see the stack trace of this error execute with --v=5 or higher\n");
        let m = failure_message("kubeadm join exited with status 1", &out);
        assert!(m.len() <= MESSAGE_CAP, "{}", m.len());
        assert!(
            m.starts_with("kubeadm join exited with status 1: error execution phase preflight: [preflight] Some fatal errors occurred: | [ERROR SystemVerification]: missing required cgroups: cpu | [preflight] Running pre-flight checks"),
            "{m}"
        );
        assert!(
            !m.contains("WARNING") && !m.contains("1.37") && !m.contains("stack trace"),
            "{m}"
        );
        // Errors alone past the cap: cut, never over it.
        let many = "\t[ERROR X]: ".to_string() + &"y".repeat(300) + "\n";
        let m = failure_message("kubeadm join exited with status 1", &many.repeat(4));
        assert!(
            m.len() <= MESSAGE_CAP && m.contains("[ERROR X]"),
            "{}",
            m.len()
        );
    }
}
