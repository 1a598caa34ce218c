//! The unprivileged mode (`kiln image --via debugfs`): the same install, sysext placement and
//! node files as the rootful mode, with no mount.
//!
//! 1. **Mirror.** What the operations will look at (the paths of the new and the old install
//!    manifests, `image.env`, `/etc/kiln/`, `/etc/extensions/`) is copied out of the image
//!    with debugfs into a staging directory, with each path's ancestors as directories.
//! 2. **Apply.** `kiln install`, the sysext placement and the node files run against the
//!    staging directory, with all their rules (verification, ownership, idempotence,
//!    removals): the same code as the rootful mode, on a smaller root.
//! 3. **Commit.** What changed in the staging directory (a new inode, size, mode or time
//!    against the mirrored snapshot; a path that disappeared) is written into the image in one
//!    debugfs session: directories first, then removals, then files and links, the install
//!    manifest last. Owner is root (0:0), modes are the staged ones.
//! 4. **Check.** Each written entry is listed again (type, mode, owner, size) and every file
//!    read back and compared byte for byte; then `e2fsck -fn` checks the whole filesystem.
//!
//! debugfs does not follow a symbolic link in the middle of a path, so a base whose directory
//! on the way to a layer path is a symlink is refused with the path named (the rootful mode
//! resolves it inside the image).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::image::debugfs::{safe, Entry, Fs, S_IFDIR, S_IFLNK, S_IFREG};
use crate::image::error::{io_err, ImageError};

/// What was staged, and what the image held, before the operations ran.
#[derive(Debug)]
pub struct Mirror {
    fs: Fs,
    staging: PathBuf,
    /// Directories that exist in the image (relative paths, `""` for the root).
    image_dirs: BTreeSet<String>,
    /// Files and links that exist in the image, with their entry.
    image_has: BTreeMap<String, Entry>,
    /// The staged copy of each, as `lstat` saw it after mirroring.
    before: BTreeMap<String, Snap>,
}

/// What identifies a staged entry: any change by the operations replaces the inode or
/// changes one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snap {
    ino: u64,
    mtime: (i64, i64),
    size: u64,
    mode: u32,
}

fn snap(m: &fs::Metadata) -> Snap {
    Snap {
        ino: m.ino(),
        mtime: (m.mtime(), m.mtime_nsec()),
        size: m.size(),
        mode: m.mode(),
    }
}

/// What the commit wrote, as relative paths.
#[derive(Debug, Default, Clone)]
pub struct Changes {
    /// Directories created.
    pub dirs: Vec<String>,
    /// Files and links written.
    pub written: Vec<String>,
    /// Files and links removed.
    pub removed: Vec<String>,
}

fn refuse(fs_image: &Path, path: &str, why: &str) -> ImageError {
    ImageError::Io {
        path: fs_image.to_path_buf(),
        source: std::io::Error::other(format!(
            "/{path}: {why}; the unprivileged mode (debugfs) cannot write there, run kiln image as root (--via loop)"
        )),
    }
}

fn abs(rel: &str) -> String {
    format!("/{rel}")
}

fn parent(rel: &str) -> &str {
    rel.rsplit_once('/').map_or("", |(p, _)| p)
}

fn ancestors(rel: &str) -> impl Iterator<Item = &str> {
    let mut v = vec![""];
    for (i, b) in rel.bytes().enumerate() {
        if b == b'/' {
            v.push(&rel[..i]);
        }
    }
    v.into_iter()
}

