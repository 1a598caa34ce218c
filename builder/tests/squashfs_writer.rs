//! kiln's squashfs writer against the real readers: `unsquashfs` (listing, superblock,
//! extraction), squashfs-tools-ng's `rdsquashfs`/`sqfs2tar` as a second, stricter reader,
//! the Linux kernel itself when this machine lets the test loop-mount (root), and
//! `mksquashfs` packing the same tree as the reference for what the tree must look like.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use kiln::bake::squashfs::{self, Codec, Options, SquashError, BLOCK_SIZE};
use kiln::bake::{Data, Node};
use sha2::{Digest, Sha256};

#[path = "../../testkit/optout.rs"]
mod optout;

const EPOCH: u64 = 1_704_067_200;

/// A tree entry as the test builds it.
struct Tree {
    entries: BTreeMap<String, Node>,
    /// Kept alive for `Data::File` sources.
    _dir: tempfile::TempDir,
}

fn file(data: Data, bytes: &[u8], mode: u32) -> Node {
    Node::File {
        data,
        mode,
        size: bytes.len() as u64,
        sha256: hex::encode(Sha256::digest(bytes)),
        sha1: String::new(),
    }
}

/// Deterministic bytes that zstd cannot shrink.
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Compressible but distinct text.
fn text(n: usize, tag: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    let mut i = 0;
    while v.len() < n {
        v.extend_from_slice(format!("{tag} line {i} of a kiln test file\n").as_bytes());
        i += 1;
    }
    v.truncate(n);
    v
}

/// The edge cases: empty file, exactly one block, block + 1, a sparse block, incompressible
/// blocks, duplicates, many small files over several fragment blocks, a directory with more
/// than 256 entries and one whose listing spans metadata blocks (indexed), deep paths,
/// symlinks, empty directories, odd modes.
fn edge_tree() -> Tree {
    let dir = tempfile::tempdir().unwrap();
    let mut e = BTreeMap::new();
    let add_dir = |e: &mut BTreeMap<String, Node>, p: &str| {
        let mut acc = String::new();
        for c in p.split('/') {
            if !acc.is_empty() {
                acc.push('/');
            }
            acc.push_str(c);
            e.entry(acc.clone()).or_insert(Node::Dir);
        }
    };
    let on_disk = |name: &str, bytes: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        Data::File(p)
    };
    add_dir(&mut e, "usr/bin");
    add_dir(&mut e, "usr/lib/empty");
    let bs = BLOCK_SIZE as usize;
    let cases: Vec<(&str, Vec<u8>, u32)> = vec![
        ("usr/bin/empty", Vec::new(), 0o644),
        ("usr/bin/one-block", text(bs, "one"), 0o755),
        ("usr/bin/block-plus-one", text(bs + 1, "plus"), 0o755),
        ("usr/bin/two-blocks-exact", noise(2 * bs, 7), 0o700),
        ("usr/bin/noise-and-tail", noise(3 * bs + 999, 9), 0o755),
        ("usr/bin/setuid", text(10, "s"), 0o4755),
        (
            "usr/bin/sparse",
            [text(1000, "head"), vec![0; 2 * bs], text(bs + 5, "tail")].concat(),
            0o644,
        ),
        ("usr/bin/dup-a", text(bs + 77, "dup"), 0o755),
        ("usr/bin/dup-b", text(bs + 77, "dup"), 0o700),
    ];
    for (p, b, mode) in cases {
        let data = on_disk(p.rsplit('/').next().unwrap(), &b);
        e.insert(p.into(), file(data, &b, mode));
    }
    // 300 small files, ~3 KiB each: 900 KiB of tails, several fragment blocks.
    add_dir(&mut e, "usr/share/many");
    for i in 0..300 {
        let b = text(2000 + i * 7, &format!("small {i}"));
        e.insert(
            format!("usr/share/many/f{i:03}"),
            file(Data::Inline(b.clone()), &b, 0o644),
        );
    }
    // 1500 entries with long names: listing > 8 KiB (extended inode with an index), many
    // headers; files, symlinks and subdirectories mixed.
    add_dir(&mut e, "usr/share/big");
    for i in 0..1500 {
        let name = format!("usr/share/big/entry-{i:05}-{}", "x".repeat(i % 60));
        match i % 10 {
            0 => {
                e.insert(name, Node::Dir);
            }
            1 => {
                e.insert(name, Node::Symlink(format!("../many/f{:03}", i % 300)));
            }
            _ => {
                let b = format!("{i}\n").into_bytes();
                e.insert(name, file(Data::Inline(b.clone()), &b, 0o644));
            }
        }
    }
    // A deep path, and names at the length limit.
    let deep: Vec<String> = (0..40).map(|i| format!("d{i}")).collect();
    let deep = format!("usr/deep/{}", deep.join("/"));
    add_dir(&mut e, &deep);
    let b = text(300, "deep");
    e.insert(
        format!("{deep}/leaf"),
        file(Data::Inline(b.clone()), &b, 0o644),
    );
    let long = format!("usr/lib/{}", "n".repeat(255));
    let b = text(5, "long");
    e.insert(long, file(Data::Inline(b.clone()), &b, 0o644));
    e.insert(
        "usr/lib/abs-link".into(),
        Node::Symlink("/usr/bin/one-block".into()),
    );
    e.insert(
        "usr/lib/rel-link".into(),
        Node::Symlink("../bin/dup-a".into()),
    );
    Tree {
        entries: e,
        _dir: dir,
    }
}

