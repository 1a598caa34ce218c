//! Shared helpers for the `kiln image` tests: small base disks built with the real tools
//! (sgdisk/sfdisk, mkfs.ext4 -d, dd at the partition offset), a baked layer, and a way to
//! read the tree inside an output image (debugfs rdump, no mount).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub use crate::bake_support::*;

/// GPT type GUIDs used by the tests (Discoverable Partitions Specification).
pub const ROOT_X86_64: &str = "4F68BCE3-E8CD-4DB1-96E7-FBCAF984B709";
pub const ROOT_ARM64: &str = "B921B045-1DF0-41C3-AF44-4C6F280D3FAE";
pub const LINUX_DATA: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";
pub const ESP: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";

/// Fails the test (never skips) when a tool is missing or kiln cannot be run as root.
pub fn require(tools: &[&str], root: bool) -> bool {
    for t in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !found {
            optout::cannot_run(&format!("tool-{t}"), &format!("{t} is not installed"));
            return false;
        }
    }
    // SAFETY: geteuid has no preconditions.
    if root && unsafe { libc::geteuid() } != 0 {
        optout::cannot_run(
            "image-root",
            "kiln image's rootful mode needs root (loop devices, mount)",
        );
        return false;
    }
    true
}

/// Runs a command, panicking with its output on failure.
pub fn sh(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// A Debian-shaped root tree to put into the base's ext4.
pub fn base_tree(dir: &Path) -> PathBuf {
    let root = dir.join("base-tree");
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
    std::fs::write(root.join("usr/bin/bash"), b"the base's own shell").unwrap();
    std::fs::write(root.join("etc/hostname"), b"base\n").unwrap();
    root
}

/// An ext4 filesystem image of `mib` MiB holding `tree`, labelled `label`.
pub fn ext4(dir: &Path, tree: &Path, mib: u64, label: &str) -> PathBuf {
    let p = dir.join(format!("{label}-{mib}.ext4"));
    sh(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", label, "-E", "root_owner=0:0", "-d"])
        .arg(tree)
        .arg(&p)
        .arg(format!("{mib}M")));
    p
}

/// One GPT partition: start and size in MiB, type GUID, name, and the filesystem to put in.
pub struct Part<'a> {
    pub start: u64,
    pub mib: u64,
    pub kind: &'a str,
    pub name: &'a str,
    pub fs: Option<&'a Path>,
}

/// A raw GPT disk of `mib` MiB with `parts`, each filesystem written at its offset with dd.
pub fn gpt_disk(path: &Path, mib: u64, parts: &[Part<'_>]) {
    sh(Command::new("truncate").arg(format!("-s{mib}M")).arg(path));
    let mut c = Command::new("sgdisk");
    for (i, p) in parts.iter().enumerate() {
        let n = i + 1;
        c.arg(format!("-n{n}:{}:+{}M", p.start * 2048, p.mib))
            .arg(format!("-t{n}:{}", p.kind))
            .arg(format!("-c{n}:{}", p.name));
    }
    sh(c.arg(path));
    for p in parts {
        if let Some(fs) = p.fs {
            dd(fs, path, p.start);
        }
    }
}

/// Copies `fs` into `disk` at `start_mib`.
pub fn dd(fs: &Path, disk: &Path, start_mib: u64) {
    sh(Command::new("dd")
        .arg(format!("if={}", fs.display()))
        .arg(format!("of={}", disk.display()))
        .args(["bs=1M", "conv=notrunc,sparse", "status=none"])
        .arg(format!("seek={start_mib}")));
}

/// The usual base: a 64 MiB disk with an ESP (1 MiB at 1) and an x86-64 root (48 MiB at 8)
/// holding [`base_tree`].
pub fn gpt_base(dir: &Path) -> PathBuf {
    let tree = base_tree(dir);
    let fs = ext4(dir, &tree, 48, "root");
    let disk = dir.join("base.raw");
    gpt_disk(
        &disk,
        64,
        &[
            Part {
                start: 1,
                mib: 1,
                kind: ESP,
                name: "EFI",
                fs: None,
            },
            Part {
                start: 8,
                mib: 48,
                kind: ROOT_X86_64,
                name: "root",
                fs: Some(&fs),
            },
        ],
    );
    disk
}

/// A rootfs layer baked from `images/ubuntu.toml` with containerd's sandbox image tagged
/// `pause` (it lands in containerd's config, so two tags give two image ids); returns the
/// layer path.
pub fn layer(fx: &Fixture, pause: &str, out: &Path) -> PathBuf {
    let text = std::fs::read_to_string(repo().join("images/ubuntu.toml")).unwrap();
    let shipped = "sandbox_image = \"registry.k8s.io/pause:3.10.2\"";
    assert!(text.contains(shipped), "images/ubuntu.toml changed");
    let def = text.replace(
        shipped,
        &format!("sandbox_image = \"registry.k8s.io/pause:{pause}\""),
    );
    let max_pods = pause.replace('.', "_");
    // Beside links to everything else in images/ (the definition names data/ relative to
    // itself).
    let defs = fx.dir.path().join(format!("defs-{max_pods}"));
    std::fs::create_dir_all(&defs).unwrap();
    for e in std::fs::read_dir(repo().join("images")).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(e.path(), defs.join(e.file_name())).unwrap();
    }
    let path = defs.join(format!("ubuntu-{max_pods}.toml"));
    std::fs::write(&path, def).unwrap();
    ok(
        &bake_cli(fx, &path, "rootfs", "amd64", out, &[]),
        "bake rootfs",
    );
    out.join(format!("ubuntu-{}-amd64.tar.zst", kube_version()))
}

