//! `kiln install --root DIR LAYER.tar.zst`: applies a rootfs layer to a mounted root (or `/`
//! inside a Packer/image-builder VM). Idempotent, all or nothing, and it never touches a file
//! it does not own: ownership is recorded in `/usr/lib/kiln/install.manifest`.
//!
//! In order: the layer is checked against its `SHA256SUMS` (and signature) before the root
//! is looked at ([`verify`]); every entry is checked against the archive rules
//! ([`crate::archive_rules`]); the whole change is planned against the root; then every file
//! is staged beside its target and the plan is committed, or rolled back on the first
//! failure (`apply`). All paths resolve inside the root ([`root`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use sha2::{Digest, Sha256};

use crate::archive_rules::{self, Capped, EntryCheck, Gap, Gapped, Kind, Policy};
use crate::layer_contract::INSTALL_MANIFEST;

mod apply;
pub mod root;
pub mod verify;

pub use crate::layer_contract::install_manifest::{self as manifest, parse_manifest, Owned};
pub use root::Resolver;
pub use verify::{LayerTrust, Verification};

use root::{Dir, Node, Root};

mod error;
pub use error::InstallError;
use error::{hostile, io_err, split};

/// How to install.
#[derive(Debug, Clone)]
pub struct InstallOptions {
    /// Check and report, write nothing.
    pub dry_run: bool,
    /// What the layer must prove first.
    pub trust: LayerTrust,
    /// Paths (without the leading `/`) that may be installed setuid/setgid.
    pub allow_setid: BTreeSet<String>,
    /// The most the layer may unpack to.
    pub max_bytes: u64,
    /// Force a path resolver (default: `openat2` where the kernel has it).
    pub resolver: Option<Resolver>,
    /// Fault injection for tests: the change with this index (0-based, counting directories
    /// made, files staged, renames and removals) fails as if the disk had.
    #[doc(hidden)]
    pub fail_at: Option<usize>,
    /// Flush every file and directory as it is committed (the default: a power cut leaves
    /// the old or the new file, never an empty one). `kiln image` turns it off: it writes into
    /// a throw-away working copy that is flushed once, whole, before it is published.
    pub durable: bool,
}

impl InstallOptions {
    /// Defaults: checked against `SHA256SUMS` beside the layer, no setuid, 4 GiB cap.
    pub fn new(trust: LayerTrust) -> InstallOptions {
        InstallOptions {
            dry_run: false,
            trust,
            allow_setid: BTreeSet::new(),
            max_bytes: archive_rules::DEFAULT_MAX_BYTES,
            resolver: None,
            fail_at: None,
            durable: true,
        }
    }

    fn policy(&self) -> Policy {
        let mut p = Policy::layer();
        p.setid_allowed = self.allow_setid.clone();
        p.max_bytes = self.max_bytes;
        p
    }
}

/// What one install did, by layer path.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct InstallReport {
    /// What was proven about the layer.
    pub verified: Option<Verification>,
    /// Files and links written (new or updated).
    pub written: Vec<String>,
    /// Files and links already as the layer wants them.
    pub unchanged: Vec<String>,
    /// Files from an earlier install that this layer no longer has, removed.
    pub removed: Vec<String>,
    /// Files from an earlier install that were modified since; left alone.
    pub kept_modified: Vec<String>,
    /// Directories created.
    pub dirs_created: Vec<String>,
}

/// One layer entry to apply.
#[derive(Debug, Clone)]
enum Want {
    Dir,
    File { mode: u32, sha256: String },
    Link { target: String },
}

impl Want {
    fn owned(&self) -> Option<Owned> {
        match self {
            Want::Dir => None,
            Want::File { mode, sha256 } => Some(Owned {
                sha256: sha256.clone(),
                mode: format!("{mode:04o}"),
            }),
            Want::Link { target } => Some(Owned {
                sha256: hex::encode(Sha256::digest(target.as_bytes())),
                mode: "link".into(),
            }),
        }
    }
}

