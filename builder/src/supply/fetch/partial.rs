//! Filling the store's partial file for one artifact: claiming it, writing chunks, committing
//! off the runtime, and turning store errors into retry decisions.

use std::time::Duration;

use super::error::AttemptError;
use crate::supply::store::{Claim, Expect, Partial, Store, StoreError};

/// Claims the partial file for `expect`, waiting while another task or process fills it.
pub(crate) async fn claim(store: &Store, expect: &Expect) -> Result<Claim, AttemptError> {
    loop {
        match store.claim(expect).map_err(AttemptError::Store)? {
            // Another process (or task) is filling it: wait for it to finish or die.
            Claim::Busy => tokio::time::sleep(Duration::from_millis(100)).await,
            other => return Ok(other),
        }
    }
}

/// fsync of a large blob can take a while: do it on the blocking pool so the runtime's few
/// worker threads keep other downloads moving.
pub(crate) async fn commit_off_thread(partial: Partial, from: String) -> Result<(), AttemptError> {
    tokio::task::spawn_blocking(move || commit(partial, &from))
        .await
        .unwrap_or_else(|e| Err(AttemptError::Fatal(format!("commit task failed: {e}"))))
}

/// Appends `bytes` read from `from`.
pub(crate) fn write_chunk(
    partial: &mut Partial,
    bytes: &[u8],
    from: String,
) -> Result<(), AttemptError> {
    partial.write(bytes).map_err(|e| write_error(e, &from))
}

/// A failed [`Partial::write`]: too many bytes means the source serves another file.
pub(crate) fn write_error(e: StoreError, from: &str) -> AttemptError {
    match e {
        StoreError::TooLong { .. } => AttemptError::Wrong(format!("{from}: {e}")),
        other => AttemptError::Store(other),
    }
}

fn commit(partial: Partial, from: &str) -> Result<(), AttemptError> {
    match partial.commit() {
        Ok(_) => Ok(()),
        Err(e @ StoreError::Mismatch { .. }) => Err(AttemptError::Wrong(format!("{from}: {e}"))),
        Err(e @ StoreError::TooShort { .. }) => {
            Err(AttemptError::Transient(format!("{from}: {e}")))
        }
        Err(e) => Err(AttemptError::Store(e)),
    }
}
