//! The dm-verity hash partition of a DDI, as `systemd-repart` 257 has cryptsetup format it:
//! SHA-256, 4096-byte data and hash blocks, format 1 (salt first), a superblock, and the
//! tree's levels stored top level first.

use sha2::{Digest, Sha256};

/// The data and hash block size, in bytes.
pub const BLOCK: usize = 4096;

/// Digests per hash block (4096 / 32).
const FANOUT: usize = BLOCK / 32;

/// The superblock's bytes that carry fields; the rest of its block is zero.
const SUPERBLOCK_LEN: usize = 512;

/// What makes one tree differ from another over the same data: the salt (hashed before each
/// block) and the UUID recorded in the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerityParams {
    /// The 32-byte salt.
    pub salt: [u8; 32],
    /// The superblock UUID, in the byte order of its text form.
    pub uuid: [u8; 16],
}

/// A finished tree: its root hash and the bytes of the hash partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerityTree {
    /// SHA-256(salt, top block), or of the only data block when there is one.
    pub root_hash: [u8; 32],
    /// How many 4096-byte data blocks were hashed.
    pub data_blocks: u64,
    /// The superblock block, then the levels from the top one down to level 0.
    pub hash_area: Vec<u8>,
}

/// Hashes data blocks as they stream past and keeps only their digests (32 bytes a block).
#[derive(Debug, Clone)]
pub struct TreeBuilder {
    params: VerityParams,
    salted: Sha256,
    leaves: Vec<u8>,
    blocks: u64,
}

impl TreeBuilder {
    /// A builder with no blocks yet.
    pub fn new(params: VerityParams) -> TreeBuilder {
        TreeBuilder {
            params,
            salted: Sha256::new_with_prefix(params.salt),
            leaves: Vec::new(),
            blocks: 0,
        }
    }

    /// Adds the next data block.
    pub fn push(&mut self, block: &[u8; BLOCK]) {
        let digest = self.salted.clone().chain_update(block).finalize();
        self.leaves.extend_from_slice(&digest);
        self.blocks += 1;
    }

    /// Builds the upper levels and lays out the hash partition; `None` when no block was
    /// pushed (cryptsetup refuses empty data too).
    pub fn finish(self) -> Option<VerityTree> {
        if self.blocks == 0 {
            return None;
        }
        let mut digests = self.leaves;
        let mut levels: Vec<Vec<u8>> = Vec::new();
        while digests.len() > 32 {
            let mut level = digests;
            level.resize(level.len().div_ceil(BLOCK) * BLOCK, 0);
            digests = level
                .chunks(BLOCK)
                .flat_map(|b| self.salted.clone().chain_update(b).finalize())
                .collect();
            levels.push(level);
        }
        let root_hash: [u8; 32] = digests.try_into().expect("one digest is left at the top");
        let mut hash_area = superblock(&self.params, self.blocks);
        for level in levels.iter().rev() {
            hash_area.extend_from_slice(level);
        }
        Some(VerityTree {
            root_hash,
            data_blocks: self.blocks,
            hash_area,
        })
    }
}

/// The size of the hash partition for `data_blocks` blocks: the superblock block and every
/// level's blocks, level `i` holding `ceil(n / 128^(i+1))` of them until one block is left.
pub fn hash_area_size(data_blocks: u64) -> u64 {
    let fanout = FANOUT as u64;
    let mut blocks = 1;
    let mut n = data_blocks;
    while n > 1 {
        n = n.div_ceil(fanout);
        blocks += n;
    }
    blocks * BLOCK as u64
}

