//! How an install fails ([`InstallError`]) and the small helpers every install step uses to
//! name what failed.

use std::io;
use std::path::{Path, PathBuf};

use crate::install::verify;
use crate::layer_contract::install_manifest as manifest;

/// Why an install stopped. The root is as it was unless the error says otherwise.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// An I/O error on a named path.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The layer archive holds an entry kiln refuses to apply.
    #[error("{archive}: refusing layer entry {entry:?}: {why}")]
    Hostile {
        /// The layer archive.
        archive: PathBuf,
        /// The entry.
        entry: String,
        /// The rule it breaks.
        why: String,
    },
    /// A path in the root is not kiln's to change.
    #[error("{path}: {why}; kiln install changes only files it installed (listed in {manifest})")]
    NotOwned {
        /// The path in the root.
        path: PathBuf,
        /// What was found.
        why: String,
        /// The install manifest.
        manifest: PathBuf,
    },
    /// The root directory is unusable.
    #[error("root {root}: {why}")]
    Root {
        /// The root.
        root: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The layer could not be verified.
    #[error(transparent)]
    Verify(#[from] verify::VerifyError),
    /// The root's install manifest is malformed.
    #[error(transparent)]
    Manifest(#[from] manifest::ManifestError),
    /// A change failed and undoing the earlier ones failed too.
    #[error("{source}; rolling back also failed, so the root may be partly changed: {}", problems.join("; "))]
    RollbackFailed {
        /// The first failure.
        source: Box<InstallError>,
        /// What could not be undone.
        problems: Vec<String>,
    },
}

impl InstallError {
    /// Whether a check refused the input (a hostile or unverified layer), as opposed to an
    /// I/O failure or a root kiln does not own.
    pub fn is_refusal(&self) -> bool {
        matches!(self, InstallError::Hostile { .. } | InstallError::Verify(_))
    }
}

pub(crate) fn io_err(path: &Path) -> impl FnOnce(io::Error) -> InstallError {
    let path = path.to_path_buf();
    move |source| InstallError::Io { path, source }
}

pub(crate) fn hostile(archive: &Path, entry: &str, why: impl Into<String>) -> InstallError {
    InstallError::Hostile {
        archive: archive.to_path_buf(),
        entry: entry.to_string(),
        why: why.into(),
    }
}

/// Splits `a/b/c` into (`a/b`, `c`); a top-level name has the parent `""`.
pub(crate) fn split(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}
