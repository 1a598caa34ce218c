//! The SBOM of a layer: SPDX 2.3 JSON. One package per artifact (with its upstream URL,
//! version and download sha256), one package for the layer, and every regular file with its
//! SHA1 (SPDX requires it) and sha256, linked to the artifact it came from. The hashes are
//! the ones computed while preparing the layer; nothing is read again here.

use serde_json::{json, Value};
use sha1::Digest as _;

use crate::bake::error::BakeError;
use crate::bake::layer::{civil, Layer, Node, Origin};

fn spdx_id(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// SPDX's package verification code: the SHA1 of the sorted lowercase SHA1 hex digests of
/// every file in the package, concatenated (SPDX 2.3, clause 7.9).
fn verification_code(layer: &Layer) -> String {
    let mut sums: Vec<&str> = layer
        .entries
        .values()
        .filter_map(|e| match &e.node {
            Node::File { sha1, .. } => Some(sha1.as_str()),
            _ => None,
        })
        .collect();
    sums.sort_unstable();
    let mut h = sha1::Sha1::new();
    for s in sums {
        h.update(s.as_bytes());
    }
    hex::encode(h.finalize())
}

/// Renders the SPDX document for `layer`.
#[allow(
    clippy::too_many_lines,
    reason = "one SPDX document written field by field in the order of the SPDX 2.3 specification, so the output can be read against it"
)]
pub fn spdx_json(layer: &Layer) -> Result<String, BakeError> {
    let (y, mo, d, h, mi, s) = civil(layer.epoch);
    let created = format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z");
    let layer_id = "SPDXRef-Layer";
    let mut packages = vec![json!({
        "SPDXID": layer_id,
        "name": format!("{}-{}", layer.name, layer.format),
        "versionInfo": layer.image_id,
        "downloadLocation": "NOASSERTION",
        // The layer CONTAINS its files, which SPDX allows only for an analysed package, and
        // an analysed package carries the verification code of its files.
        "filesAnalyzed": true,
        "packageVerificationCode": {"packageVerificationCodeValue": verification_code(layer)},
        "primaryPackagePurpose": "OPERATING-SYSTEM",
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "comment": format!("kiln {} layer for {}/{}", layer.format, layer.os, layer.arch),
    })];
    let mut rels = vec![json!({
        "spdxElementId": "SPDXRef-DOCUMENT",
        "relationshipType": "DESCRIBES",
        "relatedSpdxElement": layer_id,
    })];
    for a in &layer.artifacts {
        let id = format!("SPDXRef-Artifact-{}", spdx_id(&a.name));
        packages.push(json!({
            "SPDXID": id,
            "name": a.name,
            "versionInfo": a.version,
            "downloadLocation": download_location(&a.url),
            "filesAnalyzed": false,
            "checksums": [{"algorithm": "SHA256", "checksumValue": a.sha256}],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
        }));
        if download_location(&a.url) == NOASSERTION {
            if let Some(p) = packages.last_mut() {
                p["comment"] = json!(format!(
                    "downloaded from {} (SPDX tools accept only a host name as downloadLocation)",
                    crate::supply::fetch::shown(&a.url)
                ));
            }
        }
        rels.push(json!({
            "spdxElementId": layer_id,
            "relationshipType": "DEPENDS_ON",
            "relatedSpdxElement": id,
        }));
    }
    // Each baked image: the pinned digest, the platform's manifest digest, and a package URL
    // (purl `oci` type: the repository's last component, the digest as version).
    for img in &layer.images {
        let id = format!("SPDXRef-Image-{}", spdx_id(&img.name));
        let (repo, tag) = match crate::supply::lock_image::ImageRef::parse(&img.reference) {
            Ok(r) => (format!("{}/{}", r.host, r.repository), r.tag),
            Err(_) => (img.reference.clone(), None),
        };
        let last = repo.rsplit('/').next().unwrap_or(&repo);
        let mut purl = format!(
            "pkg:oci/{last}@{}?arch={}&repository_url={repo}",
            img.digest.replace(':', "%3A"),
            layer.arch
        );
        if let Some(t) = &tag {
            purl.push_str(&format!("&tag={t}"));
        }
        packages.push(json!({
            "SPDXID": id,
            "name": img.name,
            "versionInfo": img.digest,
            "downloadLocation": "NOASSERTION",
            "filesAnalyzed": false,
            "primaryPackagePurpose": "CONTAINER",
            "checksums": [{
                "algorithm": "SHA256",
                "checksumValue": img.digest.trim_start_matches("sha256:"),
            }],
            "externalRefs": [{
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": purl,
            }],
            "licenseConcluded": "NOASSERTION",
            "licenseDeclared": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "comment": format!(
                "container image {} pinned by {}; {}/{} manifest {}; baked as {}",
                img.reference, img.digest, layer.os, layer.arch, img.platform_digest, img.path
            ),
        }));
        rels.push(json!({
            "spdxElementId": layer_id,
            "relationshipType": "DEPENDS_ON",
            "relatedSpdxElement": id,
        }));
    }
    let mut files = Vec::new();
    for (i, (path, e)) in layer.entries.iter().enumerate() {
        let Node::File { sha256, sha1, .. } = &e.node else {
            continue;
        };
        let id = format!(
            "SPDXRef-File-{i}-{}",
            spdx_id(path.rsplit('/').next().unwrap_or(path))
        );
        let comment = match &e.origin {
            Origin::Artifact { name, member } => {
                let v = layer
                    .artifacts
                    .iter()
                    .find(|a| &a.name == name)
                    .map(|a| a.version.as_str())
                    .unwrap_or("?");
                rels.push(json!({
                    "spdxElementId": id,
                    "relationshipType": "GENERATED_FROM",
                    "relatedSpdxElement": format!("SPDXRef-Artifact-{}", spdx_id(name)),
                }));
                format!("artifact {name} {v}, member {member}")
            }
            Origin::Config(keys) => format!(
                "rendered by kiln from image definition keys: {}",
                keys.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            Origin::Kiln(what) => format!("written by kiln: {what}"),
            Origin::Image { name, digest } => {
                rels.push(json!({
                    "spdxElementId": id,
                    "relationshipType": "GENERATED_FROM",
                    "relatedSpdxElement": format!("SPDXRef-Image-{}", spdx_id(name)),
                }));
                format!("OCI archive of container image {name} {digest}")
            }
        };
        files.push(json!({
            "fileName": format!("./{path}"),
            "SPDXID": id,
            "checksums": [
                {"algorithm": "SHA1", "checksumValue": sha1},
                {"algorithm": "SHA256", "checksumValue": sha256},
            ],
            "licenseConcluded": "NOASSERTION",
            "copyrightText": "NOASSERTION",
            "comment": comment,
        }));
        rels.push(json!({
            "spdxElementId": layer_id,
            "relationshipType": "CONTAINS",
            "relatedSpdxElement": id,
        }));
    }
    let doc: Value = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("{}-{}", layer.base_name(), layer.format),
        "documentNamespace": format!(
            "https://kiln.invalid/spdx/{}/{}/{}/{}",
            layer.name,
            layer.format,
            layer.arch,
            layer.image_id.trim_start_matches("sha256:")
        ),
        "creationInfo": {
            "created": created,
            "creators": [format!("Tool: kiln-{}", env!("CARGO_PKG_VERSION"))],
        },
        "documentDescribes": [layer_id],
        "packages": packages,
        "files": files,
        "relationships": rels,
    });
    let mut s = serde_json::to_string_pretty(&doc).map_err(|e| BakeError::Tool {
        tool: "spdx".into(),
        detail: e.to_string(),
    })?;
    s.push('\n');
    Ok(s)
}

