//! The artifact lock (`artifacts.lock`): every artifact kiln may use, pinned by URL, size and
//! sha256 per OS and architecture. Parsed strictly (unknown keys refused) and validated once.
//!
//! The format is documented in `docs/lock-format.md`. Signature checking lives in
//! [`crate::supply::sign`]; [`Lock::load_verified`] does both.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::exit::ExitClass;
use crate::supply::lock_image;
pub use crate::supply::lock_image::{Image, ImagePlatform};
pub use crate::supply::names::{is_sha256_hex, Arch, Os};
use crate::supply::sign::{self, SignError, Trust, Verified};
use crate::supply::waiver;
pub use crate::supply::waiver::Waiver;

/// The lock format version this kiln reads and writes.
pub const LOCK_VERSION: u32 = 1;

/// The most bytes kiln accepts for an artifact whose lock entry records no size.
pub const MAX_UNSIZED: u64 = 4 << 30;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How the downloaded bytes are packaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Format {
    /// The download is the file itself (kubelet, runc).
    #[serde(rename = "binary")]
    Binary,
    /// A gzip-compressed tar archive (containerd, CNI plugins, crictl).
    #[serde(rename = "tar.gz")]
    TarGz,
    /// A zip archive (Windows bundles).
    #[serde(rename = "zip")]
    Zip,
}

impl Format {
    /// The name used in the lock.
    pub fn as_str(self) -> &'static str {
        match self {
            Format::Binary => "binary",
            Format::TarGz => "tar.gz",
            Format::Zip => "zip",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One file taken from an artifact and where it goes in the baked layer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// Path inside the archive (leading `./` ignored when matching). For a `binary` artifact,
    /// the file name of the download itself.
    pub from: String,
    /// Relative destination in the layer, e.g. `bin/containerd` or `libexec/cni/bridge`.
    /// Bake decides the prefix (`/usr` on Linux, `C:\k` on Windows).
    pub to: String,
}

/// One pinned artifact for one OS and architecture.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// Short name, e.g. `kubelet`, `containerd`, `cni-plugins`.
    pub name: String,
    /// Upstream version, e.g. `v1.33.1` or `2.1.1`.
    pub version: String,
    /// Target OS.
    pub os: Os,
    /// Target architecture.
    pub arch: Arch,
    /// Packaging of the download.
    pub format: Format,
    /// Upstream download URL (`http` or `https`).
    pub url: String,
    /// Extra upstream URLs holding the same bytes, tried after `url`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<String>,
    /// Exact size in bytes; `0` (or absent in the file) when the author could not record it.
    /// The sha256 still binds the bytes; downloads of unsized artifacts are capped at
    /// [`MAX_UNSIZED`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub size: u64,
    /// Lowercase hex sha256 of the download.
    pub sha256: String,
    /// What upstream signature or checksum was checked when this entry was authored, and where
    /// the value came from.
    pub verified: String,
    /// Files to take from the download and where each goes.
    pub members: Vec<Member>,
}

impl Artifact {
    /// A stable identifier: `name@version/os/arch`.
    pub fn id(&self) -> String {
        format!("{}@{}/{}/{}", self.name, self.version, self.os, self.arch)
    }

    /// Every URL this artifact may be downloaded from upstream, in order.
    pub fn upstream_urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.url.as_str()).chain(self.sources.iter().map(String::as_str))
    }

    /// The recorded size, if the author recorded one.
    pub fn known_size(&self) -> Option<u64> {
        (self.size > 0).then_some(self.size)
    }

    /// The last path segment of the upstream URL (the download's file name).
    pub fn file_name(&self) -> &str {
        url_file_name(&self.url)
    }
}

fn url_file_name(url: &str) -> &str {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or(path)
}

/// The on-disk shape of the lock, before validation.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct LockFile {
    version: u32,
    #[serde(default, rename = "artifact")]
    artifacts: Vec<Artifact>,
    #[serde(default, rename = "image", skip_serializing_if = "Vec::is_empty")]
    images: Vec<Image>,
    #[serde(default, rename = "waiver", skip_serializing_if = "Vec::is_empty")]
    waivers: Vec<Waiver>,
}

/// A parsed and validated artifact lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lock {
    /// Where it was read from (for messages); `<memory>` when parsed from a string.
    pub path: PathBuf,
    /// The artifacts, in file order.
    pub artifacts: Vec<Artifact>,
    /// The pinned OCI images (`[[image]]`), in file order.
    pub images: Vec<Image>,
    /// Reviewed waivers of known advisories (`[[waiver]]`), in file order.
    pub waivers: Vec<Waiver>,
}

