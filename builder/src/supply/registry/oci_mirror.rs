//! A whole mirror in one registry repository (`oci://HOST[:PORT]/REPO`): `kiln mirror push`
//! and `kiln mirror sync --from oci://…`.
//!
//! Each file artifact is an OCI artifact: an image manifest with `artifactType`
//! [`ARTIFACT_TYPE`], the empty config, and one layer whose bytes ARE the artifact, so the
//! layer's digest is the lock's sha256 and `GET /v2/<repo>/blobs/sha256:<hex>` fetches it.
//! Each pinned platform manifest is pushed as itself (config and layers by digest). The image's
//! root (an index naming platforms the mirror does not carry) cannot be pushed as a manifest:
//! a registry refuses an index whose children are absent. Its bytes travel as the single
//! layer of an [`IMAGE_ROOT_TYPE`] artifact instead, so its digest still verifies. The signed
//! lock and its signature are the two layers of a [`LOCK_TYPE`] artifact tagged [`LOCK_TAG`],
//! pushed last: a registry advertises a lock only once what it names is there.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use futures_util::StreamExt;
use serde::Serialize;
use serde_json::json;

use super::blobs::Blobs;
use super::error::RegistryError;
use super::layout;
use super::manifest::{self, Parsed};
use super::options::{client, RegistryOptions};
use super::push::Payload;
use super::session::Session;
use super::target::{artifact_tag, tag_of, OciTarget};
use crate::supply::fetch::{msg, AttemptError, FetchOptions, Reporter, Summary};
use crate::supply::lock::{Artifact, Lock};
use crate::supply::lock_image::{digest_hex, Image};
use crate::supply::store::{Expect, Store};

/// `artifactType` of a file artifact.
pub const ARTIFACT_TYPE: &str = "application/vnd.kiln.artifact.v1";
/// `artifactType` of the signed lock.
pub const LOCK_TYPE: &str = "application/vnd.kiln.lock.v1";
/// `artifactType` of an image's root document carried as a blob.
pub const IMAGE_ROOT_TYPE: &str = "application/vnd.kiln.image-root.v1";
/// The tag of the lock artifact.
pub const LOCK_TAG: &str = "kiln-lock";
/// The lock's layer.
pub const LOCK_LAYER: &str = "application/vnd.kiln.lock.v1+toml";
/// The signature's layer.
pub const SIG_LAYER: &str = "application/vnd.kiln.lock.signature.v1+minisign";
/// A file artifact's layer.
pub const FILE_LAYER: &str = "application/octet-stream";
/// The empty config of OCI artifacts (image-spec 1.1 "Guidance for an Empty Descriptor").
pub(super) const EMPTY_TYPE: &str = "application/vnd.oci.empty.v1+json";
pub(super) const EMPTY: &[u8] = b"{}";
/// The most a lock or its signature may be.
const MAX_LOCK: u64 = 16 << 20;

fn sha256_digest(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

pub(super) fn session<'a>(
    target: &OciTarget,
    client: &'a reqwest::Client,
    ropts: &'a RegistryOptions,
    opts: &'a FetchOptions,
) -> Session<'a> {
    Session::new(
        client,
        ropts.scheme(&target.host),
        &target.image_ref(),
        ropts.credentials.get(&target.host),
        opts,
    )
}

/// What to push or pull for one blob.
pub(super) struct Blob {
    pub(super) digest: String,
    pub(super) payload: Payload,
}

/// One manifest with its blobs, pushed under one tag.
struct Unit {
    what: String,
    tag: String,
    bytes: Vec<u8>,
    media_type: String,
    blobs: Vec<Blob>,
}

/// An OCI artifact manifest: the empty config and `layers` (`media type, digest, size,
/// title`); deterministic bytes, so a re-push finds the same digest under the tag.
pub(super) fn artifact_manifest(
    artifact_type: &str,
    layers: &[(&str, &str, u64, &str)],
    annotations: &[(&str, &str)],
) -> Vec<u8> {
    let layers: Vec<_> = layers
        .iter()
        .map(|(mt, d, size, title)| {
            json!({"mediaType": mt, "digest": d, "size": size,
                   "annotations": {"org.opencontainers.image.title": title}})
        })
        .collect();
    let ann: BTreeMap<_, _> = annotations.iter().copied().collect();
    let doc = json!({
        "schemaVersion": 2,
        "mediaType": manifest::OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": {"mediaType": EMPTY_TYPE, "digest": sha256_digest(EMPTY), "size": EMPTY.len()},
        "layers": layers,
        "annotations": ann,
    });
    serde_json::to_vec(&doc).unwrap_or_default()
}

