//! Compressing while extracting. A cold bake used to extract, hash and gate every artifact
//! first and compress only then, so one core idled through most of the extraction (one
//! archive left to gunzip) and the compression started late. Here the format's big-file
//! pieces (rootfs frames, squashfs block groups: [`Target::pieces`]) are compressed into the
//! chunk cache by a pool of workers as soon as their file is final, while other artifacts are
//! still being extracted; the write then finds them in the cache, as a warm bake does.
//!
//! The bytes do not change: a piece is compressed by the format's own code under the key its
//! writer looks up. `kiln bake --no-cache` gets a scratch chunk cache in the bake's work
//! directory (no fsync, deleted with it), so nothing outlives the bake; with a bake cache the
//! pieces go where a warm bake would find them. A piece that fails here is only left out: the
//! write compresses it itself and reports the error, naming the file.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use crate::bake::chunk_cache::ChunkCache;
use crate::bake::target::{ReadyFile, Target};
use crate::image_def::ImageDef;

struct Pending {
    file: ReadyFile,
    left: AtomicU64,
}

/// Runs `body` (which assembles the layer, calling its argument with each file once that
/// file is final) beside `threads` workers that compress the files' pieces for `target` into
/// `cache`. Returns once `body` has returned and every queued piece is done, or, when `body`
/// failed, right after the pieces being compressed at that moment.
pub fn alongside<R, E>(
    target: &dyn Target,
    def: &ImageDef,
    cache: &ChunkCache,
    threads: usize,
    body: impl FnOnce(&(dyn Fn(ReadyFile) + Sync)) -> Result<R, E>,
) -> Result<R, E> {
    let (tx, rx) = mpsc::channel::<(Arc<Pending>, u64)>();
    let rx = Mutex::new(rx);
    let tx = Mutex::new(Some(tx));
    let stop = AtomicBool::new(false);
    // One content, compressed once (the same binary under two paths, or in two artifacts).
    let seen = Mutex::new(HashSet::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            let (rx, stop) = (&rx, &stop);
            s.spawn(move || loop {
                let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                let Ok((p, piece)) = next else { return };
                if stop.load(Ordering::Relaxed) {
                    continue;
                }
                if let Err(e) = target.precompress(def, &p.file, piece, cache) {
                    tracing::debug!("compressing ahead of the write: {e}; the write compresses it");
                }
                if p.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                    target.precompressed(def, &p.file, cache);
                }
            });
        }
        let submit = |file: ReadyFile| {
            let n = target.pieces(def, file.size);
            if n == 0
                || !seen
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(file.sha256.clone())
            {
                return;
            }
            let p = Arc::new(Pending {
                file,
                left: AtomicU64::new(n),
            });
            if let Some(tx) = tx.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                for piece in 0..n {
                    let _ = tx.send((p.clone(), piece));
                }
            }
        };
        let r = body(&submit);
        if r.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        // Closing the queue ends the workers once it is empty; the scope waits for them.
        tx.lock().unwrap_or_else(|e| e.into_inner()).take();
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bake::{rootfs, sysext};
    use sha2::{Digest, Sha256};
    use std::path::Path;

    fn def() -> ImageDef {
        let text = "name = \"t\"\nos = \"linux\"\narch = [\"amd64\"]\nformats = [\"sysext\", \"rootfs\"]\n\
             [kubernetes]\nversion = \"v1.34.2\"\n[[artifact]]\nname = \"kubelet\"\n\
             [sysext]\nname = \"kubernetes\"\nid = \"flatcar\"\nsysext_level = \"1.0\"\n\
             update_url = \"https://example.com/ext/\"\n";
        ImageDef::parse(text, Path::new("t.toml")).unwrap()
    }

    /// A file of `len` bytes that compresses (not all zero, not random).
    fn file(dir: &Path, name: &str, len: usize) -> ReadyFile {
        let bytes: Vec<u8> = (0..len)
            .map(|i| (i / 7 % 251) as u8 ^ (i % 13) as u8)
            .collect();
        let path = dir.join(name);
        std::fs::write(&path, &bytes).unwrap();
        ReadyFile {
            path,
            size: len as u64,
            sha256: hex::encode(Sha256::digest(&bytes)),
        }
    }

    fn entries(cache: &ChunkCache) -> usize {
        walk(cache.dir())
    }

    fn walk(dir: &Path) -> usize {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return 0;
        };
        rd.flatten()
            .map(|e| {
                let p = e.path();
                if p.is_dir() {
                    walk(&p)
                } else {
                    usize::from(p.extension().is_some_and(|x| x == "chunk"))
                }
            })
            .sum()
    }

    #[test]
    fn every_piece_of_a_ready_file_is_in_the_cache_once_it_returns() {
        let d = tempfile::tempdir().unwrap();
        let cache = ChunkCache::scratch(&d.path().join("c"));
        let big = file(d.path(), "big", 20 << 20); // 3 rootfs frames of 8 MiB
        let small = file(d.path(), "small", 1000); // batched by the writer: no piece
        let target = crate::bake::target_of(crate::image_def::Format::Rootfs);
        let r: Result<(), ()> = alongside(target, &def(), &cache, 2, |ready| {
            ready(big.clone());
            ready(small.clone());
            ready(big.clone()); // the same content again: compressed once
            Ok(())
        });
        r.unwrap();
        assert_eq!(rootfs::pieces(rootfs::FRAMING, big.size), 3);
        assert_eq!(entries(&cache), 3);
        assert_eq!(cache.stats().stored, 3);
    }

    #[test]
    fn a_failed_assembly_stops_the_queue() {
        let d = tempfile::tempdir().unwrap();
        let cache = ChunkCache::scratch(&d.path().join("c"));
        let files: Vec<ReadyFile> = (0..4)
            .map(|i| file(d.path(), &format!("f{i}"), 40 << 20))
            .collect();
        let target = crate::bake::target_of(crate::image_def::Format::Rootfs);
        let r: Result<(), &str> = alongside(target, &def(), &cache, 1, |ready| {
            for f in &files {
                ready(f.clone());
            }
            Err("gate refused a binary")
        });
        assert_eq!(r, Err("gate refused a binary"));
        // 20 pieces were queued; at most the one being compressed when the body failed is in.
        assert!(entries(&cache) <= 1, "{} entries", entries(&cache));
    }

    #[test]
    fn sysext_takes_back_the_groups_of_a_file_that_is_not_its_sha256() {
        let d = tempfile::tempdir().unwrap();
        let def = def();
        let cache = ChunkCache::scratch(&d.path().join("c"));
        let good = file(d.path(), "good", 3 << 20); // 24 blocks: 2 groups
        let mut bad = file(d.path(), "bad", 3 << 20);
        bad.sha256 = "0".repeat(64); // as if it changed after it was hashed
        let target = &sysext::Sysext;
        let r: Result<(), ()> = alongside(target, &def, &cache, 2, |ready| {
            ready(good.clone());
            ready(bad.clone());
            Ok(())
        });
        r.unwrap();
        assert_eq!(target.pieces(&def, good.size), 2);
        // Both files' groups were stored; the bad one's were removed again.
        assert_eq!(cache.stats().stored, 4);
        assert_eq!(entries(&cache), 2);
    }
}
