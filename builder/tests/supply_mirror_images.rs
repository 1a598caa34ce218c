//! A lock's pinned images from a plain kiln mirror (issue 16): `kiln fetch --mirror` and
//! `kiln bake --fetch --mirror` over real HTTP on loopback (the test file server serving a
//! mirror's `blobs/sha256/`) and from a mirror directory, with no registry anywhere. Each
//! manifest and blob is checked against its digest while it streams: a wrong-digest blob is
//! refused and nothing of it is stored; a truncated one is resumed with Range, or refused when
//! it never completes; the registry the lock names is never contacted.

// Both support trees include testkit/optout.rs; this test uses both.
#![allow(clippy::duplicate_mod)]

use crate::bake_support;
use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;

use support::registry::{self, all_blobs_honest, hex, TestImage};
use support::server::{Fault, Server};

/// The reference the definitions name as their sandbox image. The registry is never asked:
/// every byte comes from the test's mirror, and the image is the test's own.
const REFERENCE: &str = "registry.k8s.io/pause:3.10.2";

struct Fx {
    dir: tempfile::TempDir,
    img: TestImage,
    lock: PathBuf,
    pk: PathBuf,
}

/// A test image (amd64, arm64 pinned; s390x in the index only) as a mirror directory, and a
/// signed lock pinning it.
fn fixture() -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let img = registry::build_image(
        &dir.path().join("mirror"),
        "t",
        &[
            ("amd64", support::noise(400_000, 1)),
            ("arm64", support::noise(300_000, 2)),
            ("s390x", support::noise(200_000, 3)),
        ],
    );
    let (pk, sk) = support::test_keypair(dir.path(), "t");
    let d = dir.path().join("lock");
    std::fs::create_dir_all(&d).unwrap();
    let text = format!("version = 1\n{}", registry::image_entry(REFERENCE, &img));
    let lock = support::write_signed_lock(&d, &text, &sk);
    Fx { dir, img, lock, pk }
}

/// Serves every blob of the mirror directory at `/blobs/sha256/<hex>`.
fn serve(layout: &Path) -> Server {
    let s = Server::start();
    for e in std::fs::read_dir(layout.join("blobs/sha256")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        s.add(&format!("/blobs/sha256/{name}"), std::fs::read(&p).unwrap());
    }
    s
}

fn fetch(fx: &Fx, cache: &Path, mirror: &str) -> Output {
    fetch_from(fx, cache, &[mirror])
}

/// `kiln fetch` of the fixture's lock into `cache`, with each of `mirrors` as a `--mirror`.
fn fetch_from(fx: &Fx, cache: &Path, mirrors: &[&str]) -> Output {
    let mut c = support::kiln();
    c.args(["fetch", "--backoff-ms", "10", "--attempts", "3"])
        .arg(&fx.lock)
        .arg("--trusted-key")
        .arg(&fx.pk)
        .arg("--cache")
        .arg(cache);
    for m in mirrors {
        c.args(["--mirror", m]);
    }
    support::run(&mut c)
}

fn path_of(d: &str) -> String {
    format!("/blobs/sha256/{}", hex(d))
}

/// The amd64 layer: the biggest blob a node needs.
fn amd64_layer(img: &TestImage) -> &str {
    &img.platforms[0].3[1]
}

/// The pinned platforms' blobs are in `cache`, the unpinned one's are not, every blob is
/// its digest, and the layout's index names the image.
fn assert_pinned_only(fx: &Fx, cache: &Path) {
    let at = |d: &str| cache.join("blobs/sha256").join(hex(d));
    assert!(at(&fx.img.index_digest).is_file());
    for (_, arch, md, blobs) in &fx.img.platforms {
        let want = arch != "s390x";
        assert_eq!(at(md).is_file(), want, "{arch} manifest");
        for b in blobs {
            assert_eq!(at(b).is_file(), want, "{arch} blob {b}");
        }
    }
    assert_eq!(all_blobs_honest(cache), 1 + 2 * 3);
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(cache.join("index.json")).unwrap()).unwrap();
    assert_eq!(
        index["manifests"][0]["digest"],
        fx.img.index_digest.as_str()
    );
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        REFERENCE
    );
}

