//! Property test, fixed case count, no persistence files: random trees written by kiln's
//! squashfs writer read back by `unsquashfs` (squashfs-tools) and `rdsquashfs`
//! (squashfs-tools-ng) give the same paths, types, modes, link targets and content hashes.
//! Each case runs both tools, so the count is small.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use kiln::bake::squashfs::{self, Codec, Options, BLOCK_SIZE};
use kiln::bake::{Data, Node};
use proptest::prelude::*;
use sha2::{Digest, Sha256};

#[path = "../../testkit/optout.rs"]
mod optout;

/// What a path holds, as both the generator and the readers see it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Dir(u32),
    File(u32, String),
    Link(String),
}

#[derive(Debug, Clone)]
enum Gen {
    Dir,
    File(u32, Vec<u8>),
    Link(String),
}

/// A file name: never `.` or `..` (any pattern with a dot can make them), no `/`, no NUL.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-c]{1,2}",
        1 => "[a-zA-Z0-9 ._~#%+=,;@\\-]{1,30}",
        1 => "\\PC{1,6}",
        1 => (200usize..=255).prop_map(|n| "n".repeat(n)),
    ]
    .prop_filter("a file name", |s| {
        !s.contains('/') && s != "." && s != ".." && !s.contains('\0')
    })
}

fn contents() -> impl Strategy<Value = Vec<u8>> {
    let bs = BLOCK_SIZE as usize;
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..2000),
        1 => Just(Vec::new()),
        // Whole blocks, a zero (sparse) block, tails: the block and fragment paths.
        1 => (1usize..3, any::<u8>(), 0usize..3000, any::<bool>()).prop_map(move |(n, b, tail, zero)| {
            let mut v: Vec<u8> = (0..n * bs).map(|i| (i as u8).wrapping_mul(b | 1)).collect();
            if zero {
                v[..bs].fill(0);
            }
            v.extend(std::iter::repeat_n(b, tail));
            v
        }),
    ]
}

fn mode() -> impl Strategy<Value = u32> {
    // Owner-readable, so the readers (and the comparison) can read every file back.
    any::<u32>().prop_map(|m| (m & 0o7777) | 0o400)
}

fn target() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-c./]{1,20}",
        "/usr/[a-z]{1,8}",
        "\\PC{1,40}".prop_filter("no NUL", |s| !s.contains('\0')),
        (1usize..1000).prop_map(|n| "t/".repeat(n)),
    ]
}

fn entry() -> impl Strategy<Value = Gen> {
    prop_oneof![
        2 => Just(Gen::Dir),
        4 => (mode(), contents()).prop_map(|(m, c)| Gen::File(m, c)),
        1 => target().prop_map(Gen::Link),
    ]
}

/// A tree: each entry's parent is an earlier directory, names unique per directory.
fn tree() -> impl Strategy<Value = BTreeMap<String, Gen>> {
    prop::collection::vec((any::<prop::sample::Index>(), name(), entry()), 1..40).prop_map(
        |items| {
            let mut dirs: Vec<String> = vec![String::new()];
            let mut out = BTreeMap::new();
            for (parent, name, g) in items {
                let p = &dirs[parent.index(dirs.len())];
                let path = if p.is_empty() {
                    name
                } else {
                    format!("{p}/{name}")
                };
                if out.contains_key(&path) {
                    continue;
                }
                if matches!(g, Gen::Dir) {
                    dirs.push(path.clone());
                }
                out.insert(path, g);
            }
            out
        },
    )
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

fn expected(tree: &BTreeMap<String, Gen>) -> BTreeMap<String, Seen> {
    tree.iter()
        .map(|(p, g)| {
            let s = match g {
                Gen::Dir => Seen::Dir(0o755),
                Gen::File(m, c) => Seen::File(*m, sha(c)),
                Gen::Link(t) => Seen::Link(t.clone()),
            };
            (p.clone(), s)
        })
        .collect()
}

/// Everything under `root`, relative paths, by walking the extracted tree.
fn walk(root: &Path, rel: &str, out: &mut BTreeMap<String, Seen>) {
    for e in std::fs::read_dir(root.join(rel)).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().into_string().expect("UTF-8 name");
        let p = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        let md = std::fs::symlink_metadata(e.path()).unwrap();
        let mode = md.permissions().mode() & 0o7777;
        if md.file_type().is_symlink() {
            let t = std::fs::read_link(e.path()).unwrap();
            out.insert(p, Seen::Link(t.into_os_string().into_string().unwrap()));
        } else if md.is_dir() {
            out.insert(p.clone(), Seen::Dir(mode));
            walk(root, &p, out);
        } else {
            assert!(md.is_file(), "{p}: not a file");
            out.insert(p, Seen::File(mode, sha(&std::fs::read(e.path()).unwrap())));
        }
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tools_present() -> bool {
    for tool in ["unsquashfs", "rdsquashfs"] {
        if Command::new(tool).arg("--help").output().is_err() {
            optout::cannot_run(
                "squashfs-tools",
                &format!("{tool} is not installed (squashfs-tools, squashfs-tools-ng)"),
            );
            return false;
        }
    }
    true
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn generated_trees_read_back_the_same(tree in tree(), gzip in any::<bool>()) {
        if !tools_present() {
            return Ok(());
        }
        let nodes: BTreeMap<String, Node> = tree
            .iter()
            .map(|(p, g)| {
                let n = match g {
                    Gen::Dir => Node::Dir,
                    Gen::Link(t) => Node::Symlink(t.clone()),
                    Gen::File(m, c) => Node::File {
                        data: Data::Inline(c.clone()),
                        mode: *m,
                        size: c.len() as u64,
                        sha256: sha(c),
                        sha1: String::new(),
                    },
                };
                (p.clone(), n)
            })
            .collect();
        // A Layer lists parents before children: sorted by path components.
        let mut order: Vec<(&str, &Node)> = nodes.iter().map(|(p, n)| (p.as_str(), n)).collect();
        order.sort_by(|a, b| a.0.split('/').cmp(b.0.split('/')));
        let dir = tempfile::tempdir().unwrap();
        let img = dir.path().join("t.raw");
        let opts = Options {
            codec: if gzip { Codec::gzip(6) } else { Codec::zstd(3) },
            threads: 2,
            cache: None,
            scratch_cache: false,
        };
        squashfs::write_file(order, 1_704_067_200, &img, &opts).unwrap();
        let want = expected(&tree);

        let un = dir.path().join("un");
        run(Command::new("unsquashfs").args(["-no-progress", "-quiet", "-d"]).arg(&un).arg(&img));
        let mut got = BTreeMap::new();
        walk(&un, "", &mut got);
        prop_assert_eq!(&got, &want, "unsquashfs");

        let rd = dir.path().join("rd");
        std::fs::create_dir(&rd).unwrap();
        run(Command::new("rdsquashfs").args(["-q", "-C", "-u", "/", "-p"]).arg(&rd).arg(&img));
        let mut got = BTreeMap::new();
        walk(&rd, "", &mut got);
        prop_assert_eq!(&got, &want, "rdsquashfs");
    }
}