/// Why a lock could not be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The file could not be read.
    #[error("reading lock {path}: {source}")]
    Read {
        /// The lock file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not valid TOML or not the lock's shape (unknown key, wrong type, missing field).
    #[error("lock {path} is not a valid artifact lock: {message}")]
    Parse {
        /// The lock file.
        path: PathBuf,
        /// The parser's message, with line and column.
        message: String,
    },
    /// A field has a value the lock does not allow.
    #[error(
        "lock {path}: artifact {artifact}: field `{field}`: expected {expected}, found {found:?}"
    )]
    Invalid {
        /// The lock file.
        path: PathBuf,
        /// The artifact id or index.
        artifact: String,
        /// The field name.
        field: &'static str,
        /// What was expected.
        expected: String,
        /// What was found.
        found: String,
    },
    /// A `[[waiver]]` field has a value the lock does not allow.
    #[error("lock {path}: waiver {waiver}: field `{field}`: expected {expected}, found {found:?}")]
    InvalidWaiver {
        /// The lock file.
        path: PathBuf,
        /// `ADVISORY ARTIFACT` or the waiver's index.
        waiver: String,
        /// The field name.
        field: &'static str,
        /// What was expected.
        expected: String,
        /// What was found.
        found: String,
    },
    /// An `[[image]]` field has a value the lock does not allow.
    #[error("lock {path}: image {image}: field `{field}`: expected {expected}, found {found:?}")]
    InvalidImage {
        /// The lock file.
        path: PathBuf,
        /// The image name or index.
        image: String,
        /// The field name.
        field: &'static str,
        /// What was expected.
        expected: String,
        /// What was found.
        found: String,
    },
    /// The lock's `version` is not one this kiln reads.
    #[error("lock {path}: field `version`: expected {LOCK_VERSION}, found {found}")]
    Version {
        /// The lock file.
        path: PathBuf,
        /// The version found.
        found: u32,
    },
    /// Two entries for the same name, OS and architecture.
    #[error("lock {path}: artifact {name} for {os}/{arch} appears twice; keep one entry per name, OS and architecture")]
    Duplicate {
        /// The lock file.
        path: PathBuf,
        /// The artifact name.
        name: String,
        /// Its OS.
        os: Os,
        /// Its architecture.
        arch: Arch,
    },
    /// The signature check failed.
    #[error(transparent)]
    Signature(#[from] SignError),
}

impl LockError {
    /// A lock that cannot be read is a plain failure; one that is invalid or badly signed
    /// is refused (exit 3).
    pub fn exit_class(&self) -> ExitClass {
        match self {
            LockError::Read { .. } => ExitClass::Failure,
            _ => ExitClass::Verify,
        }
    }
}

impl Lock {
    /// Parses and validates lock text; `path` is used in messages only.
    pub fn parse(text: &str, path: &Path) -> Result<Lock, LockError> {
        let file: LockFile = toml::from_str(text).map_err(|e| LockError::Parse {
            path: path.to_path_buf(),
            message: e.to_string().trim_end().to_string(),
        })?;
        if file.version != LOCK_VERSION {
            return Err(LockError::Version {
                path: path.to_path_buf(),
                found: file.version,
            });
        }
        let mut seen = BTreeSet::new();
        for (i, a) in file.artifacts.iter().enumerate() {
            validate(a, i, path)?;
            if !seen.insert((a.name.clone(), a.os, a.arch)) {
                return Err(LockError::Duplicate {
                    path: path.to_path_buf(),
                    name: a.name.clone(),
                    os: a.os,
                    arch: a.arch,
                });
            }
        }
        let mut names = BTreeSet::new();
        for (i, img) in file.images.iter().enumerate() {
            let who = if img.name.is_empty() {
                format!("#{}", i + 1)
            } else {
                img.name.clone()
            };
            let invalid = |p: lock_image::Problem| LockError::InvalidImage {
                path: path.to_path_buf(),
                image: who.clone(),
                field: p.field,
                expected: p.expected,
                found: p.found,
            };
            lock_image::validate(img).map_err(invalid)?;
            if !names.insert(img.name.as_str()) {
                return Err(invalid(lock_image::Problem {
                    field: "name",
                    expected: "each image name once in the lock".into(),
                    found: img.name.clone(),
                }));
            }
        }
        let mut waived = BTreeSet::new();
        for (i, w) in file.waivers.iter().enumerate() {
            let known = file.artifacts.iter().any(|a| a.name == w.artifact);
            let who = format!("#{} ({} {})", i + 1, w.advisory, w.artifact);
            let invalid = |p: waiver::Problem| LockError::InvalidWaiver {
                path: path.to_path_buf(),
                waiver: who.clone(),
                field: p.field,
                expected: p.expected,
                found: p.found,
            };
            waiver::validate(w, known).map_err(invalid)?;
            if !waived.insert((w.advisory.as_str(), w.artifact.as_str(), w.os)) {
                return Err(invalid(waiver::Problem {
                    field: "advisory",
                    expected: "one waiver per advisory, artifact and OS".into(),
                    found: w.advisory.clone(),
                }));
            }
        }
        Ok(Lock {
            path: path.to_path_buf(),
            artifacts: file.artifacts,
            images: file.images,
            waivers: file.waivers,
        })
    }

