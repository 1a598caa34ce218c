//! How `kiln image` fails: each error names the file or partition, what was expected and
//! what was found.

use std::io;
use std::path::{Path, PathBuf};

use crate::image::partition::ReadError;
use crate::image::pick::PickError;
use crate::install::InstallError;

/// Why `kiln image` stopped. The base image is never changed; OUT is written only at the end.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// An I/O error on a named path.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// An external tool failed or is missing.
    #[error("{tool}: {why}")]
    Tool {
        /// The tool.
        tool: String,
        /// What happened.
        why: String,
    },
    /// The base image (or a file it names) is refused before `qemu-img` opens it.
    #[error("base image {base}: {source}")]
    Base {
        /// The base image.
        base: PathBuf,
        /// Why.
        source: crate::image::base::BaseError,
    },
    /// The base's partition table is refused.
    #[error("base image {base}: {source}")]
    Table {
        /// The base image.
        base: PathBuf,
        /// Why.
        source: ReadError,
    },
    /// No root partition could be chosen.
    #[error("base image {base}: {source}")]
    Pick {
        /// The base image.
        base: PathBuf,
        /// Why.
        source: PickError,
    },
    /// The layer is built for another architecture than the base's root partition type says.
    #[error(
        "base image {base}, partition {partition}: its GPT type {kind} is the {part_arch} root, but the layer {layer} was baked for {layer_arch}; bake the layer with --arch {part_arch} or use a {layer_arch} base"
    )]
    Arch {
        /// The base image.
        base: PathBuf,
        /// The root partition's number.
        partition: u32,
        /// Its GPT type GUID.
        kind: String,
        /// The architecture that type names.
        part_arch: &'static str,
        /// The layer.
        layer: PathBuf,
        /// The layer's `KILN_ARCH`.
        layer_arch: String,
    },
    /// The root partition holds no filesystem kiln can write.
    #[error(
        "base image {base}, partition {partition}: expected a root filesystem kiln can write (ext4, xfs, btrfs), found {found}"
    )]
    Filesystem {
        /// The base image.
        base: PathBuf,
        /// The partition number.
        partition: u32,
        /// What is there.
        found: String,
    },
    /// The base is a kiln node of another image; `--replace` upgrades it.
    #[error("base image {base} is already a kiln node ({found}); the layer is {want}; pass --replace to upgrade it the way `kiln install` upgrades a root")]
    OtherVersion {
        /// The base image.
        base: PathBuf,
        /// Its image id.
        found: String,
        /// The layer's.
        want: String,
    },
    /// The root filesystem is too full for the layer.
    #[error("base image {base}, partition {partition}: the root filesystem has {free} bytes and {inodes} inodes free, the layer unpacks to {need} bytes (plus a {margin}-byte margin) in {entries} entries; grow the partition and filesystem (qemu-img resize, growpart, resize2fs) first")]
    NoSpace {
        /// The base image.
        base: PathBuf,
        /// The partition number.
        partition: u32,
        /// Bytes free (statvfs f_bavail).
        free: u64,
        /// The layer's unpacked size.
        need: u64,
        /// The margin kept for metadata.
        margin: u64,
        /// Inodes free.
        inodes: u64,
        /// Entries the layer adds.
        entries: u64,
    },
    /// The layer could not be read.
    #[error("layer {layer}: {why}")]
    Layer {
        /// The layer.
        layer: PathBuf,
        /// Why.
        why: String,
    },
    /// `kiln install`'s step failed.
    #[error("installing into partition {partition} of {base}")]
    Install {
        /// The base image.
        base: PathBuf,
        /// The partition.
        partition: u32,
        /// Why (boxed: it is large, and every other variant is small).
        source: Box<InstallError>,
    },
}

impl ImageError {
    /// Whether a check refused the input (a hostile or unverified layer).
    pub fn is_refusal(&self) -> bool {
        matches!(self, ImageError::Install { source, .. } if source.is_refusal())
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ImageError {
    let path = path.to_path_buf();
    move |source| ImageError::Io { path, source }
}

/// A tool that could not be started (usually: not installed).
pub(crate) fn tool(name: &'static str) -> impl FnOnce(io::Error) -> ImageError {
    move |e| {
        ImageError::Tool {
        tool: name.into(),
        why: format!("could not run it ({e}); kiln image needs util-linux (mount, losetup) and qemu-img on PATH"),
    }
    }
}
