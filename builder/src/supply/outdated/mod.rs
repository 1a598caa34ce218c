//! `kiln lock outdated`: for each lock entry, the newest patch of its minor and the newest
//! minor, from upstream's release indexes ([`index`]) or from another lock (offline).
//!
//! A lock is *behind* when a newer patch of a pinned minor exists: patches carry security fixes
//! and never need a skew check. A newer minor is reported, never counted as behind: crossing a
//! minor is a decision (see `docs/lock-format.md`, "Staying current").

pub mod index;
pub mod policy;
pub mod version;

use serde::Serialize;

use crate::supply::lock::{Artifact, Lock};
use index::{Endpoints, Fetcher, Index, IndexError, Listed};
use version::Version;

/// Versions a source offers for one entry, and what it listed but does not count.
#[derive(Debug, Clone, Default)]
pub struct Offered {
    /// Released versions that carry this entry's download.
    pub versions: Vec<Version>,
    /// Listed releases that do not count, with the reason.
    pub ignored: Vec<Ignored>,
    /// Where the versions came from (URLs or a lock path).
    pub source: Vec<String>,
}

/// A listed release that is not an update candidate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Ignored {
    /// The tag as listed.
    pub tag: String,
    /// Why it does not count.
    pub why: String,
}

/// Where newer versions are looked up.
pub trait Releases {
    /// The versions available for `a` (pinned at `pinned`); `Ok(None)` when this source does
    /// not know the artifact.
    fn offered(&mut self, a: &Artifact, pinned: &Version) -> Result<Option<Offered>, IndexError>;
}

/// Upstream's own indexes, fetched over HTTP.
#[derive(Debug)]
pub struct Upstream {
    endpoints: Endpoints,
    fetcher: Fetcher,
}

impl Upstream {
    /// Reads the indexes under `endpoints`.
    pub fn new(endpoints: Endpoints) -> Result<Upstream, IndexError> {
        Ok(Upstream {
            endpoints,
            fetcher: Fetcher::new()?,
        })
    }

    fn label(&mut self, url: String) -> Result<Version, IndexError> {
        let text = self.fetcher.get(&url)?;
        index::parse_stable_label(&text).map_err(|message| IndexError::Format { url, message })
    }
}

impl Releases for Upstream {
    fn offered(&mut self, a: &Artifact, pinned: &Version) -> Result<Option<Offered>, IndexError> {
        match index::index_for(&a.name) {
            None => Ok(None),
            Some(Index::Kubernetes) => {
                let line = self.endpoints.kubernetes_label(pinned.major, pinned.minor);
                let stable = self.endpoints.kubernetes_stable();
                let patch = self.label(line.clone())?;
                // A proxy or a typo that answers another minor's label must not pass for
                // "no newer patch".
                if patch.line() != pinned.line() {
                    return Err(IndexError::Format {
                        url: line,
                        message: format!(
                            "names {patch}, which is not a {}.{} release",
                            pinned.major, pinned.minor
                        ),
                    });
                }
                let versions = vec![patch, self.label(stable.clone())?];
                Ok(Some(Offered {
                    versions,
                    ignored: Vec::new(),
                    source: vec![line, stable],
                }))
            }
            Some(Index::GitHub(repo)) => {
                let url = self.endpoints.github_releases(repo);
                let text = self.fetcher.get(&url)?;
                let listed =
                    index::parse_github_releases(&text).map_err(|message| IndexError::Format {
                        url: url.clone(),
                        message,
                    })?;
                Ok(Some(candidates(a, pinned, listed, url)))
            }
        }
    }
}

/// Sorts a listing into candidates and ignored releases for one entry: a release counts only
/// when it is usable ([`Skip`]) and carries this entry's download, renamed to its version.
fn candidates(a: &Artifact, pinned: &Version, listed: Vec<Listed>, url: String) -> Offered {
    let mut out = Offered {
        source: vec![url],
        ..Offered::default()
    };
    for l in listed {
        // A tag that is no version cannot be compared; anything else newer than the pin that
        // does not count is named, so a reader sees why it was passed over.
        let Some(v) = l.version else { continue };
        if let Some(skip) = &l.skip {
            if v > *pinned {
                out.ignored.push(Ignored {
                    tag: l.tag,
                    why: skip.to_string(),
                });
            }
            continue;
        }
        let want = url_file_name(&retarget(&a.url, pinned, &v)).to_string();
        match &l.assets {
            Some(assets) if !assets.contains(&want) => {
                if v > *pinned {
                    out.ignored.push(Ignored {
                        tag: l.tag,
                        why: format!("it has no download named {want}"),
                    });
                }
            }
            _ => out.versions.push(v),
        }
    }
    out
}