    /// Reads and validates a lock file without checking its signature.
    pub fn load_unverified(path: &Path) -> Result<Lock, LockError> {
        let text = std::fs::read_to_string(path).map_err(|source| LockError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Lock::parse(&text, path)
    }

    /// Reads a lock, checks `<path>.minisig` under `trust`, then parses and validates it.
    /// The signature covers the exact bytes that are parsed.
    pub fn load_verified(path: &Path, trust: &Trust) -> Result<(Lock, Verified), LockError> {
        Lock::load_verified_as(path, path, trust)
    }

    /// [`Lock::load_verified`] for a lock staged from elsewhere (a registry): read from
    /// `path`, named `shown` in every error.
    pub fn load_verified_as(
        path: &Path,
        shown: &Path,
        trust: &Trust,
    ) -> Result<(Lock, Verified), LockError> {
        let bytes = std::fs::read(path).map_err(|source| LockError::Read {
            path: shown.to_path_buf(),
            source,
        })?;
        let verified = sign::verify_file_bytes_as(path, shown, &bytes, trust)?;
        let text = String::from_utf8(bytes).map_err(|e| LockError::Parse {
            path: shown.to_path_buf(),
            message: format!("not UTF-8: {e}"),
        })?;
        Ok((Lock::parse(&text, shown)?, verified))
    }

    /// The entry for `name` on `os`/`arch`, if the lock has one.
    pub fn find(&self, name: &str, os: Os, arch: Arch) -> Option<&Artifact> {
        self.artifacts
            .iter()
            .find(|a| a.name == name && a.os == os && a.arch == arch)
    }

    /// Serialises the lock back to TOML (stable field order).
    pub fn to_toml(&self) -> String {
        let file = LockFile {
            version: LOCK_VERSION,
            artifacts: self.artifacts.clone(),
            images: self.images.clone(),
            waivers: self.waivers.clone(),
        };
        toml::to_string(&file).unwrap_or_default()
    }

    /// Total bytes of every artifact.
    pub fn total_size(&self) -> u64 {
        self.artifacts.iter().map(|a| a.size).sum()
    }
}

fn is_safe_relative(p: &str) -> bool {
    let p = p.strip_prefix("./").unwrap_or(p);
    !p.is_empty()
        && !p.starts_with('/')
        && !p.contains('\\')
        && p.split('/').all(|c| !c.is_empty() && c != ".." && c != ".")
}

fn validate(a: &Artifact, index: usize, path: &Path) -> Result<(), LockError> {
    let who = if a.name.is_empty() {
        format!("#{}", index + 1)
    } else {
        a.id()
    };
    let bad = |field: &'static str, expected: &str, found: &str| LockError::Invalid {
        path: path.to_path_buf(),
        artifact: who.clone(),
        field,
        expected: expected.to_string(),
        found: found.to_string(),
    };
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b))
    };
    if !name_ok(&a.name) {
        return Err(bad("name", "a non-empty name of [A-Za-z0-9._+-]", &a.name));
    }
    if !name_ok(&a.version) {
        return Err(bad(
            "version",
            "a non-empty version of [A-Za-z0-9._+-]",
            &a.version,
        ));
    }
    for u in a.upstream_urls() {
        let field = if u == a.url { "url" } else { "sources" };
        if !(u.starts_with("https://") || u.starts_with("http://")) || url_file_name(u).is_empty() {
            return Err(bad(field, "an http(s) URL ending in a file name", u));
        }
    }
    if !is_sha256_hex(&a.sha256) {
        return Err(bad("sha256", "64 lowercase hex digits", &a.sha256));
    }
    if a.verified.trim().is_empty() {
        return Err(bad(
            "verified",
            "a note of the upstream signature or checksum that was checked",
            &a.verified,
        ));
    }
    if a.members.is_empty() {
        return Err(bad("members", "at least one member", "[]"));
    }
    if a.format == Format::Binary && (a.members.len() != 1 || a.members[0].from != a.file_name()) {
        let found: Vec<&str> = a.members.iter().map(|m| m.from.as_str()).collect();
        return Err(bad(
            "members",
            &format!(
                "exactly one member with from = {:?} for a binary download",
                a.file_name()
            ),
            &found.join(", "),
        ));
    }
    let mut tos = BTreeSet::new();
    for m in &a.members {
        if !is_safe_relative(&m.from) {
            return Err(bad("members.from", "a relative path without `..`", &m.from));
        }
        if !is_safe_relative(&m.to) {
            return Err(bad("members.to", "a relative path without `..`", &m.to));
        }
        if !tos.insert(m.to.as_str()) {
            return Err(bad("members.to", "each destination once", &m.to));
        }
    }
    Ok(())
}

