//! The first bake (issue 38, docs/first-bake.md): each wall a newcomer hit on the way from a
//! fresh clone to a layer is now one clear error naming the next step, or gone. The path
//! itself runs as the page's example (docs_examples); these tests hold each wall's message,
//! with the fixture mirror (`KILN_FIXTURE_MIRROR`, else one built here) and kiln's release lock.

use crate::bake_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::support::out_text as text;
use bake_support::fixture_mirror::{build_fixture, read_only_fixture, standin};
use bake_support::{kiln, repo};

/// Wall 1: the release lock fetched from a mirror made from another lock (the fixture's) gave
/// one "No such file" per artifact, each printed twice; now one error names the mirror's own
/// lock, and nothing is fetched.
#[test]
fn fetching_the_release_lock_from_the_fixture_mirror_names_the_mirrors_own_lock() {
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let cache = d.path().join("cache");
    let o = kiln()
        .arg("fetch")
        .arg(repo().join("images/artifacts.lock"))
        .arg("--mirror")
        .arg(fx.join("mirror"))
        .env("KILN_CACHE", &cache)
        .env_remove("KILN_TRUSTED_KEY")
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(4), "{t}");
    let own = fx.join("mirror/artifacts.lock");
    assert!(
        t.contains("holds none of the")
            && t.contains(&format!("--lock {}", own.display()))
            && t.contains("--upstream"),
        "{t}"
    );
    assert!(
        !t.contains("No such file") && t.lines().filter(|l| l.starts_with("kiln:")).count() == 1,
        "one message, not one per artifact:\n{t}"
    );
    let blobs = cache.join("blobs/sha256");
    assert!(
        !blobs.is_dir() || std::fs::read_dir(&blobs).unwrap().next().is_none(),
        "nothing fetched"
    );
}

/// A mirror directory holding some of what is wanted fetches those, and each missing one is
/// named once, in the final error, as "not in this mirror".
#[test]
fn a_mirror_missing_some_blobs_names_each_once() {
    let d = tempfile::tempdir().unwrap();
    let fx = d.path().join("fx");
    build_fixture(&fx);
    let blobs = fx.join("mirror/blobs/sha256");
    let lock = std::fs::read_to_string(fx.join("artifacts.lock")).unwrap();
    let runc = lock
        .split("[[artifact]]")
        .find(|e| e.contains("name = \"runc\"") && e.contains("arch = \"amd64\""))
        .and_then(|e| e.lines().find_map(|l| l.strip_prefix("sha256 = \"")))
        .map(|h| h.trim_end_matches('"').to_string())
        .unwrap();
    std::fs::remove_file(blobs.join(&runc)).unwrap();
    let o = kiln()
        .arg("fetch")
        .arg(fx.join("artifacts.lock"))
        .arg("--mirror")
        .arg(fx.join("mirror"))
        .args(["--name", "runc", "--name", "containerd"])
        .arg("--trusted-key")
        .arg(fx.join("keys/fixture.pub"))
        .env("KILN_CACHE", d.path().join("cache"))
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(4), "{t}");
    assert_eq!(t.matches(&runc).count(), 1, "named once:\n{t}");
    assert!(t.contains("not in this mirror"), "{t}");
    assert!(!t.contains("os error 2"), "{t}");
}

/// Wall 2: the fixture lock checked with kiln's release key names where the signer's public
/// key is, for the reader to decide; kiln does not trust it by itself.
#[test]
fn a_lock_signed_by_another_key_names_the_public_key_beside_it() {
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let o = kiln()
        .args(["lock", "verify"])
        .arg(fx.join("mirror/artifacts.lock"))
        .env_remove("KILN_TRUSTED_KEY")
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(
        t.contains(&format!("is in {}", fx.join("keys/fixture.pub").display())),
        "{t}"
    );
}

