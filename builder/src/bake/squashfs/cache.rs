//! The compressed-block cache: one entry per file content (sha256 and size) and codec, holding
//! the file's compressed data blocks exactly as they go into an image, so a re-bake copies
//! them instead of compressing again, and an upgrade recompresses only the files that changed.
//!
//! Entry layout (`<cache>/<kiln version>/squashfs-<codec key>/<sha256>-<size>`), little endian:
//! `KSQBLK1\n`, u32 block size, u32 block count, u64 data length, one u32 size word per block,
//! the data, then the sha256 of (data ‖ size words). Entries are written to a temp file and
//! renamed; a reader checks the lengths before use and the digest while copying, so a torn
//! or corrupt entry is never trusted.

use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::codec::Codec;

const MAGIC: &[u8; 8] = b"KSQBLK1\n";
const FIXED: u64 = 8 + 4 + 4 + 8;

/// Bit 24 of a data block's size word: the block is stored uncompressed.
pub const BLOCK_UNCOMPRESSED: u32 = 1 << 24;

/// Bytes a size word says are stored for the block.
pub fn stored_len(word: u32) -> u64 {
    (word & !BLOCK_UNCOMPRESSED) as u64
}

/// A cache directory for one codec and block size.
#[derive(Debug, Clone)]
pub struct BlockCache {
    dir: PathBuf,
    block_size: u32,
}

/// A usable-looking entry (lengths checked; the digest is checked while copying).
#[derive(Debug, Clone)]
pub struct Hit {
    path: PathBuf,
    /// Size word of each block.
    pub sizes: Vec<u32>,
    data_len: u64,
}

impl BlockCache {
    /// The cache for `codec` and `block_size` under the bake cache `root`.
    pub fn new(root: &Path, codec: &Codec, block_size: u32) -> BlockCache {
        let key = Sha256::digest(
            format!(
                "kiln squashfs blocks v1\n{}\nblock_size={block_size}\n",
                codec.identity()
            )
            .as_bytes(),
        );
        BlockCache {
            dir: root
                .join(env!("CARGO_PKG_VERSION"))
                .join(format!("squashfs-{}", &hex::encode(key)[..16])),
            block_size,
        }
    }

    /// Where the entry of a content lives.
    pub fn entry_path(&self, sha256: &str, size: u64) -> PathBuf {
        self.dir.join(format!("{sha256}-{size}"))
    }

    /// The entry for a file of `size` bytes with `sha256`, if its header is consistent.
    pub fn lookup(&self, sha256: &str, size: u64) -> Option<Hit> {
        let path = self.entry_path(sha256, size);
        let mut f = File::open(&path).ok()?;
        let len = f.metadata().ok()?.len();
        let mut fixed = [0u8; FIXED as usize];
        f.read_exact(&mut fixed).ok()?;
        let bs = u32::from_le_bytes(fixed[8..12].try_into().ok()?);
        let n = u32::from_le_bytes(fixed[12..16].try_into().ok()?);
        let data_len = u64::from_le_bytes(fixed[16..24].try_into().ok()?);
        if &fixed[..8] != MAGIC
            || bs != self.block_size
            || n as u64 != size / self.block_size as u64
            || len != FIXED + 4 * n as u64 + data_len + 32
        {
            return None;
        }
        let mut raw = vec![0u8; 4 * n as usize];
        f.read_exact(&mut raw).ok()?;
        let sizes: Vec<u32> = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let ok = sizes
            .iter()
            .all(|&w| stored_len(w) <= self.block_size as u64 && (w >> 25) == 0);
        let sum: u64 = sizes.iter().map(|&w| stored_len(w)).sum();
        (ok && sum == data_len).then_some(Hit {
            path,
            sizes,
            data_len,
        })
    }

