//! A corpus of hostile archives, generated here, fed to both readers of archives: every case
//! as a rootfs layer to `kiln install` (with a `SHA256SUMS` that lists it, so the refusal
//! comes from the entry rules, not the checksum) and as an upstream tar.gz to `kiln bake`.
//! Each must be refused naming the entry and the rule, and the whole temp tree — the root,
//! a directory outside it that symlinks point at, the inputs — is listed (paths, types,
//! modes, content hashes, link targets) before and after, and must not change.

use crate::bake_support;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use bake_support::*;
use kiln::bake::{self, ArchiveKind, ArtifactInput, BakeRequest, InputKind, MemberMap};
use kiln::image_def::{Arch, Format, ImageDef};
use sha2::{Digest, Sha256};
use tar::EntryType as T;

const GIB: u64 = 1 << 30;

/// One raw tar entry, written byte by byte (the tar crate's setters refuse hostile names).
#[derive(Clone)]
struct E {
    name: String,
    kind: T,
    link: Option<String>,
    mode: u32,
    data: Vec<u8>,
    /// Size the header declares when it is not the data's (a bomb: the data never follows).
    declared: Option<u64>,
    /// A GNU sparse file of this full size whose data is one 512-byte block at the end.
    sparse: Option<u64>,
}

fn e(name: &str, kind: T) -> E {
    E {
        name: name.into(),
        kind,
        link: None,
        mode: if kind == T::Directory { 0o755 } else { 0o644 },
        data: Vec::new(),
        declared: None,
        sparse: None,
    }
}
fn f(name: &str) -> E {
    E {
        data: b"evil\n".to_vec(),
        ..e(name, T::Regular)
    }
}
fn d(name: &str) -> E {
    e(name, T::Directory)
}
fn l(name: &str, target: &str) -> E {
    E {
        link: Some(target.into()),
        mode: 0o777,
        ..e(name, T::Symlink)
    }
}
fn h(name: &str, target: &str) -> E {
    E {
        link: Some(target.into()),
        ..e(name, T::Link)
    }
}
fn moded(mut x: E, mode: u32) -> E {
    x.mode = mode;
    x
}

fn octal(field: &mut [u8], v: u64) {
    let w = field.len() - 1;
    let s = format!("{v:0w$o}");
    field[..w].copy_from_slice(s.as_bytes());
    field[w] = 0;
}

