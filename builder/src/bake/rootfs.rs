//! The rootfs overlay: the layer as a `.tar.zst` that `tar -xf … -C /` (or `kiln install`)
//! applies to an Ubuntu/Debian root. Entries sorted, owner root:root (0/0), one mtime,
//! fixed modes.
//!
//! The `.tar.zst` is a sequence of independent zstd frames (level 3, each with its content
//! checksum), which the zstd format defines as one stream: `zstd -d`, `tar --zstd` and
//! libzstd's streaming decoder read them all. Where the frames start depends
//! on the layer only ([`Framing`]): tar headers and small files are batched into frames, and
//! the data of each big file is cut at fixed offsets into chunks of its own (the last one
//! carrying tar's zero padding). That gives three properties:
//!
//! - frames are compressed in parallel on every core, with a bounded number in flight, so
//!   memory stays bounded whatever the size of the layer;
//! - the frames of big files come from the [chunk cache](super::chunk_cache) when the same
//!   bytes were compressed before (a re-bake, or an upgrade that changed only kubelet);
//! - the bytes do not depend on the number of threads or on what the cache held.

use std::collections::BTreeMap;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Mutex;

use crate::bake::chunk_cache::{ChunkCache, ChunkKey, Codec, Source, Stats};
use crate::bake::error::{io_err, BakeError};
use crate::bake::layer::{Data, Layer, Node};
use crate::bake::progress::{Phase, Tracker};
use crate::bake::sums::publish_sums;
use crate::bake::target::{base_name, ReadyFile, Target, TargetContext};
use crate::image_def::{Arch, ImageDef};
use sha2::{Digest, Sha256};

/// zstd level for the overlay (the same default `zstd` and `tar -I zstd` use).
pub const ZSTD_LEVEL: i32 = 3;

/// The chunk cache format string of overlay frames; bump it when frames change.
pub const FRAME_FORMAT: &str = "kiln-rootfs-zstd-frame-v1";

/// Memory for frames in flight (read, compressing, or waiting to be written in order).
const IN_FLIGHT_BYTES: u64 = 96 << 20;

/// Where frames start: part of the output format (changing it changes the bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// A big file's data is cut into frames of this many bytes (the last one shorter).
    /// Also the size at which a batch of headers and small files is closed.
    pub chunk: u64,
    /// Files from disk of at least this size are big: their data gets frames of its own,
    /// which the chunk cache keeps. Smaller files and kiln's rendered files are batched.
    pub big: u64,
}

/// The framing kiln uses: 8 MiB chunks (at most ~0.2 % bigger than one zstd frame on machine
/// code, see docs/benchmarks.md), files from 1 MiB up cut into chunks.
pub const FRAMING: Framing = Framing {
    chunk: 8 << 20,
    big: 1 << 20,
};

/// How to write the overlay.
#[derive(Debug, Clone, Copy)]
pub struct RootfsOptions<'a> {
    /// Compression threads (0: all cores). Never changes the bytes.
    pub threads: u32,
    /// The chunk cache, if any. Never changes the bytes.
    pub cache: Option<&'a ChunkCache>,
    /// Where frames start.
    pub framing: Framing,
}

/// What writing the overlay did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootfsReport {
    /// zstd frames written.
    pub frames: u64,
    /// Frames of big-file chunks among them.
    pub chunk_frames: u64,
    /// The chunk cache's counters for this write (`None` without a cache).
    pub cache: Option<Stats>,
    /// sha256 of the `.tar.zst` as written (taken while the frames were written, so
    /// `SHA256SUMS` needs no second read of the archive).
    pub sha256: [u8; 32],
}

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

/// Writes the tar stream of `layer` (uncompressed) into `w`: exactly the bytes the `.tar.zst`
/// decompresses to.
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

/// The uncompressed bytes of one frame.
enum Job<'a> {
    /// Tar headers, small files and padding, in memory, and the bytes of file data among
    /// them (for progress).
    Batch(Vec<u8>, u64),
    /// `len` bytes at `offset` of a big file, then `pad` zero bytes.
    Slice {
        path: &'a Path,
        size: u64,
        sha256: &'a str,
        offset: u64,
        len: u64,
        pad: u64,
    },
}