const NOASSERTION: &str = "NOASSERTION";

/// An artifact's lock URL as SPDX's `downloadLocation`, or `NOASSERTION` where the reference
/// validator (spdx-tools, `validate_url`) would refuse it: a host that is an IP address,
/// `localhost` or any name without a dot (a loopback or in-house mirror), or a URL carrying
/// credentials. The URL then goes into the package's comment, credentials masked.
fn download_location(url: &str) -> String {
    let host = url
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or(""))
        .unwrap_or("");
    let (creds, hostport) = match host.rsplit_once('@') {
        Some((_, h)) => (true, h),
        None => (false, host),
    };
    let name = match hostport.strip_prefix('[') {
        Some(_) => "",
        None => hostport.split(':').next().unwrap_or(""),
    };
    let dns = name.contains('.')
        && name.parse::<std::net::Ipv4Addr>().is_err()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    // A query may be a pre-signed URL's signature: such a URL is named in the comment, as
    // kiln prints it (query values masked), never in full.
    if dns && !creds && !url.contains('?') {
        url.to_string()
    } else {
        NOASSERTION.to_string()
    }
}

#[cfg(test)]
mod download_location_tests {
    use super::*;

    #[test]
    fn a_presigned_query_never_reaches_the_sbom() {
        assert_eq!(
            download_location("https://bucket.s3.example.com/kubelet?X-Amz-Signature=s3cr3t"),
            NOASSERTION
        );
    }

    #[test]
    fn only_urls_with_a_host_name_are_kept() {
        for (url, kept) in [
            ("https://dl.k8s.io/v1.36.1/bin/linux/amd64/kubelet", true),
            ("https://github.com:443/a/b.tar.gz", true),
            ("http://127.0.0.1:8080/containerd.tar.gz", false),
            ("http://[::1]:8080/x", false),
            ("http://localhost/x", false),
            ("http://mirror/x", false),
            ("https://u:p@dl.example.org/x", false),
            ("not a url", false),
        ] {
            let want = if kept { url } else { NOASSERTION };
            assert_eq!(download_location(url), want, "{url}");
        }
    }
}