/// Wall 3: a definition for v1.36.4 and a lock with kubelet v1.36.4-standin. `plan` said
/// "ready to bake" and `bake` then refused; now both refuse alike (exit 3), naming the flag
/// that bakes the lock's version, and with it the plan is ready and the bake names the layer
/// by that version.
#[test]
fn plan_and_bake_refuse_a_kubelet_version_alike_and_the_flag_bakes_it() {
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let image = repo().join("images/ubuntu.toml");
    let run = |cmd: &str, extra: &[&str]| {
        let mut c = kiln();
        c.arg(cmd)
            .arg(&image)
            .args(["--arch", "amd64", "--lock"])
            .arg(fx.join("artifacts.lock"))
            .arg("--trusted-key")
            .arg(fx.join("keys/fixture.pub"))
            .arg("--store")
            .arg(fx.join("mirror"))
            .args(extra);
        c.output().unwrap()
    };
    let v = standin();
    let out = d.path().join("out");
    let out_s = out.to_str().unwrap();
    for (cmd, extra) in [("plan", vec![]), ("bake", vec!["--out", out_s])] {
        let o = run(cmd, &extra);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(3), "{cmd}: {t}");
        assert!(
            t.contains(&format!("--kubernetes-version {v}")),
            "{cmd}: {t}"
        );
        assert!(!t.contains(": ready to bake"), "{cmd}: {t}");
    }
    assert!(!out.exists(), "a refused bake writes nothing");
    let o = run("plan", &["--kubernetes-version", &v]);
    assert!(
        o.status.success() && text(&o).contains("rootfs amd64: ready to bake"),
        "{}",
        text(&o)
    );
    let o = run("bake", &["--out", out_s, "--kubernetes-version", &v]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(out.join(format!("ubuntu-{v}-amd64.tar.zst")).is_file());
    // A version is part of file names: nothing that leaves the output directory.
    for bad in ["../../x", "v1/2", "-v1", "v1..2", ""] {
        let o = run("plan", &[&format!("--kubernetes-version={bad}")]);
        let t = text(&o);
        assert!(
            o.status.code() == Some(1) && t.contains("--kubernetes-version"),
            "{bad:?}: {t}"
        );
    }
}

/// kiln, linked into `prefix/bin/kiln` (a hard link, so `current_exe` is that path).
fn kiln_at(prefix: &Path) -> PathBuf {
    let bin = prefix.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let k = bin.join("kiln");
    if std::fs::hard_link(env!("CARGO_BIN_EXE_kiln"), &k).is_err() {
        std::fs::copy(env!("CARGO_BIN_EXE_kiln"), &k).unwrap();
    }
    k
}

/// Wall 4: `--firstboot` defaulted to `target/firstboot/…` under the current directory, and
/// outside the repository the bake failed with a bare "No such file or directory". Now kiln
/// looks beside itself (a release archive's `lib/kiln/<os>-<arch>/`, a repository build's
/// `target/firstboot/`) and, finding none, names every place and the command that builds it;
/// `plan` says the same and is not "ready".
#[test]
fn kiln_firstboot_is_found_beside_kiln_or_every_place_looked_is_named() {
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let prefix = d.path().join("prefix");
    let k = kiln_at(&prefix);
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let v = standin();
    let run = |cmd: &str, out: &str| {
        let mut c = Command::new(&k);
        c.current_dir(&elsewhere)
            .arg(cmd)
            .arg(repo().join("images/ubuntu.toml"))
            .args(["--arch", "amd64", "--kubernetes-version", &v, "--lock"])
            .arg(fx.join("artifacts.lock"))
            .arg("--trusted-key")
            .arg(fx.join("keys/fixture.pub"))
            .arg("--store")
            .arg(fx.join("mirror"));
        if cmd == "bake" {
            c.args(["--out", out, "--no-cache"]);
        }
        c.output().unwrap()
    };
    let installed = prefix.join("lib/kiln/linux-amd64/kiln-firstboot");
    let o = run("bake", "out1");
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "{t}");
    assert!(
        t.contains("no kiln-firstboot for linux/amd64")
            && t.contains(&installed.display().to_string())
            && t.contains(
                &prefix
                    .join("firstboot/kiln-firstboot")
                    .display()
                    .to_string()
            )
            && t.contains("target/firstboot/kiln-firstboot")
            && t.contains("make firstboot-amd64")
            && t.contains("--firstboot FILE"),
        "{t}"
    );
    assert!(!elsewhere.join("out1").exists(), "nothing written");
    let o = run("plan", "");
    let t = text(&o);
    assert!(
        o.status.success() && !t.contains(": ready to bake") && t.contains("no kiln-firstboot"),
        "{t}"
    );
    // A release archive's layout: the bake ships the kiln-firstboot beside kiln.
    std::fs::create_dir_all(installed.parent().unwrap()).unwrap();
    let elf = repo().join("target/firstboot/kiln-firstboot");
    let elf = if elf.is_file() {
        elf
    } else {
        PathBuf::from("/bin/true")
    };
    std::fs::copy(&elf, &installed).unwrap();
    let o = run("bake", "out2");
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains(&format!("shipping kiln-firstboot {}", installed.display())),
        "{t}"
    );
}

