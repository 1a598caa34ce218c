//! Property tests, fixed case counts, no persistence files: the archive name and link rules
//! (an archive the rules accept, unpacked by a naive extractor that follows every symlink,
//! never writes outside its directory), the two path resolvers of `kiln install` against
//! each other on random symlink trees, and the install manifest parser.

use std::collections::BTreeMap;
use std::path::Path;

use kiln::archive_rules::{clean_name, EntryCheck, Kind, Policy};
use kiln::install::manifest::{parse_manifest, render_manifest, Owned};
use kiln::install::root::{Resolver, Root};
use proptest::prelude::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn component() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::sample::select(vec!["a", "b", "c"]).prop_map(String::from),
        1 => prop::sample::select(vec!["..", ".", "", "\\..", "C:"]).prop_map(String::from),
    ]
}

fn raw_name() -> impl Strategy<Value = String> {
    (
        prop::sample::select(vec!["", "/", "./", "\\"]),
        prop::collection::vec(component(), 1..4),
        any::<bool>(),
    )
        .prop_map(|(lead, parts, slash)| {
            format!("{lead}{}{}", parts.join("/"), if slash { "/" } else { "" })
        })
}

fn target() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(prop::sample::select(vec!["a", "b", "..", ".", "c"]), 1..5)
            .prop_map(|v| v.join("/")),
        1 => prop::sample::select(vec!["/", "/tmp", "/etc/passwd", "/a/../.."]).prop_map(String::from),
    ]
}

#[derive(Debug, Clone)]
enum Ent {
    Dir(String),
    File(String),
    Link(String, String),
}

/// Mostly plain names in a namespace small enough that links and later entries collide.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => prop::collection::vec(prop::sample::select(vec!["a", "b"]), 1..4)
            .prop_map(|v| v.join("/")),
        1 => raw_name(),
    ]
}

fn entry() -> impl Strategy<Value = Ent> {
    prop_oneof![
        name().prop_map(Ent::Dir),
        name().prop_map(Ent::File),
        (name(), target()).prop_map(|(n, t)| Ent::Link(n, t)),
    ]
}

proptest! {
    #![proptest_config(config(256))]

    /// A cleaned name is canonical, relative and free of `.`/`..`/empty parts, and cleaning
    /// it again changes nothing; a name with a `..` part is never accepted.
    #[test]
    fn clean_names_are_canonical(raw in raw_name()) {
        if let Ok(c) = clean_name(&raw) {
            prop_assert_eq!(clean_name(&c), Ok(c.clone()));
            if !c.is_empty() {
                prop_assert!(!c.starts_with('/') && !c.starts_with('\\'));
                for part in c.split(['/', '\\']) {
                    prop_assert!(!matches!(part, "" | "." | ".."), "{c:?}");
                }
                let normal = Path::new(&c)
                    .components()
                    .all(|x| matches!(x, std::path::Component::Normal(_)));
                prop_assert!(normal, "{c:?}");
            }
        }
        if raw.split(['/', '\\']).any(|p| p == "..") {
            prop_assert!(clean_name(&raw).is_err());
        }
    }
}

/// Unpacks what the upstream rules accept with a naive extractor (parents created, every
/// symlink followed) inside `t/o1/…/o5/top`; returns what appeared anywhere else.
fn naive_unpack(entries: &[Ent]) -> Vec<std::path::PathBuf> {
    // Deep enough that no `..` chain of the generated targets gets above `t`.
    let t = tempfile::tempdir().unwrap();
    let top = t.path().join("o1/o2/o3/o4/o5/top");
    std::fs::create_dir_all(&top).unwrap();
    let mut check = EntryCheck::new(Policy::upstream());
    for e in entries {
        let (raw, kind) = match e {
            Ent::Dir(n) => (n, Kind::Dir),
            Ent::File(n) => (n, Kind::File { size: 1 }),
            Ent::Link(n, t) => (n, Kind::Symlink(t.clone())),
        };
        let Ok(Some(name)) = check.check(raw.as_bytes(), &kind, 0o644) else {
            // A refused entry refuses the archive: nothing after it is unpacked.
            break;
        };
        let p = top.join(&name);
        if let Some(parent) = p.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = match e {
            Ent::Dir(_) => std::fs::create_dir_all(&p),
            Ent::File(_) => std::fs::write(&p, b"x"),
            Ent::Link(_, t) => std::os::unix::fs::symlink(t, &p),
        };
    }
    let mut outside = Vec::new();
    let mut dir = t.path().to_path_buf();
    for next in ["o1", "o2", "o3", "o4", "o5", "top"] {
        for e in std::fs::read_dir(&dir).unwrap() {
            let n = e.unwrap().file_name().to_string_lossy().into_owned();
            if n != next {
                outside.push(dir.join(n));
            }
        }
        dir = dir.join(next);
    }
    outside
}

