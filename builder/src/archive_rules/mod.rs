//! The rules every archive entry kiln unpacks must satisfy, whether it is a rootfs layer
//! (`kiln install`) or an upstream archive (`kiln bake`): one owner, so the two cannot drift.
//!
//! An [`EntryCheck`] sees the entries in archive order and refuses, with a [`Rule`], any entry
//! that could write outside the tree or turn a later entry into a write through a link:
//! absolute and `..` names, links that leave the tree, an entry beneath a symlink or file of
//! the same archive, a link that would shadow entries already seen, a directory replaced by a
//! link, duplicates, device nodes, FIFOs, sockets, setuid/setgid files outside an allow-list,
//! and archives that unpack to more than a cap. [`Capped`] holds the same cap on the bytes
//! actually decompressed, so a header that lies about a size cannot get past it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;

/// The rules' version, part of the bake cache's key for extracted members: an extraction
/// cached under laxer rules is never reused once they tighten. Bump it when they do.
/// 3: an archive is checked against the lock's sha256 before it is unpacked (entries made
/// by a kiln without that check may hold members of a blob the lock never named).
/// 4: PAX sparse members (`GNU.sparse.*` records) are refused, not unpacked raw.
pub const RULES_VERSION: u32 = 4;

/// Why an archive entry is refused. Each message names the rule, never the archive or the
/// entry: the caller's error carries those.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rule {
    /// The name is not UTF-8.
    #[error("name is not UTF-8")]
    NotUtf8,
    /// A NUL byte in the name or a link target.
    #[error("NUL in path")]
    Nul,
    /// `/x`, `\x`, `C:\x`.
    #[error("absolute path")]
    Absolute,
    /// A `..` component.
    #[error("path contains `..`")]
    DotDot,
    /// An empty name, or an empty or `.` component inside it (`a//b`, `a/./b`).
    #[error("empty name, or an empty or `.` part inside it")]
    EmptyPart,
    /// A symlink with an empty target.
    #[error("symlink with an empty target")]
    EmptyLink,
    /// A link whose target leaves the tree.
    #[error("{kind} points outside {tree} (target {target:?})")]
    LinkOutside {
        /// `symlink` or `hard link`.
        kind: &'static str,
        /// `the root` or `the archive`.
        tree: &'static str,
        /// The link target as stored.
        target: String,
    },
    /// A hard link where the policy allows none.
    #[error("hard link (kiln bake never writes one into a layer)")]
    HardLink,
    /// A hard link to something that is not an earlier regular file of the archive.
    #[error("hard link to {target:?}, which is not an earlier regular file of the archive")]
    HardLinkTarget {
        /// The link target.
        target: String,
    },
    /// A device node, FIFO or socket.
    #[error("device node or FIFO ({0}): only files, directories and symlinks are unpacked")]
    Special(&'static str),
    /// A PAX sparse member: its data is a sparse map plus chunks, which kiln does not rebuild.
    #[error("PAX sparse member (GNU.sparse.* records): kiln does not unpack sparse files")]
    PaxSparse,
    /// An entry type kiln does not know.
    #[error("unknown entry type {0}")]
    UnknownType(String),
    /// A setuid or setgid file not on the allow-list.
    #[error("setuid/setgid file (mode {mode:04o}) not on the allow-list")]
    SetId {
        /// The entry's mode bits.
        mode: u32,
    },
    /// An entry beneath a symlink (or a file) of the same archive: unpacking it would write
    /// wherever the link points.
    #[error("its parent {parent:?} is a {what} in this archive, so the entry would be written through it")]
    ParentNotDir {
        /// The parent's path.
        parent: String,
        /// `symlink`, `file`, …
        what: &'static str,
    },
    /// A non-directory entry at a path that earlier entries used as a directory: the parent
    /// would become a symlink (or file) after they were placed.
    #[error("earlier entry {child:?} lies beneath it, so this entry would turn its parent into a {what}")]
    WouldBecomeParent {
        /// An earlier entry beneath this path.
        child: String,
        /// What this entry is.
        what: &'static str,
    },
    /// A directory entry followed by a symlink of the same name.
    #[error("duplicate entry replaces a directory with a symlink")]
    DirReplacedByLink,
    /// The same path twice (other than a directory repeated).
    #[error("path appears twice (the later entry would silently replace the earlier)")]
    Duplicate,
    /// More entries than the cap.
    #[error("more than {cap} entries")]
    TooManyEntries {
        /// The cap.
        cap: usize,
    },
    /// A GNU long-name or pax record (read whole into memory by the tar reader) too large.
    #[error("a long-name or pax header record larger than {} follows it", human(*cap))]
    HeaderTooLarge {
        /// The cap in bytes.
        cap: u64,
    },
    /// The archive unpacks (or would unpack) to more bytes than the cap.
    #[error("unpacks to more than {} (the cap per archive): a decompression bomb or a huge sparse member", human(*cap))]
    TooLarge {
        /// The cap in bytes.
        cap: u64,
    },
}

