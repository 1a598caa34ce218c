//! `[sizing]` of an image definition: how the nodes decide max pods (the CNI mode) and
//! kubelet's reservations (the formula), and the AWS ENI table the AWS modes read, a pinned
//! input like a lock entry: its sha256 is in the definition, and a table whose bytes differ is
//! refused at bake time. Names, shapes and the table parser are kiln-firstboot's
//! ([`kiln_firstboot::contract::sizing`], [`kiln_firstboot::sizing::parse_table`]), so the
//! builder and the node cannot disagree. Formulas: `docs/contract.md#sizing`.

use std::path::{Path, PathBuf};

use kiln_firstboot::contract::sizing::{
    self as key, parse_pairs, CniMode, Formula, CNI_MODE_EXPECTED, FORMULA_EXPECTED,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The largest table kiln-firstboot reads (it caps the read at this size).
pub const MAX_TABLE_BYTES: u64 = 1024 * 1024;

/// `max_pods` of `[sizing]`: a mode's name or a number.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MaxPodsSetting {
    /// A fixed number of pods.
    Pods(u32),
    /// A CNI mode's name (`aws-vpc-cni`, …).
    Mode(String),
}

impl Default for MaxPodsSetting {
    fn default() -> Self {
        MaxPodsSetting::Mode("overlay".into())
    }
}

/// `[sizing]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct SizingDef {
    /// How max pods is decided: `aws-vpc-cni`, `aws-vpc-cni-prefix-delegation`, `azure-cni`,
    /// `azure-cni-overlay`, `gke`, `overlay` (the default: `default_max_pods`) or a number.
    #[serde(default)]
    pub max_pods: MaxPodsSetting,
    /// The reservation formula: `eks`, `gke`, `aks`, `fixed` or `none`. Default `eks` on
    /// Linux, `none` on Windows (kiln-firstboot cannot read the machine's size there yet).
    #[serde(default)]
    pub reservation: Option<String>,
    /// The AWS ENI table, relative to the definition (`data/aws-eni.tsv`); required by the
    /// AWS modes, baked as `/usr/lib/kiln/aws-eni.tsv`.
    #[serde(default)]
    pub aws_table: Option<PathBuf>,
    /// The table's sha256 (hex); required with `aws_table`.
    #[serde(default)]
    pub aws_table_sha256: Option<String>,
    /// `fixed` only: kubelet's `--kube-reserved` (`cpu=100m,memory=1Gi`).
    #[serde(default)]
    pub kube_reserved: String,
    /// `fixed` only: `--system-reserved`.
    #[serde(default)]
    pub system_reserved: String,
    /// `fixed` only: `--eviction-hard` (`memory.available<100Mi,nodefs.available<10%`).
    #[serde(default)]
    pub eviction_hard: String,
}

/// A `[sizing]` value that is not acceptable: the dotted key, what was expected, what was found.
pub type Invalid = (String, String, String);

fn invalid(k: &str, expected: &str, found: impl ToString) -> Invalid {
    (
        format!("sizing.{k}"),
        expected.to_string(),
        found.to_string(),
    )
}

impl SizingDef {
    /// The CNI mode (validated by [`SizingDef::validate`]).
    pub fn mode(&self) -> Option<CniMode> {
        match &self.max_pods {
            MaxPodsSetting::Pods(n) => CniMode::parse(&n.to_string()),
            MaxPodsSetting::Mode(m) => CniMode::parse(m),
        }
    }

    /// The formula, the OS's default when unset.
    pub fn formula(&self, windows: bool) -> Option<Formula> {
        match self.reservation.as_deref() {
            Some(f) => Formula::parse(f),
            None if windows => Some(Formula::None),
            None => Some(Formula::Eks),
        }
    }

