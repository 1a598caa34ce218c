//! One repository on one registry: the `Authorization` it needs (found by asking `/v2/`, then
//! `Basic` or a bearer token), and manifest and blob downloads through the file fetcher.

use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

use reqwest::header::{HeaderMap, HeaderValue, ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};

use super::auth::{parse_challenge, token_from_json, Challenge, Credentials};
use super::manifest;
use crate::supply::fetch::{backoff, fetch_url, AttemptError, Event, FetchOptions, Reporter};
use crate::supply::lock_image::ImageRef;
use crate::supply::names::{Arch, Os};
use crate::supply::store::{Expect, Store};

/// The most bytes read from a token endpoint or an error body.
const MAX_SMALL: usize = 1 << 20;

pub(super) struct Session<'a> {
    pub(super) client: &'a reqwest::Client,
    pub(super) base: String,
    pub(super) host: String,
    pub(super) repo: String,
    creds: Option<&'a Credentials>,
    pub(super) opts: &'a FetchOptions,
    // `None`: not asked yet; `Some(None)`: anonymous; `Some(Some(v))`: this Authorization.
    auth: Mutex<Option<Option<HeaderValue>>>,
    /// Ask for `pull,push` scope (a `kiln mirror push`), not `pull`.
    pub(super) push: bool,
    /// An image's root (index or manifest) is read from the blobs endpoint: a kiln mirror in
    /// a registry carries the index as a blob (its platforms are not all there; see
    /// `docs/mirror.md`).
    pub(super) root_from_blobs: bool,
}

impl<'a> Session<'a> {
    pub(super) fn new(
        client: &'a reqwest::Client,
        scheme: &str,
        r: &ImageRef,
        creds: Option<&'a Credentials>,
        opts: &'a FetchOptions,
    ) -> Session<'a> {
        Session {
            client,
            base: format!("{scheme}://{}", r.host),
            host: r.host.clone(),
            repo: r.repository.clone(),
            creds,
            opts,
            auth: Mutex::new(None),
            push: false,
            root_from_blobs: false,
        }
    }

    fn cached_auth(&self) -> Option<Option<HeaderValue>> {
        self.auth.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The Authorization value for this repository, asking the registry when not known yet
    /// (or when `renew`, after a 401/403 that may be an expired token).
    pub(super) async fn authorization(
        &self,
        renew: bool,
    ) -> Result<Option<HeaderValue>, AttemptError> {
        if !renew {
            if let Some(a) = self.cached_auth() {
                return Ok(a);
            }
        }
        let url = format!("{}/v2/", self.base);
        let resp = self.send_retrying(&url, None).await?;
        let found = match resp.status().as_u16() {
            200..=299 => None,
            401 => {
                let challenge = resp
                    .headers()
                    .get_all(WWW_AUTHENTICATE)
                    .iter()
                    .filter_map(|v| v.to_str().ok())
                    .find_map(parse_challenge)
                    .ok_or_else(|| {
                        AttemptError::Fatal(format!(
                            "{url}: HTTP 401 without a Basic or Bearer WWW-Authenticate challenge"
                        ))
                    })?;
                Some(self.answer(challenge).await?)
            }
            s => {
                return Err(AttemptError::Fatal(format!(
                    "{url}: HTTP {s} (expected 200 or 401): not an OCI registry?"
                )))
            }
        };
        *self.auth.lock().unwrap_or_else(|p| p.into_inner()) = Some(found.clone());
        Ok(found)
    }

    async fn answer(&self, challenge: Challenge) -> Result<HeaderValue, AttemptError> {
        match challenge {
            Challenge::Basic => {
                let c = self.creds.ok_or_else(|| {
                    AttemptError::Fatal(format!(
                        "registry {} asks for a user name and password, and no credentials for it were found (--registry-auth FILE, $DOCKER_CONFIG/config.json or ~/.docker/config.json)",
                        self.host
                    ))
                })?;
                secret_header(&c.basic())
            }
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                if !(realm.starts_with("https://") || realm.starts_with("http://")) {
                    return Err(AttemptError::Fatal(format!(
                        "registry {}: token realm {realm:?} is not an http(s) URL",
                        self.host
                    )));
                }
                let mut url = reqwest::Url::parse(&realm).map_err(|e| {
                    AttemptError::Fatal(format!(
                        "registry {}: token realm {realm:?}: {e}",
                        self.host
                    ))
                })?;
                {
                    let mut q = url.query_pairs_mut();
                    if let Some(s) = &service {
                        q.append_pair("service", s);
                    }
                    // A push needs `pull,push` on this repository whatever `/v2/` suggested.
                    let scope = match scope {
                        Some(s) if !self.push => s,
                        _ if self.push => format!("repository:{}:pull,push", self.repo),
                        _ => format!("repository:{}:pull", self.repo),
                    };
                    q.append_pair("scope", &scope);
                }
                // Credentials go to the token endpoint only over TLS or to the registry's own
                // host: a plain-HTTP realm elsewhere would see them in clear.
                let same_host = url
                    .host_str()
                    .is_some_and(|h| self.host.split(':').next() == Some(h));
                let basic = match self.creds {
                    Some(c) if url.scheme() == "https" || same_host => {
                        Some(secret_header(&c.basic())?)
                    }
                    _ => None,
                };
                let url = url.to_string();
                let resp = self.send_retrying(&url, basic).await?;
                let status = resp.status();
                if !status.is_success() {
                    let hint = if self.creds.is_some() {
                        "the credentials were refused"
                    } else {
                        "anonymous pull was refused; give credentials with --registry-auth"
                    };
                    return Err(AttemptError::Fatal(format!(
                        "registry {}: token endpoint {realm} answered HTTP {status} ({hint})",
                        self.host
                    )));
                }
                let body = small_body(resp, &realm).await?;
                let token = token_from_json(&body).ok_or_else(|| {
                    AttemptError::Fatal(format!(
                        "registry {}: token endpoint {realm} answered without a usable token",
                        self.host
                    ))
                })?;
                secret_header(&format!("Bearer {token}"))
            }
        }
    }

    /// GET with the fetcher's retry rules for transient failures; the response is returned
    /// whatever its status otherwise.
    async fn send_retrying(
        &self,
        url: &str,
        auth: Option<HeaderValue>,
    ) -> Result<reqwest::Response, AttemptError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut req = self.client.get(url);
            if let Some(a) = &auth {
                req = req.header(AUTHORIZATION, a.clone());
            }
            let e: String = match tokio::time::timeout(self.opts.idle_timeout, req.send()).await {
                Err(_) => format!("{url}: no response within {:?}", self.opts.idle_timeout),
                Ok(Err(e)) => format!("{url}: {}", e.without_url()),
                Ok(Ok(resp)) => {
                    let s = resp.status().as_u16();
                    if s == 408 || s == 429 || (500..600).contains(&s) {
                        format!("{url}: HTTP {s}")
                    } else {
                        return Ok(resp);
                    }
                }
            };
            if attempt >= self.opts.attempts_per_url {
                return Err(AttemptError::Transient(e));
            }
            tracing::debug!("{e}; retrying");
            tokio::time::sleep(backoff(self.opts, attempt)).await;
        }
    }

    fn headers(&self, manifest: bool, auth: Option<HeaderValue>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if manifest {
            h.insert(ACCEPT, HeaderValue::from_static(manifest::ACCEPT));
        }
        if let Some(a) = auth {
            h.insert(AUTHORIZATION, a);
        }
        h
    }

    /// Downloads one URL into the store as `expect`, renewing the token once on 401/403.
    pub(super) async fn get_into(
        &self,
        store: &Store,
        expect: &Expect,
        url: &str,
        is_manifest: bool,
        reporter: &dyn Reporter,
        transferred: &AtomicU64,
    ) -> Result<(), AttemptError> {
        if store.contains(&expect.sha256) {
            return Ok(());
        }
        let mut renewed = false;
        loop {
            let auth = self.authorization(renewed).await?;
            let h = self.headers(is_manifest, auth);
            match fetch_url(
                self.client,
                store,
                expect,
                url,
                &h,
                self.opts,
                reporter,
                transferred,
            )
            .await
            {
                Ok(resumed) => {
                    let len = std::fs::metadata(store.blob_path(&expect.sha256))
                        .map_or(expect.size, |m| m.len());
                    reporter.event(&Event::Done {
                        id: expect.what.clone(),
                        source: url.to_string(),
                        transferred: len.saturating_sub(resumed),
                        resumed,
                    });
                    return Ok(());
                }
                Err(AttemptError::Denied(_)) if !renewed => renewed = true,
                Err(e) => return Err(e),
            }
        }
    }
}

