//! kiln's own squashfs 4.0 writer, which packs the Flatcar sysext: reproducible by
//! construction (one owner, one time, sorted entries, bytes independent of the thread count),
//! parallel and memory-bounded, with a cache of compressed blocks keyed by file content.
//!
//! What it writes: a superblock; zstd (id 6) or zlib (id 1) data blocks of 128 KiB (stored
//! as is when compression does not shrink them, not at all when all zero), fragment blocks
//! packing file tails and small files; basic inodes, extended ones when a field needs more
//! bits (file start beyond 4 GiB, sparse blocks, directories with an index or a listing over
//! 64 KiB); symlinks; directory listings in headers of at most 256 entries sharing one
//! inode metadata block; the fragment and id tables with their index arrays. Files with the
//! same content share their blocks. No xattrs, no export table, no hard links, no device
//! nodes: a sysext needs none. Single files of 4 GiB or more are refused.
//! docs/bake.md describes the format choices and the cache.

mod ahead;
mod codec;
mod data;
pub mod error;
mod meta;

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use crate::atomic_file::AtomicFile;
use crate::bake::layer::Node;
pub use ahead::{forget, pieces, precompress};
pub use codec::{Codec, BLOCK_SIZE, GZIP_DEFAULT_LEVEL, ZSTD_DEFAULT_LEVEL};
use error::image_io;
pub use error::SquashError;
use meta::{MetaWriter, METADATA_SIZE};

const BLOCK_LOG: u16 = 17;
const MAGIC: u32 = 0x7371_7368;
const SUPERBLOCK_LEN: u64 = 96;
const NONE64: u64 = u64::MAX;
const NONE32: u32 = u32::MAX;

const FLAG_DUPLICATES: u16 = 0x0040;
const FLAG_NO_XATTRS: u16 = 0x0200;
const FLAG_COMP_OPT: u16 = 0x0400;

const T_DIR: u16 = 1;
const T_FILE: u16 = 2;
const T_SYMLINK: u16 = 3;
const T_LDIR: u16 = 8;
const T_LFILE: u16 = 9;

/// How to write an image.
#[derive(Debug, Clone)]
pub struct Options {
    /// The compressor.
    pub codec: Codec,
    /// Compression threads (0 = all cores). Never changes the bytes.
    pub threads: usize,
    /// The bake cache directory, for compressed blocks; `None` compresses everything.
    pub cache: Option<PathBuf>,
    /// `cache` is the bake's scratch chunk cache ([`ChunkCache::scratch`]), not one that
    /// outlives it.
    ///
    /// [`ChunkCache::scratch`]: crate::bake::chunk_cache::ChunkCache::scratch
    pub scratch_cache: bool,
}

/// Facts about a written image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// Inodes.
    pub inodes: u32,
    /// Fragment blocks.
    pub fragments: u32,
    /// Bytes of the filesystem (the file is padded to 4 KiB past this).
    pub bytes_used: u64,
    /// Groups of blocks copied from the cache.
    pub cache_hits: usize,
    /// Blocks compressed by this run.
    pub compressed_blocks: u64,
}

enum Kind {
    Dir,
    File {
        mode: u16,
        content: usize,
        size: u64,
    },
    Symlink(Vec<u8>),
}

struct TNode {
    name: Vec<u8>,
    kind: Kind,
    children: Vec<usize>,
    ino: u32,
    parent_ino: u32,
}

/// The layer as a tree, with numbered inodes and distinct file contents.
struct Tree<'a> {
    nodes: Vec<TNode>,
    contents: Vec<data::FileSpec<'a>>,
}

