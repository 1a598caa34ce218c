//! Gate: kiln-firstboot is std-only. This test fails as soon as firstboot/Cargo.toml gains a
//! dependency of any kind (normal, build, dev or target-specific), so nobody adds one by accident.

use std::path::Path;

/// Section headers that declare dependencies.
fn is_dependency_table(header: &str) -> bool {
    let h = header.trim_matches(|c| c == '[' || c == ']').trim();
    h == "dependencies"
        || h == "build-dependencies"
        || h == "dev-dependencies"
        || h.starts_with("dependencies.")
        || h.starts_with("build-dependencies.")
        || h.starts_with("dev-dependencies.")
        || (h.starts_with("target.") && h.contains("dependencies"))
}

/// Returns every dependency line found in a Cargo manifest.
fn dependency_lines(manifest: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines() {
        let t = line.trim();
        if t.starts_with('[') {
            in_deps = is_dependency_table(t);
            // `[dependencies.foo]` is itself a dependency.
            if in_deps
                && t.trim_matches(|c| c == '[' || c == ']')
                    .contains("dependencies.")
            {
                found.push(t.to_string());
            }
            continue;
        }
        if in_deps && !t.is_empty() && !t.starts_with('#') {
            found.push(t.to_string());
        }
    }
    found
}

#[test]
fn firstboot_manifest_has_no_dependencies() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let manifest = std::fs::read_to_string(&path).expect("read firstboot/Cargo.toml");
    let deps = dependency_lines(&manifest);
    assert!(
        deps.is_empty(),
        "{} declares dependencies, but kiln-firstboot must stay std-only: {deps:?}",
        path.display()
    );
}

// Runs the host's cargo, which a Windows test binary under Wine cannot start; the Linux run
// of this same test covers the one Cargo.toml both builds share.
#[cfg(not(windows))]
#[test]
fn cargo_metadata_agrees() {
    // Ask cargo itself, so a dependency added by any syntax is caught.
    let out = std::process::Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = String::from_utf8(out.stdout).expect("utf-8");
    let start = json
        .find("\"name\":\"kiln-firstboot\"")
        .expect("kiln-firstboot in cargo metadata");
    let deps_at = start
        + json[start..]
            .find("\"dependencies\":")
            .expect("dependencies field");
    let rest = &json[deps_at + "\"dependencies\":".len()..];
    assert!(
        rest.starts_with("[]"),
        "cargo metadata lists dependencies for kiln-firstboot: {}",
        &rest[..rest.len().min(200)]
    );
}

#[test]
fn the_gate_catches_dependencies() {
    // The parser above must actually see the forms people write.
    let cases = [
        ("[dependencies]\nserde = \"1\"\n", 1),
        ("[dev-dependencies]\nproptest = \"1\"\n", 1),
        ("[build-dependencies]\ncc = \"1\"\n", 1),
        ("[target.'cfg(unix)'.dependencies]\nlibc = \"0.2\"\n", 1),
        ("[dependencies.libc]\nversion = \"0.2\"\n", 2),
        (
            "[dependencies]\n# nothing\n\n[lints]\nworkspace = true\n",
            0,
        ),
    ];
    for (manifest, n) in cases {
        assert_eq!(dependency_lines(manifest).len(), n, "{manifest}");
    }
}