/// The tar stream for `entries`, ending where a bomb's data would start.
fn tar_bytes(entries: &[E]) -> Vec<u8> {
    let mut out = Vec::new();
    for x in entries {
        let mut hd = tar::Header::new_gnu();
        hd.set_entry_type(x.kind);
        hd.set_mode(x.mode);
        hd.set_mtime(0);
        let name = x.name.as_bytes();
        hd.as_old_mut().name[..name.len()].copy_from_slice(name);
        if let Some(t) = &x.link {
            hd.as_old_mut().linkname[..t.len()].copy_from_slice(t.as_bytes());
        }
        let mut data = x.data.clone();
        if let Some(full) = x.sparse {
            data = vec![7u8; 512];
            let g = hd.as_gnu_mut().unwrap();
            octal(&mut g.sparse[0].offset, full - 512);
            octal(&mut g.sparse[0].numbytes, 512);
            octal(&mut g.realsize, full);
        }
        hd.set_size(x.declared.unwrap_or(data.len() as u64));
        hd.set_cksum();
        out.extend_from_slice(hd.as_bytes());
        if x.declared.is_some() {
            return out;
        }
        out.extend_from_slice(&data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// PAX extended header records: `<len> <key>=<value>\n`, the length counting itself.
fn pax_records(kv: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (k, v) in kv {
        let body = format!(" {k}={v}\n");
        let mut len = body.len() + 1;
        while format!("{len}{body}").len() != len {
            len += 1;
        }
        out.extend_from_slice(format!("{len}{body}").as_bytes());
    }
    out
}

struct Case {
    id: &'static str,
    entries: Vec<E>,
    /// The entry the refusal names and the rule, for install and for bake.
    install: (&'static str, &'static str),
    bake: (&'static str, &'static str),
    /// Extra `kiln install` flags.
    flags: &'static [&'static str],
}

#[allow(
    clippy::too_many_lines,
    reason = "one scenario from its setup to its last assertion, each step depending on the one before; its helpers are in support/"
)]
fn corpus() -> Vec<Case> {
    let both = |entry, rule| ((entry), (rule));
    let c = |id,
             entries: Vec<E>,
             install: (&'static str, &'static str),
             bake: (&'static str, &'static str)| Case {
        id,
        entries,
        install,
        bake,
        flags: &[],
    };
    let (ie, ir) = both("usr/evil/pwned", "its parent \"usr/evil\" is a symlink");
    vec![
        c(
            "absolute name",
            vec![f("/etc/cron.d/evil")],
            ("/etc/cron.d/evil", "absolute path"),
            ("/etc/cron.d/evil", "absolute path"),
        ),
        c(
            "dot-dot name",
            vec![f("../../outside/evil")],
            ("../../outside/evil", "`..`"),
            ("../../outside/evil", "`..`"),
        ),
        c(
            "dot-dot inside a name",
            vec![d("usr"), f("usr/../../outside/evil")],
            ("usr/../../outside/evil", "`..`"),
            ("usr/../../outside/evil", "`..`"),
        ),
        c(
            "backslash root",
            vec![f("\\outside\\evil")],
            ("\\outside\\evil", "absolute path"),
            ("\\outside\\evil", "absolute path"),
        ),
        c(
            "drive letter",
            vec![f("C:\\evil")],
            ("C:\\evil", "absolute path"),
            ("C:\\evil", "absolute path"),
        ),
        c(
            "empty part",
            vec![f("usr//evil")],
            ("usr//evil", "empty"),
            ("usr//evil", "empty"),
        ),
        c(
            "dot part",
            vec![f("usr/./evil")],
            ("usr/./evil", "empty"),
            ("usr/./evil", "empty"),
        ),
        // The issue's own case: a link to a host directory, then a file through it.
        c(
            "symlink parent, absolute target",
            vec![d("usr"), l("usr/evil", "/outside"), f("usr/evil/pwned")],
            (ie, ir),
            ("usr/evil", "symlink points outside the archive"),
        ),
        c(
            "symlink parent, relative target",
            vec![
                d("usr"),
                d("usr/lib"),
                l("usr/evil", "lib"),
                f("usr/evil/pwned"),
            ],
            (ie, ir),
            (ie, ir),
        ),
        c(
            "symlink chain as a parent",
            vec![
                d("usr"),
                l("usr/a", "b"),
                l("usr/b", "c"),
                l("usr/c", "."),
                f("usr/a/x"),
            ],
            ("usr/a/x", "is a symlink"),
            ("usr/a/x", "is a symlink"),
        ),
        c(
            "directory beneath a symlink",
            vec![d("usr"), l("usr/evil", "lib"), d("usr/evil/sub")],
            ("usr/evil/sub", "is a symlink"),
            ("usr/evil/sub", "is a symlink"),
        ),
        c(
            "symlink climbing out",
            vec![d("usr"), l("usr/x", "../../../outside")],
            ("usr/x", "symlink points outside the root"),
            ("usr/x", "symlink points outside the archive"),
        ),
        c(
            "symlink climbing out via a detour",
            vec![d("usr"), d("usr/lib"), l("usr/lib/x", "../a/../../../..")],
            ("usr/lib/x", "points outside"),
            ("usr/lib/x", "points outside"),
        ),
        c(
            "parent becomes a symlink after its child",
            vec![d("etc"), f("etc/x/y"), l("etc/x", "../usr")],
            ("etc/x", "lies beneath it"),
            ("etc/x", "lies beneath it"),
        ),
        c(
            "parent becomes a file after its child",
            vec![f("etc/x/y"), f("etc/x")],
            ("etc/x", "lies beneath it"),
            ("etc/x", "lies beneath it"),
        ),
        c(
            "directory replaced by a symlink",
            vec![d("usr"), d("usr/lib"), l("usr/lib", "../x")],
            ("usr/lib", "replaces a directory with a symlink"),
            ("usr/lib", "replaces a directory with a symlink"),
        ),
        c(
            "directory replaced by a symlink, then written through",
            vec![
                d("usr"),
                d("usr/lib"),
                l("usr/lib", "../x"),
                f("usr/lib/evil"),
            ],
            ("usr/lib", "replaces a directory"),
            ("usr/lib", "replaces a directory"),
        ),
        c(
            "duplicate file",
            vec![f("usr/a"), f("usr/a")],
            ("usr/a", "appears twice"),
            ("usr/a", "appears twice"),
        ),
        c(
            "file beneath a file",
            vec![f("usr/a"), f("usr/a/b")],
            ("usr/a/b", "is a file in this archive"),
            ("usr/a/b", "is a file in this archive"),
        ),
        c(
            "hard link to a host file",
            vec![h("usr/h", "/etc/shadow")],
            ("usr/h", "hard link"),
            ("usr/h", "hard link points outside the archive"),
        ),
        c(
            "hard link climbing out",
            vec![h("usr/h", "../../etc/shadow")],
            ("usr/h", "hard link"),
            ("usr/h", "hard link points outside the archive"),
        ),
        c(
            "hard link to nothing",
            vec![h("usr/h", "usr/nothing")],
            ("usr/h", "hard link"),
            ("usr/h", "not an earlier regular file"),
        ),
        c(
            "character device",
            vec![e("usr/null", T::Char)],
            ("usr/null", "character device"),
            ("usr/null", "character device"),
        ),
        c(
            "block device",
            vec![e("usr/sda", T::Block)],
            ("usr/sda", "block device"),
            ("usr/sda", "block device"),
        ),
        c(
            "FIFO",
            vec![e("usr/fifo", T::Fifo)],
            ("usr/fifo", "FIFO"),
            ("usr/fifo", "FIFO"),
        ),
        c(
            "setuid file",
            vec![moded(f("usr/bin/su"), 0o4755)],
            ("usr/bin/su", "setuid/setgid"),
            ("usr/bin/su", "setuid/setgid"),
        ),
        c(
            "setgid file",
            vec![moded(f("usr/bin/sg"), 0o2755)],
            ("usr/bin/sg", "setuid/setgid"),
            ("usr/bin/sg", "setuid/setgid"),
        ),
        c(
            "symlink with an empty target",
            vec![l("usr/x", "")],
            ("usr/x", "empty target"),
            ("usr/x", "empty target"),
        ),
        c(
            "unknown entry type",
            vec![e("usr/v", T::new(b'V'))],
            ("usr/v", "unknown entry type"),
            ("usr/v", "unknown entry type"),
        ),
        c(
            "huge sparse member (5 GiB of holes)",
            vec![E {
                sparse: Some(5 * GIB),
                ..e("usr/sparse", T::GNUSparse)
            }],
            ("usr/sparse", "unpacks to more than 4 GiB"),
            ("usr/sparse", "unpacks to more than 4 GiB"),
        ),
        c(
            "PAX 1.0 sparse member (the map would be unpacked as the file)",
            vec![
                E {
                    data: pax_records(&[
                        ("GNU.sparse.major", "1"),
                        ("GNU.sparse.minor", "0"),
                        ("GNU.sparse.name", "usr/sparse"),
                        ("GNU.sparse.realsize", "1024"),
                    ]),
                    ..e("usr/PaxHeaders/sparse", T::XHeader)
                },
                E {
                    data: [b"1\n512\n512\n".to_vec(), vec![0; 500], vec![7; 512]].concat(),
                    ..e("usr/GNUSparseFile.0/sparse", T::Regular)
                },
            ],
            ("usr/GNUSparseFile.0/sparse", "PAX sparse member"),
            ("usr/GNUSparseFile.0/sparse", "PAX sparse member"),
        ),
        c(
            "PAX 0.1 sparse member",
            vec![
                E {
                    data: pax_records(&[
                        ("GNU.sparse.size", "1024"),
                        ("GNU.sparse.numblocks", "1"),
                        ("GNU.sparse.map", "512,512"),
                    ]),
                    ..e("usr/PaxHeaders/s01", T::XHeader)
                },
                E {
                    data: vec![7; 512],
                    ..e("usr/GNUSparseFile.0/s01", T::Regular)
                },
            ],
            ("usr/GNUSparseFile.0/s01", "PAX sparse member"),
            ("usr/GNUSparseFile.0/s01", "PAX sparse member"),
        ),
        c(
            "bomb: a header declaring 5 GiB",
            vec![
                f("usr/a"),
                E {
                    declared: Some(5 * GIB),
                    ..e("usr/bomb", T::Regular)
                },
            ],
            ("usr/bomb", "unpacks to more than 4 GiB"),
            ("usr/bomb", "unpacks to more than 4 GiB"),
        ),
        c(
            "bomb: a 3 GiB member under --max-size 1 GiB",
            vec![E {
                declared: Some(3 * GIB),
                ..e("usr/b1", T::Regular)
            }],
            ("usr/b1", "bytes"),
            ("usr/b1", "bytes"),
        ),
        c(
            "GNU long-name record of 8 MiB (read whole into memory by tar readers)",
            vec![
                E {
                    data: vec![b'a'; 8 << 20],
                    ..e("././@LongLink", T::GNULongName)
                },
                f("usr/x"),
            ],
            (
                "(before the first entry)",
                "long-name or pax header record larger than 1 MiB",
            ),
            (
                "bin/containerd",
                "long-name or pax header record larger than 1 MiB",
            ),
        ),
        c(
            "pax record of 8 MiB",
            vec![
                E {
                    data: vec![b'a'; 8 << 20],
                    ..e("./PaxHeaders/x", T::XHeader)
                },
                f("usr/x"),
            ],
            (
                "(before the first entry)",
                "long-name or pax header record larger than 1 MiB",
            ),
            (
                "bin/containerd",
                "long-name or pax header record larger than 1 MiB",
            ),
        ),
    ]
    .into_iter()
    .map(|mut c| {
        // A cap lowered to 1 GiB shows the sum rule on its own; bake keeps its default.
        if c.id.starts_with("bomb: a 3 GiB") {
            c.flags = &["--max-size", "1073741824"];
            c.install = ("usr/b1", "unpacks to more than 1 GiB");
            c.bake = ("", "");
        }
        c
    })
    .collect()
}

