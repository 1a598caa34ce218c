//! kiln: builds immutable Kubernetes node images from a signed, pinned artifact lock.
//!
//! The library holds every piece so tests and benchmarks can call it directly; the `kiln`
//! binary is a thin command line on top (see [`cli`]).

pub mod archive_rules;
pub mod atomic_file;
pub mod attest;
pub mod bake;
pub mod bounded_read;
pub mod cli;
pub mod digest;
pub mod exit;
pub mod firstboot_man;
pub mod image;
pub mod image_def;
pub mod install;
pub mod layer_contract;
pub mod plan;
pub mod proxy_url;
pub mod render;
pub mod sizing;
pub mod supply;
