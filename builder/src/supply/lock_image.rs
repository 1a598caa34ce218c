//! `[[image]]` entries of the lock: OCI images pinned by digest (the index or manifest list,
//! and the manifest of each platform kiln keeps), with the reference they were taken from.
//!
//! A leaf module: [`crate::supply::lock`] parses the file and turns a [`Problem`] found here into
//! its own error naming the lock file. The format is documented in `docs/lock-format.md`.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::supply::names::{is_sha256_hex, Arch, Os};

/// One platform of a pinned image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImagePlatform {
    /// The platform's OS.
    pub os: Os,
    /// The platform's architecture.
    pub arch: Arch,
    /// `sha256:<hex>` of this platform's manifest. Optional: the image's `digest` binds the
    /// index, and the index names each platform's manifest by digest, so an entry without one
    /// is still pinned (transitively). When present, the index must name exactly this digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

/// One pinned OCI image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Image {
    /// Short name, e.g. `pause`; unique among the lock's images.
    pub name: String,
    /// Where it is published: `HOST[:PORT]/REPOSITORY[:TAG]`, e.g.
    /// `registry.k8s.io/pause:3.10.1`. The tag is informational: kiln pulls by `digest`.
    pub reference: String,
    /// `sha256:<hex>` of the image index (or manifest list), or of the single manifest when
    /// the image is not multi-platform.
    pub digest: String,
    /// What was checked when this entry was authored, and where the digests came from.
    pub verified: String,
    /// The platforms kiln keeps; an index's other platforms are left out of the store.
    pub platforms: Vec<ImagePlatform>,
}

/// A parsed image reference: registry host, repository, tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// `host` or `host:port`.
    pub host: String,
    /// `path/to/repo`.
    pub repository: String,
    /// The tag, when the reference has one.
    pub tag: Option<String>,
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.host, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        Ok(())
    }
}

impl ImageRef {
    /// Parses `HOST[:PORT]/REPO[:TAG]`. The host is required (no implicit `docker.io`) and
    /// must look like one (a `.`, a `:` port, or `localhost`); a digest (`@…`) is refused:
    /// the lock's `digest` field carries it.
    pub fn parse(s: &str) -> Result<ImageRef, String> {
        let (host, rest) = s
            .split_once('/')
            .ok_or_else(|| "HOST/REPOSITORY[:TAG] (no registry host found)".to_string())?;
        let host_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:".contains(&b))
            && (host.contains('.') || host.contains(':') || host == "localhost")
            && host
                .split_once(':')
                .is_none_or(|(h, p)| !h.is_empty() && !p.is_empty() && p.parse::<u16>().is_ok());
        if !host_ok {
            return Err(format!(
                "a registry host such as registry.k8s.io or 127.0.0.1:5000, found {host:?}"
            ));
        }
        if rest.contains('@') {
            return Err("a reference without @digest (put the digest in `digest`)".into());
        }
        let (repo, tag) = match rest.rsplit_once(':') {
            Some((r, t)) if !t.contains('/') => (r, Some(t)),
            _ => (rest, None),
        };
        let comp_ok = |c: &str| {
            !c.is_empty()
                && c.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
                && c.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
                && c.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
        };
        if repo.is_empty() || repo.len() > 255 || !repo.split('/').all(comp_ok) {
            return Err(format!(
                "a repository of lowercase [a-z0-9._-] path components, found {repo:?}"
            ));
        }
        if let Some(t) = tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                && !t.starts_with(['.', '-']);
            if !ok {
                return Err(format!("a tag of [A-Za-z0-9_.-] (≤ 128), found {t:?}"));
            }
        }
        Ok(ImageRef {
            host: host.to_string(),
            repository: repo.to_string(),
            tag: tag.map(str::to_string),
        })
    }
}

