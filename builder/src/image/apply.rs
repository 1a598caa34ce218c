//! What `kiln image` does to the root filesystem, in either mode: the checks before the first
//! write (whose node this is, whether the layer fits), then the layer (`kiln install`'s rules,
//! or a sysext placed in `/etc/extensions/`) and the node config's files.
//!
//! [`Via::Loop`] runs it on the mounted filesystem; [`Via::Debugfs`] on a staging directory that
//! [`crate::image::offline`] mirrors from, and commits back into, the image.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use kiln_firstboot::contract::paths;

use crate::image::disk::Format;
use crate::image::error::{io_err, ImageError};
use crate::image::layer;
use crate::image::offline;
use crate::image::provision;
use crate::image::sysext;
use crate::install::{InstallOptions, InstallReport};
use crate::layer_contract::INSTALL_MANIFEST;
use crate::render::model::{CONTRACT_FILES, LINUX_DIR};

/// Bytes kept free beyond the layer's size, for directories, inode tables and the journal.
pub const SPACE_MARGIN: u64 = 16 << 20;

/// What to build.
#[derive(Debug, Clone)]
pub struct ImageOptions {
    /// The base disk image (raw, qcow2, VHD, VHDX, single-file VMDK). Read only.
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
    /// How the root filesystem is written.
    pub via: Via,
    /// The directory a base's backing files and external data files may come from
    /// (`--allow-backing-dir`); without it a base that names another file is refused.
    pub allow_backing_dir: Option<PathBuf>,
}

/// How kiln writes the root filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// `loop` when kiln may mount (root, or CAP_SYS_ADMIN), otherwise `debugfs`.
    Auto,
    /// Loop-mount the root partition in a private mount namespace (root; ext4, xfs, btrfs).
    Loop,
    /// Edit the ext4 filesystem in the file with e2fsprogs' debugfs (no privileges).
    Debugfs,
}

/// Where the checks and the install ran, and what they found.
#[derive(Debug)]
pub struct Applied {
    /// The image id of the kiln node the base already was.
    pub installed: Option<String>,
    /// Bytes free before.
    pub free: u64,
    /// The install's report.
    pub report: InstallReport,
    /// The node config's files, as the node sees their paths.
    pub node_files: Vec<String>,
}

/// Room in the root filesystem.
#[derive(Debug, Clone, Copy)]
pub struct Space {
    /// Bytes an unprivileged writer may use.
    pub free: u64,
    /// Free inodes.
    pub inodes: u64,
}

/// Where the partition is, for error messages.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The base image as the user named it.
    pub base: &'a Path,
    /// The root partition's number.
    pub partition: u32,
}

/// Checks and applies the layer and node files to the root at `root`.
pub fn to_root(
    root: &Path,
    o: &ImageOptions,
    facts: &layer::LayerFacts,
    is_sysext: bool,
    space: Space,
    t: Target<'_>,
) -> Result<Applied, ImageError> {
    let installed = if is_sysext {
        None
    } else {
        layer::installed_image_id(root)?
    };
    if let (Some(have), false) = (&installed, o.replace) {
        if facts.image_id.as_deref() != Some(have.as_str()) {
            return Err(ImageError::OtherVersion {
                base: t.base.to_path_buf(),
                found: have.clone(),
                want: facts
                    .image_id
                    .clone()
                    .unwrap_or_else(|| "(no image id)".into()),
            });
        }
    }
    // Files the root already holds as the layer wants them are not written again.
    let need = facts.unpacked_bytes.saturating_sub(if is_sysext {
        0
    } else {
        layer::already_there(root, facts)
    }) + o
        .node_files
        .iter()
        .map(|f| f.contents.len() as u64)
        .sum::<u64>();
    let entries = facts.entries + o.node_files.len() as u64;
    if space.free < need.saturating_add(SPACE_MARGIN) || space.inodes < entries {
        return Err(ImageError::NoSpace {
            base: t.base.to_path_buf(),
            partition: t.partition,
            free: space.free,
            need,
            margin: SPACE_MARGIN,
            inodes: space.inodes,
            entries,
        });
    }
    let report = if is_sysext {
        let p = sysext::place(
            &o.layer,
            root,
            &o.install.trust,
            o.replace,
            t.base,
            t.partition,
        )?;
        InstallReport {
            verified: p.verified,
            written: [p.written].into_iter().filter(|w| !w.is_empty()).collect(),
            removed: p.removed,
            ..Default::default()
        }
    } else {
        // The working copy is thrown away on failure and flushed whole before it is
        // published: per-file fsyncs buy nothing.
        let install = InstallOptions {
            durable: false,
            ..o.install.clone()
        };
        crate::install::install(&o.layer, root, &install).map_err(|source| ImageError::Install {
            base: t.base.to_path_buf(),
            partition: t.partition,
            source: Box::new(source),
        })?
    };
    let node_files = if o.node_files.is_empty() {
        Vec::new()
    } else {
        provision::place_node_files(root, &o.node_files)?
    };
    Ok(Applied {
        installed,
        free: space.free,
        report,
        node_files,
    })
}

