//! `kiln install` knows what it installs and is all or nothing: the layer is checked against
//! `SHA256SUMS` (and its minisign signature with `--trusted-key`) before the root is touched;
//! a failure at any single change leaves the root exactly as it was; a root whose own
//! symlinks point out of it is still written only inside it.

use crate::bake_support;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bake_support::kiln;
use kiln::install::{install, InstallOptions, LayerTrust, Resolver};
use sha2::{Digest, Sha256};

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

enum N {
    Dir,
    File(&'static [u8], u32),
    Link(&'static str),
}

/// A kiln-shaped layer: the entries plus an install manifest that lists their files and links.
fn layer(dir: &Path, name: &str, entries: &[(&str, N)]) -> PathBuf {
    let mut manifest = String::from("# kiln install manifest v1: sha256  mode  path\n");
    let mut b = tar::Builder::new(Vec::new());
    for (p, n) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(0);
        match n {
            N::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                h.set_size(0);
                b.append_data(&mut h, p, &[][..]).unwrap();
            }
            N::File(data, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                b.append_data(&mut h, p, *data).unwrap();
                manifest.push_str(&format!("{}  {mode:04o}  /{p}\n", sha(data)));
            }
            N::Link(t) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                b.append_link(&mut h, p, t).unwrap();
                manifest.push_str(&format!("{}  link  /{p}\n", sha(t.as_bytes())));
            }
        }
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(manifest.len() as u64);
    b.append_data(&mut h, "usr/lib/kiln/install.manifest", manifest.as_bytes())
        .unwrap();
    let p = dir.join(name);
    std::fs::write(
        &p,
        zstd::encode_all(&b.into_inner().unwrap()[..], 3).unwrap(),
    )
    .unwrap();
    let mut sums = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("SHA256SUMS"))
        .unwrap();
    writeln!(sums, "{}  {name}", sha(&std::fs::read(&p).unwrap())).unwrap();
    p
}

/// Everything under `top`: path -> type, mode, content hash or link target.
fn listing(top: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![top.to_path_buf()];
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(top).unwrap().display().to_string();
        let what = if m.file_type().is_symlink() {
            format!("link {}", std::fs::read_link(&p).unwrap().display())
        } else if m.is_dir() {
            todo.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            format!("dir {:o}", m.mode() & 0o7777)
        } else {
            format!(
                "file {:o} {}",
                m.mode() & 0o7777,
                sha(&std::fs::read(&p).unwrap())
            )
        };
        out.insert(rel, what);
    }
    out
}

fn base_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    for d in ["usr/bin", "usr/lib", "etc"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
    std::fs::write(root.join("usr/bin/bash"), b"base").unwrap();
    root
}

fn old_layer(dir: &Path) -> PathBuf {
    layer(
        dir,
        "old.tar.zst",
        &[
            ("usr", N::Dir),
            ("usr/bin", N::Dir),
            ("usr/bin/kubelet", N::File(b"kubelet 1", 0o755)),
            ("usr/bin/crictl", N::File(b"crictl 1", 0o755)),
            ("usr/lib/kiln", N::Dir),
            ("etc/kiln-link", N::Link("/usr/bin/kubelet")),
        ],
    )
}

fn new_layer(dir: &Path) -> PathBuf {
    layer(
        dir,
        "new.tar.zst",
        &[
            ("usr", N::Dir),
            ("usr/bin", N::Dir),
            ("usr/bin/kubelet", N::File(b"kubelet 2", 0o755)),
            ("usr/bin/containerd", N::File(b"containerd 2", 0o755)),
            ("usr/lib/kiln", N::Dir),
            ("usr/lib/kiln/new/deep", N::Dir),
            ("usr/lib/kiln/new/deep/config", N::File(b"x = 1\n", 0o644)),
            ("etc/kiln-link", N::Link("/usr/bin/containerd")),
        ],
    )
}

fn opts() -> InstallOptions {
    InstallOptions::new(LayerTrust::Sums { sums: None })
}

