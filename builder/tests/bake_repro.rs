//! Same inputs, same bytes: every format baked twice — different output directories,
//! different umask, shuffled lock and definition order, a different thread count — gives
//! byte-identical outputs; SOURCE_DATE_EPOCH changes them, and only through timestamps.
//! Linux layers carry a lock image (issue 16), whose OCI archive must be as reproducible.

// Both support trees include testkit/optout.rs; this test uses both.
#![allow(clippy::duplicate_mod)]

use crate::bake_support;
use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use bake_support::*;

/// The definition with its `[[artifact]]` tables in reverse order.
fn shuffled_definition(src: &Path, dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(src).unwrap();
    let (head, arts) = text.split_at(text.find("[[artifact]]").unwrap());
    let end = arts.find("\n\n").map(|i| i + 2).unwrap_or(arts.len());
    let (arts, tail) = arts.split_at(end);
    let mut blocks: Vec<String> = arts
        .split("[[artifact]]")
        .filter(|b| !b.trim().is_empty())
        .map(|b| format!("[[artifact]]{}\n", b.trim_end()))
        .collect();
    blocks.reverse();
    let out = dir.join(src.file_name().unwrap());
    std::fs::write(&out, format!("{head}{}\n{tail}", blocks.concat())).unwrap();
    out
}

/// How one bake runs: umask, compression threads, SOURCE_DATE_EPOCH.
/// And the bake cache argument (`--cache DIR` or `--no-cache`).
struct Env<'a>(&'a str, &'a str, &'a str, &'a str);

fn bake_in(fx: &Fixture, lock: &Path, image: &Path, format: &str, out: &Path, env: Env<'_>) {
    let Env(umask, threads, epoch, cache) = env;
    let fb = if format == "windows" {
        &fx.firstboot_exe
    } else {
        &fx.firstboot
    };
    let script = format!(
        "umask {umask} && exec \"$0\" bake \"$1\" --format {format} --arch amd64 --out \"$2\" --lock \"$3\" --allow-unsigned --store \"$4\" --firstboot \"$5\" --threads {threads} $6"
    );
    let r = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_kiln"))
        .arg(image)
        .arg(out)
        .arg(lock)
        .arg(&fx.store)
        .arg(fb)
        .arg(cache)
        .env("SOURCE_DATE_EPOCH", epoch)
        .output()
        .unwrap();
    ok(&r, &format!("bake {format} umask {umask}"));
}

/// Every file a bake wrote but its provenance, which records when the bake ran and which
/// definition and lock files it read (here a shuffled copy of each, on purpose): it describes
/// the layer, it is not part of it (docs/bake.md, "Provenance").
fn outputs(dir: &Path) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .filter(|p| !p.to_string_lossy().ends_with(".provenance.json"))
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                sha256_file(&p),
            )
        })
        .collect();
    v.sort();
    v
}

