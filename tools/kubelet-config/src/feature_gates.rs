//! The feature gates a v1.36 kubelet knows, and what it does with `featureGates`:
//! `SetFromMap` of component-base's `featuregate/feature_gate.go` (v0.36.0, commit
//! 5234ccbb, `unsafeSetFromMap`), which `cmd/kubelet/app/server.go` calls on the merged
//! configuration before it validates it, wrapping an error as
//! `failed to set feature gates from initial flags-based config: …`.
//!
//! The table (`feature_gates_1.36.tsv`, its sources in its header) holds each gate's
//! effective spec at 1.36: default, whether it is locked to that default, and its stage.

use std::collections::BTreeMap;
use std::sync::OnceLock;

/// One gate's spec at 1.36.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spec {
    /// Its default value.
    pub default: bool,
    /// `LockToDefault`: setting the other value is an error.
    pub locked: bool,
    /// `Alpha`, `Beta`, `GA` or `Deprecated`.
    pub stage: &'static str,
}

const TABLE: &str = include_str!("feature_gates_1.36.tsv");

/// Every gate by name.
pub fn known() -> &'static BTreeMap<&'static str, Spec> {
    static GATES: OnceLock<BTreeMap<&'static str, Spec>> = OnceLock::new();
    GATES.get_or_init(|| {
        TABLE
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let f: Vec<&'static str> = l.split('\t').collect();
                assert_eq!(f.len(), 4, "feature_gates_1.36.tsv: {l:?}");
                let spec = Spec {
                    default: f[1] == "true",
                    locked: f[2] == "true",
                    stage: f[3],
                };
                (f[0], spec)
            })
            .collect()
    })
}

/// What kubelet's `SetFromMap` does with `gates`: the error it returns (the first unknown
/// gate ends it at once; locked gates set to the other value are all reported), or the
/// warnings it logs for the GA and deprecated gates it was given, in name order (Go walks
/// the map in random order; a sorted walk gives one of the answers kubelet can give).
pub fn set_from_map(gates: &BTreeMap<String, bool>) -> Result<Vec<String>, String> {
    let known = known();
    let mut errs = Vec::new();
    let mut warnings = Vec::new();
    for (k, v) in gates {
        let Some(spec) = known.get(k.as_str()) else {
            return Err(format!("unrecognized feature gate: {k}"));
        };
        if spec.locked && spec.default != *v {
            errs.push(format!(
                "cannot set feature gate {k} to {v}, feature is locked to {}",
                spec.default
            ));
            continue;
        }
        let what = match spec.stage {
            "Deprecated" => "deprecated",
            "GA" => "GA",
            _ => continue,
        };
        warnings.push(format!(
            "\"Warning: setting {what} feature gate. It will be removed in a future release.\" featureGate=\"{k}\" value={v}"
        ));
    }
    match errs.len() {
        0 => Ok(warnings),
        1 => Err(errs.remove(0)),
        // utilerrors.NewAggregate's text for several errors.
        _ => Err(format!("[{}]", errs.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gates(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn the_table_is_whole() {
        let k = known();
        assert_eq!(k.len(), 242);
        let count = |stage: &str| k.values().filter(|s| s.stage == stage).count();
        assert_eq!(
            (
                count("Alpha"),
                count("Beta"),
                count("GA"),
                count("Deprecated")
            ),
            (50, 100, 76, 16)
        );
        assert_eq!(k.values().filter(|s| s.locked).count(), 76);
        assert!(k
            .values()
            .all(|s| !s.locked || matches!(s.stage, "GA" | "Deprecated")));
    }

    #[test]
    fn kubelets_answers() {
        assert_eq!(
            set_from_map(&gates(&[("Bogus", true)])),
            Err("unrecognized feature gate: Bogus".into())
        );
        assert_eq!(
            set_from_map(&gates(&[("NodeSwap", false)])),
            Err("cannot set feature gate NodeSwap to false, feature is locked to true".into())
        );
        assert_eq!(
            set_from_map(&gates(&[("NodeSwap", false), ("ImageMaximumGCAge", false)])),
            Err("[cannot set feature gate ImageMaximumGCAge to false, feature is locked to true, cannot set feature gate NodeSwap to false, feature is locked to true]".into())
        );
        let w = set_from_map(&gates(&[("NodeSwap", true), ("AllAlpha", false)])).unwrap();
        assert_eq!(
            w,
            ["\"Warning: setting GA feature gate. It will be removed in a future release.\" featureGate=\"NodeSwap\" value=true"]
        );
        assert_eq!(
            set_from_map(&gates(&[("KubeletCrashLoopBackOffMax", false)])),
            Ok(vec![])
        );
        let w = set_from_map(&gates(&[("GitRepoVolumeDriver", false)])).unwrap();
        assert!(w[0].contains("setting deprecated feature gate"), "{w:?}");
    }
}