/// Hashes what passes through, so every pass over the layer proves it read the verified bytes.
struct Tee<R> {
    inner: R,
    h: Option<Sha256>,
}

impl<R: Read> Read for Tee<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(h) = &mut self.h {
            h.update(&buf[..n]);
        }
        Ok(n)
    }
}

/// One pass over the layer: every entry checked under `policy`, `each` called with the
/// cleaned name, the raw name, what it is, its mode and its content. With `sha256` (the
/// verified hash), the whole file must hash to it at the end, or nothing read in the pass
/// counts: the pass whose bytes are written uses it (hashing costs about as much as
/// decompressing, so the planning pass, whose every file hash the writing pass re-checks,
/// does without).
fn read_layer(
    file: &File,
    archive: &Path,
    policy: &Policy,
    sha256: Option<&str>,
    mut each: impl FnMut(&str, &str, &Kind, u32, &mut dyn Read) -> Result<(), InstallError>,
) -> Result<(), InstallError> {
    let mut f = file.try_clone().map_err(io_err(archive))?;
    f.rewind().map_err(io_err(archive))?;
    let tee = Tee {
        inner: f,
        h: sha256.map(|_| Sha256::new()),
    };
    let dec = zstd::Decoder::new(tee).map_err(io_err(archive))?;
    let gap = Gap::new();
    let (capped, flag) = Capped::new(Gapped::new(dec, gap.clone()), policy.stream_cap());
    let mut tar = tar::Archive::new(capped);
    let mut last = String::from("(before the first entry)");
    let read_err = |last: &str, e: io::Error| {
        if gap.tripped() {
            hostile(
                archive,
                last,
                archive_rules::Rule::HeaderTooLarge {
                    cap: archive_rules::MAX_HEADER_BYTES,
                }
                .to_string(),
            )
        } else if archive_rules::tripped(&flag) {
            hostile(
                archive,
                last,
                archive_rules::Rule::TooLarge {
                    cap: policy.max_bytes,
                }
                .to_string(),
            )
        } else {
            io_err(archive)(e)
        }
    };
    let mut check = EntryCheck::new(policy.clone());
    for e in tar.entries().map_err(|e| read_err(&last, e))? {
        let mut e = e.map_err(|e| read_err(&last, e))?;
        gap.allow(e.size());
        last = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let Some(kind) = archive_rules::tar_kind(&mut e) else {
            continue;
        };
        let mode = e.header().mode().map_err(io_err(archive))? & 0o7777;
        let raw = e.path_bytes().into_owned();
        let Some(name) = check
            .check(&raw, &kind, mode)
            .map_err(|r| hostile(archive, &last, r.to_string()))?
        else {
            continue;
        };
        each(&name, &last, &kind, mode, &mut e).map_err(|err| match err {
            InstallError::Io { source, .. } if archive_rules::tripped(&flag) => {
                read_err(&last, source)
            }
            other => other,
        })?;
    }
    let Some(sha256) = sha256 else {
        return Ok(());
    };
    // Read what follows the end-of-archive marker too, so the hash covers the whole file.
    gap.allow(u64::MAX);
    let mut rest = tar.into_inner().into_inner().into_inner().finish();
    io::copy(&mut rest, &mut io::sink()).map_err(io_err(archive))?;
    let got = hex::encode(rest.into_inner().h.unwrap_or_default().finalize());
    if got != sha256 {
        return Err(hostile(
            archive,
            "(whole layer)",
            format!("the file changed while it was read (sha256 {got}, verified {sha256})"),
        ));
    }
    Ok(())
}

/// Reads the whole layer once: every entry checked, every file hashed.
fn scan(
    file: &File,
    archive: &Path,
    policy: &Policy,
) -> Result<BTreeMap<String, Want>, InstallError> {
    let mut out = BTreeMap::new();
    read_layer(file, archive, policy, None, |name, _, kind, mode, r| {
        let want = match kind {
            Kind::Dir => Want::Dir,
            Kind::File { .. } => {
                let mut h = Sha256::new();
                io::copy(r, &mut h).map_err(io_err(archive))?;
                Want::File {
                    mode,
                    sha256: hex::encode(h.finalize()),
                }
            }
            Kind::Symlink(target) => Want::Link {
                target: target.clone(),
            },
            // The layer policy refuses everything else before it gets here.
            _ => return Ok(()),
        };
        out.insert(name.to_string(), want);
        Ok(())
    })?;
    Ok(out)
}