/// Everything under `top`: path -> type, mode, size, content sha256 or link target.
fn listing(top: &Path, skip: Option<&Path>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![top.to_path_buf()];
    while let Some(p) = todo.pop() {
        if Some(p.as_path()) == skip {
            continue;
        }
        let m = std::fs::symlink_metadata(&p).unwrap();
        let rel = p.strip_prefix(top).unwrap().display().to_string();
        let ft = m.file_type();
        let what = if ft.is_symlink() {
            format!("link -> {}", std::fs::read_link(&p).unwrap().display())
        } else if ft.is_dir() {
            let mut kids: Vec<PathBuf> = std::fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            kids.sort();
            todo.extend(kids);
            format!("dir {:o}", m.mode() & 0o7777)
        } else if ft.is_file() {
            format!(
                "file {:o} {} {}",
                m.mode() & 0o7777,
                m.len(),
                hex::encode(Sha256::digest(std::fs::read(&p).unwrap()))
            )
        } else {
            format!("special {:o}", m.mode())
        };
        out.insert(rel, what);
    }
    out
}

fn assert_same(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>, what: &str) {
    if before != after {
        let mut diff = String::new();
        for (k, v) in after {
            if before.get(k) != Some(v) {
                diff.push_str(&format!("+ {k}: {v}\n"));
            }
        }
        for (k, v) in before {
            if after.get(k) != Some(v) {
                diff.push_str(&format!("- {k}: {v}\n"));
            }
        }
        panic!("{what}: the temp tree changed:\n{diff}");
    }
}

