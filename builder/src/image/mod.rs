//! `kiln image --base BASE --layer LAYER --out OUT`: a base disk image in, a node image out,
//! without booting it. The base is never written: kiln works on a raw copy in OUT's
//! directory, finds the root partition in its table ([`partition`]), checks the filesystem
//! ([`fs`]), loop-mounts it in a private mount namespace ([`mount`]), applies the rootfs
//! layer with `kiln install`'s own code ([`crate::install::install`]), and writes OUT in the
//! format asked for ([`disk`]) through a temporary file and a rename.
//!
//! Two modes ([`Via`]): rootful, through a loop mount (ext4, xfs, btrfs), and unprivileged,
//! through e2fsprogs' debugfs on `IMAGE?offset=N` (ext4; [`offline`]). Both run the same
//! checks and the same install ([`apply`]).

use std::path::{Path, PathBuf};

use crate::install::InstallReport;

pub mod apply;
pub mod base;
pub mod debugfs;
pub mod disk;
mod error;
pub mod frames;
pub mod fs;
pub mod layer;
pub mod leftovers;
pub mod mount;
pub mod offline;
pub mod partition;
pub mod pick;
pub mod provision;
pub mod sbom;
pub mod sysext;

pub use apply::{ImageOptions, Via, SPACE_MARGIN};
pub use disk::Format;
use error::io_err;
pub use error::ImageError;

/// What one `kiln image` did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImageReport {
    /// The base's format as `qemu-img` named it.
    pub base_format: String,
    /// `GPT` or `MBR`.
    pub table: String,
    /// The root partition's number.
    pub partition: u32,
    /// Its byte offset.
    pub offset: u64,
    /// Its size in bytes.
    pub size: u64,
    /// How the root filesystem was written (`loop` or `debugfs`).
    pub via: Via,
    /// The root filesystem (`ext4`, `xfs`, `btrfs`).
    pub filesystem: String,
    /// The image id of the kiln node the base already was, if it was one.
    pub replaced: Option<String>,
    /// The layer's image id.
    pub image_id: Option<String>,
    /// Bytes free in the root filesystem before the install.
    pub free_before: u64,
    /// The install step's report.
    pub install: InstallReport,
    /// The node config's files written into the image, as the node sees their paths.
    pub node_files: Vec<String>,
    /// Leftovers of killed runs removed from OUT's directory.
    pub swept: Vec<PathBuf>,
    /// The SBOM written beside OUT.
    pub sbom: PathBuf,
    /// OUT.
    pub out: PathBuf,
}

fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.dev() == y.dev() && x.ino() == y.ino(),
        _ => false,
    }
}

