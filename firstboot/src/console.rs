//! Serial console output: one line per phase plus the final `KILN-STATUS` line, written so a
//! missing, stuck or full console never delays the boot.
//!
//! The device is opened non-blocking and without becoming our controlling terminal. A line
//! that finds the console full waits while it drains (a serial port is slow, and systemd's
//! status lines share it); a console that takes nothing for two seconds is given up on with
//! one warning on stderr, so a stuck console costs the boot at most that once.

use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::redact::{self, Redacted, Redactor};

/// The consoles tried, in order, when `--console` is not given.
#[cfg(not(windows))]
pub const DEFAULT_CONSOLES: &[&str] = &["/dev/ttyS0", "/dev/console"];
/// The consoles tried, in order, when `--console` is not given.
#[cfg(windows)]
pub const DEFAULT_CONSOLES: &[&str] = &["COM1"];

/// The prefix of the final line that carries the whole status JSON.
pub const STATUS_PREFIX: &str = "KILN-STATUS ";

/// A console that may be absent. Every write is best effort.
#[derive(Debug)]
pub struct Console {
    file: Option<File>,
    path: PathBuf,
    warned: bool,
    /// The default consoles after the one opened, tried in order when it refuses a write:
    /// a `/dev/ttyS0` with no UART behind it (the kernel's placeholder 8250 ports on an arm64
    /// machine whose console is the PL011 `ttyAMA0`) opens fine and fails every write with EIO.
    fallbacks: Vec<PathBuf>,
}

impl Console {
    /// A console that writes nowhere (`--console none`, tests, `status`).
    pub fn none() -> Console {
        Console {
            file: None,
            path: PathBuf::new(),
            warned: true,
            fallbacks: Vec::new(),
        }
    }

    /// Opens `path`, or the first of [`DEFAULT_CONSOLES`] that opens when `path` is `None`.
    /// Never fails: a console that cannot be opened is reported on stderr and skipped.
    pub fn open(path: Option<&Path>) -> Console {
        // An explicit path may be a plain file (created if missing); the default devices are
        // never created, so a missing /dev/ttyS0 is not turned into a regular file.
        match path {
            Some(p) => Console::open_first(&[p], true),
            None => {
                let defaults: Vec<&Path> = DEFAULT_CONSOLES.iter().map(Path::new).collect();
                Console::open_first(&defaults, false)
            }
        }
    }

    /// The first of `candidates` that opens; the rest are its fallbacks.
    fn open_first(candidates: &[&Path], create: bool) -> Console {
        let mut last_err = None;
        for (i, p) in candidates.iter().enumerate() {
            match open_nonblocking(p, create) {
                Ok(file) => {
                    return Console {
                        file: Some(file),
                        path: p.to_path_buf(),
                        warned: false,
                        fallbacks: candidates[i + 1..]
                            .iter()
                            .map(|p| p.to_path_buf())
                            .collect(),
                    }
                }
                Err(e) => last_err = Some((p.to_path_buf(), e)),
            }
        }
        if let Some((p, e)) = last_err {
            redact::eprint(&Redactor::shapes_only().redact(&format!(
                "kiln-firstboot: warning: console {} cannot be opened ({e}); console lines are skipped",
                p.display()
            )));
        }
        Console::none()
    }

    /// The device written to, if any.
    pub fn path(&self) -> Option<&Path> {
        self.file.as_ref().map(|_| self.path.as_path())
    }

    /// Writes one line (the newline is added), waiting while the console drains; drops the
    /// rest of the line, and every later line, once the console has taken nothing for
    /// 2 s (the stall limit).
    /// The console is readable through cloud APIs by people who must not see credentials:
    /// only redacted text goes there.
    pub fn line(&mut self, text: &Redacted) {
        let text = text.as_str();
        let Some(file) = self.file.as_mut() else {
            return;
        };
        // One write call for text and newline, so lines from other writers do not interleave
        // inside ours on a shared console.
        let mut buf = Vec::with_capacity(text.len() + 1);
        buf.extend_from_slice(text.as_bytes());
        buf.push(b'\n');
        if let Err(e) = write_nonblocking(file, &buf) {
            if e.kind() != ErrorKind::WouldBlock && self.fall_back(&buf, &e) {
                return;
            }
            if !self.warned {
                let why = if e.kind() == ErrorKind::WouldBlock {
                    format!("took nothing for {} s", STALL_LIMIT.as_secs())
                } else {
                    e.to_string()
                };
                redact::eprint(&Redactor::shapes_only().redact(&format!(
                    "kiln-firstboot: warning: console {} did not take a line ({why}); console lines are skipped from now on",
                    self.path.display()
                )));
                self.warned = true;
            }
            // A broken or stuck console stays so: stop trying, so it costs the boot one stall
            // at most.
            self.file = None;
        }
    }
}

