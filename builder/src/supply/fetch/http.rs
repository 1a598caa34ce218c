//! Downloading over HTTP: one URL into the store with Range resume and retries, and hashing a
//! URL for lock authoring.

use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::StreamExt;

use super::error::{msg, AttemptError, FetchError};
use super::partial::{claim, commit_off_thread, write_error};
use super::report::{Event, Reporter};
use super::shown::{causes, shown};
use super::source::{backoff, FetchOptions};
use crate::supply::store::{Claim, Expect, Partial, Store};

/// Downloads one URL into the store with retries; returns the bytes reused by resume.
/// `headers` go with every request (a registry's `Accept` and `Authorization`; never logged).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn fetch_url(
    client: &reqwest::Client,
    store: &Store,
    expect: &Expect,
    url: &str,
    headers: &reqwest::header::HeaderMap,
    opts: &FetchOptions,
    reporter: &dyn Reporter,
    transferred: &AtomicU64,
) -> Result<u64, AttemptError> {
    let shown = shown(url);
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
        let result = match request(client, &mut partial, url, headers, opts).await {
            Ok(None) => commit_off_thread(partial, shown.clone()).await,
            Ok(Some(resp)) => {
                let (partial, r) =
                    stream_body(partial, resp, &shown, opts, reporter, transferred).await;
                match r {
                    Ok(()) => commit_off_thread(partial, shown.clone()).await,
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => return Ok(resumed),
            Err(AttemptError::Transient(e)) if attempt < opts.attempts_per_url => {
                retry_wait(expect, &shown, attempt, e, opts, reporter).await;
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
    headers: &reqwest::header::HeaderMap,
    opts: &FetchOptions,
) -> Result<Option<reqwest::Response>, AttemptError> {
    let size = partial.expect().size;
    if partial.expect().exact && partial.len() == size {
        return Ok(None);
    }
    let shown = shown(url);
    let mut req = client.get(url).headers(headers.clone());
    if !partial.is_empty() {
        req = req.header(reqwest::header::RANGE, format!("bytes={}-", partial.len()));
    }
    let resp = tokio::time::timeout(opts.idle_timeout, req.send())
        .await
        .map_err(|_| {
            AttemptError::Transient(format!(
                "{shown}: no response within {:?}",
                opts.idle_timeout
            ))
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
                    "{shown}: asked for bytes from {}, the server answered with range {start:?}; starting over",
                    partial.len()
                )));
            }
        }
        416 => {
            // Our partial is not a prefix the server recognises; start over.
            partial.restart().map_err(AttemptError::Store)?;
            return Err(AttemptError::Transient(format!(
                "{shown}: HTTP 416 to a resume request; starting over"
            )));
        }
        _ if transient_status(status) => {
            return Err(AttemptError::Transient(format!("{shown}: HTTP {status}")));
        }
        401 | 403 => return Err(AttemptError::Denied(format!("{shown}: HTTP {status}"))),
        _ => {
            return Err(AttemptError::Fatal(format!(
                "{shown}: HTTP {status} (expected 200 or 206)"
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
    shown: &str,
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
                    "{shown}: no data for {:?} after {} bytes",
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
            Some(Err(e)) => break Err(classify_reqwest(shown, e)),
        }
    };
    drop(tx);
    let (partial, written) = writer
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    if let Err(e) = written {
        return (partial, Err(write_error(e, shown)));
    }
    if let Err(e) = net {
        return (partial, Err(e));
    }
    if exact && partial.len() < size {
        let n = partial.len();
        return (
            partial,
            Err(AttemptError::Transient(format!(
                "{shown}: the response ended after {n} of {size} bytes"
            ))),
        );
    }
    (partial, Ok(()))
}

pub(crate) fn classify_reqwest(url: &str, e: reqwest::Error) -> AttemptError {
    // The message names the URL once, in front and masked; reqwest's own text would repeat it.
    let e = e.without_url();
    let text = format!("{}: {}", shown(url), causes(&e));
    if e.is_builder() || e.is_redirect() {
        AttemptError::Fatal(text)
    } else {
        // Connect errors, resets, timeouts and broken bodies are all worth another try.
        AttemptError::Transient(text)
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
    let shown = shown(url);
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
                    return Err(AttemptError::Transient(format!("{shown}: HTTP {status}")));
                }
                if !status.is_success() {
                    return Err(AttemptError::Fatal(format!(
                        "{shown}: HTTP {status} (expected 200)"
                    )));
                }
                let mut h = sha2::Sha256::new();
                let mut n = 0u64;
                let mut body = resp.bytes_stream();
                while let Some(chunk) = tokio::time::timeout(opts.idle_timeout, body.next())
                    .await
                    .map_err(|_| {
                    AttemptError::Transient(format!("{shown}: no data for {:?}", opts.idle_timeout))
                })? {
                    let chunk = chunk.map_err(|e| classify_reqwest(url, e))?;
                    n += chunk.len() as u64;
                    if n > limit {
                        return Err(AttemptError::Fatal(format!(
                            "{shown}: larger than {limit} bytes"
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
                        failures: vec![(shown.clone(), msg(&e))],
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
}
