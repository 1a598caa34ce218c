//! The store as an OCI image layout: the `oci-layout` marker and `index.json`, whose entries
//! are the pinned images (annotated with `org.opencontainers.image.ref.name`), so `skopeo`
//! (`oci:DIR:REF`) and `umoci` read a kiln store or mirror directly. Also the walk that checks
//! a stored image is complete (`kiln mirror verify`).

use std::path::Path;

use serde_json::{json, Value};

use super::manifest::{self, Parsed};
use crate::supply::lock_image::{digest_hex, Image};
use crate::supply::store::{write_atomic, Store, StoreError};

/// The marker file of an OCI image layout.
pub const LAYOUT_FILE: &str = "oci-layout";
/// The layout's index.
pub const INDEX_FILE: &str = "index.json";
/// The annotation naming an index entry.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_path_buf();
    move |source| StoreError::Io {
        action,
        path,
        source,
    }
}

/// Records a pulled image in `index.json` (replacing an entry of the same ref name, keeping
/// the others) and writes the `oci-layout` marker if missing. Both are written atomically,
/// under the store's `index.json` lock so concurrent syncs never drop each other's entries.
pub fn record(store: &Store, image: &Image, media_type: &str, size: u64) -> Result<(), StoreError> {
    store.locked(INDEX_FILE, || record_locked(store, image, media_type, size))?
}

fn record_locked(
    store: &Store,
    image: &Image,
    media_type: &str,
    size: u64,
) -> Result<(), StoreError> {
    let root = store.root();
    let marker = root.join(LAYOUT_FILE);
    if !marker.is_file() {
        write_atomic(&marker, b"{\"imageLayoutVersion\":\"1.0.0\"}\n")?;
    }
    let path = root.join(INDEX_FILE);
    let mut manifests: Vec<Value> = match std::fs::read(&path) {
        Ok(b) => serde_json::from_slice::<Value>(&b)
            .ok()
            .and_then(|v| v.get("manifests").and_then(|m| m.as_array()).cloned())
            .unwrap_or_default(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io("reading", &path)(e)),
    };
    manifests.retain(|m| {
        m.pointer("/annotations/org.opencontainers.image.ref.name")
            .and_then(|r| r.as_str())
            != Some(image.reference.as_str())
    });
    manifests.push(json!({
        "mediaType": media_type,
        "digest": image.digest,
        "size": size,
        "annotations": { REF_NAME: image.reference },
    }));
    manifests.sort_by_key(|m| {
        m.pointer("/annotations/org.opencontainers.image.ref.name")
            .and_then(|r| r.as_str())
            .unwrap_or_default()
            .to_string()
    });
    let doc = json!({
        "schemaVersion": 2,
        "mediaType": manifest::OCI_INDEX,
        "manifests": manifests,
    });
    let mut bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    bytes.push(b'\n');
    // Readable by the tools that serve or read the layout, like the blobs.
    write_atomic(&path, &bytes)?;
    set_mode_644(&path);
    set_mode_644(&marker);
    Ok(())
}

#[cfg(unix)]
fn set_mode_644(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644));
}

#[cfg(not(unix))]
fn set_mode_644(_: &Path) {}

/// Reads a stored manifest or index (at most [`manifest::MAX_MANIFEST`] bytes) and parses it.
pub fn read_manifest(store: &Store, digest: &str) -> Result<(Parsed, u64), String> {
    let hex = digest_hex(digest).ok_or_else(|| format!("not a sha256 digest: {digest:?}"))?;
    let path = store.blob_path(hex);
    let len = std::fs::metadata(&path)
        .map_err(|_| format!("manifest {digest} is missing"))?
        .len();
    if len > manifest::MAX_MANIFEST {
        return Err(format!(
            "manifest {digest} is {len} bytes, over the {} byte limit",
            manifest::MAX_MANIFEST
        ));
    }
    let bytes = std::fs::read(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    manifest::parse(&bytes, "").map(|p| (p, len))
}

/// What of `image` is missing from the store (empty when complete): the index, each pinned
/// platform's manifest, config and layers. Digests are not re-hashed here (`verify` does).
pub fn missing(store: &Store, image: &Image) -> Vec<String> {
    let mut out = Vec::new();
    let (root, _) = match read_manifest(store, &image.digest) {
        Ok(r) => r,
        Err(e) => return vec![format!("{}: {e}", image.id())],
    };
    let manifests: Vec<String> = match &root {
        Parsed::Index { manifests, .. } => image
            .platforms
            .iter()
            .filter_map(|p| match manifest::select(manifests, p.os, p.arch) {
                Ok(d) => Some(d.digest.clone()),
                Err(e) => {
                    out.push(format!("{}: {e}", image.id()));
                    None
                }
            })
            .collect(),
        Parsed::Manifest { .. } => vec![image.digest.clone()],
    };
    for m in manifests {
        match read_manifest(store, &m) {
            Ok((Parsed::Manifest { config, layers, .. }, _)) => {
                for d in std::iter::once(&config).chain(&layers) {
                    if !store.contains(d.hex()) {
                        out.push(format!("{}: blob {} is missing", image.id(), d.digest));
                    }
                }
            }
            Ok((Parsed::Index { .. }, _)) => {
                out.push(format!("{}: {m} is an index inside an index", image.id()))
            }
            Err(e) => out.push(format!("{}: {e}", image.id())),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supply::lock_image::ImagePlatform;
    use crate::supply::names::{Arch, Os};

    fn image(i: usize) -> Image {
        Image {
            name: format!("i{i}"),
            reference: format!("registry.example/r{i}:t"),
            digest: format!("sha256:{}", format!("{i:02}").repeat(32)),
            verified: "t".into(),
            platforms: vec![ImagePlatform {
                os: Os::Linux,
                arch: Arch::Amd64,
                digest: None,
            }],
        }
    }

    #[test]
    fn concurrent_records_keep_every_entry() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        std::thread::scope(|s| {
            for i in 0..16 {
                let store = store.clone();
                s.spawn(move || record(&store, &image(i), manifest::OCI_INDEX, 10).unwrap());
            }
        });
        // Re-recording one replaces it rather than adding a second entry.
        record(&store, &image(3), manifest::OCI_INDEX, 11).unwrap();
        let v: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join(INDEX_FILE)).unwrap()).unwrap();
        let m = v["manifests"].as_array().unwrap();
        assert_eq!(m.len(), 16);
        let r3: Vec<_> = m
            .iter()
            .filter(|e| e["annotations"][REF_NAME] == "registry.example/r3:t")
            .collect();
        assert_eq!(r3.len(), 1);
        assert_eq!(r3[0]["size"], 11);
        assert!(dir.path().join(LAYOUT_FILE).is_file());
    }
}
