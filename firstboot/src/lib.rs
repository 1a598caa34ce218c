//! kiln-firstboot: runs once per boot, turns kiln's node contract (`/usr/lib/kiln`,
//! `/etc/kiln`) and one instance metadata source into kubelet's environment, starts kubelet
//! and reports the outcome. std only, no crates: see `docs/contract.md`.

pub mod reason;

pub use reason::Reason;
pub mod status;
