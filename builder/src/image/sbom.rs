//! The SBOM of a node image `kiln image` wrote: SPDX 2.3 JSON, `OUT.spdx.json` beside OUT.
//!
//! It describes OUT as a package built from two inputs: the base disk image (its sha256, taken
//! while the layer is installed) and the layer file (its sha256). What the layer holds is
//! not repeated: the bake's own SBOM of the layer (`<layer stem>.spdx.json` beside it) is an
//! external document reference, pinned by its SHA1 as SPDX requires (SPDX 2.3, clause 6.6),
//! and OUT `CONTAINS` its layer package. A layer without its SBOM beside it is still listed,
//! with a comment saying the contents are not described. The node config's files, if any,
//! are named, never their contents. `created` is `SOURCE_DATE_EPOCH` (or the bake's default),
//! so the same inputs give the same document.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::digest::{hash_file, Sums};
use crate::image::error::{io_err, ImageError};

/// What the SBOM says about one run.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// OUT.
    pub out: &'a Path,
    /// OUT's format name (`qcow2`, `raw`, …).
    pub format: &'a str,
    /// The base, its format and the sha256 of its bytes.
    pub base: &'a Path,
    /// The base's format as qemu-img named it.
    pub base_format: &'a str,
    /// sha256 of the base file.
    pub base_sha256: &'a str,
    /// The root partition written.
    pub partition: u32,
    /// The layer file.
    pub layer: &'a Path,
    /// Its sha256 as the install verified it (hashed here when the install did not say).
    pub layer_sha256: Option<&'a str>,
    /// The layer's image id, if it has one.
    pub image_id: Option<&'a str>,
    /// Paths of the node config's files written into the image.
    pub node_files: &'a [String],
}