/// The hex of a `sha256:<64 lowercase hex>` digest; `None` for anything else (other
/// algorithms, upper case, a path such as `sha256:../../x`).
pub fn digest_hex(d: &str) -> Option<&str> {
    d.strip_prefix("sha256:").filter(|h| is_sha256_hex(h))
}

impl Image {
    /// A stable identifier for messages: `name (reference)`.
    pub fn id(&self) -> String {
        format!("{} ({})", self.name, self.reference)
    }

    /// The parsed reference (validated when the lock was parsed).
    pub fn image_ref(&self) -> Result<ImageRef, String> {
        ImageRef::parse(&self.reference)
    }

    /// The platform entry for `os`/`arch`, if pinned.
    pub fn platform(&self, os: Os, arch: Arch) -> Option<&ImagePlatform> {
        self.platforms.iter().find(|p| p.os == os && p.arch == arch)
    }
}

/// What is wrong with one image entry: the field, what was expected, what was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// The field name.
    pub field: &'static str,
    /// What was expected.
    pub expected: String,
    /// What was found.
    pub found: String,
}

fn problem(field: &'static str, expected: impl Into<String>, found: &str) -> Problem {
    Problem {
        field,
        expected: expected.into(),
        found: found.to_string(),
    }
}

/// Checks one image entry.
pub fn validate(img: &Image) -> Result<(), Problem> {
    let name_ok = !img.name.is_empty()
        && img
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.+".contains(&b));
    if !name_ok {
        return Err(problem(
            "name",
            "a non-empty name of [A-Za-z0-9._+-]",
            &img.name,
        ));
    }
    ImageRef::parse(&img.reference).map_err(|e| problem("reference", e, &img.reference))?;
    if digest_hex(&img.digest).is_none() {
        return Err(problem(
            "digest",
            "sha256: and 64 lowercase hex digits",
            &img.digest,
        ));
    }
    if img.verified.trim().is_empty() {
        return Err(problem(
            "verified",
            "a note of what was checked and where the digests came from",
            &img.verified,
        ));
    }
    if img.platforms.is_empty() {
        return Err(problem("platforms", "at least one platform", "[]"));
    }
    let mut seen = BTreeSet::new();
    for p in &img.platforms {
        let key = format!("{}/{}", p.os, p.arch);
        if !seen.insert((p.os, p.arch)) {
            return Err(problem("platforms", "each os/arch once", &key));
        }
        if let Some(d) = &p.digest {
            if digest_hex(d).is_none() {
                return Err(problem(
                    "platforms.digest",
                    format!("sha256: and 64 lowercase hex digits for {key}"),
                    d,
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references() {
        let r = ImageRef::parse("registry.k8s.io/pause:3.10.1").unwrap();
        assert_eq!(
            (r.host.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("registry.k8s.io", "pause", Some("3.10.1"))
        );
        let r = ImageRef::parse("127.0.0.1:5000/kiln/test/pause").unwrap();
        assert_eq!(r.host, "127.0.0.1:5000");
        assert_eq!(r.repository, "kiln/test/pause");
        assert_eq!(r.tag, None);
        assert_eq!(r.to_string(), "127.0.0.1:5000/kiln/test/pause");
        for bad in [
            "pause:3.10",
            "library/pause",
            "registry.k8s.io/Pause:1",
            "registry.k8s.io/pause@sha256:00",
            "registry.k8s.io/../x",
            "registry.k8s.io/pause:",
            "registry.k8s.io/pause:-x",
            "host:99999/x",
            "registry.k8s.io/",
            "reg istry.io/x",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn digests() {
        let h = "ab".repeat(32);
        assert_eq!(digest_hex(&format!("sha256:{h}")), Some(h.as_str()));
        for bad in [
            "sha256:../../x".to_string(),
            format!("sha512:{h}"),
            format!("sha256:{}", h.to_uppercase()),
            h.clone(),
            format!("sha256:{h}/.."),
        ] {
            assert_eq!(digest_hex(&bad), None, "{bad}");
        }
    }
}