impl<'a> Tree<'a> {
    fn build(
        entries: impl IntoIterator<Item = (&'a str, &'a Node)>,
    ) -> Result<Tree<'a>, SquashError> {
        let mut t = Tree {
            nodes: vec![TNode {
                name: Vec::new(),
                kind: Kind::Dir,
                children: Vec::new(),
                ino: 0,
                parent_ino: 0,
            }],
            contents: Vec::new(),
        };
        let mut by_path: HashMap<&'a str, usize> = HashMap::new();
        let mut by_content: HashMap<(&'a str, u64), usize> = HashMap::new();
        for (path, node) in entries {
            let bad = |what: String| SquashError::Unsupported {
                path: path.to_string(),
                what,
            };
            let (parent, name) = match path.rsplit_once('/') {
                Some((p, n)) => (
                    *by_path.get(p).ok_or_else(|| {
                        bad(format!(
                            "its parent /{p} is not a directory listed before it"
                        ))
                    })?,
                    n,
                ),
                None => (0, path),
            };
            if name.is_empty() || name == "." || name == ".." || name.contains('\0') {
                return Err(bad("not a valid file name".into()));
            }
            if name.len() > 256 {
                return Err(bad(format!(
                    "a name of at most 256 bytes, found {}",
                    name.len()
                )));
            }
            if !matches!(t.nodes[parent].kind, Kind::Dir) {
                return Err(bad("its parent is not a directory".into()));
            }
            let kind = match node {
                Node::Dir => Kind::Dir,
                Node::Symlink(target) => {
                    if target.is_empty() {
                        return Err(bad("a symlink with an empty target".into()));
                    }
                    Kind::Symlink(target.as_bytes().to_vec())
                }
                Node::File {
                    data,
                    mode,
                    size,
                    sha256,
                    ..
                } => {
                    if *size > u32::MAX as u64 {
                        return Err(bad(format!(
                            "files under 4 GiB, found {size} bytes (not supported by kiln's squashfs writer)"
                        )));
                    }
                    let content =
                        *by_content
                            .entry((sha256.as_str(), *size))
                            .or_insert_with(|| {
                                t.contents.push(data::FileSpec {
                                    data,
                                    size: *size,
                                    sha256,
                                    path,
                                    copies: 0,
                                });
                                t.contents.len() - 1
                            });
                    t.contents[content].copies += 1;
                    Kind::File {
                        mode: (*mode & 0o7777) as u16,
                        content,
                        size: *size,
                    }
                }
            };
            let id = t.nodes.len();
            t.nodes.push(TNode {
                name: name.as_bytes().to_vec(),
                kind,
                children: Vec::new(),
                ino: 0,
                parent_ino: 0,
            });
            t.nodes[parent].children.push(id);
            if matches!(node, Node::Dir) && by_path.insert(path, id).is_some() {
                return Err(bad("listed twice".into()));
            }
        }
        // Directory entries are looked up by binary order of their names.
        let names: Vec<Vec<u8>> = t.nodes.iter().map(|n| n.name.clone()).collect();
        for n in &mut t.nodes {
            n.children.sort_by(|a, b| names[*a].cmp(&names[*b]));
            if n.children.windows(2).any(|w| names[w[0]] == names[w[1]]) {
                return Err(SquashError::Unsupported {
                    path: String::from_utf8_lossy(&n.name).into_owned(),
                    what: "two entries with the same name".into(),
                });
            }
        }
        let mut next = 1u32;
        t.number(0, &mut next);
        let count = next - 1;
        t.nodes[0].parent_ino = count + 1;
        Ok(t)
    }

    /// Numbers inodes children first, so a directory follows its whole subtree and the root
    /// is last (what a post-order write of the inode table needs).
    fn number(&mut self, n: usize, next: &mut u32) {
        let children = self.nodes[n].children.clone();
        for &c in &children {
            if matches!(self.nodes[c].kind, Kind::Dir) {
                self.number(c, next);
            } else {
                self.nodes[c].ino = *next;
                *next += 1;
            }
        }
        self.nodes[n].ino = *next;
        *next += 1;
        for &c in &children {
            if matches!(self.nodes[c].kind, Kind::Dir) {
                self.nodes[c].parent_ino = self.nodes[n].ino;
            }
        }
    }
}

/// Writes the inode and directory tables, children before parents.
struct Tables<'c, 'd> {
    inodes: MetaWriter<'c>,
    dirs: MetaWriter<'c>,
    area: &'d data::DataArea,
    mtime: u32,
}

struct DirEnt<'n> {
    name: &'n [u8],
    reference: u64,
    ino: u32,
    kind: u16,
}

fn base(buf: &mut Vec<u8>, kind: u16, mode: u16, mtime: u32, ino: u32) {
    buf.extend_from_slice(&kind.to_le_bytes());
    buf.extend_from_slice(&mode.to_le_bytes());
    buf.extend_from_slice(&0u16.to_le_bytes()); // uid: id table entry 0 (root)
    buf.extend_from_slice(&0u16.to_le_bytes()); // gid: the same
    buf.extend_from_slice(&mtime.to_le_bytes());
    buf.extend_from_slice(&ino.to_le_bytes());
}

