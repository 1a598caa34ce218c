//! The one file hasher: a file's size and sha256, and its SHA1 when an SBOM needs it, read in
//! large chunks. Every digest kiln takes of a file on disk comes from here, as a
//! [`FileDigest`] with named fields.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use sha1::Sha1;
use sha2::{Digest, Sha256};

/// Read size while hashing.
const CHUNK: usize = 1 << 20;

/// Which sums to take besides the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sums {
    /// sha256 only (the store, published outputs).
    Sha256,
    /// sha256 and SHA1 (files that go into a layer, whose SBOM lists both).
    Sha256AndSha1,
}

/// What a file hashed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileDigest {
    /// Bytes read.
    pub size: u64,
    /// Lowercase hex sha256.
    pub sha256: String,
    /// Lowercase hex SHA1, when [`Sums::Sha256AndSha1`] asked for it.
    pub sha1: Option<String>,
}

/// Hashes a reader to its end.
pub fn hash_reader(r: &mut impl Read, sums: Sums) -> io::Result<FileDigest> {
    let mut sha256 = Sha256::new();
    let mut sha1 = (sums == Sums::Sha256AndSha1).then(Sha1::new);
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        sha256.update(&buf[..n]);
        if let Some(h) = sha1.as_mut() {
            h.update(&buf[..n]);
        }
        size += n as u64;
    }
    Ok(FileDigest {
        size,
        sha256: hex::encode(sha256.finalize()),
        sha1: sha1.map(|h| hex::encode(h.finalize())),
    })
}

/// Hashes the file at `path`.
pub fn hash_file(path: &Path, sums: Sums) -> io::Result<FileDigest> {
    hash_reader(&mut File::open(path)?, sums)
}

/// CRC-32 as GPT uses it (IEEE 802.3, reflected polynomial 0xEDB88320; UEFI spec §5.3.2).
pub fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in data {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            let mask = (crc & 1).wrapping_neg();
            crc = (crc >> 1) ^ (0xEDB8_8320 & mask);
        }
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        let d = hash_reader(&mut &b"abc"[..], Sums::Sha256AndSha1).unwrap();
        assert_eq!(d.size, 3);
        assert_eq!(
            d.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(
            d.sha1.as_deref(),
            Some("a9993e364706816aba3e25717850c26c9cd0d89d")
        );
        let d = hash_reader(&mut &b""[..], Sums::Sha256).unwrap();
        assert_eq!(d.size, 0);
        assert_eq!(d.sha1, None);
    }
}
