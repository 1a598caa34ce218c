//! kiln-firstboot: runs once per boot, turns kiln's node contract (`/usr/lib/kiln`,
//! `/etc/kiln`) and one instance metadata source into kubelet's environment, starts kubelet
//! and reports the outcome. std only, no crates: see `docs/contract.md`.

pub mod contract;

pub use contract::Reason;
pub mod cli;
pub mod clock;
pub mod config;
pub mod console;
pub mod diagnose;
pub mod error;
pub mod fsutil;
pub mod http;
pub mod json;
pub mod kubelet_env;
pub mod netaddr;
pub mod provider;
pub mod report;
pub mod run;
pub mod service;
pub mod sizing;
pub mod standin;
pub mod status;
pub mod text;
pub mod wait;
pub mod windows;
