//! Writing to a registry, per the OCI distribution spec's "Push" section: a blob goes up as
//! a monolithic upload in two requests ("POST then PUT": `POST /v2/<repo>/blobs/uploads/`
//! answers 202 with a `Location`, then `PUT <location>?digest=<digest>` with the bytes answers
//! 201), a manifest with `PUT /v2/<repo>/manifests/<reference>`. Before each, a `HEAD` asks
//! whether the registry already has it ("Checking if content exists in the registry"), so a
//! push moves only what the registry lacks. Every request carries the session's
//! `Authorization` (a token of `pull,push` scope), renewed once on 401/403; transient failures
//! are retried with the fetcher's backoff. Messages name URLs without their query (an upload
//! location carries the registry's upload state), never a credential.

use std::path::{Path, PathBuf};

use reqwest::header::{
    HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE,
};
use reqwest::{Method, StatusCode};

use super::manifest;
use super::session::{small_body, Session};
use crate::supply::fetch::{backoff, AttemptError};

/// The header a registry states a manifest's or blob's digest in.
const DIGEST_HEADER: &str = "docker-content-digest";

/// What a request sends as its body (made again for each attempt).
pub(super) enum Payload {
    /// No body.
    None,
    /// Bytes held in memory (manifests, small blobs).
    Bytes(Vec<u8>),
    /// A file streamed from disk, of this length.
    File(PathBuf, u64),
}

impl Payload {
    fn body(&self) -> Result<Option<(reqwest::Body, u64)>, AttemptError> {
        match self {
            Payload::None => Ok(None),
            Payload::Bytes(b) => Ok(Some((reqwest::Body::from(b.clone()), b.len() as u64))),
            Payload::File(p, len) => Ok(Some((file_body(p)?, *len))),
        }
    }
}

fn file_body(path: &Path) -> Result<reqwest::Body, AttemptError> {
    use tokio::io::AsyncReadExt;
    let f = std::fs::File::open(path)
        .map_err(|e| AttemptError::Fatal(format!("reading {}: {e}", path.display())))?;
    let f = tokio::fs::File::from_std(f);
    let chunks = futures_util::stream::unfold(Some(f), |f| async move {
        let mut f = f?;
        let mut buf = vec![0u8; crate::supply::store::CHUNK];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(buf), Some(f)))
            }
            Err(e) => Some((Err(e), None)),
        }
    });
    Ok(reqwest::Body::wrap_stream(chunks))
}

/// A URL without its query, for messages.
fn shown(url: &str) -> &str {
    url.split('?').next().unwrap_or(url)
}

