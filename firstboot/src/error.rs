//! The one error type of a run: what went wrong, in words that name the file, key or URL,
//! and the stable [`Reason`] that decides the exit code and the status files.

use std::fmt;

use crate::Reason;

/// A failed run: its reason code and the human message.
///
/// Boxed, so that an `Error` is one pointer: every `Result<_, Error>` forwarded through `?`
/// stays small (the failure path is the rare one; a 32-byte error cost kiln-firstboot about
/// 8 KiB of code moving it around). The constructors name the phase that failed.
#[derive(Debug)]
pub struct Error(Box<Inner>);

#[derive(Debug)]
struct Inner {
    reason: Reason,
    message: String,
}

impl Error {
    fn new(reason: Reason, message: String) -> Error {
        Error(Box::new(Inner { reason, message }))
    }

    /// A contract file is missing, malformed, of an unknown version, or too open.
    pub fn config(reason: Reason, message: String) -> Error {
        Error::new(reason, message)
    }

    /// The metadata source failed or answered something unusable.
    pub fn metadata(reason: Reason, message: String) -> Error {
        Error::new(reason, message)
    }

    /// A file under `/run/kiln/` could not be written.
    pub fn write(message: String) -> Error {
        Error::new(Reason::WriteFailed, message)
    }

    /// The service manager or `kubeadm join` failed.
    pub fn start(reason: Reason, message: String) -> Error {
        Error::new(reason, message)
    }

    /// kubelet started but did not become healthy and joined; the reason is the diagnosis.
    pub fn join(reason: Reason, message: String) -> Error {
        Error::new(reason, message)
    }

    /// The stable reason code.
    pub fn reason(&self) -> Reason {
        self.0.reason
    }

    /// The human message, without the reason code.
    pub fn message(&self) -> &str {
        &self.0.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.reason().code(), self.message())
    }
}

impl std::error::Error for Error {}
