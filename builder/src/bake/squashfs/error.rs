//! Why a squashfs image could not be written.

use std::io;
use std::path::{Path, PathBuf};

use crate::atomic_file;

/// Why an image could not be written. Each names the layer path or file involved.
#[derive(Debug, thiserror::Error)]
pub enum SquashError {
    /// Reading an input or writing the image failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The tree holds something this writer does not store.
    #[error("squashfs: /{path}: {what}")]
    Unsupported {
        /// The layer path.
        path: String,
        /// What is wrong and what is supported.
        what: String,
    },
    /// An input file is not what the layer says it is.
    #[error("squashfs: /{path} ({file}): {detail}: the file changed while the image was written; bake again")]
    Changed {
        /// The layer path.
        path: String,
        /// Where its bytes were read.
        file: PathBuf,
        /// Expected against found.
        detail: String,
    },
}

impl From<atomic_file::WriteError> for SquashError {
    fn from(e: atomic_file::WriteError) -> SquashError {
        SquashError::Io {
            path: e.path,
            source: e.source,
        }
    }
}

pub(crate) fn image_io(path: &Path) -> impl Fn(io::Error) -> SquashError + '_ {
    move |source| SquashError::Io {
        path: path.to_path_buf(),
        source,
    }
}
