//! Verified parallel fetch: fill a [`Store`] with the blobs a lock names, from mirrors (URL or
//! directory) and upstream, in order.
//!
//! Bounded concurrency, HTTP Range resume of partial files, retries with capped exponential
//! backoff on transient failures only (connect errors, resets, timeouts, truncation, 408, 429,
//! 5xx), and one overall deadline. Bytes stream through the store's hashing partial file in
//! chunks; no artifact is ever held in memory whole.

mod error;
mod http;
mod partial;
mod report;
mod shown;
mod small;
mod source;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;

pub use error::FetchError;
pub(crate) use error::{msg, AttemptError};
pub(crate) use http::fetch_url;
pub use http::{content_range_start, hash_url};
pub use report::{Event, Reporter, Silent, Summary};
pub use shown::{causes, shown};
pub use small::{client, get_small};
pub(crate) use source::backoff;
pub use source::{FetchOptions, Source};

use crate::supply::lock::Artifact;
use crate::supply::store::{Claim, Expect, Store, CHUNK};
use partial::{claim, commit_off_thread, write_chunk};

/// Fetches every artifact into `store`, trying `sources` in order for each. Artifacts already
/// present are not fetched again (their blob name is their digest, checked when written).
pub async fn fetch_all(
    store: &Store,
    artifacts: &[Artifact],
    sources: &[Source],
    opts: &FetchOptions,
    reporter: Arc<dyn Reporter>,
) -> Result<Summary, FetchError> {
    let client = client(opts)?;
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
            Err(AttemptError::Transient(e) | AttemptError::Fatal(e) | AttemptError::Denied(e)) => {
                failures.push((id, e))
            }
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
        // Upstream: each URL in turn; a mirror (`None`): its `blobs/sha256/<hex>`.
        let urls: Vec<Option<String>> = match source {
            Source::Upstream => a.upstream_urls().map(|u| Some(u.to_string())).collect(),
            Source::MirrorUrl(_) | Source::MirrorDir(_) => vec![None],
        };
        for url in urls {
            let label = url.as_deref().map_or_else(|| source.label(), shown);
            let r = if let Some(url) = url {
                let none = reqwest::header::HeaderMap::new();
                let r = fetch_url(
                    client,
                    store,
                    &expect,
                    &url,
                    &none,
                    opts,
                    reporter,
                    transferred,
                )
                .await;
                r.map(|resumed| (shown(&url), resumed))
            } else {
                from_mirror(client, store, &expect, source, opts, reporter, transferred).await
            };
            match r {
                Ok((from, resumed)) => {
                    let len =
                        std::fs::metadata(store.blob_path(&a.sha256)).map_or(a.size, |m| m.len());
                    reporter.event(&Event::Done {
                        id: id.clone(),
                        source: from,
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
                        source: label,
                        error: msg(&e),
                    });
                    last = e;
                }
            }
        }
    }
    Err(last)
}

/// Fetches one blob by its digest from a kiln mirror, `<mirror>/blobs/sha256/<hex>` (over
/// HTTP with the URL rules: Range resume, retries; from a directory by copying), verified
/// like any download. Returns where it came from and the bytes an earlier run left.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn from_mirror(
    client: &reqwest::Client,
    store: &Store,
    expect: &Expect,
    source: &Source,
    opts: &FetchOptions,
    reporter: &dyn Reporter,
    transferred: &AtomicU64,
) -> Result<(String, u64), AttemptError> {
    match source {
        Source::MirrorUrl(base) => {
            let url = format!("{base}/blobs/sha256/{}", expect.sha256);
            let none = reqwest::header::HeaderMap::new();
            let resumed = fetch_url(
                client,
                store,
                expect,
                &url,
                &none,
                opts,
                reporter,
                transferred,
            )
            .await?;
            Ok((shown(&url), resumed))
        }
        Source::MirrorDir(dir) => {
            let path = dir.join("blobs").join("sha256").join(&expect.sha256);
            copy_from_dir(store, expect, &path, reporter, transferred).await?;
            Ok((path.display().to_string(), 0))
        }
        Source::Upstream => Err(AttemptError::Fatal(format!(
            "{}: upstream is not a mirror",
            expect.what
        ))),
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
    // Only a regular file: opening a FIFO or a device would block or never end.
    match tokio::fs::metadata(path).await {
        Ok(m) if m.is_file() => {}
        Ok(_) => {
            return Err(AttemptError::Fatal(format!(
                "{}: not a regular file (a mirror's blobs are plain files)",
                path.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(AttemptError::Fatal(format!(
                "not in this mirror (no {})",
                path.display()
            )))
        }
        Err(e) => return Err(AttemptError::Fatal(format!("{}: {e}", path.display()))),
    }
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
