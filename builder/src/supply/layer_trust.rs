//! Whether a baked layer is what its signatures and provenance say, checked before kiln
//! publishes it (`kiln mirror push --layer`), brings it in (`kiln mirror sync --from oci://
//! --layer`) or applies it (`kiln install --verify-key`), issue 39.
//!
//! A layer is its main file plus what `kiln bake --attest-key` wrote beside it: `<main>.sig`
//! (the main file's signature), `<base>.provenance.dsse.json` (the signed provenance) and
//! `<base>.spdx.json`. [`check`] says which check failed: a signature by another key, a
//! provenance whose subject is not this file, a provenance naming a lock entry or image the
//! signed lock does not have.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::attest::{VerifyKey, IN_TOTO};
use crate::supply::lock::Lock;

/// The most a provenance, its envelope, an SBOM or a signature file may be.
pub const MAX_SIDE_FILE: u64 = 16 << 20;

/// A baked layer's files.
#[derive(Debug, Clone)]
pub struct LayerFiles {
    /// The main file (`.raw`, `.tar.zst`, `.zip`).
    pub main: PathBuf,
    /// `<main>.sig`.
    pub sig: PathBuf,
    /// `<base>.provenance.json`.
    pub provenance: PathBuf,
    /// `<base>.provenance.dsse.json`.
    pub dsse: PathBuf,
    /// `<base>.spdx.json`.
    pub sbom: PathBuf,
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// The provenance `explicit` names, else the `*.provenance.json` beside `layer` whose first
/// subject is the layer's file name; with its parsed statement.
pub fn find_provenance(layer: &Path, explicit: Option<&Path>) -> Result<(PathBuf, Value), String> {
    let read = |p: &Path| -> Result<Value, String> {
        let text = crate::bounded_read::read_text(p, MAX_SIDE_FILE)
            .map_err(|e| format!("reading provenance {}: {e}", p.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("parsing provenance {}: {e}", p.display()))
    };
    if let Some(p) = explicit {
        return Ok((p.to_path_buf(), read(p)?));
    }
    let dir = layer
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let want = file_name(layer);
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("listing {}: {e}", dir.display()))?
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| file_name(p).ends_with(".provenance.json"))
        .collect();
    found.sort();
    for p in found {
        let v = read(&p)?;
        if v["subject"][0]["name"] == want.as_str() {
            return Ok((p, v));
        }
    }
    Err(format!(
        "no provenance for {} in {}: expected a *.provenance.json whose subject is {want:?} \
         (kiln bake writes it beside the layer)",
        layer.display(),
        dir.display()
    ))
}

impl LayerFiles {
    /// The files `kiln bake` wrote beside `main` (found by the provenance whose subject it is).
    pub fn beside(main: &Path) -> Result<LayerFiles, String> {
        let (provenance, _) = find_provenance(main, None)?;
        let base = file_name(&provenance)
            .trim_end_matches(".provenance.json")
            .to_string();
        let dir = provenance.parent().unwrap_or(Path::new(".")).to_path_buf();
        let mut sig = main.as_os_str().to_owned();
        sig.push(".sig");
        Ok(LayerFiles {
            main: main.to_path_buf(),
            sig: PathBuf::from(sig),
            dsse: dir.join(format!("{base}.provenance.dsse.json")),
            sbom: dir.join(format!("{base}.spdx.json")),
            provenance,
        })
    }
}

/// A layer refused: which file and which check (exit 3).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Untrusted(pub String);

impl Untrusted {
    /// Always a verification failure.
    pub fn exit_class(&self) -> crate::exit::ExitClass {
        crate::exit::ExitClass::Verify
    }
}

/// What [`check`] found true.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The main file's sha256 (hex).
    pub sha256: String,
    /// The provenance statement the envelope carries.
    pub statement: Vec<u8>,
    /// How many lock entries and images the provenance names (all in the lock).
    pub dependencies: usize,
}

/// Checks `files` with `key` against `lock`: the main file is a regular file whose signature
/// is `key`'s; the provenance envelope is signed by `key`, its statement is SLSA provenance
/// whose subject is the main file's sha256; every lock entry and pinned image it names is in
/// `lock` with the same digest. Each refusal names the file and the check.
pub fn check(files: &LayerFiles, key: &VerifyKey, lock: &Lock) -> Result<Checked, Untrusted> {
    check_inner(files, key, lock, None).map_err(Untrusted)
}

/// [`check`] of a main file whose sha256 was verified while it was written (a layer pulled
/// against a signed manifest's digest): not hashed again.
pub fn check_known(
    files: &LayerFiles,
    key: &VerifyKey,
    lock: &Lock,
    sha256: &str,
) -> Result<Checked, Untrusted> {
    check_inner(files, key, lock, Some(sha256)).map_err(Untrusted)
}

