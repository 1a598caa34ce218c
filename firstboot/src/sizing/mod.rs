//! Node sizing at boot: max pods from the image's CNI mode (and, on AWS, the baked ENI table),
//! and kubelet's kube-reserved, system-reserved and hard-eviction thresholds from the image's
//! named formula, the machine's real CPU count and memory, and the max pods just decided.
//! Formulas and sources: `docs/contract.md#sizing`. Everything here is a pure function of its
//! arguments except [`read_machine`], which reads `/sys` and `/proc` under a root.

mod machine;
mod pods;
mod reserved;
mod table;

pub use machine::*;
pub use pods::*;
pub use reserved::*;
pub use table::*;

use crate::contract::envfile::EnvFile;
use crate::contract::sizing::{self as key, CniMode, Formula, CNI_MODE_EXPECTED, FORMULA_EXPECTED};
use crate::contract::{image_env, node_env, paths};
use std::fmt::Write as _;

// ---------------------------------------------------------------------------------------------
// The image's and the operator's settings, and the decision.

/// The sizing settings of image.env and node.env, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// `MAX_PODS_MODE`; `None` when image.env does not set it (an image baked before sizing):
    /// `max-pods.map`, then `DEFAULT_MAX_PODS`, as before.
    pub mode: Option<CniMode>,
    /// `RESERVATION` (default `none` for such an image).
    pub formula: Formula,
    /// image.env's `KUBE_RESERVED`, `SYSTEM_RESERVED`, `EVICTION_HARD` (for `fixed`).
    pub fixed: Reserved,
    /// node.env's values of the same keys, each overriding one value.
    pub overrides: Reserved,
}

/// A sizing value that is not acceptable: the key and what it must look like.
pub type Invalid = (&'static str, &'static str);

impl Settings {
    /// Reads the settings from image.env and node.env.
    pub fn from_env(image: &EnvFile, node: &EnvFile) -> Result<Settings, (bool, Invalid)> {
        let img = |e| (true, e);
        let mode = match image.non_empty(key::MAX_PODS_MODE) {
            None => None,
            Some(v) => Some(CniMode::parse(v).ok_or(img((key::MAX_PODS_MODE, CNI_MODE_EXPECTED)))?),
        };
        let formula = match image.non_empty(key::RESERVATION) {
            None => Formula::None,
            Some(v) => Formula::parse(v).ok_or(img((key::RESERVATION, FORMULA_EXPECTED)))?,
        };
        Ok(Settings {
            mode,
            formula,
            fixed: Reserved::from_env(image).map_err(img)?,
            overrides: Reserved::from_env(node).map_err(|e| (false, e))?,
        })
    }
}

/// What was decided for this node: max pods, the machine, the reservations, and warnings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizing {
    /// Max pods and how it was decided.
    pub max_pods: MaxPods,
    /// The machine, when it could be read.
    pub machine: Option<Machine>,
    /// The formula applied.
    pub formula: Formula,
    /// The reservations after node.env's overrides.
    pub reserved: Reserved,
    /// Everything a default had to stand in for, one sentence each.
    pub warnings: Vec<String>,
}

/// The inputs of one decision besides the settings.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// node.env's `MAX_PODS`.
    pub max_pods_override: Option<u32>,
    /// `max-pods.map`'s entry for the instance type.
    pub map_entry: Option<u32>,
    /// `DEFAULT_MAX_PODS`.
    pub default_max_pods: u32,
    /// The instance type from metadata.
    pub instance_type: &'a str,
    /// The machine, or why it could not be read.
    pub machine: Result<Machine, &'a str>,
    /// The AWS table's text, when the image has one.
    pub table: Option<&'a str>,
}

/// Decides max pods (node.env `MAX_PODS`, else `max-pods.map`, else the image's mode, else
/// `DEFAULT_MAX_PODS`) and then the reservations from it.
pub fn decide(s: &Settings, i: Inputs<'_>) -> Sizing {
    let mut warnings = Vec::new();
    let machine = match i.machine {
        Ok(m) => Some(m),
        Err(why) => {
            if s.formula != Formula::None && s.formula != Formula::Fixed {
                warnings.push(format!(
                    "{why}: RESERVATION={} needs the CPU count and MemTotal, so no reservation is computed (only node.env's values apply)",
                    s.formula.name()
                ));
            }
            None
        }
    };
    let fixed = |value: u32, source: &str| MaxPods {
        value,
        source: source.to_string(),
        warning: None,
    };
    let max_pods = match (i.max_pods_override, i.map_entry, s.mode) {
        (Some(n), _, _) => fixed(n, node_env::MAX_PODS),
        (None, Some(n), _) => fixed(n, paths::MAX_PODS_MAP),
        (None, None, Some(mode)) => max_pods(
            mode,
            i.instance_type,
            machine.map(|m| m.cpus),
            i.table,
            i.default_max_pods,
        ),
        (None, None, None) => fixed(i.default_max_pods, image_env::DEFAULT_MAX_PODS),
    };
    warnings.extend(max_pods.warning.clone());
    let mut reserved = match machine {
        Some(m) => reserve(
            s.formula,
            m.cpus,
            m.mem_kib / 1024,
            max_pods.value,
            &s.fixed,
        ),
        None if s.formula == Formula::Fixed => s.fixed.clone(),
        None => Reserved::default(),
    };
    reserved.merge(&s.overrides);
    Sizing {
        max_pods,
        machine,
        formula: s.formula,
        reserved,
        warnings,
    }
}

