//! The content-addressed store: `blobs/sha256/<hex>` plus an index from lock entries to blobs.
//!
//! A blob only ever appears under its final name after its bytes were hashed and counted while
//! they streamed into a partial file in the same directory, fsynced, and renamed. Partial files
//! (`blobs/sha256/.partial-<hex>`) are held under an exclusive `flock` by the one process
//! filling them, so concurrent writers into one store never interleave, and a partial left by
//! a killed process is resumed by the next one.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod error;
mod partial;

pub use error::StoreError;
use partial::{is_own_regular, same_file};
pub use partial::{Expect, Partial, CHUNK, WRITEBACK_STEP};

use error::io_err;

use crate::atomic_file;
use crate::digest::{self, FileDigest, Sums};
use crate::supply::lock::{is_sha256_hex, Artifact};

/// One index record: which blob holds a lock entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IndexEntry {
    /// `name@version/os/arch`.
    pub id: String,
    /// The blob's sha256.
    pub sha256: String,
    /// The blob's size.
    pub size: u64,
    /// The upstream file name.
    pub file_name: String,
    /// The upstream URL.
    pub url: String,
}

/// A content-addressed store rooted at a directory (a cache or a mirror).
#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
}

/// The outcome of trying to claim the partial file of a blob.
#[derive(Debug)]
pub enum Claim {
    /// The blob is already complete at this path.
    Done(PathBuf),
    /// Another process is filling this blob right now.
    Busy,
    /// This process now owns the partial file.
    Partial(Partial),
}

impl Store {
    /// Opens (creating if needed) a store at `root`.
    pub fn open(root: impl AsRef<Path>) -> Result<Store, StoreError> {
        let root = root.as_ref().to_path_buf();
        for d in [root.join("blobs").join("sha256"), root.join("index")] {
            std::fs::create_dir_all(&d).map_err(io_err("creating store directory", &d))?;
        }
        Ok(Store { root })
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory holding the blobs.
    pub fn blob_dir(&self) -> PathBuf {
        self.root.join("blobs").join("sha256")
    }

    /// Where the blob with this digest lives (whether or not it exists yet).
    pub fn blob_path(&self, sha256: &str) -> PathBuf {
        self.blob_dir().join(sha256)
    }

    /// Whether a complete blob with this digest is present (its bytes are not re-hashed). A
    /// symlink at a blob's name is not a blob: it is replaced by the next download.
    pub fn contains(&self, sha256: &str) -> bool {
        is_sha256_hex(sha256) && is_blob(&self.blob_path(sha256))
    }

    /// Every blob digest present, sorted.
    pub fn blobs(&self) -> Result<Vec<String>, StoreError> {
        let dir = self.blob_dir();
        let mut out = Vec::new();
        for e in std::fs::read_dir(&dir).map_err(io_err("listing", &dir))? {
            let e = e.map_err(io_err("listing", &dir))?;
            if let Some(n) = e.file_name().to_str() {
                if is_sha256_hex(n) {
                    out.push(n.to_string());
                }
            }
        }
        out.sort();
        Ok(out)
    }

    /// Tries to take ownership of the partial file for `sha256` (see [`Claim`]).
    pub fn claim(&self, expect: &Expect) -> Result<Claim, StoreError> {
        if !is_sha256_hex(&expect.sha256) {
            return Err(StoreError::BadDigest(expect.sha256.clone()));
        }
        let blob = self.blob_path(&expect.sha256);
        let path = self.blob_dir().join(format!(".partial-{}", expect.sha256));
        // A shared mirror directory may hold names planted by others: a symlink, FIFO, device
        // or hard link at the partial's name is removed (never followed, truncated or
        // appended through) and the name claimed again, a bounded number of times.
        for _ in 0..PLANTED_RETRIES {
            if is_blob(&blob) {
                return Ok(Claim::Done(blob));
            }
            let file = match open_lockable(&path) {
                Ok(f) => f,
                Err(e) if is_planted_error(&e) => {
                    remove_planted(&path)?;
                    continue;
                }
                Err(e) => return Err(io_err("opening partial file", &path)(e)),
            };
            let ours = file.metadata().map_err(io_err("reading", &path))?;
            if !is_own_regular(&ours) {
                drop(file);
                remove_planted(&path)?;
                continue;
            }
            if !try_lock(&file).map_err(io_err("locking partial file", &path))? {
                return Ok(Claim::Busy);
            }
            // The previous owner may have renamed this very inode into place before we locked it.
            if is_blob(&blob) {
                return Ok(Claim::Done(blob));
            }
            match std::fs::symlink_metadata(&path) {
                Ok(now) if same_file(&ours, &now) => {}
                _ => continue,
            }
            let partial = Partial::resume(file, path, blob, expect.clone(), ours.len())?;
            return Ok(Claim::Partial(partial));
        }
        Err(StoreError::Planted { path })
    }

    /// Claims the partial for `expect`, waiting while another process holds it.
    pub fn claim_wait(&self, expect: &Expect) -> Result<Claim, StoreError> {
        loop {
            match self.claim(expect)? {
                Claim::Busy => std::thread::sleep(Duration::from_millis(50)),
                other => return Ok(other),
            }
        }
    }

    /// Streams `reader` into the blob for `expect`, hashing and size-limiting as it goes.
    /// Returns the blob path; on any mismatch nothing is stored.
    pub fn put_reader(
        &self,
        mut reader: impl Read,
        expect: &Expect,
    ) -> Result<PathBuf, StoreError> {
        let mut partial = match self.claim_wait(expect)? {
            Claim::Done(p) => return Ok(p),
            Claim::Partial(p) => p,
            Claim::Busy => unreachable_busy(),
        };
        partial.restart()?;
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = reader
                .read(&mut buf)
                .map_err(io_err("reading source for", partial.blob()))?;
            if n == 0 {
                break;
            }
            partial.write(&buf[..n])?;
        }
        partial.commit()
    }

