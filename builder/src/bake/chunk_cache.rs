//! A content-addressed cache of compressed chunks inside the bake cache, so a re-bake
//! copies the compressed bytes of data it has compressed before instead of compressing it
//! again. Shared by the output writers that compress big files in independent pieces: the
//! rootfs overlay (one zstd frame per chunk of a big file) and kiln's squashfs writer
//! (compressed blocks).
//!
//! # Keys
//!
//! A [`ChunkKey`] is the sha256 of a canonical text naming **what the uncompressed bytes are**
//! ([`Source`]: a slice of a file identified by the sha256 of its whole content, or the
//! chunk's own sha256) and **every parameter that shapes the compressed bytes** ([`Codec`]:
//! codec name, library version, level, chunk size and a format version string owned by the
//! caller). Two writers that would produce different bytes for the same input therefore
//! never share an entry; a caller bumps its format string whenever it changes how it
//! compresses.
//!
//! # Layout and entries
//!
//! Entries live in `<cache>/<kiln version>/chunks/<first two hex digits>/<key hex>.chunk`.
//! Each file is a fixed 80-byte header followed by the payload (the compressed bytes):
//!
//! | bytes | content |
//! |---|---|
//! | 0..8 | magic `KILNCHK1` |
//! | 8..16 | payload length, u64 little endian |
//! | 16..48 | sha256 of the payload |
//! | 48..80 | the entry's key (so a file copied under another name is refused) |
//! | 80.. | payload |
//!
//! An entry is written to a temporary file in its own directory, fsynced and renamed into
//! place, so concurrent bakes sharing a cache only ever see whole entries, and two bakes
//! storing the same key simply replace one whole, equal entry with another. On read every
//! field is checked; an entry that is truncated, padded, mislabelled or whose payload does not
//! hash to the recorded digest is a miss (counted as [`Stats::corrupt`]) and the caller's next
//! [`ChunkCache::put`] replaces it. A bad entry can therefore cost time but never reach an
//! output.
//!
//! The cache holds derived data only: deleting `chunks/` (or the whole bake cache) is always
//! safe. Nothing is evicted; a hit refreshes the entry's mtime so that
//! `find <cache> -name '*.chunk' -mmin +N -delete` prunes what recent bakes did not use.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::atomic_file;

const MAGIC: &[u8; 8] = b"KILNCHK1";
const HEADER: usize = 80;

/// Why the chunk cache could not store an entry. Readers never fail: a bad entry is a miss.
#[derive(Debug, thiserror::Error)]
pub enum ChunkCacheError {
    /// An I/O error on a named file or directory of the cache.
    #[error("chunk cache {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Every parameter that, with the input bytes, determines the compressed bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Codec {
    /// Codec name, e.g. `zstd`.
    pub name: String,
    /// The codec library's version (different versions may compress differently).
    pub library: String,
    /// Compression level.
    pub level: i32,
    /// The chunk (or block) size the caller cuts its input into.
    pub chunk_size: u64,
    /// The caller's format version, e.g. `kiln-rootfs-frame-v1`: bump it whenever anything
    /// else about how the chunk is compressed changes (frame flags, padding, checksums).
    pub format: String,
}

impl Codec {
    /// zstd at `level`, with the linked libzstd's version.
    pub fn zstd(level: i32, chunk_size: u64, format: &str) -> Codec {
        Codec {
            name: "zstd".into(),
            library: zstd::zstd_safe::version_string().to_string(),
            level,
            chunk_size,
            format: format.into(),
        }
    }
}

/// What the uncompressed bytes of a chunk are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source<'a> {
    /// `len` bytes at `offset` of a file whose whole content has sha256 `file_sha256`
    /// (lowercase hex), followed by `pad` zero bytes. Lets a writer find a hit without
    /// reading the input again.
    Slice {
        /// sha256 of the whole file (lowercase hex).
        file_sha256: &'a str,
        /// Where the chunk starts in the file.
        offset: u64,
        /// How many bytes of the file it holds.
        len: u64,
        /// Zero bytes appended after them (e.g. tar's padding to 512).
        pad: u64,
    },
    /// The sha256 of the chunk's uncompressed bytes themselves.
    Digest(&'a [u8; 32]),
}

/// The name of one cache entry: sha256 of the canonical description of its source and codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkKey([u8; 32]);

