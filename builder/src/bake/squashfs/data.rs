//! The data area: every file's full blocks, compressed in parallel and written in order, and
//! the fragment blocks that pack file tails and small files together.
//!
//! One reader walks the files in order and cuts them into blocks; worker threads compress
//! the blocks; one writer puts the results into the image in the reader's order. A fixed
//! number of tokens bounds the messages between reader and writer, so memory stays at a few
//! MiB whatever the input size, and the bytes do not depend on the number of threads.
//!
//! With a cache ([`crate::bake::chunk_cache`]), a file's full blocks are cached in groups of
//! [`GROUP_BLOCKS`]: one entry holds the group's size words and stored bytes, keyed by the
//! file's sha256 and the group's offset, so a hit needs no reading of the input at all.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Cursor, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::codec::{Codec, Context};
use super::error::SquashError;
use crate::bake::chunk_cache::{self, ChunkCache, ChunkKey, Source};
use crate::bake::layer::Data;

/// Bit 24 of a data block's size word: the block is stored uncompressed.
pub const BLOCK_UNCOMPRESSED: u32 = 1 << 24;

/// Full blocks per cache entry: 2 MiB of input, so a warm bake reads a few hundred entries
/// for a node layer and at most one group per message is in memory.
pub const GROUP_BLOCKS: u64 = 16;

/// Bytes a size word says are stored for the block.
fn stored_len(word: u32) -> u64 {
    (word & !BLOCK_UNCOMPRESSED) as u64
}

/// The squashfs writer's view of the shared chunk cache.
#[derive(Debug)]
pub struct BlockCache<'c> {
    /// The cache.
    pub cache: &'c ChunkCache,
    /// Codec parameters in the cache's terms.
    pub codec: chunk_cache::Codec,
    /// Block size.
    pub block_size: u32,
}

impl BlockCache<'_> {
    pub(super) fn key(&self, sha256: &str, group: u64, blocks: u64) -> ChunkKey {
        let bs = self.block_size as u64;
        ChunkKey::new(
            &self.codec,
            &Source::Slice {
                file_sha256: sha256,
                offset: group * GROUP_BLOCKS * bs,
                len: blocks * bs,
                pad: 0,
            },
        )
    }

    /// A cached group: its size words and stored bytes, if the entry is consistent.
    fn get(&self, key: &ChunkKey, blocks: u64) -> Option<(Vec<u32>, Vec<u8>)> {
        let p = self.cache.get(key)?;
        let n = u32::from_le_bytes(p.get(..4)?.try_into().ok()?) as u64;
        let words_end = 4 + 4 * n as usize;
        if n != blocks || p.len() < words_end {
            return None;
        }
        let words: Vec<u32> = p[4..words_end]
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let sane = words
            .iter()
            .all(|&w| w >> 25 == 0 && stored_len(w) <= self.block_size as u64);
        let total: u64 = words.iter().map(|&w| stored_len(w)).sum();
        (sane && total == (p.len() - words_end) as u64).then(|| (words, p[words_end..].to_vec()))
    }
}

/// Serializes a group for the cache.
pub(super) fn group_payload(words: &[u32], data: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(4 + 4 * words.len() + data.len());
    p.extend_from_slice(&(words.len() as u32).to_le_bytes());
    for w in words {
        p.extend_from_slice(&w.to_le_bytes());
    }
    p.extend_from_slice(data);
    p
}

/// One distinct file content to store.
#[derive(Debug, Clone, Copy)]
pub struct FileSpec<'a> {
    /// Where its bytes are.
    pub data: &'a Data,
    /// Its size.
    pub size: u64,
    /// Its sha256 (lowercase hex), the cache key.
    pub sha256: &'a str,
    /// The layer path, for messages.
    pub path: &'a str,
    /// How many layer files hold this content (for progress).
    pub copies: u64,
}

/// Where a file's data ended up.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileData {
    /// Image offset of its first block.
    pub start: u64,
    /// Size word of each full block (0 = sparse).
    pub blocks: Vec<u32>,
    /// Bytes of all-zero blocks not stored.
    pub sparse: u64,
    /// Fragment block index and offset of its tail.
    pub fragment: Option<(u32, u32)>,
}

/// The whole data area.
#[derive(Debug, Clone, Default)]
pub struct DataArea {
    /// Per [`FileSpec`], in the same order.
    pub files: Vec<FileData>,
    /// Image offset and size word of each fragment block.
    pub fragments: Vec<(u64, u32)>,
    /// Image offset just past the area.
    pub end: u64,
    /// Groups of blocks that came from the cache.
    pub cache_hits: usize,
    /// Blocks compressed in this run.
    pub compressed: u64,
}