/// A directory the plan needs: there already (open), or to be made.
#[derive(Debug, Clone)]
enum Parent {
    Exists(Rc<Dir>),
    Planned,
}

/// Resolves the directories a plan touches, once each, and lists those to create.
struct Planner<'a> {
    root: &'a Root,
    manifest: PathBuf,
    dirs: BTreeMap<String, Parent>,
    mkdirs: Vec<String>,
}

impl Planner<'_> {
    fn not_owned(&self, rel: &str, why: String) -> InstallError {
        InstallError::NotOwned {
            path: self.root.host_path(rel),
            why,
            manifest: self.manifest.clone(),
        }
    }

    /// The directory `rel`, following root symlinks inside the root. With `create`, a
    /// missing one is planned (with its missing parents); without, `None`.
    fn dir(&mut self, rel: &str, create: bool) -> Result<Option<Parent>, InstallError> {
        if let Some(p) = self.dirs.get(rel) {
            return Ok(Some(p.clone()));
        }
        if rel.is_empty() {
            let p = Parent::Exists(Rc::new(self.root.top()));
            self.dirs.insert(String::new(), p.clone());
            return Ok(Some(p));
        }
        let (up, name) = split(rel);
        let Some(parent) = self.dir(up, create)? else {
            return Ok(None);
        };
        let host = self.root.host_path(rel);
        let me = match parent {
            Parent::Planned => Parent::Planned,
            Parent::Exists(d) => match d.node(name).map_err(io_err(&host))? {
                Node::Missing => Parent::Planned,
                Node::Dir => Parent::Exists(Rc::new(d.subdir(name).map_err(io_err(&host))?)),
                // A symlink to a directory (merged /usr, a bind layout) is followed inside
                // the root, like every other parent.
                Node::Symlink => match self.root.dir(rel) {
                    Ok(Some(d)) => Parent::Exists(Rc::new(d)),
                    Ok(None) => {
                        return Err(self.not_owned(
                            rel,
                            format!("is a symlink that leads nowhere inside the root, but /{rel} must be a directory"),
                        ))
                    }
                    Err(e) => {
                        return Err(self.not_owned(
                            rel,
                            format!("is a symlink that does not lead to a directory inside the root ({e}), but /{rel} must be one"),
                        ))
                    }
                },
                Node::File { .. } | Node::Special => {
                    return Err(self.not_owned(
                        rel,
                        format!("is not a directory, but /{rel} must be one"),
                    ))
                }
            },
        };
        if matches!(me, Parent::Planned) {
            if !create {
                return Ok(None);
            }
            self.mkdirs.push(rel.to_string());
        }
        self.dirs.insert(rel.to_string(), me.clone());
        Ok(Some(me))
    }
}

/// What is at `name` in `dir` now: `None`, a dir (`Some(None)`), or what a manifest line
/// would say about the file or link there.
fn current(dir: &Dir, name: &str) -> Result<Option<Option<Owned>>, InstallError> {
    let host = dir.host(name);
    Ok(match dir.node(name).map_err(io_err(&host))? {
        Node::Missing => None,
        Node::Dir => Some(None),
        Node::Symlink => {
            let t = dir.read_link(name).map_err(io_err(&host))?;
            Some(Some(Owned {
                sha256: hex::encode(Sha256::digest(&t)),
                mode: "link".into(),
            }))
        }
        Node::File { mode } => {
            let mut f = dir.open_file(name).map_err(io_err(&host))?;
            let mut h = Sha256::new();
            io::copy(&mut f, &mut h).map_err(io_err(&host))?;
            Some(Some(Owned {
                sha256: hex::encode(h.finalize()),
                mode: format!("{mode:04o}"),
            }))
        }
        Node::Special => Some(Some(Owned {
            sha256: String::new(),
            mode: "special".into(),
        })),
    })
}

