//! OCI and Docker manifests and indexes: the media types kiln asks for and accepts, and a
//! strict reading of the few fields it uses (descriptors' digest, size, media type and
//! platform). Anything else (schema 1, an unknown media type, a digest that is not a
//! `sha256:<hex>`, a negative or huge size) is refused with the reason.

use serde::Deserialize;

use crate::supply::lock_image::digest_hex;
use crate::supply::names::{Arch, Os};

/// OCI image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Docker manifest list.
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker image manifest (schema 2).
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// The `Accept` header for manifest requests: every kind kiln reads.
pub const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.list.v2+json, application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/// The largest manifest or index kiln reads (registries cap theirs at 4 MiB too).
pub const MAX_MANIFEST: u64 = 4 << 20;

/// The largest single blob a manifest may declare (a sanity bound, not a budget).
pub const MAX_BLOB: u64 = 64 << 30;

/// A platform as an index states it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Platform {
    /// `linux`, `windows`, …
    pub os: String,
    /// `amd64`, `arm64`, …
    pub architecture: String,
}

#[derive(Debug, Deserialize)]
struct RawDescriptor {
    #[serde(rename = "mediaType", default)]
    media_type: String,
    digest: String,
    size: i64,
    #[serde(default)]
    platform: Option<Platform>,
}

#[derive(Debug, Deserialize)]
struct RawManifest {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    #[serde(rename = "mediaType", default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<Vec<RawDescriptor>>,
    #[serde(default)]
    config: Option<RawDescriptor>,
    #[serde(default)]
    layers: Option<Vec<RawDescriptor>>,
}

/// A checked descriptor: the digest is `sha256:<hex>` and the size within bounds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    /// Its media type.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its platform (index entries only).
    pub platform: Option<Platform>,
}

impl Descriptor {
    /// The lowercase hex of the digest.
    pub fn hex(&self) -> &str {
        self.digest.strip_prefix("sha256:").unwrap_or(&self.digest)
    }
}

/// What a manifest document is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// An OCI index or Docker manifest list: its media type and entries.
    Index {
        /// The media type.
        media_type: String,
        /// The entries, in document order.
        manifests: Vec<Descriptor>,
    },
    /// An image manifest: its media type, config and layers.
    Manifest {
        /// The media type.
        media_type: String,
        /// The config blob.
        config: Descriptor,
        /// The layers, in order.
        layers: Vec<Descriptor>,
    },
}

fn check(d: RawDescriptor, max: u64, what: &str) -> Result<Descriptor, String> {
    if digest_hex(&d.digest).is_none() {
        return Err(format!(
            "{what}: digest: expected sha256: and 64 lowercase hex digits, found {:?}",
            d.digest
        ));
    }
    if d.size < 0 || d.size as u64 > max {
        return Err(format!(
            "{what} {}: size: expected 0 to {max} bytes, found {}",
            d.digest, d.size
        ));
    }
    Ok(Descriptor {
        media_type: d.media_type,
        digest: d.digest,
        size: d.size as u64,
        platform: d.platform,
    })
}

/// Parses a manifest or index. `content_type` is the HTTP `Content-Type` (or empty); the
/// document's own `mediaType`, when present, must agree with it.
pub fn parse(bytes: &[u8], content_type: &str) -> Result<Parsed, String> {
    let raw: RawManifest = serde_json::from_slice(bytes)
        .map_err(|e| format!("not an OCI/Docker manifest (JSON): {e}"))?;
    if raw.schema_version != 2 {
        return Err(format!(
            "schemaVersion: expected 2, found {} (schema 1 manifests are not supported)",
            raw.schema_version
        ));
    }
    let ct = content_type.split(';').next().unwrap_or("").trim();
    let media_type = match (raw.media_type.as_deref(), ct) {
        (Some(m), c) if !c.is_empty() && c != m && c != "application/json" => {
            return Err(format!(
                "mediaType {m:?} disagrees with the Content-Type {c:?}"
            ))
        }
        (Some(m), _) => m.to_string(),
        (None, c) if !c.is_empty() && c != "application/json" => c.to_string(),
        // OCI allows leaving mediaType out: the shape decides.
        (None, _) if raw.manifests.is_some() => OCI_INDEX.to_string(),
        (None, _) => OCI_MANIFEST.to_string(),
    };
    match media_type.as_str() {
        OCI_INDEX | DOCKER_LIST => {
            let list = raw
                .manifests
                .ok_or_else(|| format!("{media_type}: no `manifests` list"))?;
            let manifests = list
                .into_iter()
                .map(|d| check(d, MAX_MANIFEST, "manifests[]"))
                .collect::<Result<_, _>>()?;
            Ok(Parsed::Index {
                media_type,
                manifests,
            })
        }
        OCI_MANIFEST | DOCKER_MANIFEST => {
            let config = check(
                raw.config
                    .ok_or_else(|| format!("{media_type}: no `config`"))?,
                MAX_MANIFEST,
                "config",
            )?;
            let layers = raw
                .layers
                .unwrap_or_default()
                .into_iter()
                .map(|d| check(d, MAX_BLOB, "layers[]"))
                .collect::<Result<_, _>>()?;
            Ok(Parsed::Manifest {
                media_type,
                config,
                layers,
            })
        }
        other => Err(format!(
            "media type {other:?} is not an OCI index, Docker manifest list, OCI manifest or Docker manifest"
        )),
    }
}

