//! The rootfs overlay as independent zstd frames: real `zstd` and `tar` read it, it
//! decompresses to exactly the tar stream, and its bytes are the same whatever the thread
//! count and whatever the chunk cache held (empty, warm, corrupt, shared by concurrent bakes).

use crate::bake_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use bake_support::*;
use kiln::bake::chunk_cache::ChunkCache;
use kiln::bake::rootfs::{self, Framing, RootfsOptions};
use kiln::bake::{Data, Entry, Layer, Node, Origin};
use kiln::image_def::{Arch, Format, Os};
use sha2::{Digest, Sha256};

/// Small frames so that a test layer of a few hundred KiB has many of them.
const SMALL: Framing = Framing {
    chunk: 64 << 10,
    big: 16 << 10,
};

/// Deterministic, moderately compressible bytes.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|i| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if i % 7 < 3 {
                (x >> 59) as u8
            } else {
                b"kiln layer "[i % 11]
            }
        })
        .collect()
}

fn file_node(data: Data, content: &[u8]) -> Node {
    Node::File {
        data,
        mode: 0o755,
        size: content.len() as u64,
        sha256: hex::encode(Sha256::digest(content)),
        sha1: String::new(),
    }
}

/// A layer whose files sit on disk in `dir`: sizes around the tar block, the big-file
/// threshold and the chunk size, a path too long for a ustar header, a symlink.
fn test_layer(dir: &Path, variant: u64) -> (Layer, BTreeMap<String, Vec<u8>>) {
    let sizes: &[(&str, usize)] = &[
        ("usr/bin/empty", 0),
        ("usr/bin/tiny", 100),
        ("usr/bin/block", 512),
        ("usr/bin/block1", 513),
        ("usr/bin/just-big", SMALL.big as usize),
        ("usr/bin/one-chunk", SMALL.chunk as usize),
        ("usr/bin/kubelet", 3 * SMALL.chunk as usize + 1),
        ("usr/bin/odd", 200_003),
        ("usr/libexec/cni/a-very-long-directory-name-for-a-plugin/that-goes-on-and-on/and-on-beyond-one-hundred-bytes/bridge", 40_000),
    ];
    let mut entries = BTreeMap::new();
    let mut want = BTreeMap::new();
    let mut dirs = vec!["usr".to_string()];
    for (i, (path, n)) in sizes.iter().enumerate() {
        // `variant` changes only kubelet's bytes: an upgrade.
        let seed = if *path == "usr/bin/kubelet" {
            100 + variant
        } else {
            i as u64
        };
        let content = bytes(seed, *n);
        let f = dir.join(format!("file-{i}-{variant}"));
        std::fs::write(&f, &content).unwrap();
        let mut p = String::new();
        for c in path.split('/').take(path.split('/').count() - 1) {
            if !p.is_empty() {
                p.push('/');
            }
            p.push_str(c);
            dirs.push(p.clone());
        }
        entries.insert(
            path.to_string(),
            Entry {
                node: file_node(Data::File(f), &content),
                origin: Origin::Kiln("test".into()),
            },
        );
        want.insert(path.to_string(), content);
    }
    for d in dirs {
        entries.insert(
            d,
            Entry {
                node: Node::Dir,
                origin: Origin::Kiln("directory".into()),
            },
        );
    }
    let text = b"KILN_IMAGE_ID=sha256:test\n".to_vec();
    entries.insert(
        "usr/lib/kiln/image.env".into(),
        Entry {
            node: file_node(Data::Inline(text.clone()), &text),
            origin: Origin::Kiln("image facts".into()),
        },
    );
    want.insert("usr/lib/kiln/image.env".into(), text);
    for d in ["usr/lib", "usr/lib/kiln", "etc", "etc/systemd"] {
        entries.insert(
            d.into(),
            Entry {
                node: Node::Dir,
                origin: Origin::Kiln("directory".into()),
            },
        );
    }
    entries.insert(
        "etc/systemd/kubelet-link".into(),
        Entry {
            node: Node::Symlink("/usr/bin/kubelet".into()),
            origin: Origin::Kiln("test".into()),
        },
    );
    let layer = Layer {
        name: "frames".into(),
        os: Os::Linux,
        arch: Arch::Amd64,
        format: Format::Rootfs,
        kubernetes_version: "v1.30.0-test".into(),
        epoch: 1_704_067_200,
        image_id: "sha256:test".into(),
        entries,
        artifacts: Vec::new(),
        images: Vec::new(),
    };
    (layer, want)
}