/// Another lock (a site's own, or a mirror's), read offline: it offers its version of the
/// same name, OS and architecture.
#[derive(Debug)]
pub struct OtherLock(pub Lock);

impl Releases for OtherLock {
    fn offered(&mut self, a: &Artifact, _: &Version) -> Result<Option<Offered>, IndexError> {
        Ok(self.0.find(&a.name, a.os, a.arch).map(|o| Offered {
            versions: Version::parse(&o.version).into_iter().collect(),
            ignored: Vec::new(),
            source: vec![self.0.path.display().to_string()],
        }))
    }
}

/// Where an entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// No newer patch of the pinned minor.
    Current,
    /// A newer patch of the pinned minor exists.
    PatchBehind,
    /// The source does not list this artifact, or its version is not `N.N.N`.
    Unknown,
}

/// The verdict for one entry.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    /// `name@version/os/arch`.
    pub id: String,
    /// Artifact name.
    pub name: String,
    /// The pinned version.
    pub pinned: String,
    /// Where it stands.
    pub status: Status,
    /// The newest patch of the pinned minor, when newer than the pin.
    pub newest_patch: Option<String>,
    /// The newest release of a later minor, when there is one.
    pub newest_minor: Option<String>,
    /// Listed releases newer than the pin that do not count, and why.
    pub ignored: Vec<Ignored>,
    /// Where the answer came from, or why there is none.
    pub source: Vec<String>,
}

/// Checks every entry of `lock` against `releases`.
pub fn check(lock: &Lock, releases: &mut dyn Releases) -> Result<Vec<Finding>, IndexError> {
    let mut out = Vec::new();
    for a in &lock.artifacts {
        out.push(check_one(a, releases)?);
    }
    Ok(out)
}

/// Checks one entry against `releases`.
pub fn check_one(a: &Artifact, releases: &mut dyn Releases) -> Result<Finding, IndexError> {
    let mut f = Finding {
        id: a.id(),
        name: a.name.clone(),
        pinned: a.version.clone(),
        status: Status::Unknown,
        newest_patch: None,
        newest_minor: None,
        ignored: Vec::new(),
        source: Vec::new(),
    };
    let Some(pinned) = Version::parse(&a.version).filter(|v| !v.is_prerelease()) else {
        f.source
            .push(format!("version {:?} is not MAJOR.MINOR.PATCH", a.version));
        return Ok(f);
    };
    let Some(offered) = releases.offered(a, &pinned)? else {
        f.source
            .push(format!("no release index is known for {:?}", a.name));
        return Ok(f);
    };
    let newest = |same_line: bool| {
        offered
            .versions
            .iter()
            .filter(|v| !v.is_prerelease() && **v > pinned)
            .filter(|v| (v.line() == pinned.line()) == same_line)
            .filter(|v| same_line || v.line() > pinned.line())
            .max()
            .map(|v| v.spelled_like(&pinned))
    };
    f.newest_patch = newest(true);
    f.newest_minor = newest(false);
    f.status = if f.newest_patch.is_some() {
        Status::PatchBehind
    } else {
        Status::Current
    };
    f.ignored = offered.ignored;
    f.source = offered.source;
    Ok(f)
}

/// `url` with every `pinned` version number (`2.3.4`) replaced by `to`'s (`2.3.6`): where
/// upstream keeps the same artifact for another release.
pub fn retarget(url: &str, pinned: &Version, to: &Version) -> String {
    url.replace(&pinned.core(), &to.core())
}

