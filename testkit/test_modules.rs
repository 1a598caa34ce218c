//! The check every crate's one integration-test binary makes of itself (issue 35): each
//! `tests/*.rs` is declared in `tests/it.rs`, since with `autotests = false` an undeclared
//! file would silently never run. Included by path from each crate's `tests/it.rs`.

/// Asserts that every `tests/<stem>.rs` under `manifest_dir` other than `it.rs` is declared in
/// `tests/it.rs` as `mod <stem>;` on a line of its own.
pub fn assert_every_test_file_is_declared(manifest_dir: &str) {
    let dir = std::path::Path::new(manifest_dir).join("tests");
    let me = std::fs::read_to_string(dir.join("it.rs")).unwrap();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let (Some(stem), Some("rs")) = (
            p.file_stem().and_then(|s| s.to_str()),
            p.extension().and_then(|s| s.to_str()),
        ) else {
            continue;
        };
        if stem != "it" {
            assert!(
                me.contains(&format!("\nmod {stem};\n")),
                "tests/{stem}.rs is not declared in tests/it.rs"
            );
        }
    }
}
