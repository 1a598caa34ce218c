//! `oci://HOST[:PORT]/REPO`, a registry repository holding a kiln mirror ([`OciTarget`]), and
//! the tags kiln gives what it pushes there ([`tag_of`], [`artifact_tag`]).

use crate::supply::lock::Artifact;
use crate::supply::lock_image::ImageRef;

/// `oci://HOST[:PORT]/REPO`: a registry repository holding a kiln mirror.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciTarget {
    /// `host` or `host:port`.
    pub host: String,
    /// The repository.
    pub repo: String,
}

impl OciTarget {
    /// Parses `oci://HOST[:PORT]/REPO` (no tag, no digest).
    pub fn parse(s: &str) -> Result<OciTarget, String> {
        let rest = s
            .strip_prefix("oci://")
            .ok_or_else(|| format!("{s:?}: expected oci://HOST[:PORT]/REPOSITORY"))?;
        let r = ImageRef::parse(rest.trim_end_matches('/'))
            .map_err(|e| format!("{s:?}: expected {e}"))?;
        if r.tag.is_some() {
            return Err(format!(
                "{s:?}: expected oci://HOST[:PORT]/REPOSITORY without a :tag (kiln picks the tags)"
            ));
        }
        Ok(OciTarget {
            host: r.host,
            repo: r.repository,
        })
    }

    /// Whether `s` names a registry mirror.
    pub fn is_oci(s: &str) -> bool {
        s.starts_with("oci://")
    }

    /// The repository as an image reference without a tag.
    pub fn image_ref(&self) -> ImageRef {
        ImageRef {
            host: self.host.clone(),
            repository: self.repo.clone(),
            tag: None,
        }
    }

    /// The URL a node or a bake fetches a blob from (anonymous-pull registries only need this).
    pub fn blob_url(&self, scheme: &str, sha256_hex: &str) -> String {
        format!(
            "{scheme}://{}/v2/{}/blobs/sha256:{sha256_hex}",
            self.host, self.repo
        )
    }
}

impl std::fmt::Display for OciTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "oci://{}/{}", self.host, self.repo)
    }
}

/// Makes a tag (`[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}`) of `parts` joined by `-`: other
/// characters become `_`; an over-long tag keeps its start and gains a hash of the whole.
pub fn tag_of(parts: &[&str]) -> String {
    let joined = parts.join("-");
    let mut t: String = joined
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if t.starts_with(['.', '-']) || t.is_empty() {
        t.insert(0, '_');
    }
    if t.len() > 128 {
        use sha2::Digest as _;
        let h = hex::encode(sha2::Sha256::digest(joined.as_bytes()));
        t.truncate(115);
        t.push('-');
        t.push_str(&h[..12]);
    }
    t
}

/// The tag of a file artifact: `<name>-<version>-<os>-<arch>`.
pub fn artifact_tag(a: &Artifact) -> String {
    tag_of(&[&a.name, &a.version, a.os.as_str(), a.arch.as_str()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_follow_the_grammar() {
        for (parts, want) in [
            (
                &["kubelet", "v1.33.1", "linux", "amd64"][..],
                "kubelet-v1.33.1-linux-amd64",
            ),
            (
                &["cni", "1.0+build/7", "linux", "arm64"][..],
                "cni-1.0_build_7-linux-arm64",
            ),
            (&[".hidden"][..], "_.hidden"),
            (&["-x"][..], "_-x"),
            (&[""][..], "_"),
        ] {
            assert_eq!(tag_of(parts), want);
        }
        let long = "x".repeat(300);
        let t = tag_of(&[&long]);
        assert_eq!(t.len(), 128);
        assert_ne!(t, tag_of(&[&"x".repeat(301)]));
    }

    #[test]
    fn targets() {
        let t = OciTarget::parse("oci://127.0.0.1:5000/kiln/mirror/").unwrap();
        assert_eq!(
            (t.host.as_str(), t.repo.as_str()),
            ("127.0.0.1:5000", "kiln/mirror")
        );
        assert_eq!(t.to_string(), "oci://127.0.0.1:5000/kiln/mirror");
        for bad in [
            "oci://host-without-dot/repo",
            "oci://127.0.0.1:5000/Repo",
            "oci://127.0.0.1:5000/repo:tag",
            "https://127.0.0.1/repo",
            "oci://127.0.0.1:5000",
        ] {
            assert!(OciTarget::parse(bad).is_err(), "{bad}");
        }
    }
}
