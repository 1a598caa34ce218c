//! A baked layer in a registry repository, with what proves it attached as OCI 1.1
//! referrers (issue 39): `kiln mirror push --layer` and `kiln mirror sync --from oci://
//! --layer`.
//!
//! The layer is an OCI artifact ([`LAYER_TYPE`], the empty config, one layer whose bytes are
//! the main file) tagged `layer-<file name>`. Its manifest's bytes depend only on the file's
//! name, size and sha256 ([`layer_manifest`]), so `kiln bake` names the manifest's digest in
//! the provenance before anything is pushed. Four manifests refer to it (`subject`):
//!
//! - the image signature as cosign writes it (`cosign sign`, `--registry-referrers-mode
//!   oci-1-1`): config media type [`COSIGN_SIG_TYPE`], one simple-signing layer whose
//!   annotation holds the signature, also tagged `sha256-<hex>.sig` (cosign's own tag);
//! - the provenance attestation as `cosign attest` writes it: one DSSE layer with the
//!   `predicateType` annotation, also tagged `sha256-<hex>.att`;
//! - the SBOM ([`SBOM_TYPE`]) and the main file's own signature ([`BLOB_SIG_TYPE`]).
//!
//! A registry with the referrers API states `OCI-Subject` when it stores a manifest with a
//! subject; when it does not, the referrers tag schema (distribution-spec 1.1, "Referrers Tag
//! Schema") lists them in an index tagged `sha256-<hex>`, which kiln reads back and extends.

use serde_json::{json, Value};

use super::oci_mirror::{artifact_manifest, EMPTY_TYPE, FILE_LAYER};

/// `artifactType` of a baked layer.
pub const LAYER_TYPE: &str = "application/vnd.kiln.layer.v1";
/// The config media type of cosign's OCI 1.1 image signature.
pub const COSIGN_SIG_TYPE: &str = "application/vnd.dev.cosign.artifact.sig.v1+json";
/// cosign's signed payload.
pub const SIMPLE_SIGNING: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// The annotation cosign keeps a signature in.
pub const SIG_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// A DSSE envelope layer (cosign's attestations).
pub const DSSE_LAYER: &str = "application/vnd.dsse.envelope.v1+json";
/// The SBOM's `artifactType` and layer.
pub const SBOM_TYPE: &str = "application/spdx+json";
/// The main file's signature (`<main>.sig`, for `cosign verify-blob`).
pub const BLOB_SIG_TYPE: &str = "application/vnd.kiln.layer.signature.v1";
/// An OCI image config (cosign's attestation manifests).
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const TITLE: &str = "org.opencontainers.image.title";
const SLSA: &str = "https://slsa.dev/provenance/v1";

/// The manifest a layer whose main file is `name` (`size` bytes, sha256 `hex`) is pushed as.
pub fn layer_manifest(name: &str, hex: &str, size: u64) -> Vec<u8> {
    artifact_manifest(
        LAYER_TYPE,
        &[(FILE_LAYER, &format!("sha256:{hex}"), size, name)],
        &[],
    )
}

/// The sha256 (hex) of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The tag of the layer whose main file is `name`.
pub fn layer_tag(name: &str) -> String {
    super::target::tag_of(&["layer", name])
}

/// cosign's simple-signing payload for manifest `digest` in `repository` (`HOST/REPO`).
pub fn simple_signing(repository: &str, digest: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "critical": {
            "identity": {"docker-reference": repository},
            "image": {"docker-manifest-digest": digest},
            "type": "cosign container image signature",
        },
        "optional": null,
    }))
    .unwrap_or_default()
}

/// The image config cosign gives its signature and attestation manifests (it names the
/// one layer as the rootfs); deterministic bytes.
pub fn cosign_config(layer_digest: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "architecture": "",
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "config": {},
    }))
    .unwrap_or_default()
}

/// One referrer: its manifest bytes and the blobs it names (`digest`, bytes).
#[derive(Debug)]
pub struct Referrer {
    /// What it is, for messages.
    pub what: &'static str,
    /// The cosign tag it also goes under, if any.
    pub tag: Option<String>,
    /// The manifest.
    pub manifest: Vec<u8>,
    /// The config and layer blobs.
    pub blobs: Vec<(String, Vec<u8>)>,
    /// Its `artifactType` as the referrers index lists it.
    pub artifact_type: String,
}

fn digest_of(b: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(b))
}

fn referrer_manifest(
    artifact_type: Option<&str>,
    config: (&str, &[u8]),
    layer: (&str, &[u8], Value),
    subject: (&str, u64),
) -> Vec<u8> {
    let mut doc = json!({
        "schemaVersion": 2,
        "mediaType": super::manifest::OCI_MANIFEST,
        "config": {"mediaType": config.0, "digest": digest_of(config.1), "size": config.1.len()},
        "layers": [{"mediaType": layer.0, "digest": digest_of(layer.1), "size": layer.1.len(),
                    "annotations": layer.2}],
        "subject": {"mediaType": super::manifest::OCI_MANIFEST, "digest": subject.0, "size": subject.1},
    });
    if let Some(t) = artifact_type {
        doc["artifactType"] = t.into();
    }
    serde_json::to_vec(&doc).unwrap_or_default()
}