/// Builds the node image: rootful through a loop mount in a private mount namespace of the
/// calling thread, or unprivileged through debugfs ([`ImageOptions::via`]).
#[allow(
    clippy::too_many_lines,
    reason = "the steps of kiln image in the order docs/image.md gives, with the mount guard's scope spanning them; each step is its own function"
)]
pub fn build(o: &ImageOptions) -> Result<ImageReport, ImageError> {
    if same_file(&o.base, &o.out) {
        return Err(ImageError::Io {
            path: o.out.clone(),
            source: std::io::Error::other(
                "is the base image; kiln image never writes the base, name another --out",
            ),
        });
    }
    let base_err = |source| ImageError::Base {
        base: o.base.clone(),
        source,
    };
    if let Some(p) = o.base.to_str().and_then(base::protocol) {
        return Err(base_err(base::BaseError::Refused {
            what: format!(
                "a {p}: name, which qemu-img would open as a protocol or a JSON description"
            ),
            hint: "name a file (./NAME if its name has a colon)",
        }));
    }
    check_base(&o.base)?;
    let allow = o
        .allow_backing_dir
        .as_deref()
        .map(allowed_dir)
        .transpose()?;
    // The layer first: a layer that cannot be read fails before gigabytes are copied.
    let is_sysext = sysext::is_sysext(&o.layer);
    let facts = if is_sysext {
        sysext::check_signed(&o.layer)?;
        layer::LayerFacts {
            unpacked_bytes: std::fs::metadata(&o.layer).map_err(io_err(&o.layer))?.len(),
            entries: 1,
            ..Default::default()
        }
    } else {
        layer::peek(&o.layer)?
    };
    // The base's own header first, then QEMU's reading of it: a base that names another
    // file is refused before qemu-img opens anything.
    let node = base::check(&o.base, allow.as_ref()).map_err(base_err)?;
    disk::cross_check(&o.base, &node)?;
    let base_format = node.format.driver().to_string();
    let dir = out_dir(&o.out)?;
    let temp = |suffix: &str| {
        let t = tempfile::Builder::new()
            .prefix(leftovers::PREFIX)
            .suffix(suffix)
            .tempfile_in(&dir)
            .map_err(io_err(&dir))?;
        leftovers::hold(t.as_file()).map_err(io_err(t.path()))?;
        Ok::<_, ImageError>(t)
    };
    // Before the copy, so a run that cannot mount fails at once rather than after gigabytes.
    let via = choose_via(o.via)?;
    // e2fsprogs takes the first `?` of a device name as the start of its options: with one in
    // OUT's directory, debugfs would open (and write) the file named by what precedes it.
    if via == Via::Debugfs && dir.as_os_str().as_encoded_bytes().contains(&b'?') {
        return Err(ImageError::Io {
            path: dir,
            source: std::io::Error::other(
                "the directory of --out has a '?' in its path, which debugfs would read as the start of its options and open another file; write OUT elsewhere and move it",
            ),
        });
    }
    // What killed runs left here (a working copy can be as big as the base).
    let swept = leftovers::sweep(&dir);
    let work = temp(".raw")?;
    disk::working_copy(&o.base, &node, work.path())?;

    let file = std::fs::File::open(work.path()).map_err(io_err(work.path()))?;
    let table = partition::read_table(&file).map_err(|source| ImageError::Table {
        base: o.base.clone(),
        source,
    })?;
    let part = pick::pick_root(&table, o.partition).map_err(|source| ImageError::Pick {
        base: o.base.clone(),
        source,
    })?;
    // A GPT root type names its architecture (the Discoverable Partitions Specification):
    // an arm64 layer in an x86-64 root would boot to a kubelet that cannot run.
    let part_arch = match part.kind.as_str() {
        partition::guid::ROOT_X86_64 => Some("amd64"),
        partition::guid::ROOT_ARM64 => Some("arm64"),
        _ => None,
    };
    if let (Some(part_arch), Some(layer_arch)) = (part_arch, facts.arch.as_deref()) {
        if part_arch != layer_arch {
            return Err(ImageError::Arch {
                base: o.base.clone(),
                partition: part.number,
                kind: part.kind.clone(),
                part_arch,
                layer: o.layer.clone(),
                layer_arch: layer_arch.to_string(),
            });
        }
    }
    let probe = (partition::ReadAt::size(&file) - part.offset)
        .min(part.size)
        .min(fs::PROBE_BYTES as u64) as usize;
    let head =
        partition::ReadAt::read_at(&file, part.offset, probe).map_err(io_err(work.path()))?;
    drop(file);
    let kind = check_fs(&head, via, &o.base, part.number)?;
    // The base's sha256 for the SBOM, read beside the rest of the run once the base is known
    // to be usable (the base is never written, so any moment gives the same bytes).
    let base_hash = {
        let p = o.base.clone();
        std::thread::spawn(move || crate::digest::hash_file(&p, crate::digest::Sums::Sha256))
    };
    let t = apply::Target {
        base: &o.base,
        partition: part.number,
    };
    let applied = if via == Via::Loop {
        let mounted = mount::Mounted::new(work.path(), part.offset, part.size, kind.name(), &dir)?;
        let root = mounted.path().to_path_buf();
        let st = rustix::fs::statvfs(&root).map_err(|e| ImageError::Io {
            path: root.clone(),
            source: e.into(),
        })?;
        let space = apply::Space {
            free: st.f_bavail.saturating_mul(st.f_frsize),
            // btrfs allocates inodes as it goes and reports none (f_files 0).
            inodes: if st.f_files == 0 {
                u64::MAX
            } else {
                st.f_favail
            },
        };
        let a = apply::to_root(&root, o, &facts, is_sysext, space, t)?;
        mounted.unmount()?;
        a
    } else {
        let sb = fs::ext4_space(&head).ok_or_else(|| ImageError::Filesystem {
            base: o.base.clone(),
            partition: part.number,
            found: "an ext4 superblock kiln cannot read".into(),
        })?;
        let at = apply::Staged {
            work: work.path(),
            offset: part.offset,
            scratch: &dir,
        };
        let space = apply::Space {
            free: sb.free,
            inodes: sb.inodes,
        };
        apply::offline(at, o, &facts, is_sysext, space, t)?
    };

    // The SBOM before OUT appears, so no image is published without one.
    let base_sha256 = base_hash
        .join()
        .map_err(|_| ImageError::Tool {
            tool: "sha256".into(),
            why: format!("hashing {} panicked", o.base.display()),
        })?
        .map_err(io_err(&o.base))?
        .sha256;
    let format_name = clap::ValueEnum::to_possible_value(&o.format)
        .map(|v| v.get_name().to_string())
        .unwrap_or_default();
    let layer_sha256 = applied.report.verified.as_ref().map(|v| v.sha256.clone());
    let sbom = sbom::spdx_json(&sbom::Inputs {
        out: &o.out,
        format: &format_name,
        base: &o.base,
        base_format: &base_format,
        base_sha256: &base_sha256,
        partition: part.number,
        layer: &o.layer,
        layer_sha256: layer_sha256.as_deref(),
        image_id: facts.image_id.as_deref(),
        node_files: &applied.node_files,
    })?;
    let sbom_path = sbom_path(&o.out);

    if o.format == Format::Raw {
        sync(work.path())?;
        publish_mode(work.path())?;
        work.persist(&o.out).map_err(|e| ImageError::Io {
            path: o.out.clone(),
            source: e.error,
        })?;
    } else {
        let out = temp(".out")?;
        disk::convert_out(work.path(), o.format, out.path())?;
        sync(out.path())?;
        publish_mode(out.path())?;
        out.persist(&o.out).map_err(|e| ImageError::Io {
            path: o.out.clone(),
            source: e.error,
        })?;
    }
    if let Err(e) = crate::atomic_file::write(&sbom_path, ".kiln-image-", sbom.as_bytes(), 0o644) {
        let _ = std::fs::remove_file(&o.out);
        return Err(ImageError::Io {
            path: sbom_path,
            source: std::io::Error::other(e.to_string()),
        });
    }
    Ok(ImageReport {
        sbom: sbom_path,
        base_format,
        table: table.scheme.to_string(),
        partition: part.number,
        offset: part.offset,
        size: part.size,
        via,
        filesystem: kind.name().to_string(),
        replaced: applied
            .installed
            .filter(|h| facts.image_id.as_deref() != Some(h.as_str())),
        image_id: facts.image_id,
        free_before: applied.free,
        install: applied.report,
        node_files: applied.node_files,
        swept,
        out: o.out.clone(),
    })
}

