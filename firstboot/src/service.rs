//! The one process runner: starts the few programs firstboot may run (the service manager,
//! `kubeadm join`, `systemctl show`, `journalctl`, `vmware-rpctool`, `schtasks.exe`), bounded
//! by a deadline, reading their output on threads so a full pipe cannot stall them.
//!
//! The deadline bounds the whole run of a tool, not only the tool's own process: a child
//! (or a service manager's helper) that forks and leaves a grandchild holding the output
//! pipes must not hold the boot until that grandchild ends. So the output is never waited
//! for past `EOF_GRACE` once the tool exited, nor past the deadline; at the deadline the
//! tool's whole process group is killed (Unix), not only the tool.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// How much of each output stream [`run`] keeps for its message: the tail.
const TAIL: usize = 2048;
/// How much of each output stream [`output`] keeps: the head (enough for 200 journal lines
/// per unit; more is cut, not buffered).
const HEAD: usize = 1 << 20;
/// How long the output is still read after the tool exited: what it wrote just before
/// exiting is in the pipe already, so only a process it left behind holding the pipe makes
/// this wait run out; what that process writes later is not the tool's answer.
const EOF_GRACE: Duration = Duration::from_millis(200);

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

impl Keep {
    /// Adds `chunk` to `kept`, which never grows past the cap plus one chunk.
    fn add(self, kept: &mut Vec<u8>, chunk: &[u8]) {
        match self {
            Keep::Head(max) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Keep::Tail(max) => {
                kept.extend_from_slice(chunk);
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
}

/// What a reader thread has kept so far: shared, so the runner can take it without
/// waiting for the end of a stream that a left-behind process may never close.
type Kept = Arc<Mutex<Vec<u8>>>;

/// One output stream's `read`: boxed, so that one reader serves both streams.
type Reads = Box<dyn FnMut(&mut [u8]) -> std::io::Result<usize> + Send>;

/// A stream read on a thread of its own: what it kept so far, and the thread.
struct Reader {
    kept: Kept,
    thread: thread::JoinHandle<()>,
}

/// Runs `task` on a thread of its own. Every detached thread of firstboot (these readers,
/// the doctor's name lookup) starts through this one boxed type: each closure type given to
/// `thread::spawn` costs the static binary another copy of std's thread start.
pub(crate) fn detach(task: Box<dyn FnOnce() + Send>) -> thread::JoinHandle<()> {
    thread::spawn(task)
}

/// Reads a stream on a thread, keeping the part `keep` says in the reader's buffer.
fn reader(mut read: Reads, keep: Keep) -> Reader {
    let kept = Kept::default();
    let shared = Arc::clone(&kept);
    let thread = detach(Box::new(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = read(&mut buf) {
            if n == 0 {
                break;
            }
            // A poisoned lock only means the other side panicked; keep reading to drain.
            if let Ok(mut k) = shared.lock() {
                keep.add(&mut k, &buf[..n]);
            }
        }
    }));
    Reader { kept, thread }
}

/// Waits until every reader has finished (its stream ended), or `until`. Polled, not
/// received over a channel: an mpsc channel costs the static binary about 3 KiB of code
/// (as in `doctor::tls::resolve`). The first polls come quickly, as the exit's: a reader
/// ends microseconds after its tool, and a fixed 1 ms sleep cost every boot about 2 ms
/// (the firstboot bench, two tool runs).
fn wait_readers(readers: &[Option<Reader>], until: Instant) {
    let running = || readers.iter().flatten().any(|r| !r.thread.is_finished());
    let mut pause = Duration::from_micros(20);
    while running() && Instant::now() < until {
        thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
}

/// Takes what a reader kept so far (nothing for a stream that was not there).
fn take(reader: Option<Reader>) -> Vec<u8> {
    reader
        .and_then(|r| r.kept.lock().ok().map(|mut k| std::mem::take(&mut *k)))
        .unwrap_or_default()
}

/// Puts the child in a process group of its own (its pid), so [`kill_all`] reaches what it
/// forked too.
#[cfg(unix)]
fn own_group(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
}

#[cfg(not(unix))]
fn own_group(_cmd: &mut Command) {}

/// Kills the child's whole process group with SIGKILL, then the child itself. Called before
/// the child is reaped, so its pid (the group's id) cannot have been reused.
#[cfg(unix)]
fn kill_all(child: &mut Child) {
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    const SIGKILL: i32 = 9;
    if let Ok(pgid) = i32::try_from(child.id()) {
        // SAFETY: kill(2) takes two integers and touches no memory of ours; a negative pid
        // names the process group `pgid`, which `own_group` made the child's own (and the
        // unreaped child keeps the id from being reused).
        unsafe {
            kill(-pgid, SIGKILL);
        }
    }
    let _ = child.kill();
}

/// Windows: TerminateProcess on the tool; a process it left holding the pipes no longer
/// holds the run, which stops reading at the deadline.
#[cfg(not(unix))]
fn kill_all(child: &mut Child) {
    let _ = child.kill();
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
/// `deadline` passes (then it and its process group are killed). Returns by the deadline
/// (plus [`EOF_GRACE`] at most when the tool exits just before it), whatever the tool left
/// behind.
fn exec(program: &Path, args: &[&str], deadline: Instant, keep: Keep) -> Result<Output, ToolError> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    own_group(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| ToolError::Spawn(format!("cannot run {}: {e}", shown(program, args))))?;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let readers = [
        stdout.map(|mut r| reader(Box::new(move |b| r.read(b)), keep)),
        stderr.map(|mut r| reader(Box::new(move |b| r.read(b)), keep)),
    ];
    // Poll quickly at first: systemctl --no-block returns in a millisecond or two.
    let mut pause = Duration::from_micros(50);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => {
                kill_all(&mut child);
                let _ = child.wait();
                return Err(ToolError::Failed(format!(
                    "waiting for {}: {e}",
                    shown(program, args)
                )));
            }
        }
        let now = Instant::now();
        if now >= deadline {
            kill_all(&mut child);
            let _ = child.wait();
            return Err(ToolError::Timeout(format!(
                "{} was still running at the deadline and was stopped",
                shown(program, args)
            )));
        }
        thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(50));
    };
    // The tool has exited: its output is in the pipes already, unless something it left
    // behind still holds them open; that is given a moment, never the rest of the run.
    wait_readers(&readers, Instant::now() + EOF_GRACE);
    let [stdout, stderr] = readers.map(take);
    Ok(Output {
        success: status.success(),
        code: status.code(),
        stdout,
        stderr,
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
    fn what_a_tool_leaves_behind_holding_a_pipe_does_not_hold_the_caller() {
        // stdout closed, stderr kept by a grandchild; then the other way round; then both.
        for script in [
            "echo said; exec >&-; sleep 30 & exit 4",
            "echo said; exec 2>&-; sleep 30 & exit 4",
            "echo said; sleep 30 & exit 4",
        ] {
            let start = Instant::now();
            let out = output("/bin/sh", &["-c", script], soon()).unwrap();
            assert!(start.elapsed() < Duration::from_secs(3), "{script}");
            assert_eq!((out.code, out.stdout_text().as_str()), (Some(4), "said\n"));
            let e = run("/bin/sh", &["-c", script], soon()).unwrap_err();
            assert!(e.message().ends_with("exited with status 4: said"), "{e:?}");
        }
    }

    #[test]
    fn huge_output_is_read_to_the_end_but_kept_to_the_cap() {
        let script = "head -c 50000000 /dev/zero; echo; echo last";
        let out = output("/bin/sh", &["-c", script], soon()).unwrap();
        assert!(out.success);
        assert_eq!(out.stdout.len(), HEAD);
        let e = run("/bin/sh", &["-c", &format!("{script}; exit 1")], soon()).unwrap_err();
        assert!(e.message().len() < TAIL + 200, "{}", e.message().len());
        // The tail starts at a line: the 50 MB line of NULs is cut whole.
        assert!(e.message().ends_with("status 1: last"), "{}", e.message());
    }

    #[test]
    fn at_the_deadline_the_tool_and_what_it_forked_are_killed() {
        // Ignores SIGTERM and forks a sleeper that holds the pipes; its pid goes to a file.
        let pidfile = std::env::temp_dir().join(format!("kiln-svc-{}.pid", std::process::id()));
        let script = format!(
            "trap '' TERM; sleep 30 & echo $! > '{}'; wait",
            pidfile.display()
        );
        let start = Instant::now();
        let e = output(
            "/bin/sh",
            &["-c", &script],
            start + Duration::from_millis(500),
        )
        .unwrap_err();
        assert!(matches!(e, ToolError::Timeout(_)), "{e:?}");
        assert!(start.elapsed() < Duration::from_secs(3));
        let pid = std::fs::read_to_string(&pidfile).unwrap();
        let _ = std::fs::remove_file(&pidfile);
        // SIGKILL is delivered asynchronously: gone (or a zombie waiting for whoever
        // inherited it) within a moment.
        let running = || {
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim()));
            let state = stat
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.to_string()));
            state.filter(|r| !r.starts_with('Z') && !r.starts_with('X'))
        };
        let until = Instant::now() + Duration::from_secs(2);
        while running().is_some() && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(running(), None, "the sleeper outlived the deadline");
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