/// What a layer's referrers are made of.
#[derive(Debug)]
pub struct Proofs<'a> {
    /// The layer manifest's digest and size.
    pub subject: (&'a str, u64),
    /// The simple-signing payload and its signature (base64).
    pub image_signature: (Vec<u8>, String),
    /// The provenance's DSSE envelope and its file name.
    pub envelope: (&'a [u8], &'a str),
    /// The SBOM and its file name.
    pub sbom: (&'a [u8], &'a str),
    /// The main file's signature and its file name.
    pub blob_signature: (&'a [u8], &'a str),
}

/// The four referrers of a layer, in the order they are pushed.
pub fn referrers(p: &Proofs<'_>) -> Vec<Referrer> {
    let tag = |suffix: &str| {
        let hex = p.subject.0.trim_start_matches("sha256:");
        Some(format!("sha256-{hex}.{suffix}"))
    };
    let empty = (EMPTY_TYPE, super::oci_mirror::EMPTY);
    let mut out = Vec::new();
    let (payload, sig) = &p.image_signature;
    let config = cosign_config(&digest_of(payload));
    out.push(Referrer {
        what: "the image signature",
        tag: tag("sig"),
        manifest: referrer_manifest(
            None,
            (COSIGN_SIG_TYPE, &config),
            (SIMPLE_SIGNING, payload, json!({ SIG_ANNOTATION: sig })),
            p.subject,
        ),
        blobs: vec![
            (digest_of(&config), config.clone()),
            (digest_of(payload), payload.clone()),
        ],
        artifact_type: COSIGN_SIG_TYPE.into(),
    });
    let config = cosign_config(&digest_of(p.envelope.0));
    out.push(Referrer {
        what: "the provenance attestation",
        tag: tag("att"),
        manifest: referrer_manifest(
            Some(crate::attest::IN_TOTO),
            (OCI_CONFIG, &config),
            (
                DSSE_LAYER,
                p.envelope.0,
                json!({ SIG_ANNOTATION: "", "predicateType": SLSA, TITLE: p.envelope.1 }),
            ),
            p.subject,
        ),
        blobs: vec![
            (digest_of(&config), config.clone()),
            (digest_of(p.envelope.0), p.envelope.0.to_vec()),
        ],
        artifact_type: crate::attest::IN_TOTO.into(),
    });
    for (what, t, (bytes, name)) in [
        ("the SBOM", SBOM_TYPE, p.sbom),
        (
            "the layer's file signature",
            BLOB_SIG_TYPE,
            p.blob_signature,
        ),
    ] {
        out.push(Referrer {
            what,
            tag: None,
            manifest: referrer_manifest(
                Some(t),
                empty,
                (t, bytes, json!({ TITLE: name })),
                p.subject,
            ),
            blobs: vec![
                (digest_of(empty.1), empty.1.to_vec()),
                (digest_of(bytes), bytes.to_vec()),
            ],
            artifact_type: t.into(),
        });
    }
    out
}

/// The referrers index tagged `sha256-<hex>` with `added` merged in (by digest; the first
/// entry of a digest wins), for a registry without the referrers API.
pub fn merged_index(existing: Option<&[u8]>, added: &[Value]) -> Result<Vec<u8>, String> {
    let mut entries: Vec<Value> = match existing {
        None => Vec::new(),
        Some(b) => {
            let v: Value = serde_json::from_slice(b)
                .map_err(|e| format!("the referrers tag holds no index (JSON: {e})"))?;
            v["manifests"]
                .as_array()
                .cloned()
                .ok_or("the referrers tag holds no index (no manifests)")?
        }
    };
    for a in added {
        if !entries.iter().any(|e| e["digest"] == a["digest"]) {
            entries.push(a.clone());
        }
    }
    serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": super::manifest::OCI_INDEX,
        "manifests": entries,
    }))
    .map_err(|e| e.to_string())
}

/// A referrers index entry for `r`.
pub fn index_entry(r: &Referrer) -> Value {
    json!({
        "mediaType": super::manifest::OCI_MANIFEST,
        "digest": digest_of(&r.manifest),
        "size": r.manifest.len(),
        "artifactType": r.artifact_type,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_manifest_depends_on_name_size_and_digest_only() {
        let a = layer_manifest("x.raw", &"a".repeat(64), 5);
        assert_eq!(a, layer_manifest("x.raw", &"a".repeat(64), 5));
        assert_ne!(a, layer_manifest("y.raw", &"a".repeat(64), 5));
        let v: Value = serde_json::from_slice(&a).unwrap();
        assert_eq!(v["artifactType"], LAYER_TYPE);
        assert_eq!(v["layers"][0]["size"], 5);
    }

    #[test]
    fn the_referrers_index_keeps_what_others_listed_and_adds_each_digest_once() {
        let first = merged_index(None, &[json!({"digest": "sha256:1"})]).unwrap();
        let both = merged_index(
            Some(&first),
            &[json!({"digest": "sha256:1"}), json!({"digest": "sha256:2"})],
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&both).unwrap();
        assert_eq!(v["manifests"].as_array().unwrap().len(), 2);
        assert!(merged_index(Some(b"[1]"), &[]).is_err());
    }
}