#[test]
fn fetch_takes_the_pinned_platforms_from_an_http_mirror_and_again_nothing() {
    let fx = fixture();
    let srv = serve(&fx.img.layout);
    let cache = fx.dir.path().join("cache");
    let o = fetch(&fx, &cache, &srv.base());
    assert!(o.status.success(), "{}", support::out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("fetch: 1 images (7 manifests and blobs, 0 already present)"),
        "{}",
        support::out_text(&o)
    );
    assert_pinned_only(&fx, &cache);
    // Only the mirror's blobs were asked for, each once; the s390x ones never.
    let log = srv.log();
    assert_eq!(log.len(), 7, "{log:?}");
    assert!(log.iter().all(|s| s.path.starts_with("/blobs/sha256/")));
    assert_eq!(srv.hits(&path_of(&fx.img.platforms[2].2)), 0);

    // Again: nothing crosses the wire.
    let sent = srv.bytes_sent();
    let o = fetch(&fx, &cache, &srv.base());
    assert!(o.status.success(), "{}", support::out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("7 already present"),
        "{}",
        support::out_text(&o)
    );
    assert_eq!(srv.bytes_sent(), sent);
}

#[test]
fn fetch_takes_images_from_a_mirror_directory_and_refuses_a_wrong_blob_there() {
    let fx = fixture();
    let cache = fx.dir.path().join("cache");
    let mirror = fx.img.layout.to_str().unwrap().to_string();
    let o = fetch(&fx, &cache, &mirror);
    assert!(o.status.success(), "{}", support::out_text(&o));
    assert_pinned_only(&fx, &cache);

    // A mirror directory whose layer blob is not its digest: refused, named, not stored.
    let bad = fx.dir.path().join("bad-mirror");
    copy_dir(&fx.img.layout, &bad);
    let layer = amd64_layer(&fx.img);
    let p = bad.join("blobs/sha256").join(hex(layer));
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&p, bytes).unwrap();
    let cache2 = fx.dir.path().join("cache2");
    let o = fetch(&fx, &cache2, bad.to_str().unwrap());
    let text = support::out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(text.contains(hex(layer)), "{text}");
    assert!(text.contains(&bad.display().to_string()), "{text}");
    assert!(
        text.contains("pause (registry.k8s.io/pause:3.10.2)"),
        "{text}"
    );
    assert!(!cache2.join("blobs/sha256").join(hex(layer)).exists());
    all_blobs_honest(&cache2);
    // No record of an image that is not complete.
    assert!(!cache2.join("index.json").exists());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("blobs/sha256")).unwrap();
    for e in std::fs::read_dir(from.join("blobs/sha256")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, to.join("blobs/sha256").join(p.file_name().unwrap())).unwrap();
    }
}

#[test]
fn a_wrong_digest_blob_over_http_is_refused_and_nothing_of_it_is_stored() {
    let fx = fixture();
    let srv = serve(&fx.img.layout);
    let layer = amd64_layer(&fx.img);
    srv.always(&path_of(layer), Fault::WrongBytes);
    let cache = fx.dir.path().join("cache");
    let o = fetch(&fx, &cache, &srv.base());
    let text = support::out_text(&o);
    // Exit 3: wrong bytes, as for a file artifact.
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(text.contains(hex(layer)), "{text}");
    assert!(text.contains(&srv.base()), "{text}");
    assert!(text.contains("the bytes were discarded"), "{text}");
    assert!(!cache.join("blobs/sha256").join(hex(layer)).exists());
    // The other blobs that arrived are their digests; no partial blob is visible.
    all_blobs_honest(&cache);
    assert!(!cache.join("index.json").exists());

    // A wrong index: the root itself is refused.
    let srv2 = serve(&fx.img.layout);
    srv2.always(&path_of(&fx.img.index_digest), Fault::WrongBytes);
    let cache2 = fx.dir.path().join("cache2");
    let o = fetch(&fx, &cache2, &srv2.base());
    let text = support::out_text(&o);
    assert!(!o.status.success(), "{text}");
    assert!(text.contains(hex(&fx.img.index_digest)), "{text}");
    assert!(!cache2
        .join("blobs/sha256")
        .join(hex(&fx.img.index_digest))
        .exists());
    assert_eq!(srv2.hits(&path_of(layer)), 0, "nothing past a wrong index");

    // Healed: the same cache completes.
    srv.heal(&path_of(layer));
    let o = fetch(&fx, &cache, &srv.base());
    assert!(o.status.success(), "{}", support::out_text(&o));
    assert_pinned_only(&fx, &cache);
}