fn opts(threads: usize, cache: Option<&Path>) -> Options {
    Options {
        codec: Codec::zstd(15),
        threads,
        cache: cache.map(Path::to_path_buf),
        scratch_cache: false,
    }
}

fn write(tree: &Tree, out: &Path, o: &Options) -> squashfs::Summary {
    squashfs::write_file(
        tree.entries.iter().map(|(p, n)| (p.as_str(), n)),
        EPOCH,
        out,
        o,
    )
    .unwrap()
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn sha(p: &Path) -> String {
    hex::encode(Sha256::digest(std::fs::read(p).unwrap()))
}

fn bytes_of(n: &Node) -> Vec<u8> {
    match n {
        Node::File {
            data: Data::Inline(b),
            ..
        } => b.clone(),
        Node::File {
            data: Data::File(p),
            ..
        } => std::fs::read(p).unwrap(),
        _ => unreachable!(),
    }
}

/// Checks an extracted tree against the entries: types, modes, bytes, link targets, and
/// nothing more.
fn check_extracted(root: &Path, tree: &Tree) {
    let mut seen = 0;
    for (p, n) in &tree.entries {
        let path = root.join(p);
        let md = std::fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{p}: {e}"));
        match n {
            Node::Dir => assert!(md.is_dir(), "{p}"),
            Node::Symlink(t) => {
                assert!(md.file_type().is_symlink(), "{p}");
                assert_eq!(std::fs::read_link(&path).unwrap(), PathBuf::from(t), "{p}");
            }
            Node::File { mode, .. } => {
                assert!(md.is_file(), "{p}");
                assert_eq!(md.permissions().mode() & 0o7777, *mode, "{p}");
                assert!(
                    std::fs::read(&path).unwrap() == bytes_of(n),
                    "{p}: contents differ"
                );
            }
        }
        seen += 1;
    }
    let count = walkdir_count(root);
    assert_eq!(count, seen, "extracted tree has other entries");
}

fn walkdir_count(root: &Path) -> usize {
    let mut n = 0;
    for e in std::fs::read_dir(root).unwrap() {
        let e = e.unwrap();
        n += 1;
        if e.file_type().unwrap().is_dir() {
            n += walkdir_count(&e.path());
        }
    }
    n
}

/// Stages the tree on disk for mksquashfs.
fn stage(tree: &Tree, root: &Path) {
    std::fs::create_dir_all(root).unwrap();
    for (p, n) in &tree.entries {
        let dst = root.join(p);
        match n {
            Node::Dir => std::fs::create_dir_all(&dst).unwrap(),
            Node::Symlink(t) => std::os::unix::fs::symlink(t, &dst).unwrap(),
            Node::File { mode, .. } => {
                std::fs::write(&dst, bytes_of(n)).unwrap();
                std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(*mode)).unwrap();
            }
        }
    }
    for (p, n) in &tree.entries {
        if matches!(n, Node::Dir) {
            std::fs::set_permissions(root.join(p), std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn unsquashfs_reads_every_edge_case_like_mksquashfs_writes_it() {
    let t = tempfile::tempdir().unwrap();
    let tree = edge_tree();
    let img = t.path().join("kiln.raw");
    let s = write(&tree, &img, &opts(2, None));
    assert_eq!(std::fs::metadata(&img).unwrap().len() % 4096, 0);
    assert!(s.fragments >= 3, "{s:?}");

    // The superblock as unsquashfs reads it.
    let sb = run(Command::new("unsquashfs").arg("-s").arg(&img));
    for want in [
        "Filesystem size",
        "Compression zstd",
        "Block size 131072",
        "Xattrs are not stored",
        "Number of ids 1",
    ] {
        assert!(sb.contains(want), "unsquashfs -s lacks {want:?}:\n{sb}");
    }
    assert!(
        sb.contains(&format!("Number of inodes {}", tree.entries.len() + 1)),
        "{sb}"
    );
    assert!(
        sb.contains(&format!("Number of fragments {}", s.fragments)),
        "{sb}"
    );

    // Extraction is byte-identical to the tree.
    let x = t.path().join("x");
    run(Command::new("unsquashfs")
        .args(["-q", "-no-xattrs", "-d"])
        .arg(&x)
        .arg(&img));
    check_extracted(&x, &tree);

    // mksquashfs packing the same tree gives the very same listing (paths, modes, owners,
    // sizes, times, link targets).
    let root = t.path().join("root");
    stage(&tree, &root);
    let reference = t.path().join("mksquashfs.raw");
    let epoch = EPOCH.to_string();
    run(Command::new("mksquashfs")
        .env_remove("SOURCE_DATE_EPOCH")
        .arg(&root)
        .arg(&reference)
        .args([
            "-noappend",
            "-quiet",
            "-no-progress",
            "-no-xattrs",
            "-all-root",
        ])
        .args(["-mkfs-time", &epoch, "-all-time", &epoch])
        .args(["-comp", "zstd", "-b", "131072"]));
    let ours = run(Command::new("unsquashfs").arg("-lln").arg(&img));
    let theirs = run(Command::new("unsquashfs").arg("-lln").arg(&reference));
    // Directory sizes are listing lengths, which depend on how entries are grouped under
    // headers; everything else must match.
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let size = if l.starts_with('d') { "-" } else { f[2] };
                format!("{} {} {} {}", f[0], f[1], size, f[3..].join(" "))
            })
            .collect()
    };
    let (a, b) = (strip(&ours), strip(&theirs));
    let diff: Vec<_> = a.iter().zip(&b).filter(|(x, y)| x != y).take(5).collect();
    assert!(
        diff.is_empty() && a.len() == b.len(),
        "{} vs {} lines; first differences: {diff:#?}",
        a.len(),
        b.len()
    );
    assert!(ours
        .lines()
        .all(|l| l.split_whitespace().nth(1) == Some("0/0")));

    // squashfs-tools-ng reads it too (its own parser, stricter on table bounds): the tar
    // stream sqfs2tar makes of it holds the tree exactly.
    let listing = run(Command::new("rdsquashfs")
        .args(["-l", "/usr/share/big"])
        .arg(&img));
    assert_eq!(listing.lines().count(), 1500, "{listing}");
    let out = Command::new("sqfs2tar")
        .arg("--no-skip")
        .arg(&img)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sqfs2tar: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check_tar(&out.stdout, &tree);
}

fn check_tar(tar_bytes: &[u8], tree: &Tree) {
    let mut seen = 0;
    let mut a = tar::Archive::new(tar_bytes);
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e
            .path()
            .unwrap()
            .to_string_lossy()
            .trim_end_matches('/')
            .to_string();
        let n = tree
            .entries
            .get(&path)
            .unwrap_or_else(|| panic!("sqfs2tar: unexpected {path}"));
        let h = e.header().clone();
        assert_eq!(h.uid().unwrap(), 0, "{path}");
        assert_eq!(h.mtime().unwrap(), EPOCH, "{path}");
        match n {
            Node::Dir => assert!(h.entry_type().is_dir(), "{path}"),
            Node::Symlink(t) => {
                assert!(h.entry_type().is_symlink(), "{path}");
                assert_eq!(
                    e.link_name().unwrap().unwrap().to_string_lossy(),
                    t.as_str()
                );
            }
            Node::File { mode, .. } => {
                assert!(h.entry_type().is_file(), "{path}");
                assert_eq!(h.mode().unwrap() & 0o7777, *mode, "{path}");
                let mut got = Vec::new();
                std::io::Read::read_to_end(&mut e, &mut got).unwrap();
                assert!(got == bytes_of(n), "{path}: contents differ");
            }
        }
        seen += 1;
    }
    assert_eq!(seen, tree.entries.len());
}

