//! kubelet's drop-in directory (`--config-dir`), as kubernetes/kubernetes
//! `cmd/kubelet/app/server.go` reads it (`mergeKubeletConfigurations`,
//! `loadDropinConfigFileIntoJSON`, `kubeletConfigFlagPrecedence`; KEP-3983, beta and on by
//! default since 1.30, GA in 1.35):
//!
//! - `filepath.WalkDir` over the directory: every entry that is not a directory and whose
//!   name ends in `.conf`, in lexical order, descending into subdirectories where they
//!   sort; other files are skipped. A missing directory is an error.
//! - Each file is decoded to JSON as written (`DecodeKubeletConfigurationIntoJSON`, into an
//!   `Unstructured`): YAML or JSON with its `kind` and `apiVersion`; an empty file is an
//!   error. Unlike `--config`, an unknown field is not reported: it is carried into the
//!   merged JSON, which `json.Unmarshal` then decodes leniently, so kubelet drops it without
//!   a word. A wrong type fails the merge.
//! - Each file is applied with `jsonpatch.MergePatch` over the configuration so far, then
//!   the result is unmarshalled into the already-decoded configuration. Together that is:
//!   objects and maps merge key by key, at every depth (a drop-in's `evictionHard` adds to
//!   the base's thresholds, it does not replace them); lists and scalars replace; a `null`
//!   changes nothing (the patch's key is not the base's Go field name, so it deletes nothing).
//! - The base is the loaded `--config` (with `evictionHard` defaulted when the file left it
//!   out, `loadConfigFile`), else kubelet's defaults; command-line flags are parsed again
//!   afterwards and win over both.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// A drop-in's file name ends in this.
pub const EXTENSION: &str = ".conf";

/// kubelet's Linux `DefaultEvictionHard` (`pkg/kubelet/eviction/defaults_linux.go`), which
/// `loadConfigFile` puts in the base when the file has no `evictionHard`.
pub const DEFAULT_EVICTION_HARD: [(&str, &str); 4] = [
    ("memory.available", "100Mi"),
    ("nodefs.available", "10%"),
    ("nodefs.inodesFree", "5%"),
    ("imagefs.available", "15%"),
];

/// The drop-ins of `dir` in the order kubelet applies them, or kubelet's error text.
pub fn files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut out = Vec::new();
    walk(dir, &mut out).map_err(|e| {
        format!(
            "failed to walk through kubelet dropin directory {:?}: {e}",
            dir.display().to_string()
        )
    })?;
    Ok(out)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let go_err = |p: &Path, e: std::io::Error| {
        let what = match e.kind() {
            std::io::ErrorKind::NotFound => "no such file or directory".to_string(),
            std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
            _ => e.to_string(),
        };
        format!("open {}: {what}", p.display())
    };
    // WalkDir stats the root first: a missing one is `lstat D: no such file or directory`.
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| go_err(dir, e).replacen("open ", "lstat ", 1))?;
    if !meta.is_dir() && !std::fs::metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Err(format!("readdirent {}: not a directory", dir.display()));
    }
    let mut entries: Vec<(String, PathBuf, bool)> = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| go_err(dir, e))? {
        let e = e.map_err(|e| go_err(dir, e))?;
        // DirEntry.IsDir: the entry's own type; a symlink to a directory is not one.
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        entries.push((
            e.file_name().to_string_lossy().into_owned(),
            e.path(),
            is_dir,
        ));
    }
    entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    for (name, path, is_dir) in entries {
        if is_dir {
            walk(&path, out)?;
        } else if Path::new(&name).extension().is_some_and(|x| x == "conf") {
            out.push(path);
        }
    }
    Ok(())
}

/// One drop-in's text as kubelet takes it: its JSON tree, or the error after
/// `failed to load drop-in kubelet config file P, error `.
pub fn decode(text: &str) -> Result<Value, String> {
    if text.is_empty() {
        return Err("was empty".into());
    }
    let (value, dups) = crate::tree(text)?;
    if let Some(e) = crate::duplicate_keys_error(&dups) {
        // Strict YAML-to-JSON: no lenient retry for a drop-in.
        return Err(format!("failed to decode: strict decoding error: {e}"));
    }
    crate::type_meta(&value)?;
    Ok(value)
}

/// Reads and decodes the drop-in at `path`, wrapping errors as kubelet does.
pub fn load(path: &Path) -> Result<Value, String> {
    let p = path.display();
    // loadDropinConfigFileIntoJSON returns LoadIntoJSON's error as it is; the walk's
    // callback names the file.
    let wrap = |e: String| format!("failed to load kubelet dropin file, path: {p}, error: {e}");
    let data = std::fs::read(path).map_err(|e| {
        wrap(format!(
            "failed to read kubelet config file \"{p}\", error: open {p}: {e}"
        ))
    })?;
    if data.is_empty() {
        return Err(wrap(format!("kubelet config file \"{p}\" was empty")));
    }
    decode(&String::from_utf8_lossy(&data)).map_err(wrap)
}

/// Applies one drop-in over `base` with kubelet's rules (module docs).
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (_, Value::Null) => {}
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    continue;
                }
                match b.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        b.insert(k.clone(), pruned(v));
                    }
                }
            }
        }
        (b, p) => *b = pruned(p),
    }
}