/// A Debian-shaped root beside an `outside` directory its own hostile symlinks point at.
fn world(dir: &Path) -> PathBuf {
    let root = dir.join("root");
    for p in ["usr/bin", "usr/lib", "etc/systemd/system", "var/lib"] {
        std::fs::create_dir_all(root.join(p)).unwrap();
    }
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
    std::fs::write(root.join("usr/bin/bash"), b"the base image's").unwrap();
    std::fs::create_dir_all(dir.join("outside")).unwrap();
    std::fs::write(dir.join("outside/canary"), b"host file").unwrap();
    std::fs::set_permissions(
        dir.join("outside/canary"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    root
}

#[test]
fn kiln_install_refuses_every_hostile_layer_and_changes_nothing() {
    let cases = corpus();
    assert!(cases.len() >= 25, "{} cases", cases.len());
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    let root = world(dir);
    let layers = dir.join("layers");
    std::fs::create_dir_all(&layers).unwrap();
    let mut sums = String::new();
    let mut paths = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let p = layers.join(format!("case-{i:02}.tar.zst"));
        std::fs::write(&p, zstd::encode_all(&tar_bytes(&c.entries)[..], 3).unwrap()).unwrap();
        sums.push_str(&format!("{}  case-{i:02}.tar.zst\n", sha256_file(&p)));
        paths.push(p);
    }
    std::fs::write(layers.join("SHA256SUMS"), sums).unwrap();
    let before = listing(dir, None);
    for (c, layer) in cases.iter().zip(&paths) {
        let o = kiln()
            .arg("install")
            .arg(layer)
            .arg("--root")
            .arg(&root)
            .args(c.flags)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let (entry, rule) = c.install;
        assert_eq!(o.status.code(), Some(3), "{}: {err}", c.id);
        assert!(
            err.contains(&format!("refusing layer entry {entry:?}")) && err.contains(rule),
            "{}: expected entry {entry:?} and rule {rule:?} in:\n{err}",
            c.id
        );
        assert_same(&before, &listing(dir, None), c.id);
    }
}

// Versions here are test data for a self-contained definition, not the shipped pins.
const DEF: &str = r#"
name = "t"
os = "linux"
arch = ["amd64"]
formats = ["rootfs"]
[kubernetes]
version = "v1.30.0-test"
[[artifact]]
name = "kubelet"
[[artifact]]
name = "containerd"
"#;

/// Bakes with `archive` as containerd's upstream archive.
fn bake_with(dir: &Path, archive: &Path, kind: ArchiveKind) -> Result<(), String> {
    let def = ImageDef::parse(DEF, Path::new("t.toml")).unwrap();
    let inputs = vec![
        ArtifactInput {
            name: "kubelet".into(),
            version: "v1.30.0-test".into(),
            url: "https://example.invalid/kubelet".into(),
            sha256: sha256_file(&dir.join("kubelet-blob")),
            kind: InputKind::Binary,
            blob: dir.join("kubelet-blob"),
            members: vec![MemberMap {
                from: "kubelet".into(),
                to: "bin/kubelet".into(),
            }],
        },
        ArtifactInput {
            name: "containerd".into(),
            version: "2.0.0-test".into(),
            url: "https://example.invalid/containerd".into(),
            sha256: sha256_file(archive),
            kind: InputKind::Archive(kind),
            blob: archive.to_path_buf(),
            members: vec![MemberMap {
                from: "bin/containerd".into(),
                to: "bin/containerd".into(),
            }],
        },
    ];
    let gate = bake::inspect_gate(def.os, Arch::Amd64);
    let req = BakeRequest {
        def: &def,
        arch: Arch::Amd64,
        format: Format::Rootfs,
        artifacts: &inputs,
        images: &[],
        firstboot: &dir.join("fb"),
        epoch: 0,
        work: &dir.join("work"),
        gate: &gate,
        cache: None,
    };
    bake::bake(&req, &dir.join("out"), &Default::default())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

fn bake_world(dir: &Path) {
    world(dir);
    std::fs::write(dir.join("kubelet-blob"), tiny_elf(X86_64, "kubelet")).unwrap();
    std::fs::write(dir.join("fb"), tiny_elf(X86_64, "fb")).unwrap();
    std::fs::create_dir_all(dir.join("work")).unwrap();
}

/// `bake` creates its output directory first; after a refusal it must hold nothing, and is
/// removed so the next listing compares like with like.
fn out_is_empty(dir: &Path) {
    let out = dir.join("out");
    if out.exists() {
        let left: Vec<_> = std::fs::read_dir(&out).unwrap().collect();
        assert!(left.is_empty(), "output written: {left:?}");
        std::fs::remove_dir(&out).unwrap();
    }
}

/// What the scratch directory may hold after a refused bake: kiln's own regular files and
/// directories, nothing else (no link, no device, nothing named by the archive).
fn scratch_is_kilns(work: &Path) {
    for (p, what) in listing(work, None) {
        assert!(
            what.starts_with("dir ") || what.starts_with("file "),
            "scratch holds {p}: {what}"
        );
        assert!(
            p.is_empty()
                || p.split('/')
                    .all(|c| !c.contains("evil") && !c.contains("pwned")),
            "scratch holds an archive-named path {p}"
        );
    }
}

#[test]
fn kiln_bake_refuses_every_hostile_upstream_archive_and_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    bake_world(dir);
    let containerd = tiny_elf(X86_64, "containerd");
    let mut n = 0;
    for (i, c) in corpus().iter().enumerate() {
        let (entry, rule) = c.bake;
        if rule.is_empty() {
            continue;
        }
        n += 1;
        // A proper member first, so the refusal is about the hostile entry.
        let mut entries = vec![
            d("bin"),
            E {
                data: containerd.clone(),
                mode: 0o755,
                ..e("bin/containerd", T::Regular)
            },
        ];
        entries.extend(c.entries.iter().cloned());
        let archive = dir.join(format!("in/case-{i:02}.tar.gz"));
        std::fs::create_dir_all(archive.parent().unwrap()).unwrap();
        let mut gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&archive).unwrap(),
            flate2::Compression::fast(),
        );
        gz.write_all(&tar_bytes(&entries)).unwrap();
        gz.finish().unwrap();
        let before = listing(dir, Some(&dir.join("work")));
        let err = bake_with(dir, &archive, ArchiveKind::TarGz).unwrap_err();
        out_is_empty(dir);
        assert!(
            err.contains(&format!("refusing hostile archive entry {entry:?}"))
                && err.contains(rule)
                && err.contains(&archive.display().to_string()),
            "{}: expected entry {entry:?} and rule {rule:?} in:\n{err}",
            c.id
        );
        assert_same(&before, &listing(dir, Some(&dir.join("work"))), c.id);
        scratch_is_kilns(&dir.join("work"));
    }
    assert!(n >= 25, "{n} bake cases");
}