fn write(
    layer: &Layer,
    out: &Path,
    threads: u32,
    cache: Option<&ChunkCache>,
) -> rootfs::RootfsReport {
    let report = rootfs::write(
        layer,
        out,
        &RootfsOptions {
            threads,
            cache,
            framing: SMALL,
        },
    )
    .unwrap();
    // The digest taken while writing (what SHA256SUMS gets) is the file's on disk.
    let on_disk: [u8; 32] = Sha256::digest(std::fs::read(out).unwrap()).into();
    assert_eq!(report.sha256, on_disk, "{out:?}");
    report
}

fn tool(c: &mut Command) -> Vec<u8> {
    let out = c.output().unwrap();
    ok(&out, &format!("{c:?}"));
    out.stdout
}

#[test]
fn frames_are_one_zstd_stream_that_real_tools_read() {
    let d = tempfile::tempdir().unwrap();
    let (layer, want) = test_layer(d.path(), 0);
    let out = d.path().join("frames.tar.zst");
    let report = write(&layer, &out, 2, None);

    // kubelet: 4 chunks; one-chunk, just-big, odd (4), long-path bridge (1): 11 in all.
    assert_eq!(report.chunk_frames, 4 + 1 + 1 + 4 + 1, "{report:?}");
    assert!(report.frames > report.chunk_frames, "{report:?}");
    assert_eq!(report.cache, None);
    let listing = String::from_utf8(tool(Command::new("zstd").arg("-lv").arg(&out))).unwrap();
    assert!(
        listing.contains(&format!("# Zstandard Frames: {}", report.frames)),
        "{listing}"
    );
    assert!(listing.contains("Check: XXH64"), "{listing}");
    tool(Command::new("zstd").arg("-tq").arg(&out));

    // It decompresses to exactly the tar stream kiln describes.
    let mut tar_bytes = Vec::new();
    rootfs::write_tar(&layer, &mut tar_bytes).unwrap();
    let decoded = tool(Command::new("zstd").arg("-dcq").arg(&out));
    assert!(
        decoded == tar_bytes,
        "zstd -d output differs from the tar stream"
    );

    // tar lists every entry, with owners, modes and the epoch.
    let list = String::from_utf8(tool(
        Command::new("tar")
            .env("TZ", "UTC")
            .arg("--zstd")
            .arg("-tvf")
            .arg(&out),
    ))
    .unwrap();
    assert_eq!(list.lines().count(), layer.entries.len(), "{list}");
    for line in list.lines() {
        assert!(
            line.contains("root/root") && line.contains("2024-01-01 00:00"),
            "{line}"
        );
    }
    let kubelet: Vec<&str> = list
        .lines()
        .find(|l| l.ends_with(" usr/bin/kubelet"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        kubelet[..3],
        ["-rwxr-xr-x", "root/root", "196609"],
        "{list}"
    );

    // Both ways of calling zstd from tar extract byte-identical files.
    for how in [&["--zstd", "-xf"][..], &["-I", "zstd", "-xf"][..]] {
        let x = tempfile::tempdir().unwrap();
        tool(
            Command::new("tar")
                .args(how)
                .arg(&out)
                .arg("-C")
                .arg(x.path()),
        );
        for (path, content) in &want {
            let got = std::fs::read(x.path().join(path)).unwrap();
            assert!(&got == content, "{how:?}: {path} differs after extraction");
        }
        let link = std::fs::read_link(x.path().join("etc/systemd/kubelet-link")).unwrap();
        assert_eq!(link, PathBuf::from("/usr/bin/kubelet"));
    }
}

#[test]
fn bytes_do_not_depend_on_threads_or_on_the_cache() {
    let d = tempfile::tempdir().unwrap();
    let (layer, _) = test_layer(d.path(), 0);
    let o = |n: &str| d.path().join(n);
    let reference = o("ref.tar.zst");
    let report = write(&layer, &reference, 1, None);
    let want = sha256_file(&reference);
    for t in [2, 3, 8] {
        write(&layer, &o("t.tar.zst"), t, None);
        assert_eq!(sha256_file(&o("t.tar.zst")), want, "{t} threads");
    }

    let cache = ChunkCache::new(&o("cache"));
    // Cold: every chunk is compressed and stored.
    let cold = write(&layer, &o("cold.tar.zst"), 2, Some(&cache));
    let s = cold.cache.unwrap();
    assert_eq!(
        (s.hits, s.misses, s.stored),
        (0, report.chunk_frames, report.chunk_frames),
        "{s:?}"
    );
    assert_eq!(sha256_file(&o("cold.tar.zst")), want);
    // Warm: every chunk comes from the cache, same bytes.
    let warm = write(&layer, &o("warm.tar.zst"), 3, Some(&cache));
    let s = warm.cache.unwrap();
    assert_eq!(
        (s.hits, s.misses, s.stored),
        (report.chunk_frames, 0, 0),
        "{s:?}"
    );
    assert_eq!(sha256_file(&o("warm.tar.zst")), want);

    // Upgrade: only kubelet's bytes changed, so only its 4 chunks are compressed again.
    let (layer2, _) = test_layer(d.path(), 1);
    let up = write(&layer2, &o("up.tar.zst"), 2, Some(&cache));
    let s = up.cache.unwrap();
    assert_eq!((s.hits, s.misses), (report.chunk_frames - 4, 4), "{s:?}");
    write(&layer2, &o("up-fresh.tar.zst"), 2, None);
    assert_eq!(
        sha256_file(&o("up.tar.zst")),
        sha256_file(&o("up-fresh.tar.zst"))
    );
}

fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for sub in std::fs::read_dir(dir).unwrap() {
        for e in std::fs::read_dir(sub.unwrap().path()).unwrap() {
            v.push(e.unwrap().path());
        }
    }
    v.sort();
    v
}