/// A value with the `null` members of its objects dropped, as `MergePatch` writes a new key.
fn pruned(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), pruned(v)))
                .collect::<Map<String, Value>>(),
        ),
        other => other.clone(),
    }
}

/// The base a drop-in directory merges into: the `--config` tree (`None`: no file, kubelet's
/// defaults) with `evictionHard` defaulted as `loadConfigFile` does.
pub fn base(config_tree: Option<Value>) -> Value {
    let mut base = config_tree.unwrap_or_else(|| Value::Object(Map::new()));
    if let Value::Object(m) = &mut base {
        let unset = m.get("evictionHard").is_none_or(Value::is_null);
        if unset {
            let defaults: Map<String, Value> = DEFAULT_EVICTION_HARD
                .iter()
                .map(|(k, v)| ((*k).to_string(), Value::String((*v).to_string())))
                .collect();
            m.insert("evictionHard".into(), Value::Object(defaults));
        }
    }
    base
}

/// Merges every drop-in of `dir` over `base`, in kubelet's order; `Err` is the text after
/// kubelet's `failed to merge kubelet configs: `.
pub fn merge_dir(mut base: Value, dir: &Path) -> Result<(Value, Vec<PathBuf>), String> {
    let files = files(dir)?;
    for f in &files {
        let patch = load(f).map_err(|e| {
            format!(
                "failed to walk through kubelet dropin directory {:?}: {e}",
                dir.display().to_string()
            )
        })?;
        merge(&mut base, &patch);
    }
    Ok((base, files))
}

/// The merged tree as kubelet's `json.Unmarshal` takes it: unknown fields dropped without a
/// word, a wrong type an error (after `failed to merge kubelet configs: `).
pub fn unmarshal(merged: Value) -> Result<crate::KubeletConfiguration, String> {
    crate::typed(merged)
        .map(|(config, _unknown)| config)
        .map_err(|e| format!("failed to unmarshal merged JSON into kubelet configuration: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn objects_merge_lists_and_scalars_replace_null_changes_nothing() {
        let mut b = json!({
            "maxPods": 110,
            "clusterDNS": ["10.96.0.10", "10.96.0.11"],
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%"},
            "authentication": {"webhook": {"enabled": true}, "x509": {"clientCAFile": "/ca"}},
        });
        merge(
            &mut b,
            &json!({
                "maxPods": 50,
                "clusterDNS": ["fd00::a"],
                "evictionHard": {"memory.available": "200Mi"},
                "authentication": {"webhook": {"enabled": false}},
                "cgroupDriver": null,
                "featureGates": {"A": true, "B": null},
            }),
        );
        assert_eq!(
            b,
            json!({
                "maxPods": 50,
                "clusterDNS": ["fd00::a"],
                "evictionHard": {"memory.available": "200Mi", "nodefs.available": "10%"},
                "authentication": {"webhook": {"enabled": false}, "x509": {"clientCAFile": "/ca"}},
                "featureGates": {"A": true},
            })
        );
        // A null where the base has a value keeps the value.
        merge(&mut b, &json!({"maxPods": null}));
        assert_eq!(b["maxPods"], 50);
    }

    #[test]
    fn the_base_gets_kubelets_default_eviction_thresholds() {
        let b = base(Some(json!({"kind": "KubeletConfiguration"})));
        assert_eq!(b["evictionHard"]["imagefs.available"], "15%");
        let b = base(Some(json!({"evictionHard": {"memory.available": "1Gi"}})));
        assert_eq!(b["evictionHard"], json!({"memory.available": "1Gi"}));
    }

    #[test]
    fn the_walk_is_lexical_recursive_and_takes_only_conf_files() {
        let d = std::env::temp_dir().join(format!("kiln-dropin-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("20-dir.conf")).unwrap();
        for f in [
            "30-z.conf",
            "10-a.conf",
            "20-dir.conf/05-in.conf",
            "15-x.yaml",
            "9.conf",
        ] {
            std::fs::write(d.join(f), "x").unwrap();
        }
        let got: Vec<String> = files(&d)
            .unwrap()
            .iter()
            .map(|p| p.strip_prefix(&d).unwrap().display().to_string())
            .collect();
        assert_eq!(
            got,
            ["10-a.conf", "20-dir.conf/05-in.conf", "30-z.conf", "9.conf"]
        );
        let e = files(&d.join("missing")).unwrap_err();
        assert!(e.contains("no such file or directory"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_drop_in_needs_its_type_meta_and_no_repeated_keys() {
        let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        assert!(decode(&format!("{head}maxPods: 3\n")).is_ok());
        assert!(decode("maxPods: 3\n")
            .unwrap_err()
            .contains("'Kind' is missing"));
        assert!(decode("").unwrap_err().contains("empty"));
        let e = decode(&format!("{head}maxPods: 3\nmaxPods: 4\n")).unwrap_err();
        assert!(e.contains("key \"maxPods\" already set in map"), "{e}");
        // Unknown fields pass the decode and vanish in the unmarshal; wrong types do not.
        let v = decode(&format!("{head}maxPodz: 3\n")).unwrap();
        assert!(unmarshal(v).is_ok());
        let v = decode(&format!("{head}maxPods: \"3\"\n")).unwrap();
        assert!(unmarshal(v)
            .unwrap_err()
            .starts_with("failed to unmarshal merged JSON"));
    }
}
