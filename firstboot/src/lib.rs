//! kiln-firstboot: runs once per boot, turns kiln's node contract (`/usr/lib/kiln`,
//! `/etc/kiln`) and one instance metadata source into kubelet's environment, starts kubelet
//! and reports the outcome. std only, no crates: see `docs/contract.md`.
// Nothing prints directly: stdout and stderr are reached through `redact::print` and
// `redact::eprint`, which take only redacted text (docs/security.md).
#![warn(clippy::print_stdout, clippy::print_stderr)]

pub mod contract;

pub use contract::Reason;
pub mod cli;
pub mod clock;
pub mod config;
pub mod console;
pub mod diagnose;
pub mod doctor;
pub mod error;
pub mod fsutil;
pub mod http;
pub mod joined;
pub mod json;
pub mod kubeadm;
pub mod kubelet_env;
pub mod netaddr;
pub mod provider;
pub mod redact;
pub mod report;
pub mod reporter;
pub mod run;
pub mod service;
pub mod signatures;
pub mod sizing;
pub mod standin;
pub mod swap;
#[cfg(unix)]
pub mod systemd_bus;
pub mod text;
pub mod wait;
pub mod windows;
pub mod windows_kubelet;
pub mod windows_main;
pub mod yaml;
