//! The provenance of a baked layer: an in-toto Statement v1 whose predicate is SLSA
//! Provenance v1 (<https://slsa.dev/spec/v1.0/provenance>), written beside the layer as
//! `<base>.provenance.json` and, with a signing key, signed as a DSSE envelope
//! ([`crate::attest`]). The subject is the layer's main file; every input that decides its
//! bytes is named with its sha256: the definition and the options that change bytes
//! (`externalParameters`), the lock, each lock entry and pinned image the layer carries, and
//! kiln-firstboot (`resolvedDependencies`). The start and end times are in `runDetails` only:
//! the layer's bytes (and its manifest, SBOM and SHA256SUMS) never depend on them.

use serde_json::{json, Value};

use crate::bake::images::ImageInput;
use crate::bake::layer::{civil, ArtifactInput};

/// `buildType`: what `externalParameters` and `internalParameters` mean, documented in
/// docs/bake.md ("Provenance").
pub const BUILD_TYPE: &str =
    "https://github.com/kiln-project/kiln/blob/main/docs/bake.md#provenance-v1";

/// The builder id when `--builder-id` names none: a kiln run on a machine that attests to
/// nothing about itself. A pipeline names its own (its CI system's runner identity).
pub const LOCAL_BUILDER: &str = "https://github.com/kiln-project/kiln#local";

/// A file named in the provenance with its digest.
#[derive(Debug, Clone)]
pub struct Named {
    /// How it is named: a path as given on the command line, or a file name.
    pub name: String,
    /// Its sha256, hex.
    pub sha256: String,
}

/// What a bake's provenance records.
#[derive(Debug)]
pub struct Facts<'a> {
    /// The layer's main file (the subject).
    pub subject: Named,
    /// The sha256 of the OCI manifest `kiln mirror push --layer` pushes the main file as
    /// (the second subject: `cosign verify-attestation` checks a subject is the manifest).
    pub oci_manifest: String,
    /// The image definition file.
    pub definition: Named,
    /// The signed lock.
    pub lock: Named,
    /// kiln-firstboot as shipped.
    pub firstboot: Named,
    /// `sysext`, `rootfs`, `windows`.
    pub format: &'a str,
    /// `amd64`, `arm64`.
    pub arch: &'a str,
    /// The definition's Kubernetes version as baked (after `--kubernetes-version`).
    pub kubernetes_version: &'a str,
    /// SOURCE_DATE_EPOCH as the bake used it.
    pub epoch: u64,
    /// `--sysext-ddi`: the sysext is a signed disk image.
    pub sysext_ddi: bool,
    /// The lock entries placed in the layer.
    pub artifacts: &'a [ArtifactInput],
    /// The pinned images the layer carries.
    pub images: &'a [ImageInput],
    /// The content-derived image id.
    pub image_id: &'a str,
    /// `builder.id`.
    pub builder_id: &'a str,
    /// The other files of the bake a verifier gets with the layer (the SBOM), as
    /// `runDetails.byproducts`.
    pub byproducts: &'a [Named],
    /// When the bake started and ended, seconds since the epoch.
    pub started: u64,
    /// See `started`.
    pub finished: u64,
}

