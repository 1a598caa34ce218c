//! `kiln install --root`: applies a baked rootfs layer to a root, idempotently, never touching
//! files it does not own; refuses hostile layer archives; leaves units that
//! `systemd-analyze verify` accepts.

use crate::bake_support;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bake_support::*;

fn install(layer: &Path, root: &Path) -> Output {
    kiln()
        .arg("install")
        .arg(layer)
        .arg("--root")
        .arg(root)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}
fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A Debian-shaped root: merged /usr (`lib -> usr/lib`, `bin -> usr/bin`), an /etc.
fn debian_root(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    for d in [
        "usr/bin",
        "usr/lib/systemd/system",
        "usr/sbin",
        "etc/systemd/system",
        "var",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
    std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
    std::os::unix::fs::symlink("usr/sbin", root.join("sbin")).unwrap();
    std::fs::write(root.join("usr/bin/bash"), b"not kiln's").unwrap();
    root
}

fn bake_rootfs(fx: &Fixture, image: &Path, out: &Path) -> PathBuf {
    ok(
        &bake_cli(fx, image, "rootfs", "amd64", out, &[]),
        "bake rootfs",
    );
    out.join(format!("ubuntu-{}-amd64.tar.zst", kube_version()))
}

fn tree(root: &Path) -> Vec<(String, String)> {
    let out = Command::new("find")
        .arg(".")
        .args(["-printf", "%y %m %s %l %p\n"])
        .current_dir(root)
        .output()
        .unwrap();
    let mut v: Vec<(String, String)> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let p = l.rsplit(' ').next().unwrap().to_string();
            let content = std::fs::read(root.join(&p))
                .map(|b| {
                    hex::encode(sha2::Digest::finalize(
                        <sha2::Sha256 as sha2::Digest>::new_with_prefix(b),
                    ))
                })
                .unwrap_or_default();
            (p, format!("{l} {content}"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn installs_idempotently_and_records_ownership() {
    let fx = fixture(Bins::Real);
    let d = fx.dir.path();
    let layer = bake_rootfs(&fx, &repo().join("images/ubuntu.toml"), &d.join("out"));
    let root = debian_root(d);
    let first = install(&layer, &root);
    ok(&first, "first install");
    let kubelet = root.join("usr/bin/kubelet");
    assert_eq!(
        std::fs::metadata(&kubelet).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    let want = &fx
        .arts
        .iter()
        .find(|a| a.name == "kubelet" && a.os == "linux" && a.arch == "amd64")
        .unwrap()
        .bytes;
    assert_eq!(&std::fs::read(&kubelet).unwrap(), want);
    let link = root.join("etc/systemd/system/multi-user.target.wants/kiln-firstboot.service");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("/usr/lib/systemd/system/kiln-firstboot.service")
    );
    assert!(!root
        .join("etc/systemd/system/multi-user.target.wants/kubelet.service")
        .exists());
    // The manifest lists every file with its real hash.
    let manifest = std::fs::read_to_string(root.join("usr/lib/kiln/install.manifest")).unwrap();
    let n = manifest.lines().filter(|l| !l.starts_with('#')).count();
    assert!(n > 20, "{manifest}");
    for line in manifest.lines().filter(|l| !l.starts_with('#')) {
        let parts: Vec<&str> = line.splitn(3, "  ").collect();
        if parts[1] == "link" {
            continue;
        }
        let p = root.join(parts[2].trim_start_matches('/'));
        assert_eq!(sha256_file(&p), parts[0], "{line}");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(format!("{mode:04o}"), parts[1], "{line}");
    }
    // The root's own files are untouched.
    assert_eq!(
        std::fs::read(root.join("usr/bin/bash")).unwrap(),
        b"not kiln's"
    );
    assert!(root
        .join("lib")
        .symlink_metadata()
        .unwrap()
        .file_type()
        .is_symlink());

    // Second run: nothing to do, nothing changes.
    let before = tree(&root);
    let second = install(&layer, &root);
    ok(&second, "second install");
    // First what was verified, then the counts.
    let out2 = stdout(&second);
    let lines: Vec<&str> = out2.lines().collect();
    assert!(
        lines.len() >= 2
            && lines[0].starts_with(&format!("verified {}: sha256 ", layer.display()))
            && lines[0].contains(" is listed as ")
            && lines[1].starts_with("wrote 0, unchanged "),
        "{out2}"
    );
    assert_eq!(before, tree(&root));

    // A file kiln owns, modified by hand, is not overwritten.
    std::fs::write(root.join("usr/lib/kiln/max-pods.map"), b"m5.large 1\n").unwrap();
    let third = install(&layer, &root);
    assert!(!third.status.success());
    let e = stderr(&third);
    assert!(
        e.contains("usr/lib/kiln/max-pods.map") && e.contains("modified since kiln installed it"),
        "{e}"
    );
}

#[test]
fn refuses_files_it_does_not_own_and_writes_nothing() {
    let fx = fixture(Bins::Real);
    let d = fx.dir.path();
    let layer = bake_rootfs(&fx, &repo().join("images/ubuntu.toml"), &d.join("out"));
    let root = debian_root(d);
    // A distro containerd already sits where the layer wants its own.
    std::fs::write(root.join("usr/bin/containerd"), b"debian's containerd").unwrap();
    let before = tree(&root);
    let r = install(&layer, &root);
    assert!(!r.status.success());
    let e = stderr(&r);
    assert!(
        e.contains("usr/bin/containerd") && e.contains("was not installed by kiln"),
        "{e}"
    );
    assert_eq!(
        before,
        tree(&root),
        "a refused install must not write anything"
    );
    // --dry-run reports the same plan without writing.
    let fresh = debian_root(&d.join("fresh"));
    let before = tree(&fresh);
    let dry = kiln()
        .arg("install")
        .arg(&layer)
        .arg("--root")
        .arg(&fresh)
        .arg("--dry-run")
        .output()
        .unwrap();
    ok(&dry, "dry run");
    assert!(
        stdout(&dry).contains("would write /usr/bin/kubelet"),
        "{}",
        stdout(&dry)
    );
    assert_eq!(before, tree(&fresh));
}

#[test]
fn upgrade_removes_what_the_new_layer_dropped_and_diff_explains_it() {
    let fx = fixture(Bins::Real);
    let d = fx.dir.path();
    // Both definitions beside a copy of the AWS table they pin, each with a max-pods.map entry.
    let shipped = std::fs::read_to_string(repo().join("images/ubuntu.toml")).unwrap();
    let def_in = |dir: &str, text: String| {
        std::fs::create_dir_all(d.join(dir).join("data")).unwrap();
        std::fs::copy(
            repo().join("images/data/aws-eni.tsv"),
            d.join(dir).join("data/aws-eni.tsv"),
        )
        .unwrap();
        let def = d.join(dir).join("ubuntu.toml");
        std::fs::write(&def, text + "\n[max_pods]\n\"t3.medium\" = 17\n").unwrap();
        def
    };
    let def1 = def_in("defs-old", shipped.clone());
    let old = bake_rootfs(&fx, &def1, &d.join("old"));
    let text = shipped
        .replace("[[artifact]]\nname = \"crictl\"\n", "")
        .replace(
            "registry.k8s.io/pause:3.10.2",
            "registry.k8s.io/pause:3.10.1",
        );
    let def2 = def_in("defs", text);
    let t = std::fs::read_to_string(&def2).unwrap();
    std::fs::write(&def2, t.replace("\"t3.medium\" = 17", "\"t3.medium\" = 20")).unwrap();
    let new = bake_rootfs(&fx, &def2, &d.join("new"));
    let root = debian_root(d);
    ok(&install(&old, &root), "install old");
    assert!(root.join("usr/bin/crictl").exists());
    let up = install(&new, &root);
    ok(&up, "install new");
    assert!(!root.join("usr/bin/crictl").exists(), "{}", stdout(&up));
    assert!(
        stdout(&up).contains("removed /usr/bin/crictl"),
        "{}",
        stdout(&up)
    );
    let cfg = std::fs::read_to_string(root.join("usr/lib/kiln/containerd/config.toml")).unwrap();
    assert!(cfg.contains("pause:3.10.1"), "{cfg}");

    let diff = kiln()
        .arg("diff")
        .arg(d.join(format!("old/ubuntu-{}-amd64.manifest.json", kube_version())))
        .arg(d.join(format!("new/ubuntu-{}-amd64.manifest.json", kube_version())))
        .output()
        .unwrap();
    assert_eq!(diff.status.code(), Some(1), "{}", stderr(&diff));
    let t = stdout(&diff);
    for want in [
        format!("removed /usr/bin/crictl: artifact crictl {FIXTURE_CRICTL} removed").as_str(),
        "changed /usr/lib/kiln/containerd/config.toml: containerd.sandbox_image: \"registry.k8s.io/pause:3.10.2\" -> \"registry.k8s.io/pause:3.10.1\"",
        "changed /usr/lib/kiln/max-pods.map: max_pods.t3.medium: 17 -> 20",
        "changed /usr/lib/kiln/image.env:",
    ] {
        assert!(t.contains(want), "{want:?} not in:\n{t}");
    }
    assert!(
        !t.contains("/usr/bin/kubelet"),
        "kubelet did not change:\n{t}"
    );
    // Identical layers: exit 0, no changes.
    let same = kiln()
        .arg("diff")
        .arg(d.join(format!("new/ubuntu-{}-amd64.manifest.json", kube_version())))
        .arg(d.join(format!("new/ubuntu-{}-amd64.manifest.json", kube_version())))
        .output()
        .unwrap();
    ok(&same, "diff of identical layers");
    assert!(stdout(&same).contains(": 0 change(s)"), "{}", stdout(&same));
}

/// A tar.zst whose single entry has a raw name and type kiln must refuse.
fn hostile_layer(dir: &Path, name: &str, kind: tar::EntryType, link: Option<&str>) -> PathBuf {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(if kind == tar::EntryType::Regular {
        5
    } else {
        0
    });
    h.set_entry_type(kind);
    // Written into the raw header: the tar crate's own setters refuse these names.
    let raw = &mut h.as_old_mut().name;
    raw[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(l) = link {
        h.as_old_mut().linkname[..l.len()].copy_from_slice(l.as_bytes());
    }
    h.set_cksum();
    let body: &[u8] = if kind == tar::EntryType::Regular {
        b"evil\n"
    } else {
        b""
    };
    b.append(&h, body).unwrap();
    let tarbytes = b.into_inner().unwrap();
    let p = dir.join(format!("hostile-{}.tar.zst", name.replace(['/', '.'], "_")));
    let mut f = std::fs::File::create(&p).unwrap();
    f.write_all(&zstd::encode_all(&tarbytes[..], 3).unwrap())
        .unwrap();
    // Listed in SHA256SUMS: a layer that verifies is still refused by the entry rules.
    let line = format!(
        "{}  {}\n",
        sha256_file(&p),
        p.file_name().unwrap().to_string_lossy()
    );
    let mut sums = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(dir.join("SHA256SUMS"))
        .unwrap();
    sums.write_all(line.as_bytes()).unwrap();
    p
}

#[test]
fn refuses_hostile_layer_archives() {
    let d = tempfile::tempdir().unwrap();
    let outside = d.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let root = d.path().join("r/root");
    std::fs::create_dir_all(&root).unwrap();
    use tar::EntryType as E;
    let cases: &[(&str, E, Option<&str>, &str)] = &[
        ("../../outside/evil", E::Regular, None, "`..`"),
        ("/tmp/evil", E::Regular, None, "absolute path"),
        ("usr/dev/null", E::Char, None, "device node"),
        ("usr/fifo", E::Fifo, None, "FIFO"),
        ("usr/hard", E::Link, Some("/etc/shadow"), "hard link"),
        (
            "usr/x",
            E::Symlink,
            Some("../../../outside"),
            "symlink points outside the root",
        ),
    ];
    for (name, kind, link, why) in cases {
        let layer = hostile_layer(d.path(), name, *kind, *link);
        let r = install(&layer, &root);
        assert!(!r.status.success(), "{name} accepted");
        let e = stderr(&r);
        assert!(
            e.contains("refusing layer entry") && e.contains(why),
            "{name}: {e}"
        );
        assert_eq!(
            std::fs::read_dir(&root).unwrap().count(),
            0,
            "{name} wrote into the root"
        );
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "{name} wrote outside"
        );
    }
}

#[test]
fn systemd_analyze_verify_accepts_the_installed_units() {
    let fx = fixture(Bins::Real);
    let d = fx.dir.path();
    let layer = bake_rootfs(&fx, &repo().join("images/ubuntu.toml"), &d.join("out"));
    let root = debian_root(d);
    // A minimal root: the targets and the modprobe the units name, as stubs (the QEMU boot
    // tests run the same units in a debootstrapped Debian).
    for t in [
        "multi-user.target",
        "network-online.target",
        "network.target",
        "local-fs.target",
        "sysinit.target",
        "basic.target",
        "shutdown.target",
        "sockets.target",
        "paths.target",
        "timers.target",
        "slices.target",
        "system.slice",
        "-.slice",
    ] {
        std::fs::write(
            root.join("usr/lib/systemd/system").join(t),
            format!("[Unit]\nDescription={t}\n"),
        )
        .unwrap();
    }
    std::fs::write(root.join("usr/sbin/modprobe"), b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(
        root.join("usr/sbin/modprobe"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    ok(&install(&layer, &root), "install");
    let units = [
        "kiln-firstboot.service",
        "kubelet.service",
        "kiln-report.service",
        "kiln-report.timer",
        "containerd.service",
    ];
    let mut c = Command::new("systemd-analyze");
    c.arg("verify")
        .arg(format!("--root={}", root.display()))
        .arg("--man=no");
    for u in units {
        c.arg(root.join("usr/lib/systemd/system").join(u));
    }
    let r = c.output().unwrap();
    let e = stderr(&r);
    assert!(
        r.status.success(),
        "systemd-analyze verify: {}\n{e}",
        r.status
    );
    // verify exits 0 on some warnings; none of ours may be named.
    for u in units {
        assert!(!e.contains(&format!("{u}:")), "{u} has findings:\n{e}");
    }
    // A broken unit is caught by the same command (so the check above can fail).
    let bad = root.join("usr/lib/systemd/system/broken.service");
    std::fs::write(&bad, "[Service]\nExecStart=/usr/bin/does-not-exist\n").unwrap();
    let r = Command::new("systemd-analyze")
        .arg("verify")
        .arg(format!("--root={}", root.display()))
        .arg("--man=no")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(
        !r.status.success() || !stderr(&r).is_empty(),
        "a broken unit passed"
    );
}
