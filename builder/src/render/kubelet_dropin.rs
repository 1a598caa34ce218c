//! The node's KubeletConfiguration drop-in (`/etc/kiln/kubelet-dropin.conf`): made from
//! `kubelet.config_file` and the inline `[kubelet.config]` table, checked with the rules the
//! stand-in kubelet runs with (`kiln-kubelet-config`, one owner), written as JSON.
//!
//! kubelet merges it over the image's config file and kiln-firstboot's per-node drop-in
//! (docs/contract.md, "kubelet's configuration"). In a drop-in kubelet drops an unknown field
//! without a word (`dropin.rs`), so an unknown field is refused here, where someone reads
//! the error. Fields kiln decides per node are refused too, each naming the key that sets it:
//! two owners of one value would make status.json or the node.toml key wrong.

use kiln_kubelet_config::{dropin, validate, API_VERSION, KIND};
use serde_json::{Map, Value};

/// Fields kiln-firstboot writes in the node's own drop-in, and where each is set instead.
pub const OWNED: &[(&str, &str)] = &[
    (
        "containerRuntimeEndpoint",
        "the image's CONTAINER_RUNTIME_ENDPOINT (its runtime is baked)",
    ),
    ("providerID", "the metadata service (kiln-firstboot)"),
    ("maxPods", "`node.max_pods`"),
    ("registerWithTaints", "`node.taints`"),
    ("clusterDNS", "`kubelet.cluster_dns`"),
    ("serverTLSBootstrap", "`kubelet.server_tls_bootstrap`"),
    (
        "kubeReserved",
        "`node.kube_reserved` (over the image's RESERVATION formula; status.json reports what kubelet gets)",
    ),
    (
        "systemReserved",
        "`node.system_reserved` (over the image's RESERVATION formula; status.json reports what kubelet gets)",
    ),
    (
        "evictionHard",
        "`node.eviction_hard` (over the image's RESERVATION formula; status.json reports what kubelet gets)",
    ),
];

/// One input of the drop-in: what node.toml calls it, and its JSON tree.
#[derive(Debug)]
pub struct Part<'a> {
    /// The node.toml key, for errors.
    pub key: &'a str,
    /// The document.
    pub tree: Value,
}

/// Why a drop-in is refused: the node.toml key, what was expected and what was found.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The node.toml key (and the field inside it).
    pub key: String,
    /// What was expected.
    pub expected: String,
    /// What was found.
    pub found: String,
}

fn refuse(
    key: impl Into<String>,
    expected: impl Into<String>,
    found: impl Into<String>,
) -> Refusal {
    Refusal {
        key: key.into(),
        expected: expected.into(),
        found: found.into(),
    }
}

/// A `config_file`'s text as a part: YAML or JSON, its type meta kubelet's, no repeated key.
pub fn file_part<'a>(key: &'a str, text: &str) -> Result<Part<'a>, Refusal> {
    let expected = "a KubeletConfiguration drop-in (apiVersion: kubelet.config.k8s.io/v1beta1)";
    let tree = dropin::decode(text).map_err(|e| refuse(key, expected, e))?;
    Ok(Part { key, tree })
}

/// The inline table as a part: its fields as written, the type meta added.
pub fn table_part<'a>(key: &'a str, table: &toml::Table) -> Result<Part<'a>, Refusal> {
    let mut tree = serde_json::to_value(table).map_err(|e| {
        refuse(
            key,
            "KubeletConfiguration fields (no TOML dates)",
            e.to_string(),
        )
    })?;
    if let Value::Object(m) = &mut tree {
        for (k, want) in [("apiVersion", API_VERSION), ("kind", KIND)] {
            match m.get(k) {
                None => {
                    m.insert(k.into(), Value::String(want.into()));
                }
                Some(Value::String(s)) if s == want => {}
                Some(other) => {
                    return Err(refuse(
                        format!("{key}.{k}"),
                        format!("{want:?} or nothing"),
                        other.to_string(),
                    ))
                }
            }
        }
    }
    Ok(Part { key, tree })
}

