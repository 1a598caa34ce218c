//! What a bake tells its caller while it runs: the [`Phase`]s it goes through, as [`Event`]s
//! to a [`Reporter`] (`kiln bake` turns them into bars on a terminal and JSON lines with
//! `--json`). Reporting never changes what a bake writes.
//!
//! A bake goes through three phases, in this order: `extract` (archive members extracted,
//! every artifact and kiln-firstboot hashed and inspected; its bytes are the downloads' and
//! kiln-firstboot's), `compress` (the format's image written; its bytes are the layer's file
//! data) and `checksum` (the written image hashed for `SHA256SUMS`; its bytes are the
//! image's; sysext and rootfs only). The SBOM and manifest reuse the hashes of `extract`.

use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;

use crate::bake::error::{io_err, BakeError};
use crate::bake::layer::{Layer, Node};

/// A phase of a bake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Archive members extracted; artifacts and kiln-firstboot hashed and inspected.
    Extract,
    /// The format's image compressed and written.
    Compress,
    /// The written image hashed for `SHA256SUMS`.
    Checksum,
}

impl Phase {
    /// The phase's name as events and messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Extract => "extract",
            Phase::Compress => "compress",
            Phase::Checksum => "checksum",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Something that happened in a bake's phase.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// The phase began; it will process `total_bytes`.
    PhaseStart {
        /// Which phase.
        phase: Phase,
        /// Bytes it will process.
        total_bytes: u64,
    },
    /// Part of the phase is done (`bytes` never decreases and never passes `total_bytes`).
    PhaseProgress {
        /// Which phase.
        phase: Phase,
        /// Bytes processed so far.
        bytes: u64,
        /// Bytes it will process.
        total_bytes: u64,
        /// Milliseconds since the phase began.
        elapsed_ms: u64,
    },
    /// The phase is done: all of its `bytes` were processed.
    PhaseDone {
        /// Which phase.
        phase: Phase,
        /// Bytes processed (the start's `total_bytes`).
        bytes: u64,
        /// Milliseconds the phase took.
        elapsed_ms: u64,
    },
}

/// Receives a bake's [`Event`]s, from any of its threads; must be cheap.
pub trait Reporter: Sync {
    /// One event.
    fn event(&self, e: &Event);
}

/// A reporter that drops everything.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Reporter for Silent {
    fn event(&self, _: &Event) {}
}

/// One phase under way: counts processed bytes from any thread and reports them.
pub struct Tracker<'a> {
    rep: &'a dyn Reporter,
    phase: Phase,
    total: u64,
    start: Instant,
    done: Mutex<u64>,
}

impl std::fmt::Debug for Tracker<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker")
            .field("phase", &self.phase)
            .field("total", &self.total)
            .finish_non_exhaustive()
    }
}

impl<'a> Tracker<'a> {
    /// Starts `phase`, which will process `total` bytes.
    pub fn start(rep: &'a dyn Reporter, phase: Phase, total: u64) -> Tracker<'a> {
        rep.event(&Event::PhaseStart {
            phase,
            total_bytes: total,
        });
        Tracker {
            rep,
            phase,
            total,
            start: Instant::now(),
            done: Mutex::new(0),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        self.start
            .elapsed()
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// `n` more bytes were processed (nothing is reported for 0).
    pub fn add(&self, n: u64) {
        if n == 0 {
            return;
        }
        // Counted and reported under one lock, so the reported bytes never go backwards
        // whichever thread reports.
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        *done = done.saturating_add(n).min(self.total);
        self.rep.event(&Event::PhaseProgress {
            phase: self.phase,
            bytes: *done,
            total_bytes: self.total,
            elapsed_ms: self.elapsed_ms(),
        });
    }

    /// The phase is done.
    pub fn finish(self) {
        self.done();
    }

    /// The phase is done, for a tracker held by reference (a phase started by one function
    /// and ended by another); call it once.
    pub fn done(&self) {
        self.rep.event(&Event::PhaseDone {
            phase: self.phase,
            bytes: self.total,
            elapsed_ms: self.elapsed_ms(),
        });
    }
}

/// The bytes of file data in `layer`: what the `compress` phase processes.
pub fn file_bytes(layer: &Layer) -> u64 {
    layer
        .entries
        .values()
        .map(|e| match &e.node {
            Node::File { size, .. } => *size,
            _ => 0,
        })
        .sum()
}

/// Hashes the written image at `path` for `SHA256SUMS`: the `checksum` phase.
pub fn checksum(rep: &dyn Reporter, path: &std::path::Path) -> Result<String, BakeError> {
    let size = std::fs::metadata(path).map_err(io_err(path))?.len();
    let t = Tracker::start(rep, Phase::Checksum, size);
    let sha = crate::digest::hash_file(path, crate::digest::Sums::Sha256)
        .map_err(io_err(path))?
        .sha256;
    t.add(size);
    t.finish();
    Ok(sha)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Record(Mutex<Vec<Event>>);

    impl Reporter for Record {
        fn event(&self, e: &Event) {
            self.0.lock().unwrap().push(e.clone());
        }
    }

    #[test]
    fn progress_is_clamped_and_done_reports_the_total() {
        let r = Record::default();
        let t = Tracker::start(&r, Phase::Checksum, 10);
        t.add(4);
        t.add(0);
        t.add(9);
        t.finish();
        let events = r.0.into_inner().unwrap();
        let bytes: Vec<(&str, u64)> = events
            .iter()
            .map(|e| match e {
                Event::PhaseStart { total_bytes, .. } => ("start", *total_bytes),
                Event::PhaseProgress { bytes, .. } => ("progress", *bytes),
                Event::PhaseDone { bytes, .. } => ("done", *bytes),
            })
            .collect();
        assert_eq!(
            bytes,
            [
                ("start", 10),
                ("progress", 4),
                ("progress", 10),
                ("done", 10)
            ]
        );
        let json = serde_json::to_string(&events[0]).unwrap();
        assert_eq!(
            json,
            r#"{"event":"phase_start","phase":"checksum","total_bytes":10}"#
        );
    }
}
