//! Readers that enforce the archive limits while bytes stream through them: [`Capped`] stops
//! a stream at its byte cap, [`Gapped`] walks a tar stream's gaps (headers, padding) so
//! they count against the cap too.

use std::io::{self, Read};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A reader that fails once more than `cap` bytes have passed, and says so through a flag
/// the caller keeps (the error itself may come back wrapped by a decoder or the tar reader).
#[derive(Debug)]
pub struct Capped<R> {
    inner: R,
    left: u64,
    tripped: Arc<AtomicBool>,
}

impl<R> Capped<R> {
    /// Wraps `inner`; the returned flag turns true when the cap is hit.
    pub fn new(inner: R, cap: u64) -> (Capped<R>, Arc<AtomicBool>) {
        let tripped = Arc::new(AtomicBool::new(false));
        (
            Capped {
                inner,
                left: cap,
                tripped: tripped.clone(),
            },
            tripped,
        )
    }

    /// Wraps `inner`, sharing an existing flag (several members counted against one cap
    /// each get a fresh budget but report through the same flag).
    pub fn with_flag(inner: R, cap: u64, tripped: Arc<AtomicBool>) -> Capped<R> {
        Capped {
            inner,
            left: cap,
            tripped,
        }
    }

    /// The bytes still allowed.
    pub fn left(&self) -> u64 {
        self.left
    }

    /// The wrapped reader.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // Read one byte past the budget, so an archive of exactly `cap` bytes passes and one
        // byte more does not.
        let want = buf
            .len()
            .min(usize::try_from(self.left.saturating_add(1)).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n as u64 > self.left {
            self.tripped.store(true, Ordering::SeqCst);
            self.left = 0;
            return Err(io::Error::other("decompressed size cap exceeded"));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// The most bytes a tar stream may hold between one entry's data and the next entry: its
/// header blocks plus GNU long-name and pax records, which the tar reader keeps in memory.
pub const MAX_HEADER_BYTES: u64 = 1 << 20;

/// The budget of header bytes before the next entry of a tar stream, shared between the
/// reader ([`Gapped`]) and the loop over entries, which renews it at each entry.
#[derive(Debug)]
pub struct Gap {
    left: AtomicU64,
    tripped: AtomicBool,
}

impl Gap {
    /// A budget of [`MAX_HEADER_BYTES`] for the headers before the first entry.
    pub fn new() -> Arc<Gap> {
        Arc::new(Gap {
            left: AtomicU64::new(MAX_HEADER_BYTES),
            tripped: AtomicBool::new(false),
        })
    }

    /// An entry of `size` bytes was just yielded: its data (padded to 512) and the headers
    /// of the next entry may follow.
    pub fn allow(&self, size: u64) {
        let data = size.saturating_add(511) / 512 * 512;
        self.left
            .store(data.saturating_add(MAX_HEADER_BYTES), Ordering::SeqCst);
    }

    /// Whether the budget was exceeded.
    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::SeqCst)
    }
}

/// A tar stream reader held to a [`Gap`].
#[derive(Debug)]
pub struct Gapped<R> {
    inner: R,
    gap: Arc<Gap>,
}

impl<R> Gapped<R> {
    /// Wraps `inner`.
    pub fn new(inner: R, gap: Arc<Gap>) -> Gapped<R> {
        Gapped { inner, gap }
    }

    /// The wrapped reader.
    pub fn into_inner(self) -> R {
        self.inner
    }
}

impl<R: Read> Read for Gapped<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.gap.left.load(Ordering::SeqCst);
        let want = buf
            .len()
            .min(usize::try_from(left.saturating_add(1)).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n as u64 > left {
            self.gap.tripped.store(true, Ordering::SeqCst);
            return Err(io::Error::other("tar header record too large"));
        }
        self.gap.left.store(left - n as u64, Ordering::SeqCst);
        Ok(n)
    }
}

/// Whether a flag from [`Capped::new`] has tripped.
pub fn tripped(flag: &AtomicBool) -> bool {
    flag.load(Ordering::SeqCst)
}

/// `4 GiB`, `512 MiB`, or bytes.
pub(super) fn human(n: u64) -> String {
    if n >= 1 << 30 && n.is_multiple_of(1 << 30) {
        format!("{} GiB", n >> 30)
    } else if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else {
        format!("{n} bytes")
    }
}