fn url_file_name(url: &str) -> &str {
    let path = url.split(['?', '#']).next().unwrap_or(url);
    path.rsplit('/').next().unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::supply::lock::{Arch, Format, Member, Os};

    fn art(name: &str, version: &str, url: &str) -> Artifact {
        Artifact {
            name: name.into(),
            version: version.into(),
            os: Os::Linux,
            arch: Arch::Amd64,
            format: Format::TarGz,
            url: url.into(),
            sources: Vec::new(),
            size: 0,
            sha256: "0".repeat(64),
            verified: "test".into(),
            members: vec![Member {
                from: "x".into(),
                to: "bin/x".into(),
            }],
        }
    }

    struct Fixed(Vec<&'static str>);

    impl Releases for Fixed {
        fn offered(&mut self, _: &Artifact, _: &Version) -> Result<Option<Offered>, IndexError> {
            Ok(Some(Offered {
                versions: self.0.iter().filter_map(|s| Version::parse(s)).collect(),
                ..Offered::default()
            }))
        }
    }

    #[test]
    fn patch_and_minor_are_reported_apart() {
        let a = art(
            "containerd",
            "2.3.4",
            "https://h/v2.3.4/containerd-2.3.4-linux-amd64.tar.gz",
        );
        type Case<'a> = (&'a [&'a str], Status, Option<&'a str>, Option<&'a str>);
        let cases: &[Case<'_>] = &[
            (
                &["2.3.6", "2.3.5", "2.4.1", "2.4.0"],
                Status::PatchBehind,
                Some("2.3.6"),
                Some("2.4.1"),
            ),
            (&["2.3.4", "2.2.9"], Status::Current, None, None),
            (&["2.4.0"], Status::Current, None, Some("2.4.0")),
            (
                &["v2.3.10", "2.3.9"],
                Status::PatchBehind,
                Some("2.3.10"),
                None,
            ),
            (&["3.0.0", "2.5.1"], Status::Current, None, Some("3.0.0")),
        ];
        for (offered, status, patch, minor) in cases {
            let f = check_one(&a, &mut Fixed(offered.to_vec())).unwrap();
            assert_eq!(
                (
                    f.status,
                    f.newest_patch.as_deref(),
                    f.newest_minor.as_deref()
                ),
                (*status, *patch, *minor),
                "{offered:?}"
            );
        }
        let k = art(
            "kubelet",
            "v1.36.1",
            "https://dl.k8s.io/release/v1.36.1/bin/linux/amd64/kubelet",
        );
        let f = check_one(&k, &mut Fixed(vec!["v1.36.4", "v1.37.0"])).unwrap();
        assert_eq!(f.newest_patch.as_deref(), Some("v1.36.4"));
        let odd = art("agent", "2024-01", "https://h/agent");
        assert_eq!(
            check_one(&odd, &mut Fixed(vec![])).unwrap().status,
            Status::Unknown
        );
    }

    #[test]
    fn a_release_counts_only_with_this_entrys_download() {
        let a = art(
            "containerd",
            "2.3.4",
            "https://h/v2.3.4/containerd-2.3.4-windows-amd64.tar.gz",
        );
        let listed = index::parse_github_releases(
            r#"[{"tag_name":"v2.3.6","assets":[{"name":"containerd-2.3.6-linux-amd64.tar.gz"}]},
                {"tag_name":"v2.3.5","assets":[{"name":"containerd-2.3.5-windows-amd64.tar.gz"}]},
                {"tag_name":"v2.3.3","assets":[{"name":"containerd-2.3.3-windows-amd64.tar.gz"}]}]"#,
        )
        .unwrap();
        let pinned = Version::parse("2.3.4").unwrap();
        let o = candidates(&a, &pinned, listed, "u".into());
        let got: Vec<&str> = o.versions.iter().map(|v| v.text.as_str()).collect();
        assert_eq!(got, ["v2.3.5", "v2.3.3"]);
        assert_eq!(
            o.ignored[0].why,
            "it has no download named containerd-2.3.6-windows-amd64.tar.gz"
        );
    }

    #[test]
    fn retarget_moves_every_version_number() {
        let p = Version::parse("v1.36.1").unwrap();
        let t = Version::parse("v1.36.4").unwrap();
        assert_eq!(
            retarget(
                "https://dl.k8s.io/release/v1.36.1/bin/linux/amd64/kubelet",
                &p,
                &t
            ),
            "https://dl.k8s.io/release/v1.36.4/bin/linux/amd64/kubelet"
        );
    }
}
