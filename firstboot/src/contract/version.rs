//! The contract version, and the key that carries it in every contract env file.

/// The contract version this build speaks (`KILN_CONTRACT` in every env file, `kiln_contract`
/// in status.json).
pub const VERSION: u32 = 1;

/// [`VERSION`] as it appears in an env file.
pub const VERSION_TEXT: &str = "1";

/// The key every contract env file starts with: the contract version it was written for.
pub const KILN_CONTRACT: &str = "KILN_CONTRACT";
