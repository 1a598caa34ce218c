//! The guest's serial console as the host saw it: every line with the host time it arrived,
//! kept in memory for assertions and mirrored to a log file for people.

use std::io::{BufRead, BufReader, Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One console line, stamped with the milliseconds since QEMU was started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Host milliseconds since QEMU started when the line was complete.
    pub host_ms: u64,
    /// The text, without the line ending and with terminal escapes removed.
    pub text: String,
}

#[derive(Debug, Default)]
struct State {
    lines: Vec<Line>,
    closed: bool,
}

/// A console fed by a reader thread; cheap to clone.
#[derive(Debug, Clone)]
pub struct Console {
    inner: Arc<(Mutex<State>, Condvar)>,
    started: Instant,
}

impl Console {
    /// An empty console whose clock starts now.
    pub fn new(started: Instant) -> Self {
        Console {
            inner: Arc::new((Mutex::new(State::default()), Condvar::new())),
            started,
        }
    }

    /// Reads `from` on a thread until it ends, adding each line and copying it (with its
    /// host time) to `log`.
    pub fn feed(
        &self,
        from: impl Read + Send + 'static,
        mut log: Option<impl Write + Send + 'static>,
    ) {
        let me = self.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(from);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        let text = clean(&buf);
                        let host_ms = me.started.elapsed().as_millis() as u64;
                        if let Some(log) = log.as_mut() {
                            let _ = writeln!(
                                log,
                                "[{:>6}.{:03}] {text}",
                                host_ms / 1000,
                                host_ms % 1000
                            );
                            let _ = log.flush();
                        }
                        me.push(Line { host_ms, text });
                    }
                }
            }
            me.close();
        });
    }

    fn push(&self, line: Line) {
        let (m, cv) = &*self.inner;
        m.lock().unwrap_or_else(|e| e.into_inner()).lines.push(line);
        cv.notify_all();
    }

    fn close(&self) {
        let (m, cv) = &*self.inner;
        m.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        cv.notify_all();
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<Line> {
        self.inner
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .lines
            .clone()
    }

    /// The last `n` lines, joined for an error message.
    pub fn tail(&self, n: usize) -> String {
        let lines = self.lines();
        let start = lines.len().saturating_sub(n);
        lines[start..]
            .iter()
            .map(|l| {
                format!(
                    "  [{:>6}.{:03}] {}",
                    l.host_ms / 1000,
                    l.host_ms % 1000,
                    l.text
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until a line matches, the console closes (`Err(true)`), or the deadline passes
    /// (`Err(false)`).
    pub fn wait_for(&self, pred: impl Fn(&str) -> bool, until: Instant) -> Result<Line, bool> {
        let (m, cv) = &*self.inner;
        let mut state = m.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = 0;
        loop {
            if let Some(l) = state.lines[seen..].iter().find(|l| pred(&l.text)) {
                return Ok(l.clone());
            }
            seen = state.lines.len();
            if state.closed {
                return Err(true);
            }
            let now = Instant::now();
            if now >= until {
                return Err(false);
            }
            let wait = (until - now).min(Duration::from_millis(500));
            state = cv
                .wait_timeout(state, wait)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Waits until the console closes (QEMU exited) or the deadline passes.
    pub fn wait_closed(&self, until: Instant) -> bool {
        self.wait_for(|_| false, until) == Err(true)
    }
}

/// Turns raw console bytes into one printable line: drops `\r`, ANSI escape sequences
/// (systemd's coloured status) and other control characters.
pub fn clean(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    // CSI: parameters and intermediates, then one final byte in @..~.
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\n' | '\r' => {}
            c if c.is_control() && c != '\t' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_strips_escapes_and_line_endings() {
        let cases: [(&[u8], &str); 4] = [
            (b"plain\r\n", "plain"),
            (
                b"[\x1b[0;32m  OK  \x1b[0m] Started x.\r\n",
                "[  OK  ] Started x.",
            ),
            (b"\x1b[?25lcursor\x07\n", "cursor"),
            (b"KILN-STATUS {\"a\":1}\n", "KILN-STATUS {\"a\":1}"),
        ];
        for (raw, want) in cases {
            assert_eq!(clean(raw), want);
        }
    }

    #[test]
    fn wait_for_sees_lines_fed_later_and_reports_close() {
        let c = Console::new(Instant::now());
        // A real child process writing late, as QEMU does.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 0.05; printf 'one\\r\\nMARKER two\\r\\n'"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        c.feed(child.stdout.take().unwrap(), None::<std::fs::File>);
        let got = c
            .wait_for(
                |l| l.starts_with("MARKER"),
                Instant::now() + Duration::from_secs(5),
            )
            .unwrap();
        assert_eq!(got.text, "MARKER two");
        child.wait().unwrap();
        assert!(c.wait_closed(Instant::now() + Duration::from_secs(5)));
        assert_eq!(
            c.wait_for(|l| l == "never", Instant::now() + Duration::from_secs(1)),
            Err(true)
        );
        assert_eq!(c.lines().len(), 2);
    }
}