/// The most an install manifest in the root may hold.
const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// Reads the root's install manifest, if there is one (never through a symlink).
fn read_old_manifest(planner: &mut Planner<'_>) -> Result<BTreeMap<String, Owned>, InstallError> {
    let (up, name) = split(INSTALL_MANIFEST);
    let host = planner.root.host_path(INSTALL_MANIFEST);
    let Some(Parent::Exists(d)) = planner.dir(up, false)? else {
        return Ok(BTreeMap::new());
    };
    match d.node(name).map_err(io_err(&host))? {
        Node::Missing => Ok(BTreeMap::new()),
        Node::File { .. } => {
            let f = d.open_file(name).map_err(io_err(&host))?;
            let mut b = Vec::new();
            f.take(MAX_MANIFEST_BYTES + 1)
                .read_to_end(&mut b)
                .map_err(io_err(&host))?;
            if b.len() as u64 > MAX_MANIFEST_BYTES {
                return Err(planner.not_owned(
                    INSTALL_MANIFEST,
                    "is larger than 16 MiB, not an install manifest".into(),
                ));
            }
            Ok(parse_manifest(&String::from_utf8_lossy(&b), &host)?)
        }
        _ => Err(planner.not_owned(
            INSTALL_MANIFEST,
            "is not a regular file (a symlink or special file where the install manifest belongs)"
                .into(),
        )),
    }
}

