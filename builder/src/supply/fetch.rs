//! Verified parallel fetch: fill a [`Store`] with the blobs a lock names, from mirrors (URL or
//! directory) and upstream, in order.
//!
//! Bounded concurrency, HTTP Range resume of partial files, retries with capped exponential
//! backoff on transient failures only (connect errors, resets, timeouts, truncation, 408, 429,
//! 5xx), and one overall deadline. Bytes stream through the store's hashing partial file in
//! chunks; no artifact is ever held in memory whole.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use serde::Serialize;

use crate::exit::ExitClass;
use crate::supply::lock::Artifact;
use crate::supply::store::{Claim, Expect, Partial, Store, StoreError, CHUNK};

/// Where bytes may come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A mirror served over HTTP: blobs at `<base>/blobs/sha256/<hex>`.
    MirrorUrl(String),
    /// A mirror directory on disk: blobs at `<dir>/blobs/sha256/<hex>`.
    MirrorDir(PathBuf),
    /// The artifact's own upstream URLs (`url`, then `sources`).
    Upstream,
}

impl Source {
    /// Parses a `--mirror` value: `http(s)://…` is a URL, anything else a directory.
    pub fn mirror(s: &str) -> Source {
        if s.starts_with("http://") || s.starts_with("https://") {
            Source::MirrorUrl(s.trim_end_matches('/').to_string())
        } else {
            Source::MirrorDir(PathBuf::from(s))
        }
    }

    fn label(&self) -> String {
        match self {
            Source::MirrorUrl(u) => u.clone(),
            Source::MirrorDir(d) => d.display().to_string(),
            Source::Upstream => "upstream".into(),
        }
    }
}

/// Tuning for a fetch run.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Downloads in flight at once.
    pub concurrency: usize,
    /// The whole run must finish within this time.
    pub deadline: Duration,
    /// Connecting to a host must finish within this time.
    pub connect_timeout: Duration,
    /// A response that sends nothing for this long is treated as a dropped connection.
    pub idle_timeout: Duration,
    /// First backoff delay; doubled per retry.
    pub backoff_initial: Duration,
    /// Backoff never waits longer than this.
    pub backoff_max: Duration,
    /// Attempts per URL before moving to the next source.
    pub attempts_per_url: u32,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            concurrency: 8,
            deadline: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            backoff_initial: Duration::from_millis(250),
            backoff_max: Duration::from_secs(10),
            attempts_per_url: 5,
        }
    }
}

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

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// Every source failed for some artifacts.
    #[error("{} of {total} artifacts could not be fetched:\n{}", failures.len(), failures.iter().map(|(id, e)| format!("  {id}: {e}")).collect::<Vec<_>>().join("\n"))]
    Failed {
        /// Artifacts attempted.
        total: usize,
        /// `(artifact id, last error)` per failed artifact.
        failures: Vec<(String, String)>,
        /// Whether any failure was a digest/size mismatch (bytes were wrong, not missing).
        wrong_bytes: bool,
    },
    /// The overall deadline passed.
    #[error("the fetch did not finish within its deadline of {0:?}; partial downloads are kept and resume next time")]
    Deadline(Duration),
    /// The HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Client(String),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl FetchError {
    /// Wrong bytes from a source are refused (exit 3); sources that could not deliver, or
    /// the deadline, exit 4; the rest (the client, the store itself) is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            FetchError::Failed {
                wrong_bytes: true, ..
            } => ExitClass::Verify,
            FetchError::Failed { .. } | FetchError::Deadline(_) => ExitClass::Fetch,
            FetchError::Client(_) | FetchError::Store(_) => ExitClass::Failure,
        }
    }
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

/// How one attempt ended.
enum AttemptError {
    /// Worth retrying the same URL (after backoff).
    Transient(String),
    /// This source cannot deliver this artifact; try the next one.
    Fatal(String),
    /// The source delivered wrong bytes (digest/size); try the next one.
    Wrong(String),
    /// The store itself failed; stop.
    Store(StoreError),
}