/// The first hash block: cryptsetup's on-disk superblock (little-endian, packed), zero-padded.
fn superblock(params: &VerityParams, data_blocks: u64) -> Vec<u8> {
    let mut sb = vec![0u8; BLOCK];
    sb[0..8].copy_from_slice(b"verity\0\0");
    sb[8..12].copy_from_slice(&1u32.to_le_bytes()); // superblock version
    sb[12..16].copy_from_slice(&1u32.to_le_bytes()); // hash type 1: salt before the block
    sb[16..32].copy_from_slice(&params.uuid);
    sb[32..38].copy_from_slice(b"sha256");
    sb[64..68].copy_from_slice(&(BLOCK as u32).to_le_bytes());
    sb[68..72].copy_from_slice(&(BLOCK as u32).to_le_bytes());
    sb[72..80].copy_from_slice(&data_blocks.to_le_bytes());
    sb[80..82].copy_from_slice(&(params.salt.len() as u16).to_le_bytes());
    sb[88..88 + params.salt.len()].copy_from_slice(&params.salt);
    debug_assert!(sb[SUPERBLOCK_LEN..].iter().all(|&b| b == 0));
    sb
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bake::ddi::test_tools::{run, tool};
    use std::path::Path;

    const PARAMS: VerityParams = VerityParams {
        salt: [0x5a; 32],
        uuid: [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0x4d, 0xef, 0x81, 0x23, 0x45, 0x67, 0x89, 0xab,
            0xcd, 0xef,
        ],
    };

    /// Deterministic, incompressible-looking test data.
    fn data(blocks: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(blocks * BLOCK);
        let mut x = Sha256::digest(b"kiln verity test data");
        while out.len() < blocks * BLOCK {
            out.extend_from_slice(&x);
            x = Sha256::digest(x);
        }
        out
    }

    fn tree(data: &[u8]) -> VerityTree {
        let mut b = TreeBuilder::new(PARAMS);
        for chunk in data.chunks(BLOCK) {
            b.push(chunk.try_into().unwrap());
        }
        b.finish().expect("at least one block")
    }

    #[test]
    fn sizes_follow_the_level_counts() {
        // (data blocks, hash blocks including the superblock); 384 and 2560 are the
        // research spec's cryptsetup and repart measurements.
        for (n, blocks) in [(1, 1), (2, 2), (128, 2), (129, 4), (384, 5), (2560, 22)] {
            assert_eq!(hash_area_size(n), blocks * BLOCK as u64, "{n} data blocks");
            assert_eq!(
                tree(&data(n as usize)).hash_area.len() as u64,
                blocks * BLOCK as u64
            );
        }
    }

    #[test]
    fn one_block_has_its_own_digest_as_root() {
        let d = data(1);
        let t = tree(&d);
        let want: [u8; 32] = Sha256::new()
            .chain_update(PARAMS.salt)
            .chain_update(&d)
            .finalize()
            .into();
        assert_eq!(t.root_hash, want);
    }

    #[test]
    fn no_block_no_tree() {
        assert_eq!(TreeBuilder::new(PARAMS).finish(), None);
    }

    #[test]
    fn superblock_fields() {
        let sb = &tree(&data(3)).hash_area[..BLOCK];
        assert_eq!(&sb[0..8], b"verity\0\0");
        assert_eq!(&sb[16..32], &PARAMS.uuid);
        assert_eq!(&sb[32..39], b"sha256\0");
        assert_eq!(u64::from_le_bytes(sb[72..80].try_into().unwrap()), 3);
        assert_eq!(&sb[80..82], &[32, 0]);
        assert_eq!(&sb[88..120], &PARAMS.salt);
        assert!(sb[120..].iter().all(|&b| b == 0));
    }

    fn write(dir: &Path, name: &str, bytes: &[u8]) -> String {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p.to_str().unwrap().to_string()
    }

    /// cryptsetup's own `veritysetup format` with the same parameters writes the same hash
    /// device and prints the same root hash; `verify` accepts kiln's tree and refuses it once
    /// a data byte changes.
    #[test]
    fn veritysetup_agrees() {
        let vs = tool("veritysetup", "cryptsetup-bin");
        let dir = tempfile::tempdir().unwrap();
        for n in [1usize, 129, 300] {
            let mut d = data(n);
            let t = tree(&d);
            let root = hex::encode(t.root_hash);
            let data_path = write(dir.path(), "data", &d);
            let hash_path = write(dir.path(), "hash", &t.hash_area);
            run(&vs, &["verify", &data_path, &hash_path, &root]).expect("verify accepts");

            let theirs = dir.path().join("theirs");
            let salt = hex::encode(PARAMS.salt);
            let uuid = "12345678-9abc-4def-8123-456789abcdef";
            let out = run(
                &vs,
                &[
                    "format",
                    "--hash=sha256",
                    "--format=1",
                    "--data-block-size=4096",
                    "--hash-block-size=4096",
                    &format!("--salt={salt}"),
                    &format!("--uuid={uuid}"),
                    &data_path,
                    theirs.to_str().unwrap(),
                ],
            )
            .expect("format runs");
            let printed = out.lines().find(|l| l.starts_with("Root hash:"));
            assert_eq!(
                printed.map(|l| l.ends_with(&root)),
                Some(true),
                "{n}: {out}"
            );
            assert_eq!(std::fs::read(&theirs).unwrap(), t.hash_area, "{n} blocks");

            d[(n - 1) * BLOCK + 7] ^= 1;
            let data_path = write(dir.path(), "data", &d);
            let err = run(&vs, &["verify", &data_path, &hash_path, &root])
                .expect_err("verify refuses a changed data byte");
            assert!(
                err.contains("Verification of") && err.contains("failed."),
                "{err}"
            );
        }
    }
}
