//! The rootfs layer installs kiln-firstboot's man page at
//! `usr/share/man/man8/kiln-firstboot.8.gz`: the page `kiln man` writes, gzipped without a
//! time or a name, listed in the manifest and the SBOM, and readable by the real `man`.

use crate::bake_support;

use std::process::Command;

use bake_support::*;

const PAGE: &str = "usr/share/man/man8/kiln-firstboot.8.gz";

#[test]
fn the_rootfs_layer_carries_kiln_firstboots_man_page() {
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let out = d.join("rootfs");
    ok(
        &bake_cli(
            &fx,
            &repo().join("images/ubuntu.toml"),
            "rootfs",
            "amd64",
            &out,
            &[],
        ),
        "bake rootfs",
    );
    let base = format!("ubuntu-{}-amd64", kube_version());
    let tarball = out.join(format!("{base}.tar.zst"));

    // In the archive, as real tar sees it: root-owned, 0644.
    let o = Command::new("tar")
        .arg("--zstd")
        .arg("-tvf")
        .arg(&tarball)
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    ok(&o, "tar -tvf");
    let listing = String::from_utf8(o.stdout).unwrap();
    let line = listing
        .lines()
        .find(|l| l.ends_with(PAGE))
        .unwrap_or_else(|| panic!("{}: expected {PAGE}, found:\n{listing}", tarball.display()));
    assert!(line.starts_with("-rw-r--r-- root/root"), "{line}");

    // Its bytes: a gzip with no mtime and no file name of exactly the page `kiln man` writes.
    let x = d.join("x");
    std::fs::create_dir_all(&x).unwrap();
    let o = Command::new("tar")
        .arg("--zstd")
        .arg("-xf")
        .arg(&tarball)
        .arg("-C")
        .arg(&x)
        .arg(PAGE)
        .output()
        .unwrap();
    ok(&o, "tar -x");
    let gz_path = x.join(PAGE);
    let gz = std::fs::read(&gz_path).unwrap();
    assert_eq!(gz[..2], [0x1f, 0x8b], "{PAGE}: expected gzip magic");
    assert_eq!(
        gz[3] & 0x08,
        0,
        "{PAGE}: expected no file name in the gzip header"
    );
    assert_eq!(
        gz[4..8],
        [0, 0, 0, 0],
        "{PAGE}: expected mtime 0 in the gzip header"
    );
    let o = Command::new("gzip")
        .arg("-dc")
        .arg(&gz_path)
        .output()
        .unwrap();
    ok(&o, "gzip -dc");
    let man_dir = d.join("man");
    ok(
        &kiln()
            .arg("man")
            .arg("--out")
            .arg(&man_dir)
            .output()
            .unwrap(),
        "kiln man",
    );
    let page = std::fs::read(man_dir.join("kiln-firstboot.8")).unwrap();
    assert!(
        o.stdout == page,
        "{PAGE} is not the kiln-firstboot.8 that kiln man writes"
    );

    // The real man reads it from the layer, gzipped, without a warning.
    let o = Command::new("man")
        .args(["--warnings", "-l", "-P", "cat"])
        .arg(&gz_path)
        .env("MANWIDTH", "100")
        .env("LC_ALL", "C.UTF-8")
        .output()
        .expect("man (man-db) reads the page");
    ok(&o, "man -l");
    let shown = String::from_utf8_lossy(&o.stdout);
    assert!(
        shown.contains("KILN-FIRSTBOOT(8)") && shown.contains("--vmware-rpctool PATH"),
        "{shown}"
    );
    assert_eq!(String::from_utf8_lossy(&o.stderr), "", "man -l warnings");

    // Listed like every other file: the manifest (with its size and sha256) and the SBOM.
    let sha = sha256_file(&gz_path);
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(format!("{base}.manifest.json"))).unwrap())
            .unwrap();
    let entry = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["path"] == PAGE)
        .unwrap_or_else(|| panic!("{base}.manifest.json: expected {PAGE} in files"));
    assert_eq!(entry["sha256"], sha.as_str(), "{entry}");
    assert_eq!(entry["size"], gz.len() as u64, "{entry}");
    let sbom: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join(format!("{base}.spdx.json"))).unwrap())
            .unwrap();
    let file = sbom["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["fileName"] == format!("./{PAGE}"))
        .unwrap_or_else(|| panic!("{base}.spdx.json: expected ./{PAGE} in files"));
    assert!(file.to_string().contains(&sha), "{file}");
}