/// Copies `paths` (files or links, relative) and every entry of `whole` (directories whose
/// files an operation reads all of) out of the filesystem into `staging`.
pub fn mirror(
    fs_: Fs,
    image: &Path,
    staging: &Path,
    paths: &BTreeSet<String>,
    whole: &[&str],
) -> Result<Mirror, ImageError> {
    for p in paths
        .iter()
        .map(String::as_str)
        .chain(whole.iter().copied())
    {
        if !safe(p) {
            return Err(refuse(
                image,
                p,
                "has bytes debugfs's command parser would split",
            ));
        }
    }
    let mut dirs: BTreeSet<&str> = paths.iter().flat_map(|p| ancestors(p)).collect();
    for w in whole {
        dirs.extend(ancestors(w));
        dirs.insert(w);
    }
    let list: Vec<String> = dirs.iter().map(|d| abs(d)).collect();
    let listed = fs_.list(&list, staging)?;
    let entry = |rel: &str| -> Option<Entry> {
        let (up, name) = rel.rsplit_once('/').unwrap_or(("", rel));
        listed.get(&abs(up))?.get(name).copied()
    };
    // Which directories exist, refusing a symlink (or anything else) on the way.
    let mut image_dirs = BTreeSet::from([String::new()]);
    for d in dirs.iter().filter(|d| !d.is_empty()) {
        if !image_dirs.contains(parent(d)) {
            continue;
        }
        match entry(d) {
            None => {}
            Some(e) if e.kind() == S_IFDIR => {
                image_dirs.insert(d.to_string());
            }
            Some(e) if e.kind() == S_IFLNK => {
                return Err(refuse(image, d, "is a symbolic link in the base"))
            }
            Some(e) => {
                return Err(refuse(
                    image,
                    d,
                    &format!("is not a directory in the base (mode {:o})", e.mode),
                ))
            }
        }
    }
    let mut wanted: BTreeSet<String> = paths.clone();
    for w in whole {
        if let Some(m) = listed.get(&abs(w)) {
            wanted.extend(m.keys().map(|n| format!("{w}/{n}")));
        }
    }
    let mut image_has = BTreeMap::new();
    let mut script = String::new();
    for d in &image_dirs {
        let perm = entry(d).map_or(0o755, |e| e.mode & 0o7777) | 0o700;
        let host = staging.join(d);
        fs::create_dir_all(&host).map_err(io_err(&host))?;
        fs::set_permissions(&host, fs::Permissions::from_mode(perm)).map_err(io_err(&host))?;
    }
    for p in &wanted {
        if !image_dirs.contains(parent(p)) {
            continue;
        }
        let Some(e) = entry(p) else { continue };
        match e.kind() {
            S_IFDIR => {
                // Staged as an empty directory: the operations refuse a file over it.
                let host = staging.join(p);
                fs::create_dir_all(&host).map_err(io_err(&host))?;
            }
            S_IFREG | S_IFLNK => {
                let up = if parent(p).is_empty() { "." } else { parent(p) };
                script.push_str(&format!("rdump {} {up}\n", abs(p)));
                image_has.insert(p.clone(), e);
            }
            _ => {
                return Err(refuse(
                    image,
                    p,
                    &format!("is a special file in the base (mode {:o})", e.mode),
                ))
            }
        }
    }
    if !script.is_empty() {
        // As a user, rdump cannot give the copies root's ownership, and says so.
        fs_.run(&script, false, staging, &["while changing ownership"])?;
    }
    let mut before = BTreeMap::new();
    for p in image_has.keys() {
        let host = staging.join(p);
        let m = fs::symlink_metadata(&host).map_err(|e| ImageError::Tool {
            tool: "debugfs".into(),
            why: format!("/{p} was listed in the image but not copied out ({e})"),
        })?;
        before.insert(p.clone(), snap(&m));
    }
    Ok(Mirror {
        fs: fs_,
        staging: staging.to_path_buf(),
        image_dirs,
        image_has,
        before,
    })
}

