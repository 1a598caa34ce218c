//! Golden listings: what the real tools (`unsquashfs -lln`, `tar -tvf`, `unzip -Z`) print for
//! the three shipped definitions baked from the stand-in fixture, and the resulting
//! `image.env`. `make golden` rewrites them; a stale golden fails here with a diff.

use crate::bake_support;

use std::process::Command;

use bake_support::*;

fn tool(cmd: &mut Command) -> String {
    let out = cmd.env("TZ", "UTC").env("LC_ALL", "C").output().unwrap();
    ok(&out, &format!("{cmd:?}"));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn golden_listings() {
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let images = repo().join("images");

    let out = d.join("sysext");
    ok(
        &bake_cli(
            &fx,
            &images.join("flatcar.toml"),
            "sysext",
            "amd64",
            &out,
            &[],
        ),
        "bake sysext",
    );
    let raw = out.join(format!("kubernetes-{}-x86-64.raw", kube_version()));
    golden(
        "flatcar-sysext-amd64.unsquashfs-lln.txt",
        &tool(Command::new("unsquashfs").arg("-lln").arg(&raw)),
    );
    let x = d.join("x");
    tool(
        Command::new("unsquashfs")
            .arg("-d")
            .arg(&x)
            .arg(&raw)
            .arg("usr/lib/kiln/image.env"),
    );
    golden(
        "flatcar-sysext-amd64.image.env",
        &std::fs::read_to_string(x.join("usr/lib/kiln/image.env")).unwrap(),
    );

    let out = d.join("rootfs");
    ok(
        &bake_cli(
            &fx,
            &images.join("ubuntu.toml"),
            "rootfs",
            "amd64",
            &out,
            &[],
        ),
        "bake rootfs",
    );
    let tarball = out.join(format!("ubuntu-{}-amd64.tar.zst", kube_version()));
    golden(
        "ubuntu-rootfs-amd64.tar-tv.txt",
        &tool(Command::new("tar").arg("--zstd").arg("-tvf").arg(&tarball)),
    );

    let out = d.join("arm");
    ok(
        &bake_cli(
            &fx,
            &images.join("ubuntu.toml"),
            "rootfs",
            "arm64",
            &out,
            &[],
        ),
        "bake rootfs arm64",
    );
    let tarball = out.join(format!("ubuntu-{}-arm64.tar.zst", kube_version()));
    golden(
        "ubuntu-rootfs-arm64.tar-tv.txt",
        &tool(Command::new("tar").arg("--zstd").arg("-tvf").arg(&tarball)),
    );

    let out = d.join("windows");
    ok(
        &bake_cli(
            &fx,
            &images.join("windows.toml"),
            "windows",
            "amd64",
            &out,
            &[],
        ),
        "bake windows",
    );
    let zip = out.join(format!("windows-{}-amd64.zip", kube_version()));
    // Drop zipinfo's first line: it names the zip's path, which is a temp dir.
    let listing = tool(Command::new("unzip").arg("-Z").arg(&zip));
    let listing: String = listing.lines().skip(1).map(|l| format!("{l}\n")).collect();
    golden("windows-amd64.zipinfo.txt", &listing);
}