#[test]
fn a_failure_at_any_change_leaves_the_root_as_it_was() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let root = base_root(dir);
    let old = old_layer(dir);
    let new = new_layer(dir);
    // An upgrade: directories made, files staged, replaced, added, one removed, the link and
    // the manifest replaced. Fail each change in turn, with both resolvers.
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let _ = std::fs::remove_dir_all(root.join("usr/lib/kiln/new"));
        install(&old, &root, &opts()).unwrap();
        let before = listing(dir);
        let mut n = 0;
        loop {
            let mut o = opts();
            o.resolver = Some(resolver);
            o.fail_at = Some(n);
            match install(&new, &root, &o) {
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains(&format!("injected failure at change {n}")),
                        "{msg}"
                    );
                    assert_eq!(
                        before,
                        listing(dir),
                        "{resolver:?}: failure at change {n} left the root changed"
                    );
                }
                Ok(_) => break,
            }
            n += 1;
        }
        assert!(n >= 10, "only {n} changes were tried");
        // The run that did not fail installed the whole upgrade.
        assert_eq!(
            std::fs::read(root.join("usr/bin/kubelet")).unwrap(),
            b"kubelet 2"
        );
        assert_eq!(
            std::fs::read(root.join("usr/lib/kiln/new/deep/config")).unwrap(),
            b"x = 1\n"
        );
        assert!(!root.join("usr/bin/crictl").exists());
    }
}