    /// Copies a local file into the store (see [`Store::put_reader`]).
    pub fn put_file(&self, path: &Path, expect: &Expect) -> Result<PathBuf, StoreError> {
        let f = File::open(path).map_err(io_err("opening", path))?;
        self.put_reader(f, expect)
    }

    /// Re-hashes a stored blob: its actual size and digest.
    pub fn rehash(&self, sha256: &str) -> Result<FileDigest, StoreError> {
        let path = self.blob_path(sha256);
        digest::hash_file(&path, Sums::Sha256).map_err(io_err("hashing", &path))
    }

    fn index_path(&self, a: &Artifact) -> PathBuf {
        self.root
            .join("index")
            .join(&a.name)
            .join(&a.version)
            .join(format!("{}-{}.json", a.os, a.arch))
    }

    /// Records that the blob for `a` is present (atomically replaces any older record).
    pub fn record(&self, a: &Artifact) -> Result<(), StoreError> {
        let entry = IndexEntry {
            id: a.id(),
            sha256: a.sha256.clone(),
            size: a.size,
            file_name: a.file_name().to_string(),
            url: a.url.clone(),
        };
        let mut json = serde_json::to_vec_pretty(&entry).unwrap_or_default();
        json.push(b'\n');
        let path = self.index_path(a);
        self.refuse_links_below(&path)?;
        write_atomic(&path, &json)
    }

