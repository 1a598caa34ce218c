//! The shared fixture mirror (`scripts/fixture-mirror.sh`) and the shipped image definitions
//! adapted to it, for the tests that bake from it.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{kube_version, ok, repo};

/// Names a fixture mirror already built by `qemu-tests/assets/fixture.sh DIR` (`make test`
/// builds `target/fixture-mirror` once, before the test suites, and sets this): the tests then
/// copy it instead of each building its own (docs/building.md, "What make test costs").
pub const SHARED_FIXTURE: &str = "KILN_FIXTURE_MIRROR";

/// What a test takes from a fixture mirror: the signed lock, its signature, the key pair and
/// the mirror. (`upstream/` is only the loopback server's input.)
const PARTS: [&str; 4] = ["artifacts.lock", "artifacts.lock.minisig", "keys", "mirror"];

/// Makes the fixture mirror in `out` (a signed lock, its key and a mirror): a copy of the one
/// [`SHARED_FIXTURE`] names when it is set, so a test may change its copy; otherwise built
/// here by `scripts/fixture-mirror.sh`, as `cargo nextest run` alone does.
pub fn build_fixture(out: &Path) {
    if let Some(shared) = std::env::var_os(SHARED_FIXTURE).filter(|v| !v.is_empty()) {
        copy_fixture(Path::new(&shared), out);
        return;
    }
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

/// The fixture mirror for a test that only reads it: the shared one when `make test` made it
/// ([`SHARED_FIXTURE`]), else one built into `scratch/fx`.
pub fn read_only_fixture(scratch: &Path) -> PathBuf {
    match std::env::var_os(SHARED_FIXTURE).filter(|v| !v.is_empty()) {
        Some(shared) => PathBuf::from(shared),
        None => {
            let fx = scratch.join("fx");
            build_fixture(&fx);
            fx
        }
    }
}

/// `--trusted-key` and `--store` naming the fixture mirror `fx` (its throwaway key, its
/// blobs), for `kiln plan`, `bake` and `verify`; the caller names the lock.
pub fn fixture_flags<'a>(c: &'a mut Command, fx: &Path) -> &'a mut Command {
    c.arg("--trusted-key")
        .arg(fx.join("keys/fixture.pub"))
        .arg("--store")
        .arg(fx.join("mirror"))
}

/// `kiln bake images/<image>.toml` for `arch` from the fixture mirror `fx` into `out`, for the
/// lock's Kubernetes version, with `extra` flags; its output.
pub fn bake_from_fixture(
    fx: &Path,
    image: &str,
    arch: &str,
    out: &Path,
    extra: &[&dyn AsRef<std::ffi::OsStr>],
) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kiln"));
    c.arg("bake")
        .arg(repo().join(format!("images/{image}.toml")))
        .args(["--arch", arch, "--kubernetes-version", &standin(), "--lock"])
        .arg(fx.join("artifacts.lock"))
        .arg("--out")
        .arg(out);
    for e in extra {
        c.arg(e);
    }
    fixture_flags(&mut c, fx).output().unwrap()
}

/// Copies the parts of the fixture mirror in `shared` that tests use into `out`.
pub fn copy_fixture(shared: &Path, out: &Path) {
    for part in PARTS {
        let from = shared.join(part);
        assert!(
            from.exists(),
            "{SHARED_FIXTURE}={}: no {part} there; expected a fixture mirror made by \
             qemu-tests/assets/fixture.sh DIR (make test makes target/fixture-mirror), \
             or unset {SHARED_FIXTURE} to build one per test",
            shared.display()
        );
        copy_tree(&from, &out.join(part));
    }
}

/// A recursive copy of regular files and directories, with their permissions; anything else
/// (a symlink, a device) fails the test, naming it.
fn copy_tree(from: &Path, to: &Path) {
    let meta = std::fs::symlink_metadata(from).unwrap();
    if meta.is_dir() {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            copy_tree(&e.path(), &to.join(e.file_name()));
        }
    } else if meta.is_file() {
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
    } else {
        panic!(
            "{}: expected a file or directory in the shared fixture mirror, found {:?}",
            from.display(),
            meta.file_type()
        );
    }
}

/// The stand-in kubelet's version in the fixture lock (scripts/fixture-mirror.sh derives it
/// the same way from the images' `kubernetes.version`: `v1.36.4` gives `v1.36.4-standin`).
pub fn standin() -> String {
    format!("v{}-standin", kube_version().trim_start_matches('v'))
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
