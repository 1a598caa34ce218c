//! Why talking to a registry failed ([`RegistryError`]), and the exit code it maps to.

use std::time::Duration;

use crate::exit::ExitClass;
use crate::supply::store::StoreError;

/// Why pulling images failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// Some images (or, from a registry mirror, artifacts) could not be pulled.
    #[error("{} of {total} {kind} could not be pulled:\n{}", failures.len(), failures.iter().map(|(id, e)| format!("  {id}: {e}")).collect::<Vec<_>>().join("\n"))]
    Failed {
        /// `images` or `artifacts`.
        kind: &'static str,
        /// How many were attempted.
        total: usize,
        /// `(image id, last error)` per failed image.
        failures: Vec<(String, String)>,
        /// Whether any failure was wrong bytes (a digest or size mismatch).
        wrong_bytes: bool,
    },
    /// Some manifests or blobs could not be pushed.
    #[error("{} of {total} manifests could not be pushed to {target}:\n{}", failures.len(), failures.iter().map(|(id, e)| format!("  {id}: {e}")).collect::<Vec<_>>().join("\n"))]
    PushFailed {
        /// `oci://HOST/REPO`.
        target: String,
        /// Manifests attempted.
        total: usize,
        /// `(what, last error)` per failure.
        failures: Vec<(String, String)>,
        /// Whether the registry found wrong bytes (a damaged local blob).
        wrong_bytes: bool,
    },
    /// The mirror lacks what its lock names; nothing was pushed.
    #[error("the mirror is incomplete, nothing was pushed (run kiln mirror verify, then kiln mirror sync):\n{}", .0.iter().map(|(id, e)| format!("  {id}: {e}")).collect::<Vec<_>>().join("\n"))]
    Incomplete(Vec<(String, String)>),
    /// A layer in the registry is not what its referrers say, or lacks one.
    #[error("layer {layer}: {why}")]
    Untrusted {
        /// `oci://HOST/REPO:TAG`.
        layer: String,
        /// Which check failed.
        why: String,
    },
    /// The lock artifact of a registry mirror could not be read.
    #[error("reading the mirror's lock from {0}")]
    LockArtifact(String),
    /// The overall deadline passed.
    #[error("pulling images did not finish within its deadline of {0:?}; partial downloads are kept and resume next time")]
    Deadline(Duration),
    /// The HTTP client or the options are unusable.
    #[error("registry client: {0}")]
    Client(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl RegistryError {
    /// Wrong bytes exit 3; unreachable registries and the deadline exit 4; the rest 1.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            RegistryError::Failed {
                wrong_bytes: true, ..
            } => ExitClass::Verify,
            RegistryError::PushFailed {
                wrong_bytes: true, ..
            } => ExitClass::Verify,
            RegistryError::Failed { .. }
            | RegistryError::PushFailed { .. }
            | RegistryError::LockArtifact(_)
            | RegistryError::Deadline(_) => ExitClass::Fetch,
            RegistryError::Client(_) | RegistryError::Store(_) => ExitClass::Failure,
            RegistryError::Incomplete(_) | RegistryError::Untrusted { .. } => ExitClass::Verify,
        }
    }
}