/// The paths the operations read or write, for the unprivileged mode's mirror: every path of
/// the layer's manifest and of the one the base holds, `image.env`, and the contract files.
fn paths_to_mirror(
    fs_: &crate::image::debugfs::Fs,
    facts: &layer::LayerFacts,
    o: &ImageOptions,
    is_sysext: bool,
) -> Result<BTreeSet<String>, ImageError> {
    let mut set = BTreeSet::new();
    let manifest = |text: &str, from: &Path| {
        crate::install::parse_manifest(text, from).map_err(|e| ImageError::Layer {
            layer: from.to_path_buf(),
            why: e.to_string(),
        })
    };
    if !is_sysext {
        set.insert(INSTALL_MANIFEST.to_string());
        set.insert(paths::IMAGE_ENV.trim_start_matches('/').to_string());
        if let Some(text) = &facts.manifest {
            set.extend(manifest(text, &o.layer)?.into_keys());
        }
        if let Some(old) = fs_.cat(&format!("/{INSTALL_MANIFEST}"))? {
            let text = String::from_utf8_lossy(&old);
            set.extend(manifest(&text, &o.base.join(INSTALL_MANIFEST))?.into_keys());
        }
    }
    if !o.node_files.is_empty() {
        let dir = LINUX_DIR.trim_start_matches('/');
        set.extend(CONTRACT_FILES.iter().map(|(n, _)| format!("{dir}/{n}")));
        set.extend(o.node_files.iter().map(|f| format!("{dir}/{}", f.name)));
        // Registry host directories the base already holds, so that placing the node's files
        // sees (and refuses or updates) them as it does on a mounted root.
        let certs = format!("/{dir}/{}", crate::render::registries::CERTS_D);
        let listed = fs_.list(std::slice::from_ref(&certs), &std::env::temp_dir())?;
        for host in listed.get(&certs).into_iter().flat_map(|m| m.keys()) {
            for f in crate::render::registries::HOST_FILES {
                set.insert(format!("{}/{host}/{f}", certs.trim_start_matches('/')));
            }
        }
    }
    Ok(set)
}

/// Where the unprivileged mode works.
#[derive(Debug, Clone, Copy)]
pub struct Staged<'a> {
    /// The raw working copy.
    pub work: &'a Path,
    /// The root partition's byte offset in it.
    pub offset: u64,
    /// A directory for the staging and check copies (OUT's).
    pub scratch: &'a Path,
}

/// The unprivileged mode: mirror, apply on the staging directory, commit into the image.
pub fn offline(
    at: Staged<'_>,
    o: &ImageOptions,
    facts: &layer::LayerFacts,
    is_sysext: bool,
    space: Space,
    t: Target<'_>,
) -> Result<Applied, ImageError> {
    let scratch = at.scratch;
    let fs_ = crate::image::debugfs::Fs::new(at.work, at.offset);
    let paths = paths_to_mirror(&fs_, facts, o, is_sysext)?;
    let staging = tempfile::Builder::new()
        .prefix(crate::image::leftovers::PREFIX)
        .tempdir_in(scratch)
        .map_err(io_err(scratch))?;
    let _held =
        crate::image::leftovers::hold_dir(staging.path()).map_err(io_err(staging.path()))?;
    let whole: &[&str] = if is_sysext {
        &[sysext::EXTENSIONS]
    } else {
        &[]
    };
    let m = offline::mirror(fs_, t.base, staging.path(), &paths, whole)?;
    let mut applied = to_root(m.root(), o, facts, is_sysext, space, t)?;
    let ch = m.commit(t.base, INSTALL_MANIFEST, scratch)?;
    // The staging directory lacks the base's other directories, so the install's own list
    // of directories it made is the commit's.
    applied.report.dirs_created = ch.dirs;
    Ok(applied)
}