impl Sizing {
    /// The `"sizing"` object of status.json (keys in the contract's order).
    pub fn render_json(&self, out: &mut String) {
        out.push_str("{\"max_pods\":");
        let _ = write!(out, "{}", self.max_pods.value);
        out.push_str(",\"max_pods_source\":");
        crate::json::write_str(out, &self.max_pods.source);
        if let Some(m) = self.machine {
            let _ = write!(out, ",\"cpus\":{},\"mem_total_kib\":{}", m.cpus, m.mem_kib);
        }
        out.push_str(",\"reservation\":\"");
        out.push_str(self.formula.name());
        out.push('"');
        for (k, v) in [
            ("kube_reserved", self.reserved.kube.render('=')),
            ("system_reserved", self.reserved.system.render('=')),
            ("eviction_hard", self.reserved.eviction.render('<')),
        ] {
            out.push_str(",\"");
            out.push_str(k);
            out.push_str("\":");
            crate::json::write_str(out, &v);
        }
        out.push('}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        for (text, want) in [
            ("0\n", Some(1)),
            ("0-3\n", Some(4)),
            ("0-3,6,8-9\n", Some(7)),
            ("0-95", Some(96)),
            ("", None),
            ("3-1", None),
            ("a", None),
        ] {
            assert_eq!(parse_cpu_list(text), want, "{text:?}");
        }
        assert_eq!(
            parse_cpuinfo("processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\n"),
            Some(2)
        );
        assert_eq!(parse_cpuinfo("model name: x\n"), None);
        assert_eq!(
            parse_meminfo("MemTotal:        8039868 kB\nMemFree: 1 kB\n"),
            Some(8_039_868)
        );
        assert_eq!(parse_meminfo("MemFree: 1 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: 12 MB\n"), None);
    }

    #[test]
    fn table_rows() {
        let t = "# c\nm5.large\t3\t10\tnitro\nm4.large\t2\t10\txen\nm5.metal\t15\t50\tunknown\n";
        assert_eq!(
            lookup(t, "m5.large"),
            Some(EniLimits {
                enis: 3,
                ipv4_per_eni: 10,
                nitro: true
            })
        );
        assert_eq!(lookup(t, "m5.larg"), None);
        assert_eq!(lookup(t, "5.large"), None);
        assert_eq!(lookup(t, ""), None);
        assert_eq!(lookup("x\tm5.large\t3\t10\tnitro\n", "m5.large"), None);
        assert_eq!(
            lookup("# m5.large\t1\t2\tnitro\nm5.large\t3\t10\txen", "m5.large"),
            Some(EniLimits {
                enis: 3,
                ipv4_per_eni: 10,
                nitro: false
            })
        );
        assert_eq!(lookup(t, "m5"), None);
        assert_eq!(lookup(t, "M5.LARGE"), None);
        assert_eq!(parse_table(t).unwrap().len(), 3);
        for (bad, needle) in [
            ("a\t1\t2\n", "line 1"),
            ("a\t0\t2\tnitro\n", "positive"),
            ("a\t1\t2\tkvm\n", "nitro|xen|unknown"),
            ("a\t1\t2\tnitro\na\t1\t2\tnitro\n", "listed twice"),
            ("a 1 2 nitro\n", "line 1"),
        ] {
            let e = parse_table(bad).unwrap_err();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    #[test]
    fn tiered_cpu_matches_nodeadm() {
        // (vCPUs, millicores): the tiers applied by hand, 6 % + 1 % + 2 × 0.5 % + n × 0.25 %.
        for (cpus, want) in [
            (1, 60),
            (2, 70),
            (3, 75),
            (4, 80),
            (8, 90),
            (16, 110),
            (48, 190),
            (96, 310),
        ] {
            assert_eq!(tiered_cpu_millicores(cpus), want, "{cpus} vCPUs");
        }
    }
}