fn empty_blob() -> Blob {
    Blob {
        digest: sha256_digest(EMPTY),
        payload: Payload::Bytes(EMPTY.to_vec()),
    }
}

fn stored(store: &Store, hex: &str, what: &str) -> Result<(Blob, u64), String> {
    let p = store.blob_path(hex);
    let len = std::fs::metadata(&p)
        .map_err(|_| {
            format!(
                "{what}: blob {hex} is missing from the mirror ({})",
                p.display()
            )
        })?
        .len();
    Ok((
        Blob {
            digest: format!("sha256:{hex}"),
            payload: Payload::File(p, len),
        },
        len,
    ))
}

fn artifact_unit(store: &Store, a: &Artifact) -> Result<Unit, String> {
    let (blob, len) = stored(store, &a.sha256, &a.id())?;
    let id = a.id();
    let bytes = artifact_manifest(
        ARTIFACT_TYPE,
        &[(FILE_LAYER, &blob.digest, len, a.file_name())],
        &[("io.kiln.artifact", &id)],
    );
    Ok(Unit {
        what: id,
        tag: artifact_tag(a),
        bytes,
        media_type: manifest::OCI_MANIFEST.into(),
        blobs: vec![blob],
    })
}

/// An image's units: each pinned platform manifest (with its config and layers), then the
/// root document as an [`IMAGE_ROOT_TYPE`] artifact.
fn image_units(store: &Store, img: &Image) -> Result<Vec<Unit>, String> {
    let id = img.id();
    let root_hex = digest_hex(&img.digest).ok_or_else(|| format!("{id}: bad digest"))?;
    let (root, root_len) =
        layout::read_manifest(store, &img.digest).map_err(|e| format!("{id}: {e}"))?;
    let (root_type, platforms): (String, Vec<(String, String)>) = match &root {
        Parsed::Index {
            media_type,
            manifests,
        } => {
            let mut v = Vec::new();
            for p in &img.platforms {
                let d =
                    manifest::select(manifests, p.os, p.arch).map_err(|e| format!("{id}: {e}"))?;
                v.push((d.digest.clone(), format!("{}-{}", p.os, p.arch)));
            }
            (media_type.clone(), v)
        }
        Parsed::Manifest { media_type, .. } => {
            let p = img
                .platforms
                .first()
                .ok_or_else(|| format!("{id}: no platform"))?;
            (
                media_type.clone(),
                vec![(img.digest.clone(), format!("{}-{}", p.os, p.arch))],
            )
        }
    };
    let mut units = Vec::new();
    for (digest, plat) in platforms {
        let hex = digest_hex(&digest).unwrap_or_default();
        let (parsed, _) =
            layout::read_manifest(store, &digest).map_err(|e| format!("{id}: {e}"))?;
        let Parsed::Manifest {
            media_type,
            config,
            layers,
        } = parsed
        else {
            return Err(format!("{id}: {digest} is an index inside an index"));
        };
        let mut blobs = Vec::new();
        for d in std::iter::once(&config).chain(&layers) {
            blobs.push(stored(store, d.hex(), &id)?.0);
        }
        let bytes = std::fs::read(store.blob_path(hex)).map_err(|e| format!("{id}: {e}"))?;
        units.push(Unit {
            what: format!("{id} {plat}"),
            tag: tag_of(&["image", &img.name, &plat]),
            bytes,
            media_type,
            blobs,
        });
    }
    let (root_blob, _) = stored(store, root_hex, &id)?;
    let bytes = artifact_manifest(
        IMAGE_ROOT_TYPE,
        &[(&root_type, &root_blob.digest, root_len, &img.name)],
        &[("io.kiln.image.reference", &img.reference)],
    );
    units.push(Unit {
        what: id,
        tag: tag_of(&["image", &img.name]),
        bytes,
        media_type: manifest::OCI_MANIFEST.into(),
        blobs: vec![root_blob],
    });
    Ok(units)
}

