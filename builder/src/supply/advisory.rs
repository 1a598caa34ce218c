//! Known advisories (`images/advisories.toml`) and the audit of a lock against them: which pin
//! carries which advisory, and whether a signed, unexpired waiver in the lock covers it.
//!
//! Ranges follow the OSV schema's `SEMVER` events (<https://ossf.github.io/osv-schema/>):
//! `introduced` is the first affected version, `fixed` the first unaffected one; a range without
//! `fixed` has no fix yet.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::exit::ExitClass;
use crate::supply::lock::{Artifact, Lock};
use crate::supply::names::Os;
use crate::supply::outdated::version::Version;
use crate::supply::waiver::{is_advisory_id, Day, Waiver};

/// The advisory file format version this kiln reads.
pub const ADVISORIES_VERSION: u32 = 1;

/// How bad an advisory is, as its publisher rates it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The maintainers have not read a rating from the publisher.
    Unrated,
    /// Low.
    Low,
    /// Moderate (GitHub's word for CVSS medium).
    #[serde(alias = "medium")]
    Moderate,
    /// High.
    High,
    /// Critical.
    Critical,
}

/// One affected range: `introduced <= v < fixed`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Range {
    /// The first affected version.
    pub introduced: String,
    /// The first version with the fix; absent when there is none yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed: Option<String>,
}

/// One advisory as the maintainers record it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Advisory {
    /// Its primary id (`CVE-2026-53495`).
    pub id: String,
    /// Other ids of the same advisory (`GHSA-…`); a waiver may name any of them.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// The lock artifact names it affects (`containerd`; `kubelet`, `kubeadm`, `kubectl`).
    pub artifacts: Vec<String>,
    /// Only these OSes; every OS when empty.
    #[serde(default)]
    pub os: Vec<Os>,
    /// The affected ranges.
    pub affected: Vec<Range>,
    /// The publisher's rating.
    pub severity: Severity,
    /// One line: what it is.
    pub summary: String,
    /// Where it is published (https URLs a reader can open).
    pub published: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AdvisoryFile {
    version: u32,
    #[serde(default, rename = "advisory")]
    advisories: Vec<Advisory>,
}

/// Why an advisory file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum AdvisoryError {
    /// The file could not be read.
    #[error("reading advisories {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not valid TOML or not the file's shape.
    #[error("advisories {path} is not a valid advisory file: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        message: String,
    },
    /// A field holds a value the format does not allow.
    #[error(
        "advisories {path}: advisory {id}: field `{field}`: expected {expected}, found {found:?}"
    )]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The advisory id or index.
        id: String,
        /// The field.
        field: &'static str,
        /// What was expected.
        expected: String,
        /// What was found.
        found: String,
    },
}

impl AdvisoryError {
    /// A file that cannot be read is a plain failure; an invalid one is refused (exit 3).
    pub fn exit_class(&self) -> ExitClass {
        match self {
            AdvisoryError::Read { .. } => ExitClass::Failure,
            _ => ExitClass::Verify,
        }
    }
}

/// The validated advisories of one file.
#[derive(Debug, Clone)]
pub struct Advisories {
    /// Where they were read from.
    pub path: PathBuf,
    /// The advisories, in file order.
    pub list: Vec<Advisory>,
}

impl Advisories {
    /// Reads and validates an advisory file.
    pub fn load(path: &Path) -> Result<Advisories, AdvisoryError> {
        let text = std::fs::read_to_string(path).map_err(|source| AdvisoryError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Advisories::parse(&text, path)
    }

    /// Parses and validates advisory text; `path` is for messages.
    pub fn parse(text: &str, path: &Path) -> Result<Advisories, AdvisoryError> {
        let file: AdvisoryFile = toml::from_str(text).map_err(|e| AdvisoryError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        if file.version != ADVISORIES_VERSION {
            return Err(AdvisoryError::Invalid {
                path: path.to_path_buf(),
                id: "(file)".into(),
                field: "version",
                expected: ADVISORIES_VERSION.to_string(),
                found: file.version.to_string(),
            });
        }
        let mut ids = BTreeSet::new();
        for (i, a) in file.advisories.iter().enumerate() {
            let who = if a.id.is_empty() {
                format!("#{}", i + 1)
            } else {
                a.id.clone()
            };
            let bad = |field, expected: &str, found: &str| AdvisoryError::Invalid {
                path: path.to_path_buf(),
                id: who.clone(),
                field,
                expected: expected.to_string(),
                found: found.to_string(),
            };
            for id in std::iter::once(&a.id).chain(&a.aliases) {
                if !is_advisory_id(id) {
                    return Err(bad("id", "an advisory id of [A-Za-z0-9._:-]", id));
                }
                if !ids.insert(id.clone()) {
                    return Err(bad("id", "each id and alias once in the file", id));
                }
            }
            if a.artifacts.is_empty() || a.artifacts.iter().any(|n| n.trim().is_empty()) {
                return Err(bad(
                    "artifacts",
                    "at least one artifact name",
                    &a.artifacts.join(","),
                ));
            }
            if a.affected.is_empty() {
                return Err(bad("affected", "at least one range", "[]"));
            }
            for r in &a.affected {
                let Some(lo) = Version::parse(&r.introduced) else {
                    return Err(bad("affected.introduced", "a version N.N.N", &r.introduced));
                };
                if let Some(fixed) = &r.fixed {
                    match Version::parse(fixed) {
                        Some(hi) if hi > lo => {}
                        _ => {
                            return Err(bad(
                                "affected.fixed",
                                &format!("a version N.N.N above introduced {}", r.introduced),
                                fixed,
                            ))
                        }
                    }
                }
            }
            if a.summary.trim().is_empty() {
                return Err(bad("summary", "one line of what it is", &a.summary));
            }
            if a.published.is_empty() || a.published.iter().any(|u| !u.starts_with("https://")) {
                return Err(bad(
                    "published",
                    "at least one https:// URL",
                    &a.published.join(" "),
                ));
            }
        }
        Ok(Advisories {
            path: path.to_path_buf(),
            list: file.advisories,
        })
    }
}

/// What the audit concluded about one advisory on one pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Verdict {
    /// Affected, and no waiver covers it: the audit fails.
    Open,
    /// Affected, covered by a waiver that holds until `expires`.
    Waived {
        /// The waiver's last day.
        expires: String,
    },
    /// Affected, and the waiver that covered it ran out: the audit fails.
    WaiverExpired {
        /// The waiver's last day.
        expires: String,
    },
    /// The pin's version cannot be compared with the advisory's ranges: the audit fails,
    /// since nothing shows the pin is unaffected.
    Unknown,
}

/// One advisory on one pin.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The pin (`name@version/os/arch`).
    pub artifact: String,
    /// The advisory's primary id.
    pub advisory: String,
    /// Its severity.
    pub severity: Severity,
    /// The first fixed version of the range the pin is in (`None`: no fix yet).
    pub fixed_in: Option<String>,
    /// One line of what it is.
    pub summary: String,
    /// The verdict.
    #[serde(flatten)]
    pub verdict: Verdict,
}