impl Session<'_> {
    /// One request with the session's `Authorization`. Transient failures (connect errors,
    /// timeouts, 408, 429, 5xx) are retried when `retry`; a 401/403 renews the token once.
    /// Any other answer is returned whatever its status.
    pub(super) async fn call(
        &self,
        method: Method,
        url: &str,
        headers: &HeaderMap,
        payload: &Payload,
        retry: bool,
    ) -> Result<reqwest::Response, AttemptError> {
        let mut attempt = 0;
        let mut renew = false;
        let mut renewed = false;
        loop {
            attempt += 1;
            let auth = self.authorization(renew).await?;
            renew = false;
            let mut req = self
                .client
                .request(method.clone(), url)
                .headers(headers.clone());
            if let Some(a) = auth {
                req = req.header(AUTHORIZATION, a);
            }
            let streaming = matches!(payload, Payload::File(..));
            if let Some((body, len)) = payload.body()? {
                req = req.header(CONTENT_LENGTH, len).body(body);
            }
            // A streamed upload may take longer than the idle timeout to send; the overall
            // deadline still bounds it.
            let sent = if streaming {
                Ok(req.send().await)
            } else {
                tokio::time::timeout(self.opts.idle_timeout, req.send()).await
            };
            let e = match sent {
                Err(_) => format!(
                    "{} {}: no response within {:?}",
                    method,
                    shown(url),
                    self.opts.idle_timeout
                ),
                Ok(Err(e)) => format!("{method} {}: {}", shown(url), e.without_url()),
                Ok(Ok(resp)) => {
                    let s = resp.status().as_u16();
                    if (s == 401 || s == 403) && !renewed {
                        renewed = true;
                        renew = true;
                        continue;
                    }
                    if s == 408 || s == 429 || (500..600).contains(&s) {
                        format!("{method} {}: HTTP {s}", shown(url))
                    } else {
                        return Ok(resp);
                    }
                }
            };
            if !retry || attempt >= self.opts.attempts_per_url {
                return Err(AttemptError::Transient(e));
            }
            tracing::debug!("{e}; retrying");
            tokio::time::sleep(backoff(self.opts, attempt)).await;
        }
    }

    pub(super) fn url(&self, kind: &str, reference: &str) -> String {
        format!("{}/v2/{}/{kind}/{reference}", self.base, self.repo)
    }

    /// Whether the registry has blob `digest` in this repository (`HEAD`, 200 or 404).
    pub(super) async fn has_blob(&self, digest: &str) -> Result<bool, AttemptError> {
        let url = self.url("blobs", digest);
        let resp = self
            .call(Method::HEAD, &url, &HeaderMap::new(), &Payload::None, true)
            .await?;
        exists(resp.status(), &url)
    }

    /// The digest the registry holds under manifest `reference` (a tag), `None` when absent.
    pub(super) async fn manifest_digest(
        &self,
        reference: &str,
    ) -> Result<Option<String>, AttemptError> {
        let url = self.url("manifests", reference);
        let mut h = HeaderMap::new();
        h.insert(ACCEPT, HeaderValue::from_static(manifest::ACCEPT));
        let resp = self
            .call(Method::HEAD, &url, &h, &Payload::None, true)
            .await?;
        if !exists(resp.status(), &url)? {
            return Ok(None);
        }
        if let Some(d) = resp
            .headers()
            .get(DIGEST_HEADER)
            .and_then(|v| v.to_str().ok())
        {
            return Ok(Some(d.to_string()));
        }
        // A registry that states no digest on HEAD: read the manifest and hash it.
        Ok(self.manifest_bytes(reference).await?.map(|(bytes, _)| {
            use sha2::Digest as _;
            format!("sha256:{}", hex::encode(sha2::Sha256::digest(&bytes)))
        }))
    }

    /// Reads manifest `reference` (a tag) whole: `(bytes, Content-Type)`, `None` when absent.
    pub(super) async fn manifest_bytes(
        &self,
        reference: &str,
    ) -> Result<Option<(Vec<u8>, String)>, AttemptError> {
        let url = self.url("manifests", reference);
        let mut h = HeaderMap::new();
        h.insert(ACCEPT, HeaderValue::from_static(manifest::ACCEPT));
        let resp = self
            .call(Method::GET, &url, &h, &Payload::None, true)
            .await?;
        if !exists(resp.status(), &url)? {
            return Ok(None);
        }
        let ct = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        Ok(Some((small_body(resp, &url).await?, ct)))
    }

    /// Uploads a blob (POST then PUT `?digest=`). The registry hashes what it receives and
    /// refuses bytes that do not match `digest` (then: [`AttemptError::Wrong`]). A failed
    /// upload is started again from the POST, with the fetcher's retry rules.
    pub(super) async fn upload_blob(
        &self,
        digest: &str,
        payload: &Payload,
    ) -> Result<(), AttemptError> {
        let start = format!("{}/v2/{}/blobs/uploads/", self.base, self.repo);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let err = match self.upload_once(&start, digest, payload).await {
                Ok(()) => return Ok(()),
                Err(AttemptError::Transient(e)) => e,
                Err(e) => return Err(e),
            };
            if attempt >= self.opts.attempts_per_url {
                return Err(AttemptError::Transient(err));
            }
            tracing::debug!("{err}; starting the upload of {digest} again");
            tokio::time::sleep(backoff(self.opts, attempt)).await;
        }
    }

    async fn upload_once(
        &self,
        start: &str,
        digest: &str,
        payload: &Payload,
    ) -> Result<(), AttemptError> {
        let resp = self
            .call(
                Method::POST,
                start,
                &HeaderMap::new(),
                &Payload::Bytes(Vec::new()),
                true,
            )
            .await?;
        if resp.status() != StatusCode::ACCEPTED {
            return Err(refused(resp, "POST", start, "202 Accepted").await);
        }
        let location = resp
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| {
                AttemptError::Fatal(format!("POST {start}: 202 without a Location header"))
            })?;
        let mut url = reqwest::Url::parse(start)
            .and_then(|b| b.join(location))
            .map_err(|e| AttemptError::Fatal(format!("POST {start}: bad Location: {e}")))?;
        // Uploads stay on the registry the session authenticated to: a Location elsewhere
        // would carry the token there.
        let base = reqwest::Url::parse(&self.base)
            .map_err(|e| AttemptError::Fatal(format!("{}: {e}", self.base)))?;
        if url.origin() != base.origin() {
            return Err(AttemptError::Fatal(format!(
                "POST {start}: the upload Location points to another origin ({}); kiln does not send credentials there",
                url.origin().ascii_serialization()
            )));
        }
        url.query_pairs_mut().append_pair("digest", digest);
        let url = url.to_string();
        let mut h = HeaderMap::new();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        let resp = self.call(Method::PUT, &url, &h, payload, false).await?;
        match resp.status().as_u16() {
            201 => check_digest(&resp, digest, &url),
            400 => {
                let body = small_body(resp, shown(&url)).await.unwrap_or_default();
                let text = String::from_utf8_lossy(&body);
                if text.contains("DIGEST_INVALID") || text.contains("SIZE_INVALID") {
                    Err(AttemptError::Wrong(format!(
                        "PUT {}: the registry found the uploaded bytes do not hash to {digest} (the local blob is damaged: run kiln mirror verify)",
                        shown(&url)
                    )))
                } else {
                    Err(AttemptError::Fatal(format!(
                        "PUT {}: HTTP 400 (expected 201 Created): {}",
                        shown(&url),
                        text.chars().take(300).collect::<String>()
                    )))
                }
            }
            _ => Err(refused(resp, "PUT", &url, "201 Created").await),
        }
    }

    /// Stores `bytes` as manifest `reference` (a tag or the digest); checks the digest the
    /// registry states is `digest`. Returns whether the registry stated `OCI-Subject` (it
    /// keeps the referrers of a manifest with a `subject` itself: distribution-spec 1.1,
    /// "Pushing Manifests with Subject").
    pub(super) async fn put_manifest(
        &self,
        reference: &str,
        bytes: &[u8],
        media_type: &str,
        digest: &str,
    ) -> Result<bool, AttemptError> {
        let url = self.url("manifests", reference);
        let mut h = HeaderMap::new();
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_str(media_type).map_err(|_| {
                AttemptError::Fatal(format!("media type {media_type:?} is not a header value"))
            })?,
        );
        let resp = self
            .call(Method::PUT, &url, &h, &Payload::Bytes(bytes.to_vec()), true)
            .await?;
        if resp.status() != StatusCode::CREATED {
            return Err(refused(resp, "PUT", &url, "201 Created").await);
        }
        check_digest(&resp, digest, &url)?;
        Ok(resp.headers().contains_key("oci-subject"))
    }

    /// The referrers of manifest `digest` from the referrers API (`GET
    /// /v2/<repo>/referrers/<digest>`), `None` when the registry has no such API (any 4xx
    /// but 401/403: distribution 2.8 answers 404).
    pub(super) async fn referrers_api(
        &self,
        digest: &str,
    ) -> Result<Option<Vec<u8>>, AttemptError> {
        let url = self.url("referrers", digest);
        let mut h = HeaderMap::new();
        h.insert(ACCEPT, HeaderValue::from_static(manifest::OCI_INDEX));
        let resp = self
            .call(Method::GET, &url, &h, &Payload::None, true)
            .await?;
        match resp.status().as_u16() {
            200 => Ok(Some(small_body(resp, &url).await?)),
            401 | 403 => Err(AttemptError::Denied(format!(
                "{}: HTTP {}: the registry refused the credentials",
                shown(&url),
                resp.status()
            ))),
            400..=499 => Ok(None),
            _ => Err(refused(resp, "GET", &url, "200 or 404").await),
        }
    }
}

