//! The root `kiln install` writes into, reached only through directory file descriptors.
//!
//! A path is resolved the way a chroot would see it: a symlink in the root (merged `/usr`, an
//! `/etc/systemd/system` bind layout) is followed, but an absolute target or a `..` stops at
//! the root, so no symlink can lead out of it. With `openat2(RESOLVE_IN_ROOT)` (Linux 5.6+)
//! the kernel does this; elsewhere a walk that opens one component at a time with
//! `O_NOFOLLOW` does the same. Every change then happens with `*at` calls on the final
//! component relative to its directory's descriptor, never through a path string.

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, ResolveFlags};

/// How paths inside the root are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolver {
    /// `openat2(…, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: the kernel confines the walk.
    Openat2,
    /// One `O_NOFOLLOW` `openat` per component, symlinks read and resolved by kiln.
    Walk,
}

/// The most symlinks one resolution follows (the kernel's own limit).
const MAX_HOPS: u32 = 40;

/// A root directory, held open.
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
    fd: OwnedFd,
    resolver: Resolver,
}

/// What one directory entry is, without following it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Node {
    /// Nothing there.
    Missing,
    /// A directory.
    Dir,
    /// A regular file with these permission bits.
    File {
        /// `st_mode & 0o7777`.
        mode: u32,
    },
    /// A symlink.
    Symlink,
    /// A device node, FIFO or socket.
    Special,
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC
}

fn to_io(e: rustix::io::Errno) -> io::Error {
    io::Error::from(e)
}

impl Root {
    /// Opens `path` (which may itself be reached through symlinks: the caller named it) with
    /// the best resolver the kernel offers, or the one given.
    pub fn open(path: &Path, resolver: Option<Resolver>) -> io::Result<Root> {
        let fd = rustix::fs::open(path, dir_flags(), Mode::empty()).map_err(to_io)?;
        let resolver = match resolver {
            Some(r) => r,
            None => {
                // ENOSYS on kernels before 5.6; EPERM/ENOSYS where a seccomp filter blocks it.
                match rustix::fs::openat2(
                    &fd,
                    ".",
                    dir_flags(),
                    Mode::empty(),
                    ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
                ) {
                    Ok(_) => Resolver::Openat2,
                    Err(_) => Resolver::Walk,
                }
            }
        };
        Ok(Root {
            path: path.to_path_buf(),
            fd,
            resolver,
        })
    }

    /// The resolver in use.
    pub fn resolver(&self) -> Resolver {
        self.resolver
    }

    /// The root's own directory.
    pub fn top(&self) -> Dir {
        Dir {
            fd: self.fd.try_clone().expect("dup of the root descriptor"),
            path: self.path.clone(),
        }
    }

    /// The host path of `rel`, for messages only.
    pub fn host_path(&self, rel: &str) -> PathBuf {
        if rel.is_empty() {
            self.path.clone()
        } else {
            self.path.join(rel)
        }
    }

    /// Opens the directory `rel` (a `/`-separated path inside the root; `""` is the root),
    /// following symlinks inside the root only. `Ok(None)` when a component does not exist
    /// (or a symlink leads nowhere); `ENOTDIR` when one is not a directory.
    pub fn dir(&self, rel: &str) -> io::Result<Option<Dir>> {
        let rel = rel.trim_matches('/');
        if rel.is_empty() {
            return Ok(Some(self.top()));
        }
        let fd = match self.resolver {
            Resolver::Openat2 => {
                // EAGAIN: a rename or mount anywhere raced the lookup, and the kernel could
                // not prove a `..` stayed inside; it asks the caller to try again.
                let mut tries = 0;
                loop {
                    match rustix::fs::openat2(
                        &self.fd,
                        rel,
                        dir_flags(),
                        Mode::empty(),
                        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
                    ) {
                        Ok(fd) => break Some(fd),
                        Err(rustix::io::Errno::NOENT) => break None,
                        Err(rustix::io::Errno::AGAIN) if tries < 100 => tries += 1,
                        Err(e) => return Err(to_io(e)),
                    }
                }
            }
            Resolver::Walk => self.walk(rel)?,
        };
        Ok(fd.map(|fd| Dir {
            fd,
            path: self.host_path(rel),
        }))
    }

