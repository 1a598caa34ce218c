//! Disk image files: what format the base is, a raw working copy of it (a reflink where the
//! filesystem can, never a write to the base), and the output in the format a cloud imports.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

use crate::image::error::{io_err, tool, ImageError};

/// An output format, with the `qemu-img` driver and options each cloud's importer wants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// QEMU copy-on-write v2 (OpenStack, KubeVirt, Proxmox).
    Qcow2,
    /// Raw bytes (AWS import-snapshot, GCP).
    Raw,
    /// Fixed-size VHD, size a whole MiB (what Azure requires of a page blob).
    Vhd,
    /// VHDX (Hyper-V).
    Vhdx,
    /// Stream-optimised VMDK (AWS import-snapshot, vSphere).
    Vmdk,
}

impl Format {
    /// `qemu-img convert -O` driver and `-o` options.
    pub fn qemu(self) -> (&'static str, Option<&'static str>) {
        match self {
            Format::Qcow2 => ("qcow2", None),
            Format::Raw => ("raw", None),
            Format::Vhd => ("vpc", Some("subformat=fixed,force_size=on")),
            Format::Vhdx => ("vhdx", None),
            Format::Vmdk => ("vmdk", Some("subformat=streamOptimized")),
        }
    }
}

fn run(cmd: &mut Command, name: &'static str, what: &str) -> Result<Vec<u8>, ImageError> {
    let out = cmd.output().map_err(tool(name))?;
    if !out.status.success() {
        return Err(ImageError::Tool {
            tool: name.into(),
            why: format!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    Ok(out.stdout)
}

/// The base's format as `qemu-img info` names it (`raw`, `qcow2`, `vpc`, `vmdk`, …).
pub fn probe(base: &Path) -> Result<String, ImageError> {
    let out = run(
        Command::new("qemu-img")
            .args(["info", "--output=json"])
            .arg(base),
        "qemu-img",
        &format!("reading {}", base.display()),
    )?;
    let v: serde_json::Value = serde_json::from_slice(&out).map_err(|e| ImageError::Tool {
        tool: "qemu-img".into(),
        why: format!("info of {}: unreadable JSON ({e})", base.display()),
    })?;
    match v.get("format").and_then(|f| f.as_str()) {
        // A fixed VHD is raw bytes and a 512-byte footer, which qemu-img's probe does not
        // look for: read as raw, the footer would become part of the disk.
        Some("raw") if has_vhd_footer(base) => Ok("vpc".into()),
        Some(f) => Ok(f.to_string()),
        None => Err(ImageError::Tool {
            tool: "qemu-img".into(),
            why: format!("info of {} names no format", base.display()),
        }),
    }
}

/// Whether `path` ends in a VHD footer (cookie `conectix`; Microsoft's "Virtual Hard Disk
/// Image Format Specification", Hard Disk Footer Format).
fn has_vhd_footer(path: &Path) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(f) = File::open(path) else {
        return false;
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let mut cookie = [0u8; 8];
    len >= 512 && f.read_exact_at(&mut cookie, len - 512).is_ok() && &cookie == b"conectix"
}

/// Makes `work` a raw copy of `base` (format `format`): a reflink or sparse copy of a raw
/// base, `qemu-img convert` of any other.
pub fn working_copy(base: &Path, format: &str, work: &Path) -> Result<(), ImageError> {
    if format != "raw" {
        run(
            Command::new("qemu-img")
                .args(["convert", "-f", format, "-O", "raw"])
                .arg(base)
                .arg(work),
            "qemu-img",
            &format!("converting {} ({format}) to raw", base.display()),
        )?;
        return Ok(());
    }
    let src = File::open(base).map_err(io_err(base))?;
    let dst = File::options()
        .write(true)
        .truncate(true)
        .open(work)
        .map_err(io_err(work))?;
    // FICLONE (linux/fs.h): share every extent, copy nothing, where the filesystem can
    // (btrfs, XFS with reflink, bcachefs); the `cp --reflink=auto` behaviour.
    // SAFETY: both descriptors are open files we own for the duration of the call; FICLONE
    // takes the source descriptor as its argument and reads no memory of ours.
    if unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0 {
        return Ok(());
    }
    sparse_copy(&src, &dst).map_err(io_err(work))
}

/// Copies the data extents of `src` (SEEK_DATA/SEEK_HOLE), leaving holes as holes, so a
/// mostly-empty 2 GiB base costs what it holds.
fn sparse_copy(src: &File, dst: &File) -> io::Result<()> {
    let len = src.metadata()?.len();
    dst.set_len(len)?;
    let fd = src.as_raw_fd();
    let mut pos: i64 = 0;
    let end = len as i64;
    let (mut s, mut d) = (src.try_clone()?, dst.try_clone()?);
    while pos < end {
        // SAFETY: lseek on a descriptor we own; no memory is passed.
        let data = unsafe { libc::lseek(fd, pos, libc::SEEK_DATA) };
        if data < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break; // only a hole remains
            }
            return Err(e);
        }
        // SAFETY: as above.
        let hole = unsafe { libc::lseek(fd, data, libc::SEEK_HOLE) };
        if hole < 0 {
            return Err(io::Error::last_os_error());
        }
        s.seek(SeekFrom::Start(data as u64))?;
        d.seek(SeekFrom::Start(data as u64))?;
        io::copy(&mut (&mut s).take((hole - data) as u64), &mut d)?;
        pos = hole;
    }
    dst.sync_all()
}

/// Writes `work` (raw) to `out` in `format` (through `qemu-img convert`).
pub fn convert_out(work: &Path, format: Format, out: &Path) -> Result<(), ImageError> {
    let (driver, opts) = format.qemu();
    let mut c = Command::new("qemu-img");
    c.args(["convert", "-f", "raw", "-O", driver]);
    if let Some(o) = opts {
        c.args(["-o", o]);
    }
    run(
        c.arg(work).arg(out),
        "qemu-img",
        &format!("writing {} as {driver}", out.display()),
    )?;
    Ok(())
}