/// What an entry is, as far as the rules care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file of `size` bytes (for a sparse file: its full size, holes included).
    File {
        /// The size the entry unpacks to.
        size: u64,
    },
    /// A symlink to this target.
    Symlink(String),
    /// A hard link to this (archive) path.
    HardLink(String),
    /// A device node, FIFO or socket: `character device`, `block device`, `FIFO`, `socket`.
    Special(&'static str),
    /// A PAX sparse member: refused ([`Rule::PaxSparse`]).
    PaxSparse,
    /// Anything else, named for the message.
    Unknown(String),
}

impl Kind {
    fn noun(&self) -> &'static str {
        match self {
            Kind::Dir => "directory",
            Kind::File { .. } => "file",
            Kind::Symlink(_) => "symlink",
            Kind::HardLink(_) => "hard link",
            Kind::Special(_) | Kind::Unknown(_) | Kind::PaxSparse => "special file",
        }
    }
}

/// What a tar entry is; `None` for a pax global header, which describes the archive, not
/// an entry (`git archive` writes one).
pub fn tar_kind<R: Read>(e: &mut tar::Entry<'_, R>) -> Option<Kind> {
    use tar::EntryType as E;
    if pax::is_sparse(e) {
        return Some(Kind::PaxSparse);
    }
    let link = || {
        e.link_name_bytes()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    };
    Some(match e.header().entry_type() {
        // For a sparse file, `size()` is the full size, holes included: what it unpacks to.
        E::Regular | E::Continuous | E::GNUSparse => Kind::File { size: e.size() },
        E::Directory => Kind::Dir,
        E::Symlink => Kind::Symlink(link()),
        E::Link => Kind::HardLink(link()),
        E::Char => Kind::Special("character device"),
        E::Block => Kind::Special("block device"),
        E::Fifo => Kind::Special("FIFO"),
        E::XGlobalHeader => return None,
        other => Kind::Unknown(format!("{other:?}")),
    })
}

/// The bytes of tar headers, padding and long names a tar stream may hold on top of its
/// content, per entry: the decompressed stream is capped at `max_bytes` plus this much for
/// each allowed entry, so a huge GNU long-name or pax record cannot exhaust memory either.
pub const HEADER_ALLOWANCE_PER_ENTRY: u64 = 2048;

impl Policy {
    /// The cap on a decompressed tar stream under this policy.
    pub fn stream_cap(&self) -> u64 {
        self.max_bytes
            .saturating_add(HEADER_ALLOWANCE_PER_ENTRY.saturating_mul(self.max_entries as u64))
    }
}

/// What the tree being unpacked allows.
#[derive(Debug, Clone)]
pub struct Policy {
    /// The tree's name in messages: `the root` or `the archive`.
    pub tree: &'static str,
    /// Whether a symlink may have an absolute target. A layer's `/usr/lib/…` links resolve
    /// inside the node's root when the node runs; an upstream archive has no root to name.
    pub absolute_symlinks: bool,
    /// Whether hard links (to earlier regular files of the archive) are allowed at all.
    pub hard_links: bool,
    /// Paths (cleaned, no leading `/`) that may be setuid/setgid files.
    pub setid_allowed: BTreeSet<String>,
    /// The cap on the bytes the archive unpacks to (the sum of its files' sizes).
    pub max_bytes: u64,
    /// The cap on the number of entries.
    pub max_entries: usize,
}

/// The default cap on what one archive may unpack to: 4 GiB. The largest layer kiln bakes is
/// a few hundred MiB; the largest upstream archive in the lock is under 200 MiB unpacked.
pub const DEFAULT_MAX_BYTES: u64 = 4 << 30;