/// Loop-mounts an image read-only; unmounts on drop.
struct Mount(PathBuf);

/// What keeps this machine from loop-mounting at all, before anything is tried: a refusal by
/// the environment is told apart from the kernel rejecting kiln's image.
fn loop_mount_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("loop mounts need root".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control does not exist (no loop devices)".into());
    }
    None
}

impl Mount {
    /// Mounts `img` at `at`. `Err(reason)` when the environment refused the mount system
    /// call itself (EPERM); any other failure is the kernel rejecting the image and panics.
    fn new(img: &Path, at: &Path) -> Result<Mount, String> {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-o", "loop,ro", "-t", "squashfs"])
            .arg(img)
            .arg(at)
            .output()
            .expect("mount(8) could not be started (util-linux)");
        if out.status.success() {
            return Ok(Mount(at.to_path_buf()));
        }
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        if err.contains("Operation not permitted") || err.contains("permission denied") {
            return Err(format!(
                "mount was refused by the environment: {}",
                err.trim()
            ));
        }
        panic!(
            "the kernel refused to mount kiln's squashfs image {}: {}",
            img.display(),
            err.trim()
        );
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn the_kernel_reads_it_where_the_test_may_mount() {
    let t = tempfile::tempdir().unwrap();
    let tree = edge_tree();
    let img = t.path().join("kiln.raw");
    write(&tree, &img, &opts(2, None));
    if let Some(why) = loop_mount_unavailable() {
        return optout::cannot_run("loop-mount", &why);
    }
    let m = match Mount::new(&img, &t.path().join("mnt")) {
        Ok(m) => m,
        Err(why) => return optout::cannot_run("loop-mount", &why),
    };
    check_extracted(&m.0, &tree);
    // Lookups by name go through the directory index in the big directory.
    for i in [0usize, 1, 2, 777, 1499] {
        let p =
            m.0.join(format!("usr/share/big/entry-{i:05}-{}", "x".repeat(i % 60)));
        assert!(std::fs::symlink_metadata(&p).is_ok(), "{}", p.display());
    }
    assert!(std::fs::symlink_metadata(m.0.join("usr/share/big/entry-00002-y")).is_err());
    let st = std::fs::metadata(m.0.join("usr/share/big")).unwrap();
    // nlink = 2 + subdirectories.
    assert_eq!(std::os::unix::fs::MetadataExt::nlink(&st), 2 + 150);
    assert_eq!(std::os::unix::fs::MetadataExt::mtime(&st), EPOCH as i64);
}

#[test]
fn same_bytes_whatever_the_threads_and_the_cache() {
    let t = tempfile::tempdir().unwrap();
    let tree = edge_tree();
    let one = t.path().join("one.raw");
    let four = t.path().join("four.raw");
    write(&tree, &one, &opts(1, None));
    write(&tree, &four, &opts(4, None));
    assert_eq!(sha(&one), sha(&four));

    let cache = t.path().join("cache");
    let cold = t.path().join("cold.raw");
    let s = write(&tree, &cold, &opts(3, Some(&cache)));
    assert_eq!(s.cache_hits, 0);
    assert_eq!(sha(&cold), sha(&one));
    let warm = t.path().join("warm.raw");
    let s = write(&tree, &warm, &opts(2, Some(&cache)));
    // Every distinct content with a full block: one-block, block-plus-one, two-blocks,
    // noise-and-tail, sparse, dup (once).
    assert_eq!(s.cache_hits, 6, "{s:?}");
    assert_eq!(sha(&warm), sha(&one));
}

fn cache_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            v.extend(cache_entries(&p));
        } else {
            v.push(p);
        }
    }
    v.sort();
    v
}