/// Fetches every artifact into `store`, trying `sources` in order for each. Artifacts already
/// present are not fetched again (their blob name is their digest, checked when written).
pub async fn fetch_all(
    store: &Store,
    artifacts: &[Artifact],
    sources: &[Source],
    opts: &FetchOptions,
    reporter: Arc<dyn Reporter>,
) -> Result<Summary, FetchError> {
    let client = reqwest::Client::builder()
        .connect_timeout(opts.connect_timeout)
        .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
        // Transparent decompression would change the bytes being hashed.
        .no_gzip()
        .build()
        .map_err(|e| FetchError::Client(e.to_string()))?;
    let transferred = Arc::new(AtomicU64::new(0));
    let work = futures_util::stream::iter(artifacts.iter().map(|a| {
        let client = client.clone();
        let reporter = reporter.clone();
        let transferred = transferred.clone();
        async move {
            let r = fetch_one(&client, store, a, sources, opts, &*reporter, &transferred).await;
            // Index records are written as each artifact lands, overlapping other downloads.
            let r = match r {
                Ok(o) => {
                    let st = store.clone();
                    let art = a.clone();
                    match tokio::task::spawn_blocking(move || st.record(&art)).await {
                        Ok(Ok(())) => Ok(o),
                        Ok(Err(e)) => Err(AttemptError::Store(e)),
                        Err(e) => Err(AttemptError::Fatal(format!("index task failed: {e}"))),
                    }
                }
                Err(e) => Err(e),
            };
            (a.id(), r)
        }
    }))
    .buffer_unordered(opts.concurrency.max(1))
    .collect::<Vec<_>>();
    let results = tokio::time::timeout(opts.deadline, work)
        .await
        .map_err(|_| FetchError::Deadline(opts.deadline))?;

    let mut summary = Summary::default();
    let mut failures = Vec::new();
    let mut wrong_bytes = false;
    for (id, r) in results {
        match r {
            Ok(o) => {
                summary.artifacts += 1;
                summary.cached += usize::from(o.cached);
                summary.resumed += o.resumed;
            }
            Err(AttemptError::Store(e)) => return Err(FetchError::Store(e)),
            Err(AttemptError::Wrong(e)) => {
                wrong_bytes = true;
                failures.push((id, e));
            }
            Err(AttemptError::Transient(e) | AttemptError::Fatal(e)) => failures.push((id, e)),
        }
    }
    summary.transferred = transferred.load(Ordering::Relaxed);
    if !failures.is_empty() {
        failures.sort();
        return Err(FetchError::Failed {
            total: artifacts.len(),
            failures,
            wrong_bytes,
        });
    }
    Ok(summary)
}

struct Outcome {
    cached: bool,
    resumed: u64,
}

async fn claim(store: &Store, expect: &Expect) -> Result<Claim, AttemptError> {
    loop {
        match store.claim(expect).map_err(AttemptError::Store)? {
            // Another process (or task) is filling it: wait for it to finish or die.
            Claim::Busy => tokio::time::sleep(Duration::from_millis(100)).await,
            other => return Ok(other),
        }
    }
}

