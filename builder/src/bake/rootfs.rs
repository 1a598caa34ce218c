//! The rootfs overlay: the layer as a `.tar.zst` that `tar -xf … -C /` (or `kiln install`)
//! applies to an Ubuntu/Debian root. Entries sorted, owner root:root (0/0), one mtime,
//! fixed modes; zstd level 3 with a checksum. zstd's multi-threaded mode gives the same bytes
//! whatever the number of workers, so `threads` only changes the speed.

use std::io::{BufWriter, Write};
use std::path::Path;

use super::{BakeError, Layer, Node};

/// zstd level for the overlay (the same default `zstd` and `tar -I zstd` use).
pub const ZSTD_LEVEL: i32 = 3;

fn header(layer: &Layer, mode: u32, kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    let _ = h.set_username("root");
    let _ = h.set_groupname("root");
    h.set_mtime(layer.epoch);
    h.set_size(size);
    h
}

/// Writes the tar stream of `layer` (uncompressed) into `w`.
pub fn write_tar(layer: &Layer, w: impl Write) -> Result<(), BakeError> {
    let io = |e| BakeError::Io {
        path: layer.base_name().into(),
        source: e,
    };
    let mut tar = tar::Builder::new(w);
    for (path, e) in &layer.entries {
        match &e.node {
            Node::Dir => {
                let mut h = header(layer, 0o755, tar::EntryType::Directory, 0);
                tar.append_data(&mut h, format!("{path}/"), std::io::empty())
                    .map_err(io)?;
            }
            Node::File {
                data, mode, size, ..
            } => {
                let mut h = header(layer, *mode, tar::EntryType::Regular, *size);
                let r = data.open()?;
                tar.append_data(&mut h, path, r).map_err(io)?;
            }
            Node::Symlink(target) => {
                let mut h = header(layer, 0o777, tar::EntryType::Symlink, 0);
                tar.append_link(&mut h, path, target).map_err(io)?;
            }
        }
    }
    tar.into_inner().map_err(io)?.flush().map_err(io)?;
    Ok(())
}

/// Writes `layer` as a `.tar.zst` at `out`, atomically.
pub fn write(layer: &Layer, out: &Path, threads: u32) -> Result<(), BakeError> {
    let threads = if threads == 0 {
        std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1)
    } else {
        threads
    };
    let mut inner: Option<BakeError> = None;
    super::write_atomic_with(out, |f| {
        let mut enc = zstd::Encoder::new(BufWriter::with_capacity(1 << 20, f), ZSTD_LEVEL)?;
        enc.include_checksum(true)?;
        // Always the multi-threaded code path (even with one worker) so the bytes never
        // depend on how many cores the baking machine has.
        enc.multithread(threads.max(1))?;
        if let Err(e) = write_tar(layer, &mut enc) {
            let msg = e.to_string();
            inner = Some(e);
            return Err(std::io::Error::other(msg));
        }
        enc.finish()?.flush()
    })
    .map_err(|e| inner.take().unwrap_or(e))
}