#[test]
fn corrupt_entries_are_compressed_again_and_never_reach_the_output() {
    let d = tempfile::tempdir().unwrap();
    let (layer, _) = test_layer(d.path(), 0);
    let o = |n: &str| d.path().join(n);
    let cache = ChunkCache::new(&o("cache"));
    let first = write(&layer, &o("a.tar.zst"), 2, Some(&cache));
    let want = sha256_file(&o("a.tar.zst"));
    let files = entries(cache.dir());
    assert_eq!(files.len() as u64, first.chunk_frames);
    assert!(
        files.iter().all(|p| p.extension().unwrap() == "chunk"),
        "{files:?}"
    );

    // Flip a payload byte in one entry, truncate another, swap the payloads of two more
    // (each keeps a well-formed header whose digest no longer matches).
    let mut a = std::fs::read(&files[0]).unwrap();
    let n = a.len();
    a[n - 1] ^= 0x40;
    std::fs::write(&files[0], &a).unwrap();
    let b = std::fs::read(&files[1]).unwrap();
    std::fs::write(&files[1], &b[..b.len() / 2]).unwrap();
    let (c, e) = (
        std::fs::read(&files[2]).unwrap(),
        std::fs::read(&files[3]).unwrap(),
    );
    std::fs::write(&files[2], [&c[..80], &e[80..]].concat()).unwrap();
    std::fs::write(&files[3], [&e[..80], &c[80..]].concat()).unwrap();

    let again = write(&layer, &o("b.tar.zst"), 2, Some(&cache));
    let s = again.cache.unwrap();
    assert_eq!((s.corrupt, s.stored), (4, 4), "{s:?}");
    assert_eq!(s.hits, first.chunk_frames - 4, "{s:?}");
    assert_eq!(
        sha256_file(&o("b.tar.zst")),
        want,
        "a bad entry reached the output"
    );
    tool(Command::new("zstd").arg("-tq").arg(o("b.tar.zst")));

    // The bad entries were replaced: a third write is all hits.
    let third = write(&layer, &o("c.tar.zst"), 2, Some(&cache));
    assert_eq!(third.cache.unwrap().hits, first.chunk_frames);
    assert_eq!(sha256_file(&o("c.tar.zst")), want);
}

