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