/// Applies the rootfs layer `archive` to `root` under `opts`.
#[allow(
    clippy::too_many_lines,
    reason = "verify, plan and commit-or-roll-back share the open root and the plan; the all-or-nothing guarantee is easiest to review when that sequence is in one place"
)]
pub fn install(
    archive: &Path,
    root: &Path,
    opts: &InstallOptions,
) -> Result<InstallReport, InstallError> {
    let root_err = |why: String| InstallError::Root {
        root: root.to_path_buf(),
        why,
    };
    let meta = match std::fs::metadata(root) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(root_err("does not exist: kiln install applies a layer to an existing root (a mounted image, / in a build VM, or a directory made for it) and creates none".into()))
        }
        r => r.map_err(io_err(root))?,
    };
    if !meta.is_dir() {
        return Err(root_err("is not a directory".into()));
    }
    let rootfs = Root::open(root, opts.resolver).map_err(io_err(root))?;

    // 1. What the layer is, before anything in the root is looked at.
    let mut file = File::open(archive).map_err(io_err(archive))?;
    let verified = verify::verify_layer(&mut file, archive, &opts.trust)?;
    // 2. Every entry checked, every file hashed.
    let policy = opts.policy();
    let wants = scan(&file, archive, &policy)?;
    if !matches!(wants.get(INSTALL_MANIFEST), Some(Want::File { .. })) {
        return Err(hostile(
            archive,
            INSTALL_MANIFEST,
            "missing: not a kiln rootfs layer (bake it with --format rootfs)",
        ));
    }

    // 3. The plan: every check against the root before the first change.
    let mut planner = Planner {
        root: &rootfs,
        manifest: rootfs.host_path(INSTALL_MANIFEST),
        dirs: BTreeMap::new(),
        mkdirs: Vec::new(),
    };
    let old = read_old_manifest(&mut planner)?;
    let mut report = InstallReport {
        verified: Some(verified.clone()),
        ..Default::default()
    };
    let mut plan = apply::Plan::default();
    for (path, want) in &wants {
        let Some(new) = want.owned() else {
            planner.dir(path, true)?;
            continue;
        };
        let (up, name) = split(path);
        let parent = planner.dir(up, true)?.expect("created on demand");
        let now = match &parent {
            Parent::Planned => None,
            Parent::Exists(d) => current(d, name)?,
        };
        let replace = now.is_some();
        match now {
            None => {}
            Some(None) => {
                return Err(planner.not_owned(path, "is a directory, the layer has a file here".into()))
            }
            Some(Some(cur)) if cur == new && path != INSTALL_MANIFEST => {
                report.unchanged.push(path.clone());
                continue;
            }
            Some(Some(_)) if path == INSTALL_MANIFEST => {}
            Some(Some(cur)) => match old.get(path) {
                Some(o) if *o == cur => {}
                Some(o) => {
                    return Err(planner.not_owned(
                        path,
                        format!(
                            "was modified since kiln installed it (sha256 {} mode {}, installed {} mode {}); restore or remove it",
                            cur.sha256, cur.mode, o.sha256, o.mode
                        ),
                    ))
                }
                None => {
                    return Err(planner.not_owned(
                        path,
                        format!(
                            "exists and was not installed by kiln (sha256 {} mode {}); remove it or the package that owns it",
                            cur.sha256, cur.mode
                        ),
                    ))
                }
            },
        }
        plan.write.insert(
            path.clone(),
            apply::Write {
                parent: up.to_string(),
                name: name.to_string(),
                replace,
            },
        );
    }
    for (path, o) in &old {
        if wants.contains_key(path) || path == INSTALL_MANIFEST {
            continue;
        }
        let (up, name) = split(path);
        let Some(Parent::Exists(d)) = planner.dir(up, false)? else {
            continue;
        };
        match current(&d, name)? {
            None => {}
            Some(Some(cur)) if cur == *o => {
                plan.remove
                    .push((path.clone(), up.to_string(), name.to_string()))
            }
            Some(_) => report.kept_modified.push(path.clone()),
        }
    }
    plan.mkdirs = planner.mkdirs.clone();
    report.dirs_created = plan.mkdirs.clone();
    report.written = plan
        .write
        .keys()
        .filter(|p| *p != INSTALL_MANIFEST)
        .cloned()
        .collect();
    report.removed = plan.remove.iter().map(|(p, _, _)| p.clone()).collect();
    if opts.dry_run {
        return Ok(report);
    }

    // 4. Stage every file beside its target, then commit; undo everything on a failure.
    let dirs: BTreeMap<String, Rc<Dir>> = planner
        .dirs
        .iter()
        .filter_map(|(k, v)| match v {
            Parent::Exists(d) => Some((k.clone(), d.clone())),
            Parent::Planned => None,
        })
        .collect();
    let mut tx = apply::Transaction::new(&rootfs, dirs, opts.fail_at, opts.durable);
    let staged = tx.run(|tx| {
        tx.make_dirs(&plan.mkdirs)?;
        read_layer(
            &file,
            archive,
            &policy,
            Some(&verified.sha256),
            |name, raw, kind, _, r| {
                let Some(w) = plan.write.get(name) else {
                    return Ok(());
                };
                match (wants.get(name), kind) {
                    (Some(Want::File { mode, sha256 }), Kind::File { .. }) => {
                        tx.stage_file(name, w, r, *mode, sha256, archive, raw)
                    }
                    (Some(Want::Link { target }), Kind::Symlink(_)) => {
                        tx.stage_link(name, w, target)
                    }
                    _ => Err(hostile(
                        archive,
                        raw,
                        "changed type between the check and the write",
                    )),
                }
            },
        )?;
        for p in plan.write.keys() {
            if !tx.is_staged(p) {
                return Err(hostile(
                    archive,
                    p,
                    "vanished between the check and the write",
                ));
            }
        }
        // The manifest goes last, so an interrupted commit still lists every file it owned.
        let order: Vec<&String> = plan
            .write
            .keys()
            .filter(|p| *p != INSTALL_MANIFEST)
            .chain(plan.write.keys().filter(|p| *p == INSTALL_MANIFEST))
            .collect();
        for p in &plan.remove {
            tx.remove(&p.1, &p.2)?;
        }
        for p in order {
            tx.commit(p)?;
        }
        Ok(())
    });
    staged?;
    Ok(report)
}
