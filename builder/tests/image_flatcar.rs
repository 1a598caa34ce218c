//! `kiln image` on a Flatcar-shaped base: the sysext lands, verified, in `/etc/extensions/`
//! of partition 9 (`ROOT`), found by its label; another version of it needs `--replace`.

use crate::image_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use image_support::*;

const TOOLS: &[&str] = &[
    "sgdisk",
    "mkfs.ext4",
    "debugfs",
    "qemu-img",
    "losetup",
    "setpriv",
    "e2fsck",
    "mount",
];
const COREOS_ROOT: &str = "3884DD41-8582-4404-B9A8-E9B84F2DF50E";
const COREOS_USR: &str = "5DFBF5F4-2848-4BAC-AA5E-0D9A20B745A6";

/// The sysext `kiln bake` makes of images/flatcar.toml (with `extra` flags).
fn sysext_with(fx: &Fixture, out: &Path, extra: &[&str]) -> PathBuf {
    ok(
        &bake_cli(
            fx,
            &repo().join("images/flatcar.toml"),
            "sysext",
            "amd64",
            out,
            extra,
        ),
        "bake sysext",
    );
    std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "raw"))
        .expect("a .raw sysext")
}

fn sysext(fx: &Fixture, out: &Path) -> PathBuf {
    sysext_with(fx, out, &[])
}

/// Flatcar's layout in small: EFI (1), USR-A (3), ROOT (9, ext4 with /etc).
fn flatcar_base(d: &Path) -> PathBuf {
    let tree = d.join("flatcar-root");
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/machine-id"), b"uninitialized\n").unwrap();
    let fs = ext4(d, &tree, 24, "ROOT");
    let disk = d.join("flatcar.raw");
    sh(Command::new("truncate").arg("-s40M").arg(&disk));
    sh(Command::new("sgdisk")
        .args(["-n1:2048:+2M", "-t1:EF00", "-c1:EFI-SYSTEM"])
        .args(["-n3:6144:+8M", &format!("-t3:{COREOS_USR}"), "-c3:USR-A"])
        .args(["-n9:24576:+24M", &format!("-t9:{COREOS_ROOT}"), "-c9:ROOT"])
        .arg(&disk));
    dd(&fs, &disk, 12);
    disk
}