#[test]
fn a_file_that_shrank_after_hashing_fails_the_bake_by_name() {
    let d = tempfile::tempdir().unwrap();
    let (mut layer, _) = test_layer(d.path(), 0);
    let Node::File {
        data: Data::File(p),
        ..
    } = &layer.entries["usr/bin/kubelet"].node
    else {
        panic!("kubelet is a file")
    };
    let p = p.clone();
    std::fs::write(&p, bytes(1, 70_000)).unwrap();
    layer.name = "shrunk".into();
    let out = d.path().join("out.tar.zst");
    let e = rootfs::write(
        &layer,
        &out,
        &RootfsOptions {
            threads: 2,
            cache: None,
            framing: SMALL,
        },
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains(&p.display().to_string()), "{e}");
    assert!(
        e.contains("expected 196609 bytes") && e.contains("found 70000"),
        "{e}"
    );
    assert!(!out.exists(), "a failed write left {out:?}");
    let leftovers: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".kiln-"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
}

#[test]
fn concurrent_bakes_share_one_chunk_cache() {
    let fx = fixture(Bins::Real);
    let d = fx.dir.path();
    let image = repo().join("images/ubuntu.toml");
    let cache = d.join("shared-cache");
    let bake = |out: &Path, threads: &str, cache: Option<&Path>| {
        let mut c = kiln();
        c.arg("bake")
            .arg(&image)
            .args([
                "--format",
                "rootfs",
                "--arch",
                "amd64",
                "--threads",
                threads,
                "--out",
            ])
            .arg(out)
            .arg("--lock")
            .arg(&fx.lock)
            .arg("--allow-unsigned")
            .arg("--store")
            .arg(&fx.store)
            .arg("--firstboot")
            .arg(&fx.firstboot)
            .env("SOURCE_DATE_EPOCH", "1704067200");
        match cache {
            Some(p) => c.arg("--cache").arg(p),
            None => c.arg("--no-cache"),
        };
        c.spawn().unwrap()
    };
    let reference = d.join("ref");
    ok(
        &bake(&reference, "0", None).wait_with_output().unwrap(),
        "bake --no-cache",
    );
    let name = format!("ubuntu-{}-amd64.tar.zst", kube_version());
    let want = sha256_file(&reference.join(&name));
    // Twice: the first round races on an empty cache, the second on a full one.
    for round in 0..2 {
        let outs: Vec<PathBuf> = (0..3).map(|i| d.join(format!("r{round}-{i}"))).collect();
        let children: Vec<_> = outs
            .iter()
            .enumerate()
            .map(|(i, o)| bake(o, &(i + 1).to_string(), Some(&cache)))
            .collect();
        for c in children {
            ok(&c.wait_with_output().unwrap(), "concurrent bake");
        }
        for o in &outs {
            assert_eq!(sha256_file(&o.join(&name)), want, "round {round}: {o:?}");
        }
    }
    let chunks = ChunkCache::new(&cache);
    let files = entries(chunks.dir());
    assert!(
        !files.is_empty(),
        "the fixture's big binaries left no chunks"
    );
    for f in &files {
        let n = f.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            n.ends_with(".chunk") && !n.starts_with('.'),
            "stray file {f:?}"
        );
    }
}