/// 2xx: present; 404: absent; anything else is an error naming the URL.
fn exists(s: StatusCode, url: &str) -> Result<bool, AttemptError> {
    match s.as_u16() {
        200..=299 => Ok(true),
        404 => Ok(false),
        401 | 403 => Err(AttemptError::Denied(format!(
            "{}: HTTP {s}: the registry refused the credentials (push needs pull,push access to the repository)",
            shown(url)
        ))),
        _ => Err(AttemptError::Fatal(format!(
            "{}: HTTP {s} (expected 200 or 404)",
            shown(url)
        ))),
    }
}

fn check_digest(resp: &reqwest::Response, digest: &str, url: &str) -> Result<(), AttemptError> {
    match resp
        .headers()
        .get(DIGEST_HEADER)
        .and_then(|v| v.to_str().ok())
    {
        Some(found) if found != digest => Err(AttemptError::Wrong(format!(
            "{}: the registry stored {found}, expected {digest}",
            shown(url)
        ))),
        _ => Ok(()),
    }
}

/// An unexpected answer: the status and the start of the registry's error body.
async fn refused(resp: reqwest::Response, method: &str, url: &str, want: &str) -> AttemptError {
    let s = resp.status();
    let body = small_body(resp, shown(url)).await.unwrap_or_default();
    let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
    let m = format!(
        "{method} {}: HTTP {s} (expected {want}): {}",
        shown(url),
        text.trim()
    );
    if s == StatusCode::UNAUTHORIZED || s == StatusCode::FORBIDDEN {
        AttemptError::Denied(format!(
            "{m}; the registry refused the credentials (push needs pull,push access to the repository)"
        ))
    } else {
        AttemptError::Fatal(m)
    }
}
