//! Upstream release indexes: which index lists an artifact's releases, fetching it over HTTP
//! (base URLs are arguments, so tests point them at a loopback server), and pure parsers for
//! the two formats: Kubernetes' `stable-1.N.txt` labels and GitHub's release listing JSON.

use std::collections::HashMap;
use std::time::Duration;

use serde::Deserialize;

use super::version::Version;
use crate::exit::ExitClass;

/// The Kubernetes release bucket (`<base>/release/stable-1.N.txt`).
pub const KUBERNETES_INDEX: &str = "https://dl.k8s.io";
/// The GitHub REST API (`<base>/repos/OWNER/REPO/releases`).
pub const GITHUB_API: &str = "https://api.github.com";

/// The most bytes kiln reads from one index response.
const MAX_INDEX: usize = 16 << 20;

/// Where an artifact's releases are listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Index {
    /// Kubernetes' own release labels: `stable-1.N.txt` (newest patch of a minor) and
    /// `stable.txt` (newest release).
    Kubernetes,
    /// A GitHub repository's release listing.
    GitHub(&'static str),
}

/// The index for an artifact name kiln knows, `None` for any other name.
pub fn index_for(name: &str) -> Option<Index> {
    Some(match name {
        "kubelet" | "kubeadm" | "kubectl" | "kube-proxy" => Index::Kubernetes,
        "containerd" => Index::GitHub("containerd/containerd"),
        "runc" => Index::GitHub("opencontainers/runc"),
        "cni-plugins" => Index::GitHub("containernetworking/plugins"),
        "crictl" => Index::GitHub("kubernetes-sigs/cri-tools"),
        _ => return None,
    })
}

/// Why a listed release does not count as an update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skip {
    /// `draft: true`: not published.
    Draft,
    /// `prerelease: true`, or a tag with a `-rc.1`/`-beta.0` style suffix.
    PreRelease,
    /// The tag is not `[v]N.N.N`.
    NotAVersion,
    /// Upstream withdrew it: its title says so, or it lists no downloads at all.
    Withdrawn(String),
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::Draft => f.write_str("draft"),
            Skip::PreRelease => f.write_str("pre-release"),
            Skip::NotAVersion => f.write_str("tag is not a version"),
            Skip::Withdrawn(why) => write!(f, "withdrawn ({why})"),
        }
    }
}

/// One release as an index lists it.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The tag as written (`v2.3.6`).
    pub tag: String,
    /// The parsed version, when the tag is one.
    pub version: Option<Version>,
    /// Why it is not a candidate; `None` for a usable release.
    pub skip: Option<Skip>,
    /// Download file names the release carries; `None` when the index does not list them.
    pub assets: Option<Vec<String>>,
}

#[derive(Deserialize)]
struct GhRelease {
    tag_name: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    draft: bool,
    #[serde(default)]
    prerelease: bool,
    #[serde(default)]
    assets: Vec<GhAsset>,
}

#[derive(Deserialize)]
struct GhAsset {
    name: String,
}

/// Words in a release title that mark it withdrawn.
const WITHDRAWN_WORDS: &[&str] = &["withdrawn", "yanked", "retracted"];

/// The withdrawn marker in a (lower-cased) title, when one is set off as a label: at the
/// start, in brackets or parentheses, or followed by a colon. A title that only mentions the
/// word ("2.3.6 (replaces withdrawn 2.3.5)") does not withdraw its own release.
fn withdrawn_marker(title: &str) -> Option<&'static str> {
    WITHDRAWN_WORDS.iter().copied().find(|w| {
        title.starts_with(w)
            || [
                format!("({w}"),
                format!("[{w}"),
                format!("{w}:"),
                format!("{w})"),
                format!("{w}]"),
            ]
            .iter()
            .any(|m| title.contains(m.as_str()))
    })
}

/// Parses a GitHub release listing (`GET /repos/OWNER/REPO/releases`): a JSON array of
/// objects with `tag_name`, `name`, `draft`, `prerelease` and `assets[].name`.
///
/// The withdrawn rule: a release whose title (`name`) carries "withdrawn", "yanked" or
/// "retracted" (any case) as a label (at its start, in brackets or parentheses, or before a
/// colon), or that lists no assets at all, is withdrawn.
pub fn parse_github_releases(text: &str) -> Result<Vec<Listed>, String> {
    let list: Vec<GhRelease> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    Ok(list
        .into_iter()
        .map(|r| {
            let version = Version::parse(&r.tag_name);
            let title = r.name.unwrap_or_default().to_ascii_lowercase();
            let skip = if r.draft {
                Some(Skip::Draft)
            } else if version.is_none() {
                Some(Skip::NotAVersion)
            } else if r.prerelease || version.as_ref().is_some_and(Version::is_prerelease) {
                Some(Skip::PreRelease)
            } else if let Some(w) = withdrawn_marker(&title) {
                Some(Skip::Withdrawn(format!("its title says {w:?}")))
            } else if r.assets.is_empty() {
                Some(Skip::Withdrawn("it lists no downloads".into()))
            } else {
                None
            };
            Listed {
                tag: r.tag_name,
                version,
                skip,
                assets: Some(r.assets.into_iter().map(|a| a.name).collect()),
            }
        })
        .collect())
}