#[test]
fn the_layer_must_match_its_sha256sums() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let root = base_root(dir);
    let l = old_layer(dir);
    let before = listing(&root);
    let run = |args: &[&str]| {
        kiln()
            .arg("install")
            .arg(&l)
            .arg("--root")
            .arg(&root)
            .args(args)
            .output()
            .unwrap()
    };
    // Tampered: one byte of the layer changed after SHA256SUMS was written.
    let good = std::fs::read(&l).unwrap();
    let mut bad = good.clone();
    let last = bad.len() - 1;
    bad[last] ^= 1;
    std::fs::write(&l, &bad).unwrap();
    let o = run(&[]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(
        e.contains("but") && e.contains("lists old.tar.zst with sha256"),
        "{e}"
    );
    assert_eq!(before, listing(&root));
    // --allow-unverified does not excuse a checksum file that disagrees.
    assert_eq!(run(&["--allow-unverified"]).status.code(), Some(3));
    std::fs::write(&l, &good).unwrap();
    // No SHA256SUMS: refused, unless explicitly allowed (and then said loudly).
    std::fs::rename(dir.join("SHA256SUMS"), dir.join("sums.elsewhere")).unwrap();
    let o = run(&[]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(
        e.contains("is unverified") && e.contains("--allow-unverified"),
        "{e}"
    );
    assert_eq!(before, listing(&root));
    let sums = dir.join("sums.elsewhere");
    let o = run(&["--sums", sums.to_str().unwrap(), "--dry-run"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.starts_with("verified "), "{out}");
    let o = run(&["--allow-unverified"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{e}");
    assert!(e.contains("warning: UNVERIFIED"), "{e}");
}

#[test]
fn trusted_key_requires_a_valid_signature_and_names_the_key() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let root = base_root(dir);
    let l = old_layer(dir);
    let kp = minisign::KeyPair::generate_encrypted_keypair(Some(String::new())).unwrap();
    let other = minisign::KeyPair::generate_encrypted_keypair(Some(String::new())).unwrap();
    let pk = dir.join("ci.pub");
    std::fs::write(&pk, kp.pk.to_box().unwrap().to_string()).unwrap();
    let sign = |k: &minisign::KeyPair| {
        let skp = dir.join("k.key");
        std::fs::write(&skp, k.sk.to_box(None).unwrap().to_string()).unwrap();
        let sums = std::fs::read(dir.join("SHA256SUMS")).unwrap();
        let sig = kiln::supply::sign::sign(&sums, &skp, None, "file:SHA256SUMS").unwrap();
        std::fs::write(dir.join("SHA256SUMS.minisig"), sig).unwrap();
    };
    let run = || {
        kiln()
            .arg("install")
            .arg(&l)
            .arg("--root")
            .arg(&root)
            .arg("--trusted-key")
            .arg(&pk)
            .arg("--dry-run")
            .output()
            .unwrap()
    };
    let id = kiln::supply::sign::TrustedKey::from_file(&pk)
        .unwrap()
        .id()
        .to_string();
    // No signature.
    let o = run();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(e.contains("SHA256SUMS.minisig does not exist"), "{e}");
    assert!(e.contains(&format!("trusting minisign key {id}")), "{e}");
    // Issue 38: the hint is the checksum file's, not the lock's (`kiln lock sign` fails on a
    // SHA256SUMS; --allow-unsigned is no flag of install).
    assert!(
        e.contains("minisign -Sm") && e.contains("without --trusted-key"),
        "{e}"
    );
    assert!(
        !e.contains("kiln lock sign") && !e.contains("--allow-unsigned"),
        "{e}"
    );
    // Signed by another key.
    sign(&other);
    let o = run();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(e.contains("was made by key") && e.contains(&id), "{e}");
    // Signed by the trusted key.
    sign(&kp);
    let o = run();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        out.contains(&format!("verifies with trusted key {id}")),
        "{out}"
    );
    // SHA256SUMS changed after signing.
    let mut sums = std::fs::OpenOptions::new()
        .append(true)
        .open(dir.join("SHA256SUMS"))
        .unwrap();
    writeln!(sums, "{}  extra.tar.zst", "0".repeat(64)).unwrap();
    let o = run();
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(e.contains("does not match its signature"), "{e}");
}

#[test]
fn root_symlinks_that_point_out_are_followed_inside_the_root_only() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let root = base_root(dir);
    let outside = dir.join("outside");
    std::fs::create_dir_all(outside.join("etc")).unwrap();
    std::fs::write(outside.join("etc/canary"), b"host").unwrap();
    // The base image's own links: to the host's absolute path of `outside`, and climbing up.
    std::os::unix::fs::symlink(&outside, root.join("usr/host")).unwrap();
    std::os::unix::fs::symlink("../../../../../../..", root.join("usr/up")).unwrap();
    std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o755)).unwrap();
    let l = layer(
        dir,
        "through.tar.zst",
        &[("usr/up/etc/from-layer", N::File(b"in the root", 0o644))],
    );
    let outside_before = listing(&outside);
    for resolver in [Resolver::Openat2, Resolver::Walk] {
        let mut o = opts();
        o.resolver = Some(resolver);
        install(&l, &root, &o).unwrap();
        // `usr/up` climbs to the root itself, never above it.
        assert_eq!(
            std::fs::read(root.join("etc/from-layer")).unwrap(),
            b"in the root"
        );
        std::fs::remove_file(root.join("etc/from-layer")).unwrap();
        std::fs::remove_file(root.join("usr/lib/kiln/install.manifest")).unwrap();
        std::fs::remove_dir(root.join("usr/lib/kiln")).unwrap();
    }
    // An absolute link to a host directory resolves to <root>/<that path>, which does not
    // exist: refused, and the host directory untouched.
    let l = layer(
        dir,
        "host.tar.zst",
        &[("usr/host/etc/pwned", N::File(b"evil", 0o644))],
    );
    let before = listing(dir);
    let err = install(&l, &root, &opts()).unwrap_err().to_string();
    assert!(
        err.contains("usr/host") && err.contains("leads nowhere inside the root"),
        "{err}"
    );
    assert_eq!(before, listing(dir));
    assert_eq!(outside_before, listing(&outside));
}

#[test]
fn setuid_files_need_the_allow_list() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let root = base_root(dir);
    let l = layer(
        dir,
        "setuid.tar.zst",
        &[
            ("usr", N::Dir),
            ("usr/bin", N::Dir),
            ("usr/bin/newuidmap", N::File(b"helper", 0o4755)),
        ],
    );
    let run = |extra: &[&str]| {
        kiln()
            .arg("install")
            .arg(&l)
            .arg("--root")
            .arg(&root)
            .args(extra)
            .output()
            .unwrap()
    };
    let before = listing(dir);
    let o = run(&[]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(
        e.contains("\"usr/bin/newuidmap\"") && e.contains("setuid/setgid file (mode 4755)"),
        "{e}"
    );
    // Another path on the list does not help.
    assert_eq!(
        run(&["--allow-setid", "/usr/bin/other"]).status.code(),
        Some(3)
    );
    assert_eq!(before, listing(dir));
    let o = run(&["--allow-setid", "/usr/bin/newuidmap"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mode = std::fs::metadata(root.join("usr/bin/newuidmap"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o4755);
}