impl Console {
    /// Moves to the next default console that opens and takes `buf`, saying so once on
    /// stderr. False when none does.
    fn fall_back(&mut self, buf: &[u8], err: &std::io::Error) -> bool {
        while !self.fallbacks.is_empty() {
            let next = self.fallbacks.remove(0);
            let Ok(mut file) = open_nonblocking(&next, false) else {
                continue;
            };
            if write_nonblocking(&mut file, buf).is_ok() {
                redact::eprint(&Redactor::shapes_only().redact(&format!(
                    "kiln-firstboot: warning: console {} refused a line ({err}); writing to {} instead",
                    self.path.display(),
                    next.display()
                )));
                self.file = Some(file);
                self.path = next;
                return true;
            }
        }
        false
    }
}

/// How long a console may take no byte at all before the rest of a line is dropped. A
/// serial console at 115200 baud drains its 4 KiB transmit buffer in about 0.35 s, so a
/// line that finds the buffer full (systemd's own status lines share it) waits for room; a
/// console with flow control stopped, or a pipe nobody reads, takes nothing and is given
/// up on after this long.
const STALL_LIMIT: Duration = Duration::from_secs(2);

/// How often a full console is tried again while it drains.
const STALL_POLL: Duration = Duration::from_millis(5);

/// Writes all of `buf`, waiting while the device takes bytes; stops with `WouldBlock` once it
/// has taken none for [`STALL_LIMIT`], dropping the rest.
fn write_nonblocking(file: &mut File, mut buf: &[u8]) -> std::io::Result<()> {
    let mut last_progress = Instant::now();
    while !buf.is_empty() {
        match file.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => {
                buf = &buf[n..];
                last_progress = Instant::now();
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if last_progress.elapsed() >= STALL_LIMIT {
                    return Err(e);
                }
                std::thread::sleep(STALL_POLL);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(unix)]
fn open_nonblocking(path: &Path, create: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK so a tty with flow control stopped (or a FIFO nobody reads) cannot hang us;
    // O_NOCTTY so opening /dev/ttyS0 does not make it our controlling terminal. Values from
    // the Linux generic ABI (x86-64, aarch64, riscv64).
    #[cfg(target_os = "linux")]
    const FLAGS: i32 = 0o4000 | 0o400;
    #[cfg(not(target_os = "linux"))]
    const FLAGS: i32 = 0x0004 | 0x20000; // BSD/macOS O_NONBLOCK | O_NOCTTY
    std::fs::OpenOptions::new()
        .append(true)
        .create(create)
        .custom_flags(FLAGS)
        .open(path)
}

#[cfg(not(unix))]
fn open_nonblocking(path: &Path, create: bool) -> std::io::Result<File> {
    // Windows serial ports (COM1) do not block writes on a missing reader.
    std::fs::OpenOptions::new()
        .append(true)
        .create(create)
        .open(path)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A line longer than what the console can hold at once (a pipe's 64 KiB here, a UART's
    /// 4 KiB transmit buffer on a node) reaches it whole while a reader drains it: the
    /// status line that found the console full behind systemd's output was dropped before.
    #[test]
    fn a_slow_console_gets_the_whole_line() {
        use std::io::Read;
        use std::os::unix::fs::OpenOptionsExt;
        let fifo = std::env::temp_dir().join(format!("kiln-console-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&fifo);
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success(), "mkfifo {}", fifo.display());
        let mut reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(0o4000)
            .open(&fifo)
            .unwrap();
        let line = format!("KILN-STATUS {}", "y".repeat(150_000));
        let drain = std::thread::spawn(move || {
            let mut got = Vec::new();
            let mut chunk = [0u8; 4096];
            while got.len() < 150_013 {
                match reader.read(&mut chunk) {
                    Ok(n) => got.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => panic!("{e}"),
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            got
        });
        let mut c = Console::open_first(&[fifo.as_path()], false);
        c.line(&Redactor::shapes_only().redact(&line));
        assert_eq!(
            c.path(),
            Some(fifo.as_path()),
            "the console was given up on"
        );
        let got = drain.join().unwrap();
        std::fs::remove_file(&fifo).unwrap();
        assert_eq!(got.len(), line.len() + 1);
        assert!(got.starts_with(b"KILN-STATUS yyy") && got.ends_with(b"y\n"));
    }

    /// A default console that opens but refuses writes (/dev/full stands in for a ttyS0 with
    /// no UART behind it, which fails with EIO) hands its lines to the next default.
    #[test]
    fn a_console_that_refuses_writes_falls_back_to_the_next_default() {
        let next = std::env::temp_dir().join(format!("kiln-console-{}", std::process::id()));
        std::fs::write(&next, "").unwrap();
        let mut c = Console::open_first(&[Path::new("/dev/full"), next.as_path()], false);
        assert_eq!(c.path(), Some(Path::new("/dev/full")));
        c.line(&Redactor::shapes_only().redact("phase=config result=success"));
        c.line(&Redactor::shapes_only().redact("KILN-STATUS {}"));
        assert_eq!(c.path(), Some(next.as_path()));
        let text = std::fs::read_to_string(&next).unwrap();
        std::fs::remove_file(&next).unwrap();
        assert_eq!(text, "phase=config result=success\nKILN-STATUS {}\n");
        // With nothing left to fall back to, the console goes quiet instead of failing.
        let mut c = Console::open_first(&[Path::new("/dev/full")], false);
        c.line(&Redactor::shapes_only().redact("lost"));
        assert_eq!(c.path(), None);
    }
}