/// `kiln image` with these arguments.
pub fn image(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = kiln();
    c.arg("image");
    for a in args {
        c.arg(a);
    }
    c.output().unwrap()
}

/// The byte offset of partition `n` of a raw disk, from `sgdisk -i`.
pub fn part_offset(disk: &Path, n: u32) -> u64 {
    let o = sh(Command::new("sgdisk").arg(format!("-i{n}")).arg(disk));
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let line = text
        .lines()
        .find(|l| l.starts_with("First sector:"))
        .unwrap_or_else(|| panic!("no first sector: {text}"));
    let sector: u64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    sector * 512
}

/// The tree in the ext4 filesystem at byte `offset` of raw `disk`, read with debugfs
/// (rdump into a directory) and listed as `type mode size link path sha256` per entry.
pub fn tree_at(disk: &Path, offset: u64, scratch: &Path) -> Vec<String> {
    let out = scratch.join(format!("rdump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let o = sh(Command::new("debugfs")
        .arg("-R")
        .arg(format!("rdump / {}", out.display()))
        .arg(format!("{}?offset={offset}", disk.display())));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("rdump:"), "debugfs rdump: {err}");
    let listing = sh(Command::new("find")
        .arg(".")
        .args(["-mindepth", "1", "-printf", "%y %m %s %l %P\n"])
        .current_dir(&out));
    let mut v: Vec<String> = String::from_utf8_lossy(&listing.stdout)
        .lines()
        .filter(|l| !l.ends_with(" lost+found"))
        .map(|l| {
            let p = l.rsplit(' ').next().unwrap();
            let full = out.join(p);
            let sum = if full.symlink_metadata().unwrap().is_file() {
                sha256_file(&full)
            } else {
                String::new()
            };
            format!("{l} {sum}")
        })
        .collect();
    v.sort();
    std::fs::remove_dir_all(&out).unwrap();
    v
}

/// Loop devices whose backing file lies in `dir` (`losetup -a`).
pub fn loops_in(dir: &Path) -> Vec<String> {
    let o = sh(Command::new("losetup").arg("-a"));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains(&*dir.to_string_lossy()))
        .map(str::to_string)
        .collect()
}

/// Mounts of kiln image roots visible to the test (in the host's mount namespace).
pub fn kiln_mounts() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.contains(".kiln-image-root-"))
        .map(str::to_string)
        .collect()
}

/// Files kiln left in `dir` besides those named in `keep`.
/// (Each kept image's SBOM, `NAME.spdx.json`, is kept with it.)
pub fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            let image = n.strip_suffix(".spdx.json").unwrap_or(n);
            !keep.contains(&image)
        })
        .collect()
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `kiln image ARGS` as `nobody`, with no capabilities.
pub fn as_nobody(args: &[&dyn AsRef<std::ffi::OsStr>]) -> Output {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
    ])
    .arg(env!("CARGO_BIN_EXE_kiln"))
    .arg("image");
    for a in args {
        c.arg(a);
    }
    c.output().unwrap()
}

/// Opens the fixture's directory to `nobody` (read and traverse) and makes a directory it
/// may write its images to.
pub fn nobody_dir(d: &Path) -> PathBuf {
    let mut p = d.to_path_buf();
    while p != Path::new("/") {
        let m =
            std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&p).unwrap().permissions());
        if m & 0o005 != 0o005 {
            std::fs::set_permissions(
                &p,
                <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(m | 0o005),
            )
            .unwrap();
        }
        if !p.pop() {
            break;
        }
    }
    let out = d.join("nobody");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::set_permissions(
        &out,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o777),
    )
    .unwrap();
    out
}

/// Every entry of the ext4 filesystem at `offset` of `disk` with its owner, `ls -p` style.
pub fn owners(disk: &Path, offset: u64, dirs: &[&str]) -> Vec<String> {
    let mut v = Vec::new();
    for d in dirs {
        let o = sh(Command::new("debugfs")
            .arg("-R")
            .arg(format!("ls -p {d}"))
            .arg(format!("{}?offset={offset}", disk.display())));
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            let f: Vec<&str> = l.split('/').collect();
            if f.len() > 6 && f[5] != "." && f[5] != ".." {
                v.push(format!("{d}/{} {} {}:{}", f[5], f[2], f[3], f[4]));
            }
        }
    }
    v.sort();
    v
}

pub fn fsck_clean(disk: &Path, offset: u64) {
    let o = Command::new("e2fsck")
        .arg("-fn")
        .arg(format!("{}?offset={offset}", disk.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "e2fsck -fn: {}", text(&o));
}
