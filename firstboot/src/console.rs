//! Serial console output: one line per phase plus the final `KILN-STATUS` line, written so a
//! missing, stuck or full console never delays the boot.
//!
//! The device is opened non-blocking and without becoming our controlling terminal; a write
//! that would block is dropped (with one warning on stderr) rather than waited on.

use std::fs::File;
use std::io::{ErrorKind, Write};
use std::path::{Path, PathBuf};

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

    /// Writes one line (the newline is added). Drops the line if the console would block.
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
                redact::eprint(&Redactor::shapes_only().redact(&format!(
                    "kiln-firstboot: warning: console {} did not take a line ({e}); skipping it",
                    self.path.display()
                )));
                self.warned = true;
            }
            if e.kind() != ErrorKind::WouldBlock {
                // A broken console stays broken: stop trying.
                self.file = None;
            }
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

/// Writes all of `buf` unless the device would block, in which case the rest is dropped.
fn write_nonblocking(file: &mut File, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match file.write(buf) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
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