    /// Checks every value once, naming the key.
    pub fn validate(&self, windows: bool) -> Result<(), Invalid> {
        let mode = self.mode().ok_or_else(|| {
            let found = match &self.max_pods {
                MaxPodsSetting::Pods(n) => n.to_string(),
                MaxPodsSetting::Mode(m) => m.clone(),
            };
            invalid("max_pods", CNI_MODE_EXPECTED, found)
        })?;
        let formula = self.formula(windows).ok_or_else(|| {
            invalid(
                "reservation",
                FORMULA_EXPECTED,
                self.reservation.as_deref().unwrap_or(""),
            )
        })?;
        if windows && !matches!(formula, Formula::None | Formula::Fixed) {
            return Err(invalid(
                "reservation",
                "none or fixed for os = \"windows\" (kiln-firstboot cannot read the machine's size there)",
                formula.name(),
            ));
        }
        for (k, v, sep) in [
            ("kube_reserved", &self.kube_reserved, '='),
            ("system_reserved", &self.system_reserved, '='),
            ("eviction_hard", &self.eviction_hard, '<'),
        ] {
            parse_pairs(v, sep).map_err(|e| invalid(k, e, v))?;
            if !v.is_empty() && formula != Formula::Fixed {
                return Err(invalid(k, "nothing unless reservation = \"fixed\"", v));
            }
        }
        match (&self.aws_table, &self.aws_table_sha256) {
            (None, None) if mode.is_aws() => Err(invalid(
                "aws_table",
                &format!(
                    "a table for max_pods = {:?} (images/data/aws-eni.tsv)",
                    mode.name().unwrap_or("")
                ),
                "none",
            )),
            (Some(_), None) => Err(invalid("aws_table_sha256", "the table's sha256", "none")),
            (None, Some(s)) => Err(invalid("aws_table", "a table for aws_table_sha256", s)),
            (_, Some(s)) if s.len() != 64 || !s.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Err(invalid("aws_table_sha256", "64 hex digits", s))
            }
            _ => Ok(()),
        }
    }

    /// The image.env entries: `MAX_PODS_MODE`, `RESERVATION` and, for `fixed`, the values.
    pub fn image_env_entries(&self, windows: bool) -> Vec<(&'static str, String)> {
        let mode = match (&self.max_pods, self.mode().and_then(CniMode::name)) {
            (_, Some(name)) => name.to_string(),
            (MaxPodsSetting::Pods(n), None) => n.to_string(),
            (MaxPodsSetting::Mode(m), None) => m.clone(),
        };
        let formula = self.formula(windows).unwrap_or(Formula::None);
        let mut out = vec![
            (key::MAX_PODS_MODE, mode),
            (key::RESERVATION, formula.name().to_string()),
        ];
        for (k, v) in [
            (key::KUBE_RESERVED, &self.kube_reserved),
            (key::SYSTEM_RESERVED, &self.system_reserved),
            (key::EVICTION_HARD, &self.eviction_hard),
        ] {
            if !v.is_empty() {
                out.push((k, v.clone()));
            }
        }
        out
    }

    /// Reads the table (relative to `base_dir`), refuses it unless its sha256 is the pinned
    /// one and it parses as kiln-firstboot reads it. `Ok(None)` when the image has no table.
    pub fn load_table(&self, base_dir: &Path) -> Result<Option<Vec<u8>>, TableError> {
        let (Some(rel), Some(want)) = (&self.aws_table, &self.aws_table_sha256) else {
            return Ok(None);
        };
        let path = base_dir.join(rel);
        let bytes = std::fs::read(&path).map_err(|e| TableError {
            path: path.clone(),
            expected: "a readable file".into(),
            found: e.to_string(),
        })?;
        let got = hex::encode(Sha256::digest(&bytes));
        if !got.eq_ignore_ascii_case(want) {
            return Err(TableError {
                path,
                expected: format!("sha256 {want} (sizing.aws_table_sha256)"),
                found: format!(
                    "sha256 {got}: the table changed; regenerate it with scripts/aws-eni-table.sh and pin the new hash, or restore it"
                ),
            });
        }
        if bytes.len() as u64 > MAX_TABLE_BYTES {
            return Err(TableError {
                path,
                expected: format!("at most {MAX_TABLE_BYTES} bytes (what kiln-firstboot reads)"),
                found: format!("{} bytes", bytes.len()),
            });
        }
        let text = std::str::from_utf8(&bytes).map_err(|e| TableError {
            path: path.clone(),
            expected: "UTF-8 text".into(),
            found: e.to_string(),
        })?;
        kiln_firstboot::sizing::parse_table(text).map_err(|found| TableError {
            path: path.clone(),
            expected: "the aws-eni.tsv format (docs/contract.md#aws-enitsv)".into(),
            found,
        })?;
        Ok(Some(bytes))
    }
}

/// The AWS table could not be baked.
#[derive(Debug, thiserror::Error)]
#[error("{path}: expected {expected}, found {found}")]
pub struct TableError {
    /// The table file.
    pub path: PathBuf,
    /// What kiln wanted.
    pub expected: String,
    /// What the file is.
    pub found: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(toml_text: &str) -> SizingDef {
        toml::from_str(toml_text).unwrap()
    }

