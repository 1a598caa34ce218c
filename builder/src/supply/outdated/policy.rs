//! The patch policy of `kiln lock update --to/--patch`: a patch step within a minor is routine;
//! a minor step needs `--allow-minor`, and for Kubernetes components it comes with the
//! version-skew rules. Also where upstream publishes each artifact's checksum file.

use crate::supply::lock::{self, Artifact};

use super::retarget;
use super::version::Version;

/// How far a move goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Same major and minor, newer patch.
    Patch,
    /// A later minor (or major).
    Minor,
}

/// Why an entry cannot be moved to a version.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// Not `[v]N.N.N`, or a pre-release.
    #[error(
        "{id}: {to:?} is not a release version (expected MAJOR.MINOR.PATCH, no -rc/-beta suffix)"
    )]
    NotARelease {
        /// The entry.
        id: String,
        /// The version asked for.
        to: String,
    },
    /// Not newer than the pin.
    #[error("{id}: {to} is not newer than the pinned {pinned}; kiln only moves pins forward")]
    NotNewer {
        /// The entry.
        id: String,
        /// The version asked for.
        to: String,
        /// The pinned version.
        pinned: String,
    },
    /// A minor step without `--allow-minor`.
    #[error("{id}: {to} is a new minor ({pinned} is pinned); patch updates stay within {major}.{minor}. Pass --allow-minor to cross it, after reading the skew rules it prints")]
    MinorNotAllowed {
        /// The entry.
        id: String,
        /// The version asked for.
        to: String,
        /// The pinned version.
        pinned: String,
        /// Pinned major.
        major: u64,
        /// Pinned minor.
        minor: u64,
    },
}

/// Checks a move of `a` to `to` against the policy and says how far it goes.
pub fn step(a: &Artifact, to: &str, allow_minor: bool) -> Result<(Version, Step), PolicyError> {
    let not_release = || PolicyError::NotARelease {
        id: a.id(),
        to: to.into(),
    };
    let pinned = Version::parse(&a.version)
        .filter(|v| !v.is_prerelease())
        .ok_or_else(|| PolicyError::NotARelease {
            id: a.id(),
            to: a.version.clone(),
        })?;
    let target = Version::parse(to)
        .filter(|v| !v.is_prerelease())
        .ok_or_else(not_release)?;
    if target <= pinned {
        return Err(PolicyError::NotNewer {
            id: a.id(),
            to: to.into(),
            pinned: a.version.clone(),
        });
    }
    if target.line() == pinned.line() {
        return Ok((target, Step::Patch));
    }
    if !allow_minor {
        return Err(PolicyError::MinorNotAllowed {
            id: a.id(),
            to: to.into(),
            pinned: a.version.clone(),
            major: pinned.major,
            minor: pinned.minor,
        });
    }
    Ok((target, Step::Minor))
}

/// For `kiln lock add` replacing the entry `old` with `version`: a different minor (either
/// way) needs `allow_minor`; returns whether the replacement crosses a minor. Versions that
/// are not `N.N.N` are the author's business and pass.
pub fn replacing(old: &Artifact, version: &str, allow_minor: bool) -> Result<bool, PolicyError> {
    let (Some(from), Some(to)) = (Version::parse(&old.version), Version::parse(version)) else {
        return Ok(false);
    };
    if from.line() == to.line() {
        return Ok(false);
    }
    if !allow_minor {
        return Err(PolicyError::MinorNotAllowed {
            id: old.id(),
            to: version.into(),
            pinned: old.version.clone(),
            major: from.major,
            minor: from.minor,
        });
    }
    Ok(true)
}

/// `a` moved to `to`: version spelled like the pin, every URL and member name renamed. The
/// sha256, size and `verified` are the caller's to fill from the new download.
pub fn moved(a: &Artifact, to: &Version) -> Artifact {
    let pinned = Version::parse(&a.version).unwrap_or_else(|| to.clone());
    let mut b = a.clone();
    b.version = to.spelled_like(&pinned);
    b.url = retarget(&a.url, &pinned, to);
    b.sources = a.sources.iter().map(|s| retarget(s, &pinned, to)).collect();
    for m in &mut b.members {
        m.from = retarget(&m.from, &pinned, to);
    }
    b.size = 0;
    b
}

/// Where upstream publishes the checksum of `a`'s download, for the artifacts kiln knows:
/// Kubernetes and CNI plugins and crictl a `.sha256` beside the file, containerd a
/// `.sha256sum` beside it, runc one `runc.sha256sum` for the whole release.
pub fn checksum_url(a: &Artifact) -> Option<String> {
    let dir = a.url.rsplit_once('/')?.0;
    Some(match a.name.as_str() {
        "kubelet" | "kubeadm" | "kubectl" | "kube-proxy" | "cni-plugins" | "crictl" => {
            format!("{}.sha256", a.url)
        }
        "containerd" => format!("{}.sha256sum", a.url),
        "runc" => format!("{dir}/runc.sha256sum"),
        _ => return None,
    })
}

