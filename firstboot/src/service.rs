//! Runs the few programs firstboot may start (the service manager, `kubeadm join`), bounded
//! by the global deadline, keeping the tail of their output for the failure message.

use std::io::Read;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How much of each output stream is kept.
const TAIL: usize = 2048;

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

fn tail_reader(mut r: impl Read + Send + 'static) -> thread::JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut keep = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            keep.extend_from_slice(&buf[..n]);
            if keep.len() > TAIL {
                keep.drain(..keep.len() - TAIL);
            }
        }
        keep
    })
}

/// Runs `program args…` and waits until it exits or `deadline` passes.
pub fn run(program: &str, args: &[&str], deadline: Instant) -> Result<(), ToolError> {
    let shown = {
        let mut s = program.to_string();
        for a in args {
            s.push(' ');
            s.push_str(a);
        }
        s
    };
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ToolError::Spawn(format!("cannot run {shown}: {e}")))?;
    let out = child.stdout.take().map(tail_reader);
    let err = child.stderr.take().map(tail_reader);
    // Poll quickly at first: systemctl --no-block returns in a millisecond or two.
    let mut pause = Duration::from_micros(50);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(ToolError::Failed(format!("waiting for {shown}: {e}"))),
        }
        let now = Instant::now();
        if now >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(ToolError::Timeout(format!(
                "{shown} was still running at the deadline and was stopped"
            )));
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    if status.success() {
        return Ok(());
    }
    let mut tail = String::new();
    for h in [err, out].into_iter().flatten() {
        if let Ok(bytes) = h.join() {
            let text = String::from_utf8_lossy(&bytes);
            let text = text.trim();
            if !text.is_empty() {
                if !tail.is_empty() {
                    tail.push_str(" | ");
                }
                tail.push_str(&text.replace('\n', " | "));
            }
        }
    }
    let how = match status.code() {
        Some(c) => format!("exited with status {c}"),
        None => "was killed by a signal".to_string(),
    };
    Err(ToolError::Failed(if tail.is_empty() {
        format!("{shown} {how}")
    } else {
        format!("{shown} {how}: {tail}")
    }))
}