impl Tables<'_, '_> {
    fn emit(&mut self, tree: &Tree<'_>, n: usize) -> Result<u64, SquashError> {
        let node = &tree.nodes[n];
        let at = self.inodes.pos();
        let mut b = Vec::with_capacity(64);
        match &node.kind {
            Kind::Symlink(target) => {
                base(&mut b, T_SYMLINK, 0o777, self.mtime, node.ino);
                b.extend_from_slice(&1u32.to_le_bytes());
                b.extend_from_slice(&(target.len() as u32).to_le_bytes());
                b.extend_from_slice(target);
            }
            Kind::File {
                mode,
                content,
                size,
            } => {
                let d = &self.area.files[*content];
                let (frag, off) = d.fragment.unwrap_or((NONE32, 0));
                if d.start > u32::MAX as u64 || d.sparse > 0 {
                    base(&mut b, T_LFILE, *mode, self.mtime, node.ino);
                    b.extend_from_slice(&d.start.to_le_bytes());
                    b.extend_from_slice(&size.to_le_bytes());
                    b.extend_from_slice(&d.sparse.to_le_bytes());
                    b.extend_from_slice(&1u32.to_le_bytes()); // nlink
                    b.extend_from_slice(&frag.to_le_bytes());
                    b.extend_from_slice(&off.to_le_bytes());
                    b.extend_from_slice(&NONE32.to_le_bytes()); // no xattrs
                } else {
                    base(&mut b, T_FILE, *mode, self.mtime, node.ino);
                    b.extend_from_slice(&(d.start as u32).to_le_bytes());
                    b.extend_from_slice(&frag.to_le_bytes());
                    b.extend_from_slice(&off.to_le_bytes());
                    b.extend_from_slice(&(*size as u32).to_le_bytes());
                }
                for w in &d.blocks {
                    b.extend_from_slice(&w.to_le_bytes());
                }
            }
            Kind::Dir => return self.emit_dir(tree, n),
        }
        let r = self.inodes.reference(at);
        self.inodes.push(&b);
        Ok(r)
    }

    fn emit_dir(&mut self, tree: &Tree<'_>, n: usize) -> Result<u64, SquashError> {
        let node = &tree.nodes[n];
        let mut ents = Vec::with_capacity(node.children.len());
        let mut subdirs = 0u32;
        for &c in &node.children {
            let child = &tree.nodes[c];
            let kind = match child.kind {
                Kind::Dir => {
                    subdirs += 1;
                    T_DIR
                }
                Kind::File { .. } => T_FILE,
                Kind::Symlink(_) => T_SYMLINK,
            };
            let reference = self.emit(tree, c)?;
            ents.push(DirEnt {
                name: &child.name,
                reference,
                ino: child.ino,
                kind,
            });
        }
        let (listing, headers) = listing(&ents);
        let start = self.dirs.pos();
        self.dirs.push(&listing);
        // The index lets a reader skip to the header that may hold a name: one entry for each
        // header that starts in a later metadata block than the previous one indexed.
        let mut index = Vec::new();
        let mut entries_indexed = 0usize;
        let mut last_block = start / METADATA_SIZE as u64;
        for &(off, first) in headers.iter().skip(1) {
            let abs = start + off as u64;
            if abs / METADATA_SIZE as u64 != last_block {
                last_block = abs / METADATA_SIZE as u64;
                let name = ents[first].name;
                index.extend_from_slice(&off.to_le_bytes());
                index.extend_from_slice(&(self.dirs.block_start(abs) as u32).to_le_bytes());
                index.extend_from_slice(&(name.len() as u32 - 1).to_le_bytes());
                index.extend_from_slice(name);
                entries_indexed += 1;
            }
        }
        let size = listing.len() as u64 + 3;
        let dir_block = self.dirs.block_start(start);
        let dir_off = (start % METADATA_SIZE as u64) as u16;
        if dir_block > u32::MAX as u64 {
            return Err(SquashError::Unsupported {
                path: String::from_utf8_lossy(&node.name).into_owned(),
                what: "a directory table under 4 GiB".into(),
            });
        }
        let at = self.inodes.pos();
        let mut b = Vec::with_capacity(40 + index.len());
        if entries_indexed == 0 && size <= u16::MAX as u64 {
            base(&mut b, T_DIR, 0o755, self.mtime, node.ino);
            b.extend_from_slice(&(dir_block as u32).to_le_bytes());
            b.extend_from_slice(&(2 + subdirs).to_le_bytes());
            b.extend_from_slice(&(size as u16).to_le_bytes());
            b.extend_from_slice(&dir_off.to_le_bytes());
            b.extend_from_slice(&node.parent_ino.to_le_bytes());
        } else {
            base(&mut b, T_LDIR, 0o755, self.mtime, node.ino);
            b.extend_from_slice(&(2 + subdirs).to_le_bytes());
            b.extend_from_slice(&(size as u32).to_le_bytes());
            b.extend_from_slice(&(dir_block as u32).to_le_bytes());
            b.extend_from_slice(&node.parent_ino.to_le_bytes());
            b.extend_from_slice(&(entries_indexed as u16).to_le_bytes());
            b.extend_from_slice(&dir_off.to_le_bytes());
            b.extend_from_slice(&NONE32.to_le_bytes()); // no xattrs
            b.extend_from_slice(&index);
        }
        let r = self.inodes.reference(at);
        self.inodes.push(&b);
        Ok(r)
    }
}