async fn fetch_one(
    client: &reqwest::Client,
    store: &Store,
    a: &Artifact,
    sources: &[Source],
    opts: &FetchOptions,
    reporter: &dyn Reporter,
    transferred: &AtomicU64,
) -> Result<Outcome, AttemptError> {
    let id = a.id();
    let expect = Expect::for_artifact(a);
    if store.contains(&a.sha256) {
        reporter.event(&Event::Done {
            id,
            source: "cache".into(),
            transferred: 0,
            resumed: 0,
        });
        return Ok(Outcome {
            cached: true,
            resumed: 0,
        });
    }
    reporter.event(&Event::Start {
        id: id.clone(),
        size: a.size,
    });
    let mut last = AttemptError::Fatal("no sources configured".into());
    for source in sources {
        let urls: Vec<String> = match source {
            Source::MirrorUrl(base) => vec![format!("{base}/blobs/sha256/{}", a.sha256)],
            Source::Upstream => a.upstream_urls().map(str::to_string).collect(),
            Source::MirrorDir(dir) => {
                let path = dir.join("blobs").join("sha256").join(&a.sha256);
                match copy_from_dir(store, &expect, &path, reporter, transferred).await {
                    Ok(()) => {
                        reporter.event(&Event::Done {
                            id: id.clone(),
                            source: source.label(),
                            transferred: a.size,
                            resumed: 0,
                        });
                        return Ok(Outcome {
                            cached: false,
                            resumed: 0,
                        });
                    }
                    Err(AttemptError::Store(e)) => return Err(AttemptError::Store(e)),
                    Err(e) => {
                        let msg = msg(&e);
                        reporter.event(&Event::SourceFailed {
                            id: id.clone(),
                            source: source.label(),
                            error: msg,
                        });
                        last = e;
                        continue;
                    }
                }
            }
        };
        for url in urls {
            match fetch_url(client, store, &expect, &url, opts, reporter, transferred).await {
                Ok(resumed) => {
                    let len =
                        std::fs::metadata(store.blob_path(&a.sha256)).map_or(a.size, |m| m.len());
                    reporter.event(&Event::Done {
                        id: id.clone(),
                        source: url,
                        transferred: len.saturating_sub(resumed),
                        resumed,
                    });
                    return Ok(Outcome {
                        cached: false,
                        resumed,
                    });
                }
                Err(AttemptError::Store(e)) => return Err(AttemptError::Store(e)),
                Err(e) => {
                    reporter.event(&Event::SourceFailed {
                        id: id.clone(),
                        source: url.clone(),
                        error: msg(&e),
                    });
                    last = e;
                }
            }
        }
    }
    Err(last)
}

fn msg(e: &AttemptError) -> String {
    match e {
        AttemptError::Transient(m) | AttemptError::Fatal(m) | AttemptError::Wrong(m) => m.clone(),
        AttemptError::Store(e) => e.to_string(),
    }
}

async fn copy_from_dir(
    store: &Store,
    expect: &Expect,
    path: &std::path::Path,
    reporter: &dyn Reporter,
    transferred: &AtomicU64,
) -> Result<(), AttemptError> {
    use tokio::io::AsyncReadExt;
    let mut f = match tokio::fs::File::open(path).await {
        Ok(f) => f,
        Err(e) => return Err(AttemptError::Fatal(format!("{}: {e}", path.display()))),
    };
    let mut partial = match claim(store, expect).await? {
        Claim::Done(_) => return Ok(()),
        Claim::Partial(p) => p,
        Claim::Busy => return Err(AttemptError::Transient("busy".into())),
    };
    partial.restart().map_err(AttemptError::Store)?;
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = f
            .read(&mut buf)
            .await
            .map_err(|e| AttemptError::Fatal(format!("reading {}: {e}", path.display())))?;
        if n == 0 {
            break;
        }
        write_chunk(&mut partial, &buf[..n], path.display().to_string())?;
        transferred.fetch_add(n as u64, Ordering::Relaxed);
        reporter.event(&Event::Progress {
            id: expect.what.clone(),
            bytes: partial.len(),
        });
    }
    commit_off_thread(partial, path.display().to_string()).await
}

/// fsync of a large blob can take a while: do it on the blocking pool so the runtime's few
/// worker threads keep other downloads moving.
async fn commit_off_thread(partial: Partial, from: String) -> Result<(), AttemptError> {
    tokio::task::spawn_blocking(move || commit(partial, &from))
        .await
        .unwrap_or_else(|e| Err(AttemptError::Fatal(format!("commit task failed: {e}"))))
}

fn write_chunk(partial: &mut Partial, bytes: &[u8], from: String) -> Result<(), AttemptError> {
    partial.write(bytes).map_err(|e| write_error(e, &from))
}

/// A failed [`Partial::write`]: too many bytes means the source serves another file.
fn write_error(e: StoreError, from: &str) -> AttemptError {
    match e {
        StoreError::TooLong { .. } => AttemptError::Wrong(format!("{from}: {e}")),
        other => AttemptError::Store(other),
    }
}