    /// Refuses a symlink at any directory between the store's root and `path` (the names come
    /// from the lock; a link planted in a shared mirror at `index/<name>` would lead the
    /// record's write out of the store). Missing directories are created by the writer.
    fn refuse_links_below(&self, path: &Path) -> Result<(), StoreError> {
        let Ok(rel) = path.strip_prefix(&self.root) else {
            return Ok(());
        };
        let mut at = self.root.clone();
        for part in rel.parent().into_iter().flat_map(Path::components) {
            at.push(part);
            match std::fs::symlink_metadata(&at) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(StoreError::Planted { path: at });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// The blob for a lock entry, if present with the digest the entry names.
    pub fn lookup(&self, a: &Artifact) -> Option<PathBuf> {
        let p = self.blob_path(&a.sha256);
        (is_sha256_hex(&a.sha256) && is_blob(&p)).then_some(p)
    }

    /// Runs `f` holding an exclusive `flock` on `<root>/.lock-<name>` (waiting for other
    /// processes that hold it): for read-modify-write of shared files such as `index.json`.
    pub fn locked<T>(&self, name: &str, f: impl FnOnce() -> T) -> Result<T, StoreError> {
        let path = self.root.join(format!(".lock-{name}"));
        let file = open_lockable(&path).map_err(io_err("opening lock file", &path))?;
        while !try_lock(&file).map_err(io_err("locking", &path))? {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Released when `file` is dropped after `f`.
        Ok(f())
    }

    /// The index record for a lock entry, if any.
    pub fn index_entry(&self, a: &Artifact) -> Option<IndexEntry> {
        let text = std::fs::read(self.index_path(a)).ok()?;
        serde_json::from_slice(&text).ok()
    }
}

/// How often [`Store::claim`] removes a planted name and tries again before giving up.
const PLANTED_RETRIES: usize = 8;

/// Opens (creating, never truncating) a file that [`try_lock`] will lock, without following a
/// symlink at the name (`O_NOFOLLOW`) and without waiting on a FIFO (`O_NONBLOCK`, which has
/// no effect on the regular file the caller then insists on).
fn open_lockable(path: &Path) -> io::Result<File> {
    let mut o = OpenOptions::new();
    o.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    o.open(path)
}

/// `open_lockable` met a symlink (`ELOOP`) or something that is not a file to write.
fn is_planted_error(e: &io::Error) -> bool {
    #[cfg(unix)]
    {
        matches!(
            e.raw_os_error(),
            Some(libc::ELOOP) | Some(libc::EISDIR) | Some(libc::ENXIO) | Some(libc::ENODEV)
        )
    }
    #[cfg(not(unix))]
    {
        let _ = e;
        false
    }
}

/// Whether a regular file (not a symlink to one) sits at a blob's name.
fn is_blob(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// Removes what was planted at a partial's name. Only the name goes: `unlink` never follows a
/// symlink, and a directory (which kiln never creates there) is left for a human.
fn remove_planted(path: &Path) -> Result<(), StoreError> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_dir() => Err(StoreError::Planted {
            path: path.to_path_buf(),
        }),
        Ok(_) => match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err("removing what was planted at", path)(e)),
        },
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("reading", path)(e)),
    }
}

fn unreachable_busy() -> ! {
    // claim_wait loops on Busy; reaching here is a logic error in this module.
    panic!("store: claim_wait returned Busy")
}

/// Writes `bytes` to `path` atomically (see [`crate::atomic_file`]), creating its directory. The
/// mode stays the temp file's 0600.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err("creating directory", dir))?;
    atomic_file::write(path, ".tmp-", bytes, 0o600).map_err(|e| StoreError::Io {
        action: e.action,
        path: e.path,
        source: e.source,
    })
}

/// Non-blocking exclusive `flock`: released by the kernel when the process dies, which is what
/// makes a killed download's partial file claimable again.
#[cfg(unix)]
fn try_lock(file: &File) -> io::Result<bool> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock only reads the descriptor, which `file` keeps open for the call.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(err)
    }
}

