//! kiln-firstboot's integration tests, in one binary: each `tests/<name>.rs` is a module of
//! it (issue 35: one test binary per crate; under Wine, `make test-windows` starts one
//! executable instead of one per file). Run one file's tests with a name filter, e.g.
//! `cargo test -p kiln-firstboot --test it run_faults::` or
//! `cargo nextest run -p kiln-firstboot --test it -E 'test(/^run_faults::/)'`.
//!
//! A new `tests/<name>.rs` must be declared below; `every_test_file_is_a_module_here` fails
//! until it is (Cargo.toml sets `autotests = false`, so nothing else would run it). Linux-only
//! files say `#![cfg(unix)]` at their top, the Windows one `#![cfg(windows)]`.

// The testkit helpers are included by several test files each, as they were when every file
// was its own binary.
#![allow(clippy::duplicate_mod)]

// The shared Root/Server/firstboot helpers drive the Linux binary with Unix stand-ins; only
// the Linux-only files use them.
#[cfg(unix)]
mod common;

mod doctor;
mod no_dependencies;
mod no_secret_leaks;
mod prop_parsers;
mod report_after_boot;
mod report_channels;
mod report_contract;
mod report_diagnose;
mod report_run;
mod run_captured;
mod run_credential_providers;
mod run_faults;
mod run_hostile;
mod run_kubeadm;
mod run_platforms;
mod run_providers;
mod run_proxy;
mod run_swap;
mod run_warm_pool;
mod sizing;
mod windows;
mod windows_eventlog;
mod windows_task;

/// Every `tests/*.rs` is declared above: with `autotests = false`, an undeclared file would
/// silently never run.
#[test]
fn every_test_file_is_a_module_here() {
    test_modules::assert_every_test_file_is_declared(env!("CARGO_MANIFEST_DIR"));
}

#[path = "../../testkit/test_modules.rs"]
mod test_modules;