trait ReadSeek: Read + Seek + Send {}
impl<T: Read + Seek + Send> ReadSeek for T {}

fn open<'a>(spec: &FileSpec<'a>) -> Result<Box<dyn ReadSeek + 'a>, SquashError> {
    Ok(match spec.data {
        Data::Inline(b) => Box::new(Cursor::new(&b[..])),
        Data::File(p) => Box::new(File::open(p).map_err(|source| SquashError::Io {
            path: p.clone(),
            source,
        })?),
    })
}

fn src_path(spec: &FileSpec<'_>) -> PathBuf {
    match spec.data {
        Data::File(p) => p.clone(),
        Data::Inline(_) => PathBuf::from(format!("/{} (rendered)", spec.path)),
    }
}

/// Fills `buf` completely; `Ok(false)` at end of file before it is full.
fn read_full(r: &mut dyn ReadSeek, buf: &mut [u8]) -> io::Result<bool> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => return Ok(false),
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// What a compressed block turned into.
pub(super) enum Stored {
    Sparse,
    Compressed(Vec<u8>),
    Raw(Vec<u8>),
}

impl Stored {
    pub(super) fn word(&self) -> u32 {
        match self {
            Stored::Sparse => 0,
            Stored::Compressed(c) => c.len() as u32,
            Stored::Raw(r) => r.len() as u32 | BLOCK_UNCOMPRESSED,
        }
    }
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Stored::Sparse => &[],
            Stored::Compressed(b) | Stored::Raw(b) => b,
        }
    }
}

pub(super) fn store(
    codec: &Codec,
    ctx: &mut Context,
    data: Vec<u8>,
    may_be_sparse: bool,
) -> Stored {
    if may_be_sparse && data.iter().all(|&b| b == 0) {
        return Stored::Sparse;
    }
    match codec.compress(ctx, &data) {
        Some(c) => Stored::Compressed(c),
        None => Stored::Raw(data),
    }
}

enum Task {
    Block(u64, Vec<u8>),
    Fragment(u64, Vec<u8>),
}

enum Event {
    /// The next blocks are file `id`'s.
    File(usize),
    /// A group of blocks starts; with a key, the writer fills that cache entry.
    Group(Option<ChunkKey>),
    Block(Stored),
    /// The group ends.
    GroupEnd,
    /// A whole group from the cache: size words and stored bytes.
    Cached(Vec<u32>, Vec<u8>),
    Fragment(Stored),
}