fn commit(partial: Partial, from: &str) -> Result<(), AttemptError> {
    match partial.commit() {
        Ok(_) => Ok(()),
        Err(e @ StoreError::Mismatch { .. }) => Err(AttemptError::Wrong(format!("{from}: {e}"))),
        Err(e @ StoreError::TooShort { .. }) => {
            Err(AttemptError::Transient(format!("{from}: {e}")))
        }
        Err(e) => Err(AttemptError::Store(e)),
    }
}

fn backoff(opts: &FetchOptions, attempt: u32) -> Duration {
    let factor = 1u32 << attempt.saturating_sub(1).min(16);
    opts.backoff_initial
        .saturating_mul(factor)
        .min(opts.backoff_max)
}

/// Downloads one URL into the store with retries; returns the bytes reused by resume.
async fn fetch_url(
    client: &reqwest::Client,
    store: &Store,
    expect: &Expect,
    url: &str,
    opts: &FetchOptions,
    reporter: &dyn Reporter,
    transferred: &AtomicU64,
) -> Result<u64, AttemptError> {
    let mut attempt = 0;
    // Bytes left by an earlier, interrupted run (not by this run's own retries).
    let mut resumed: Option<u64> = None;
    loop {
        attempt += 1;
        let mut partial = match claim(store, expect).await? {
            Claim::Done(_) => return Ok(resumed.unwrap_or(0)),
            Claim::Partial(p) => p,
            Claim::Busy => continue,
        };
        let resumed = *resumed.get_or_insert(partial.len());
        let result = match request(client, &mut partial, url, opts).await {
            Ok(None) => commit_off_thread(partial, url.to_string()).await,
            Ok(Some(resp)) => {
                let (partial, r) =
                    stream_body(partial, resp, url, opts, reporter, transferred).await;
                match r {
                    Ok(()) => commit_off_thread(partial, url.to_string()).await,
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => return Ok(resumed),
            Err(AttemptError::Transient(e)) if attempt < opts.attempts_per_url => {
                retry_wait(expect, url, attempt, e, opts, reporter).await;
            }
            Err(e) => return Err(e),
        }
    }
}

async fn retry_wait(
    expect: &Expect,
    url: &str,
    attempt: u32,
    error: String,
    opts: &FetchOptions,
    reporter: &dyn Reporter,
) {
    let wait = backoff(opts, attempt);
    reporter.event(&Event::Retry {
        id: expect.what.clone(),
        url: url.to_string(),
        attempt,
        error,
        wait_ms: wait.as_millis() as u64,
    });
    tokio::time::sleep(wait).await;
}

fn transient_status(s: reqwest::StatusCode) -> bool {
    s.as_u16() == 408 || s.as_u16() == 429 || s.is_server_error()
}

/// Parses the start offset of `Content-Range: bytes START-END/TOTAL` (RFC 9110 section
/// 14.4; the unit is case-insensitive, TOTAL may be `*`). `None` for anything else,
/// including a range that contradicts itself (END before START, or not below TOTAL): such
/// an answer is not the resume that was asked for.
pub fn content_range_start(v: &str) -> Option<u64> {
    let (unit, rest) = v.trim().split_once(' ')?;
    if !unit.eq_ignore_ascii_case("bytes") {
        return None;
    }
    let (range, total) = rest.trim_start().split_once('/')?;
    let (start, end) = range.split_once('-')?;
    let num = |s: &str| {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse::<u64>().ok())
            .flatten()
    };
    let (start, end) = (num(start)?, num(end)?);
    let total_ok = match total {
        "*" => true,
        t => num(t).is_some_and(|t| end < t),
    };
    (start <= end && total_ok).then_some(start)
}

/// Sends the request for what `partial` still lacks and checks the answer's status and range.
/// `None` when nothing needs downloading (the commit will check what is there).
async fn request(
    client: &reqwest::Client,
    partial: &mut Partial,
    url: &str,
    opts: &FetchOptions,
) -> Result<Option<reqwest::Response>, AttemptError> {
    let size = partial.expect().size;
    if partial.expect().exact && partial.len() == size {
        return Ok(None);
    }
    let mut req = client.get(url);
    if !partial.is_empty() {
        req = req.header(reqwest::header::RANGE, format!("bytes={}-", partial.len()));
    }
    let resp = tokio::time::timeout(opts.idle_timeout, req.send())
        .await
        .map_err(|_| {
            AttemptError::Transient(format!("{url}: no response within {:?}", opts.idle_timeout))
        })?
        .map_err(|e| classify_reqwest(url, e))?;
    let status = resp.status();
    match status.as_u16() {
        200 => {
            // The server sent the whole file (it ignored Range, or none was asked for).
            if !partial.is_empty() {
                partial.restart().map_err(AttemptError::Store)?;
            }
        }
        206 => {
            let start = resp
                .headers()
                .get(reqwest::header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(content_range_start);
            if start != Some(partial.len()) {
                partial.restart().map_err(AttemptError::Store)?;
                return Err(AttemptError::Transient(format!(
                    "{url}: asked for bytes from {}, the server answered with range {start:?}; starting over",
                    partial.len()
                )));
            }
        }
        416 => {
            // Our partial is not a prefix the server recognises; start over.
            partial.restart().map_err(AttemptError::Store)?;
            return Err(AttemptError::Transient(format!(
                "{url}: HTTP 416 to a resume request; starting over"
            )));
        }
        _ if transient_status(status) => {
            return Err(AttemptError::Transient(format!("{url}: HTTP {status}")));
        }
        _ => {
            return Err(AttemptError::Fatal(format!(
                "{url}: HTTP {status} (expected 200 or 206)"
            )));
        }
    }
    Ok(Some(resp))
}

/// Network chunks queued between the socket reader and the disk writer of one download.
/// Bounded so a slow disk slows the reads (memory stays bounded) instead of piling up bytes.
const PIPE_DEPTH: usize = 4;

/// Streams a response body into `partial`. The socket is read on the runtime; hashing, writing
/// and writeback run on a blocking thread fed through a bounded channel, so neither the hash
/// nor a disk that stalls for a moment holds up the reads of this or any other download.
/// Returns the partial (its bytes are kept for resume whatever happened) and the outcome.
async fn stream_body(
    mut partial: Partial,
    resp: reqwest::Response,
    url: &str,
    opts: &FetchOptions,
    reporter: &dyn Reporter,
    transferred: &AtomicU64,
) -> (Partial, Result<(), AttemptError>) {
    let size = partial.expect().size;
    let exact = partial.expect().exact;
    let id = partial.expect().what.clone();
    let start = partial.len();
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(PIPE_DEPTH);
    let writer = tokio::task::spawn_blocking(move || {
        while let Some(chunk) = rx.blocking_recv() {
            if let Err(e) = partial.write(&chunk) {
                return (partial, Err(e));
            }
        }
        (partial, Ok(()))
    });
    let mut got = 0u64;
    let mut body = resp.bytes_stream();
    let net: Result<(), AttemptError> = loop {
        let next = match tokio::time::timeout(opts.idle_timeout, body.next()).await {
            Ok(next) => next,
            Err(_) => {
                break Err(AttemptError::Transient(format!(
                    "{url}: no data for {:?} after {} bytes",
                    opts.idle_timeout,
                    start + got
                )))
            }
        };
        match next {
            None => break Ok(()),
            Some(Ok(chunk)) => {
                let n = chunk.len() as u64;
                // A send error means the writer stopped on an error; it is reported below.
                if tx.send(chunk).await.is_err() {
                    break Ok(());
                }
                got += n;
                transferred.fetch_add(n, Ordering::Relaxed);
                reporter.event(&Event::Progress {
                    id: id.clone(),
                    bytes: start + got,
                });
            }
            Some(Err(e)) => break Err(classify_reqwest(url, e)),
        }
    };
    drop(tx);
    let (partial, written) = writer
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    if let Err(e) = written {
        return (partial, Err(write_error(e, url)));
    }
    if let Err(e) = net {
        return (partial, Err(e));
    }
    if exact && partial.len() < size {
        let n = partial.len();
        return (
            partial,
            Err(AttemptError::Transient(format!(
                "{url}: the response ended after {n} of {size} bytes"
            ))),
        );
    }
    (partial, Ok(()))
}

fn classify_reqwest(url: &str, e: reqwest::Error) -> AttemptError {
    // The message names the URL once, in front; reqwest's own text would repeat it.
    let e = e.without_url();
    let mut text = e.to_string();
    let mut cause = std::error::Error::source(&e);
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    if e.is_builder() || e.is_redirect() {
        AttemptError::Fatal(format!("{url}: {text}"))
    } else {
        // Connect errors, resets, timeouts and broken bodies are all worth another try.
        AttemptError::Transient(format!("{url}: {text}"))
    }
}

/// Downloads `url` only to hash it (for lock authoring): returns its sha256 and size. Bytes
/// are hashed as they stream and never kept; more than `limit` bytes is an error. Transient
/// failures are retried like any fetch.
pub async fn hash_url(
    url: &str,
    limit: u64,
    opts: &FetchOptions,
) -> Result<(String, u64), FetchError> {
    use sha2::Digest as _;
    let client = reqwest::Client::builder()
        .connect_timeout(opts.connect_timeout)
        .no_gzip()
        .build()
        .map_err(|e| FetchError::Client(e.to_string()))?;
    let work = async {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let r: Result<(String, u64), AttemptError> = async {
                let resp = client
                    .get(url)
                    .send()
                    .await
                    .map_err(|e| classify_reqwest(url, e))?;
                let status = resp.status();
                if transient_status(status) {
                    return Err(AttemptError::Transient(format!("{url}: HTTP {status}")));
                }
                if !status.is_success() {
                    return Err(AttemptError::Fatal(format!(
                        "{url}: HTTP {status} (expected 200)"
                    )));
                }
                let mut h = sha2::Sha256::new();
                let mut n = 0u64;
                let mut body = resp.bytes_stream();
                while let Some(chunk) = tokio::time::timeout(opts.idle_timeout, body.next())
                    .await
                    .map_err(|_| {
                    AttemptError::Transient(format!("{url}: no data for {:?}", opts.idle_timeout))
                })? {
                    let chunk = chunk.map_err(|e| classify_reqwest(url, e))?;
                    n += chunk.len() as u64;
                    if n > limit {
                        return Err(AttemptError::Fatal(format!(
                            "{url}: larger than {limit} bytes"
                        )));
                    }
                    h.update(&chunk);
                }
                Ok((hex::encode(h.finalize()), n))
            }
            .await;
            match r {
                Ok(v) => return Ok(v),
                Err(AttemptError::Transient(e)) if attempt < opts.attempts_per_url => {
                    tokio::time::sleep(backoff(opts, attempt)).await;
                    let _ = e;
                }
                Err(e) => {
                    return Err(FetchError::Failed {
                        total: 1,
                        failures: vec![(url.to_string(), msg(&e))],
                        wrong_bytes: false,
                    })
                }
            }
        }
    };
    tokio::time::timeout(opts.deadline, work)
        .await
        .map_err(|_| FetchError::Deadline(opts.deadline))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let o = FetchOptions {
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_millis(1000),
            ..FetchOptions::default()
        };
        let got: Vec<u64> = (1..=6).map(|a| backoff(&o, a).as_millis() as u64).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn content_range() {
        assert_eq!(content_range_start("bytes 100-199/200"), Some(100));
        assert_eq!(content_range_start("bytes */200"), None);
        assert_eq!(content_range_start("items 1-2/3"), None);
        assert_eq!(content_range_start("Bytes 100-199/*"), Some(100));
        // A range that contradicts itself is not the resume that was asked for.
        assert_eq!(content_range_start("bytes 100-50/200"), None);
        assert_eq!(content_range_start("bytes 100-199/199"), None);
        assert_eq!(content_range_start("bytes 100/200"), None);
        assert_eq!(content_range_start("bytes +100-199/200"), None);
    }

    #[test]
    fn mirror_parsing() {
        assert_eq!(
            Source::mirror("http://h/m/"),
            Source::MirrorUrl("http://h/m".into())
        );
        assert_eq!(Source::mirror("/srv/m"), Source::MirrorDir("/srv/m".into()));
    }
}