/// Every entry under `root`, by relative path (no symlink followed).
fn walk(root: &Path) -> Result<BTreeMap<String, fs::Metadata>, ImageError> {
    let mut out = BTreeMap::new();
    let mut todo = vec![String::new()];
    while let Some(rel) = todo.pop() {
        let dir = root.join(&rel);
        for e in fs::read_dir(&dir).map_err(io_err(&dir))? {
            let e = e.map_err(io_err(&dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            let p = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let m = e.metadata().map_err(io_err(&e.path()))?;
            if m.is_dir() {
                todo.push(p.clone());
            }
            out.insert(p, m);
        }
    }
    Ok(out)
}

impl Mirror {
    /// The staging directory the operations run against.
    pub fn root(&self) -> &Path {
        &self.staging
    }

    /// Writes what the operations changed into the image, then checks it. `last` is written
    /// after everything else (the install manifest).
    pub fn commit(&self, image: &Path, last: &str, scratch: &Path) -> Result<Changes, ImageError> {
        let now = walk(&self.staging)?;
        let mut ch = Changes::default();
        let mut script = String::new();
        for (p, m) in &now {
            if m.is_dir() && !self.image_dirs.contains(p) {
                if !safe(p) {
                    return Err(refuse(
                        image,
                        p,
                        "has bytes debugfs's command parser would split",
                    ));
                }
                script.push_str(&format!(
                    "mkdir {0}\nsif {0} mode 0{1:o}\n",
                    abs(p),
                    S_IFDIR | (m.mode() & 0o7777)
                ));
                ch.dirs.push(p.clone());
            }
        }
        for p in self.before.keys() {
            if !now.contains_key(p) {
                script.push_str(&format!("rm {}\n", abs(p)));
                ch.removed.push(p.clone());
            }
        }
        let changed: Vec<&String> = now
            .iter()
            .filter(|(p, m)| !m.is_dir() && self.before.get(*p) != Some(&snap(m)))
            .map(|(p, _)| p)
            .collect();
        let order = changed
            .iter()
            .filter(|p| p.as_str() != last)
            .chain(changed.iter().filter(|p| p.as_str() == last));
        for p in order {
            let m = &now[*p];
            if !safe(p) {
                return Err(refuse(
                    image,
                    p,
                    "has bytes debugfs's command parser would split",
                ));
            }
            if self.image_has.contains_key(*p) {
                script.push_str(&format!("rm {}\n", abs(p)));
            }
            if m.file_type().is_symlink() {
                let host = self.staging.join(p);
                let target = fs::read_link(&host).map_err(io_err(&host))?;
                let t = target.to_string_lossy();
                if !safe(&t) {
                    return Err(refuse(
                        image,
                        p,
                        "is a link whose target debugfs's parser would split",
                    ));
                }
                script.push_str(&format!("symlink {} {t}\n", abs(p)));
            } else if m.is_file() {
                script.push_str(&format!(
                    "write {p} {0}\nsif {0} mode 0{1:o}\nsif {0} uid 0\nsif {0} gid 0\n",
                    abs(p),
                    S_IFREG | (m.mode() & 0o7777)
                ));
            } else {
                return Err(refuse(
                    image,
                    p,
                    "was left as a special file by the install",
                ));
            }
            ch.written.push((*p).clone());
        }
        if !script.is_empty() {
            self.fs.run(&script, true, &self.staging, &[])?;
        }
        self.check(image, &now, &ch, scratch)?;
        Ok(ch)
    }

    /// Lists every changed entry again and reads every written file back.
    fn check(
        &self,
        image: &Path,
        now: &BTreeMap<String, fs::Metadata>,
        ch: &Changes,
        scratch: &Path,
    ) -> Result<(), ImageError> {
        let touched: BTreeSet<&str> = ch
            .dirs
            .iter()
            .chain(&ch.written)
            .chain(&ch.removed)
            .map(|p| parent(p))
            .collect();
        let dirs: Vec<String> = touched.iter().map(|d| abs(d)).collect();
        let listed = self.fs.list(&dirs, &self.staging)?;
        let wrong = |p: &str, why: String| ImageError::Tool {
            tool: "debugfs".into(),
            why: format!("{}: after the write, /{p} {why}", image.display()),
        };
        let get = |p: &str| {
            let (up, name) = p.rsplit_once('/').unwrap_or(("", p));
            listed.get(&abs(up)).and_then(|m| m.get(name)).copied()
        };
        for p in &ch.removed {
            if get(p).is_some() {
                return Err(wrong(p, "is still there".into()));
            }
        }
        for p in &ch.dirs {
            match get(p) {
                Some(e) if e.kind() == S_IFDIR => {}
                other => return Err(wrong(p, format!("is not a directory ({other:?})"))),
            }
        }
        let verify = tempfile::Builder::new()
            .prefix(crate::image::leftovers::PREFIX)
            .tempdir_in(scratch)
            .map_err(io_err(scratch))?;
        let mut script = String::new();
        for p in &ch.written {
            let m = &now[p];
            let (kind, size) = if m.file_type().is_symlink() {
                (S_IFLNK, m.size())
            } else {
                (S_IFREG, m.size())
            };
            let want = kind
                | if kind == S_IFLNK {
                    0o777
                } else {
                    m.mode() & 0o7777
                };
            match get(p) {
                Some(e) if e.mode == want && e.uid == 0 && e.gid == 0 && e.size == size => {}
                other => {
                    return Err(wrong(
                        p,
                        format!("is {other:?}, expected mode {want:o}, owner 0:0, {size} bytes"),
                    ))
                }
            }
            if kind == S_IFREG {
                script.push_str(&format!("dump {} {}\n", abs(p), p.replace('/', "%")));
            }
        }
        if !script.is_empty() {
            self.fs.run(&script, false, verify.path(), &[])?;
            for p in ch.written.iter().filter(|p| now[*p].is_file()) {
                let a = self.staging.join(p);
                let b = verify.path().join(p.replace('/', "%"));
                if !same_bytes(&a, &b)? {
                    return Err(wrong(p, "differs from the staged file".into()));
                }
                let _ = fs::remove_file(&b);
            }
        }
        self.fs.check()
    }
}

fn same_bytes(a: &Path, b: &Path) -> Result<bool, ImageError> {
    let (mut x, mut y) = (
        fs::File::open(a).map_err(io_err(a))?,
        fs::File::open(b).map_err(io_err(b))?,
    );
    let (mut bx, mut by) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = read_full(&mut x, &mut bx).map_err(io_err(a))?;
        let m = read_full(&mut y, &mut by).map_err(io_err(b))?;
        if n != m || bx[..n] != by[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ancestors_and_parents() {
        let a: Vec<&str> = ancestors("usr/lib/kiln/x").collect();
        assert_eq!(a, ["", "usr", "usr/lib", "usr/lib/kiln"]);
        assert_eq!(parent("etc"), "");
        assert_eq!(parent("etc/kiln/node.env"), "etc/kiln");
    }
}
