//! Compressing a file's groups of full blocks ahead of `write_image`, while the layer is
//! still being assembled (`crate::bake::precompress`): the same key, size words and stored
//! bytes as the writer's own cache entries, so the write copies them.

use std::fs::File;
use std::io;
use std::path::Path;

use super::codec::{Codec, Context, BLOCK_SIZE};
use super::data::{group_payload, store, BlockCache, GROUP_BLOCKS};
use crate::bake::chunk_cache::ChunkCache;

/// Ahead-of-write compression for `write_image` with `codec`: the groups of full blocks
/// of a file of `size` bytes it keeps in the chunk cache.
pub fn pieces(size: u64) -> u64 {
    groups(BLOCK_SIZE, size)
}

/// Compresses group `piece` of the file at `path` into `cache` as `write_image` with
/// `codec` would store it (see [`pieces`]).
pub fn precompress(
    codec: &Codec,
    cache: &ChunkCache,
    path: &Path,
    size: u64,
    sha256: &str,
    piece: u64,
) -> io::Result<()> {
    let bc = block_cache(codec, cache);
    precompress_group(&bc, codec, path, size, sha256, piece)
}

/// Takes back what [`precompress`] stored for a file whose content turned out not to be
/// `sha256`.
pub fn forget(codec: &Codec, cache: &ChunkCache, size: u64, sha256: &str) {
    forget_groups(&block_cache(codec, cache), size, sha256);
}

pub(super) fn block_cache<'c>(codec: &Codec, cache: &'c ChunkCache) -> BlockCache<'c> {
    BlockCache {
        cache,
        codec: codec.cache_codec(BLOCK_SIZE, GROUP_BLOCKS),
        block_size: BLOCK_SIZE,
    }
}

/// How many groups of full blocks `write_image` caches for a file of `size` bytes: the pieces
/// [`precompress_group`] can make before the image is written.
fn groups(block_size: u32, size: u64) -> u64 {
    (size / block_size as u64).div_ceil(GROUP_BLOCKS)
}

/// Compresses group `group` of the file at `path` (`size` bytes, content `sha256`) into the
/// cache exactly as `write_image` would store it (the same key, size words and stored bytes, all
/// through `store`), unless the cache holds it already. The caller checks the file's content
/// once all its groups are in ([`forget_groups`] when it no longer matches).
fn precompress_group(
    cache: &BlockCache<'_>,
    codec: &Codec,
    path: &Path,
    size: u64,
    sha256: &str,
    group: u64,
) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    let bs = cache.block_size as u64;
    let full = size / bs;
    if group >= groups(cache.block_size, size) {
        return Ok(());
    }
    let n = (full - group * GROUP_BLOCKS).min(GROUP_BLOCKS);
    let key = cache.key(sha256, group, n);
    if cache.cache.contains(&key) {
        return Ok(());
    }
    thread_local! {
        // A worker keeps its compression context from group to group, as `write`'s do: a
        // zstd context at a high level is costly to set up for every 2 MiB.
        static CTX: std::cell::RefCell<Option<(Codec, Context)>> = const { std::cell::RefCell::new(None) };
    }
    let f = File::open(path)?;
    let mut words = Vec::with_capacity(n as usize);
    let mut data = Vec::new();
    CTX.with(|cell| -> io::Result<()> {
        let mut slot = cell.borrow_mut();
        if slot.as_ref().is_none_or(|(c, _)| c != codec) {
            *slot = Some((*codec, codec.context()));
        }
        let Some((_, ctx)) = slot.as_mut() else {
            return Ok(());
        };
        for b in 0..n {
            let mut block = vec![0u8; bs as usize];
            f.read_exact_at(&mut block, (group * GROUP_BLOCKS + b) * bs)?;
            let s = store(codec, ctx, block, true);
            words.push(s.word());
            data.extend_from_slice(s.bytes());
        }
        Ok(())
    })?;
    cache
        .cache
        .put(&key, &group_payload(&words, &data))
        .map_err(io::Error::other)
}

/// Removes every group entry of a file of `size` bytes with content `sha256` from the cache.
fn forget_groups(cache: &BlockCache<'_>, size: u64, sha256: &str) {
    let full = size / cache.block_size as u64;
    for g in 0..groups(cache.block_size, size) {
        let n = (full - g * GROUP_BLOCKS).min(GROUP_BLOCKS);
        let _ = std::fs::remove_file(cache.cache.entry_path(&cache.key(sha256, g, n)));
    }
}