/// Cuts the layer into frame jobs, in output order, handing each to `emit`.
fn plan<'a>(
    layer: &'a Layer,
    framing: Framing,
    mut emit: impl FnMut(Job<'a>) -> bool,
) -> Result<(), BakeError> {
    let io = |e| BakeError::Io {
        path: layer.base_name().into(),
        source: e,
    };
    let mut tar = tar::Builder::new(Vec::new());
    // File data in the batch so far.
    let mut batch_data = 0u64;
    // Hands the batch so far to `emit`; false when the writer has stopped.
    fn flush<'a>(
        tar: &mut tar::Builder<Vec<u8>>,
        data: &mut u64,
        emit: &mut impl FnMut(Job<'a>) -> bool,
    ) -> bool {
        let bytes = std::mem::take(tar.get_mut());
        bytes.is_empty() || emit(Job::Batch(bytes, std::mem::take(data)))
    }
    for (path, e) in &layer.entries {
        match &e.node {
            Node::Dir => {
                let mut h = header(layer, 0o755, tar::EntryType::Directory, 0);
                tar.append_data(&mut h, format!("{path}/"), std::io::empty())
                    .map_err(io)?;
            }
            Node::Symlink(target) => {
                let mut h = header(layer, 0o777, tar::EntryType::Symlink, 0);
                tar.append_link(&mut h, path, target).map_err(io)?;
            }
            Node::File {
                data: Data::File(file),
                mode,
                size,
                sha256,
                ..
            } if *size >= framing.big => {
                // The header (tar writes no data or padding for an empty reader) closes the
                // batch; the data follows in frames of its own.
                let mut h = header(layer, *mode, tar::EntryType::Regular, *size);
                tar.append_data(&mut h, path, std::io::empty())
                    .map_err(io)?;
                if !flush(&mut tar, &mut batch_data, &mut emit) {
                    return Ok(());
                }
                let mut offset = 0;
                while offset < *size {
                    let len = framing.chunk.min(size - offset);
                    let last = offset + len == *size;
                    let pad = if last { (512 - size % 512) % 512 } else { 0 };
                    let job = Job::Slice {
                        path: file,
                        size: *size,
                        sha256,
                        offset,
                        len,
                        pad,
                    };
                    if !emit(job) {
                        return Ok(());
                    }
                    offset += len;
                }
            }
            Node::File {
                data, mode, size, ..
            } => {
                let mut bytes = Vec::with_capacity(*size as usize);
                data.open()?
                    .take(*size + 1)
                    .read_to_end(&mut bytes)
                    .map_err(|e| data_err(data, e))?;
                if bytes.len() as u64 != *size {
                    return Err(short(data, *size, bytes.len() as u64));
                }
                let mut h = header(layer, *mode, tar::EntryType::Regular, *size);
                tar.append_data(&mut h, path, &bytes[..]).map_err(io)?;
                batch_data += size;
            }
        }
        if tar.get_ref().len() as u64 >= framing.chunk
            && !flush(&mut tar, &mut batch_data, &mut emit)
        {
            return Ok(());
        }
    }
    let end = tar.into_inner().map_err(io)?;
    emit(Job::Batch(end, batch_data));
    Ok(())
}

fn data_err(data: &Data, e: std::io::Error) -> BakeError {
    match data {
        Data::File(p) => io_err(p)(e),
        Data::Inline(_) => BakeError::Io {
            path: "(rendered file)".into(),
            source: e,
        },
    }
}

/// A layer file whose length changed since it was hashed.
fn short(data: &Data, want: u64, got: u64) -> BakeError {
    data_err(
        data,
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("expected {want} bytes (as hashed for the layer), found {got}: the file changed during the bake"),
        ),
    )
}

/// Compresses one job into one frame, through the cache for big-file chunks.
fn run(
    job: Job<'_>,
    zc: &mut zstd::bulk::Compressor<'static>,
    codec: &Codec,
    cache: Option<&ChunkCache>,
) -> Result<Vec<u8>, BakeError> {
    match job {
        Job::Batch(bytes, _) => zc
            .compress(&bytes)
            .map_err(|e| io_err(Path::new("(zstd frame)"))(e)),
        Job::Slice {
            path,
            size,
            sha256,
            offset,
            len,
            pad,
        } => {
            let mut make = || -> Result<Vec<u8>, BakeError> {
                let mut buf = vec![0u8; (len + pad) as usize];
                let f = std::fs::File::open(path).map_err(io_err(path))?;
                f.read_exact_at(&mut buf[..len as usize], offset)
                    .map_err(|e| match e.kind() {
                        std::io::ErrorKind::UnexpectedEof => {
                            let found = f.metadata().map(|m| m.len()).unwrap_or(0);
                            short(&Data::File(path.to_path_buf()), size, found)
                        }
                        _ => io_err(path)(e),
                    })?;
                zc.compress(&buf).map_err(io_err(path))
            };
            match cache {
                Some(c) => {
                    let source = Source::Slice {
                        file_sha256: sha256,
                        offset,
                        len,
                        pad,
                    };
                    c.get_or_insert_with(&ChunkKey::new(codec, &source), make)
                }
                None => make(),
            }
        }
    }
}