#[test]
fn a_truncated_blob_is_resumed_with_range_or_refused_when_it_never_completes() {
    let fx = fixture();
    let srv = serve(&fx.img.layout);
    let layer = amd64_layer(&fx.img);
    srv.fault(&path_of(layer), Fault::TruncateAfter(100_000));
    let cache = fx.dir.path().join("cache");
    let o = fetch(&fx, &cache, &srv.base());
    assert!(o.status.success(), "{}", support::out_text(&o));
    assert_pinned_only(&fx, &cache);
    let tries: Vec<_> = srv
        .log()
        .into_iter()
        .filter(|s| s.path == path_of(layer))
        .collect();
    assert_eq!(tries.len(), 2, "{tries:?}");
    assert_eq!(tries[1].range_start, Some(100_000), "{tries:?}");

    // Always cut short: refused after the attempts, named, nothing visible as the blob.
    let srv = serve(&fx.img.layout);
    srv.always(&path_of(layer), Fault::TruncateAfter(50_000));
    let cache2 = fx.dir.path().join("cache2");
    let o = fetch(&fx, &cache2, &srv.base());
    let text = support::out_text(&o);
    assert!(!o.status.success(), "{text}");
    assert!(text.contains(hex(layer)), "{text}");
    assert!(!cache2.join("blobs/sha256").join(hex(layer)).exists());
    all_blobs_honest(&cache2);
}

#[test]
fn bake_fetch_takes_the_layers_image_from_an_http_mirror() {
    let fx = bake_support::fixture(bake_support::Bins::Real);
    let img = registry::build_image(
        &fx.dir.path().join("mirror"),
        "t",
        &[
            (
                "amd64",
                std::fs::read("/bin/busybox").expect("busybox-static"),
            ),
            ("arm64", b"stand-in pause for arm64\n".to_vec()),
        ],
    );
    let srv = serve(&img.layout);
    pin_in_fixture_lock(&fx, &img);
    let base = srv.base();
    let fetched = bake_ubuntu_archive(&fx, &["--fetch", "--mirror", &base, "--backoff-ms", "10"]);
    // Only amd64's manifest, config and layer were fetched, besides the index.
    let arm64 = &img.platforms[1];
    assert_eq!(srv.hits(&path_of(&arm64.2)), 0);
    assert_eq!(srv.log().len(), 4, "{:?}", srv.log());

    // The same image put straight into another fixture's store (no fetch) bakes the same
    // archive: what reaches the node does not depend on the mirror it came through.
    let fx2 = bake_support::fixture(bake_support::Bins::Real);
    registry::store_layout(&img.layout, &fx2.store);
    pin_in_fixture_lock(&fx2, &img);
    assert!(
        fetched == bake_ubuntu_archive(&fx2, &[]),
        "the archive differs"
    );
}

/// Adds an `[[image]]` pinning `img` to the bake fixture's own (unsigned) lock.
fn pin_in_fixture_lock(fx: &bake_support::Fixture, img: &TestImage) {
    let text = std::fs::read_to_string(&fx.lock).unwrap();
    let entry = registry::image_entry(REFERENCE, img);
    std::fs::write(&fx.lock, format!("{text}\n{entry}")).unwrap();
}

/// Bakes the ubuntu rootfs layer (amd64) from the bake fixture with `extra` arguments and
/// returns the bytes of its `usr/share/kiln/images/pause.oci.tar`.
fn bake_ubuntu_archive(fx: &bake_support::Fixture, extra: &[&str]) -> Vec<u8> {
    use bake_support::{bake_cli, ok, repo};
    let out = fx.dir.path().join("out");
    let o = bake_cli(
        fx,
        &repo().join("images/ubuntu.toml"),
        "rootfs",
        "amd64",
        &out,
        extra,
    );
    ok(&o, "bake");
    let scratch = fx.dir.path();
    let layer = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".tar.zst"))
        .unwrap();
    let root = scratch.join("extracted");
    std::fs::create_dir_all(&root).unwrap();
    let o = std::process::Command::new("tar")
        .arg("--zstd")
        .arg("-xf")
        .arg(&layer)
        .arg("-C")
        .arg(&root)
        .arg("usr/share/kiln/images/pause.oci.tar")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    std::fs::read(root.join("usr/share/kiln/images/pause.oci.tar")).unwrap()
}

