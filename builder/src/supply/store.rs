//! The content-addressed store: `blobs/sha256/<hex>` plus an index from lock entries to blobs.
//!
//! A blob only ever appears under its final name after its bytes were hashed and counted while
//! they streamed into a partial file in the same directory, fsynced, and renamed. Partial files
//! (`blobs/sha256/.partial-<hex>`) are held under an exclusive `flock` by the one process
//! filling them, so concurrent writers into one store never interleave, and a partial left by
//! a killed process is resumed by the next one.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::digest::{self, FileDigest, Sums};
use crate::exit::ExitClass;
use crate::supply::lock::{is_sha256_hex, Artifact};

/// Read/write chunk size for hashing and copying.
pub const CHUNK: usize = 256 * 1024;

/// A partial file asks the kernel to start writing its pages to disk every this many bytes, so
/// the fsync before the rename only waits for the tail instead of the whole blob.
pub const WRITEBACK_STEP: u64 = 8 << 20;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A filesystem operation failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A sha256 argument is not 64 lowercase hex digits.
    #[error("not a sha256 (64 lowercase hex digits): {0:?}")]
    BadDigest(String),
    /// More bytes arrived than the expected size.
    #[error("{what}: expected {expected} bytes, received more ({found} so far); the source is serving a different file")]
    TooLong {
        /// The artifact or blob.
        what: String,
        /// Expected size.
        expected: u64,
        /// Bytes seen.
        found: u64,
    },
    /// The stream ended early.
    #[error("{what}: expected {expected} bytes, the source ended after {found}")]
    TooShort {
        /// The artifact or blob.
        what: String,
        /// Expected size.
        expected: u64,
        /// Bytes seen.
        found: u64,
    },
    /// The bytes have the right size but the wrong hash.
    #[error("{what}: expected sha256 {expected}, found {found}; the bytes were discarded")]
    Mismatch {
        /// The artifact or blob.
        what: String,
        /// Expected digest.
        expected: String,
        /// Actual digest.
        found: String,
    },
}

impl StoreError {
    /// Bytes that are not what was expected are refused (exit 3); the rest is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            StoreError::Mismatch { .. }
            | StoreError::TooLong { .. }
            | StoreError::TooShort { .. } => ExitClass::Verify,
            StoreError::Io { .. } | StoreError::BadDigest(_) => ExitClass::Failure,
        }
    }
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io {
        action,
        path,
        source,
    }
}

/// What a blob must be: its digest and size, and a name for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expect {
    /// Lowercase hex sha256.
    pub sha256: String,
    /// Size in bytes: exact when `exact`, otherwise only an upper bound.
    pub size: u64,
    /// Whether `size` is the exact size (false for lock entries that record no size).
    pub exact: bool,
    /// The artifact id or file, for messages.
    pub what: String,
}

