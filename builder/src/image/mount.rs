//! The rootful way in: the root partition of the working copy, loop-mounted in a mount
//! namespace of kiln's own, unmounted and detached when the guard drops.
//!
//! Three layers of cleanup, so no path leaves a mount or a loop device behind: the guard's
//! `Drop` unmounts on every return and unwinding path; `mount -o loop` attaches the loop
//! device with `LO_FLAGS_AUTOCLEAR`, so it detaches when the filesystem is unmounted; and
//! the mount lives in a private mount namespace, which the kernel tears down (unmounting,
//! hence detaching) when kiln dies, even by SIGKILL, and which keeps the host's mount table
//! untouched while kiln runs.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::image::error::{tool, ImageError};

/// Moves the calling thread into a new, private mount namespace (and the processes it
/// starts after this), so what it mounts is invisible outside and dies with it.
pub fn private_namespace() -> io::Result<()> {
    // SAFETY: unshare takes flags only; CLONE_NEWNS changes this thread's mount namespace
    // and touches no memory of ours.
    if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // Without this, mounts below a shared mount (systemd makes `/` shared) would propagate
    // back to the host namespace.
    let root = c"/";
    // SAFETY: the source, type and data pointers are null (allowed for a propagation
    // change) and `root` is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            root.as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A filesystem in a disk image file, mounted read-write on a temporary directory.
#[derive(Debug)]
pub struct Mounted {
    dir: Option<tempfile::TempDir>,
    image: PathBuf,
    // Marks the mount point as in use (crate::image::leftovers) until it is removed.
    _held: Option<crate::image::leftovers::HeldDir>,
}

impl Mounted {
    /// Mounts the `fstype` filesystem of `size` bytes at `offset` in `image`, on a new
    /// directory in `scratch` (beside the working copy, so whatever a kill leaves is in one
    /// place).
    pub fn new(
        image: &Path,
        offset: u64,
        size: u64,
        fstype: &str,
        scratch: &Path,
    ) -> Result<Mounted, ImageError> {
        let dir = tempfile::Builder::new()
            .prefix(".kiln-image-root-")
            .tempdir_in(scratch)
            .map_err(|source| ImageError::Io {
                path: scratch.to_path_buf(),
                source,
            })?;
        let held =
            crate::image::leftovers::hold_dir(dir.path()).map_err(|source| ImageError::Io {
                path: dir.path().to_path_buf(),
                source,
            })?;
        let out = Command::new("mount")
            .args(["-t", fstype, "-o"])
            .arg(format!(
                "loop,offset={offset},sizelimit={size},nodev,nosuid"
            ))
            .arg(image)
            .arg(dir.path())
            .output()
            .map_err(tool("mount"))?;
        if !out.status.success() {
            return Err(ImageError::Tool {
                tool: "mount".into(),
                why: format!(
                    "mounting the {fstype} filesystem at byte {offset} of {}: {}",
                    image.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(Mounted {
            dir: Some(dir),
            image: image.to_path_buf(),
            _held: Some(held),
        })
    }

    /// Where the filesystem is mounted.
    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("mounted until dropped").path()
    }

    /// Unmounts (flushing the filesystem) and reports a failure, rather than leaving it to
    /// `Drop`, which can only try.
    pub fn unmount(mut self) -> Result<(), ImageError> {
        let r = self.try_unmount();
        self.dir = None;
        r
    }

    fn try_unmount(&mut self) -> Result<(), ImageError> {
        let Some(dir) = self.dir.take() else {
            return Ok(());
        };
        let out = Command::new("umount")
            .arg(dir.path())
            .output()
            .map_err(tool("umount"))?;
        let r = if out.status.success() {
            Ok(())
        } else {
            // Something holds it open: detach it lazily so it goes when released.
            let _ = Command::new("umount").arg("-l").arg(dir.path()).status();
            Err(ImageError::Tool {
                tool: "umount".into(),
                why: format!(
                    "{}: {}",
                    dir.path().display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            })
        };
        detach_loops(&self.image);
        r
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.try_unmount() {
            eprintln!("kiln: warning: {e}");
        }
    }
}

/// Detaches any loop device still backed by `image` (the working copy, kiln's own file):
/// autoclear does this already; this covers a kernel or mount that did not set it.
fn detach_loops(image: &Path) {
    let Ok(out) = Command::new("losetup").arg("-j").arg(image).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some((dev, _)) = line.split_once(':') {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}
