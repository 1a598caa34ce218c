//! `kiln image --base BASE --layer LAYER --out OUT`: a base disk image in, a node image out,
//! without booting it. The base is never written: kiln works on a raw copy in OUT's
//! directory, finds the root partition in its table ([`partition`]), checks the filesystem
//! ([`fs`]), loop-mounts it in a private mount namespace ([`mount`]), applies the rootfs
//! layer with `kiln install`'s own code ([`crate::install::install`]), and writes OUT in the
//! format asked for ([`disk`]) through a temporary file and a rename.
//!
//! One mode exists: rootful, through a loop device. An unprivileged mode (e2fsprogs'
//! `debugfs -w` on `IMAGE?offset=N`) is not built yet.

use std::path::{Path, PathBuf};

use crate::install::{InstallOptions, InstallReport};

pub mod disk;
mod error;
pub mod fs;
pub mod layer;
pub mod leftovers;
pub mod mount;
pub mod partition;
pub mod pick;
pub mod provision;
pub mod sbom;
pub mod sysext;

pub use disk::Format;
use error::io_err;
pub use error::ImageError;

/// Bytes kept free beyond the layer's size, for directories, inode tables and the journal.
pub const SPACE_MARGIN: u64 = 16 << 20;

/// What to build.
#[derive(Debug, Clone)]
pub struct ImageOptions {
    /// The base disk image (raw, qcow2, or anything `qemu-img` reads). Read only.
    pub base: PathBuf,
    /// The rootfs layer (`kiln bake --format rootfs`).
    pub layer: PathBuf,
    /// Where the node image goes (replaced atomically).
    pub out: PathBuf,
    /// OUT's format.
    pub format: Format,
    /// The root partition's number, instead of finding it.
    pub partition: Option<u32>,
    /// Upgrade a base that is already a kiln node of another image.
    pub replace: bool,
    /// How the layer is installed (trust, setuid paths, size cap): `kiln install`'s options.
    pub install: InstallOptions,
    /// A node config's files for `/etc/kiln/` (`kiln image --node`), written after the layer.
    pub node_files: Vec<crate::render::model::NodeFile>,
}

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