impl Expect {
    /// The expectation a lock entry sets.
    pub fn for_artifact(a: &Artifact) -> Expect {
        Expect {
            sha256: a.sha256.clone(),
            size: a.known_size().unwrap_or(crate::supply::lock::MAX_UNSIZED),
            exact: a.known_size().is_some(),
            what: a.id(),
        }
    }
}

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

    /// Whether a complete blob with this digest is present (its bytes are not re-hashed).
    pub fn contains(&self, sha256: &str) -> bool {
        is_sha256_hex(sha256) && self.blob_path(sha256).is_file()
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
        loop {
            if blob.is_file() {
                return Ok(Claim::Done(blob));
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(io_err("opening partial file", &path))?;
            if !try_lock(&file).map_err(io_err("locking partial file", &path))? {
                return Ok(Claim::Busy);
            }
            // The previous owner may have renamed this very inode into place before we locked it.
            if blob.is_file() {
                return Ok(Claim::Done(blob));
            }
            let ours = file.metadata().map_err(io_err("reading", &path))?;
            match std::fs::metadata(&path) {
                Ok(now) if same_file(&ours, &now) => {}
                _ => continue,
            }
            let mut partial = Partial {
                file,
                path,
                blob,
                expect: expect.clone(),
                hasher: Sha256::new(),
                len: 0,
                buf: Vec::with_capacity(CHUNK),
                writeback_from: 0,
            };
            partial.hash_existing(ours.len())?;
            return Ok(Claim::Partial(partial));
        }
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
                .map_err(io_err("reading source for", &partial.blob))?;
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
        write_atomic(&self.index_path(a), &json)
    }

    /// The blob for a lock entry, if present with the digest the entry names.
    pub fn lookup(&self, a: &Artifact) -> Option<PathBuf> {
        let p = self.blob_path(&a.sha256);
        (is_sha256_hex(&a.sha256) && p.is_file()).then_some(p)
    }

    /// The index record for a lock entry, if any.
    pub fn index_entry(&self, a: &Artifact) -> Option<IndexEntry> {
        let text = std::fs::read(self.index_path(a)).ok()?;
        serde_json::from_slice(&text).ok()
    }
}

fn unreachable_busy() -> ! {
    // claim_wait loops on Busy; reaching here is a logic error in this module.
    panic!("store: claim_wait returned Busy")
}

/// A partial blob owned (under `flock`) by this process. Bytes written are hashed and counted;
/// [`Partial::commit`] renames it into place only when digest and size match.
#[derive(Debug)]
pub struct Partial {
    file: File,
    path: PathBuf,
    blob: PathBuf,
    expect: Expect,
    hasher: Sha256,
    len: u64,
    // Small network chunks are gathered into CHUNK-sized writes.
    buf: Vec<u8>,
    // File offset up to which writeback to disk has been started.
    writeback_from: u64,
}

impl Drop for Partial {
    fn drop(&mut self) {
        // Keep what arrived so a later run can resume from it.
        let _ = self.flush_buf();
    }
}

impl Partial {
    fn flush_buf(&mut self) -> Result<(), StoreError> {
        if !self.buf.is_empty() {
            self.file
                .write_all(&self.buf)
                .map_err(io_err("writing partial file", &self.path))?;
            self.buf.clear();
            self.start_writeback();
        }
        Ok(())
    }

    /// Bytes already handed to the file (the rest waits in `buf`).
    fn in_file(&self) -> u64 {
        self.len - self.buf.len() as u64
    }

    /// Starts (does not wait for) writeback of what was written since the last call, once
    /// that is at least [`WRITEBACK_STEP`]: the disk then works while the network delivers,
    /// and the commit's fsync has little left to do. Durability still comes from that fsync.
    fn start_writeback(&mut self) {
        let end = self.in_file();
        if end < self.writeback_from + WRITEBACK_STEP {
            return;
        }
        writeback(&self.file, self.writeback_from, end - self.writeback_from);
        self.writeback_from = end;
    }

    fn hash_existing(&mut self, len: u64) -> Result<(), StoreError> {
        if len > self.expect.size {
            return self.restart();
        }
        self.file
            .seek(SeekFrom::Start(0))
            .map_err(io_err("reading partial file", &self.path))?;
        let mut buf = vec![0u8; CHUNK];
        let mut left = len;
        while left > 0 {
            let want = buf.len().min(left as usize);
            let n = self
                .file
                .read(&mut buf[..want])
                .map_err(io_err("reading partial file", &self.path))?;
            if n == 0 {
                break;
            }
            self.hasher.update(&buf[..n]);
            left -= n as u64;
        }
        self.len = len - left;
        self.writeback_from = self.len;
        self.file
            .set_len(self.len)
            .map_err(io_err("trimming partial file", &self.path))?;
        self.file
            .seek(SeekFrom::Start(self.len))
            .map_err(io_err("seeking partial file", &self.path))?;
        Ok(())
    }