/// Merges the parts in order (kubelet's rules), checks the result and renders it: `None`
/// when there is nothing to write.
pub fn render(parts: Vec<Part<'_>>) -> Result<Option<Vec<u8>>, Refusal> {
    let Some(first) = parts.first().map(|p| p.key.to_string()) else {
        return Ok(None);
    };
    let mut merged = Value::Object(Map::new());
    for part in &parts {
        check_part(part)?;
        dropin::merge(&mut merged, &part.tree);
    }
    let key = if parts.len() == 1 {
        first
    } else {
        parts.iter().map(|p| p.key).collect::<Vec<_>>().join(" + ")
    };
    let (config, _) = kiln_kubelet_config::typed(merged.clone())
        .map_err(|e| refuse(&key, "KubeletConfiguration field types", e))?;
    // Over kubelet's defaults: the image's config is not known at render time, and the node's
    // own drop-in sets only the fields refused above.
    let errs = validate::validate(&config);
    if !errs.is_empty() {
        return Err(refuse(
            &key,
            "a configuration kubelet's validation accepts (over kubelet's defaults)",
            validate::aggregate(&errs),
        ));
    }
    validate::run_checks(&config).map_err(|e| refuse(&key, "values kubelet can parse", e))?;
    if let Some(gates) = &config.feature_gates {
        kiln_kubelet_config::feature_gates::set_from_map(gates).map_err(|e| {
            refuse(
                format!("{key}.featureGates"),
                "gates a v1.36 kubelet knows, locked ones at their value (kubelet refuses the rest before it starts)",
                e,
            )
        })?;
    }
    let mut out = serde_json::to_string_pretty(&merged).expect("JSON of a JSON tree");
    out.push('\n');
    Ok(Some(out.into_bytes()))
}

/// Fields that hold credentials: the drop-in is world-readable (0644) on the node and in
/// user data, so they are refused, and their values never reach an error message.
pub const SECRET_FIELDS: &[&str] = &["staticPodURLHeader"];

