//! Version skew between the artifacts of one lock: whether the containerd a lock pins for a
//! platform can serve the kubelet it pins there.
//!
//! The rule (docs/lock-format.md, "Version skew"):
//!
//! - kubelet 1.37 and later need containerd 2.0 or later. Kubernetes 1.35 was the last
//!   release to support containerd 1.x (Amazon EKS, "Review release notes for Kubernetes
//!   versions on standard support", Kubernetes 1.35: "Containerd 1.x End of Support"), and
//!   kubelet 1.36 logs that its fallback for runtimes without the CRI `RuntimeConfig` call
//!   (which containerd 1.x lacks; KEP-4033 "Discover cgroup driver from CRI") "will be removed
//!   in 1.37". A lock pairing them is refused: `kiln plan` marks the target, `kiln bake`
//!   stops before reading a blob.
//! - kubelet 1.36 with containerd 1.x still runs, on that fallback: a warning.
//!
//! A version kiln cannot read (a stand-in's `1.36.4-standin` reads as 1.36) is no skew: the
//! rule needs both numbers.

use std::fmt;

use crate::supply::lock::{Arch, Lock, Os};

/// A lock whose containerd cannot serve its kubelet on one platform.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{lock}: kubelet {kubelet} and containerd {containerd} for {os}/{arch} cannot run together: \
     kubelet 1.37 and later need containerd 2.0 or later (Kubernetes 1.35 was the last release \
     to support containerd 1.x, and kubelet 1.36 says its fallback for runtimes without the CRI \
     RuntimeConfig call is removed in 1.37); pin containerd 2.x for {os}/{arch} (`kiln lock move`) or a kubelet \
     before 1.37"
)]
pub struct SkewError {
    /// The lock file, as the caller names it.
    pub lock: String,
    /// The kubelet version the lock pins.
    pub kubelet: String,
    /// The containerd version the lock pins.
    pub containerd: String,
    /// The platform.
    pub os: Os,
    /// The platform's architecture.
    pub arch: Arch,
}

/// A pairing that runs today but not after the next kubelet minor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkewWarning {
    /// The kubelet version the lock pins.
    pub kubelet: String,
    /// The containerd version the lock pins.
    pub containerd: String,
}

impl fmt::Display for SkewWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kubelet {} runs containerd {} on its fallback for runtimes without the CRI \
             RuntimeConfig call, which kubelet 1.37 removes: move containerd to 2.x before \
             kubelet 1.37 (docs/lock-format.md#version-skew)",
            self.kubelet, self.containerd
        )
    }
}

/// `(major, minor)` of a version such as `v1.36.4`, `1.36.4-standin` or `2.3.6`.
fn major_minor(version: &str) -> Option<(u32, u32)> {
    let v = version.strip_prefix('v').unwrap_or(version);
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The skew rule for one pair of versions: `Err` refuses, `Ok(Some)` warns.
pub fn check_versions(
    lock: &str,
    kubelet: &str,
    containerd: &str,
    os: Os,
    arch: Arch,
) -> Result<Option<SkewWarning>, SkewError> {
    let (Some(k), Some((c_major, _))) = (major_minor(kubelet), major_minor(containerd)) else {
        return Ok(None);
    };
    if c_major >= 2 || k < (1, 36) {
        return Ok(None);
    }
    if k >= (1, 37) {
        return Err(SkewError {
            lock: lock.to_string(),
            kubelet: kubelet.to_string(),
            containerd: containerd.to_string(),
            os,
            arch,
        });
    }
    Ok(Some(SkewWarning {
        kubelet: kubelet.to_string(),
        containerd: containerd.to_string(),
    }))
}

/// The skew rule for what `lock` pins for `os`/`arch`; a platform without both kubelet and
/// containerd has no skew to check.
pub fn check(lock: &Lock, os: Os, arch: Arch) -> Result<Option<SkewWarning>, SkewError> {
    match (
        lock.find("kubelet", os, arch),
        lock.find("containerd", os, arch),
    ) {
        (Some(k), Some(c)) => check_versions(
            &lock.path.display().to_string(),
            &k.version,
            &c.version,
            os,
            arch,
        ),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(k: &str, c: &str) -> Result<Option<SkewWarning>, SkewError> {
        check_versions("artifacts.lock", k, c, Os::Linux, Arch::Amd64)
    }

    #[test]
    fn kubelet_1_37_with_containerd_1_is_refused_naming_both_and_the_fix() {
        let e = run("v1.37.0", "1.7.28").unwrap_err().to_string();
        assert!(
            e.starts_with("artifacts.lock: kubelet v1.37.0 and containerd 1.7.28 for linux/amd64"),
            "{e}"
        );
        assert!(
            e.contains("need containerd 2.0 or later") && e.contains("kiln lock move"),
            "{e}"
        );
        assert!(run("1.40.1", "v1.6.20").is_err());
    }

    #[test]
    fn kubelet_1_36_with_containerd_1_warns_and_2_x_is_quiet() {
        let w = run("v1.36.4", "1.6.20").unwrap().expect("a warning");
        assert!(w.to_string().contains("kubelet 1.37 removes"), "{w}");
        // The fixture's stand-in version reads as 1.36.
        assert!(run("1.36.4-standin", "1.6.20").unwrap().is_some());
        assert_eq!(run("v1.37.0", "2.0.0").unwrap(), None);
        assert_eq!(run("v1.36.4", "2.3.6").unwrap(), None);
        assert_eq!(run("v1.35.2", "1.7.28").unwrap(), None);
    }

    #[test]
    fn versions_kiln_cannot_read_are_no_skew() {
        assert_eq!(run("latest", "1.6.20").unwrap(), None);
        assert_eq!(run("v1.37.0", "main").unwrap(), None);
        assert_eq!(major_minor("v1.36.4"), Some((1, 36)));
        assert_eq!(major_minor("1.6.20~ds1"), Some((1, 6)));
        assert_eq!(major_minor("7"), None);
    }
}