/// How many frames of its own [`write()`] gives a file of `size` bytes from disk: the pieces
/// [`precompress`] can make before the layer is complete (0 for a file batched with others).
pub fn pieces(framing: Framing, size: u64) -> u64 {
    if size >= framing.big {
        size.div_ceil(framing.chunk)
    } else {
        0
    }
}

/// Compresses frame `piece` of the big file at `path` (`size` bytes, content `sha256`) into
/// `cache` under the key [`write()`] looks up, so that the write copies it instead of
/// compressing it: the same job, key and bytes as the write's own (`run`). Nothing is done
/// when the cache holds the entry already.
pub fn precompress(
    framing: Framing,
    path: &Path,
    size: u64,
    sha256: &str,
    piece: u64,
    cache: &ChunkCache,
) -> Result<(), BakeError> {
    let offset = piece * framing.chunk;
    if piece >= pieces(framing, size) {
        return Ok(());
    }
    let len = framing.chunk.min(size - offset);
    let pad = if offset + len == size {
        (512 - size % 512) % 512
    } else {
        0
    };
    let codec = Codec::zstd(ZSTD_LEVEL, framing.chunk, FRAME_FORMAT);
    let source = Source::Slice {
        file_sha256: sha256,
        offset,
        len,
        pad,
    };
    if cache.contains(&ChunkKey::new(&codec, &source)) {
        return Ok(());
    }
    let mut zc = compressor().map_err(io_err(Path::new("zstd")))?;
    let job = Job::Slice {
        path,
        size,
        sha256,
        offset,
        len,
        pad,
    };
    run(job, &mut zc, &codec, Some(cache)).map(|_| ())
}

fn compressor() -> std::io::Result<zstd::bulk::Compressor<'static>> {
    let mut zc = zstd::bulk::Compressor::new(ZSTD_LEVEL)?;
    zc.set_parameter(zstd::zstd_safe::CParameter::ChecksumFlag(true))?;
    Ok(zc)
}

/// Writes `layer` as a `.tar.zst` at `out`, atomically (see the module docs for the frames).
pub fn write(
    layer: &Layer,
    out: &Path,
    opts: &RootfsOptions<'_>,
) -> Result<RootfsReport, BakeError> {
    write_with(layer, out, opts, &|_| {})
}

