//! Metadata blocks: the 8 KiB units (each behind a 2-byte length header) that hold the inode,
//! directory, fragment and id tables, and the positions ("references") readers use to find
//! a byte inside them.

use super::codec::Codec;

/// Uncompressed size of one metadata block.
pub const METADATA_SIZE: usize = 8192;

/// Set in a metadata block header when the block is stored uncompressed.
const META_UNCOMPRESSED: u16 = 0x8000;

/// Accumulates one metadata stream (a table) and compresses it block by block.
pub struct MetaWriter<'c> {
    codec: &'c Codec,
    ctx: super::codec::Context,
    /// Compressed blocks so far, headers included.
    out: Vec<u8>,
    /// Bytes of the block being filled.
    pending: Vec<u8>,
    /// Offset in `out` of each finished block.
    block_starts: Vec<u64>,
}

impl<'c> MetaWriter<'c> {
    /// An empty stream compressed with `codec`.
    pub fn new(codec: &'c Codec) -> MetaWriter<'c> {
        MetaWriter {
            codec,
            ctx: codec.context(),
            out: Vec::new(),
            pending: Vec::with_capacity(METADATA_SIZE),
            block_starts: Vec::new(),
        }
    }

    /// Position of the next byte in the uncompressed stream.
    pub fn pos(&self) -> u64 {
        (self.block_starts.len() * METADATA_SIZE + self.pending.len()) as u64
    }

    /// Offset, from the table's start, of the compressed block holding uncompressed byte `upos`
    /// (which must be in a finished block or in the one being filled).
    pub fn block_start(&self, upos: u64) -> u64 {
        let b = (upos / METADATA_SIZE as u64) as usize;
        self.block_starts
            .get(b)
            .copied()
            .unwrap_or(self.out.len() as u64)
    }

    /// The squashfs reference of uncompressed byte `upos`: block offset << 16 | offset in block.
    pub fn reference(&self, upos: u64) -> u64 {
        (self.block_start(upos) << 16) | (upos % METADATA_SIZE as u64)
    }

    /// Appends bytes, finishing blocks as they fill.
    pub fn push(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let room = METADATA_SIZE - self.pending.len();
            let n = room.min(b.len());
            self.pending.extend_from_slice(&b[..n]);
            b = &b[n..];
            if self.pending.len() == METADATA_SIZE {
                self.flush();
            }
        }
    }

    fn flush(&mut self) {
        self.block_starts.push(self.out.len() as u64);
        let packed = self.codec.compress(&mut self.ctx, &self.pending);
        let (header, body) = match packed {
            Some(c) => (c.len() as u16, c),
            None => (
                self.pending.len() as u16 | META_UNCOMPRESSED,
                self.pending.clone(),
            ),
        };
        self.out.extend_from_slice(&header.to_le_bytes());
        self.out.extend_from_slice(&body);
        self.pending.clear();
    }

    /// Finishes the last block; returns the compressed stream and each block's offset in it.
    pub fn finish(mut self) -> (Vec<u8>, Vec<u64>) {
        if !self.pending.is_empty() {
            self.flush();
        }
        (self.out, self.block_starts)
    }
}

/// A table stored as metadata blocks followed by the u64 array of their absolute positions
/// (the fragment and id tables). `at` is where the blocks will start in the image; returns
/// the bytes to write there and the offset, within them, of the index array (what the
/// superblock points at).
pub fn indexed_table(codec: &Codec, entries: &[u8], at: u64) -> (Vec<u8>, u64) {
    let mut w = MetaWriter::new(codec);
    w.push(entries);
    let (mut bytes, starts) = w.finish();
    let index_at = bytes.len() as u64;
    for s in starts {
        bytes.extend_from_slice(&(at + s).to_le_bytes());
    }
    (bytes, index_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads a metadata stream back: (header, payload) per block.
    fn blocks(mut s: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut out = Vec::new();
        while !s.is_empty() {
            let h = u16::from_le_bytes([s[0], s[1]]);
            let n = (h & 0x7fff) as usize;
            let body = &s[2..2 + n];
            let plain = if h & META_UNCOMPRESSED != 0 {
                body.to_vec()
            } else {
                zstd::bulk::decompress(body, METADATA_SIZE).unwrap()
            };
            out.push((h, plain));
            s = &s[2 + n..];
        }
        out
    }

    #[test]
    fn blocks_split_at_8k_and_references_point_into_them() {
        let codec = Codec::zstd(15);
        let mut w = MetaWriter::new(&codec);
        let data: Vec<u8> = (0..20_000u32).map(|i| (i % 7) as u8).collect();
        w.push(&data[..5000]);
        assert_eq!(w.reference(5000), 5000);
        w.push(&data[5000..]);
        let r = w.reference(8192 + 10);
        let (bytes, starts) = w.finish();
        let bl = blocks(&bytes);
        assert_eq!(bl.len(), 3);
        assert_eq!(starts[0], 0);
        assert_eq!(r >> 16, starts[1]);
        assert_eq!(r & 0xffff, 10);
        let joined: Vec<u8> = bl.iter().flat_map(|(_, p)| p.clone()).collect();
        assert_eq!(joined, data);
        assert_eq!(bl[0].1.len(), METADATA_SIZE);
        assert_eq!(bl[2].1.len(), 20_000 - 2 * METADATA_SIZE);
    }

    #[test]
    fn incompressible_blocks_are_stored_with_the_flag() {
        let codec = Codec::zstd(15);
        let mut w = MetaWriter::new(&codec);
        // A xorshift stream: zstd cannot shrink it.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let noise: Vec<u8> = (0..3000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        w.push(&noise);
        let (bytes, _) = w.finish();
        let bl = blocks(&bytes);
        assert_eq!(bl[0].0, 3000 | META_UNCOMPRESSED);
        assert_eq!(bl[0].1, noise);
    }

    #[test]
    fn indexed_table_points_at_its_blocks() {
        let codec = Codec::zstd(15);
        let entries = vec![0u8; 16 * 600]; // > 512 fragment entries: two blocks
        let (bytes, index_at) = indexed_table(&codec, &entries, 1000);
        let idx: Vec<u64> = bytes[index_at as usize..]
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(idx.len(), 2);
        assert_eq!(idx[0], 1000);
        assert!(idx[1] > 1000 && idx[1] < 1000 + index_at);
    }
}