/// A zip with these names, unix modes (written straight into the central directory: the
/// zip crate's setters keep only permission bits) and data; with `declared`, every member
/// named `big…` claims that many bytes uncompressed.
fn zip_bytes(entries: &[(&str, u32, &[u8])], declared: Option<u32>) -> Vec<u8> {
    let mut buf = std::io::Cursor::new(Vec::new());
    let mut z = zip::ZipWriter::new(&mut buf);
    for (name, mode, data) in entries {
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .unix_permissions(mode & 0o777);
        if mode & 0o170000 == 0o120000 {
            z.add_symlink(*name, std::str::from_utf8(data).unwrap(), opts)
                .unwrap();
        } else {
            z.start_file(*name, opts).unwrap();
            z.write_all(data).unwrap();
        }
    }
    z.finish().unwrap();
    let mut b = buf.into_inner();
    let mut i = 0;
    let mut k = 0;
    while let Some(off) = b[i..].windows(4).position(|w| w == b"PK\x01\x02") {
        let at = i + off;
        let len = u16::from_le_bytes([b[at + 28], b[at + 29]]) as usize;
        let name = String::from_utf8_lossy(&b[at + 46..at + 46 + len]).into_owned();
        let mode = entries[k].1;
        k += 1;
        b[at + 5] = 3; // made by: Unix, so the mode is read
        b[at + 38..at + 42].copy_from_slice(&(mode << 16).to_le_bytes());
        if let (Some(size), true) = (declared, name.starts_with("big")) {
            b[at + 24..at + 28].copy_from_slice(&size.to_le_bytes());
        }
        i = at + 4;
    }
    // The writer refuses duplicate names, so the duplicate is written as `…containerD`
    // and renamed in every header here.
    let (from, to) = (b"bin/containerD", b"bin/containerd");
    while let Some(at) = b.windows(from.len()).position(|w| w == from) {
        b[at..at + to.len()].copy_from_slice(to);
    }
    b
}