    /// Starts a new entry; `None` when the cache directory cannot be written (the cache is
    /// an optimisation: a bake never fails because of it).
    pub fn filler(&self, sha256: &str, size: u64) -> Option<Filler> {
        std::fs::create_dir_all(&self.dir).ok()?;
        let tmp = tempfile::Builder::new()
            .prefix(".blocks-")
            .tempfile_in(&self.dir)
            .ok()?;
        let n = (size / self.block_size as u64) as u32;
        let mut w = BufWriter::with_capacity(1 << 20, tmp);
        w.write_all(MAGIC).ok()?;
        w.write_all(&self.block_size.to_le_bytes()).ok()?;
        w.write_all(&n.to_le_bytes()).ok()?;
        w.write_all(&0u64.to_le_bytes()).ok()?;
        w.write_all(&vec![0u8; 4 * n as usize]).ok()?;
        Some(Filler {
            w,
            hash: Sha256::new(),
            sizes: Vec::with_capacity(n as usize),
            data_len: 0,
            dest: self.entry_path(sha256, size),
            blocks: n,
            failed: false,
        })
    }
}

impl Hit {
    /// Stored bytes of all blocks.
    pub fn data_len(&self) -> u64 {
        self.data_len
    }

    /// Copies the cached data into `out`, hashing it; `Ok(false)` when the digest does not
    /// match (the caller must then throw away what was copied). I/O errors on `out` are
    /// returned; a read error on the entry counts as a mismatch.
    pub fn copy_into(&self, out: &mut impl Write) -> io::Result<bool> {
        let Ok(mut f) = File::open(&self.path) else {
            return Ok(false);
        };
        if f.seek(SeekFrom::Start(FIXED + 4 * self.sizes.len() as u64))
            .is_err()
        {
            return Ok(false);
        }
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut left = self.data_len;
        while left > 0 {
            let want = left.min(buf.len() as u64) as usize;
            if f.read_exact(&mut buf[..want]).is_err() {
                return Ok(false);
            }
            h.update(&buf[..want]);
            out.write_all(&buf[..want])?;
            left -= want as u64;
        }
        for w in &self.sizes {
            h.update(w.to_le_bytes());
        }
        let mut digest = [0u8; 32];
        if f.read_exact(&mut digest).is_err() {
            return Ok(false);
        }
        Ok(h.finalize()[..] == digest)
    }

    /// Removes a bad entry so the next bake fills it again.
    pub fn discard(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// An entry being written, block by block, as the image gets the same blocks.
pub struct Filler {
    w: BufWriter<tempfile::NamedTempFile>,
    hash: Sha256,
    sizes: Vec<u32>,
    data_len: u64,
    dest: PathBuf,
    blocks: u32,
    failed: bool,
}

impl Filler {
    /// Adds the next block: its size word and stored bytes.
    pub fn push(&mut self, word: u32, bytes: &[u8]) {
        self.sizes.push(word);
        self.data_len += bytes.len() as u64;
        self.hash.update(bytes);
        if !self.failed && self.w.write_all(bytes).is_err() {
            self.failed = true;
        }
    }

    /// Publishes the entry if every block arrived and was written.
    pub fn publish(mut self) {
        if self.failed || self.sizes.len() != self.blocks as usize {
            return;
        }
        for w in &self.sizes {
            self.hash.update(w.to_le_bytes());
        }
        let digest = self.hash.finalize();
        let words: Vec<u8> = self.sizes.iter().flat_map(|w| w.to_le_bytes()).collect();
        // Failing to publish only costs the next bake a recompression.
        let _ = (|| -> io::Result<()> {
            self.w.write_all(&digest)?;
            self.w.seek(SeekFrom::Start(16))?;
            self.w.write_all(&self.data_len.to_le_bytes())?;
            self.w.write_all(&words)?;
            let tmp = self.w.into_inner().map_err(|e| e.into_error())?;
            tmp.as_file().sync_all()?;
            tmp.persist(&self.dest).map_err(|e| e.error)?;
            Ok(())
        })();
    }
}
