//! The one error type of a run: what went wrong, in words that name the file, key or URL,
//! and the stable [`Reason`] that decides the exit code and the status files.

use std::fmt;

use crate::Reason;

/// A failed run, grouped by the phase that failed. Each carries its reason code.
#[derive(Debug)]
pub enum Error {
    /// The command line was wrong.
    Usage(String),
    /// A contract file is missing, malformed, of an unknown version, or too open.
    Config { reason: Reason, message: String },
    /// The metadata source failed or answered something unusable.
    Metadata { reason: Reason, message: String },
    /// A file under `/run/kiln/` could not be written.
    Write(String),
    /// The service manager or `kubeadm join` failed.
    Start { reason: Reason, message: String },
    /// kubelet started but did not become healthy and joined; the reason is the diagnosis.
    Join { reason: Reason, message: String },
}

impl Error {
    /// A configuration error with `reason`.
    pub fn config(reason: Reason, message: String) -> Error {
        Error::Config { reason, message }
    }

    /// A metadata error with `reason`.
    pub fn metadata(reason: Reason, message: String) -> Error {
        Error::Metadata { reason, message }
    }

    /// The stable reason code.
    pub fn reason(&self) -> Reason {
        match self {
            Error::Usage(_) => Reason::Usage,
            Error::Write(_) => Reason::WriteFailed,
            Error::Config { reason, .. }
            | Error::Metadata { reason, .. }
            | Error::Start { reason, .. }
            | Error::Join { reason, .. } => *reason,
        }
    }

    /// The human message, without the reason code.
    pub fn message(&self) -> &str {
        match self {
            Error::Usage(m) | Error::Write(m) => m,
            Error::Config { message, .. }
            | Error::Metadata { message, .. }
            | Error::Start { message, .. }
            | Error::Join { message, .. } => message,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason().code(), self.message())
    }
}

impl std::error::Error for Error {}
