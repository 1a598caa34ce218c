//! `/run/kiln/status.json` (`docs/contract.md#status-json`): the caps on its free-text
//! fields. The document itself is written by `crate::reporter` and read back by
//! `crate::report`.

/// The cap on the `log` lines kept in status.json, in bytes, all lines together.
pub const LOG_CAP: usize = 4096;
/// The cap on `message`, and on each `log` line, in bytes.
pub const MESSAGE_CAP: usize = 512;