/// Builds the node image. Needs root (`CAP_SYS_ADMIN`): it moves the calling thread into
/// a private mount namespace of its own.
pub fn build(o: &ImageOptions) -> Result<ImageReport, ImageError> {
    if same_file(&o.base, &o.out) {
        return Err(ImageError::Io {
            path: o.out.clone(),
            source: std::io::Error::other(
                "is the base image; kiln image never writes the base, name another --out",
            ),
        });
    }
    std::fs::metadata(&o.base).map_err(io_err(&o.base))?;
    // The base's sha256 for the SBOM, read beside the rest of the run (the base is never
    // written, so any moment gives the same bytes).
    let base_hash = {
        let p = o.base.clone();
        std::thread::spawn(move || crate::digest::hash_file(&p, crate::digest::Sums::Sha256))
    };
    // The layer first: a layer that cannot be read fails before gigabytes are copied.
    let is_sysext = sysext::is_sysext(&o.layer);
    let facts = if is_sysext {
        layer::LayerFacts {
            unpacked_bytes: std::fs::metadata(&o.layer).map_err(io_err(&o.layer))?.len(),
            entries: 1,
            image_id: None,
        }
    } else {
        layer::peek(&o.layer)?
    };
    let base_format = disk::probe(&o.base)?;
    let dir = match o.out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let temp = |suffix: &str| {
        let t = tempfile::Builder::new()
            .prefix(leftovers::PREFIX)
            .suffix(suffix)
            .tempfile_in(&dir)
            .map_err(io_err(&dir))?;
        leftovers::hold(t.as_file()).map_err(io_err(t.path()))?;
        Ok::<_, ImageError>(t)
    };
    match std::fs::metadata(&dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(ImageError::Io {
                path: dir,
                source: std::io::Error::other("is not a directory (the directory of --out)"),
            })
        }
        Err(e) => {
            return Err(ImageError::Io {
                path: dir,
                source: std::io::Error::new(
                    e.kind(),
                    format!("the directory of --out: {e}; create it first"),
                ),
            })
        }
    }
    // Before the copy, so a run without root fails at once rather than after gigabytes.
    mount::private_namespace().map_err(|e| ImageError::Tool {
        tool: "unshare(CLONE_NEWNS)".into(),
        why: format!("{e}: kiln image mounts the root partition through a loop device and needs root (the unprivileged mode is not built yet)"),
    })?;
    // What killed runs left here (a working copy can be as big as the base).
    let swept = leftovers::sweep(&dir);
    let work = temp(".raw")?;
    disk::working_copy(&o.base, &base_format, work.path())?;

    let file = std::fs::File::open(work.path()).map_err(io_err(work.path()))?;
    let table = partition::read_table(&file).map_err(|source| ImageError::Table {
        base: o.base.clone(),
        source,
    })?;
    let part = pick::pick_root(&table, o.partition).map_err(|source| ImageError::Pick {
        base: o.base.clone(),
        source,
    })?;
    let probe = (partition::ReadAt::size(&file) - part.offset)
        .min(part.size)
        .min(fs::PROBE_BYTES as u64) as usize;
    let head =
        partition::ReadAt::read_at(&file, part.offset, probe).map_err(io_err(work.path()))?;
    let fs_err = |found: String| ImageError::Filesystem {
        base: o.base.clone(),
        partition: part.number,
        found,
    };
    match fs::detect(&head) {
        Some(fs::FsKind::Ext4) => {}
        Some(other) => {
            return Err(fs_err(format!(
                "{} (kiln image writes ext4 only so far)",
                other.name()
            )))
        }
        None => return Err(fs_err(fs::describe_unknown(&head))),
    }
    drop(file);

    let mounted = mount::Mounted::new(work.path(), part.offset, part.size, "ext4", &dir)?;
    let root = mounted.path().to_path_buf();

    // Checks before the first write: whose node this is, and whether the layer fits.
    // (A sysext's other versions are found, and refused without --replace, when placing.)
    let installed = if is_sysext {
        None
    } else {
        layer::installed_image_id(&root)?
    };
    if let (Some(have), false) = (&installed, o.replace) {
        if facts.image_id.as_deref() != Some(have.as_str()) {
            return Err(ImageError::OtherVersion {
                base: o.base.clone(),
                found: have.clone(),
                want: facts
                    .image_id
                    .clone()
                    .unwrap_or_else(|| "(no image id)".into()),
            });
        }
    }
    let st = rustix::fs::statvfs(&root).map_err(|e| ImageError::Io {
        path: root.clone(),
        source: e.into(),
    })?;
    let free = st.f_bavail.saturating_mul(st.f_frsize);
    let need = facts.unpacked_bytes
        + o.node_files
            .iter()
            .map(|f| f.contents.len() as u64)
            .sum::<u64>();
    let entries = facts.entries + o.node_files.len() as u64;
    if free < need.saturating_add(SPACE_MARGIN) || st.f_favail < entries {
        return Err(ImageError::NoSpace {
            base: o.base.clone(),
            partition: part.number,
            free,
            need,
            margin: SPACE_MARGIN,
        });
    }

    let report = if is_sysext {
        let p = sysext::place(
            &o.layer,
            &root,
            &o.install.trust,
            o.replace,
            &o.base,
            part.number,
        )?;
        InstallReport {
            verified: p.verified,
            written: [p.written].into_iter().filter(|w| !w.is_empty()).collect(),
            removed: p.removed,
            ..Default::default()
        }
    } else {
        // The working copy is thrown away on failure and flushed whole before it is
        // published: per-file fsyncs through the loop device buy nothing.
        let install = InstallOptions {
            durable: false,
            ..o.install.clone()
        };
        crate::install::install(&o.layer, &root, &install).map_err(|source| {
            ImageError::Install {
                base: o.base.clone(),
                partition: part.number,
                source: Box::new(source),
            }
        })?
    };
    let node_files = if o.node_files.is_empty() {
        Vec::new()
    } else {
        provision::place_node_files(&root, &o.node_files)?
    };
    mounted.unmount()?;

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
    let sbom = sbom::spdx_json(&sbom::Inputs {
        out: &o.out,
        format: &format_name,
        base: &o.base,
        base_format: &base_format,
        base_sha256: &base_sha256,
        partition: part.number,
        layer: &o.layer,
        image_id: facts.image_id.as_deref(),
        node_files: &node_files,
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
        replaced: installed.filter(|h| facts.image_id.as_deref() != Some(h.as_str())),
        image_id: facts.image_id,
        free_before: free,
        install: report,
        node_files,
        swept,
        out: o.out.clone(),
    })
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
