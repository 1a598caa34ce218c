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
pub mod sysctl;
pub mod version;

pub use envfile::EnvFile;
pub use node_env::{JoinMode, Provider};
pub use reason::Reason;
pub use version::{KILN_CONTRACT, VERSION, VERSION_TEXT};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_text_is_the_version() {
        assert_eq!(VERSION_TEXT, VERSION.to_string());
    }
}