    #[test]
    fn values_are_checked_naming_the_key() {
        let sha = "a".repeat(64);
        let ok = [
            String::new(),
            "max_pods = 58".into(),
            "max_pods = \"gke\"\nreservation = \"gke\"".into(),
            format!("max_pods = \"aws-vpc-cni\"\naws_table = \"t.tsv\"\naws_table_sha256 = \"{sha}\""),
            "reservation = \"fixed\"\nkube_reserved = \"cpu=100m\"\neviction_hard = \"memory.available<1Gi\"".into(),
        ];
        for t in &ok {
            def(t)
                .validate(false)
                .unwrap_or_else(|e| panic!("{t}: {e:?}"));
        }
        let bad = [
            ("max_pods = 0", "sizing.max_pods"),
            ("max_pods = \"calico\"", "sizing.max_pods"),
            ("reservation = \"gcp\"", "sizing.reservation"),
            ("max_pods = \"aws-vpc-cni\"", "sizing.aws_table"),
            ("aws_table = \"t.tsv\"", "sizing.aws_table_sha256"),
            (
                "aws_table = \"t.tsv\"\naws_table_sha256 = \"abc\"",
                "sizing.aws_table_sha256",
            ),
            ("kube_reserved = \"cpu=100m\"", "sizing.kube_reserved"),
            (
                "reservation = \"fixed\"\neviction_hard = \"memory.available=1Gi\"",
                "sizing.eviction_hard",
            ),
        ];
        for (t, k) in bad {
            let e = def(t).validate(false).unwrap_err();
            assert_eq!(e.0, k, "{t}: {e:?}");
        }
        assert_eq!(
            def("reservation = \"eks\"").validate(true).unwrap_err().0,
            "sizing.reservation"
        );
        assert!(toml::from_str::<SizingDef>("colour = 1").is_err());
    }

    #[test]
    fn image_env_entries() {
        let text = |d: SizingDef, windows| {
            let mut env = kiln_firstboot::contract::EnvFile::default();
            for (k, v) in d.image_env_entries(windows) {
                env.set(k, v);
            }
            env.to_string()
        };
        assert_eq!(
            text(def(""), false),
            "MAX_PODS_MODE=overlay\nRESERVATION=eks\n"
        );
        assert_eq!(
            text(def(""), true),
            "MAX_PODS_MODE=overlay\nRESERVATION=none\n"
        );
        // `<` is quoted: a shell that sources image.env must not read a redirection.
        assert_eq!(
            text(
                def("max_pods = 58\nreservation = \"fixed\"\neviction_hard = \"memory.available<1Gi\""),
                false
            ),
            "MAX_PODS_MODE=58\nRESERVATION=fixed\nEVICTION_HARD=\"memory.available<1Gi\"\n"
        );
    }

    #[test]
    fn a_table_is_baked_only_with_its_pinned_hash() {
        let dir = tempfile::tempdir().unwrap();
        let text = "# t\nm5.large\t3\t10\tnitro\n";
        std::fs::write(dir.path().join("t.tsv"), text).unwrap();
        let sha = hex::encode(Sha256::digest(text.as_bytes()));
        let d = def(&format!(
            "max_pods = \"aws-vpc-cni\"\naws_table = \"t.tsv\"\naws_table_sha256 = \"{sha}\""
        ));
        assert_eq!(
            d.load_table(dir.path()).unwrap().as_deref(),
            Some(text.as_bytes())
        );
        // One changed digit: refused, naming both hashes.
        std::fs::write(dir.path().join("t.tsv"), text.replace("10", "11")).unwrap();
        let e = d.load_table(dir.path()).unwrap_err().to_string();
        assert!(e.contains(&sha) && e.contains("the table changed"), "{e}");
        // The right hash of a table firstboot could not read: refused too.
        let broken = "m5.large 3 10\n";
        std::fs::write(dir.path().join("t.tsv"), broken).unwrap();
        let sha = hex::encode(Sha256::digest(broken.as_bytes()));
        let d = def(&format!(
            "max_pods = \"aws-vpc-cni\"\naws_table = \"t.tsv\"\naws_table_sha256 = \"{sha}\""
        ));
        let e = d.load_table(dir.path()).unwrap_err().to_string();
        assert!(
            e.contains("aws-eni.tsv format") && e.contains("line 1"),
            "{e}"
        );
    }
}