#[cfg(not(unix))]
fn try_lock(_: &File) -> io::Result<bool> {
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    fn expect(bytes: &[u8]) -> Expect {
        Expect {
            sha256: hex::encode(Sha256::digest(bytes)),
            size: bytes.len() as u64,
            exact: true,
            what: "t".into(),
        }
    }

    #[test]
    fn put_and_refuse() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let data = vec![7u8; 1_000_000];
        let e = expect(&data);
        let p = store.put_reader(&data[..], &e).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), data);
        assert!(store.contains(&e.sha256));
        assert_eq!(store.blobs().unwrap(), vec![e.sha256.clone()]);

        let other = vec![8u8; 1_000_000];
        let e2 = Expect {
            sha256: "ab".repeat(32),
            ..e.clone()
        };
        let err = store.put_reader(&other[..], &e2).unwrap_err().to_string();
        assert!(err.contains("expected sha256 abab"), "{err}");
        assert!(!store.contains(&e2.sha256));

        let err = store
            .put_reader(&data[..10], &expect(&data[..20]))
            .unwrap_err();
        assert!(
            matches!(err, StoreError::TooShort { found: 10, .. }),
            "{err}"
        );
        let err = store
            .put_reader(&data[..30], &expect(&data[..20]))
            .unwrap_err();
        assert!(matches!(err, StoreError::TooLong { .. }), "{err}");
        // Only the one good blob is visible.
        assert_eq!(store.blobs().unwrap(), vec![e.sha256]);
    }

    #[test]
    fn partial_resumes_and_is_exclusive() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let data: Vec<u8> = (0..500_000u32).map(|i| (i % 251) as u8).collect();
        let e = expect(&data);
        let Claim::Partial(mut p) = store.claim(&e).unwrap() else {
            panic!("expected a fresh partial")
        };
        p.write(&data[..123_456]).unwrap();
        // A second claimant (another open file description) sees it busy.
        assert!(matches!(store.claim(&e).unwrap(), Claim::Busy));
        drop(p);
        let Claim::Partial(mut p) = store.claim(&e).unwrap() else {
            panic!("expected to resume")
        };
        assert_eq!(p.len(), 123_456);
        p.write(&data[123_456..]).unwrap();
        let path = p.commit().unwrap();
        assert_eq!(std::fs::read(path).unwrap(), data);
        assert!(matches!(store.claim(&e).unwrap(), Claim::Done(_)));
    }

    /// Issue 34 item 3: a partial's name swapped for a symlink while the download ran (here
    /// to an outside file with the very bytes expected) is not renamed into the store.
    #[cfg(unix)]
    #[test]
    fn a_partial_swapped_for_a_link_is_not_committed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s")).unwrap();
        let data = b"the blob".to_vec();
        let e = expect(&data);
        let Claim::Partial(mut p) = store.claim(&e).unwrap() else {
            panic!("expected a fresh partial")
        };
        p.write(&data).unwrap();
        let outside = dir.path().join("outside");
        std::fs::write(&outside, &data).unwrap();
        let name = store.blob_dir().join(format!(".partial-{}", e.sha256));
        std::fs::remove_file(&name).unwrap();
        std::os::unix::fs::symlink(&outside, &name).unwrap();
        let err = p.commit().unwrap_err();
        assert!(matches!(err, StoreError::Planted { .. }), "{err}");
        assert!(err.to_string().contains(".partial-"), "{err}");
        assert!(!store.contains(&e.sha256));
        assert!(std::fs::symlink_metadata(store.blob_path(&e.sha256)).is_err());
    }

    /// A symlink planted at `index/<name>` does not lead the record's write out of the store.
    #[cfg(unix)]
    /// A runc entry whose bytes are `abc`.
    fn runc_abc() -> Artifact {
        Artifact {
            name: "runc".into(),
            version: "1".into(),
            os: crate::supply::lock::Os::Linux,
            arch: crate::supply::lock::Arch::Arm64,
            format: crate::supply::lock::Format::Binary,
            url: "http://x/runc.arm64".into(),
            sources: vec![],
            size: 3,
            sha256: hex::encode(Sha256::digest(b"abc")),
            verified: "t".into(),
            members: vec![],
        }
    }

    #[test]
    fn an_index_record_is_not_written_through_a_planted_link() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("s")).unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, store.root().join("index/runc")).unwrap();
        let a = runc_abc();
        let err = store.record(&a).unwrap_err();
        assert!(matches!(err, StoreError::Planted { .. }), "{err}");
        assert!(err.to_string().contains("index/runc"), "{err}");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn index_records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let a = runc_abc();
        assert!(store.lookup(&a).is_none());
        store
            .put_reader(&b"abc"[..], &Expect::for_artifact(&a))
            .unwrap();
        store.record(&a).unwrap();
        assert!(store.lookup(&a).is_some());
        let e = store.index_entry(&a).unwrap();
        assert_eq!(e.id, "runc@1/linux/arm64");
        assert_eq!(e.file_name, "runc.arm64");
    }
}
