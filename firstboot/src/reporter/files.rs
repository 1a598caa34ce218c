//! The files a finished run leaves besides status.json: Cluster API's success sentinel and
//! the failure files (`docs/contract.md#cluster-api-files`), each written atomically.

use std::path::{Path, PathBuf};

use crate::contract::paths::NodePaths;
use crate::fsutil;
use crate::redact::{Redacted, Redactor};
use crate::reporter::model::Outcome;
use crate::Reason;

/// Writes or removes the success sentinel and the failure files for a final `outcome`.
/// Never leaves both the sentinel and a failure file in place.
///
/// `redactor` cleans what is written.
pub fn publish_outcome_files(
    paths: &NodePaths,
    outcome: Outcome,
    reason: Reason,
    message: &str,
    redactor: &Redactor,
) -> Result<(), WriteError> {
    let (success, failure, capi_failure) =
        (&paths.capi_success, &paths.failure, &paths.capi_failure);
    match outcome {
        Outcome::Success => {
            remove_if_present(failure)?;
            remove_if_present(capi_failure)?;
            write_atomic(success, &redactor.redact("success\n"), 0o644)
        }
        Outcome::Failure => {
            // The sentinel goes first: a crash in between must not leave a stale "success".
            remove_if_present(success)?;
            let mut text = String::with_capacity(64 + message.len());
            text.push_str(reason.code());
            text.push('\n');
            // The message is one line by contract; logs may carry newlines.
            for c in message.chars() {
                text.push(if c == '\n' || c == '\r' { ' ' } else { c });
            }
            text.push('\n');
            text.push_str(reason.hint());
            text.push('\n');
            let text = redactor.redact(&text);
            write_atomic(failure, &text, 0o644)?;
            write_atomic(capi_failure, &text, 0o644)
        }
        Outcome::Running => Ok(()),
    }
}

fn remove_if_present(path: &Path) -> Result<(), WriteError> {
    fsutil::remove_file(path).map_err(|source| WriteError {
        path: path.to_path_buf(),
        action: "remove",
        source,
    })
}

/// A file under `/run` could not be written or removed.
#[derive(Debug)]
pub struct WriteError {
    pub path: PathBuf,
    pub action: &'static str,
    pub source: std::io::Error,
}

impl std::fmt::Display for WriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "cannot {} {}: {} (is /run a writable tmpfs with free space?)",
            self.action,
            self.path.display(),
            self.source
        )
    }
}

impl std::error::Error for WriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Replaces `path` atomically (fsutil's temp file, fsync, rename), naming it on failure.
/// Status files are read by people who must not see credentials: only redacted text.
pub fn write_atomic(path: &Path, text: &Redacted, mode: u32) -> Result<(), WriteError> {
    fsutil::write_atomic(path, text.as_str().as_bytes(), mode).map_err(|source| WriteError {
        path: path.to_path_buf(),
        action: "write",
        source,
    })
}
