//! Small files from a mirror URL (a lock, its signature): GET with the blob fetch's retries
//! and capped backoff ([`super::backoff`]), transient failures only (connect errors, resets,
//! timeouts, 408, 429, 5xx), and a size cap that holds with or without a Content-Length.

use super::error::FetchError;
use super::shown::{causes, shown};
use super::source::{backoff, FetchOptions};

/// The HTTP client kiln fetches with: the connect timeout of `opts`, kiln's user agent, no
/// transparent decompression (it would change the bytes that are hashed).
pub fn client(opts: &FetchOptions) -> Result<reqwest::Client, FetchError> {
    reqwest::Client::builder()
        .connect_timeout(opts.connect_timeout)
        .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
        .no_gzip()
        .build()
        .map_err(|e| FetchError::Client(e.to_string()))
}

enum Attempt {
    Transient(String),
    Fatal(String),
}

/// GETs `url` (at most `cap` bytes), retried as blob downloads are: `Ok(None)` for 404, the
/// last error (naming the URL) when every attempt failed.
pub async fn get_small(
    client: &reqwest::Client,
    url: &str,
    cap: u64,
    opts: &FetchOptions,
) -> Result<Option<Vec<u8>>, FetchError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        match once(client, url, cap, opts).await {
            Ok(b) => return Ok(b),
            Err(Attempt::Transient(e)) if attempt < opts.attempts_per_url => {
                let wait = backoff(opts, attempt);
                tracing::debug!("{}: {e}; retrying in {wait:?}", shown(url));
                tokio::time::sleep(wait).await;
            }
            Err(Attempt::Transient(reason) | Attempt::Fatal(reason)) => {
                return Err(FetchError::Get {
                    url: shown(url),
                    reason,
                    attempts: attempt,
                })
            }
        }
    }
}

async fn once(
    client: &reqwest::Client,
    url: &str,
    cap: u64,
    opts: &FetchOptions,
) -> Result<Option<Vec<u8>>, Attempt> {
    // reqwest's Display omits the cause ("error sending request"); the chain names it.
    let net_err = |e: reqwest::Error| Attempt::Transient(causes(&e.without_url()));
    let resp = tokio::time::timeout(opts.idle_timeout, client.get(url).send())
        .await
        .map_err(|_| Attempt::Transient(format!("no response within {:?}", opts.idle_timeout)))?
        .map_err(net_err)?;
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if status.as_u16() == 408 || status.as_u16() == 429 || status.is_server_error() {
        return Err(Attempt::Transient(format!("HTTP {status}")));
    }
    if !status.is_success() {
        return Err(Attempt::Fatal(format!("HTTP {status} (expected 200)")));
    }
    let too_big = || {
        Attempt::Fatal(format!(
            "larger than {cap} bytes, the most kiln reads for it"
        ))
    };
    if resp.content_length().unwrap_or(0) > cap {
        return Err(too_big());
    }
    // A chunked response has no Content-Length: the cap holds on the bytes as they come.
    let mut resp = resp;
    let mut body = Vec::new();
    while let Some(chunk) = tokio::time::timeout(opts.idle_timeout, resp.chunk())
        .await
        .map_err(|_| Attempt::Transient(format!("no data for {:?}", opts.idle_timeout)))?
        .map_err(net_err)?
    {
        if (body.len() + chunk.len()) as u64 > cap {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}
