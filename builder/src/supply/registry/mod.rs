//! Pulling the lock's `[[image]]` entries from OCI registries into the store.
//!
//! The distribution API (`/v2/<repo>/manifests/<digest>`, `/v2/<repo>/blobs/<digest>`), pulled
//! by digest only: the index the lock pins, the manifest of each pinned platform (other
//! platforms are left out), then its config and layers. Every manifest and blob goes through
//! the file fetcher's download ([`crate::supply::fetch`]): hashed while streaming into a
//! partial file, renamed only when the digest matches, resumed with Range, retried with the
//! same backoff. Auth: anonymous, `Basic`, or the bearer-token exchange, with credentials from
//! a docker-style file ([`auth`]). The store becomes an OCI image layout ([`layout`]).

pub mod auth;
mod blobs;
mod error;
pub mod layer_io;
pub mod layer_oci;
pub mod layout;
pub mod manifest;
pub mod oci_mirror;
mod options;
mod push;
mod session;
pub mod target;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use serde::Serialize;

pub use auth::{CredentialStore, Credentials};
pub use error::RegistryError;
pub use oci_mirror::PushSummary;
pub use options::{client, RegistryOptions};
pub use target::OciTarget;

use crate::supply::fetch::{msg, AttemptError, Event, FetchOptions, Reporter, Source};
use crate::supply::lock_image::Image;
use crate::supply::store::Store;
use blobs::{Blobs, MirrorBlobs};
use manifest::Parsed;
use session::Session;

/// What a pull did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ImageSummary {
    /// Images complete in the store.
    pub images: usize,
    /// Manifests and blobs they consist of.
    pub blobs: usize,
    /// Of those, already present before this run.
    pub cached: usize,
    /// Bytes received.
    pub transferred: u64,
}

/// Where images are pulled from, tried in order for each image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// Each image's own registry (its `reference`).
    Upstream,
    /// A kiln mirror pushed into a registry repository (roots read as blobs).
    Oci(OciTarget),
    /// A kiln mirror directory or HTTP mirror: every manifest and blob at `blobs/sha256/<hex>`.
    Mirror(Source),
}

impl ImageSource {
    fn label(&self) -> String {
        match self {
            ImageSource::Upstream => "upstream".into(),
            ImageSource::Oci(t) => t.to_string(),
            ImageSource::Mirror(s) => s.label(),
        }
    }
}

/// Pulls every image into `store` and records each in the layout's `index.json`, trying
/// `sources` in order for each image: what one source delivered (verified) stays, the next
/// is asked only for what is still missing.
pub async fn pull_images(
    store: &Store,
    images: &[Image],
    sources: &[ImageSource],
    ropts: &RegistryOptions,
    opts: &FetchOptions,
    reporter: Arc<dyn Reporter>,
) -> Result<ImageSummary, RegistryError> {
    let client = client(ropts, opts).map_err(RegistryError::Client)?;
    let transferred = Arc::new(AtomicU64::new(0));
    let mut summary = ImageSummary::default();
    let mut failures = Vec::new();
    let mut wrong_bytes = false;
    let work = async {
        for img in images {
            let mut failed = Some(AttemptError::Fatal("no sources configured".into()));
            for source in sources {
                let r = pull_from(
                    &client,
                    store,
                    img,
                    source,
                    ropts,
                    opts,
                    &*reporter,
                    &transferred,
                )
                .await;
                match r {
                    Ok((blobs, cached)) => {
                        summary.images += 1;
                        summary.blobs += blobs;
                        summary.cached += cached;
                        failed = None;
                        break;
                    }
                    Err(AttemptError::Store(e)) => return Err(RegistryError::Store(e)),
                    Err(e) => {
                        reporter.event(&Event::SourceFailed {
                            id: img.id(),
                            source: source.label(),
                            error: msg(&e),
                        });
                        failed = Some(e);
                    }
                }
            }
            if let Some(e) = failed {
                wrong_bytes |= matches!(e, AttemptError::Wrong(_));
                failures.push((img.id(), msg(&e)));
            }
        }
        Ok(())
    };
    tokio::time::timeout(opts.deadline, work)
        .await
        .map_err(|_| RegistryError::Deadline(opts.deadline))??;
    summary.transferred = transferred.load(Ordering::Relaxed);
    if !failures.is_empty() {
        return Err(RegistryError::Failed {
            kind: "images",
            total: images.len(),
            failures,
            wrong_bytes,
        });
    }
    Ok(summary)
}

