//! The rootful mode's working copy without a copy: a qcow2 overlay whose backing file is the
//! base (opened read-only by QEMU's block layer), exported as a raw file by
//! `qemu-storage-daemon`'s FUSE export, which the loop mount then uses like any raw image.
//! Every write lands in the overlay; the base is never written. OUT is then one
//! `qemu-img convert` of the overlay (base and changes, read once), so a base is read and
//! written once instead of twice, and OUT's directory needs room for the changes only, not
//! for a raw copy of the whole disk.
//!
//! Used when `/dev/fuse` and `qemu-storage-daemon` are there (as root); otherwise kiln falls
//! back to the raw working copy ([`crate::image::disk::working_copy`]).
//!
//! The daemon is started after kiln's private mount namespace exists, so its FUSE mount is
//! in that namespace and invisible on the host; it gets `PR_SET_PDEATHSIG` (SIGTERM), so a
//! kiln killed by any signal takes the daemon, and with it the namespace, down.

use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::image::error::{io_err, tool, ImageError};

/// How long the daemon may take to export the overlay.
const READY: Duration = Duration::from_secs(30);

/// A running export of an overlay on the base.
#[derive(Debug)]
pub struct Exported {
    child: Option<Child>,
    // Open (and flock-held, crate::image::leftovers) while the run lives.
    overlay: Option<tempfile::NamedTempFile>,
    file: tempfile::NamedTempFile,
}

/// Whether this host can export: `/dev/fuse` and `qemu-storage-daemon` on PATH.
pub fn available() -> bool {
    Path::new("/dev/fuse").exists()
        && Command::new("qemu-storage-daemon")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

fn temp_in(dir: &Path, suffix: &str) -> Result<tempfile::NamedTempFile, ImageError> {
    let t = tempfile::Builder::new()
        .prefix(crate::image::leftovers::PREFIX)
        .suffix(suffix)
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    crate::image::leftovers::hold(t.as_file()).map_err(io_err(t.path()))?;
    Ok(t)
}

impl Exported {
    /// Creates the overlay on `base` (format `format`) in `dir` and exports it.
    pub fn start(base: &Path, format: &str, dir: &Path) -> Result<Exported, ImageError> {
        let base = std::fs::canonicalize(base).map_err(io_err(base))?;
        let overlay = temp_in(dir, ".qcow2")?;
        let out = Command::new("qemu-img")
            .args(["create", "-q", "-f", "qcow2", "-F", format, "-b"])
            .arg(&base)
            .arg(overlay.path())
            .output()
            .map_err(tool("qemu-img"))?;
        if !out.status.success() {
            return Err(ImageError::Tool {
                tool: "qemu-img".into(),
                why: format!(
                    "creating an overlay on {}: {}",
                    base.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        let file = temp_in(dir, ".export")?;
        let dev_before = file
            .as_file()
            .metadata()
            .map_err(io_err(file.path()))?
            .dev();
        let mut cmd = Command::new("qemu-storage-daemon");
        cmd.arg("--blockdev")
            .arg(format!(
                "driver=file,filename={},node-name=kiln-file",
                opt(overlay.path())
            ))
            .arg("--blockdev")
            .arg("driver=qcow2,file=kiln-file,node-name=kiln-disk")
            .arg("--export")
            .arg(format!(
                "type=fuse,id=kiln,node-name=kiln-disk,mountpoint={},writable=on",
                opt(file.path())
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches no memory of ours;
        // it runs in the child between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(tool("qemu-storage-daemon"))?;
        let mut e = Exported {
            child: Some(child),
            overlay: Some(overlay),
            file,
        };
        // Ready when the export is mounted over the file: its device changes.
        let start = Instant::now();
        loop {
            if let Ok(m) = std::fs::metadata(e.file.path()) {
                if m.dev() != dev_before {
                    return Ok(e);
                }
            }
            if let Some(why) = e.exited() {
                return Err(why);
            }
            if start.elapsed() > READY {
                return Err(ImageError::Tool {
                    tool: "qemu-storage-daemon".into(),
                    why: format!(
                        "did not export {} within {READY:?}",
                        e.file.path().display()
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The exported raw view of the disk.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// If the daemon has exited, why.
    fn exited(&mut self) -> Option<ImageError> {
        let child = self.child.as_mut()?;
        let status = child.try_wait().ok()??;
        let mut err = String::new();
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        self.child = None;
        Some(ImageError::Tool {
            tool: "qemu-storage-daemon".into(),
            why: format!("exited ({status}) exporting the overlay: {}", err.trim()),
        })
    }

    /// Stops the daemon (it flushes the overlay and unmounts the export) and returns the
    /// overlay, holding the base's contents and every change.
    pub fn finish(mut self) -> Result<tempfile::NamedTempFile, ImageError> {
        self.stop()?;
        Ok(self.overlay.take().expect("taken once"))
    }

    fn stop(&mut self) -> Result<(), ImageError> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: kill on the pid of a child we have not reaped yet.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let status = child.wait().map_err(tool("qemu-storage-daemon"))?;
        // SIGTERM is qemu-storage-daemon's normal way to quit: it exits 0 after flushing.
        if status.success() {
            return Ok(());
        }
        let mut err = String::new();
        if let Some(mut s) = child.stderr.take() {
            let _ = s.read_to_string(&mut err);
        }
        Err(ImageError::Tool {
            tool: "qemu-storage-daemon".into(),
            why: format!("exited with {status} when stopped: {}", err.trim()),
        })
    }
}

impl Drop for Exported {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// A path as a QEMU option value: commas are doubled (QEMU's option syntax).
fn opt(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}
