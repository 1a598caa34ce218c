//! The data area: every file's full blocks, compressed in parallel and written in order, and
//! the fragment blocks that pack file tails and small files together.
//!
//! One reader walks the files in order and cuts them into blocks; worker threads compress
//! the blocks; one writer puts the results into the image in the reader's order. A fixed
//! number of tokens bounds the blocks between reader and writer, so memory stays at a few
//! MiB whatever the input size, and the bytes do not depend on the number of threads.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Cursor, Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::mpsc::{channel, sync_channel, Receiver, Sender};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::cache::{BlockCache, Filler, Hit, BLOCK_UNCOMPRESSED};
use super::codec::{Codec, Context};
use super::SquashError;
use crate::bake::Data;

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
    /// Files whose blocks came from the cache.
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
enum Stored {
    Sparse,
    Compressed(Vec<u8>),
    Raw(Vec<u8>),
}

impl Stored {
    fn word(&self) -> u32 {
        match self {
            Stored::Sparse => 0,
            Stored::Compressed(c) => c.len() as u32,
            Stored::Raw(r) => r.len() as u32 | BLOCK_UNCOMPRESSED,
        }
    }
    fn bytes(&self) -> &[u8] {
        match self {
            Stored::Sparse => &[],
            Stored::Compressed(b) | Stored::Raw(b) => b,
        }
    }
}

fn store(codec: &Codec, ctx: &mut Context, data: Vec<u8>, may_be_sparse: bool) -> Stored {
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
    Begin { id: usize, fill: bool },
    Block(Stored),
    End,
    Cached { id: usize, hit: Hit },
    Fragment(Stored),
}

/// Writes the data area of `files` at `pos` of `out`.
pub fn write(
    files: &[FileSpec<'_>],
    codec: &Codec,
    block_size: u32,
    threads: usize,
    cache: Option<&BlockCache>,
    out: &mut BufWriter<&mut File>,
    pos: u64,
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
    std::thread::scope(|s| {
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
        let writer = s.spawn(move || {
            let mut w = Writer {
                files,
                codec,
                block_size,
                cache,
                out,
                pos,
                area: DataArea {
                    files: vec![FileData::default(); files.len()],
                    ..DataArea::default()
                },
                cur: None,
                fill: None,
            };
            w.run(ev_rx, tok_tx).map(|_| w.area)
        });
        let read = read_all(files, block_size, cache, &task_tx, &ev_tx, &tok_rx);
        drop(task_tx);
        drop(ev_tx);
        let written = writer.join().expect("squashfs writer thread panicked");
        // A reader error explains a short write better than the writer's view of it.
        let frag_pos = read?;
        let mut area = written?;
        for (id, f) in frag_pos.into_iter().enumerate() {
            area.files[id].fragment = f;
        }
        Ok(area)
    })
}

/// The reader: cuts files into tasks and events, in image order. Returns each file's fragment
/// position (an empty list when the writer stopped early: its error is the one to report).
fn read_all(
    files: &[FileSpec<'_>],
    block_size: u32,
    cache: Option<&BlockCache>,
    task_tx: &std::sync::mpsc::SyncSender<Task>,
    ev_tx: &Sender<(u64, Event)>,
    tok_rx: &Receiver<()>,
) -> Result<Vec<Option<(u32, u32)>>, SquashError> {
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
        let blocks = f.size / bs;
        let tail = (f.size % bs) as usize;
        let mut r = open(f)?;
        let io = |source| SquashError::Io {
            path: src_path(f),
            source,
        };
        let hit = match cache {
            Some(c) if blocks > 0 => c.lookup(f.sha256, f.size),
            _ => None,
        };
        let mut tail_buf = vec![0u8; tail];
        // A cache entry is keyed by the sha256, so what fills it is hashed on the way.
        let mut hasher = None;
        let mut short = false;
        let missed = hit.is_none() && blocks > 0;
        if let Some(hit) = hit {
            send!(ev_tx, (seq, Event::Cached { id, hit }));
            r.seek(SeekFrom::Start(blocks * bs)).map_err(io)?;
        } else if blocks > 0 {
            let fill = cache.is_some();
            if fill {
                hasher = Some(Sha256::new());
            }
            send!(ev_tx, (seq, Event::Begin { id, fill }));
            for _ in 0..blocks {
                let mut b = vec![0u8; block_size as usize];
                if !read_full(&mut *r, &mut b).map_err(io)? {
                    short = true;
                    break;
                }
                if let Some(h) = hasher.as_mut() {
                    h.update(&b);
                }
                send!(task_tx, Task::Block(seq, b));
            }
        }
        if !short && !read_full(&mut *r, &mut tail_buf).map_err(io)? {
            short = true;
        }
        let mut extra = [0u8; 1];
        if short || read_full(&mut *r, &mut extra).map_err(io)? {
            return Err(SquashError::Changed {
                path: f.path.to_string(),
                file: src_path(f),
                detail: format!(
                    "expected {} bytes, found {}",
                    f.size,
                    if short { "fewer" } else { "more" }
                ),
            });
        }
        if let Some(mut h) = hasher {
            h.update(&tail_buf);
            let got = hex::encode(h.finalize());
            if got != f.sha256 {
                return Err(SquashError::Changed {
                    path: f.path.to_string(),
                    file: src_path(f),
                    detail: format!("expected sha256 {}, found {got}", f.sha256),
                });
            }
        }
        if missed {
            send!(ev_tx, (seq, Event::End));
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
    }
    if !frag.is_empty() {
        send!(task_tx, Task::Fragment(seq, frag));
    }
    let _ = seq;
    Ok(tails)
}

/// The writer's state.
struct Writer<'a, 'o, 'f> {
    files: &'a [FileSpec<'a>],
    codec: &'a Codec,
    block_size: u32,
    cache: Option<&'a BlockCache>,
    out: &'o mut BufWriter<&'f mut File>,
    pos: u64,
    area: DataArea,
    cur: Option<usize>,
    fill: Option<Filler>,
}