#[test]
fn kiln_bake_refuses_hostile_zips() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path();
    bake_world(dir);
    let ctr = tiny_elf(X86_64, "containerd");
    let good: (&str, u32, &[u8]) = ("bin/containerd", 0o100755, &ctr);
    type ZipCase<'a> = (
        &'a str,
        Vec<(&'a str, u32, &'a [u8])>,
        Option<u32>,
        &'a str,
        &'a str,
    );
    let cases: Vec<ZipCase<'_>> = vec![
        (
            "dot-dot",
            vec![good, ("../../evil", 0o100644, b"x")],
            None,
            "../../evil",
            "`..`",
        ),
        (
            "absolute",
            vec![good, ("/evil", 0o100644, b"x")],
            None,
            "/evil",
            "absolute path",
        ),
        (
            "symlink out",
            vec![good, ("bin/x", 0o120777, b"../../../etc")],
            None,
            "bin/x",
            "symlink points outside the archive",
        ),
        (
            "FIFO",
            vec![good, ("bin/p", 0o010644, b"")],
            None,
            "bin/p",
            "FIFO",
        ),
        (
            "socket",
            vec![good, ("bin/s", 0o140644, b"")],
            None,
            "bin/s",
            "socket",
        ),
        (
            "setuid",
            vec![good, ("bin/su", 0o104755, b"x")],
            None,
            "bin/su",
            "setuid/setgid",
        ),
        (
            "duplicate",
            vec![good, ("bin/containerD", 0o100755, b"again")],
            None,
            "(central directory: 2 records, 1 names)",
            "appears twice",
        ),
        // Overlapping-member style bomb: two members each claiming 3 GiB.
        (
            "declared bomb",
            vec![good, ("big1", 0o100644, b"x"), ("big2", 0o100644, b"x")],
            Some(3 << 30),
            "big2",
            "unpacks to more than 4 GiB",
        ),
    ];
    for (id, entries, declared, entry, rule) in cases {
        let archive = dir.join(format!("in/{}.zip", id.replace(' ', "-")));
        std::fs::create_dir_all(archive.parent().unwrap()).unwrap();
        std::fs::write(&archive, zip_bytes(&entries, declared)).unwrap();
        let before = listing(dir, Some(&dir.join("work")));
        let err = bake_with(dir, &archive, ArchiveKind::Zip).unwrap_err();
        out_is_empty(dir);
        assert!(
            err.contains(&format!("refusing hostile archive entry {entry:?}"))
                && err.contains(rule),
            "{id}: expected entry {entry:?} and rule {rule:?} in:\n{err}"
        );
        assert_same(&before, &listing(dir, Some(&dir.join("work"))), id);
        scratch_is_kilns(&dir.join("work"));
    }
    // The honest zip bakes, so the refusals above are about the hostile entries.
    let archive = dir.join("in/good.zip");
    std::fs::write(&archive, zip_bytes(&[good], None)).unwrap();
    bake_with(dir, &archive, ArchiveKind::Zip).unwrap();
}
