//! Where one image's manifests and blobs are read from: a registry repository (its own, or a
//! kiln mirror pushed into one), or a kiln mirror directory or HTTP mirror, whose layout is
//! the store's (`blobs/sha256/<hex>` for the index, manifests, configs and layers alike).

use std::sync::atomic::AtomicU64;

use super::manifest::{Descriptor, MAX_MANIFEST};
use super::session::Session;
use crate::supply::fetch::{from_mirror, AttemptError, Event, FetchOptions, Reporter, Source};
use crate::supply::lock_image::digest_hex;
use crate::supply::store::{Expect, Store};

pub(super) enum Blobs<'a> {
    Registry(&'a Session<'a>),
    Mirror(MirrorBlobs<'a>),
}

/// A kiln mirror (directory or HTTP) as the source of an image's blobs.
pub(super) struct MirrorBlobs<'a> {
    pub(super) client: &'a reqwest::Client,
    pub(super) source: &'a Source,
    pub(super) opts: &'a FetchOptions,
    /// The image's reference, for messages.
    pub(super) reference: &'a str,
}

impl Blobs<'_> {
    /// Fetches the manifest or index `digest` into the store (exactly `size` bytes when the
    /// referring index states it, else at most [`MAX_MANIFEST`]).
    pub(super) async fn manifest(
        &self,
        store: &Store,
        digest: &str,
        size: Option<u64>,
        reporter: &dyn Reporter,
        transferred: &AtomicU64,
    ) -> Result<(), AttemptError> {
        let hex = digest_hex(digest)
            .ok_or_else(|| AttemptError::Wrong(format!("not a sha256 digest: {digest:?}")))?;
        let bound = (size.unwrap_or(MAX_MANIFEST), size.is_some());
        match self {
            Blobs::Registry(s) => {
                let expect = Expect {
                    sha256: hex.to_string(),
                    size: bound.0,
                    exact: bound.1,
                    what: format!("{}/{}@{digest}", s.host, s.repo),
                };
                // A kiln mirror in a registry carries an image's root as a blob (its
                // platforms are not all there; see `docs/mirror.md`).
                let endpoint = if s.root_from_blobs && size.is_none() {
                    "blobs"
                } else {
                    "manifests"
                };
                let url = format!("{}/v2/{}/{endpoint}/{digest}", s.base, s.repo);
                s.get_into(store, &expect, &url, true, reporter, transferred)
                    .await
            }
            Blobs::Mirror(m) => m.get(store, hex, bound, reporter, transferred).await,
        }
    }

    /// Fetches one blob (config or layer) into the store, exactly `d.size` bytes.
    pub(super) async fn blob(
        &self,
        store: &Store,
        d: &Descriptor,
        reporter: &dyn Reporter,
        transferred: &AtomicU64,
    ) -> Result<(), AttemptError> {
        match self {
            Blobs::Registry(s) => {
                let expect = Expect {
                    sha256: d.hex().to_string(),
                    size: d.size,
                    exact: true,
                    what: format!("{}/{}@{}", s.host, s.repo, d.digest),
                };
                let url = format!("{}/v2/{}/blobs/{}", s.base, s.repo, d.digest);
                s.get_into(store, &expect, &url, false, reporter, transferred)
                    .await
            }
            Blobs::Mirror(m) => {
                m.get(store, d.hex(), (d.size, true), reporter, transferred)
                    .await
            }
        }
    }
}

impl MirrorBlobs<'_> {
    /// Fetches blob `hex` (`size`: the exact size, or an upper bound when not exact).
    async fn get(
        &self,
        store: &Store,
        hex: &str,
        (size, exact): (u64, bool),
        reporter: &dyn Reporter,
        transferred: &AtomicU64,
    ) -> Result<(), AttemptError> {
        if store.contains(hex) {
            return Ok(());
        }
        let expect = Expect {
            sha256: hex.to_string(),
            size,
            exact,
            what: format!("{}@sha256:{hex}", self.reference),
        };
        let (from, resumed) = from_mirror(
            self.client,
            store,
            &expect,
            self.source,
            self.opts,
            reporter,
            transferred,
        )
        .await?;
        let len = std::fs::metadata(store.blob_path(hex)).map_or(size, |m| m.len());
        reporter.event(&Event::Done {
            id: expect.what,
            source: from,
            transferred: len.saturating_sub(resumed),
            resumed,
        });
        Ok(())
    }
}
