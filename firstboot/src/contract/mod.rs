//! The node contract (`docs/contract.md`) in one place: its version, every path, every env
//! key, the env-file codec and the reason codes. kiln-firstboot reads the contract and the
//! builder (`kiln`, which depends on this library) writes it, so both import it from here and
//! neither spells a path, a key or a quoting rule of its own.
//!
//! Nothing in here does I/O: the modules are constants, typed values and pure parsers.

pub mod envfile;
pub mod image_env;
pub mod kubelet_env;
pub mod node_env;
pub mod paths;
pub mod reason;
pub mod sizing;
pub mod status_json;

pub use envfile::EnvFile;
pub use node_env::{JoinMode, Provider};
pub use reason::Reason;

/// The contract version this build speaks (`KILN_CONTRACT` in every env file, `kiln_contract`
/// in status.json).
pub const VERSION: u32 = 1;

/// [`VERSION`] as it appears in an env file.
pub const VERSION_TEXT: &str = "1";

/// The key every contract env file starts with: the contract version it was written for.
pub const KILN_CONTRACT: &str = "KILN_CONTRACT";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_text_is_the_version() {
        assert_eq!(VERSION_TEXT, VERSION.to_string());
    }
}