/// The index entry for `os`/`arch` (any variant). More than one entry for a platform is
/// refused: which one would be pinned would be a guess.
pub fn select(manifests: &[Descriptor], os: Os, arch: Arch) -> Result<&Descriptor, String> {
    let mut hits = manifests.iter().filter(|d| {
        d.platform
            .as_ref()
            .is_some_and(|p| p.os == os.as_str() && p.architecture == arch.as_str())
    });
    let first = hits
        .next()
        .ok_or_else(|| format!("the index has no manifest for {os}/{arch}"))?;
    if hits.next().is_some() {
        return Err(format!(
            "the index has more than one manifest for {os}/{arch}"
        ));
    }
    if first.media_type != OCI_MANIFEST && first.media_type != DOCKER_MANIFEST {
        return Err(format!(
            "the {os}/{arch} entry {} has media type {:?}, expected an image manifest",
            first.digest, first.media_type
        ));
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(h: char) -> String {
        format!("sha256:{}", h.to_string().repeat(64))
    }

    #[test]
    fn index_and_manifest() {
        let idx = format!(
            r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[{{"mediaType":"{OCI_MANIFEST}","digest":"{}","size":10,"platform":{{"os":"linux","architecture":"arm64","variant":"v8"}}}}]}}"#,
            d('a')
        );
        let Parsed::Index { manifests, .. } = parse(idx.as_bytes(), OCI_INDEX).unwrap() else {
            panic!()
        };
        assert_eq!(manifests[0].hex(), "a".repeat(64));
        assert_eq!(
            manifests[0].platform.as_ref().unwrap().architecture,
            "arm64"
        );
        let m = format!(
            r#"{{"schemaVersion":2,"config":{{"mediaType":"x","digest":"{}","size":2}},"layers":[{{"mediaType":"y","digest":"{}","size":3}}]}}"#,
            d('b'),
            d('c')
        );
        let Parsed::Manifest { layers, .. } = parse(m.as_bytes(), DOCKER_MANIFEST).unwrap() else {
            panic!()
        };
        assert_eq!(layers[0].size, 3);
    }

    #[test]
    fn hostile_manifests_are_refused() {
        let traversal =
            r#"{"schemaVersion":2,"config":{"digest":"sha256:../../x","size":2},"layers":[]}"#;
        assert!(parse(traversal.as_bytes(), "")
            .unwrap_err()
            .contains("digest"));
        let neg = format!(
            r#"{{"schemaVersion":2,"config":{{"digest":"{}","size":-1}},"layers":[]}}"#,
            d('a')
        );
        assert!(parse(neg.as_bytes(), "").unwrap_err().contains("size"));
        let big = format!(
            r#"{{"schemaVersion":2,"config":{{"digest":"{}","size":99999999999}},"layers":[]}}"#,
            d('a')
        );
        assert!(parse(big.as_bytes(), "").unwrap_err().contains("size"));
        let s1 = r#"{"schemaVersion":1,"fsLayers":[]}"#;
        assert!(parse(s1.as_bytes(), "").unwrap_err().contains("schema 1"));
        let odd = r#"{"schemaVersion":2,"mediaType":"text/html"}"#;
        assert!(parse(odd.as_bytes(), "").unwrap_err().contains("text/html"));
        let liar = format!(r#"{{"schemaVersion":2,"mediaType":"{OCI_INDEX}","manifests":[]}}"#);
        assert!(parse(liar.as_bytes(), OCI_MANIFEST)
            .unwrap_err()
            .contains("disagrees"));
        assert!(parse(b"\xff", "").is_err());
    }
}