/// An Authorization value marked sensitive (kept out of reqwest's and hyper's debug output).
pub(super) fn secret_header(v: &str) -> Result<HeaderValue, AttemptError> {
    let mut h = HeaderValue::from_str(v).map_err(|_| {
        AttemptError::Fatal("a credential holds characters an HTTP header cannot carry".into())
    })?;
    h.set_sensitive(true);
    Ok(h)
}

pub(super) async fn small_body(
    resp: reqwest::Response,
    what: &str,
) -> Result<Vec<u8>, AttemptError> {
    use futures_util::StreamExt;
    let mut out = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(c) = body.next().await {
        let c = c.map_err(|e| AttemptError::Transient(format!("{what}: {}", e.without_url())))?;
        out.extend_from_slice(&c);
        if out.len() > MAX_SMALL {
            return Err(AttemptError::Fatal(format!(
                "{what}: answer larger than {MAX_SMALL} bytes"
            )));
        }
    }
    Ok(out)
}

/// A single-platform image: its config must state the platform the lock pins.
pub(super) fn check_config_platform(
    store: &Store,
    manifest_digest: &str,
    os: Os,
    arch: Arch,
) -> Result<(), String> {
    let (parsed, _) = super::layout::read_manifest(store, manifest_digest)?;
    let manifest::Parsed::Manifest { config, .. } = parsed else {
        return Err(format!("{manifest_digest} is not an image manifest"));
    };
    let bytes = std::fs::read(store.blob_path(config.hex()))
        .map_err(|e| format!("reading config {}: {e}", config.digest))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| format!("config {} is not JSON: {e}", config.digest))?;
    let found = (
        v.get("os").and_then(|s| s.as_str()).unwrap_or(""),
        v.get("architecture").and_then(|s| s.as_str()).unwrap_or(""),
    );
    if found != (os.as_str(), arch.as_str()) {
        return Err(format!(
            "config {} is for {}/{}, the lock pins {os}/{arch}",
            config.digest, found.0, found.1
        ));
    }
    Ok(())
}
