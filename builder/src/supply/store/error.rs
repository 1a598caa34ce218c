//! Why a store operation failed, with the exit class each failure maps to.

use std::io;
use std::path::{Path, PathBuf};

use crate::exit::ExitClass;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A filesystem operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// Something other than kiln's own file sits, or was swapped in, at a partial file's name.
    #[error("{path}: not a regular file kiln created (a symlink, FIFO, device, directory or hard link is at that name, or it was replaced while kiln wrote it); nothing was stored. Remove it, and check who else writes this directory")]
    Planted {
        /// The partial file's name.
        path: PathBuf,
    },
    /// A sha256 argument is not 64 lowercase hex digits.
    #[error("not a sha256 (64 lowercase hex digits): {0:?}")]
    BadDigest(String),
    /// More bytes arrived than the expected size.
    #[error("{what}: expected {expected} bytes, received more ({found} so far); the source is serving a different file")]
    TooLong {
        /// The artifact or blob.
        what: String,
        /// Expected size.
        expected: u64,
        /// Bytes seen.
        found: u64,
    },
    /// The stream ended early.
    #[error("{what}: expected {expected} bytes, the source ended after {found}")]
    TooShort {
        /// The artifact or blob.
        what: String,
        /// Expected size.
        expected: u64,
        /// Bytes seen.
        found: u64,
    },
    /// The bytes have the right size but the wrong hash.
    #[error("{what}: expected sha256 {expected}, found {found}; the bytes were discarded")]
    Mismatch {
        /// The artifact or blob.
        what: String,
        /// Expected digest.
        expected: String,
        /// Actual digest.
        found: String,
    },
}

impl StoreError {
    /// Bytes that are not what was expected are refused (exit 3); the rest is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            StoreError::Mismatch { .. }
            | StoreError::TooLong { .. }
            | StoreError::TooShort { .. } => ExitClass::Verify,
            StoreError::Io { .. } | StoreError::BadDigest(_) | StoreError::Planted { .. } => {
                ExitClass::Failure
            }
        }
    }
}

pub(crate) fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io {
        action,
        path,
        source,
    }
}