fn check_inner(
    files: &LayerFiles,
    key: &VerifyKey,
    lock: &Lock,
    known: Option<&str>,
) -> Result<Checked, String> {
    let main = &files.main;
    let meta = std::fs::metadata(main).map_err(|e| format!("layer {}: {e}", main.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "layer {}: expected a regular file, found a {}",
            main.display(),
            crate::bounded_read::type_name(&meta)
        ));
    }
    let side = |p: &Path, what: &str| -> Result<Vec<u8>, String> {
        crate::bounded_read::read_regular(p, MAX_SIDE_FILE).map_err(|e| {
            format!(
                "{what} {}: {e} (kiln bake --attest-key writes it beside the layer)",
                p.display()
            )
        })
    };
    let sig = String::from_utf8(side(&files.sig, "layer signature")?)
        .map_err(|_| format!("layer signature {}: not text", files.sig.display()))?;
    let sha256 = match known {
        Some(s) => s.to_string(),
        None => {
            crate::digest::hash_file(main, crate::digest::Sums::Sha256)
                .map_err(|e| format!("hashing {}: {e}", main.display()))?
                .sha256
        }
    };
    let raw = hex::decode(&sha256).unwrap_or_default();
    key.verify_sha256(&raw, &sig).map_err(|e| {
        format!(
            "layer signature {}: {e} ({} was signed by another key, or changed after it was signed)",
            files.sig.display(),
            main.display()
        )
    })?;
    let env = side(&files.dsse, "provenance envelope")?;
    let statement = key
        .open_dsse(&env, IN_TOTO)
        .map_err(|e| format!("provenance envelope {}: {e}", files.dsse.display()))?;
    let v: Value = serde_json::from_slice(&statement).map_err(|e| {
        format!(
            "provenance envelope {}: the statement is not JSON: {e}",
            files.dsse.display()
        )
    })?;
    let shown = files.dsse.display();
    if v["_type"] != "https://in-toto.io/Statement/v1"
        || v["predicateType"] != "https://slsa.dev/provenance/v1"
    {
        return Err(format!(
            "provenance envelope {shown}: expected an in-toto Statement v1 of SLSA provenance v1, found _type {} predicateType {}",
            v["_type"], v["predicateType"]
        ));
    }
    let subjects = v["subject"].as_array().cloned().unwrap_or_default();
    if !subjects
        .iter()
        .any(|s| s["digest"]["sha256"] == sha256.as_str())
    {
        return Err(format!(
            "provenance envelope {shown}: its subject is not {} (sha256 {sha256}): it names {}",
            main.display(),
            subjects
                .iter()
                .map(|s| format!("{} {}", s["name"], s["digest"]["sha256"]))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    check_byproducts(&v, files).map_err(|e| format!("provenance envelope {shown}: {e}"))?;
    let dependencies =
        check_dependencies(&v, lock).map_err(|e| format!("provenance envelope {shown}: {e}"))?;
    Ok(Checked {
        sha256,
        statement,
        dependencies,
    })
}

/// The SBOM beside the layer, when there is one, is the byproduct the statement `v` names.
fn check_byproducts(v: &Value, files: &LayerFiles) -> Result<(), String> {
    let name = file_name(&files.sbom);
    let Some(want) = v["predicate"]["runDetails"]["byproducts"]
        .as_array()
        .and_then(|b| b.iter().find(|b| b["name"] == name.as_str()))
        .and_then(|b| b["digest"]["sha256"].as_str())
    else {
        return Ok(());
    };
    let Ok(bytes) = crate::bounded_read::read_regular(&files.sbom, MAX_SIDE_FILE) else {
        return Ok(());
    };
    let have = crate::supply::registry::layer_oci::sha256_hex(&bytes);
    if have == want {
        Ok(())
    } else {
        Err(format!(
            "it names SBOM {name} with sha256 {want}; {} has {have}",
            files.sbom.display()
        ))
    }
}

/// Every `artifact` and `image` dependency of the statement `v` is in `lock`: an artifact by
/// name, version and sha256, an image by name and digest. Returns how many there are.
pub fn check_dependencies(v: &Value, lock: &Lock) -> Result<usize, String> {
    let deps = v["predicate"]["buildDefinition"]["resolvedDependencies"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut n = 0;
    for d in &deps {
        let name = d["name"].as_str().unwrap_or("");
        let sha = d["digest"]["sha256"].as_str().unwrap_or("");
        match d["annotations"]["role"].as_str() {
            Some("artifact") => {
                let version = d["annotations"]["version"].as_str().unwrap_or("");
                if !lock
                    .artifacts
                    .iter()
                    .any(|a| a.name == name && a.version == version && a.sha256 == sha)
                {
                    return Err(format!(
                        "it names lock entry {name} {version} (sha256 {sha}), which the signed lock does not have: the layer was baked from another lock"
                    ));
                }
            }
            Some("image") => {
                let digest = format!("sha256:{sha}");
                if !lock
                    .images
                    .iter()
                    .any(|i| i.name == name && i.digest == digest)
                {
                    return Err(format!(
                        "it names image {name}@{digest}, which the signed lock does not pin"
                    ));
                }
            }
            _ => continue,
        }
        n += 1;
    }
    Ok(n)
}
