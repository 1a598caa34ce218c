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
mod source;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;

pub use error::FetchError;
pub(crate) use error::{msg, AttemptError};
pub(crate) use http::fetch_url;
pub use http::{content_range_start, hash_url};
pub use report::{Event, Reporter, Silent, Summary};
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
            let none = reqwest::header::HeaderMap::new();
            match fetch_url(
                client,
                store,
                &expect,
                &url,
                &none,
                opts,
                reporter,
                transferred,
            )
            .await
            {
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