/// `plan` runs the bake's inspection gate on the kiln-firstboot it found: one for another
/// architecture is not "ready to bake" (bake refuses it, exit 3), and the plan says why.
#[test]
fn plan_is_not_ready_with_a_kiln_firstboot_for_another_architecture() {
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let o = kiln()
        .arg("plan")
        .arg(repo().join("images/flatcar.toml"))
        .args([
            "--arch",
            "arm64",
            "--kubernetes-version",
            &standin(),
            "--lock",
        ])
        .arg(fx.join("artifacts.lock"))
        .arg("--trusted-key")
        .arg(fx.join("keys/fixture.pub"))
        .arg("--store")
        .arg(fx.join("mirror"))
        .arg("--firstboot")
        .arg("/bin/true")
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        !t.contains(": ready to bake") && t.contains("expected a linux/arm64 binary"),
        "{t}"
    );
}

/// A kiln unpacked from a release archive, run where there is no `images/artifacts.lock`,
/// reads the release lock installed beside it (verified with the embedded key as always).
#[test]
fn the_release_lock_installed_beside_kiln_is_the_default_outside_a_checkout() {
    let d = tempfile::tempdir().unwrap();
    let prefix = d.path().join("prefix");
    let k = kiln_at(&prefix);
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir_all(&elsewhere).unwrap();
    let verify = || {
        Command::new(&k)
            .current_dir(&elsewhere)
            .args(["lock", "verify"])
            .env_remove("KILN_TRUSTED_KEY")
            .output()
            .unwrap()
    };
    let o = verify();
    assert!(!o.status.success(), "no lock anywhere: {}", text(&o));
    let share = prefix.join("share/kiln/images");
    std::fs::create_dir_all(&share).unwrap();
    for f in ["artifacts.lock", "artifacts.lock.minisig"] {
        std::fs::copy(repo().join("images").join(f), share.join(f)).unwrap();
    }
    let o = verify();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains(&format!(
            "using the lock {}",
            share.join("artifacts.lock").display()
        )),
        "{t}"
    );
    // A tampered installed lock is refused like any other.
    let lock = share.join("artifacts.lock");
    let mut bytes = std::fs::read(&lock).unwrap();
    bytes.extend_from_slice(b"\n# changed\n");
    std::fs::write(&lock, bytes).unwrap();
    assert_eq!(verify().status.code(), Some(3));
}

/// `kiln install --root` into a root that does not exist says so, and creates nothing.
#[test]
fn install_into_a_missing_root_says_it_creates_none() {
    let d = tempfile::tempdir().unwrap();
    let layer = d.path().join("x.tar.zst");
    std::fs::write(&layer, b"not a layer").unwrap();
    let root = d.path().join("no-such-root");
    let o = kiln()
        .args(["install", "--allow-unverified"])
        .arg(&layer)
        .arg("--root")
        .arg(&root)
        .output()
        .unwrap();
    let t = text(&o);
    assert!(!o.status.success() && t.contains("does not exist"), "{t}");
    assert!(!root.exists());
}
