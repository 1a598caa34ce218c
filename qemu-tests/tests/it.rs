//! The boot tests, in one binary (issue 35: one test binary per crate, as `builder/tests/it.rs`
//! and `firstboot/tests/it.rs`): each `tests/<name>.rs` is a module of it. Run one scenario
//! with a name filter, e.g. `cargo nextest run -p kiln-qemu-tests -E 'test(=scenarios::cloud_init)'`
//! or `cargo test -p kiln-qemu-tests --test it scenarios::cloud_init`.
//!
//! A new `tests/<name>.rs` must be declared below; `every_test_file_is_a_module_here` fails
//! until it is (Cargo.toml sets `autotests = false`, so nothing else would run it).

mod boot;
mod harness;
mod scenarios;

/// Every `tests/*.rs` is declared above: with `autotests = false`, an undeclared file would
/// silently never run.
#[test]
fn every_test_file_is_a_module_here() {
    test_modules::assert_every_test_file_is_declared(env!("CARGO_MANIFEST_DIR"));
}

#[path = "../../testkit/test_modules.rs"]
mod test_modules;
