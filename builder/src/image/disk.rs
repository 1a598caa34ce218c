//! Disk image files: what format the base is, a raw working copy of it (a reflink where the
//! filesystem can, never a write to the base), and the output in the format a cloud imports.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::Command;

use crate::image::base::{qemu_spec, BaseError, BaseFormat, Node};
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

/// A path as `qemu-img` must be given it: absolute, so no name (`nbd:x`, `json:{…}`) is ever
/// read as a protocol (QEMU takes a colon before the first slash as one).
pub fn qemu_path(p: &Path) -> Result<std::path::PathBuf, ImageError> {
    std::path::absolute(p).map_err(io_err(p))
}

/// Asks `qemu-img info` (on the checked chain, force-share, no backing chain) whether the
/// base names any file kiln's own reading of its header missed: a backing file, an external
/// data file, a VMDK extent other than the file itself. A second opinion, by QEMU's parser.
pub fn cross_check(base: &Path, node: &Node) -> Result<(), ImageError> {
    let spec = qemu_spec(node, false).map_err(|source| ImageError::Base {
        base: base.to_path_buf(),
        source,
    })?;
    let out = run(
        Command::new("qemu-img")
            .args(["info", "-U", "--output=json"])
            .arg(&spec),
        "qemu-img",
        &format!("reading {}", base.display()),
    )?;
    let v: serde_json::Value = serde_json::from_slice(&out).map_err(|e| ImageError::Tool {
        tool: "qemu-img".into(),
        why: format!("info of {}: unreadable JSON ({e})", base.display()),
    })?;
    let names = |what: &'static str, name: &serde_json::Value| ImageError::Base {
        base: base.to_path_buf(),
        source: BaseError::NamesFile {
            what,
            name: name.as_str().unwrap_or_default().to_string(),
        },
    };
    if node.backing.is_none() {
        for key in ["backing-filename", "full-backing-filename"] {
            if let Some(n) = v.get(key) {
                return Err(names("backing file", n));
            }
        }
    }
    let data = &v["format-specific"]["data"];
    if let (Some(n), None) = (data.get("data-file"), &node.data_file) {
        return Err(names("external data file", n));
    }
    let me = node.path.to_string_lossy();
    for e in data["extents"].as_array().into_iter().flatten() {
        if e["filename"].as_str() != Some(&*me) {
            return Err(names("VMDK extent", &e["filename"]));
        }
    }
    if v.get("format").and_then(|f| f.as_str()) != Some(node.format.driver()) {
        return Err(ImageError::Tool {
            tool: "qemu-img".into(),
            why: format!(
                "info of {}: expected format {}, found {}",
                base.display(),
                node.format.driver(),
                v.get("format").unwrap_or(&serde_json::Value::Null)
            ),
        });
    }
    Ok(())
}

/// Makes `work` a raw copy of the checked base: a reflink or sparse copy of a raw base,
/// `qemu-img convert` of any other, told every file of the chain (nothing else is opened).
pub fn working_copy(base: &Path, node: &Node, work: &Path) -> Result<(), ImageError> {
    if node.format != BaseFormat::Raw {
        let spec = qemu_spec(node, true).map_err(|source| ImageError::Base {
            base: base.to_path_buf(),
            source,
        })?;
        run(
            Command::new("qemu-img")
                .args(["convert", "-O", "raw"])
                .arg(&spec)
                .arg(qemu_path(work)?),
            "qemu-img",
            &format!(
                "converting {} ({}) to raw",
                base.display(),
                node.format.driver()
            ),
        )?;
        return Ok(());
    }
    let src = File::open(&node.path).map_err(io_err(base))?;
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
        c.arg(qemu_path(work)?).arg(qemu_path(out)?),
        "qemu-img",
        &format!("writing {} as {driver}", out.display()),
    )?;
    Ok(())
}