/// The sha256 a checksum file gives for `file_name`: the `HEX  NAME` (or `HEX *NAME`) line
/// naming it, or the only hash of a file that holds exactly one and no other name.
pub fn published_sha256(text: &str, file_name: &str) -> Option<String> {
    let mut lone = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(hex) = words.next().map(str::to_ascii_lowercase) else {
            continue;
        };
        if !lock::is_sha256_hex(&hex) {
            continue;
        }
        match words.next().map(|n| n.trim_start_matches('*')) {
            Some(n) if n.rsplit('/').next() == Some(file_name) => return Some(hex),
            Some(_) => lone.push(None),
            None => lone.push(Some(hex)),
        }
    }
    match lone.as_slice() {
        [Some(h)] => Some(h.clone()),
        _ => None,
    }
}

/// True for the Kubernetes components whose versions the skew policy governs.
pub fn is_kubernetes(name: &str) -> bool {
    matches!(name, "kubelet" | "kubeadm" | "kubectl" | "kube-proxy")
}

/// The Kubernetes version-skew rules that apply when a minor changes, after
/// <https://kubernetes.io/releases/version-skew-policy/>.
pub const SKEW_RULES: &str = "\
Kubernetes version-skew policy (https://kubernetes.io/releases/version-skew-policy/):
  - kubelet and kube-proxy must not be newer than kube-apiserver, and may be up to three
    minor versions older (a 1.37 API server supports 1.37, 1.36, 1.35 and 1.34 kubelets);
  - kube-controller-manager, kube-scheduler and cloud-controller-manager must not be newer
    than kube-apiserver, and may be one minor older;
  - kubectl is supported within one minor (older or newer) of kube-apiserver;
  - in an HA control plane, kube-apiserver instances may differ by one minor at most;
  - upgrade the control plane first, then the nodes; kubeadm upgrades one minor at a time.
So: upgrade every control plane to the new minor before baking nodes with this lock, and
never run a node whose kubelet is newer than the API server it joins.";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supply::lock::{Arch, Format, Member, Os};

    fn art(name: &str, version: &str, url: &str, from: &str) -> Artifact {
        Artifact {
            name: name.into(),
            version: version.into(),
            os: Os::Linux,
            arch: Arch::Amd64,
            format: Format::Binary,
            url: url.into(),
            sources: Vec::new(),
            size: 5,
            sha256: "0".repeat(64),
            verified: "test".into(),
            members: vec![Member {
                from: from.into(),
                to: "bin/x".into(),
            }],
        }
    }

    #[test]
    fn patch_is_routine_minor_needs_a_flag() {
        let a = art(
            "kubelet",
            "v1.36.1",
            "https://dl.k8s.io/release/v1.36.1/bin/linux/amd64/kubelet",
            "kubelet",
        );
        assert_eq!(step(&a, "v1.36.4", false).unwrap().1, Step::Patch);
        assert_eq!(step(&a, "1.36.4", false).unwrap().1, Step::Patch);
        let e = step(&a, "v1.37.0", false).unwrap_err().to_string();
        assert!(e.contains("--allow-minor"), "{e}");
        assert_eq!(step(&a, "v1.37.0", true).unwrap().1, Step::Minor);
        for bad in ["v1.36.1", "v1.36.0", "v1.37.0-rc.1", "latest"] {
            assert!(step(&a, bad, true).is_err(), "{bad}");
        }
        let b = moved(&a, &step(&a, "1.36.4", false).unwrap().0);
        assert_eq!(b.version, "v1.36.4");
        assert_eq!(
            b.url,
            "https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet"
        );
        assert_eq!(b.size, 0);
        assert_eq!(checksum_url(&b).unwrap(), format!("{}.sha256", b.url));
    }

    #[test]
    fn add_replacing_an_entry_keeps_its_minor_unless_asked() {
        let a = art("containerd", "2.3.4", "https://h/v2.3.4/c-2.3.4.tgz", "c");
        assert!(!replacing(&a, "2.3.6", false).unwrap());
        assert!(!replacing(&a, "2.3.1", false).unwrap());
        assert!(!replacing(&a, "nightly", false).unwrap());
        for other in ["2.4.0", "2.2.9", "3.0.0"] {
            assert!(replacing(&a, other, false).is_err(), "{other}");
            assert!(replacing(&a, other, true).unwrap(), "{other}");
        }
    }

    #[test]
    fn checksum_files() {
        let r = art("runc", "1.5.1", "https://h/v1.5.1/runc.amd64", "runc.amd64");
        assert_eq!(checksum_url(&r).unwrap(), "https://h/v1.5.1/runc.sha256sum");
        assert_eq!(
            checksum_url(&art("agent", "1.0.0", "https://h/a", "a")),
            None
        );
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let sums = format!("{a}  runc.amd64\n{b} *runc.arm64\n");
        assert_eq!(published_sha256(&sums, "runc.arm64"), Some(b.clone()));
        assert_eq!(published_sha256(&sums, "runc.amd64"), Some(a.clone()));
        assert_eq!(published_sha256(&sums, "runc.s390x"), None);
        assert_eq!(
            published_sha256(&format!("{a}\n"), "kubelet"),
            Some(a.clone())
        );
        assert_eq!(
            published_sha256(&format!("{}  x.tgz\n", a.to_uppercase()), "x.tgz"),
            Some(a.clone())
        );
        assert_eq!(published_sha256("<html>", "x"), None);
    }
}