/// The base must be a regular file or a block device (an attached volume): a character
/// device, FIFO or directory is refused before anything reads it.
fn check_base(base: &Path) -> Result<(), ImageError> {
    use std::os::unix::fs::FileTypeExt;
    let t = std::fs::metadata(base).map_err(io_err(base))?.file_type();
    if t.is_file() || t.is_block_device() {
        return Ok(());
    }
    let found = if t.is_dir() {
        "a directory"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_fifo() {
        "a FIFO"
    } else {
        "a special file"
    };
    Err(ImageError::Io {
        path: base.to_path_buf(),
        source: std::io::Error::other(format!(
            "expected a disk image file (or a block device), found {found}"
        )),
    })
}

/// `--allow-backing-dir`, canonical: the directory must exist.
fn allowed_dir(dir: &Path) -> Result<base::Allow, ImageError> {
    let real = std::fs::canonicalize(dir).map_err(io_err(dir))?;
    if !real.is_dir() {
        return Err(ImageError::Io {
            path: dir.to_path_buf(),
            source: std::io::Error::other("is not a directory (--allow-backing-dir)"),
        });
    }
    Ok(base::Allow { dir: real })
}

/// OUT's directory, which must exist: the working copy and OUT's temporary file go there.
fn out_dir(out: &Path) -> Result<PathBuf, ImageError> {
    let dir = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => Ok(dir),
        Ok(_) => Err(ImageError::Io {
            path: dir,
            source: std::io::Error::other("is not a directory (the directory of --out)"),
        }),
        Err(e) => Err(ImageError::Io {
            path: dir,
            source: std::io::Error::new(
                e.kind(),
                format!("the directory of --out: {e}; create it first"),
            ),
        }),
    }
}

/// Resolves `--via auto`: a private mount namespace is the test of whether kiln may mount.
fn choose_via(via: Via) -> Result<Via, ImageError> {
    match via {
        Via::Debugfs => Ok(Via::Debugfs),
        Via::Auto => Ok(if mount::private_namespace().is_ok() {
            Via::Loop
        } else {
            Via::Debugfs
        }),
        Via::Loop => {
            mount::private_namespace().map_err(|e| ImageError::Tool {
                tool: "unshare(CLONE_NEWNS)".into(),
                why: format!("{e}: --via loop mounts the root partition through a loop device and needs root; --via debugfs needs no privileges (ext4 only)"),
            })?;
            Ok(Via::Loop)
        }
    }
}

/// The root partition's filesystem, if the chosen mode can write it.
fn check_fs(head: &[u8], via: Via, base: &Path, partition: u32) -> Result<fs::FsKind, ImageError> {
    let fs_err = |found: String| ImageError::Filesystem {
        base: base.to_path_buf(),
        partition,
        found,
    };
    match (fs::detect(head), via) {
        (Some(fs::FsKind::Ext4), Via::Debugfs) => {
            if fs::ext4_space(head).is_some_and(|s| s.needs_recovery) {
                return Err(fs_err("ext4 whose journal needs recovery (it was not unmounted cleanly): run e2fsck on the base, or kiln image as root (--via loop), which replays it".into()));
            }
            Ok(fs::FsKind::Ext4)
        }
        (Some(other), Via::Debugfs) => Err(fs_err(format!(
            "{} (the unprivileged mode writes ext4 only; as root, --via loop writes xfs and btrfs too)",
            other.name()
        ))),
        (Some(kind), _) => Ok(kind),
        (None, _) => Err(fs_err(fs::describe_unknown(head))),
    }
}

/// Where the SBOM of `out` goes: `OUT.spdx.json`.
pub fn sbom_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".spdx.json");
    out.with_file_name(name)
}

/// Gives OUT the mode of a file created under the usual umask (temporary files are 0600).
fn publish_mode(path: &Path) -> Result<(), ImageError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(io_err(path))
}

/// Flushes a file a child process wrote (by path: the tool may have replaced the inode).
fn sync(path: &Path) -> Result<(), ImageError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io_err(path))
}