/// The default cap on entries per archive: real layers and upstream archives hold dozens.
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

impl Policy {
    /// The rules for a rootfs layer applied by `kiln install`.
    pub fn layer() -> Policy {
        Policy {
            tree: "the root",
            absolute_symlinks: true,
            hard_links: false,
            setid_allowed: BTreeSet::new(),
            max_bytes: DEFAULT_MAX_BYTES,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }

    /// The rules for an upstream archive `kiln bake` takes members from.
    pub fn upstream() -> Policy {
        Policy {
            tree: "the archive",
            absolute_symlinks: false,
            hard_links: true,
            setid_allowed: BTreeSet::new(),
            max_bytes: DEFAULT_MAX_BYTES,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// Cleans an entry name: strips leading `./` and trailing `/`; refuses NUL, absolute names,
/// `..`, and empty or `.` parts. Backslashes count as separators (Windows zips use them).
/// The archive's own root (`.`, `./`) cleans to the empty string.
pub fn clean_name(raw: &str) -> Result<String, Rule> {
    if raw.contains('\0') {
        return Err(Rule::Nul);
    }
    let b = raw.as_bytes();
    let drive = b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':';
    if raw.starts_with(['/', '\\']) || drive {
        return Err(Rule::Absolute);
    }
    let mut p = raw;
    while let Some(rest) = p.strip_prefix("./") {
        p = rest;
    }
    // `./C:` and `.//x` are absolute once the `./` is gone.
    let b = p.as_bytes();
    if p.starts_with(['/', '\\']) || (b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':') {
        return Err(Rule::Absolute);
    }
    let p = p.trim_end_matches('/');
    if p == "." || p.is_empty() {
        return Ok(String::new());
    }
    let parts: Vec<&str> = p.split(['/', '\\']).collect();
    if parts.contains(&"..") {
        return Err(Rule::DotDot);
    }
    if parts.iter().any(|c| c.is_empty() || *c == ".") {
        return Err(Rule::EmptyPart);
    }
    Ok(p.to_string())
}

/// Whether a relative symlink `target`, placed at `entry` (a cleaned name), climbs above the
/// top of the tree at any point. Absolute targets are the caller's call.
pub fn relative_link_escapes(entry: &str, target: &str) -> bool {
    let mut depth = entry.split('/').count() as i64 - 1;
    for c in target.split(['/', '\\']) {
        match c {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

/// Checks the entries of one archive in order. Create one per archive.
#[derive(Debug)]
pub struct EntryCheck {
    policy: Policy,
    seen: BTreeMap<String, Kind>,
    bytes: u64,
    entries: usize,
}

impl EntryCheck {
    /// A check for one archive under `policy`.
    pub fn new(policy: Policy) -> EntryCheck {
        EntryCheck {
            policy,
            seen: BTreeMap::new(),
            bytes: 0,
            entries: 0,
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Checks the next entry: its raw name, what it is, and its permission bits. Returns the
    /// cleaned name, or `None` for a directory entry naming the archive's own top (`./`).
    pub fn check(&mut self, raw: &[u8], kind: &Kind, mode: u32) -> Result<Option<String>, Rule> {
        self.entries += 1;
        if self.entries > self.policy.max_entries {
            return Err(Rule::TooManyEntries {
                cap: self.policy.max_entries,
            });
        }
        let raw = std::str::from_utf8(raw).map_err(|_| Rule::NotUtf8)?;
        let name = clean_name(raw)?;
        if name.is_empty() {
            return match kind {
                Kind::Dir => Ok(None),
                _ => Err(Rule::EmptyPart),
            };
        }
        match kind {
            Kind::Dir => {}
            Kind::File { size } => {
                if mode & 0o6000 != 0 && !self.policy.setid_allowed.contains(&name) {
                    return Err(Rule::SetId {
                        mode: mode & 0o7777,
                    });
                }
                self.bytes = self.bytes.saturating_add(*size);
                if self.bytes > self.policy.max_bytes {
                    return Err(Rule::TooLarge {
                        cap: self.policy.max_bytes,
                    });
                }
            }
            Kind::Symlink(target) => {
                if target.is_empty() {
                    return Err(Rule::EmptyLink);
                }
                if target.contains('\0') {
                    return Err(Rule::Nul);
                }
                let absolute = target.starts_with(['/', '\\']);
                if (absolute && !self.policy.absolute_symlinks)
                    || (!absolute && relative_link_escapes(&name, target))
                {
                    return Err(Rule::LinkOutside {
                        kind: "symlink",
                        tree: self.policy.tree,
                        target: target.clone(),
                    });
                }
            }
            Kind::HardLink(target) => {
                if !self.policy.hard_links {
                    return Err(Rule::HardLink);
                }
                let t = clean_name(target).map_err(|_| Rule::LinkOutside {
                    kind: "hard link",
                    tree: self.policy.tree,
                    target: target.clone(),
                })?;
                if !matches!(self.seen.get(&t), Some(Kind::File { .. })) {
                    return Err(Rule::HardLinkTarget {
                        target: target.clone(),
                    });
                }
            }
            Kind::Special(what) => return Err(Rule::Special(what)),
            Kind::Unknown(what) => return Err(Rule::UnknownType(what.clone())),
            Kind::PaxSparse => return Err(Rule::PaxSparse),
        }
        // Every ancestor the archive itself placed must be a directory.
        let mut end = 0;
        while let Some(i) = name[end..].find('/') {
            let parent = &name[..end + i];
            if let Some(k) = self.seen.get(parent) {
                if *k != Kind::Dir {
                    return Err(Rule::ParentNotDir {
                        parent: parent.to_string(),
                        what: k.noun(),
                    });
                }
            }
            end += i + 1;
        }
        match (self.seen.get(&name), kind) {
            (None, _) => {}
            (Some(Kind::Dir), Kind::Dir) => return Ok(Some(name)),
            (Some(Kind::Dir), Kind::Symlink(_)) => return Err(Rule::DirReplacedByLink),
            (Some(_), _) => return Err(Rule::Duplicate),
        }
        if *kind != Kind::Dir {
            let prefix = format!("{name}/");
            if let Some((child, _)) = self.seen.range(prefix.clone()..).next() {
                if child.starts_with(&prefix) {
                    return Err(Rule::WouldBecomeParent {
                        child: child.clone(),
                        what: kind.noun(),
                    });
                }
            }
        }
        self.seen.insert(name.clone(), kind.clone());
        Ok(Some(name))
    }
}

mod limits;
mod pax;
use limits::human;
pub use limits::{tripped, Capped, Gap, Gapped, MAX_HEADER_BYTES};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_clean_or_name_the_rule() {
        let cases: &[(&str, Result<&str, Rule>)] = &[
            ("bin/containerd", Ok("bin/containerd")),
            ("./bridge", Ok("bridge")),
            ("././a/b/", Ok("a/b")),
            ("./", Ok("")),
            (".", Ok("")),
            ("/etc/passwd", Err(Rule::Absolute)),
            ("\\etc", Err(Rule::Absolute)),
            ("C:\\Windows\\x", Err(Rule::Absolute)),
            ("c:/x", Err(Rule::Absolute)),
            ("./C:", Err(Rule::Absolute)),
            (".//etc", Err(Rule::Absolute)),
            ("a/../../x", Err(Rule::DotDot)),
            ("..", Err(Rule::DotDot)),
            ("a\\..\\..\\x", Err(Rule::DotDot)),
            ("a//b", Err(Rule::EmptyPart)),
            ("a/./b", Err(Rule::EmptyPart)),
            ("a\0b", Err(Rule::Nul)),
        ];
        for (raw, want) in cases {
            assert_eq!(clean_name(raw), want.clone().map(str::to_string), "{raw:?}");
        }
    }

    #[test]
    fn relative_links_stay_inside() {
        let cases: &[(&str, &str, bool)] = &[
            ("bin/a", "b", false),
            ("bin/a", "../b", false),
            ("bin/a", "../../b", true),
            ("a", "../x", true),
            ("a", "./b", false),
            ("bin/a", "c/../../..", true),
            ("a/b/c", "../../x/../y", false),
            ("a/b", "..\\..\\x", true),
        ];
        for (e, t, want) in cases {
            assert_eq!(relative_link_escapes(e, t), *want, "{e} -> {t}");
        }
    }

    type Entries<'a> = &'a [(&'a str, Kind, u32)];

    fn run(policy: Policy, entries: Entries<'_>) -> Result<(), (String, Rule)> {
        let mut c = EntryCheck::new(policy);
        for (name, kind, mode) in entries {
            c.check(name.as_bytes(), kind, *mode)
                .map_err(|r| (name.to_string(), r))?;
        }
        Ok(())
    }

    #[test]
    fn layout_rules() {
        use Kind::*;
        let f = File { size: 1 };
        let link = |t: &str| Symlink(t.to_string());
        let refused: &[(Entries<'_>, &str)] = &[
            (
                &[("a", link("/etc"), 0o777), ("a/x", f.clone(), 0o644)],
                "a/x",
            ),
            (&[("a", link("b"), 0o777), ("a/b/c", Dir, 0o755)], "a/b/c"),
            (&[("a", f.clone(), 0o644), ("a/x", f.clone(), 0o644)], "a/x"),
            (
                &[("a/x", f.clone(), 0o644), ("a", link("/etc"), 0o777)],
                "a",
            ),
            (&[("a", Dir, 0o755), ("a", link("/etc"), 0o777)], "a"),
            (&[("a", f.clone(), 0o644), ("a", f.clone(), 0o644)], "a"),
            (&[("s", File { size: 0 }, 0o4755)], "s"),
            (&[("s", File { size: 0 }, 0o2755)], "s"),
            (&[("a", Special("FIFO"), 0o644)], "a"),
            (&[("./", f.clone(), 0o644)], "./"),
        ];
        for (entries, bad) in refused {
            let err = run(Policy::layer(), entries).unwrap_err();
            assert_eq!(err.0, *bad, "{entries:?}: {}", err.1);
        }
        // Repeated directories, a link beside (not above) files, the archive's own `./`.
        run(
            Policy::layer(),
            &[
                ("./", Dir, 0o755),
                ("usr", Dir, 0o755),
                ("usr", Dir, 0o755),
                ("usr/lib", Dir, 0o755),
                ("usr/lib/a", f.clone(), 0o644),
                ("usr/lib/ab", link("a"), 0o777),
                ("usr/lib.d", link("/usr/lib"), 0o777),
            ],
        )
        .unwrap();
        // The allow-list admits exactly its paths.
        let mut p = Policy::layer();
        p.setid_allowed.insert("usr/bin/newuidmap".into());
        run(p.clone(), &[("usr/bin/newuidmap", f.clone(), 0o4755)]).unwrap();
        assert!(run(p, &[("usr/bin/other", f.clone(), 0o4755)]).is_err());
    }

    #[test]
    fn hard_links_and_absolute_links_follow_the_policy() {
        use Kind::*;
        let f = File { size: 1 };
        let up = Policy::upstream();
        run(
            up.clone(),
            &[
                ("a", f.clone(), 0o644),
                ("b", HardLink("./a".into()), 0o644),
            ],
        )
        .unwrap();
        for entries in [
            vec![("b", HardLink("a".into()), 0o644)],
            vec![("a", Dir, 0o755), ("b", HardLink("a".into()), 0o644)],
            vec![("b", HardLink("../x".into()), 0o644)],
            vec![("b", Symlink("/etc/shadow".into()), 0o777)],
        ] {
            assert!(run(up.clone(), &entries).is_err(), "{entries:?}");
        }
        assert_eq!(
            run(
                Policy::layer(),
                &[("a", f.clone(), 0o644), ("b", HardLink("a".into()), 0o644)]
            )
            .unwrap_err()
            .1,
            Rule::HardLink
        );
        run(
            Policy::layer(),
            &[("b", Symlink("/etc/shadow".into()), 0o777)],
        )
        .unwrap();
    }

    #[test]
    fn the_size_cap_counts_declared_and_read_bytes() {
        let mut p = Policy::upstream();
        p.max_bytes = 10;
        let ten = Kind::File { size: 10 };
        run(p.clone(), &[("a", ten.clone(), 0o644)]).unwrap();
        let err = run(
            p,
            &[("a", ten, 0o644), ("b", Kind::File { size: 1 }, 0o644)],
        )
        .unwrap_err();
        assert_eq!(err, ("b".to_string(), Rule::TooLarge { cap: 10 }));

        let (mut r, flag) = Capped::new(&[7u8; 10][..], 10);
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        assert_eq!(v.len(), 10);
        assert!(!tripped(&flag));
        let (mut r, flag) = Capped::new(&[7u8; 11][..], 10);
        assert!(r.read_to_end(&mut Vec::new()).is_err());
        assert!(tripped(&flag));
    }
}
