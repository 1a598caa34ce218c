//! A blob being written: the partial file under `flock`, hashed and counted as bytes arrive,
//! renamed into place only when digest and size match what was [`Expect`]ed.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::error::{io_err, StoreError};
use crate::atomic_file;
use crate::supply::lock::Artifact;

/// Read/write chunk size for hashing and copying.
pub const CHUNK: usize = 256 * 1024;

/// A partial file asks the kernel to start writing its pages to disk every this many bytes, so
/// the fsync before the rename only waits for the tail instead of the whole blob.
pub const WRITEBACK_STEP: u64 = 8 << 20;

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
    /// Takes over the locked partial file at `path` (holding `existing` bytes from an earlier
    /// run, which are hashed again, or dropped when they exceed the expected size).
    pub(crate) fn resume(
        file: File,
        path: PathBuf,
        blob: PathBuf,
        expect: Expect,
        existing: u64,
    ) -> Result<Partial, StoreError> {
        let mut partial = Partial {
            file,
            path,
            blob,
            expect,
            hasher: Sha256::new(),
            len: 0,
            buf: Vec::with_capacity(CHUNK),
            writeback_from: 0,
        };
        partial.hash_existing(existing)?;
        Ok(partial)
    }

    /// The blob this partial becomes.
    pub(crate) fn blob(&self) -> &Path {
        &self.blob
    }

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
        // What is renamed into the store must be the file these bytes went into: the name
        // could have been swapped (for a symlink, another file) while the download ran.
        let ours = self
            .file
            .metadata()
            .map_err(io_err("reading partial file", &self.path))?;
        if !self.names_ours(&self.path, &ours) {
            return Err(StoreError::Planted {
                path: self.path.clone(),
            });
        }
        std::fs::rename(&self.path, &self.blob).map_err(io_err("renaming into", &self.blob))?;
        // A swap between that check and the rename would put someone else's file (or a link)
        // at the blob's name: check again, and take the name back if it is not ours.
        if !self.names_ours(&self.blob, &ours) {
            let _ = std::fs::remove_file(&self.blob);
            return Err(StoreError::Planted {
                path: self.path.clone(),
            });
        }
        let blob = std::mem::take(&mut self.blob);
        atomic_file::sync_dir(blob.parent().unwrap_or(Path::new(".")));
        Ok(blob)
    }
}

impl Partial {
    /// Whether `name` is (not a link to) the regular file this partial wrote.
    fn names_ours(&self, name: &Path, ours: &std::fs::Metadata) -> bool {
        std::fs::symlink_metadata(name)
            .is_ok_and(|now| same_file(ours, &now) && is_own_regular(&now))
    }
}

/// A regular file with one name: what kiln creates. Anything else at a partial's name was put
/// there by someone else (a FIFO, a device, a hard link to a file elsewhere).
pub(super) fn is_own_regular(m: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        m.file_type().is_file() && m.nlink() == 1
    }
    #[cfg(not(unix))]
    {
        m.file_type().is_file()
    }
}

#[cfg(unix)]
pub(super) fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
pub(super) fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata) -> bool {
    true
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
