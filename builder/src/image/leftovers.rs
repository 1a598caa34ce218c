//! What a killed `kiln image` leaves in OUT's directory, and how the next run clears it.
//!
//! A run works in OUT's directory: the raw working copy (`.kiln-image-*.raw`), the converted
//! output before its rename (`.kiln-image-*.out`) and the mount point
//! (`.kiln-image-root-*`). A SIGKILL gives no chance to remove them (the mount itself goes
//! with kiln's private mount namespace). So each run holds an exclusive `flock` on each of
//! its own while it lives; the kernel drops the locks when the process ends, however it
//! ends. The next run in that directory removes every such entry whose lock it can take and
//! that is older than [`MIN_AGE`] (a live run creates a name a moment before it locks it).
//! Symlinks are never followed, and a directory is removed only when empty.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rustix::fs::{FlockOperation, Mode, OFlags};

/// The prefix of every temporary name `kiln image` makes.
pub const PREFIX: &str = ".kiln-image-";

/// Entries younger than this are never removed.
pub const MIN_AGE: Duration = Duration::from_secs(60);

/// Takes the exclusive lock that marks `fd` as in use by this run (non-blocking).
pub fn hold(fd: &impl AsFd) -> io::Result<()> {
    rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive).map_err(io::Error::from)
}

/// A directory held open and locked for the life of the value.
#[derive(Debug)]
pub struct HeldDir(#[allow(dead_code)] File);

/// Opens and locks the directory `path`.
pub fn hold_dir(path: &Path) -> io::Result<HeldDir> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    hold(&fd)?;
    Ok(HeldDir(File::from(fd)))
}

/// Removes the leftovers of dead runs in `dir`; returns what it removed. Best effort: an
/// entry it cannot judge or remove is left alone.
pub fn sweep(dir: &Path) -> Vec<PathBuf> {
    let mut removed = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return removed;
    };
    let now = SystemTime::now();
    for e in entries.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().starts_with(PREFIX) {
            continue;
        }
        let path = e.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let old = meta
            .modified()
            .ok()
            .and_then(|m| now.duration_since(m).ok())
            .is_some_and(|age| age >= MIN_AGE);
        if !old || !(meta.is_file() || meta.is_dir()) {
            continue;
        }
        let flags = if meta.is_dir() {
            OFlags::RDONLY | OFlags::DIRECTORY
        } else {
            OFlags::RDONLY
        } | OFlags::NOFOLLOW
            | OFlags::NONBLOCK
            | OFlags::CLOEXEC;
        let Ok(fd) = rustix::fs::open(&path, flags, Mode::empty()) else {
            continue;
        };
        // A live run holds it: not a leftover.
        if hold(&fd).is_err() {
            continue;
        }
        let gone = if meta.is_dir() {
            std::fs::remove_dir(&path)
        } else {
            std::fs::remove_file(&path)
        };
        if gone.is_ok() {
            removed.push(path);
        }
    }
    removed.sort();
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age(path: &Path, secs: u64) {
        let t = SystemTime::now() - Duration::from_secs(secs);
        let f = File::options().read(true).open(path).unwrap();
        f.set_modified(t).unwrap();
    }

    #[test]
    fn removes_only_old_unlocked_entries_of_its_own() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path();
        let stale = d.join(".kiln-image-dead.raw");
        let live = d.join(".kiln-image-live.raw");
        let young = d.join(".kiln-image-young.raw");
        let mine = d.join("node.qcow2");
        let stale_dir = d.join(".kiln-image-root-dead");
        let full_dir = d.join(".kiln-image-root-full");
        for f in [&stale, &live, &young, &mine] {
            std::fs::write(f, "x").unwrap();
        }
        std::fs::create_dir(&stale_dir).unwrap();
        std::fs::create_dir(&full_dir).unwrap();
        std::fs::write(full_dir.join("keep"), "x").unwrap();
        for p in [&stale, &live, &mine, &stale_dir, &full_dir] {
            age(p, 120);
        }
        // A symlink with the prefix is never followed or removed.
        let target = d.join("precious");
        std::fs::write(&target, "x").unwrap();
        std::os::unix::fs::symlink(&target, d.join(".kiln-image-link.raw")).unwrap();

        let held = File::open(&live).unwrap();
        hold(&held).unwrap();
        let removed = sweep(d);
        assert_eq!(removed, vec![stale.clone(), stale_dir.clone()]);
        for p in [&live, &young, &mine, &full_dir, &target] {
            assert!(p.exists(), "{} was removed", p.display());
        }
        drop(held);
        assert_eq!(sweep(d), vec![live]);
    }
}
