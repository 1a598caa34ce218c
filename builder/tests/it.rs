//! kiln's integration tests, in one binary: each `tests/<name>.rs` is a module of it, so the
//! workspace links tokio, reqwest and zstd into one test executable instead of one per file
//! (issue 35: CI time). Run one file's tests with a name filter, e.g.
//! `cargo nextest run -p kiln --test it -E 'test(/^bake_golden::/)'` or
//! `cargo test -p kiln --test it bake_golden::`.
//!
//! A new `tests/<name>.rs` must be declared below; `every_test_file_is_a_module_here` fails
//! until it is (Cargo.toml sets `autotests = false`, so nothing else would run it).

// The testkit helpers and the support modules are included by several test files each, as they
// were when every file was its own binary.
#![allow(clippy::duplicate_mod)]

mod bake_support;
mod image_support;
mod render_support;
mod support;

mod bake_fixture_mirror;
mod bake_formats;
mod bake_golden;
mod bake_hostile;
mod bake_images;
mod bake_install;
mod bake_man_page;
mod bake_progress;
mod bake_provenance;
mod bake_repro;
mod bake_rootfs_frames;
mod bake_sbom;
mod bake_sizing;
mod bake_sysext_ddi;
mod bake_sysext_systemd;
mod bake_sysupdate_real;
mod bake_sysupdate_sign;
mod bake_windows_containerd;
mod bench_doc;
mod ci_examples;
mod cli_completions;
mod cli_json;
mod cli_messages;
mod cli_reference;
mod docs_examples;
mod first_bake;
mod hostile_corpus;
mod image_disk;
mod image_flatcar;
mod image_fs;
mod image_hostile;
mod image_unprivileged;
mod install_safety;
mod layer_publish;
mod layout;
mod prop_archive;
mod prop_parsers;
mod prop_squashfs;
mod render_config;
mod render_containerd_config;
mod render_credential_providers;
mod render_registry_pull;
mod render_roundtrip;
mod render_sysext;
mod render_validators;
mod squashfs_writer;
mod supply_author;
mod supply_fetch;
mod supply_fixture;
mod supply_limits;
mod supply_lock;
mod supply_lock_images;
mod supply_mirror;
mod supply_mirror_images;
mod supply_outdated;
mod supply_registry;
mod supply_registry_push;
mod supply_skew;
mod windows_layer;

/// Every `tests/*.rs` file is a module of this binary, or its tests would never run.
#[test]
fn every_test_file_is_a_module_here() {
    test_modules::assert_every_test_file_is_declared(env!("CARGO_MANIFEST_DIR"));
}

#[path = "../../testkit/test_modules.rs"]
mod test_modules;