impl ChunkKey {
    /// The key of `source` compressed with `codec`.
    pub fn new(codec: &Codec, source: &Source<'_>) -> ChunkKey {
        let mut h = Sha256::new();
        // One field per line, fields never contain newlines: the text is unambiguous.
        let text = format!(
            "kiln chunk key v1\ncodec={}\nlibrary={}\nlevel={}\nchunk_size={}\nformat={}\n",
            codec.name, codec.library, codec.level, codec.chunk_size, codec.format
        );
        h.update(text.as_bytes());
        match source {
            Source::Slice {
                file_sha256,
                offset,
                len,
                pad,
            } => h.update(
                format!("slice sha256={file_sha256} offset={offset} len={len} pad={pad}\n")
                    .as_bytes(),
            ),
            Source::Digest(d) => h.update(format!("digest sha256={}\n", hex::encode(d))),
        }
        ChunkKey(h.finalize().into())
    }

    /// The key as lowercase hex (the entry's file stem).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }
}

/// Counters of one [`ChunkCache`] since it was opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Lookups answered from the cache.
    pub hits: u64,
    /// Lookups with no entry.
    pub misses: u64,
    /// Lookups that found a bad entry (truncated, corrupt, mislabelled); also misses.
    pub corrupt: u64,
    /// Entries stored.
    pub stored: u64,
    /// Payload bytes answered from the cache.
    pub hit_bytes: u64,
}

/// The chunk cache of one bake cache directory (safe to share between threads and
/// processes).
#[derive(Debug)]
pub struct ChunkCache {
    dir: PathBuf,
    /// Entries are fsynced before their rename (a cache that outlives the bake); a scratch
    /// cache, deleted with the bake's work directory, skips that.
    durable: bool,
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    stored: AtomicU64,
    hit_bytes: AtomicU64,
}

impl ChunkCache {
    /// The chunk cache inside bake cache `cache` (`<cache>/<kiln version>/chunks`). Nothing
    /// is created until the first [`put`](Self::put).
    pub fn new(cache: &Path) -> ChunkCache {
        ChunkCache::at(cache.join(env!("CARGO_PKG_VERSION")).join("chunks"))
    }

    /// A chunk cache rooted exactly at `dir`.
    pub fn at(dir: PathBuf) -> ChunkCache {
        ChunkCache {
            dir,
            durable: true,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            corrupt: AtomicU64::new(0),
            stored: AtomicU64::new(0),
            hit_bytes: AtomicU64::new(0),
        }
    }

    /// A throw-away chunk cache inside bake cache `cache`, laid out as [`new`](Self::new)'s
    /// but storing entries without fsync or payload digest (only this process writes and
    /// reads it, in its private work directory): for a scratch directory that the bake deletes
    /// (`kiln bake --no-cache` compresses big files into one while it still extracts others).
    /// Entries are still renamed into place whole, so readers see the same guarantees.
    pub fn scratch(cache: &Path) -> ChunkCache {
        ChunkCache {
            durable: false,
            ..ChunkCache::new(cache)
        }
    }

    /// Whether an entry for `key` exists (unchecked: [`get`](Self::get) checks it).
    pub fn contains(&self, key: &ChunkKey) -> bool {
        self.entry_path(key).is_file()
    }

    /// The directory holding the entries.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the entry for `key` lives.
    pub fn entry_path(&self, key: &ChunkKey) -> PathBuf {
        let hex = key.to_hex();
        self.dir.join(&hex[..2]).join(format!("{hex}.chunk"))
    }

