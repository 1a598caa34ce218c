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
use crate::attest::{AttestKey, VerifyKey};
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

/// A layer read from a registry into a directory: its image signature checked, each file
/// chosen among the referrers because it verifies.
#[derive(Debug)]
pub struct PulledLayer {
    /// Its files (the provenance's own file is not written yet: the caller writes the
    /// statement it checked).
    pub files: LayerFiles,
    /// The layer manifest's digest.
    pub digest: String,
    /// The main file's sha256, verified as it was downloaded.
    pub sha256: String,
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

/// The most a layer's main file may be (a node layer is tens to hundreds of MiB).
pub const MAX_LAYER: u64 = 64 << 30;

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

/// One referrer of `subject`: its manifest (checked against its digest and subject) and its
/// one layer's bytes.
async fn referrer(
    s: &Session<'_>,
    staging: &Store,
    digest: &str,
    subject: &str,
) -> Result<(Value, PathBuf), String> {
    if crate::supply::lock_image::digest_hex(digest).is_none() {
        return Err(format!("{digest:?} is not a sha256 digest"));
    }
    let (rb, _) = s
        .manifest_bytes(digest)
        .await
        .map_err(|e| msg(&e))?
        .ok_or_else(|| format!("{digest} is listed but absent"))?;
    if format!("sha256:{}", sha256_hex(&rb)) != digest {
        return Err(format!(
            "{digest}: the registry's bytes have another digest"
        ));
    }
    let v: Value = serde_json::from_slice(&rb).map_err(|e| format!("{digest}: {e}"))?;
    if v["subject"]["digest"] != subject {
        return Err(format!(
            "{digest} refers to {}, not the layer's manifest {subject}",
            v["subject"]["digest"]
        ));
    }
    let path = get_blob(s, staging, &v, MAX_SIDE_FILE)
        .await
        .map_err(|e| format!("{digest}: {e}"))?;
    Ok((v, path))
}

/// The first referrer of type `t` that `accept` takes (several can be listed: a layer pushed
/// again with a new key); the reasons the others were refused otherwise.
async fn first_accepted<F>(
    s: &Session<'_>,
    staging: &Store,
    index: &[Value],
    t: &str,
    subject: &str,
    mut accept: F,
) -> Result<(Value, PathBuf), String>
where
    F: FnMut(&Value, &Path) -> Result<(), String>,
{
    let mut why = Vec::new();
    for e in index.iter().filter(|e| e["artifactType"] == t) {
        let d = e["digest"].as_str().unwrap_or("");
        match referrer(s, staging, d, subject).await {
            Ok((v, p)) => match accept(&v, &p) {
                Ok(()) => return Ok((v, p)),
                Err(w) => why.push(format!("{d}: {w}")),
            },
            Err(w) => why.push(w),
        }
    }
    if why.is_empty() {
        Err(format!(
            "no {t} refers to it (push it with kiln mirror push --layer)"
        ))
    } else {
        Err(format!("no {t} referrer verifies: {}", why.join("; ")))
    }
}

/// Reads layer `name` (its main file's name) and its referrers from `target` into `dir`,
/// checking with `key` on the way: the image signature first (it names the layer's manifest,
/// which names the main file's digest and size, so nothing unsigned is downloaded in bulk),
/// then the file signature and the provenance envelope over the main file, and the SBOM
/// against the provenance's byproducts. Every referrer must refer to this layer. The caller
/// checks the provenance against the lock ([`crate::supply::layer_trust::check`]).
pub async fn pull_layer(
    target: &OciTarget,
    ropts: &RegistryOptions,
    opts: &FetchOptions,
    name: &str,
    dir: &Path,
    key: &VerifyKey,
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
    let titled = &m["layers"][0]["annotations"]["org.opencontainers.image.title"];
    if m["artifactType"] != LAYER_TYPE || titled != name {
        return Err(bad(format!(
            "expected a {LAYER_TYPE} artifact titled {name:?}, found artifactType {} title {titled}",
            m["artifactType"]
        )));
    }
    let listed = match s.referrers_api(&digest).await.map_err(net)? {
        Some(b) => Some(b),
        None => {
            let fallback = format!("sha256-{}", digest.trim_start_matches("sha256:"));
            s.manifest_bytes(&fallback)
                .await
                .map_err(net)?
                .map(|(b, _)| b)
        }
    };
    let index: Vec<Value> = match listed {
        Some(b) => serde_json::from_slice::<Value>(&b)
            .map_err(|e| bad(format!("referrers index: {e}")))?["manifests"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let staging = Store::open(dir.join(".staging")).map_err(RegistryError::Store)?;
    let (s, st) = (&s, &staging);
    first_accepted(s, st, &index, COSIGN_SIG_TYPE, &digest, |v, p| {
        let payload = std::fs::read(p).map_err(|e| e.to_string())?;
        let named: Value = serde_json::from_slice(&payload).unwrap_or_default();
        if named["critical"]["image"]["docker-manifest-digest"] != digest.as_str() {
            return Err(format!(
                "its payload names {}, not this manifest",
                named["critical"]["image"]["docker-manifest-digest"]
            ));
        }
        let sig = v["layers"][0]["annotations"][SIG_ANNOTATION]
            .as_str()
            .unwrap_or("");
        key.verify_bytes(&payload, sig)
    })
    .await
    .map_err(|e| bad(format!("image signature: {e}")))?;
    let main = get_blob(s, st, &m, MAX_LAYER)
        .await
        .map_err(|e| bad(format!("the layer's file: {e}")))?;
    let sha = m["layers"][0]["digest"]
        .as_str()
        .unwrap_or("")
        .trim_start_matches("sha256:")
        .to_string();
    let raw = hex::decode(&sha).unwrap_or_default();
    let mut statement = Value::Null;
    let (att_v, att_p) = first_accepted(s, st, &index, crate::attest::IN_TOTO, &digest, |_, p| {
        let env = std::fs::read(p).map_err(|e| e.to_string())?;
        let payload = key.open_dsse(&env, crate::attest::IN_TOTO)?;
        statement = serde_json::from_slice(&payload).map_err(|e| e.to_string())?;
        Ok(())
    })
    .await
    .map_err(|e| bad(format!("provenance: {e}")))?;
    let (_, sig_p) = first_accepted(s, st, &index, BLOB_SIG_TYPE, &digest, |_, p| {
        let sig = std::fs::read_to_string(p).map_err(|_| "not text".to_string())?;
        key.verify_sha256(&raw, &sig)
    })
    .await
    .map_err(|e| bad(format!("file signature: {e}")))?;
    let byproducts = statement["predicate"]["runDetails"]["byproducts"].clone();
    let (sbom_v, sbom_p) = first_accepted(s, st, &index, SBOM_TYPE, &digest, |v, p| {
        let t = title(v, ".spdx.json")?;
        let want = byproducts
            .as_array()
            .and_then(|b| b.iter().find(|b| b["name"] == t.as_str()))
            .and_then(|b| b["digest"]["sha256"].as_str())
            .ok_or_else(|| format!("the provenance names no SBOM {t}"))?;
        let have = sha256_hex(&std::fs::read(p).map_err(|e| e.to_string())?);
        if have == want {
            Ok(())
        } else {
            Err(format!("sha256 {have}; the provenance names {want}"))
        }
    })
    .await
    .map_err(|e| bad(format!("SBOM: {e}")))?;
    // Every name a file gets comes from the signed statement, not from a title a registry
    // could change: the SBOM's is a byproduct the statement names (checked above), the
    // provenance files share its base, and the main file is the statement's first subject.
    let sbom_name = title(&sbom_v, ".spdx.json").map_err(|e| bad(format!("SBOM: {e}")))?;
    let base = sbom_name.trim_end_matches(".spdx.json").to_string();
    let dsse_name = format!("{base}.provenance.dsse.json");
    let titled = title(&att_v, ".provenance.dsse.json").unwrap_or_default();
    if titled != dsse_name || statement["subject"][0]["name"] != name {
        return Err(bad(format!(
            "the signed provenance is for {} with SBOM {sbom_name}; the registry names them {name:?} and {titled:?}",
            statement["subject"][0]["name"]
        )));
    }
    let place = |from: &Path, to: String| -> Result<PathBuf, RegistryError> {
        let p = dir.join(to);
        std::fs::rename(from, &p).map_err(|e| bad(format!("moving into {}: {e}", p.display())))?;
        Ok(p)
    };
    let files = LayerFiles {
        main: place(&main, name.to_string())?,
        sig: place(&sig_p, format!("{name}.sig"))?,
        provenance: dir.join(format!("{base}.provenance.json")),
        dsse: place(&att_p, dsse_name.clone())?,
        sbom: place(&sbom_p, sbom_name)?,
    };
    let _ = std::fs::remove_dir_all(dir.join(".staging"));
    Ok(PulledLayer {
        files,
        digest,
        sha256: sha,
    })
}
