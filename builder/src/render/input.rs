//! The caps for the files `node.toml` names (and `node.toml` itself), read through
//! [`crate::bounded_read`]: regular files only, no FIFO waits, never more than the cap.

pub use crate::bounded_read::{read_regular, read_text};

/// The most a CA bundle may hold: 1 MiB. A PEM certificate is 1-3 KiB; the largest public
/// trust bundles (Mozilla's, ~150 roots) are about 220 KiB. A cluster CA file is one to a few
/// certificates.
pub const MAX_CA: u64 = 1 << 20;

/// The most a `token_file` may hold: 4 KiB. A bootstrap token is 23 bytes; the cap leaves room
/// for comments or whitespace around it, and nothing a token file legitimately holds is larger.
pub const MAX_TOKEN: u64 = 4 << 10;

/// The most any other file node.toml names (node.toml itself, a kubeconfig, a kubelet config)
/// may hold: 1 MiB, far above any real one, and far below what the render payloads carry
/// (EC2 user data is 16 KiB).
pub const MAX_OTHER: u64 = 1 << 20;