    /// The `O_NOFOLLOW` walk: a stack of open directories, `..` pops (never past the root),
    /// a symlink's target is read and spliced into the components still to walk (an
    /// absolute one restarts at the root).
    fn walk(&self, rel: &str) -> io::Result<Option<OwnedFd>> {
        let mut stack: Vec<OwnedFd> = Vec::new();
        let mut todo: VecDeque<Vec<u8>> = rel.split('/').map(|c| c.as_bytes().to_vec()).collect();
        let mut hops = 0;
        while let Some(c) = todo.pop_front() {
            match &c[..] {
                b"" | b"." => continue,
                b".." => {
                    stack.pop();
                    continue;
                }
                _ => {}
            }
            let cur: BorrowedFd<'_> = stack.last().map_or(self.fd.as_fd(), |f| f.as_fd());
            let name = OsStr::from_bytes(&c);
            let st = match rustix::fs::statat(cur, name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(e) => return Err(to_io(e)),
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Symlink => {
                    hops += 1;
                    if hops > MAX_HOPS {
                        return Err(to_io(rustix::io::Errno::LOOP));
                    }
                    let t = rustix::fs::readlinkat(cur, name, Vec::new()).map_err(to_io)?;
                    let t = t.into_bytes();
                    if t.first() == Some(&b'/') {
                        stack.clear();
                    }
                    for (i, part) in t.split(|b| *b == b'/').enumerate() {
                        todo.insert(i, part.to_vec());
                    }
                }
                FileType::Directory => {
                    // O_NOFOLLOW|O_DIRECTORY: if the directory was swapped for a symlink since
                    // the stat, this fails instead of following it.
                    let fd = rustix::fs::openat(
                        cur,
                        name,
                        dir_flags() | OFlags::NOFOLLOW,
                        Mode::empty(),
                    )
                    .map_err(to_io)?;
                    stack.push(fd);
                }
                _ => return Err(to_io(rustix::io::Errno::NOTDIR)),
            }
        }
        match stack.pop() {
            Some(fd) => Ok(Some(fd)),
            None => Ok(Some(self.fd.try_clone()?)),
        }
    }
}