/// Writes the data area of `files` at `pos` of `out`, calling `on_data` with the bytes of
/// every layer file holding a content once that content is read.
#[allow(clippy::too_many_arguments)]
pub fn write(
    files: &[FileSpec<'_>],
    codec: &Codec,
    block_size: u32,
    threads: usize,
    cache: Option<&BlockCache<'_>>,
    out: &mut BufWriter<&mut File>,
    pos: u64,
    on_data: &dyn Fn(u64),
) -> Result<DataArea, SquashError> {
    let threads = threads.max(1);
    let in_flight = 4 * threads + 4;
    let (task_tx, task_rx) = sync_channel::<Task>(in_flight);
    let task_rx = Mutex::new(task_rx);
    let (ev_tx, ev_rx) = channel::<(u64, Event)>();
    let (tok_tx, tok_rx) = sync_channel::<()>(in_flight);
    for _ in 0..in_flight {
        let _ = tok_tx.send(());
    }
    // Cache entries are stored (fsync and rename) off the writer's path.
    let (put_tx, put_rx) = sync_channel::<(ChunkKey, Vec<u8>)>(4);
    let result = std::thread::scope(|s| {
        for _ in 0..threads {
            let ev_tx = ev_tx.clone();
            let task_rx = &task_rx;
            s.spawn(move || {
                let mut ctx = codec.context();
                loop {
                    let task = match task_rx.lock() {
                        Ok(rx) => rx.recv(),
                        Err(_) => return,
                    };
                    let (seq, ev) = match task {
                        Ok(Task::Block(seq, d)) => {
                            (seq, Event::Block(store(codec, &mut ctx, d, true)))
                        }
                        Ok(Task::Fragment(seq, d)) => {
                            (seq, Event::Fragment(store(codec, &mut ctx, d, false)))
                        }
                        Err(_) => return,
                    };
                    if ev_tx.send((seq, ev)).is_err() {
                        return;
                    }
                }
            });
        }
        if let Some(c) = cache {
            s.spawn(move || {
                for (key, payload) in put_rx {
                    if let Err(e) = c.cache.put(&key, &payload) {
                        tracing::warn!("{e}; continuing without caching these blocks");
                    }
                }
            });
        } else {
            drop(put_rx);
        }
        let writer = s.spawn(move || {
            let mut w = Writer {
                out,
                pos,
                area: DataArea {
                    files: vec![FileData::default(); files.len()],
                    ..DataArea::default()
                },
                cur: 0,
                fill: None,
                put_tx,
                block_size,
            };
            w.run(ev_rx, tok_tx).map(|_| w.area)
        });
        let read = read_all(files, block_size, cache, &task_tx, &ev_tx, &tok_rx, on_data);
        drop(task_tx);
        drop(ev_tx);
        let written = writer.join().expect("squashfs writer thread panicked");
        (read, written)
    });
    let (read, written) = result;
    let tails = match read {
        Ok(t) => t,
        Err((e, bad)) => {
            // Entries filled from a file that turned out not to match its sha256 must not
            // outlive this bake.
            if let (Some(c), Some(id)) = (cache, bad) {
                let f = &files[id];
                let full = f.size / block_size as u64;
                for g in 0..full.div_ceil(GROUP_BLOCKS) {
                    let n = (full - g * GROUP_BLOCKS).min(GROUP_BLOCKS);
                    let _ = std::fs::remove_file(c.cache.entry_path(&c.key(f.sha256, g, n)));
                }
            }
            return Err(e);
        }
    };
    let mut area = written?;
    for (id, f) in tails.into_iter().enumerate() {
        area.files[id].fragment = f;
    }
    Ok(area)
}

type ReadError = (SquashError, Option<usize>);

/// The reader: cuts files into tasks and events, in image order. Returns each file's fragment
/// position (an empty list when the writer stopped early: its error is the one to report).
/// On error, also the file whose content was not what the layer says.
fn read_all(
    files: &[FileSpec<'_>],
    block_size: u32,
    cache: Option<&BlockCache<'_>>,
    task_tx: &std::sync::mpsc::SyncSender<Task>,
    ev_tx: &Sender<(u64, Event)>,
    tok_rx: &Receiver<()>,
    on_data: &dyn Fn(u64),
) -> Result<Vec<Option<(u32, u32)>>, ReadError> {
    let bs = block_size as u64;
    let mut seq = 0u64;
    let mut frag = Vec::with_capacity(block_size as usize);
    let mut frag_count = 0u32;
    let mut tails = vec![None; files.len()];
    // Every message takes a token (the writer gives it back once the message is in the
    // image); a closed channel means the writer failed.
    macro_rules! send {
        ($tx:expr, $msg:expr) => {{
            if tok_rx.recv().is_err() || $tx.send($msg).is_err() {
                return Ok(Vec::new());
            }
            seq += 1;
        }};
    }
    for (id, f) in files.iter().enumerate() {
        let full = f.size / bs;
        let tail = (f.size % bs) as usize;
        let mut r = open(f).map_err(|e| (e, None))?;
        let io = |source| {
            (
                SquashError::Io {
                    path: src_path(f),
                    source,
                },
                None,
            )
        };
        let changed = |detail: String| {
            (
                SquashError::Changed {
                    path: f.path.to_string(),
                    file: src_path(f),
                    detail,
                },
                Some(id),
            )
        };
        // What the cache holds for this file, group by group, looked up before reading.
        let groups = full.div_ceil(GROUP_BLOCKS);
        let mut cached = Vec::with_capacity(groups as usize);
        for g in 0..groups {
            let n = (full - g * GROUP_BLOCKS).min(GROUP_BLOCKS);
            cached.push(cache.map(|c| {
                let key = c.key(f.sha256, g, n);
                (c.get(&key, n), key)
            }));
        }
        // Anything this bake puts in the cache is keyed by the sha256, so when it fills an
        // entry it reads (and hashes) the whole file to check it.
        let fills = cached.iter().any(|c| matches!(c, Some((None, _))));
        let mut hasher = fills.then(Sha256::new);
        if full > 0 {
            send!(ev_tx, (seq, Event::File(id)));
        }
        let mut buf = vec![0u8; block_size as usize];
        for (g, entry) in cached.into_iter().enumerate() {
            let n = (full - g as u64 * GROUP_BLOCKS).min(GROUP_BLOCKS);
            match entry {
                Some((Some((words, data)), _)) => {
                    if let Some(h) = hasher.as_mut() {
                        for _ in 0..n {
                            if !read_full(&mut *r, &mut buf).map_err(io)? {
                                return Err(changed(format!(
                                    "expected {} bytes, found fewer",
                                    f.size
                                )));
                            }
                            h.update(&buf);
                        }
                    }
                    send!(ev_tx, (seq, Event::Cached(words, data)));
                }
                other => {
                    let key = other.map(|(_, k)| k);
                    send!(ev_tx, (seq, Event::Group(key)));
                    for _ in 0..n {
                        let mut b = vec![0u8; block_size as usize];
                        if !read_full(&mut *r, &mut b).map_err(io)? {
                            return Err(changed(format!("expected {} bytes, found fewer", f.size)));
                        }
                        if let Some(h) = hasher.as_mut() {
                            h.update(&b);
                        }
                        send!(task_tx, Task::Block(seq, b));
                    }
                    send!(ev_tx, (seq, Event::GroupEnd));
                }
            }
        }
        if hasher.is_none() && full > 0 {
            r.seek(SeekFrom::Start(full * bs)).map_err(io)?;
        }
        let mut tail_buf = vec![0u8; tail];
        if !read_full(&mut *r, &mut tail_buf).map_err(io)? {
            return Err(changed(format!("expected {} bytes, found fewer", f.size)));
        }
        let mut extra = [0u8; 1];
        if read_full(&mut *r, &mut extra).map_err(io)? {
            return Err(changed(format!("expected {} bytes, found more", f.size)));
        }
        if let Some(mut h) = hasher {
            h.update(&tail_buf);
            let got = hex::encode(h.finalize());
            if got != f.sha256 {
                return Err(changed(format!(
                    "expected sha256 {}, found {got}",
                    f.sha256
                )));
            }
        }
        if tail > 0 {
            if frag.len() + tail > block_size as usize {
                let full = std::mem::replace(&mut frag, Vec::with_capacity(block_size as usize));
                send!(task_tx, Task::Fragment(seq, full));
                frag_count += 1;
            }
            tails[id] = Some((frag_count, frag.len() as u32));
            frag.extend_from_slice(&tail_buf);
        }
        on_data(f.size * f.copies);
    }
    if !frag.is_empty() {
        send!(task_tx, Task::Fragment(seq, frag));
    }
    let _ = seq;
    Ok(tails)
}

/// The writer's state.
struct Writer<'o, 'f> {
    out: &'o mut BufWriter<&'f mut File>,
    pos: u64,
    area: DataArea,
    cur: usize,
    /// The cache entry being filled: key, size words, stored bytes.
    fill: Option<(ChunkKey, Vec<u32>, Vec<u8>)>,
    put_tx: std::sync::mpsc::SyncSender<(ChunkKey, Vec<u8>)>,
    block_size: u32,
}

impl Writer<'_, '_> {
    fn run(
        &mut self,
        ev_rx: Receiver<(u64, Event)>,
        tok_tx: std::sync::mpsc::SyncSender<()>,
    ) -> Result<(), SquashError> {
        let mut pending = BTreeMap::new();
        let mut next = 0u64;
        for (seq, ev) in ev_rx {
            pending.insert(seq, ev);
            while let Some(ev) = pending.remove(&next) {
                self.event(ev)?;
                next += 1;
                let _ = tok_tx.send(());
            }
        }
        self.area.end = self.pos;
        Ok(())
    }

    fn put(&mut self, bytes: &[u8]) -> Result<(), SquashError> {
        self.out
            .write_all(bytes)
            .map_err(|source| SquashError::Io {
                path: PathBuf::from("(the image being written)"),
                source,
            })?;
        self.pos += bytes.len() as u64;
        Ok(())
    }

    fn words(&mut self, words: &[u32]) {
        let d = &mut self.area.files[self.cur];
        for &w in words {
            d.blocks.push(w);
            if w == 0 {
                d.sparse += self.block_size as u64;
            }
        }
    }

    fn event(&mut self, ev: Event) -> Result<(), SquashError> {
        match ev {
            Event::File(id) => {
                self.cur = id;
                self.area.files[id].start = self.pos;
            }
            Event::Group(key) => {
                self.fill = key.map(|k| (k, Vec::new(), Vec::new()));
            }
            Event::Block(s) => {
                self.put(s.bytes())?;
                self.words(&[s.word()]);
                self.area.compressed += 1;
                if let Some((_, words, data)) = self.fill.as_mut() {
                    words.push(s.word());
                    data.extend_from_slice(s.bytes());
                }
            }
            Event::GroupEnd => {
                if let Some((key, words, data)) = self.fill.take() {
                    // A failed store only costs a later bake a recompression.
                    let _ = self.put_tx.send((key, group_payload(&words, &data)));
                }
            }
            Event::Cached(words, data) => {
                self.put(&data)?;
                self.words(&words);
                self.area.cache_hits += 1;
            }
            Event::Fragment(s) => {
                self.area.fragments.push((self.pos, s.word()));
                self.area.compressed += 1;
                self.put(s.bytes())?;
            }
        }
        Ok(())
    }
}
