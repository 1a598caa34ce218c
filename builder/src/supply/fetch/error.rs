//! Why a fetch failed ([`FetchError`]), and how one attempt ended inside it.

use std::time::Duration;

use crate::exit::ExitClass;
use crate::supply::store::StoreError;

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Every source failed for some artifacts.
    #[error("{} of {total} artifacts could not be fetched:\n{}", failures.len(), failures.iter().map(|(id, e)| format!("  {id}: {e}")).collect::<Vec<_>>().join("\n"))]
    Failed {
        /// Artifacts attempted.
        total: usize,
        /// `(artifact id, last error)` per failed artifact.
        failures: Vec<(String, String)>,
        /// Whether any failure was a digest/size mismatch (bytes were wrong, not missing).
        wrong_bytes: bool,
    },
    /// The only sources are mirror directories that hold none of the artifacts wanted.
    #[error("{0}")]
    NotInMirrors(String),
    /// The overall deadline passed.
    #[error("the fetch did not finish within its deadline of {0:?}; partial downloads are kept and resume next time")]
    Deadline(Duration),
    /// A small file (a lock, a signature) could not be fetched from a mirror URL.
    #[error("fetching {url}: {reason} (after {attempts} attempts)")]
    Get {
        /// The URL.
        url: String,
        /// The last attempt's error.
        reason: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Client(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FetchError {
    /// Wrong bytes from a source are refused (exit 3); sources that could not deliver, or
    /// the deadline, exit 4; the rest (the client, the store itself) is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            FetchError::Failed {
                wrong_bytes: true, ..
            } => ExitClass::Verify,
            FetchError::Failed { .. }
            | FetchError::NotInMirrors(_)
            | FetchError::Deadline(_)
            | FetchError::Get { .. } => ExitClass::Fetch,
            FetchError::Client(_) | FetchError::Store(_) => ExitClass::Failure,
        }
    }
}

/// How one attempt ended.
pub(crate) enum AttemptError {
    /// Worth retrying the same URL (after backoff).
    Transient(String),
    /// This source cannot deliver this artifact; try the next one.
    Fatal(String),
    /// The source refused the credentials sent (HTTP 401/403): a registry token may have
    /// expired; otherwise the same as [`AttemptError::Fatal`].
    Denied(String),
    /// The source delivered wrong bytes (digest/size); try the next one.
    Wrong(String),
    /// The store itself failed; stop.
    Store(StoreError),
}

/// The message of a failed attempt.
pub(crate) fn msg(e: &AttemptError) -> String {
    match e {
        AttemptError::Transient(m)
        | AttemptError::Fatal(m)
        | AttemptError::Denied(m)
        | AttemptError::Wrong(m) => m.clone(),
        AttemptError::Store(e) => e.to_string(),
    }
}
