//! The one process runner: starts the few programs firstboot may run (the service manager,
//! `kubeadm join`, `systemctl show`, `journalctl`, `vmware-rpctool`), bounded by a deadline,
//! reading their output on threads so a full pipe cannot stall them.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How much of each output stream [`run`] keeps for its message: the tail.
const TAIL: usize = 2048;
/// How much of each output stream [`output`] keeps: the head (enough for 200 journal lines
/// per unit; more is cut, not buffered).
const HEAD: usize = 1 << 20;

/// How a tool run ended, when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolError {
    /// It could not be started.
    Spawn(String),
    /// It exited non-zero (or by a signal); the message holds the exit and output tail.
    Failed(String),
    /// It was still running at the deadline and was killed.
    Timeout(String),
}

impl ToolError {
    /// The message, whichever way it failed.
    pub fn message(&self) -> &str {
        match self {
            ToolError::Spawn(m) | ToolError::Failed(m) | ToolError::Timeout(m) => m,
        }
    }
}

/// Which part of an output stream to keep.
#[derive(Debug, Clone, Copy)]
enum Keep {
    /// The first bytes, up to this many; the rest is read and dropped.
    Head(usize),
    /// The last bytes, up to this many, from the start of a line when there is one.
    Tail(usize),
}

/// Reads a stream to its end on a thread, keeping the part `keep` says.
fn reader(mut r: impl Read + Send + 'static, keep: Keep) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut kept = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            match keep {
                Keep::Head(max) => {
                    let room = max.saturating_sub(kept.len());
                    kept.extend_from_slice(&buf[..n.min(room)]);
                }
                Keep::Tail(max) => {
                    kept.extend_from_slice(&buf[..n]);
                    if kept.len() > max {
                        let mut cut = kept.len() - max;
                        // Start at a line: a line cut in the middle could begin with the
                        // unmatchable second half of a secret (a token's last characters).
                        if let Some(nl) = kept[cut..].iter().position(|&c| c == b'\n') {
                            cut += nl + 1;
                        }
                        kept.drain(..cut);
                    }
                }
            }
        }
        kept
    })
}

/// What a finished program printed and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// It exited with status 0.
    pub success: bool,
    /// Its exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    /// What it wrote to stdout (the kept part).
    pub stdout: Vec<u8>,
    /// What it wrote to stderr (the kept part).
    pub stderr: Vec<u8>,
}

impl Output {
    /// stdout as text, invalid UTF-8 replaced.
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text, invalid UTF-8 replaced.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// `program args…` as messages show it.
fn shown(program: &Path, args: &[&str]) -> String {
    let mut s = program.display().to_string();
    for a in args {
        s.push(' ');
        s.push_str(a);
    }
    s
}

/// Starts `program args…` with no stdin and both outputs read, and waits until it exits or
/// `deadline` passes (then it is killed).
fn exec(program: &Path, args: &[&str], deadline: Instant, keep: Keep) -> Result<Output, ToolError> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ToolError::Spawn(format!("cannot run {}: {e}", shown(program, args))))?;
    let out = child.stdout.take().map(|r| reader(r, keep));
    let err = child.stderr.take().map(|r| reader(r, keep));
    // Poll quickly at first: systemctl --no-block returns in a millisecond or two.
    let mut pause = Duration::from_micros(50);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                return Err(ToolError::Failed(format!(
                    "waiting for {}: {e}",
                    shown(program, args)
                )))
            }
        }
        let now = Instant::now();
        if now >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ToolError::Timeout(format!(
                "{} was still running at the deadline and was stopped",
                shown(program, args)
            )));
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    let join =
        |h: Option<thread::JoinHandle<Vec<u8>>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
    Ok(Output {
        success: status.success(),
        code: status.code(),
        stdout: join(out),
        stderr: join(err),
    })
}

/// Runs `program args…` until it exits or `deadline` passes and returns what it printed
/// (the first MiB of each stream): for tools whose answer is their output, such as
/// `systemctl show`, `journalctl` and `vmware-rpctool`. A non-zero exit is an [`Output`],
/// not an error.
pub fn output(
    program: impl AsRef<Path>,
    args: &[&str],
    deadline: Instant,
) -> Result<Output, ToolError> {
    exec(program.as_ref(), args, deadline, Keep::Head(HEAD))
}

/// Runs `program args…` and waits until it exits or `deadline` passes; a non-zero exit is
/// an error whose message holds the exit and the tail of the output.
pub fn run(program: &str, args: &[&str], deadline: Instant) -> Result<(), ToolError> {
    let program = Path::new(program);
    let out = exec(program, args, deadline, Keep::Tail(TAIL))?;
    if out.success {
        return Ok(());
    }
    let mut tail = String::new();
    for bytes in [&out.stderr, &out.stdout] {
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim();
        if !text.is_empty() {
            if !tail.is_empty() {
                tail.push_str(" | ");
            }
            tail.push_str(&text.replace('\n', " | "));
        }
    }
    let how = match out.code {
        Some(c) => format!("exited with status {c}"),
        None => "was killed by a signal".to_string(),
    };
    let shown = shown(program, args);
    Err(ToolError::Failed(if tail.is_empty() {
        format!("{shown} {how}")
    } else {
        format!("{shown} {how}: {tail}")
    }))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[test]
    fn output_keeps_the_head_and_run_the_tail() {
        let script = "i=0; while [ $i -lt 3000 ]; do echo line$i; i=$((i+1)); done; exit 3";
        let out = output("/bin/sh", &["-c", script], soon()).unwrap();
        assert!(!out.success);
        assert_eq!(out.code, Some(3));
        assert!(out.stdout_text().starts_with("line0\nline1\n"));
        assert!(out.stdout_text().ends_with("line2999\n"));
        let e = run("/bin/sh", &["-c", script], soon()).unwrap_err();
        let ToolError::Failed(m) = e else {
            panic!("{e:?}")
        };
        assert!(
            m.contains("exited with status 3") && m.ends_with("line2999"),
            "{m}"
        );
        assert!(!m.contains("line0 "), "{m}");
    }

    #[test]
    fn a_missing_program_and_a_hung_one_are_errors() {
        let e = output("/nonexistent/tool", &["x"], soon()).unwrap_err();
        assert!(
            matches!(&e, ToolError::Spawn(m) if m.starts_with("cannot run /nonexistent/tool x")),
            "{e:?}"
        );
        let start = Instant::now();
        let e = output(
            "/bin/sh",
            &["-c", "sleep 5"],
            start + Duration::from_millis(200),
        )
        .unwrap_err();
        assert!(matches!(e, ToolError::Timeout(_)), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(4));
    }
}