/// An open directory inside the root; every operation is on one name within it.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh name for a temp or backup entry: `.kiln-<pid>-<seq>-<nanos>.<what>`.
fn fresh_name(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        ".kiln-{}-{}-{nanos:08x}.{what}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Tries `f` with fresh names until one is not taken.
fn with_fresh_name(
    what: &str,
    mut f: impl FnMut(&str) -> rustix::io::Result<()>,
) -> io::Result<String> {
    for _ in 0..100 {
        let name = fresh_name(what);
        match f(&name) {
            Ok(()) => return Ok(name),
            Err(rustix::io::Errno::EXIST) => continue,
            Err(e) => return Err(to_io(e)),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temp name",
    ))
}

impl Dir {
    /// The host path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The host path of `name` in this directory, for messages.
    pub fn host(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// What `name` is, not following a symlink.
    pub fn node(&self, name: &str) -> io::Result<Node> {
        let st = match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(Node::Missing),
            Err(e) => return Err(to_io(e)),
        };
        Ok(match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => Node::Dir,
            FileType::RegularFile => Node::File {
                mode: st.st_mode & 0o7777,
            },
            FileType::Symlink => Node::Symlink,
            _ => Node::Special,
        })
    }

    /// The target of the symlink `name`.
    pub fn read_link(&self, name: &str) -> io::Result<Vec<u8>> {
        Ok(rustix::fs::readlinkat(&self.fd, name, Vec::new())
            .map_err(to_io)?
            .into_bytes())
    }

    /// Opens the regular file `name` for reading, refusing a symlink (`O_NOFOLLOW`) and
    /// anything that is not a regular file once open (no blocking on a FIFO).
    pub fn open_file(&self, name: &str) -> io::Result<File> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(to_io)?;
        let st = rustix::fs::fstat(&fd).map_err(to_io)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file",
            ));
        }
        Ok(File::from(fd))
    }

    /// Opens the subdirectory `name`, refusing a symlink.
    pub fn subdir(&self, name: &str) -> io::Result<Dir> {
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            dir_flags() | OFlags::NOFOLLOW,
            Mode::empty(),
        )
        .map_err(to_io)?;
        Ok(Dir {
            fd,
            path: self.host(name),
        })
    }

    /// Creates the directory `name` (mode 0755 whatever the umask) and opens it.
    pub fn mkdir(&self, name: &str) -> io::Result<Dir> {
        rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)).map_err(to_io)?;
        let d = self.subdir(name)?;
        rustix::fs::fchmod(&d.fd, Mode::from_raw_mode(0o755)).map_err(to_io)?;
        Ok(d)
    }

    /// The names in this directory (without `.` and `..`), sorted.
    pub fn names(&self) -> io::Result<Vec<String>> {
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(&self.fd).map_err(to_io)? {
            let name = e.map_err(to_io)?.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                out.push(name);
            }
        }
        out.sort();
        Ok(out)
    }

    /// Creates a new temp file (`O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600) and returns its name.
    pub fn create_temp(&self) -> io::Result<(String, File)> {
        let mut file = None;
        let name = with_fresh_name("tmp", |n| {
            let fd = rustix::fs::openat(
                &self.fd,
                n,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            file = Some(File::from(fd));
            Ok(())
        })?;
        Ok((name, file.expect("set when the name was free")))
    }

    /// Creates a temp symlink to `target` and returns its name.
    pub fn symlink_temp(&self, target: &str) -> io::Result<String> {
        with_fresh_name("tmp", |n| rustix::fs::symlinkat(target, &self.fd, n))
    }

    /// Hard-links `name` to a fresh backup name and returns it (the link itself for a
    /// symlink: `linkat` without `AT_SYMLINK_FOLLOW`).
    pub fn backup(&self, name: &str) -> io::Result<String> {
        with_fresh_name("bak", |n| {
            rustix::fs::linkat(&self.fd, name, &self.fd, n, AtFlags::empty())
        })
    }

    /// Moves `name` aside to a fresh backup name and returns it.
    pub fn move_aside(&self, name: &str) -> io::Result<String> {
        with_fresh_name("bak", |n| {
            rustix::fs::renameat_with(&self.fd, name, &self.fd, n, RenameFlags::NOREPLACE)
        })
    }

    /// Renames `from` over `to` within this directory.
    pub fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        rustix::fs::renameat(&self.fd, from, &self.fd, to).map_err(to_io)
    }

    /// Renames `from` to `to`, failing if `to` exists.
    pub fn rename_noreplace(&self, from: &str, to: &str) -> io::Result<()> {
        rustix::fs::renameat_with(&self.fd, from, &self.fd, to, RenameFlags::NOREPLACE)
            .map_err(to_io)
    }

    /// Removes the non-directory `name`.
    pub fn unlink(&self, name: &str) -> io::Result<()> {
        rustix::fs::unlinkat(&self.fd, name, AtFlags::empty()).map_err(to_io)
    }

    /// Removes the empty directory `name`.
    pub fn rmdir(&self, name: &str) -> io::Result<()> {
        rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR).map_err(to_io)
    }

    /// Flushes the directory's entries to disk (best effort).
    pub fn sync(&self) {
        let _ = rustix::fs::fsync(&self.fd);
    }

    /// The directory's device and inode: which directory a resolution reached.
    pub fn dev_ino(&self) -> io::Result<(u64, u64)> {
        let st = rustix::fs::fstat(&self.fd).map_err(to_io)?;
        Ok((st.st_dev, st.st_ino))
    }

    /// A second handle on the same directory.
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            fd: self.fd.try_clone()?,
            path: self.path.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// Where `rel` lands, as a path relative to the root (by device and inode).
    fn landing(root: &Root, rel: &str) -> Option<String> {
        let d = root.dir(rel).ok()??;
        let st = rustix::fs::fstat(&d.fd).unwrap();
        for e in walkdir(&root.path) {
            let m = std::fs::symlink_metadata(root.path.join(&e)).unwrap();
            use std::os::unix::fs::MetadataExt;
            if m.is_dir() && m.ino() == st.st_ino as u64 {
                return Some(e);
            }
        }
        Some("<outside>".into())
    }

    fn walkdir(root: &Path) -> Vec<String> {
        let mut out = vec![String::new()];
        let mut i = 0;
        while i < out.len() {
            let rel = out[i].clone();
            let dir = if rel.is_empty() {
                root.to_path_buf()
            } else {
                root.join(&rel)
            };
            if let Ok(rd) = std::fs::read_dir(&dir) {
                for e in rd.flatten() {
                    if e.file_type().unwrap().is_dir() {
                        let n = e.file_name().to_string_lossy().into_owned();
                        out.push(if rel.is_empty() {
                            n
                        } else {
                            format!("{rel}/{n}")
                        });
                    }
                }
            }
            i += 1;
        }
        out
    }

    #[test]
    fn both_resolvers_stay_in_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("usr/lib/x")).unwrap();
        std::fs::create_dir_all(t.path().join("outside/secret")).unwrap();
        symlink("usr/lib", root.join("lib")).unwrap();
        symlink("/usr/lib", root.join("abs")).unwrap();
        symlink("../../../../..", root.join("up")).unwrap();
        symlink(t.path().join("outside"), root.join("host")).unwrap();
        symlink("loop", root.join("loop")).unwrap();
        std::fs::write(root.join("usr/file"), b"").unwrap();
        let cases: &[(&str, Option<&str>)] = &[
            ("lib/x", Some("usr/lib/x")),
            ("abs/x", Some("usr/lib/x")),
            ("up", Some("")),
            ("up/usr", Some("usr")),
            ("lib/../..", Some("")),
            ("new/dir", None),
            // An absolute symlink to a host directory is resolved inside the root: there is
            // no <root>/<tempdir>/outside, so nothing is found.
            ("host", None),
            ("host/secret", None),
        ];
        for resolver in [Resolver::Openat2, Resolver::Walk] {
            let r = match Root::open(&root, Some(resolver)) {
                Ok(r) => r,
                Err(e) => panic!("{resolver:?}: {e}"),
            };
            if resolver == Resolver::Openat2 && r.dir("usr").is_err() {
                eprintln!("openat2 unavailable here; only the walk is checked");
                continue;
            }
            for (rel, want) in cases {
                assert_eq!(landing(&r, rel).as_deref(), *want, "{resolver:?} {rel}");
            }
            assert_eq!(
                r.dir("loop/x").unwrap_err().raw_os_error(),
                Some(libc::ELOOP),
                "{resolver:?}"
            );
            assert_eq!(
                r.dir("usr/file/x").unwrap_err().raw_os_error(),
                Some(libc::ENOTDIR),
                "{resolver:?}"
            );
        }
    }

    #[test]
    fn final_components_are_never_followed() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("target"), b"host file").unwrap();
        symlink(t.path().join("target"), t.path().join("link")).unwrap();
        let r = Root::open(t.path(), None).unwrap();
        let top = r.top();
        assert_eq!(top.node("link").unwrap(), Node::Symlink);
        assert!(top.open_file("link").is_err());
        assert!(top.subdir("link").is_err());
        assert_eq!(top.node("nothing").unwrap(), Node::Missing);
        let (name, _f) = top.create_temp().unwrap();
        assert!(
            name.starts_with(".kiln-") && name.ends_with(".tmp"),
            "{name}"
        );
        assert_eq!(top.node(&name).unwrap(), Node::File { mode: 0o600 });
    }
}