#[test]
fn a_mirror_lacking_blobs_falls_through_to_the_next_and_mirror_sync_copies_images() {
    let fx = fixture();
    let srv = serve(&fx.img.layout);
    // The first mirror has the index only: what it lacks is asked of the second.
    let partial = fx.dir.path().join("partial-mirror");
    std::fs::create_dir_all(partial.join("blobs/sha256")).unwrap();
    let index = hex(&fx.img.index_digest);
    std::fs::copy(
        fx.img.layout.join("blobs/sha256").join(index),
        partial.join("blobs/sha256").join(index),
    )
    .unwrap();
    let cache = fx.dir.path().join("cache");
    let o = fetch_from(&fx, &cache, &[partial.to_str().unwrap(), &srv.base()]);
    assert!(o.status.success(), "{}", support::out_text(&o));
    assert_pinned_only(&fx, &cache);
    // The index came from the first mirror, so the second was never asked for it.
    assert_eq!(srv.hits(&path_of(&fx.img.index_digest)), 0);

    // `mirror sync --from URL` carries the images into a new mirror directory.
    let m = fx.dir.path().join("mirror2");
    let o = support::run(
        support::kiln()
            .args(["mirror", "sync", "--backoff-ms", "10"])
            .arg("--to")
            .arg(&m)
            .arg("--lock")
            .arg(&fx.lock)
            .arg("--trusted-key")
            .arg(&fx.pk)
            .args(["--from", &srv.base()]),
    );
    assert!(o.status.success(), "{}", support::out_text(&o));
    assert_pinned_only(&fx, &m);
    assert!(m.join("artifacts.lock").is_file());
}

#[test]
fn an_endless_index_is_cut_at_the_manifest_bound_over_http_and_from_a_directory() {
    let fx = fixture();
    // Over HTTP: 5 MiB where the index should be (over the 4 MiB bound for a document no
    // parent states the size of).
    let srv = Server::start();
    srv.add(&path_of(&fx.img.index_digest), support::noise(5 << 20, 9));
    let cache = fx.dir.path().join("cache");
    let o = fetch(&fx, &cache, &srv.base());
    let text = support::out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains("expected 4194304 bytes, received more"),
        "{text}"
    );
    assert!(text.contains(&srv.base()), "{text}");
    assert!(!cache
        .join("blobs/sha256")
        .join(hex(&fx.img.index_digest))
        .exists());
    assert_eq!(srv.log().len(), 1, "nothing asked past the index");

    // From a directory: a sparse 64 GiB file in its place is read only up to the bound.
    let dir = fx.dir.path().join("huge-mirror");
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    let f =
        std::fs::File::create(dir.join("blobs/sha256").join(hex(&fx.img.index_digest))).unwrap();
    f.set_len(64 << 30).unwrap();
    let cache2 = fx.dir.path().join("cache2");
    let t = std::time::Instant::now();
    let o = fetch(&fx, &cache2, dir.to_str().unwrap());
    let text = support::out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(text.contains("received more"), "{text}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t.elapsed()
    );
    assert!(!cache2
        .join("blobs/sha256")
        .join(hex(&fx.img.index_digest))
        .exists());
}

#[test]
fn a_fifo_in_a_mirror_directory_is_named_never_read() {
    let fx = fixture();
    let dir = fx.dir.path().join("fifo-mirror");
    copy_dir(&fx.img.layout, &dir);
    let layer = dir.join("blobs/sha256").join(hex(amd64_layer(&fx.img)));
    std::fs::remove_file(&layer).unwrap();
    let st = std::process::Command::new("mkfifo")
        .arg(&layer)
        .status()
        .unwrap();
    assert!(st.success());
    let cache = fx.dir.path().join("cache");
    let t = std::time::Instant::now();
    let o = fetch(&fx, &cache, dir.to_str().unwrap());
    let text = support::out_text(&o);
    assert!(!o.status.success(), "{text}");
    assert!(text.contains("not a regular file"), "{text}");
    assert!(text.contains(&layer.display().to_string()), "{text}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        t.elapsed()
    );
    all_blobs_honest(&cache);
}