fn rfc3339(t: u64) -> String {
    let (y, mo, d, h, mi, s) = civil(t);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

fn descriptor(name: &str, uri: Option<&str>, sha256: &str) -> Value {
    let mut v = json!({"name": name, "digest": {"sha256": sha256}});
    if let Some(u) = uri {
        v["uri"] = u.into();
    }
    v
}

/// The in-toto Statement v1 for `f`, as the JSON text written to disk (one document, keys
/// in a stable order, a final newline).
pub fn statement(f: &Facts<'_>) -> String {
    // `annotations.role` says what each dependency is to kiln (`kiln verify --rebuild`
    // finds the lock by it, whatever its file is called).
    let mut lock = descriptor(&f.lock.name, None, &f.lock.sha256);
    lock["annotations"] = json!({"role": "lock"});
    let mut firstboot = descriptor("kiln-firstboot", None, &f.firstboot.sha256);
    firstboot["annotations"] = json!({"role": "kiln-firstboot"});
    let mut deps = vec![lock, firstboot];
    for a in f.artifacts {
        // A lock URL may carry credentials or a pre-signed token; the provenance is
        // published, so it gets the URL as kiln prints it (user info and query values masked).
        let uri = crate::supply::fetch::shown(&a.url);
        let mut d = descriptor(&a.name, Some(uri.as_str()), &a.sha256);
        d["annotations"] = json!({"role": "artifact", "version": a.version});
        deps.push(d);
    }
    for img in f.images {
        let hex = img.digest.strip_prefix("sha256:").unwrap_or(&img.digest);
        let uri = format!("{}@{}", img.reference, img.digest);
        let mut d = descriptor(&img.name, Some(uri.as_str()), hex);
        d["annotations"] = json!({"role": "image", "platformManifest": img.platform_digest});
        deps.push(d);
    }
    let v = json!({
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [
            {"name": f.subject.name, "digest": {"sha256": f.subject.sha256}},
            {"name": format!("{} (OCI manifest)", f.subject.name), "digest": {"sha256": f.oci_manifest}},
        ],
        "predicateType": "https://slsa.dev/provenance/v1",
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "definition": {"path": f.definition.name, "sha256": f.definition.sha256},
                    "format": f.format,
                    "arch": f.arch,
                    "kubernetesVersion": f.kubernetes_version,
                    "sourceDateEpoch": f.epoch,
                    "sysextDdi": f.sysext_ddi,
                },
                "internalParameters": {
                    "kilnVersion": env!("CARGO_PKG_VERSION"),
                    "imageId": f.image_id,
                },
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": f.builder_id},
                "byproducts": f.byproducts.iter().map(|b| descriptor(&b.name, None, &b.sha256)).collect::<Vec<_>>(),
                "metadata": {
                    "startedOn": rfc3339(f.started),
                    "finishedOn": rfc3339(f.finished),
                },
            },
        },
    });
    let mut text = serde_json::to_string_pretty(&v).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statement_names_the_subject_and_every_input_with_its_digest() {
        let n = |name: &str, c: char| Named {
            name: name.into(),
            sha256: c.to_string().repeat(64),
        };
        let f = Facts {
            subject: n("ubuntu-v1-amd64.tar.zst", 'a'),
            oci_manifest: "f".repeat(64),
            definition: n("images/ubuntu.toml", 'b'),
            lock: n("artifacts.lock", 'c'),
            firstboot: n("kiln-firstboot", 'd'),
            format: "rootfs",
            arch: "amd64",
            kubernetes_version: "v1",
            epoch: 1_700_000_000,
            sysext_ddi: false,
            artifacts: &[],
            images: &[],
            image_id: "sha256:x",
            builder_id: LOCAL_BUILDER,
            byproducts: &[],
            started: 0,
            finished: 86_400,
        };
        let v: Value = serde_json::from_str(&statement(&f)).unwrap();
        let secret = ArtifactInput {
            name: "kubelet".into(),
            version: "v1".into(),
            url: "https://user:hunter2@mirror.example/kubelet?X-Amz-Signature=s3cr3t".into(),
            sha256: "e".repeat(64),
            kind: crate::bake::layer::InputKind::Binary,
            blob: "/nonexistent".into(),
            members: Vec::new(),
        };
        let text = statement(&Facts {
            artifacts: std::slice::from_ref(&secret),
            ..f
        });
        assert!(
            !text.contains("hunter2")
                && !text.contains("s3cr3t")
                && text.contains("mirror.example"),
            "{text}"
        );
        assert_eq!(v["_type"], "https://in-toto.io/Statement/v1");
        assert_eq!(v["subject"][0]["digest"]["sha256"], "a".repeat(64));
        assert_eq!(v["subject"][1]["digest"]["sha256"], "f".repeat(64));
        let p = &v["predicate"];
        assert_eq!(
            p["buildDefinition"]["externalParameters"]["definition"]["sha256"],
            "b".repeat(64)
        );
        let deps = p["buildDefinition"]["resolvedDependencies"]
            .as_array()
            .unwrap();
        assert_eq!(deps[0]["digest"]["sha256"], "c".repeat(64));
        assert_eq!(deps[1]["name"], "kiln-firstboot");
        assert_eq!(
            p["runDetails"]["metadata"]["finishedOn"],
            "1970-01-02T00:00:00Z"
        );
    }
}
