//! Moving a baked layer and its referrers ([`super::layer_oci`]) to and from a registry.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use serde::Serialize;
use serde_json::Value;

use super::error::RegistryError;
use super::layer_oci::{
    index_entry, layer_manifest, layer_tag, referrers, sha256_hex, simple_signing, Proofs,
    BLOB_SIG_TYPE, COSIGN_SIG_TYPE, LAYER_TYPE, SBOM_TYPE, SIG_ANNOTATION,
};
use super::manifest::{self, Descriptor};
use super::oci_mirror::{ensure_blob, session, Blob, Counters};
use super::options::{client, RegistryOptions};
use super::push::Payload;
use super::session::Session;
use super::target::OciTarget;
use crate::attest::AttestKey;
use crate::supply::fetch::{msg, AttemptError, FetchOptions};
use crate::supply::layer_trust::{LayerFiles, MAX_SIDE_FILE};
use crate::supply::store::Store;

/// A layer to push: its files (checked with the key's public half) and its sha256.
#[derive(Debug)]
pub struct LayerUpload<'a> {
    /// The files `kiln bake --attest-key` wrote.
    pub files: &'a LayerFiles,
    /// The main file's sha256, hex.
    pub sha256: &'a str,
}

/// What pushing one layer did.
#[derive(Debug, Clone, Serialize)]
pub struct LayerPushed {
    /// The main file's name.
    pub name: String,
    /// Its tag.
    pub tag: String,
    /// The layer manifest's digest (what `cosign verify` is given).
    pub digest: String,
    /// Whether the registry keeps referrers itself (else the `sha256-<hex>` tag lists them).
    pub referrers_api: bool,
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

fn read_side(p: &Path) -> Result<Vec<u8>, AttemptError> {
    crate::bounded_read::read_regular(p, MAX_SIDE_FILE)
        .map_err(|e| AttemptError::Fatal(format!("reading {}: {e}", p.display())))
}

async fn push_one(
    s: &Session<'_>,
    target: &OciTarget,
    up: &LayerUpload<'_>,
    key: &AttestKey,
    c: &Counters,
) -> Result<LayerPushed, AttemptError> {
    let name = file_name(&up.files.main);
    let size = std::fs::metadata(&up.files.main)
        .map_err(|e| AttemptError::Fatal(format!("{}: {e}", up.files.main.display())))?
        .len();
    let manifest = layer_manifest(&name, up.sha256, size);
    let digest = format!("sha256:{}", sha256_hex(&manifest));
    let payload = simple_signing(&format!("{}/{}", target.host, target.repo), &digest);
    let sig = key.sign_bytes(&payload);
    let (env, sbom, blob_sig) = (
        read_side(&up.files.dsse)?,
        read_side(&up.files.sbom)?,
        read_side(&up.files.sig)?,
    );
    let (env_name, sbom_name, sig_name) = (
        file_name(&up.files.dsse),
        file_name(&up.files.sbom),
        file_name(&up.files.sig),
    );
    let refs = referrers(&Proofs {
        subject: (&digest, manifest.len() as u64),
        image_signature: (payload, sig),
        envelope: (&env, &env_name),
        sbom: (&sbom, &sbom_name),
        blob_signature: (&blob_sig, &sig_name),
    });
    let main = Blob {
        digest: format!("sha256:{}", up.sha256),
        payload: Payload::File(up.files.main.clone(), size),
    };
    ensure_blob(s, &main, c).await?;
    let tag = layer_tag(&name);
    s.put_manifest(&tag, &manifest, manifest::OCI_MANIFEST, &digest)
        .await?;
    let mut api = true;
    for r in &refs {
        for (d, bytes) in &r.blobs {
            let b = Blob {
                digest: d.clone(),
                payload: Payload::Bytes(bytes.clone()),
            };
            ensure_blob(s, &b, c).await?;
        }
        let rd = format!("sha256:{}", sha256_hex(&r.manifest));
        api &= s
            .put_manifest(&rd, &r.manifest, manifest::OCI_MANIFEST, &rd)
            .await?;
        if let Some(t) = &r.tag {
            s.put_manifest(t, &r.manifest, manifest::OCI_MANIFEST, &rd)
                .await?;
        }
    }
    if !api {
        // The referrers tag schema: read the index others wrote, add ours, store it again.
        let fallback = format!("sha256-{}", digest.trim_start_matches("sha256:"));
        let existing = s.manifest_bytes(&fallback).await?.map(|(b, _)| b);
        let added: Vec<Value> = refs.iter().map(index_entry).collect();
        let index = super::layer_oci::merged_index(existing.as_deref(), &added)
            .map_err(|e| AttemptError::Fatal(format!("{target}:{fallback}: {e}")))?;
        let id = format!("sha256:{}", sha256_hex(&index));
        s.put_manifest(&fallback, &index, manifest::OCI_INDEX, &id)
            .await?;
    }
    Ok(LayerPushed {
        name,
        tag,
        digest,
        referrers_api: api,
    })
}

/// Pushes each layer with its referrers, signing the image signature with `key`.
pub async fn push_layers(
    target: &OciTarget,
    ropts: &RegistryOptions,
    opts: &FetchOptions,
    layers: &[LayerUpload<'_>],
    key: &AttestKey,
) -> Result<Vec<LayerPushed>, RegistryError> {
    let client = client(ropts, opts).map_err(RegistryError::Client)?;
    let mut s = session(target, &client, ropts, opts);
    s.push = true;
    let c = Counters::default();
    let work = async {
        let mut out = Vec::new();
        let mut failures = Vec::new();
        for up in layers {
            match push_one(&s, target, up, key, &c).await {
                Ok(p) => out.push(p),
                Err(e) => failures.push((up.files.main.display().to_string(), msg(&e))),
            }
        }
        (out, failures)
    };
    let (out, failures) = tokio::time::timeout(opts.deadline, work)
        .await
        .map_err(|_| RegistryError::Deadline(opts.deadline))?;
    if !failures.is_empty() {
        return Err(RegistryError::PushFailed {
            target: target.to_string(),
            total: layers.len(),
            failures,
            wrong_bytes: false,
        });
    }
    Ok(out)
}

/// A layer read from a registry into a staging directory, not yet trusted.
#[derive(Debug)]
pub struct PulledLayer {
    /// Its files in the staging directory (the provenance's own file is not written yet).
    pub files: LayerFiles,
    /// The layer manifest's digest.
    pub digest: String,
    /// cosign's simple-signing payload and its signature.
    pub image_signature: (Vec<u8>, String),
}

fn untrusted(target: &OciTarget, name: &str, why: String) -> RegistryError {
    RegistryError::Untrusted {
        layer: format!("{target}:{}", layer_tag(name)),
        why,
    }
}

/// A referrer's file name (its title) when it is a plain name ending in `suffix`.
fn title(v: &Value, suffix: &str) -> Result<String, String> {
    let t = v["layers"][0]["annotations"]["org.opencontainers.image.title"]
        .as_str()
        .unwrap_or("");
    let plain = !t.is_empty() && !t.contains('/') && !t.starts_with('.') && t.len() <= 255;
    if plain && t.ends_with(suffix) && t.len() > suffix.len() {
        Ok(t.to_string())
    } else {
        Err(format!("a file name ending in {suffix:?}, found {t:?}"))
    }
}

async fn get_blob(
    s: &Session<'_>,
    staging: &Store,
    v: &Value,
    max: u64,
) -> Result<PathBuf, String> {
    let d = &v["layers"][0];
    let desc = Descriptor {
        media_type: d["mediaType"].as_str().unwrap_or("").into(),
        digest: d["digest"].as_str().unwrap_or("").into(),
        size: d["size"].as_u64().unwrap_or(u64::MAX),
        platform: None,
    };
    if crate::supply::lock_image::digest_hex(&desc.digest).is_none() || desc.size > max {
        return Err(format!(
            "its layer is {} of {} bytes; expected a sha256 digest and at most {max} bytes",
            desc.digest, desc.size
        ));
    }
    super::blobs::Blobs::Registry(s)
        .blob(
            staging,
            &desc,
            &crate::supply::fetch::Silent,
            &AtomicU64::new(0),
        )
        .await
        .map_err(|e| msg(&e))?;
    Ok(staging.blob_path(desc.hex()))
}

/// Reads layer `name` (its main file's name) and its referrers from `target` into `dir`.
/// Each manifest is checked against its digest, each referrer's subject against the layer;
/// the caller checks the signatures.
pub async fn pull_layer(
    target: &OciTarget,
    ropts: &RegistryOptions,
    opts: &FetchOptions,
    name: &str,
    dir: &Path,
) -> Result<PulledLayer, RegistryError> {
    let client = client(ropts, opts).map_err(RegistryError::Client)?;
    let s = session(target, &client, ropts, opts);
    let bad = |why: String| untrusted(target, name, why);
    let net = |e: AttemptError| bad(msg(&e));
    let tag = layer_tag(name);
    let (bytes, _) =
        s.manifest_bytes(&tag).await.map_err(net)?.ok_or_else(|| {
            bad("no such tag: push the layer with kiln mirror push --layer".into())
        })?;
    let digest = format!("sha256:{}", sha256_hex(&bytes));
    let m: Value = serde_json::from_slice(&bytes).map_err(|e| bad(format!("manifest: {e}")))?;
    if m["artifactType"] != LAYER_TYPE
        || m["layers"][0]["annotations"]["org.opencontainers.image.title"] != name
    {
        return Err(bad(format!(
            "expected a {LAYER_TYPE} artifact titled {name:?}, found artifactType {} title {}",
            m["artifactType"], m["layers"][0]["annotations"]["org.opencontainers.image.title"]
        )));
    }
    let index = match s.referrers_api(&digest).await.map_err(net)? {
        Some(b) => Some(b),
        None => {
            let fallback = format!("sha256-{}", digest.trim_start_matches("sha256:"));
            s.manifest_bytes(&fallback)
                .await
                .map_err(net)?
                .map(|(b, _)| b)
        }
    };
    let index: Value = match index {
        Some(b) => serde_json::from_slice(&b).map_err(|e| bad(format!("referrers index: {e}")))?,
        None => Value::Null,
    };
    let staging = Store::open(dir.join(".staging")).map_err(RegistryError::Store)?;
    let main = get_blob(&s, &staging, &m, u64::MAX / 2)
        .await
        .map_err(bad)?;
    let mut found: std::collections::BTreeMap<&str, (Value, PathBuf)> = Default::default();
    let entries = index["manifests"].as_array().cloned().unwrap_or_default();
    for want in [
        COSIGN_SIG_TYPE,
        crate::attest::IN_TOTO,
        SBOM_TYPE,
        BLOB_SIG_TYPE,
    ] {
        for e in entries.iter().filter(|e| e["artifactType"] == want) {
            let rd = e["digest"].as_str().unwrap_or("");
            if crate::supply::lock_image::digest_hex(rd).is_none() {
                continue;
            }
            let (rb, _) = s
                .manifest_bytes(rd)
                .await
                .map_err(net)?
                .ok_or_else(|| bad(format!("referrer {rd} is listed but absent")))?;
            if format!("sha256:{}", sha256_hex(&rb)) != rd {
                return Err(bad(format!(
                    "referrer {rd}: the registry's bytes have another digest"
                )));
            }
            let rv: Value =
                serde_json::from_slice(&rb).map_err(|e| bad(format!("referrer {rd}: {e}")))?;
            if rv["subject"]["digest"] != digest.as_str() {
                return Err(bad(format!(
                    "referrer {rd} ({want}) refers to {}, not the layer's manifest {digest}",
                    rv["subject"]["digest"]
                )));
            }
            let path = get_blob(&s, &staging, &rv, MAX_SIDE_FILE)
                .await
                .map_err(|e| bad(format!("referrer {rd}: {e}")))?;
            found.entry(want).or_insert((rv, path));
        }
    }
    let mut take = |t: &str, what: &str| {
        found.remove(t).ok_or_else(|| {
            bad(format!(
                "no {what} refers to it (push it again with kiln mirror push --layer)"
            ))
        })
    };
    let (sig_v, sig_p) = take(COSIGN_SIG_TYPE, "image signature")?;
    let (att_v, att_p) = take(crate::attest::IN_TOTO, "provenance attestation")?;
    let (sbom_v, sbom_p) = take(SBOM_TYPE, "SBOM")?;
    let (_, blob_sig_p) = take(BLOB_SIG_TYPE, "file signature")?;
    let dsse_name =
        title(&att_v, ".provenance.dsse.json").map_err(|e| bad(format!("attestation: {e}")))?;
    let sbom_name = title(&sbom_v, ".spdx.json").map_err(|e| bad(format!("SBOM: {e}")))?;
    let base = dsse_name.trim_end_matches(".provenance.dsse.json");
    let place = |from: &Path, to: String| -> Result<PathBuf, RegistryError> {
        let p = dir.join(to);
        std::fs::rename(from, &p).map_err(|e| bad(format!("moving into {}: {e}", p.display())))?;
        Ok(p)
    };
    let payload = std::fs::read(&sig_p).map_err(|e| bad(e.to_string()))?;
    let signature = sig_v["layers"][0]["annotations"][SIG_ANNOTATION]
        .as_str()
        .unwrap_or("")
        .to_string();
    let files = LayerFiles {
        main: place(&main, name.to_string())?,
        sig: place(&blob_sig_p, format!("{name}.sig"))?,
        provenance: dir.join(format!("{base}.provenance.json")),
        dsse: place(&att_p, dsse_name.clone())?,
        sbom: place(&sbom_p, sbom_name)?,
    };
    let _ = std::fs::remove_dir_all(dir.join(".staging"));
    Ok(PulledLayer {
        files,
        digest,
        image_signature: (payload, signature),
    })
}