impl Writer<'_, '_, '_> {
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
        if !pending.is_empty() {
            // Only a reader failure leaves a gap; the reader reports it.
            return Ok(());
        }
        self.area.end = self.pos;
        Ok(())
    }

    fn io(&self) -> impl Fn(io::Error) -> SquashError {
        |source| SquashError::Io {
            path: PathBuf::from("(the image being written)"),
            source,
        }
    }

    fn put(&mut self, s: &Stored) -> Result<(), SquashError> {
        self.out.write_all(s.bytes()).map_err(self.io())?;
        self.pos += s.bytes().len() as u64;
        Ok(())
    }

    fn event(&mut self, ev: Event) -> Result<(), SquashError> {
        match ev {
            Event::Begin { id, fill } => {
                self.area.files[id].start = self.pos;
                self.cur = Some(id);
                let f = &self.files[id];
                self.fill = if fill {
                    self.cache.and_then(|c| c.filler(f.sha256, f.size))
                } else {
                    None
                };
            }
            Event::Block(s) => {
                let id = self.cur.expect("a block outside a file");
                self.put(&s)?;
                self.block_done(id, &s);
            }
            Event::End => {
                if let Some(fill) = self.fill.take() {
                    fill.publish();
                }
                self.cur = None;
            }
            Event::Fragment(s) => {
                self.area.fragments.push((self.pos, s.word()));
                self.area.compressed += 1;
                self.put(&s)?;
            }
            Event::Cached { id, hit } => {
                let start = self.pos;
                self.area.files[id].start = start;
                if hit.copy_into(&mut *self.out).map_err(self.io())? {
                    self.pos += hit.data_len();
                    let d = &mut self.area.files[id];
                    d.sparse = hit.sizes.iter().filter(|&&w| w == 0).count() as u64
                        * self.block_size as u64;
                    d.blocks = hit.sizes.clone();
                    self.area.cache_hits += 1;
                } else {
                    // A torn or corrupt entry: take back what was copied and compress the
                    // file here instead.
                    hit.discard();
                    self.out.seek(SeekFrom::Start(start)).map_err(self.io())?;
                    self.out.get_ref().set_len(start).map_err(self.io())?;
                    self.pos = start;
                    self.compress_here(id)?;
                }
            }
        }
        Ok(())
    }

    fn block_done(&mut self, id: usize, s: &Stored) {
        let d = &mut self.area.files[id];
        d.blocks.push(s.word());
        if matches!(s, Stored::Sparse) {
            d.sparse += self.block_size as u64;
        }
        self.area.compressed += 1;
        if let Some(fill) = self.fill.as_mut() {
            fill.push(s.word(), s.bytes());
        }
    }

    /// Compresses one file's full blocks on this thread (the rare path after a bad entry).
    fn compress_here(&mut self, id: usize) -> Result<(), SquashError> {
        let f = self.files[id];
        let mut r = open(&f)?;
        let mut ctx = self.codec.context();
        self.fill = self.cache.and_then(|c| c.filler(f.sha256, f.size));
        let mut h = Sha256::new();
        for _ in 0..f.size / self.block_size as u64 {
            let mut b = vec![0u8; self.block_size as usize];
            let full = read_full(&mut *r, &mut b).map_err(|source| SquashError::Io {
                path: src_path(&f),
                source,
            })?;
            if !full {
                return Err(SquashError::Changed {
                    path: f.path.to_string(),
                    file: src_path(&f),
                    detail: format!("expected {} bytes, found fewer", f.size),
                });
            }
            h.update(&b);
            let s = store(self.codec, &mut ctx, b, true);
            self.put(&s)?;
            self.block_done(id, &s);
        }
        let mut tail = Vec::new();
        r.read_to_end(&mut tail).map_err(|source| SquashError::Io {
            path: src_path(&f),
            source,
        })?;
        h.update(&tail);
        let fill = self.fill.take();
        if hex::encode(h.finalize()) == f.sha256 {
            if let Some(fill) = fill {
                fill.publish();
            }
        }
        Ok(())
    }
}
