//! What a fetch tells the caller: progress [`Event`]s as it runs, a [`Summary`] at the end.

use serde::Serialize;

/// Something that happened during a fetch, for progress display.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// Work on an artifact began.
    Start {
        /// Artifact id.
        id: String,
        /// Its size.
        size: u64,
    },
    /// Bytes arrived (cumulative for this artifact, including resumed bytes).
    Progress {
        /// Artifact id.
        id: String,
        /// Bytes present so far.
        bytes: u64,
    },
    /// A transient failure; the same URL is retried after `wait_ms`.
    Retry {
        /// Artifact id.
        id: String,
        /// The URL that failed.
        url: String,
        /// Attempt number that failed (1-based).
        attempt: u32,
        /// What went wrong.
        error: String,
        /// Backoff before the next attempt.
        wait_ms: u64,
    },
    /// A source could not deliver; the next one is tried.
    SourceFailed {
        /// Artifact id.
        id: String,
        /// The source.
        source: String,
        /// Why.
        error: String,
    },
    /// The artifact is in the store.
    Done {
        /// Artifact id.
        id: String,
        /// Where it came from (`cache` when it was already present).
        source: String,
        /// Bytes received over the network or copied for it in this run.
        transferred: u64,
        /// Bytes reused from an interrupted earlier download.
        resumed: u64,
    },
}

/// Receives [`Event`]s; must be cheap (it is called from download tasks).
pub trait Reporter: Send + Sync {
    /// One event.
    fn event(&self, e: &Event);
}

/// A reporter that drops everything.
#[derive(Debug, Default)]
pub struct Silent;

impl Reporter for Silent {
    fn event(&self, _: &Event) {}
}

/// What a run did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Artifacts now present.
    pub artifacts: usize,
    /// Artifacts that were already present.
    pub cached: usize,
    /// Bytes received or copied in this run.
    pub transferred: u64,
    /// Bytes reused from earlier partial downloads.
    pub resumed: u64,
}
