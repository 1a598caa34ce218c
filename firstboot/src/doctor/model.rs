//! What the doctor's checks share: a check's result, the options, and the node they read
//! (the leaf every check module imports).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::contract::envfile::{self, EnvFile};
use crate::contract::image_env::{
    CONTAINER_RUNTIME_ENDPOINT, DEFAULT_RUNTIME_ENDPOINT, KUBELET_CONFIG,
};
use crate::contract::paths::{self, NodePaths};
use crate::fsutil;

/// The verdict of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Verdict {
    /// Nothing wrong found.
    Ok,
    /// Could not be checked (no input for it on this node); never a failure.
    Skip,
    /// Works now but is likely to break, or is unusual.
    Warn,
    /// Breaks the join or kubelet.
    Fail,
}

impl Verdict {
    /// The word in the table and the JSON.
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Skip => "skip",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One check's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// A stable, short name: `swap`, `cgroup-v2`, `api-server-tls`, …
    pub name: &'static str,
    pub verdict: Verdict,
    /// What was found, naming the file, URL or value.
    pub detail: String,
    /// What to do about a warn or fail; empty otherwise.
    pub remedy: String,
}

impl Check {
    /// Not inlined: some fifty call sites build their `Check` through this one copy.
    #[inline(never)]
    fn new(name: &'static str, verdict: Verdict, detail: String, remedy: String) -> Check {
        Check {
            name,
            verdict,
            detail,
            remedy,
        }
    }

    pub(crate) fn ok(name: &'static str, detail: impl Into<String>) -> Check {
        Check::new(name, Verdict::Ok, detail.into(), String::new())
    }

    pub(crate) fn skip(name: &'static str, detail: impl Into<String>) -> Check {
        Check::new(name, Verdict::Skip, detail.into(), String::new())
    }

    pub(crate) fn warn(
        name: &'static str,
        detail: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Check {
        Check::new(name, Verdict::Warn, detail.into(), remedy.into())
    }

    pub(crate) fn fail(
        name: &'static str,
        detail: impl Into<String>,
        remedy: impl Into<String>,
    ) -> Check {
        Check::new(name, Verdict::Fail, detail.into(), remedy.into())
    }
}

/// What `doctor` is told.
#[derive(Debug, Clone)]
pub struct Options {
    pub root: PathBuf,
    /// The metadata service to read the clock from; node.env's `METADATA_URL` otherwise.
    /// No metadata URL at all skips the clock check: doctor never guesses one.
    pub metadata_url: Option<String>,
    /// Per network check.
    pub timeout: Duration,
    /// Whether the clock check may contact the metadata service at all.
    pub clock: bool,
    /// The metadata service's `Date` as a run saw it: the clock check compares with it and
    /// sends nothing. Only a run that read its metadata has one.
    pub date_seen: Option<crate::http::DateSeen>,
}

impl Options {
    /// Defaults for `root`: 3 s per network check.
    pub fn new(root: impl Into<PathBuf>) -> Options {
        Options {
            root: root.into(),
            metadata_url: None,
            timeout: Duration::from_secs(3),
            clock: true,
            date_seen: None,
        }
    }
}

/// What the checks read once: the contract's paths and its env files, as far as they parse.
pub(crate) struct Node {
    pub paths: NodePaths,
    pub node_env: Option<EnvFile>,
    pub image_env: Option<EnvFile>,
    pub opts: Options,
    /// Seconds since the epoch, read once so every date check agrees.
    pub now: i64,
}

impl Node {
    pub(crate) fn load(opts: &Options) -> Node {
        let paths = NodePaths::under(&opts.root);
        let read = |p: &std::path::Path| {
            fsutil::read_capped(p, envfile::MAX_LEN as u64)
                .ok()
                .flatten()
                .and_then(|t| envfile::parse(&t).ok())
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        Node {
            node_env: read(&paths.node_env),
            image_env: read(&paths.image_env),
            paths,
            opts: opts.clone(),
            now,
        }
    }

    /// A node.env value, when set and not empty.
    pub fn node(&self, key: &str) -> Option<&str> {
        self.node_env.as_ref()?.non_empty(key)
    }

    /// A node path under `--root`.
    pub fn at(&self, node_path: &str) -> PathBuf {
        paths::under(&self.opts.root, node_path)
    }

    /// Like [`Node::read`], but a file that exists and cannot be read (over 1 MiB, not text,
    /// not permitted) is an error naming it, not "missing".
    pub fn read_checked(&self, node_path: &str) -> Result<Option<String>, String> {
        fsutil::read_capped(&self.at(node_path), 1 << 20)
    }

    /// Reads a small text file under `--root`; `None` when missing or unreadable.
    pub fn read(&self, node_path: &str) -> Option<String> {
        fsutil::read_capped(&self.at(node_path), 1 << 20)
            .ok()
            .flatten()
    }

    /// A top-level KubeletConfiguration field as kubelet sees it: the config file's value,
    /// then the drop-ins kiln-firstboot writes in its `--config-dir` (the node's own, then
    /// the provisioned one; the directory is kiln's, rebuilt at every run), a later one
    /// winning, with the file it came from. YAML is read line by line (`key: value` at the
    /// left margin); a drop-in that starts with `{` is JSON (what kiln writes). The top level
    /// is enough: the checks read scalars (`failSwapOn`, `cgroupDriver`).
    pub fn kubelet_value(&self, key: &str) -> Option<(String, String)> {
        let mut found = None;
        for file in [
            self.kubelet_config(),
            paths::KUBELET_NODE_DROPIN.to_string(),
            paths::KUBELET_PROVISIONED_DROPIN.to_string(),
        ] {
            let Some(text) = self.read(&file) else {
                continue;
            };
            let value = if text.trim_start().starts_with('{') {
                crate::json::parse(&text)
                    .ok()
                    .and_then(|v| match v.get(key)? {
                        crate::json::Value::Bool(b) => {
                            Some(if *b { "true" } else { "false" }.into())
                        }
                        other => other.as_text().map(str::to_string),
                    })
            } else {
                yaml_top_level(&text, key)
            };
            if let Some(v) = value {
                found = Some((v, file));
            }
        }
        found
    }

    /// The kubelet config kubelet reads: the node's override, else image.env's.
    pub fn kubelet_config(&self) -> String {
        if self.paths.kubelet_config_override.is_file() {
            return paths::KUBELET_CONFIG_OVERRIDE.to_string();
        }
        self.image_env
            .as_ref()
            .and_then(|e| e.non_empty(KUBELET_CONFIG))
            .unwrap_or(paths::DEFAULT_KUBELET_CONFIG)
            .to_string()
    }

    /// The CRI socket's node path.
    pub fn runtime_socket(&self) -> String {
        let ep = self
            .image_env
            .as_ref()
            .and_then(|e| e.non_empty(CONTAINER_RUNTIME_ENDPOINT))
            .unwrap_or(DEFAULT_RUNTIME_ENDPOINT);
        ep.strip_prefix("unix://").unwrap_or(ep).to_string()
    }
}

/// The value of a top-level `key: value` line of a YAML text (comments and quotes dropped).
pub(crate) fn yaml_top_level(text: &str, key: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let rest = l.strip_prefix(key)?.strip_prefix(':')?;
        let v = rest.split('#').next().unwrap_or("").trim();
        Some(v.trim_matches(['"', '\'']).to_string())
    })
}