/// Serializes a directory's entries (sorted) into headers and entries. A new header starts
/// after 256 entries, when the inode metadata block changes, or when an inode number is out
/// of the i16 reach of the header's base. Returns the bytes and, per header, its offset and
/// first entry.
fn listing(ents: &[DirEnt<'_>]) -> (Vec<u8>, Vec<(u32, usize)>) {
    let mut out = Vec::new();
    let mut headers = Vec::new();
    let mut i = 0;
    while i < ents.len() {
        let first = &ents[i];
        let block = first.reference >> 16;
        let mut j = i + 1;
        while j < ents.len()
            && j - i < 256
            && ents[j].reference >> 16 == block
            && i16::try_from(ents[j].ino as i64 - first.ino as i64).is_ok()
        {
            j += 1;
        }
        headers.push((out.len() as u32, i));
        out.extend_from_slice(&((j - i - 1) as u32).to_le_bytes());
        out.extend_from_slice(&(block as u32).to_le_bytes());
        out.extend_from_slice(&first.ino.to_le_bytes());
        for e in &ents[i..j] {
            out.extend_from_slice(&((e.reference & 0xffff) as u16).to_le_bytes());
            out.extend_from_slice(&((e.ino as i64 - first.ino as i64) as i16).to_le_bytes());
            out.extend_from_slice(&e.kind.to_le_bytes());
            out.extend_from_slice(&(e.name.len() as u16 - 1).to_le_bytes());
            out.extend_from_slice(e.name);
        }
        i = j;
    }
    (out, headers)
}

/// Writes a squashfs image of `entries` (paths relative to the root, parents before
/// children, as a [`super::Layer`] holds them) into `out` from its current position (the
/// start of an empty file, or 1 MiB into a disk image); `path` names it
/// in errors. Every inode gets `mtime`, owner and group 0. `on_data` hears, once a distinct
/// file content is read, the bytes of every file holding it (in total, every file's size).
pub fn write_image<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a Node)>,
    mtime: u64,
    out: &mut File,
    path: &Path,
    opts: &Options,
    on_data: &dyn Fn(u64),
) -> Result<Summary, SquashError> {
    opts.codec
        .check()
        .map_err(|what| SquashError::Unsupported {
            path: String::new(),
            what,
        })?;
    let mtime = u32::try_from(mtime).map_err(|_| SquashError::Unsupported {
        path: String::new(),
        what: format!("a time before 2106 (SOURCE_DATE_EPOCH), found {mtime}"),
    })?;
    let tree = Tree::build(entries)?;
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let chunks = opts.cache.as_deref().map(|p| {
        if opts.scratch_cache {
            crate::bake::chunk_cache::ChunkCache::scratch(p)
        } else {
            crate::bake::chunk_cache::ChunkCache::new(p)
        }
    });
    let cache = chunks
        .as_ref()
        .map(|cache| ahead::block_cache(&opts.codec, cache));
    let io = image_io(path);
    // The image starts where `out` stands: a signed disk image has its squashfs 1 MiB in.
    let base = out.stream_position().map_err(&io)?;
    let mut w = BufWriter::with_capacity(1 << 20, out);
    w.write_all(&[0u8; SUPERBLOCK_LEN as usize]).map_err(&io)?;
    let mut pos = SUPERBLOCK_LEN;
    let mut flags = FLAG_DUPLICATES | FLAG_NO_XATTRS;
    if let Some(o) = opts.codec.options() {
        // Compressor options live in one uncompressed metadata block after the superblock.
        w.write_all(&(o.len() as u16 | 0x8000).to_le_bytes())
            .map_err(&io)?;
        w.write_all(&o).map_err(&io)?;
        pos += 2 + o.len() as u64;
        flags |= FLAG_COMP_OPT;
    }
    let area = data::write(
        &tree.contents,
        &opts.codec,
        BLOCK_SIZE,
        threads,
        cache.as_ref(),
        &mut w,
        pos,
        on_data,
    )?;
    let mut tables = Tables {
        inodes: MetaWriter::new(&opts.codec),
        dirs: MetaWriter::new(&opts.codec),
        area: &area,
        mtime,
    };
    let root = tables.emit(&tree, 0)?;
    let (inode_table, _) = tables.inodes.finish();
    let (dir_table, _) = tables.dirs.finish();
    let inode_table_start = area.end;
    let dir_table_start = inode_table_start + inode_table.len() as u64;
    let mut end = dir_table_start + dir_table.len() as u64;
    w.write_all(&inode_table).map_err(&io)?;
    w.write_all(&dir_table).map_err(&io)?;
    let fragment_table_start = if area.fragments.is_empty() {
        // Readers take this as the end of the directory table when there are no fragments.
        end
    } else {
        let mut entries = Vec::with_capacity(16 * area.fragments.len());
        for (start, word) in &area.fragments {
            entries.extend_from_slice(&start.to_le_bytes());
            entries.extend_from_slice(&word.to_le_bytes());
            entries.extend_from_slice(&0u32.to_le_bytes());
        }
        let (bytes, index_at) = meta::indexed_table(&opts.codec, &entries, end);
        w.write_all(&bytes).map_err(&io)?;
        let at = end + index_at;
        end += bytes.len() as u64;
        at
    };
    let (ids, index_at) = meta::indexed_table(&opts.codec, &0u32.to_le_bytes(), end);
    w.write_all(&ids).map_err(&io)?;
    let id_table_start = end + index_at;
    let bytes_used = end + ids.len() as u64;
    let padded = bytes_used.div_ceil(4096) * 4096;
    w.write_all(&vec![0u8; (padded - bytes_used) as usize])
        .map_err(&io)?;

    let inodes = tree.nodes.len() as u32;
    let mut sb = Vec::with_capacity(SUPERBLOCK_LEN as usize);
    sb.extend_from_slice(&MAGIC.to_le_bytes());
    sb.extend_from_slice(&inodes.to_le_bytes());
    sb.extend_from_slice(&mtime.to_le_bytes());
    sb.extend_from_slice(&BLOCK_SIZE.to_le_bytes());
    sb.extend_from_slice(&(area.fragments.len() as u32).to_le_bytes());
    sb.extend_from_slice(&opts.codec.id().to_le_bytes());
    sb.extend_from_slice(&BLOCK_LOG.to_le_bytes());
    sb.extend_from_slice(&flags.to_le_bytes());
    sb.extend_from_slice(&1u16.to_le_bytes()); // ids: just 0
    sb.extend_from_slice(&4u16.to_le_bytes());
    sb.extend_from_slice(&0u16.to_le_bytes());
    sb.extend_from_slice(&root.to_le_bytes());
    sb.extend_from_slice(&bytes_used.to_le_bytes());
    sb.extend_from_slice(&id_table_start.to_le_bytes());
    sb.extend_from_slice(&NONE64.to_le_bytes()); // xattr id table
    sb.extend_from_slice(&inode_table_start.to_le_bytes());
    sb.extend_from_slice(&dir_table_start.to_le_bytes());
    sb.extend_from_slice(&fragment_table_start.to_le_bytes());
    sb.extend_from_slice(&NONE64.to_le_bytes()); // export (lookup) table
    w.seek(SeekFrom::Start(base)).map_err(&io)?;
    w.write_all(&sb).map_err(&io)?;
    w.flush().map_err(&io)?;
    Ok(Summary {
        inodes,
        fragments: area.fragments.len() as u32,
        bytes_used,
        cache_hits: area.cache_hits,
        compressed_blocks: area.compressed,
    })
}

/// Writes the image to `out` atomically with mode 0644 (see [`crate::atomic_file`]).
pub fn write_file<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a Node)>,
    mtime: u64,
    out: &Path,
    opts: &Options,
) -> Result<Summary, SquashError> {
    write_file_with(entries, mtime, out, opts, &|_| {})
}

/// [`write_file`], calling `on_data` as [`write_image`] does.
pub fn write_file_with<'a>(
    entries: impl IntoIterator<Item = (&'a str, &'a Node)>,
    mtime: u64,
    out: &Path,
    opts: &Options,
    on_data: &dyn Fn(u64),
) -> Result<Summary, SquashError> {
    let mut tmp = AtomicFile::create(out, ".kiln-", ".raw.tmp")?;
    let summary = write_image(entries, mtime, tmp.file_mut(), out, opts, on_data)?;
    tmp.commit(0o644)?;
    Ok(summary)
}