fn dump(disk: &Path, at: u64, path: &str, to: &Path) -> Option<Vec<u8>> {
    let _ = std::fs::remove_file(to);
    sh(Command::new("debugfs")
        .arg("-R")
        .arg(format!("dump {path} {}", to.display()))
        .arg(format!("{}?offset={at}", disk.display())));
    std::fs::read(to).ok().filter(|b| !b.is_empty())
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario from its setup to its last assertion, each step depending on the one before; its helpers are in support/"
)]
fn the_sysext_lands_in_etc_extensions_of_the_root_partition() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let sx = sysext(&fx, &d.join("out"));
    let name = sx.file_name().unwrap().to_string_lossy().into_owned();
    let base = flatcar_base(d);
    let at = part_offset(&base, 9);
    assert_eq!(at, 12 << 20);
    let node = d.join("node.raw");
    let o = image(&[
        &"--base",
        &base,
        &"--layer",
        &sx,
        &"--out",
        &node,
        &"--format",
        &"raw",
    ]);
    ok(&o, "kiln image on a Flatcar base");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("root is partition 9 (ext4) at byte 12582912"),
        "{text}"
    );
    assert!(
        text.contains(&format!("wrote /etc/extensions/{name}")),
        "{text}"
    );
    let got = dump(
        &node,
        at,
        &format!("/etc/extensions/{name}"),
        &d.join("got.raw"),
    )
    .unwrap();
    assert_eq!(got, std::fs::read(&sx).unwrap());
    assert_eq!(
        dump(&node, at, "/etc/machine-id", &d.join("mid")).unwrap(),
        b"uninitialized\n"
    );
    // Unprivileged (debugfs, as nobody): the same tree.
    let mine = nobody_dir(d).join("node.raw");
    let o = as_nobody(&[
        &"--base",
        &base,
        &"--layer",
        &sx,
        &"--out",
        &mine,
        &"--format",
        &"raw",
        &"--via",
        &"debugfs",
    ]);
    ok(&o, "kiln image --via debugfs on a Flatcar base");
    assert_eq!(tree_at(&mine, at, d), tree_at(&node, at, d));
    assert_eq!(
        owners(&mine, at, &["/etc/extensions"]),
        owners(&node, at, &["/etc/extensions"])
    );
    fsck_clean(&mine, at);

    // Another version in /etc/extensions: refused without --replace, removed with it.
    let older = d.join("older");
    std::fs::create_dir_all(&older).unwrap();
    let old_name = name.replacen("-v", "-v0.", 1);
    std::fs::copy(&sx, older.join(&old_name)).unwrap();
    let with_old = d.join("with-old.raw");
    std::fs::copy(&base, &with_old).unwrap();
    let staged = older.join("SHA256SUMS");
    std::fs::write(&staged, format!("{}  {old_name}\n", sha256_file(&sx))).unwrap();
    ok(
        &image(&[
            &"--base",
            &base,
            &"--layer",
            &older.join(&old_name),
            &"--out",
            &with_old,
            &"--format",
            &"raw",
        ]),
        "the older version",
    );
    let out = d.join("upgraded.raw");
    let o = image(&[
        &"--base",
        &with_old,
        &"--layer",
        &sx,
        &"--out",
        &out,
        &"--format",
        &"raw",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains(&format!(
            "is already a kiln node (/etc/extensions/{old_name})"
        )) && e.contains("--replace"),
        "{e}"
    );
    let o = image(&[
        &"--base",
        &with_old,
        &"--layer",
        &sx,
        &"--out",
        &out,
        &"--format",
        &"raw",
        &"--replace",
    ]);
    ok(&o, "--replace");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("removed /etc/extensions/{old_name}"))
    );
    assert!(dump(
        &out,
        at,
        &format!("/etc/extensions/{old_name}"),
        &d.join("old")
    )
    .is_none());
    assert!(dump(&out, at, &format!("/etc/extensions/{name}"), &d.join("new")).is_some());

    // A sysext whose bytes are not the ones SHA256SUMS lists: refused (exit 3).
    let bad = d.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let mut bytes = std::fs::read(&sx).unwrap();
    let n = bytes.len();
    bytes[n - 1] ^= 1;
    std::fs::write(bad.join(&name), bytes).unwrap();
    std::fs::write(
        bad.join("SHA256SUMS"),
        format!("{}  {name}\n", sha256_file(&sx)),
    )
    .unwrap();
    let o = image(&[
        &"--base",
        &base,
        &"--layer",
        &bad.join(&name),
        &"--out",
        &d.join("bad.raw"),
    ]);
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Issue 39: a signed sysext disk image (`kiln bake --sysext-ddi`) lands with its
/// certificate in `/etc/verity.d/` and the signed-only `systemd-sysext.service` drop-in, as
/// `kiln render --sysext` places them (without the certificate, systemd-sysext could not
/// verify the image and would not merge it); one without its certificate beside it is refused
/// before the base is read.
#[test]
fn a_signed_sysext_lands_with_its_certificate_and_policy() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let prefix = d.join("attest");
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["key", "generate"])
        .arg(&prefix)
        .output()
        .unwrap();
    ok(&o, "kiln key generate");
    let key = d.join("attest.key").display().to_string();
    let out = d.join("out");
    let sx = sysext_with(&fx, &out, &["--sysext-ddi", "--attest-key", &key]);
    let base = flatcar_base(d);
    let at = part_offset(&base, 9);
    let node = d.join("node.raw");
    let o = image(&[
        &"--base",
        &base,
        &"--layer",
        &sx,
        &"--out",
        &node,
        &"--format",
        &"raw",
    ]);
    ok(&o, "kiln image with a signed sysext");
    assert_eq!(
        dump(
            &node,
            at,
            "/etc/verity.d/kiln-kubernetes.crt",
            &d.join("crt")
        )
        .unwrap(),
        std::fs::read(out.join("kubernetes.verity.crt")).unwrap()
    );
    let dropin = dump(
        &node,
        at,
        "/etc/systemd/system/systemd-sysext.service.d/kiln-signed.conf",
        &d.join("dropin"),
    )
    .unwrap();
    assert!(
        String::from_utf8_lossy(&dropin).contains("root=signed+absent:usr=signed+absent"),
        "{}",
        String::from_utf8_lossy(&dropin)
    );
    std::fs::remove_file(out.join("kubernetes.verity.crt")).unwrap();
    let o = image(&[
        &"--base",
        &base,
        &"--layer",
        &sx,
        &"--out",
        &d.join("n2.raw"),
        &"--format",
        &"raw",
    ]);
    assert!(
        !o.status.success(),
        "a signed image without its certificate was placed"
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("kubernetes.verity.crt is not beside it"),
        "{err}"
    );
}
