//! The shared fixture mirror (`scripts/fixture-mirror.sh`) and the shipped image definitions
//! adapted to it, for the tests that bake from it.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{kube_version, ok, repo};

/// Builds the fixture mirror into `out` (a signed lock, its key and a mirror).
pub fn build_fixture(out: &Path) {
    let root = repo();
    let kubelet = root.join("target/release/kubelet");
    let kubelet = if kubelet.is_file() {
        kubelet
    } else {
        PathBuf::from("/bin/true")
    };
    let o = Command::new(root.join("scripts/fixture-mirror.sh"))
        .arg(out)
        .env("KILN_BIN", env!("CARGO_BIN_EXE_kiln"))
        .env("KUBELET_BIN", kubelet)
        .output()
        .unwrap();
    ok(&o, "scripts/fixture-mirror.sh");
}

/// The stand-in kubelet's version in the fixture lock (scripts/fixture-mirror.sh derives it
/// the same way from the images' `kubernetes.version`).
pub fn standin() -> String {
    format!("{}-standin", kube_version().trim_start_matches('v'))
}

/// A copy of `images/<name>` adapted to the fixture lock.
pub fn adapt(name: &str, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("images").join(name)).unwrap();
    let text = text
        .replace(
            &format!("version = \"{}\"", kube_version()),
            &format!("version = \"{}\"", standin()),
        )
        // The pinned AWS table stays where the definition names it.
        .replace(
            "aws_table = \"data/",
            &format!("aws_table = \"{}/data/", repo().join("images").display()),
        );
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}