impl Finding {
    /// True when this finding fails the audit.
    pub fn fails(&self) -> bool {
        !matches!(self.verdict, Verdict::Waived { .. })
    }
}

/// The audit of one lock.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Audit {
    /// Every advisory that affects a pin, waived or not, in lock order.
    pub findings: Vec<Finding>,
    /// Waivers that cover nothing the lock pins any more (`advisory artifact[/os]`): stale,
    /// to be dropped at the next signing.
    pub unused_waivers: Vec<String>,
}

impl Audit {
    /// The findings that fail the audit.
    pub fn failing(&self) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(|f| f.fails())
    }
}

/// `Some(fixed)` when `version` lies in one of the ranges (`fixed` may itself be `None`);
/// `None` when it lies in none; `Err(())` when it does not parse.
fn affected(a: &Advisory, version: &str) -> Result<Option<Option<String>>, ()> {
    let v = Version::parse(version).ok_or(())?;
    for r in &a.affected {
        let lo = Version::parse(&r.introduced).ok_or(())?;
        let below_fix = match &r.fixed {
            Some(f) => v < Version::parse(f).ok_or(())?,
            None => true,
        };
        if v >= lo && below_fix {
            return Ok(Some(r.fixed.clone()));
        }
    }
    Ok(None)
}

fn covers(w: &Waiver, adv: &Advisory, pin: &Artifact) -> bool {
    w.artifact == pin.name
        && w.os.is_none_or(|os| os == pin.os)
        && (w.advisory == adv.id || adv.aliases.contains(&w.advisory))
}

/// Audits `lock` against `advisories` on `today` (UTC).
pub fn audit(lock: &Lock, advisories: &Advisories, today: Day) -> Audit {
    let mut out = Audit::default();
    let mut used = vec![false; lock.waivers.len()];
    for pin in &lock.artifacts {
        for adv in &advisories.list {
            if !adv.artifacts.contains(&pin.name)
                || !(adv.os.is_empty() || adv.os.contains(&pin.os))
            {
                continue;
            }
            let (fixed_in, mut verdict) = match affected(adv, &pin.version) {
                Ok(None) => continue,
                Ok(Some(fixed)) => (fixed, Verdict::Open),
                Err(()) => (None, Verdict::Unknown),
            };
            if verdict == Verdict::Open {
                // The waiver that lasts longest decides; an expired one is reported as such.
                let best = lock
                    .waivers
                    .iter()
                    .enumerate()
                    .filter(|(_, w)| covers(w, adv, pin))
                    .filter_map(|(i, w)| Day::parse(&w.expires).map(|d| (d, i)))
                    .max();
                if let Some((expires, i)) = best {
                    used[i] = true;
                    verdict = if expires >= today {
                        Verdict::Waived {
                            expires: expires.to_string(),
                        }
                    } else {
                        Verdict::WaiverExpired {
                            expires: expires.to_string(),
                        }
                    };
                }
            }
            out.findings.push(Finding {
                artifact: pin.id(),
                advisory: adv.id.clone(),
                severity: adv.severity,
                fixed_in,
                summary: adv.summary.clone(),
                verdict,
            });
        }
    }
    for (w, used) in lock.waivers.iter().zip(used) {
        if !used {
            let os = w.os.map_or(String::new(), |o| format!("/{o}"));
            out.unused_waivers
                .push(format!("{} {}{os}", w.advisory, w.artifact));
        }
    }
    out
}

#[cfg(test)]
mod tests;