#[test]
fn a_corrupt_or_torn_cache_entry_never_makes_a_bad_image() {
    let t = tempfile::tempdir().unwrap();
    let tree = edge_tree();
    let cache = t.path().join("cache");
    let good = t.path().join("good.raw");
    write(&tree, &good, &opts(2, Some(&cache)));
    let entries = cache_entries(&cache);
    assert_eq!(entries.len(), 6, "{entries:?}");
    // Flip a byte in the data of one entry, truncate another, empty a third.
    let mut b = std::fs::read(&entries[0]).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x55;
    std::fs::write(&entries[0], &b).unwrap();
    let b = std::fs::read(&entries[1]).unwrap();
    std::fs::write(&entries[1], &b[..b.len() - 40]).unwrap();
    std::fs::write(&entries[2], b"").unwrap();
    let again = t.path().join("again.raw");
    let s = write(&tree, &again, &opts(2, Some(&cache)));
    // The flipped entry passes the length checks, is copied, caught by its digest and taken
    // back; the torn and empty ones are not used at all.
    assert_eq!(s.cache_hits, 3, "{s:?}");
    assert_eq!(sha(&again), sha(&good));
    // The bad entries were replaced by good ones.
    let third = t.path().join("third.raw");
    let s = write(&tree, &third, &opts(2, Some(&cache)));
    assert_eq!(s.cache_hits, 6);
    assert_eq!(sha(&third), sha(&good));
}