#[test]
fn known_escapes_are_refused() {
    let l = |n: &str, t: &str| Ent::Link(n.into(), t.into());
    let f = |n: &str| Ent::File(n.into());
    for entries in [
        vec![l("a", "../.."), f("a/b")],
        vec![l("a", "b"), l("b", "../../x"), f("a/c")],
        vec![f("a/b"), l("a", "..")],
        vec![Ent::Dir("a".into()), l("a", "../../.."), f("a/x")],
    ] {
        let out = naive_unpack(&entries);
        assert!(out.is_empty(), "wrote {out:?} for {entries:?}");
    }
}

proptest! {
    #![proptest_config(config(192))]

    /// Whatever sequence of entries the upstream rules accept, a naive extractor — create
    /// the parents, write the file or make the link, following every symlink on the way, as
    /// `tar -x` would — writes nothing outside its directory.
    #[test]
    fn accepted_archives_cannot_write_outside(entries in prop::collection::vec(entry(), 1..8)) {
        let out = naive_unpack(&entries);
        prop_assert!(out.is_empty(), "wrote {:?} for {:?}", out, entries);
    }
}

fn tree() -> impl Strategy<Value = Vec<(String, Option<String>)>> {
    // Paths in a small namespace; None is a directory, Some(target) a symlink.
    let path = prop::collection::vec(prop::sample::select(vec!["a", "b", "c"]), 1..3)
        .prop_map(|v| v.join("/"));
    let node = prop_oneof![Just(None), target().prop_map(Some),];
    prop::collection::vec((path, node), 1..10)
}

proptest! {
    #![proptest_config(config(128))]

    /// `openat2(RESOLVE_IN_ROOT)` and kiln's own `O_NOFOLLOW` walk reach the same directory
    /// (or fail alike) for every path in random trees of directories and symlinks, and
    /// neither leaves the root.
    #[test]
    fn the_two_resolvers_agree(nodes in tree(), queries in prop::collection::vec(target(), 1..6)) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir(&root).unwrap();
        for (p, n) in &nodes {
            // A node below a symlink made earlier would be made where that link points, which
            // can be outside the temp dir (`a -> ../..` put `c` in /tmp): such a node is skipped.
            let below_link = Path::new(p)
                .ancestors()
                .skip(1)
                .filter(|a| !a.as_os_str().is_empty())
                .any(|a| root.join(a).symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()));
            if below_link {
                continue;
            }
            let host = root.join(p);
            if let Some(parent) = host.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
            let _ = match n {
                None => std::fs::create_dir_all(&host),
                Some(target) => std::os::unix::fs::symlink(target, &host),
            };
        }
        let walk = Root::open(&root, Some(Resolver::Walk)).unwrap();
        let kernel = Root::open(&root, Some(Resolver::Openat2)).unwrap();
        if kernel.dir("").is_err() || kernel.dir(".").is_err() {
            return Ok(());
        }
        let outside = std::fs::metadata(t.path()).map(|m| {
            use std::os::unix::fs::MetadataExt;
            (m.dev(), m.ino())
        }).unwrap();
        for q in &queries {
            let q = q.trim_start_matches('/');
            let a = walk.dir(q).map(|d| d.map(|d| d.dev_ino().unwrap())).map_err(|e| e.raw_os_error());
            let b = kernel.dir(q).map(|d| d.map(|d| d.dev_ino().unwrap())).map_err(|e| e.raw_os_error());
            prop_assert_eq!(&a, &b, "{:?} in {:?}", q, nodes);
            prop_assert!(a != Ok(Some(outside)), "{:?} left the root", q);
        }
    }
}

fn owned() -> impl Strategy<Value = Owned> {
    (
        "[0-9a-f]{64}",
        prop_oneof![Just("link".to_string()), "[0-7]{4}"],
    )
        .prop_map(|(sha256, mode)| Owned { sha256, mode })
}

proptest! {
    #![proptest_config(config(256))]

    /// What the manifest writer writes, the parser reads back unchanged.
    #[test]
    fn manifests_round_trip(entries in prop::collection::btree_map("[a-z]{1,3}(/[a-z.]{1,3}){0,3}", owned(), 0..12)) {
        let entries: BTreeMap<String, Owned> = entries
            .into_iter()
            .filter(|(k, _)| clean_name(k).is_ok_and(|c| c == *k))
            .collect();
        let text = render_manifest(&entries);
        prop_assert_eq!(parse_manifest(&text, Path::new("m")).unwrap(), entries);
    }

    /// Any text either parses into clean paths or is refused naming a line that exists.
    #[test]
    fn manifests_never_panic_and_name_the_line(text in "([0-9a-f]{0,64}( {1,2}[0-7a-z]{0,4})?( {1,2}/?[a-z./]{0,8})?\n){0,6}") {
        match parse_manifest(&text, Path::new("m")) {
            Ok(m) => {
                for k in m.keys() {
                    let c = clean_name(k);
                    prop_assert_eq!(c.as_deref(), Ok(k.as_str()));
                }
            }
            Err(e) => prop_assert!(e.line >= 1 && e.line <= text.lines().count(), "{}", e),
        }
    }
}
