//! What filesystem a partition holds, from its superblock magic, before anything mounts it.
//!
//! Magics: ext2/3/4 `0xEF53` at byte 56 of the superblock at 1024 (kernel
//! `Documentation/filesystems/ext4/super.rst`); XFS `XFSB` at 0 (`xfs_format.h`); btrfs
//! `_BHRfS_M` at 64 of the superblock at 64 KiB (`btrfs/ctree.h`).

/// A filesystem kiln recognises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsKind {
    /// ext4 (or ext2/3, which the ext4 driver mounts): kiln writes it.
    Ext4,
    /// XFS: recognised, not written yet.
    Xfs,
    /// btrfs: recognised, not written yet.
    Btrfs,
}

impl FsKind {
    /// The name `mount -t` and users know.
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
        }
    }
}

/// How many bytes at the start of a partition [`detect`] needs.
pub const PROBE_BYTES: usize = 64 * 1024 + 4096;

/// The filesystem whose superblock starts `head` (the first [`PROBE_BYTES`] of a
/// partition, or fewer when the partition is smaller), or `None`.
pub fn detect(head: &[u8]) -> Option<FsKind> {
    if head.len() >= 1024 + 58 && head[1024 + 56..1024 + 58] == [0x53, 0xef] {
        return Some(FsKind::Ext4);
    }
    if head.starts_with(b"XFSB") {
        return Some(FsKind::Xfs);
    }
    if head.len() >= 65536 + 72 && &head[65536 + 64..65536 + 72] == b"_BHRfS_M" {
        return Some(FsKind::Btrfs);
    }
    None
}

/// What an ext4 superblock says about room, for the unprivileged mode (which has no statvfs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ext4Space {
    /// Free blocks less the reserved ones, in bytes (what statvfs calls `f_bavail`).
    pub free: u64,
    /// Free inodes.
    pub inodes: u64,
    /// The journal needs recovery (`needs_recovery`): the filesystem was not unmounted cleanly.
    pub needs_recovery: bool,
}

fn le(head: &[u8], at: usize, n: usize) -> u64 {
    head[1024 + at..1024 + at + n]
        .iter()
        .rev()
        .fold(0, |v, &b| (v << 8) | b as u64)
}

/// Reads [`Ext4Space`] from the superblock at byte 1024 of `head` (field offsets from the
/// kernel's `struct ext4_super_block`, `fs/ext4/ext4.h`); `None` when `head` holds none.
pub fn ext4_space(head: &[u8]) -> Option<Ext4Space> {
    if detect(head) != Some(FsKind::Ext4) || head.len() < 1024 + 0x15c {
        return None;
    }
    let incompat = le(head, 0x60, 4);
    let wide = incompat & 0x80 != 0; // INCOMPAT_64BIT
    let blocks =
        |lo: usize, hi: usize| le(head, lo, 4) | if wide { le(head, hi, 4) << 32 } else { 0 };
    let log = le(head, 0x18, 4);
    if log > 6 {
        return None; // block sizes above 64 KiB do not exist
    }
    let free = blocks(0x0c, 0x158).saturating_sub(blocks(0x08, 0x154));
    Some(Ext4Space {
        free: free.saturating_mul(1024 << log),
        inodes: le(head, 0x10, 4),
        needs_recovery: incompat & 0x4 != 0, // INCOMPAT_RECOVER
    })
}

/// What the first bytes look like, for an error message, in words: a partition that holds
/// no filesystem may hold anything, and its bytes are never quoted (issue 34).
pub fn describe_unknown(head: &[u8]) -> String {
    if head.iter().all(|&b| b == 0) {
        "only zero bytes (no filesystem)".into()
    } else {
        "no known superblock (ext4, xfs or btrfs magic)".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magics() {
        let mut ext = vec![0u8; PROBE_BYTES];
        ext[1024 + 56] = 0x53;
        ext[1024 + 57] = 0xef;
        let mut xfs = vec![0u8; PROBE_BYTES];
        xfs[..4].copy_from_slice(b"XFSB");
        let mut btrfs = vec![0u8; PROBE_BYTES];
        btrfs[65536 + 64..65536 + 72].copy_from_slice(b"_BHRfS_M");
        for (head, want) in [
            (&ext[..], Some(FsKind::Ext4)),
            (&xfs[..], Some(FsKind::Xfs)),
            (&btrfs[..], Some(FsKind::Btrfs)),
            (&[0u8; 2048][..], None),
            (&ext[..1070], None),
        ] {
            assert_eq!(detect(head), want);
        }
        assert!(describe_unknown(&[0; 16]).contains("zero"));
    }
}