    /// The payload stored under `key`, checked; `None` when absent or bad.
    pub fn get(&self, key: &ChunkKey) -> Option<Vec<u8>> {
        let path = self.entry_path(key);
        let mut f = match File::open(&path) {
            Ok(f) => f,
            Err(_) => {
                self.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        };
        match read_entry(&mut f, key, self.durable) {
            Some(payload) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.hit_bytes
                    .fetch_add(payload.len() as u64, Ordering::Relaxed);
                // For mtime-based pruning; a read-only cache still answers.
                let _ = f.set_modified(std::time::SystemTime::now());
                Some(payload)
            }
            None => {
                tracing::warn!(entry = %path.display(), "chunk cache: bad entry, compressing again");
                self.corrupt.fetch_add(1, Ordering::Relaxed);
                self.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Stores `payload` under `key`, atomically (see [`crate::atomic_file`]).
    pub fn put(&self, key: &ChunkKey, payload: &[u8]) -> Result<(), ChunkCacheError> {
        let path = self.entry_path(key);
        let dir = path.parent().unwrap_or(&self.dir);
        let io = |p: &Path| {
            let p = p.to_path_buf();
            move |source| ChunkCacheError::Io { path: p, source }
        };
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(MAGIC);
        header[8..16].copy_from_slice(&(payload.len() as u64).to_le_bytes());
        // A scratch cache lives in the bake's private work directory (mode 0700) and only
        // this process reads it back, moments later: its entries carry no payload digest.
        if self.durable {
            header[16..48].copy_from_slice(&Sha256::digest(payload));
        }
        header[48..80].copy_from_slice(&key.0);
        let fill = |f: &mut File| f.write_all(&header).and_then(|_| f.write_all(payload));
        if self.durable {
            atomic_file::write_with(&path, ".chunk-", 0o600, fill).map_err(|e| {
                ChunkCacheError::Io {
                    path: e.path,
                    source: e.source,
                }
            })?;
        } else {
            let mut tmp = tempfile::Builder::new()
                .prefix(".chunk-")
                .suffix(".tmp")
                .tempfile_in(dir)
                .map_err(io(dir))?;
            fill(tmp.as_file_mut()).map_err(io(&path))?;
            tmp.persist(&path).map_err(|e| ChunkCacheError::Io {
                path: path.clone(),
                source: e.error,
            })?;
        }
        self.stored.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// The payload under `key`, or `make()`'s result, which is then stored (a failure to
    /// store is logged and ignored: the cache only saves time).
    pub fn get_or_insert_with<E>(
        &self,
        key: &ChunkKey,
        make: impl FnOnce() -> Result<Vec<u8>, E>,
    ) -> Result<Vec<u8>, E> {
        if let Some(hit) = self.get(key) {
            return Ok(hit);
        }
        let fresh = make()?;
        if let Err(e) = self.put(key, &fresh) {
            tracing::warn!("{e}; continuing without caching this chunk");
        }
        Ok(fresh)
    }

    /// The counters so far.
    pub fn stats(&self) -> Stats {
        Stats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            corrupt: self.corrupt.load(Ordering::Relaxed),
            stored: self.stored.load(Ordering::Relaxed),
            hit_bytes: self.hit_bytes.load(Ordering::Relaxed),
        }
    }
}

/// Reads and checks one entry: header fields, exact length, and (`digest`) the payload's
/// sha256.
fn read_entry(f: &mut File, key: &ChunkKey, digest: bool) -> Option<Vec<u8>> {
    let mut header = [0u8; HEADER];
    f.read_exact(&mut header).ok()?;
    if &header[..8] != MAGIC || header[48..80] != key.0 {
        return None;
    }
    let len = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let on_disk = f.metadata().ok()?.len();
    if on_disk != HEADER as u64 + len {
        return None;
    }
    let mut payload = vec![0u8; usize::try_from(len).ok()?];
    f.read_exact(&mut payload).ok()?;
    (!digest || Sha256::digest(&payload)[..] == header[16..48]).then_some(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> ChunkKey {
        ChunkKey::new(
            &Codec::zstd(3, 8 << 20, "test-v1"),
            &Source::Slice {
                file_sha256: "ab",
                offset: n,
                len: 10,
                pad: 0,
            },
        )
    }

    #[test]
    fn keys_change_with_every_field() {
        let base = Codec::zstd(3, 1024, "f1");
        let s = Source::Slice {
            file_sha256: "00",
            offset: 0,
            len: 5,
            pad: 507,
        };
        let k = ChunkKey::new(&base, &s);
        let codecs = [
            Codec {
                name: "xz".into(),
                ..base.clone()
            },
            Codec {
                library: "0".into(),
                ..base.clone()
            },
            Codec {
                level: 4,
                ..base.clone()
            },
            Codec {
                chunk_size: 2048,
                ..base.clone()
            },
            Codec {
                format: "f2".into(),
                ..base.clone()
            },
        ];
        for c in &codecs {
            assert_ne!(ChunkKey::new(c, &s), k, "{c:?}");
        }
        let sources = [
            Source::Slice {
                file_sha256: "01",
                offset: 0,
                len: 5,
                pad: 507,
            },
            Source::Slice {
                file_sha256: "00",
                offset: 1,
                len: 5,
                pad: 507,
            },
            Source::Slice {
                file_sha256: "00",
                offset: 0,
                len: 6,
                pad: 507,
            },
            Source::Slice {
                file_sha256: "00",
                offset: 0,
                len: 5,
                pad: 0,
            },
            Source::Digest(&[0; 32]),
        ];
        for s2 in &sources {
            assert_ne!(ChunkKey::new(&base, s2), k, "{s2:?}");
        }
        assert_eq!(ChunkKey::new(&base.clone(), &s), k);
    }

    #[test]
    fn put_get_and_bad_entries_are_misses() {
        let d = tempfile::tempdir().unwrap();
        let c = ChunkCache::new(d.path());
        assert_eq!(c.get(&key(0)), None);
        c.put(&key(0), b"compressed bytes").unwrap();
        assert_eq!(c.get(&key(0)).as_deref(), Some(&b"compressed bytes"[..]));
        let p = c.entry_path(&key(0));
        assert!(p.starts_with(d.path().join(env!("CARGO_PKG_VERSION")).join("chunks")));
        let good = std::fs::read(&p).unwrap();

        // Each kind of damage: a miss, never the damaged bytes.
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        let mut longer = good.clone();
        longer.push(0);
        let mut bad_magic = good.clone();
        bad_magic[0] = b'X';
        for (what, bytes) in [
            ("payload bit flip", flipped),
            ("truncated", good[..good.len() - 3].to_vec()),
            ("header only", good[..HEADER].to_vec()),
            ("empty", Vec::new()),
            ("trailing byte", longer),
            ("bad magic", bad_magic),
        ] {
            std::fs::write(&p, &bytes).unwrap();
            assert_eq!(c.get(&key(0)), None, "{what}");
        }
        // An entry copied under another key's name is refused too.
        std::fs::write(&p, &good).unwrap();
        let other = c.entry_path(&key(1));
        std::fs::create_dir_all(other.parent().unwrap()).unwrap();
        std::fs::copy(&p, &other).unwrap();
        assert_eq!(c.get(&key(1)), None, "mislabelled entry");

        // get_or_insert_with replaces a bad entry.
        std::fs::write(&p, b"garbage").unwrap();
        let got = c
            .get_or_insert_with(&key(0), || Ok::<_, ()>(b"fresh".to_vec()))
            .unwrap();
        assert_eq!(got, b"fresh");
        assert_eq!(c.get(&key(0)).as_deref(), Some(&b"fresh"[..]));
        let s = c.stats();
        assert_eq!(s.corrupt, 8, "{s:?}");
        assert_eq!((s.hits, s.stored), (2, 2), "{s:?}");
        // No temp files left behind.
        let leftovers: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(".chunk-"))
            .collect();
        assert!(leftovers.is_empty());
    }

    #[test]
    fn concurrent_writers_and_readers_only_see_whole_entries() {
        let d = tempfile::tempdir().unwrap();
        let payload: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::thread::scope(|s| {
            for t in 0..4 {
                let (d, payload) = (d.path(), &payload);
                s.spawn(move || {
                    let c = ChunkCache::new(d);
                    for i in 0..40u64 {
                        let k = key(i % 5);
                        if (i + t) % 2 == 0 {
                            c.put(&k, payload).unwrap();
                        } else if let Some(got) = c.get(&k) {
                            assert_eq!(&got, payload);
                        }
                    }
                    assert_eq!(c.stats().corrupt, 0);
                });
            }
        });
    }

    #[test]
    fn unwritable_cache_is_an_error_naming_the_path() {
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("not-a-dir");
        std::fs::write(&file, b"").unwrap();
        let c = ChunkCache::at(file.join("chunks"));
        let e = c.put(&key(0), b"x").unwrap_err().to_string();
        assert!(e.contains("not-a-dir"), "{e}");
        assert_eq!(
            c.get_or_insert_with(&key(0), || Ok::<_, ()>(b"y".to_vec())),
            Ok(b"y".to_vec())
        );
    }
}
