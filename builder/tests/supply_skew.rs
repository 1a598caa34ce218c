//! The version-skew rule (`supply::skew`, docs/lock-format.md#version-skew) as `kiln plan` and
//! `kiln bake` apply it to a signed lock: kubelet 1.37 with containerd 1.x is refused (exit 3)
//! before any blob is fetched or read; kubelet 1.36 with containerd 1.x is a warning.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::support::{kiln, test_keypair, write_signed_lock};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The committed lock with its Linux kubelet at `kubelet` and its Linux containerd at
/// `containerd`, signed with a key made now; returns (lock, public key).
fn skewed_lock(dir: &Path, kubelet: &str, containerd: &str) -> (PathBuf, PathBuf) {
    let text = std::fs::read_to_string(repo().join("images/artifacts.lock")).unwrap();
    let mut out = String::new();
    let mut name = String::new();
    // Entries are `[[artifact]]` tables whose name/version/os lines come in that order.
    let mut pending_version: Option<String> = None;
    for line in text.split_inclusive('\n') {
        if line.starts_with("[[") {
            if let Some(v) = pending_version.take() {
                out.push_str(&v);
            }
            name.clear();
        }
        if let Some(n) = line.strip_prefix("name = ") {
            name = n.trim().trim_matches('"').to_string();
        }
        if line.starts_with("version = ") && (name == "kubelet" || name == "containerd") {
            pending_version = Some(line.to_string());
            continue;
        }
        if line.starts_with("os = ") {
            let linux = line.contains("\"linux\"");
            if let Some(v) = pending_version.take() {
                let pinned = match (linux, name.as_str()) {
                    (true, "kubelet") => format!("version = \"{kubelet}\"\n"),
                    (true, "containerd") => format!("version = \"{containerd}\"\n"),
                    _ => v,
                };
                out.push_str(&pinned);
            }
        }
        out.push_str(line);
    }
    assert!(
        out.contains(&format!("version = \"{containerd}\"")),
        "{out}"
    );
    let (pk, sk) = test_keypair(dir, "skew");
    (write_signed_lock(dir, &out, &sk), pk)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn kubelet_1_37_with_containerd_1_is_refused_by_plan_and_bake_before_any_blob() {
    let d = tempfile::tempdir().unwrap();
    let (lock, pk) = skewed_lock(d.path(), "v1.37.0", "1.7.28");
    let store = d.path().join("store");
    let o = kiln()
        .current_dir(repo())
        .arg("plan")
        .arg("images/ubuntu.toml")
        .arg("--lock")
        .arg(&lock)
        .arg("--trusted-key")
        .arg(&pk)
        .arg("--store")
        .arg(&store)
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}{err}");
    assert!(out.contains("rootfs amd64: REFUSED"), "{out}");
    assert!(
        err.contains(&format!(
            "{}: kubelet v1.37.0 and containerd 1.7.28 for linux/",
            lock.display()
        )) && err.contains("need containerd 2.0 or later"),
        "{err}"
    );
    // The Windows definition pins containerd 2.x there: nothing to refuse.
    let o = kiln()
        .current_dir(repo())
        .args(["plan", "images/windows.toml", "--lock"])
        .arg(&lock)
        .arg("--trusted-key")
        .arg(&pk)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));

    // bake: refused with the same words, before the empty store is read for a blob and
    // before --fetch dials its (unreachable) mirror.
    let o = kiln()
        .current_dir(repo())
        .args([
            "bake",
            "images/ubuntu.toml",
            "--format",
            "rootfs",
            "--arch",
            "amd64",
        ])
        .arg("--lock")
        .arg(&lock)
        .arg("--trusted-key")
        .arg(&pk)
        .arg("--store")
        .arg(&store)
        .arg("--out")
        .arg(d.path().join("out"))
        .args(["--fetch", "--mirror", "http://127.0.0.1:9/"])
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}{err}");
    assert!(
        err.contains("image ubuntu: ") && err.contains("kubelet v1.37.0 and containerd 1.7.28"),
        "{err}"
    );
    assert!(
        !err.contains("127.0.0.1:9") && !err.contains("blob "),
        "{err}"
    );
}

#[test]
fn kubelet_1_36_with_containerd_1_is_a_warning_in_plan_and_bake() {
    let d = tempfile::tempdir().unwrap();
    let (lock, pk) = skewed_lock(d.path(), "v1.36.4", "1.7.28");
    let o = kiln()
        .current_dir(repo())
        .args([
            "plan",
            "images/ubuntu.toml",
            "--arch",
            "amd64",
            "--format",
            "rootfs",
        ])
        .arg("--lock")
        .arg(&lock)
        .arg("--trusted-key")
        .arg(&pk)
        .arg("--store")
        .arg(d.path().join("store"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        out.contains("  warning: kubelet v1.36.4 runs containerd 1.7.28 on its fallback"),
        "{out}"
    );
    // bake warns, then stops where it would anyway: the empty store has no blob.
    let o = kiln()
        .current_dir(repo())
        .args([
            "bake",
            "images/ubuntu.toml",
            "--format",
            "rootfs",
            "--arch",
            "amd64",
        ])
        .arg("--lock")
        .arg(&lock)
        .arg("--trusted-key")
        .arg(&pk)
        .arg("--store")
        .arg(d.path().join("store"))
        .arg("--out")
        .arg(d.path().join("out"))
        .output()
        .unwrap();
    let (out, err) = text(&o);
    assert_ne!(o.status.code(), Some(0), "{out}{err}");
    assert!(
        err.contains(&format!(
            "kiln: warning: {}: kubelet v1.36.4 runs containerd 1.7.28",
            lock.display()
        )),
        "{err}"
    );
}