/// The bake's SBOM of `layer`: `<stem>.spdx.json` beside it, where the stem drops
/// `.tar.zst` (rootfs) or `.raw` (sysext).
pub fn layer_sbom_path(layer: &Path) -> PathBuf {
    let name = layer
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let stem = name
        .strip_suffix(".tar.zst")
        .or_else(|| name.strip_suffix(".raw"))
        .unwrap_or(&name);
    layer.with_file_name(format!("{stem}.spdx.json"))
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

fn created() -> String {
    let epoch =
        crate::layer_contract::epoch_from_env().unwrap_or(crate::layer_contract::DEFAULT_EPOCH);
    let (y, mo, d, h, mi, s) = crate::layer_contract::civil(epoch);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// The most of a layer SBOM kiln reads (a bake's is a few MiB for a few thousand files).
const MAX_LAYER_SBOM: u64 = 256 << 20;

fn read_capped(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Non-blocking open, then only a regular file is read: a FIFO there never holds the run.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other(
            "expected the layer's SBOM as a regular file, found something else",
        ));
    }
    let mut bytes = Vec::new();
    f.take(MAX_LAYER_SBOM + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_LAYER_SBOM {
        return Err(std::io::Error::other(format!(
            "expected the layer's SBOM, at most {MAX_LAYER_SBOM} bytes; found a larger file"
        )));
    }
    Ok(bytes)
}

/// Renders the document.
pub fn spdx_json(i: &Inputs<'_>) -> Result<String, ImageError> {
    let layer_sha256 = match i.layer_sha256 {
        Some(h) => h.to_string(),
        None => {
            hash_file(i.layer, Sums::Sha256)
                .map_err(io_err(i.layer))?
                .sha256
        }
    };
    let sbom_path = layer_sbom_path(i.layer);
    let layer_doc: Option<(String, String)> = match read_capped(&sbom_path) {
        Ok(bytes) => {
            let doc: Value = serde_json::from_slice(&bytes).map_err(|e| ImageError::Io {
                path: sbom_path.clone(),
                source: std::io::Error::other(format!(
                    "expected the layer's SPDX JSON document, found unparsable JSON: {e}"
                )),
            })?;
            let ns = doc["documentNamespace"].as_str().unwrap_or_default();
            if ns.is_empty() {
                return Err(ImageError::Io {
                    path: sbom_path,
                    source: std::io::Error::other(
                        "expected an SPDX document with a documentNamespace, found none",
                    ),
                });
            }
            let sha1 = hash_file(&sbom_path, Sums::Sha256AndSha1)
                .map_err(io_err(&sbom_path))?
                .sha1
                .unwrap_or_default();
            Some((ns.to_string(), sha1))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io_err(&sbom_path)(e)),
    };
    let image = "SPDXRef-NodeImage";
    let base = "SPDXRef-Base";
    let layer = "SPDXRef-LayerFile";
    let mut comment = format!(
        "kiln image: the layer {} applied to partition {} of the base {}",
        file_name(i.layer),
        i.partition,
        file_name(i.base)
    );
    if !i.node_files.is_empty() {
        comment.push_str(&format!(
            "; node config files written (contents not listed): {}",
            i.node_files.join(", ")
        ));
    }
    let packages = vec![
        json!({
            "SPDXID": image,
            "name": file_name(i.out),
            "versionInfo": i.image_id.unwrap_or("NOASSERTION"),
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": false,
            "primaryPackagePurpose": "OPERATING-SYSTEM",
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "comment": format!("{comment}; disk format {}", i.format),
        }),
        json!({
            "SPDXID": base,
            "name": file_name(i.base),
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": false,
            "checksums": [{"algorithm": "SHA256", "checksumValue": i.base_sha256}],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "comment": format!("the base disk image ({})", i.base_format),
        }),
        json!({
            "SPDXID": layer,
            "name": file_name(i.layer),
            "versionInfo": i.image_id.unwrap_or("NOASSERTION"),
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": false,
            "checksums": [{"algorithm": "SHA256", "checksumValue": layer_sha256}],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "comment": match &layer_doc {
                Some(_) => format!("the kiln layer; its contents: DocumentRef-layer ({})", file_name(&sbom_path)),
                None => format!("the kiln layer; its contents are not described here ({} was not beside it)", file_name(&sbom_path)),
            },
        }),
    ];
    let mut rels = vec![
        json!({"spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": image}),
        json!({"spdxElementId": image, "relationshipType": "DESCENDANT_OF", "relatedSpdxElement": base}),
        json!({"spdxElementId": image, "relationshipType": "GENERATED_FROM", "relatedSpdxElement": layer}),
    ];
    let mut doc = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{}-kiln-image", file_name(i.out)),
        "documentNamespace": format!(
            "https://kiln.invalid/spdx/image/{}/{}",
            i.base_sha256,
            layer_sha256
        ),
        "creationInfo": {
            "created": created(),
            "creators": [format!("Tool: kiln-{}", env!("CARGO_PKG_VERSION"))],
        },
        "documentDescribes": [image],
        "packages": packages,
    });
    if let Some((ns, sha1)) = layer_doc {
        doc["externalDocumentRefs"] = json!([{
            "externalDocumentId": "DocumentRef-layer",
            "spdxDocument": ns,
            "checksum": {"algorithm": "SHA1", "checksumValue": sha1},
        }]);
        rels.push(json!({
            "spdxElementId": image,
            "relationshipType": "CONTAINS",
            "relatedSpdxElement": "DocumentRef-layer:SPDXRef-Layer",
        }));
    }
    doc["relationships"] = Value::Array(rels);
    let mut s = serde_json::to_string_pretty(&doc).map_err(|e| ImageError::Tool {
        tool: "spdx".into(),
        why: e.to_string(),
    })?;
    s.push('\n');
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layer_sbom_is_beside_the_layer_by_stem() {
        assert_eq!(
            layer_sbom_path(Path::new("/o/ubuntu-v1.36.1-amd64.tar.zst")),
            Path::new("/o/ubuntu-v1.36.1-amd64.spdx.json")
        );
        assert_eq!(
            layer_sbom_path(Path::new("/o/kubernetes-v1.36.1-x86-64.raw")),
            Path::new("/o/kubernetes-v1.36.1-x86-64.spdx.json")
        );
    }
}