/// Normalises an archive member path for matching: strips a leading `./`.
pub fn member_key(p: &str) -> &str {
    p.strip_prefix("./").unwrap_or(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
version = 1

[[artifact]]
name = "runc"
version = "1.3.0"
os = "linux"
arch = "amd64"
format = "binary"
url = "https://github.com/opencontainers/runc/releases/download/v1.3.0/runc.amd64"
size = 10
sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
verified = "test"
members = [{ from = "runc.amd64", to = "bin/runc" }]
"#;

    fn p() -> &'static Path {
        Path::new("t.lock")
    }

    #[test]
    fn good_lock_parses() {
        let lock = Lock::parse(GOOD, p()).unwrap();
        assert_eq!(lock.artifacts.len(), 1);
        let a = lock.find("runc", Os::Linux, Arch::Amd64).unwrap();
        assert_eq!(a.id(), "runc@1.3.0/linux/amd64");
        assert_eq!(a.file_name(), "runc.amd64");
        assert!(lock.find("runc", Os::Linux, Arch::Arm64).is_none());
        // Round trip through our own serialiser.
        let again = Lock::parse(&lock.to_toml(), p()).unwrap();
        assert_eq!(again.artifacts, lock.artifacts);
    }

    #[test]
    fn bad_locks_name_the_field() {
        let cases: &[(&str, &str, &str)] = &[
            ("size = 10", "size = -1", "invalid value"),
            ("sha256 = \"0000", "sha256 = \"X000", "`sha256`"),
            (
                "os = \"linux\"",
                "os = \"plan9\"",
                "unknown variant `plan9`",
            ),
            (
                "arch = \"amd64\"",
                "arch = \"riscv\"",
                "unknown variant `riscv`",
            ),
            (
                "format = \"binary\"",
                "format = \"rar\"",
                "unknown variant `rar`",
            ),
            ("verified = \"test\"", "verified = \"\"", "`verified`"),
            (
                "verified = \"test\"",
                "verified = \"t\"\ncolour = 1",
                "unknown field `colour`",
            ),
            ("url = \"https", "url = \"ftp", "`url`"),
            (
                "to = \"bin/runc\"",
                "to = \"../etc/passwd\"",
                "`members.to`",
            ),
            ("from = \"runc.amd64\"", "from = \"runc\"", "`members`"),
            ("version = 1\n", "version = 2\n", "expected 1, found 2"),
        ];
        for (from, to, want) in cases {
            let text = GOOD.replacen(from, to, 1);
            assert_ne!(text, GOOD, "case {from} did not apply");
            let err = Lock::parse(&text, p()).unwrap_err().to_string();
            assert!(err.contains(want), "{to}: {err}");
            assert!(err.contains("t.lock"), "{err}");
        }
    }

    #[test]
    fn duplicates_are_refused() {
        let text = format!("{GOOD}{}", GOOD.replace("version = 1\n", ""));
        let err = Lock::parse(&text, p()).unwrap_err().to_string();
        assert!(err.contains("appears twice"), "{err}");
    }

    #[test]
    fn safe_paths() {
        for (p, ok) in [
            ("bin/x", true),
            ("./bridge", true),
            ("/etc/x", false),
            ("a/../b", false),
            ("", false),
            ("a//b", false),
            ("a\\b", false),
        ] {
            assert_eq!(is_safe_relative(p), ok, "{p}");
        }
    }
}
