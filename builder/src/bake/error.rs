//! Why a bake fails ([`BakeError`]): every message names the artifact, file or key.

use std::io;
use std::path::{Path, PathBuf};

use crate::atomic_file;
use crate::bake::extract::{self};
use crate::bake::squashfs::error::SquashError;
use crate::exit::ExitClass;
use crate::image_def::{Arch, Format, Os};
use crate::supply::inspect::InspectError;

/// Why a bake failed. Every message names the artifact, file or key involved.
#[derive(Debug, thiserror::Error)]
pub enum BakeError {
    /// The pinned AWS ENI table is missing, is not the one the definition pins, or does not
    /// parse: a pinned input that did not verify.
    #[error("image {image}: sizing.aws_table: {source}")]
    SizingTable {
        /// The image definition's name.
        image: String,
        /// What is wrong with the table.
        #[source]
        source: crate::sizing::TableError,
    },
    /// An I/O error on a named file.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The lock's containerd cannot serve its kubelet ([`crate::supply::skew`]).
    #[error("image {image}: {source}")]
    Skew {
        /// Image name.
        image: String,
        /// The skew.
        #[source]
        source: crate::supply::skew::SkewError,
    },
    /// The lock's kubelet is not the definition's `kubernetes.version`
    /// ([`crate::plan::kubelet_version_mismatch`] says which and what to do).
    #[error("{0}")]
    Version(String),
    /// The lock has no entry the definition needs.
    #[error("image {image}: artifact {name:?} for {os}/{arch} is not in the lock")]
    MissingArtifact {
        /// Image name.
        image: String,
        /// Lock entry name.
        name: String,
        /// Target OS.
        os: Os,
        /// Target arch.
        arch: Arch,
    },
    /// An artifact contradicts the definition.
    #[error("image {image}: artifact {name:?}: expected {expected}, found {found}")]
    Artifact {
        /// Image name.
        image: String,
        /// Lock entry name.
        name: String,
        /// What the definition needs.
        expected: String,
        /// What the lock or blob holds.
        found: String,
    },
    /// A store blob does not hold the bytes the lock names.
    #[error("artifact {name}: expected {expected}, found {found}")]
    Blob {
        /// The artifact and blob path.
        name: String,
        /// The lock's digest.
        expected: String,
        /// What the blob hashes to.
        found: String,
    },
    /// A lock image the layer bakes is missing from the store, incomplete, or for another
    /// platform.
    #[error("image {image}: lock image {lock_image}: {detail}")]
    Image {
        /// Image definition name.
        image: String,
        /// The lock image (`name (reference)`).
        lock_image: String,
        /// What is wrong, naming the digest.
        detail: String,
    },
    /// A store blob of a lock image does not hash to its digest.
    #[error("lock image {lock_image}: blob {path}: expected {expected}, found {found}; `kiln mirror verify` quarantines it and `kiln fetch` fetches it again")]
    ImageBlob {
        /// The lock image (`name (reference)`).
        lock_image: String,
        /// The store blob.
        path: PathBuf,
        /// The digest (and size) its parent names.
        expected: String,
        /// What was read.
        found: String,
    },
    /// A binary failed the inspection gate.
    #[error("inspection refused {what} ({path}): {why}")]
    Inspect {
        /// The artifact member or `kiln-firstboot`.
        what: String,
        /// The file inspected.
        path: PathBuf,
        /// The gate's reason.
        why: Box<InspectError>,
    },
    /// Two sources want the same path in the layer.
    #[error("layer path /{path} is wanted by both {first} and {second}")]
    Conflict {
        /// The layer path.
        path: String,
        /// The first claimant.
        first: String,
        /// The second claimant.
        second: String,
    },
    /// The format cannot be baked from this definition.
    #[error("image {image}: format {format} is not one of the definition's formats ({})", allowed.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Format {
        /// Image name.
        image: String,
        /// Requested format.
        format: Format,
        /// Formats the definition lists.
        allowed: Vec<Format>,
    },
    /// An archive was refused or lacked a member.
    #[error(transparent)]
    Extract(#[from] extract::ExtractError),
    /// The squashfs writer refused the tree or failed to write.
    #[error(transparent)]
    Squash(#[from] SquashError),
    /// The signed disk image (`--sysext-ddi`) could not be written.
    #[error(transparent)]
    Ddi(#[from] crate::bake::ddi::DdiError),
    /// An external tool failed.
    #[error("{tool} failed: {detail}")]
    Tool {
        /// The tool (`mksquashfs`).
        tool: String,
        /// Its exit status and stderr.
        detail: String,
    },
}

impl BakeError {
    /// A binary the gate refuses, a blob that is not what the lock says and a hostile archive
    /// exit 3; the rest is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            BakeError::Inspect { .. }
            | BakeError::Blob { .. }
            | BakeError::ImageBlob { .. }
            | BakeError::SizingTable { .. }
            | BakeError::Skew { .. }
            | BakeError::Version(_)
            | BakeError::Extract(extract::ExtractError::Hostile { .. }) => ExitClass::Verify,
            _ => ExitClass::Failure,
        }
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> BakeError {
    let path = path.to_path_buf();
    move |source| BakeError::Io { path, source }
}

impl From<atomic_file::WriteError> for BakeError {
    fn from(e: atomic_file::WriteError) -> BakeError {
        BakeError::Io {
            path: e.path,
            source: e.source,
        }
    }
}