fn check_part(part: &Part<'_>) -> Result<(), Refusal> {
    let Value::Object(m) = &part.tree else {
        return Err(refuse(part.key, "a mapping", "another kind of value"));
    };
    for field in SECRET_FIELDS {
        if m.contains_key(*field) {
            return Err(refuse(
                format!("{}.{field}", part.key),
                format!("no {field}: it holds request headers (credentials), and the drop-in is world-readable on the node; bake it into the image's config file, or have the provisioner write a root-only file"),
                format!("{field} set (its value is not shown)"),
            ));
        }
    }
    for (field, owner) in OWNED {
        if m.get(*field).is_some_and(|v| !v.is_null()) {
            return Err(refuse(
                format!("{}.{field}", part.key),
                format!("no {field}: kiln sets it per node from {owner}"),
                format!("{field} set"),
            ));
        }
    }
    let (_, unknown) = kiln_kubelet_config::typed(part.tree.clone())
        .map_err(|e| refuse(part.key, "KubeletConfiguration field types", e))?;
    if let Some(field) = unknown.first() {
        return Err(refuse(
            format!("{}.{field}", part.key),
            "a KubeletConfiguration v1beta1 field (kubelet ignores an unknown one in a drop-in without a word)",
            format!("unknown field {field:?}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

    fn file(body: &str) -> Result<Option<Vec<u8>>, Refusal> {
        render(vec![file_part(
            "kubelet.config_file",
            &format!("{HEAD}{body}"),
        )?])
    }

    #[test]
    fn feature_gates_are_kubelets() {
        for (gates, want) in [
            ("  Bogus: true\n", "unrecognized feature gate: Bogus"),
            (
                "  NodeSwap: false\n",
                "cannot set feature gate NodeSwap to false, feature is locked to true",
            ),
        ] {
            let e = file(&format!("featureGates:\n{gates}")).unwrap_err();
            assert_eq!(e.key, "kubelet.config_file.featureGates");
            assert_eq!(e.found, want);
        }
        assert!(file("featureGates:\n  NodeSwap: true\n").is_ok());
    }

    #[test]
    fn a_file_and_a_table_merge_as_kubelet_merges_them() {
        let table: toml::Table =
            toml::from_str("imageGCHighThresholdPercent = 90\n[featureGates]\nKubeletCrashLoopBackOffMax = false\n")
                .unwrap();
        let parts = vec![
            file_part(
                "kubelet.config_file",
                &format!("{HEAD}imageGCHighThresholdPercent: 80\nimageGCLowThresholdPercent: 70\nfeatureGates:\n  AllAlpha: true\n"),
            )
            .unwrap(),
            table_part("kubelet.config", &table).unwrap(),
        ];
        let out = String::from_utf8(render(parts).unwrap().unwrap()).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["imageGCHighThresholdPercent"], 90);
        assert_eq!(v["imageGCLowThresholdPercent"], 70);
        assert_eq!(
            v["featureGates"],
            serde_json::json!({"AllAlpha": true, "KubeletCrashLoopBackOffMax": false})
        );
        assert_eq!(v["kind"], "KubeletConfiguration");
    }

    #[test]
    fn what_kubelet_would_drop_or_refuse_is_refused_here() {
        let e = file("maxPodz: 3\n").unwrap_err();
        assert_eq!(e.key, "kubelet.config_file.maxPodz");
        let e = file("authentication:\n  webhok: {}\n").unwrap_err();
        assert_eq!(e.key, "kubelet.config_file.authentication.webhok");
        let e = file("imageGCHighThresholdPercent: 101\n").unwrap_err();
        assert!(e.found.contains("must be between 0 and 100"), "{e:?}");
        let e = file("kubeAPIQPS: \"ten\"\n").unwrap_err();
        assert!(e.found.contains("invalid type: string"), "{e:?}");
        let e =
            file("imageGCHighThresholdPercent: 80\nimageGCHighThresholdPercent: 81\n").unwrap_err();
        assert!(e.found.contains("already set in map"), "{e:?}");
        // No type meta, or another kind: not a drop-in kubelet loads.
        assert!(file_part("kubelet.config_file", "imageGCHighThresholdPercent: 3\n").is_err());
        assert!(file_part("k", "kind: Config\napiVersion: v1\n").is_err());
    }

    #[test]
    fn fields_kiln_sets_per_node_name_their_key() {
        for (field, owner) in OWNED {
            let e = file(&format!("{field}: null\n"));
            assert!(e.is_ok(), "a null sets nothing: {field}");
            let table: toml::Table = toml::from_str(&format!("{field} = 1")).unwrap();
            let e = render(vec![table_part("kubelet.config", &table).unwrap()]).unwrap_err();
            assert_eq!(e.key, format!("kubelet.config.{field}"));
            assert!(e.expected.contains(owner), "{e:?}");
        }
    }

    #[test]
    fn credentials_are_refused_and_never_echoed() {
        let secret = "Bearer s3cr3t-t0ken";
        for body in [
            format!("staticPodURLHeader:\n  Authorization: [\"{secret}\"]\n"),
            // A wrong type would have serde quote the value.
            format!("staticPodURLHeader:\n  Authorization: \"{secret}\"\n"),
        ] {
            let e = file(&body).unwrap_err();
            assert_eq!(e.key, "kubelet.config_file.staticPodURLHeader");
            let shown = format!("{e:?}");
            assert!(!shown.contains("s3cr3t"), "{shown}");
        }
    }

    #[test]
    fn nothing_given_writes_nothing() {
        assert_eq!(render(Vec::new()), Ok(None));
        let t: toml::Table = toml::from_str("apiVersion = \"v1\"").unwrap();
        assert_eq!(
            table_part("kubelet.config", &t).unwrap_err().key,
            "kubelet.config.apiVersion"
        );
    }
}