/// Parses a Kubernetes release label file (`stable-1.36.txt` holds `v1.36.4` and a newline).
pub fn parse_stable_label(text: &str) -> Result<Version, String> {
    let t = text.trim();
    match Version::parse(t) {
        Some(v) if !v.is_prerelease() && !t.contains(char::is_whitespace) => Ok(v),
        _ => Err(format!(
            "expected one release version such as v1.36.4, found {:?}",
            t.chars().take(80).collect::<String>()
        )),
    }
}

/// The base URLs of the upstream indexes.
#[derive(Debug, Clone)]
pub struct Endpoints {
    /// Kubernetes release bucket, default [`KUBERNETES_INDEX`].
    pub kubernetes: String,
    /// GitHub API, default [`GITHUB_API`].
    pub github_api: String,
}

impl Default for Endpoints {
    fn default() -> Self {
        Endpoints {
            kubernetes: KUBERNETES_INDEX.into(),
            github_api: GITHUB_API.into(),
        }
    }
}

impl Endpoints {
    /// The label file for the newest patch of `major.minor`.
    pub fn kubernetes_label(&self, major: u64, minor: u64) -> String {
        format!(
            "{}/release/stable-{major}.{minor}.txt",
            trim(&self.kubernetes)
        )
    }

    /// The label file for the newest Kubernetes release.
    pub fn kubernetes_stable(&self) -> String {
        format!("{}/release/stable.txt", trim(&self.kubernetes))
    }

    /// The first page (the newest 100 releases) of a repository's release listing.
    pub fn github_releases(&self, repo: &str) -> String {
        format!(
            "{}/repos/{repo}/releases?per_page=100",
            trim(&self.github_api)
        )
    }
}

fn trim(s: &str) -> &str {
    s.trim_end_matches('/')
}

/// Why an index could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// No answer after retries (connect errors, resets, timeouts, 408/429/5xx).
    #[error("release index {url} could not be read: {message}")]
    Unreachable {
        /// The index URL.
        url: String,
        /// The last error.
        message: String,
    },
    /// A definite refusal (404, 403, ...).
    #[error("release index {url}: HTTP {status} (expected 200)")]
    Status {
        /// The index URL.
        url: String,
        /// The HTTP status.
        status: u16,
    },
    /// The body is not the index format kiln expects.
    #[error("release index {url} is not in the expected format: {message}")]
    Format {
        /// The index URL.
        url: String,
        /// What was wrong.
        message: String,
    },
}

impl IndexError {
    /// An index that could not be fetched exits 4; one that is not an index is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            IndexError::Unreachable { .. } | IndexError::Status { .. } => ExitClass::Fetch,
            IndexError::Format { .. } => ExitClass::Failure,
        }
    }
}

/// Reads index documents over HTTP, each URL once per run.
#[derive(Debug)]
pub struct Fetcher {
    rt: tokio::runtime::Runtime,
    client: reqwest::Client,
    seen: HashMap<String, String>,
    attempts: u32,
}

impl Fetcher {
    /// A fetcher with a 10 s connect timeout, a 60 s timeout per request and 3 attempts.
    pub fn new() -> Result<Fetcher, IndexError> {
        let build = |e: &dyn std::fmt::Display| IndexError::Unreachable {
            url: String::new(),
            message: format!("starting the HTTP client: {e}"),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| build(&e))?;
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| build(&e))?;
        Ok(Fetcher {
            rt,
            client,
            seen: HashMap::new(),
            attempts: 3,
        })
    }

    /// The body of `url` as text; transient failures are retried with backoff.
    pub fn get(&mut self, url: &str) -> Result<String, IndexError> {
        if let Some(t) = self.seen.get(url) {
            return Ok(t.clone());
        }
        let mut wait = Duration::from_millis(250);
        let mut attempt = 0;
        let text = loop {
            attempt += 1;
            match self.rt.block_on(get_once(&self.client, url)) {
                Ok(t) => break t,
                Err(Attempt::Final(e)) => return Err(e),
                Err(Attempt::Transient(message)) => {
                    if attempt >= self.attempts {
                        return Err(IndexError::Unreachable {
                            url: url.into(),
                            message,
                        });
                    }
                    std::thread::sleep(wait);
                    wait *= 2;
                }
            }
        };
        self.seen.insert(url.into(), text.clone());
        Ok(text)
    }
}

enum Attempt {
    Transient(String),
    Final(IndexError),
}