/// What a push did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PushSummary {
    /// Manifests (tags) the mirror consists of.
    pub manifests: usize,
    /// Of those, already in the registry under their tag with the same digest.
    pub manifests_present: usize,
    /// Blobs uploaded.
    pub blobs_uploaded: usize,
    /// Blobs the registry already had (not uploaded again).
    pub blobs_present: usize,
    /// Bytes uploaded.
    pub bytes_uploaded: u64,
}

#[derive(Default)]
pub(super) struct Counters {
    manifests_present: AtomicUsize,
    blobs_uploaded: AtomicUsize,
    blobs_present: AtomicUsize,
    bytes: AtomicU64,
    /// One entry per blob digest any unit pushes: units that share a blob (two lock entries
    /// with the same bytes, image layers shared across platforms) upload it once, the others
    /// wait for that upload. Two concurrent uploads of one digest made docker-registry answer
    /// a manifest that named it with "blob unknown" (found in CI, a fixture whose two
    /// credential-provider stand-ins are one binary).
    blobs: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::OnceCell<()>>>>,
}

impl Counters {
    fn blob_cell(&self, digest: &str) -> Arc<tokio::sync::OnceCell<()>> {
        let mut m = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        m.entry(digest.to_string()).or_default().clone()
    }
}

async fn push_unit(s: &Session<'_>, u: &Unit, c: &Counters) -> Result<(), AttemptError> {
    let digest = sha256_digest(&u.bytes);
    if s.manifest_digest(&u.tag).await?.as_deref() == Some(digest.as_str()) {
        c.manifests_present.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    for b in &u.blobs {
        // The first unit with this digest checks and uploads it; the others wait for it (a
        // failed attempt leaves the cell empty, so the next one tries again).
        c.blob_cell(&b.digest)
            .get_or_try_init(|| async {
                if s.has_blob(&b.digest).await? {
                    c.blobs_present.fetch_add(1, Ordering::Relaxed);
                    return Ok(());
                }
                s.upload_blob(&b.digest, &b.payload).await?;
                let len = match &b.payload {
                    Payload::Bytes(v) => v.len() as u64,
                    Payload::File(_, n) => *n,
                    Payload::None => 0,
                };
                c.blobs_uploaded.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(len, Ordering::Relaxed);
                Ok::<(), AttemptError>(())
            })
            .await?;
    }
    s.put_manifest(&u.tag, &u.bytes, &u.media_type, &digest)
        .await
        .map(|_| ())
}

/// Pushes the mirror in `store` (the lock's artifacts and images, and the lock itself, given
/// as its bytes and signature) to `target`. Only what the registry lacks is uploaded.
pub async fn push_mirror(
    store: &Store,
    lock: &Lock,
    lock_bytes: Vec<u8>,
    signature: Option<Vec<u8>>,
    target: &OciTarget,
    ropts: &RegistryOptions,
    opts: &FetchOptions,
) -> Result<PushSummary, RegistryError> {
    let mut units = Vec::new();
    let mut problems = Vec::new();
    for a in &lock.artifacts {
        match artifact_unit(store, a) {
            Ok(u) => units.push(u),
            Err(e) => problems.push((a.id(), e)),
        }
    }
    for img in &lock.images {
        match image_units(store, img) {
            Ok(u) => units.extend(u),
            Err(e) => problems.push((img.id(), e)),
        }
    }
    let mut tags: BTreeMap<&str, &str> = BTreeMap::new();
    for u in &units {
        if let Some(other) = tags.insert(&u.tag, &u.what) {
            problems.push((
                u.what.clone(),
                format!("its tag {} is also the tag of {other}", u.tag),
            ));
        }
    }
    if !problems.is_empty() {
        return Err(RegistryError::Incomplete(problems));
    }
    let lock_digest = sha256_digest(&lock_bytes);
    let mut layers = vec![(
        LOCK_LAYER,
        lock_digest.as_str(),
        lock_bytes.len() as u64,
        "artifacts.lock",
    )];
    let mut blobs = vec![Blob {
        digest: lock_digest.clone(),
        payload: Payload::Bytes(lock_bytes.clone()),
    }];
    let sig_digest = signature.as_deref().map(sha256_digest);
    if let (Some(sig), Some(d)) = (&signature, &sig_digest) {
        layers.push((SIG_LAYER, d, sig.len() as u64, "artifacts.lock.minisig"));
        blobs.push(Blob {
            digest: d.clone(),
            payload: Payload::Bytes(sig.clone()),
        });
    }
    let lock_unit = Unit {
        what: "the lock".into(),
        tag: LOCK_TAG.into(),
        bytes: artifact_manifest(LOCK_TYPE, &layers, &[]),
        media_type: manifest::OCI_MANIFEST.into(),
        blobs,
    };

    let client = client(ropts, opts).map_err(RegistryError::Client)?;
    let mut session = session(target, &client, ropts, opts);
    session.push = true;
    let counters = Counters::default();
    let total = units.len() + 1;
    let work = async {
        let mut errs: Vec<(String, AttemptError)> = Vec::new();
        // The empty config every artifact shares goes first, once (units do not list it).
        if let Err(e) = ensure_blob(&session, &empty_blob(), &counters).await {
            errs.push(("the empty config".into(), e));
            return errs;
        }
        let results = futures_util::stream::iter(units.iter().map(|u| {
            let (s, c) = (&session, &counters);
            async move { (u, push_unit(s, u, c).await) }
        }))
        .buffer_unordered(opts.concurrency.max(1))
        .collect::<Vec<_>>()
        .await;
        errs.extend(
            results
                .into_iter()
                .filter_map(|(u, r)| r.err().map(|e| (u.what.clone(), e))),
        );
        // The lock last, and only over a complete push.
        if errs.is_empty() {
            if let Err(e) = push_unit(&session, &lock_unit, &counters).await {
                errs.push(("the lock".into(), e));
            }
        }
        errs
    };
    let errs = tokio::time::timeout(opts.deadline, work)
        .await
        .map_err(|_| RegistryError::Deadline(opts.deadline))?;
    let wrong_bytes = errs
        .iter()
        .any(|(_, e)| matches!(e, AttemptError::Wrong(_)));
    let mut failures: Vec<(String, String)> =
        errs.iter().map(|(w, e)| (w.clone(), msg(e))).collect();
    if !failures.is_empty() {
        failures.sort();
        return Err(RegistryError::PushFailed {
            target: target.to_string(),
            total,
            failures,
            wrong_bytes,
        });
    }
    Ok(PushSummary {
        manifests: total,
        manifests_present: counters.manifests_present.load(Ordering::Relaxed),
        blobs_uploaded: counters.blobs_uploaded.load(Ordering::Relaxed),
        blobs_present: counters.blobs_present.load(Ordering::Relaxed),
        bytes_uploaded: counters.bytes.load(Ordering::Relaxed),
    })
}

pub(super) async fn ensure_blob(
    s: &Session<'_>,
    b: &Blob,
    c: &Counters,
) -> Result<(), AttemptError> {
    if s.has_blob(&b.digest).await? {
        c.blobs_present.fetch_add(1, Ordering::Relaxed);
        return Ok(());
    }
    s.upload_blob(&b.digest, &b.payload).await?;
    c.blobs_uploaded.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Reads the lock artifact of `target` into `dir` (`artifacts.lock` and, when present,
/// `artifacts.lock.minisig`), each blob checked against its digest. The caller verifies the
/// signature. Returns the lock's path.
pub async fn fetch_lock(
    target: &OciTarget,
    ropts: &RegistryOptions,
    opts: &FetchOptions,
    dir: &std::path::Path,
) -> Result<PathBuf, RegistryError> {
    let client = client(ropts, opts).map_err(RegistryError::Client)?;
    let session = session(target, &client, ropts, opts);
    let failed = |e: String| RegistryError::LockArtifact(format!("{target}:{LOCK_TAG}: {e}"));
    let (bytes, ct) = session
        .manifest_bytes(LOCK_TAG)
        .await
        .map_err(|e| failed(msg(&e)))?
        .ok_or_else(|| {
            failed("no such tag: nothing was pushed here with kiln mirror push".into())
        })?;
    let Parsed::Manifest { layers, .. } = manifest::parse(&bytes, &ct).map_err(failed)? else {
        return Err(failed(
            "an index, expected the lock artifact's manifest".into(),
        ));
    };
    let staging = Store::open(dir.join("staging")).map_err(RegistryError::Store)?;
    let transferred = AtomicU64::new(0);
    let lock_path = dir.join(crate::supply::mirror::LOCK_NAME);
    let mut found_lock = false;
    for l in &layers {
        let dest = match l.media_type.as_str() {
            LOCK_LAYER => {
                found_lock = true;
                lock_path.clone()
            }
            SIG_LAYER => crate::supply::sign::signature_path(&lock_path),
            _ => continue,
        };
        if l.size > MAX_LOCK {
            return Err(failed(format!(
                "layer {} is {} bytes, over the {MAX_LOCK} bytes a lock may have",
                l.digest, l.size
            )));
        }
        Blobs::Registry(&session)
            .blob(&staging, l, &crate::supply::fetch::Silent, &transferred)
            .await
            .map_err(|e| failed(msg(&e)))?;
        std::fs::copy(staging.blob_path(l.hex()), &dest)
            .map_err(|e| failed(format!("writing {}: {e}", dest.display())))?;
    }
    if !found_lock {
        return Err(failed(format!("no {LOCK_LAYER} layer")));
    }
    Ok(lock_path)
}

/// Pulls each file artifact's blob (by the lock's sha256) from `target` into `store`.
pub async fn pull_artifacts(
    store: &Store,
    artifacts: &[Artifact],
    target: &OciTarget,
    ropts: &RegistryOptions,
    opts: &FetchOptions,
    reporter: Arc<dyn Reporter>,
) -> Result<Summary, RegistryError> {
    let client = client(ropts, opts).map_err(RegistryError::Client)?;
    let session = session(target, &client, ropts, opts);
    let transferred = AtomicU64::new(0);
    let cached = AtomicUsize::new(0);
    let work = futures_util::stream::iter(artifacts.iter().map(|a| {
        let (s, t, c, r) = (&session, &transferred, &cached, &*reporter);
        async move {
            if store.contains(&a.sha256) {
                c.fetch_add(1, Ordering::Relaxed);
            } else {
                let url = format!("{}/v2/{}/blobs/sha256:{}", s.base, s.repo, a.sha256);
                s.get_into(store, &Expect::for_artifact(a), &url, false, r, t)
                    .await?;
            }
            let st = store.clone();
            let art = a.clone();
            tokio::task::spawn_blocking(move || st.record(&art))
                .await
                .map_err(|e| AttemptError::Fatal(format!("index task failed: {e}")))?
                .map_err(AttemptError::Store)
        }
    }))
    .buffer_unordered(opts.concurrency.max(1))
    .collect::<Vec<_>>();
    let results = tokio::time::timeout(opts.deadline, work)
        .await
        .map_err(|_| RegistryError::Deadline(opts.deadline))?;
    let mut failures = Vec::new();
    let mut wrong_bytes = false;
    for (a, r) in artifacts.iter().zip(results) {
        match r {
            Ok(()) => {}
            Err(AttemptError::Store(e)) => return Err(RegistryError::Store(e)),
            Err(e) => {
                wrong_bytes |= matches!(e, AttemptError::Wrong(_));
                failures.push((a.id(), msg(&e)));
            }
        }
    }
    if !failures.is_empty() {
        failures.sort();
        return Err(RegistryError::Failed {
            kind: "artifacts",
            total: artifacts.len(),
            failures,
            wrong_bytes,
        });
    }
    Ok(Summary {
        artifacts: artifacts.len(),
        cached: cached.load(Ordering::Relaxed),
        transferred: transferred.load(Ordering::Relaxed),
        resumed: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_manifests_are_deterministic_oci_artifacts() {
        let d = sha256_digest(b"x");
        let a = artifact_manifest(ARTIFACT_TYPE, &[(FILE_LAYER, &d, 1, "f")], &[("k", "v")]);
        assert_eq!(
            a,
            artifact_manifest(ARTIFACT_TYPE, &[(FILE_LAYER, &d, 1, "f")], &[("k", "v")])
        );
        let Parsed::Manifest { config, layers, .. } =
            manifest::parse(&a, manifest::OCI_MANIFEST).unwrap()
        else {
            panic!()
        };
        assert_eq!(
            config.digest,
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(layers[0].digest, d);
        let v: serde_json::Value = serde_json::from_slice(&a).unwrap();
        assert_eq!(v["artifactType"], ARTIFACT_TYPE);
    }
}