    /// Bytes already present (where a resumed download continues from).
    pub fn len(&self) -> u64 {
        self.len
    }

    /// True when nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// What this partial must become.
    pub fn expect(&self) -> &Expect {
        &self.expect
    }

    /// Discards what is present and starts from byte 0 (a source that ignored Range, or a
    /// failed check).
    pub fn restart(&mut self) -> Result<(), StoreError> {
        self.buf.clear();
        self.file
            .set_len(0)
            .map_err(io_err("truncating partial file", &self.path))?;
        self.file
            .seek(SeekFrom::Start(0))
            .map_err(io_err("seeking partial file", &self.path))?;
        self.hasher = Sha256::new();
        self.len = 0;
        self.writeback_from = 0;
        Ok(())
    }

    /// Appends bytes, refusing to grow past the expected size.
    pub fn write(&mut self, bytes: &[u8]) -> Result<(), StoreError> {
        let next = self.len + bytes.len() as u64;
        if next > self.expect.size {
            let found = next;
            self.restart()?;
            return Err(StoreError::TooLong {
                what: self.expect.what.clone(),
                expected: self.expect.size,
                found,
            });
        }
        self.hasher.update(bytes);
        if self.buf.len() + bytes.len() > CHUNK {
            self.flush_buf()?;
        }
        if bytes.len() >= CHUNK {
            self.file
                .write_all(bytes)
                .map_err(io_err("writing partial file", &self.path))?;
            self.len = next;
            self.start_writeback();
        } else {
            self.buf.extend_from_slice(bytes);
            self.len = next;
        }
        Ok(())
    }

    /// Checks size and digest, fsyncs, and renames into place. On a digest mismatch the partial
    /// is emptied (its bytes are wrong, resuming them would be pointless).
    pub fn commit(mut self) -> Result<PathBuf, StoreError> {
        self.flush_buf()?;
        if self.expect.exact && self.len < self.expect.size {
            return Err(StoreError::TooShort {
                what: self.expect.what.clone(),
                expected: self.expect.size,
                found: self.len,
            });
        }
        let found = hex::encode(std::mem::take(&mut self.hasher).finalize());
        if found != self.expect.sha256 {
            self.restart()?;
            return Err(StoreError::Mismatch {
                what: self.expect.what.clone(),
                expected: self.expect.sha256.clone(),
                found,
            });
        }
        self.file
            .sync_all()
            .map_err(io_err("syncing partial file", &self.path))?;
        std::fs::rename(&self.path, &self.blob).map_err(io_err("renaming into", &self.blob))?;
        let blob = std::mem::take(&mut self.blob);
        sync_dir(blob.parent().unwrap_or(Path::new(".")));
        Ok(blob)
    }
}

/// Writes `bytes` to `path` through a temp file in the same directory, fsync and rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io_err("creating directory", dir))?;
    let mut tmp = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .map_err(io_err("creating temp file in", dir))?;
    tmp.write_all(bytes)
        .map_err(io_err("writing", tmp.path()))?;
    tmp.as_file().sync_all().map_err(io_err("syncing", path))?;
    tmp.persist(path).map_err(|e| StoreError::Io {
        action: "renaming into",
        path: path.to_path_buf(),
        source: e.error,
    })?;
    sync_dir(dir);
    Ok(())
}

/// Asks Linux to start writing a file range to disk without waiting (`sync_file_range` with
/// `SYNC_FILE_RANGE_WRITE`). Only a hint: errors are ignored, the fsync at commit decides.
#[cfg(target_os = "linux")]
fn writeback(file: &File, offset: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    // SAFETY: sync_file_range only reads the descriptor, which `file` keeps open for the call.
    unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn writeback(_: &File, _: u64, _: u64) {}

/// Makes a rename durable. Best effort: some filesystems refuse fsync on directories.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    true
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

    #[test]
    fn index_records_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let a = Artifact {
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
        };
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