#[test]
fn another_level_or_codec_writes_its_options_and_reads_back() {
    let t = tempfile::tempdir().unwrap();
    let tree = edge_tree();
    for (codec, name) in [(Codec::zstd(3), "zstd"), (Codec::gzip(9), "gzip")] {
        let img = t.path().join(format!("{name}.raw"));
        let o = Options {
            codec,
            threads: 2,
            cache: None,
            scratch_cache: false,
        };
        write(&tree, &img, &o);
        let sb = run(Command::new("unsquashfs").arg("-s").arg(&img));
        assert!(sb.contains(&format!("Compression {name}")), "{sb}");
        if name == "zstd" {
            assert!(sb.contains("compression-level 3"), "{sb}");
        }
        let out = Command::new("sqfs2tar")
            .arg("--no-skip")
            .arg(&img)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sqfs2tar: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        check_tar(&out.stdout, &tree);
    }
}

#[test]
fn refused_trees_name_the_path_and_leave_no_image() {
    let t = tempfile::tempdir().unwrap();
    let out = t.path().join("x.raw");
    let huge = Node::File {
        data: Data::Inline(Vec::new()),
        mode: 0o644,
        size: 5 << 30,
        sha256: "0".repeat(64),
        sha1: String::new(),
    };
    let dir = Node::Dir;
    let e = squashfs::write_file(
        [("usr", &dir), ("usr/huge", &huge)],
        EPOCH,
        &out,
        &opts(1, None),
    )
    .unwrap_err();
    assert!(matches!(e, SquashError::Unsupported { .. }), "{e}");
    assert!(
        e.to_string().contains("/usr/huge") && e.to_string().contains("4 GiB"),
        "{e}"
    );
    let orphan = squashfs::write_file([("usr/x", &dir)], EPOCH, &out, &opts(1, None)).unwrap_err();
    assert!(orphan.to_string().contains("/usr/x"), "{orphan}");

    // A file that is not what the layer says (it changed after hashing).
    let src = t.path().join("src");
    std::fs::write(&src, vec![1u8; 200_000]).unwrap();
    let lying = Node::File {
        data: Data::File(src.clone()),
        mode: 0o644,
        size: 150_000,
        sha256: "0".repeat(64),
        sha1: String::new(),
    };
    let e = squashfs::write_file(
        [("usr", &dir), ("usr/f", &lying)],
        EPOCH,
        &out,
        &opts(2, None),
    )
    .unwrap_err();
    assert!(matches!(e, SquashError::Changed { .. }), "{e}");
    assert!(e.to_string().contains("expected 150000 bytes"), "{e}");
    let right_size = Node::File {
        data: Data::File(src),
        mode: 0o644,
        size: 200_000,
        sha256: "0".repeat(64),
        sha1: String::new(),
    };
    let cache = t.path().join("cache");
    let e = squashfs::write_file(
        [("usr", &dir), ("usr/f", &right_size)],
        EPOCH,
        &out,
        &opts(2, Some(&cache)),
    )
    .unwrap_err();
    assert!(e.to_string().contains("expected sha256 0000"), "{e}");
    // The block group it had already put in the cache was taken back out.
    assert!(cache_entries(&cache)
        .iter()
        .all(|p| !p.to_string_lossy().ends_with(".chunk")));
    assert!(!out.exists());
    let leftovers: Vec<_> = std::fs::read_dir(t.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".kiln-"))
        .collect();
    assert!(leftovers.is_empty());
}