async fn get_once(client: &reqwest::Client, url: &str) -> Result<String, Attempt> {
    let resp = client
        .get(url)
        .header("Accept", "application/vnd.github+json, text/plain")
        .send()
        .await
        .map_err(|e| Attempt::Transient(chain(&e)))?;
    let status = resp.status();
    if status.as_u16() == 408 || status.as_u16() == 429 || status.is_server_error() {
        return Err(Attempt::Transient(format!("HTTP {status}")));
    }
    if !status.is_success() {
        return Err(Attempt::Final(IndexError::Status {
            url: url.into(),
            status: status.as_u16(),
        }));
    }
    if resp.content_length().is_some_and(|n| n > MAX_INDEX as u64) {
        return Err(Attempt::Final(too_big(url)));
    }
    let mut body = Vec::new();
    let mut resp = resp;
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| Attempt::Transient(chain(&e)))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_INDEX {
            return Err(Attempt::Final(too_big(url)));
        }
    }
    String::from_utf8(body).map_err(|_| {
        Attempt::Final(IndexError::Format {
            url: url.into(),
            message: "not UTF-8".into(),
        })
    })
}

fn too_big(url: &str) -> IndexError {
    IndexError::Format {
        url: url.into(),
        message: format!("larger than {MAX_INDEX} bytes"),
    }
}

fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn github_listing_marks_what_does_not_count() {
        let text = r#"[
          {"tag_name":"v2.4.0-rc.1","name":"containerd 2.4.0-rc.1","draft":false,"prerelease":false,"assets":[{"name":"a"}]},
          {"tag_name":"v2.3.7","name":"containerd 2.3.7","draft":false,"prerelease":true,"assets":[{"name":"a"}]},
          {"tag_name":"v2.3.6","name":"containerd 2.3.6","draft":false,"prerelease":false,"assets":[{"name":"a"}],"published_at":"2026-09-24T23:00:00Z"},
          {"tag_name":"v2.3.5","name":"containerd 2.3.5 (WITHDRAWN)","draft":false,"prerelease":false,"assets":[{"name":"a"}]},
          {"tag_name":"v2.3.8","name":"containerd 2.3.8","draft":false,"prerelease":false,"assets":[]},
          {"tag_name":"v2.3.9","draft":true,"prerelease":false,"assets":[{"name":"a"}]},
          {"tag_name":"api/v1.0.0","name":"api","draft":false,"prerelease":false,"assets":[{"name":"a"}]},
          {"tag_name":"v2.3.11","name":"containerd 2.3.11 (replaces withdrawn 2.3.9)","assets":[{"name":"a"}]},
          {"tag_name":"v2.3.12","name":"[Yanked] containerd 2.3.12","assets":[{"name":"a"}]},
          {"tag_name":"v2.3.13","name":"Retracted: containerd 2.3.13","assets":[{"name":"a"}]}
        ]"#;
        let got: Vec<(String, Option<Skip>)> = parse_github_releases(text)
            .unwrap()
            .into_iter()
            .map(|l| (l.tag, l.skip))
            .collect();
        let w = |s: &str| Some(Skip::Withdrawn(s.into()));
        assert_eq!(
            got,
            vec![
                ("v2.4.0-rc.1".into(), Some(Skip::PreRelease)),
                ("v2.3.7".into(), Some(Skip::PreRelease)),
                ("v2.3.6".into(), None),
                ("v2.3.5".into(), w("its title says \"withdrawn\"")),
                ("v2.3.8".into(), w("it lists no downloads")),
                ("v2.3.9".into(), Some(Skip::Draft)),
                ("api/v1.0.0".into(), Some(Skip::NotAVersion)),
                ("v2.3.11".into(), None),
                ("v2.3.12".into(), w("its title says \"yanked\"")),
                ("v2.3.13".into(), w("its title says \"retracted\"")),
            ]
        );
        assert!(parse_github_releases("{\"message\":\"rate limited\"}").is_err());
    }

    #[test]
    fn stable_labels() {
        assert_eq!(parse_stable_label("v1.36.4\n").unwrap().core(), "1.36.4");
        for bad in ["", "v1.37.0-rc.0\n", "<html>", "v1.36.4 v1.36.5"] {
            assert!(parse_stable_label(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn endpoints_are_arguments() {
        let e = Endpoints {
            kubernetes: "http://127.0.0.1:1/".into(),
            github_api: "http://127.0.0.1:2".into(),
        };
        assert_eq!(
            e.kubernetes_label(1, 36),
            "http://127.0.0.1:1/release/stable-1.36.txt"
        );
        assert_eq!(
            e.github_releases("containerd/containerd"),
            "http://127.0.0.1:2/repos/containerd/containerd/releases?per_page=100"
        );
        assert_eq!(
            index_for("containerd"),
            Some(Index::GitHub("containerd/containerd"))
        );
        assert_eq!(index_for("my-agent"), None);
    }
}