fn check_format(image: &str, format: &str) {
    let fx = fixture(Bins::Real);
    let d = fx.dir.path();
    let def = repo().join("images").join(image);
    // The second bake reads a lock with its entries reversed and a definition with its
    // artifacts reversed.
    let mut arts = fx.arts.clone();
    arts.reverse();
    let lock2 = d.join("reversed.lock");
    std::fs::write(&lock2, lock_text(&arts)).unwrap();
    if format != "windows" {
        // A lock image in both locks; its blobs in the store.
        let img = support::registry::build_image(
            &d.join("layout"),
            "t",
            &[("amd64", std::fs::read("/bin/busybox").unwrap())],
        );
        support::registry::store_layout(&img.layout, &fx.store);
        let entry = support::registry::image_entry("registry.k8s.io/pause:3.10.2", &img);
        for l in [&fx.lock, &lock2] {
            let text = std::fs::read_to_string(l).unwrap();
            std::fs::write(l, format!("{text}{entry}")).unwrap();
        }
    }
    // The pinned AWS table travels with the definition (sizing.aws_table is relative to it).
    std::fs::create_dir_all(d.join("defs/data")).unwrap();
    std::fs::copy(
        repo().join("images/data/aws-eni.tsv"),
        d.join("defs/data/aws-eni.tsv"),
    )
    .unwrap();
    let def2 = shuffled_definition(&def, &d.join("defs"));
    assert_ne!(std::fs::read(&def).unwrap(), std::fs::read(&def2).unwrap());

    let a = d.join("a/out");
    let b = d.join("somewhere/else/out");
    // The first bake fills a cold bake cache, the second reads it warm.
    let cache = format!("--cache {}", d.join("cache").display());
    bake_in(
        &fx,
        &fx.lock,
        &def,
        format,
        &a,
        Env("022", "1", "1704067200", &cache),
    );
    bake_in(
        &fx,
        &lock2,
        &def2,
        format,
        &b,
        Env("077", "2", "1704067200", &cache),
    );
    assert!(
        std::fs::read_dir(d.join("cache")).unwrap().count() > 0,
        "cache not filled"
    );
    let (oa, ob) = (outputs(&a), outputs(&b));
    assert!(oa.len() >= 3, "{oa:?}");
    assert_eq!(oa, ob, "{format}: outputs differ between the two bakes");

    // Another SOURCE_DATE_EPOCH changes the archive bytes but not the layer's content id.
    let c = d.join("c/out");
    bake_in(
        &fx,
        &fx.lock,
        &def,
        format,
        &c,
        Env("022", "0", "1700000000", "--no-cache"),
    );
    let oc = outputs(&c);
    let main_a = &oa
        .iter()
        .find(|(n, _)| n.ends_with(".raw") || n.ends_with(".tar.zst") || n.ends_with(".zip"))
        .unwrap();
    let main_c = &oc.iter().find(|(n, _)| n == &main_a.0).unwrap();
    assert_ne!(main_a.1, main_c.1, "{format}: SOURCE_DATE_EPOCH ignored");
    let ma: serde_json::Value =
        serde_json::from_slice(&std::fs::read(a.join(manifest_name(&oa))).unwrap()).unwrap();
    let mc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.join(manifest_name(&oc))).unwrap()).unwrap();
    if format != "windows" {
        let listing = std::fs::read_to_string(a.join(manifest_name(&oa))).unwrap();
        assert!(
            listing.contains("usr/share/kiln/images/pause.oci.tar"),
            "{format}: the lock image is not in the layer"
        );
    }
    assert_eq!(
        ma["image_id"], mc["image_id"],
        "the image id is content-derived, not time-derived"
    );
}

fn manifest_name(o: &[(String, String)]) -> String {
    o.iter()
        .find(|(n, _)| n.ends_with(".manifest.json"))
        .unwrap()
        .0
        .clone()
}

#[test]
fn sysext_is_reproducible() {
    check_format("flatcar.toml", "sysext");
}

#[test]
fn rootfs_is_reproducible() {
    check_format("ubuntu.toml", "rootfs");
}

#[test]
fn windows_zip_is_reproducible() {
    check_format("windows.toml", "windows");
}

#[test]
fn source_date_epoch_lands_in_the_listing() {
    let fx = fixture(Bins::Real);
    let out = fx.dir.path().join("out");
    bake_in(
        &fx,
        &fx.lock,
        &repo().join("images/ubuntu.toml"),
        "rootfs",
        &out,
        Env("022", "0", "1700000000", "--no-cache"),
    );
    let list = Command::new("tar")
        .env("TZ", "UTC")
        .arg("--zstd")
        .arg("-tvf")
        .arg(out.join(format!("ubuntu-{}-amd64.tar.zst", kube_version())))
        .output()
        .unwrap();
    ok(&list, "tar -tvf");
    let list = String::from_utf8(list.stdout).unwrap();
    for line in list.lines() {
        assert!(line.contains("2023-11-14 22:13"), "{line}");
    }
}