/// [`write()`], calling `on_data` with the bytes of file data in each frame once the frame is
/// in the file (in total, every file's size once).
pub fn write_with(
    layer: &Layer,
    out: &Path,
    opts: &RootfsOptions<'_>,
    on_data: &(dyn Fn(u64) + Sync),
) -> Result<RootfsReport, BakeError> {
    let threads = match opts.threads {
        0 => std::thread::available_parallelism()
            .map(|n| n.get() as u32)
            .unwrap_or(1),
        n => n,
    } as u64;
    let framing = opts.framing;
    let in_flight = (2 * threads)
        .min(IN_FLIGHT_BYTES / (framing.chunk + framing.big))
        .max(2);
    let workers = threads.min(in_flight).max(1);
    let codec = Codec::zstd(ZSTD_LEVEL, framing.chunk, FRAME_FORMAT);
    let before = opts.cache.map(|c| c.stats());

    let mut inner: Option<BakeError> = None;
    let mut report = RootfsReport {
        frames: 0,
        chunk_frames: 0,
        cache: None,
        sha256: [0; 32],
    };
    let mut digest = Sha256::new();
    crate::bake::layer::write_atomic_with(out, |f| {
        let mut w = BufWriter::with_capacity(1 << 20, f);
        // A token per frame between planning and writing bounds the frames in flight.
        let (slot_tx, slot_rx) = mpsc::sync_channel::<()>(in_flight as usize);
        let (job_tx, job_rx) = mpsc::channel::<(u64, Job<'_>)>();
        let (done_tx, done_rx) = mpsc::channel::<(u64, Result<Vec<u8>, BakeError>, u64)>();
        let job_rx = Mutex::new(job_rx);
        let result = std::thread::scope(|s| {
            let planner = s.spawn(move || {
                let mut seq = 0u64;
                let mut chunks = 0u64;
                let r = plan(layer, framing, |job| {
                    if slot_tx.send(()).is_err() {
                        return false;
                    }
                    chunks += matches!(job, Job::Slice { .. }) as u64;
                    let sent = job_tx.send((seq, job)).is_ok();
                    seq += 1;
                    sent
                });
                r.map(|_| (seq, chunks))
            });
            for _ in 0..workers {
                let (job_rx, done_tx, codec) = (&job_rx, done_tx.clone(), &codec);
                s.spawn(move || {
                    let mut zc = match compressor() {
                        Ok(zc) => zc,
                        Err(e) => {
                            let err = Err(io_err(Path::new("zstd"))(e));
                            let _ = done_tx.send((u64::MAX, err, 0));
                            return;
                        }
                    };
                    loop {
                        let next = job_rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        let Ok((seq, job)) = next else { return };
                        let data = match &job {
                            Job::Batch(_, data) => *data,
                            Job::Slice { len, .. } => *len,
                        };
                        let r = run(job, &mut zc, codec, opts.cache);
                        if done_tx.send((seq, r, data)).is_err() {
                            return;
                        }
                    }
                });
            }
            drop(done_tx);
            let written = write_in_order(&mut w, &mut digest, out, done_rx, slot_rx, on_data);
            let planned = planner.join().expect("rootfs planner panicked");
            let written = written?;
            let (frames, chunks) = planned?;
            if written != frames {
                return Err(io_err(out)(std::io::Error::other(format!(
                    "expected {frames} zstd frames, wrote {written}"
                ))));
            }
            Ok((frames, chunks))
        });
        match result {
            Ok((frames, chunks)) => {
                report.frames = frames;
                report.chunk_frames = chunks;
                w.flush()
            }
            Err(e) => {
                let msg = e.to_string();
                inner = Some(e);
                Err(std::io::Error::other(msg))
            }
        }
    })
    .map_err(|e| inner.take().unwrap_or(e))?;
    report.sha256 = digest.finalize().into();
    if let (Some(c), Some(b)) = (opts.cache, before) {
        let a = c.stats();
        report.cache = Some(Stats {
            hits: a.hits - b.hits,
            misses: a.misses - b.misses,
            corrupt: a.corrupt - b.corrupt,
            stored: a.stored - b.stored,
            hit_bytes: a.hit_bytes - b.hit_bytes,
        });
    }
    tracing::info!(
        frames = report.frames,
        chunk_frames = report.chunk_frames,
        cache = ?report.cache,
        "rootfs overlay written"
    );
    Ok(report)
}

/// Writes finished frames in sequence order, returning a slot per frame written. Returns the
/// number of frames once every worker is done, or the first error (which drops the channels
/// and so stops the planner and the workers).
fn write_in_order(
    w: &mut impl Write,
    digest: &mut Sha256,
    out: &Path,
    done: mpsc::Receiver<(u64, Result<Vec<u8>, BakeError>, u64)>,
    slots: mpsc::Receiver<()>,
    on_data: &(dyn Fn(u64) + Sync),
) -> Result<u64, BakeError> {
    let mut pending = BTreeMap::new();
    let mut next = 0u64;
    for (seq, r, data) in done {
        pending.insert(seq, (r?, data));
        while let Some((frame, data)) = pending.remove(&next) {
            w.write_all(&frame).map_err(io_err(out))?;
            digest.update(&frame);
            on_data(data);
            let _ = slots.recv();
            next += 1;
        }
    }
    Ok(next)
}

/// The rootfs format: the `.tar.zst` overlay and `SHA256SUMS` (what `kiln install` checks).
#[derive(Debug)]
pub struct Rootfs;

impl Target for Rootfs {
    fn pieces(&self, _def: &ImageDef, size: u64) -> u64 {
        pieces(FRAMING, size)
    }

    fn precompress(
        &self,
        _def: &ImageDef,
        file: &ReadyFile,
        piece: u64,
        cache: &ChunkCache,
    ) -> Result<(), BakeError> {
        precompress(FRAMING, &file.path, file.size, &file.sha256, piece, cache)
    }

    fn outputs(&self, def: &ImageDef, arch: Arch) -> Vec<String> {
        vec![
            format!("{}.tar.zst", base_name(def, arch)),
            "SHA256SUMS".into(),
        ]
    }

    fn write(&self, layer: &Layer, cx: &TargetContext<'_>) -> Result<Vec<PathBuf>, BakeError> {
        let name = format!("{}.tar.zst", layer.base_name());
        let p = cx.out_dir.join(&name);
        let cache = cx.cache.map(|p| match cx.scratch_cache {
            true => ChunkCache::scratch(p),
            false => ChunkCache::new(p),
        });
        let ro = RootfsOptions {
            threads: cx.opts.threads,
            cache: cache.as_ref(),
            framing: FRAMING,
        };
        let report = write_with(layer, &p, &ro, &|n| cx.compress.add(n))?;
        cx.compress.done();
        // SHA256SUMS is written only once the layer is on disk whole; its digest was taken
        // from the frames as they were written.
        let size = std::fs::metadata(&p).map_err(io_err(&p))?.len();
        let sum = Tracker::start(cx.progress, Phase::Checksum, size);
        sum.add(size);
        sum.finish();
        let sha = hex::encode(report.sha256);
        let (sums, sig) = publish_sums(cx.out_dir, &name, &sha, cx.opts.sign.as_ref())?;
        Ok([p, sums].into_iter().chain(sig).collect())
    }
}