/// Pulls one image from one source.
#[allow(clippy::too_many_arguments)]
async fn pull_from(
    client: &reqwest::Client,
    store: &Store,
    img: &Image,
    source: &ImageSource,
    ropts: &RegistryOptions,
    opts: &FetchOptions,
    reporter: &dyn Reporter,
    transferred: &AtomicU64,
) -> Result<(usize, usize), AttemptError> {
    let r = match source {
        ImageSource::Mirror(s) => {
            let blobs = Blobs::Mirror(MirrorBlobs {
                client,
                source: s,
                opts,
                reference: &img.reference,
            });
            return pull_one(&blobs, store, img, opts, reporter, transferred).await;
        }
        ImageSource::Oci(t) => crate::supply::lock_image::ImageRef {
            host: t.host.clone(),
            repository: t.repo.clone(),
            tag: None,
        },
        ImageSource::Upstream => img.image_ref().map_err(AttemptError::Fatal)?,
    };
    let mut session = Session::new(
        client,
        ropts.scheme(&r.host),
        &r,
        ropts.credentials.get(&r.host),
        opts,
    );
    session.root_from_blobs = matches!(source, ImageSource::Oci(_));
    pull_one(
        &Blobs::Registry(&session),
        store,
        img,
        opts,
        reporter,
        transferred,
    )
    .await
}

/// Pulls one image: the root, the pinned platforms' manifests, their configs and layers;
/// returns (blobs it has, blobs that were already present).
async fn pull_one(
    session: &Blobs<'_>,
    store: &Store,
    img: &Image,
    opts: &FetchOptions,
    reporter: &dyn Reporter,
    transferred: &AtomicU64,
) -> Result<(usize, usize), AttemptError> {
    let mut blobs = 0;
    let mut cached = 0;
    let root_hex = hex_of(&img.digest)?;
    cached += usize::from(store.contains(root_hex));
    session
        .manifest(store, &img.digest, None, reporter, transferred)
        .await?;
    blobs += 1;
    let (root, root_size) = layout::read_manifest(store, &img.digest)
        .map_err(|e| AttemptError::Wrong(format!("{}: {e}", img.id())))?;
    let (root_type, manifests) = match &root {
        Parsed::Index {
            media_type,
            manifests,
        } => {
            let mut picked = Vec::new();
            for p in &img.platforms {
                let d = manifest::select(manifests, p.os, p.arch).map_err(|e| {
                    AttemptError::Fatal(format!("{} {}: {e}", img.id(), img.digest))
                })?;
                if let Some(pinned) = &p.digest {
                    if pinned != &d.digest {
                        return Err(AttemptError::Wrong(format!(
                            "{}: the index names {} for {}/{}, the lock pins {pinned}",
                            img.id(),
                            d.digest,
                            p.os,
                            p.arch
                        )));
                    }
                }
                picked.push((d.digest.clone(), Some(d.size)));
            }
            (media_type.clone(), picked)
        }
        Parsed::Manifest { media_type, .. } => {
            if img.platforms.len() != 1 {
                return Err(AttemptError::Fatal(format!(
                    "{}: {} is a single-platform manifest, but the lock pins {} platforms",
                    img.id(),
                    img.digest,
                    img.platforms.len()
                )));
            }
            (media_type.clone(), Vec::new())
        }
    };
    let mut to_walk: Vec<String> = Vec::new();
    for (digest, size) in &manifests {
        cached += usize::from(store.contains(hex_of(digest)?));
        session
            .manifest(store, digest, *size, reporter, transferred)
            .await?;
        blobs += 1;
        to_walk.push(digest.clone());
    }
    if manifests.is_empty() {
        to_walk.push(img.digest.clone());
    }
    for m in &to_walk {
        let (parsed, _) = layout::read_manifest(store, m)
            .map_err(|e| AttemptError::Wrong(format!("{}: {e}", img.id())))?;
        let Parsed::Manifest { config, layers, .. } = parsed else {
            return Err(AttemptError::Fatal(format!(
                "{}: {m} is an index inside an index",
                img.id()
            )));
        };
        let all: Vec<_> = std::iter::once(config).chain(layers).collect();
        cached += all.iter().filter(|d| store.contains(d.hex())).count();
        blobs += all.len();
        let results = futures_util::stream::iter(
            all.iter()
                .map(|d| session.blob(store, d, reporter, transferred)),
        )
        .buffer_unordered(opts.concurrency.max(1))
        .collect::<Vec<_>>()
        .await;
        for r in results {
            r?;
        }
    }
    if manifests.is_empty() {
        let p = &img.platforms[0];
        session::check_config_platform(store, &to_walk[0], p.os, p.arch)
            .map_err(|e| AttemptError::Wrong(format!("{}: {e}", img.id())))?;
    }
    let st = store.clone();
    let image = img.clone();
    tokio::task::spawn_blocking(move || layout::record(&st, &image, &root_type, root_size))
        .await
        .map_err(|e| AttemptError::Fatal(format!("index task failed: {e}")))?
        .map_err(AttemptError::Store)?;
    Ok((blobs, cached))
}

fn hex_of(digest: &str) -> Result<&str, AttemptError> {
    crate::supply::lock_image::digest_hex(digest)
        .ok_or_else(|| AttemptError::Wrong(format!("not a sha256 digest: {digest:?}")))
}
