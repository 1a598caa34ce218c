//! What kind of failure an error is, as an exit code says it (`docs/cli.md`). Each library
//! error type answers for itself with an `exit_class()` method; the command line only walks
//! an error's causes and asks (see `cli::exit_code`).

/// The class of a failure: which exit code it ends `kiln` with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitClass {
    /// Any failure not covered below (exit 1).
    Failure,
    /// A check refused its input: lock signature, artifact digest or size, the binary gate,
    /// a hostile archive (exit 3).
    Verify,
    /// A source could not deliver: network errors after retries, 404, the deadline (exit 4).
    Fetch,
}

impl ExitClass {
    /// The process exit code of this class.
    pub const fn code(self) -> u8 {
        match self {
            ExitClass::Failure => 1,
            ExitClass::Verify => 3,
            ExitClass::Fetch => 4,
        }
    }
}
