//! Where a fetch takes bytes from ([`Source`]) and how hard it tries ([`FetchOptions`]).

use std::path::PathBuf;
use std::time::Duration;

/// Where bytes may come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A mirror served over HTTP: blobs at `<base>/blobs/sha256/<hex>`.
    MirrorUrl(String),
    /// A mirror directory on disk: blobs at `<dir>/blobs/sha256/<hex>`.
    MirrorDir(PathBuf),
    /// The artifact's own upstream URLs (`url`, then `sources`).
    Upstream,
}

impl Source {
    /// Parses a `--mirror` value: `http(s)://…` is a URL, anything else a directory.
    pub fn mirror(s: &str) -> Source {
        if s.starts_with("http://") || s.starts_with("https://") {
            Source::MirrorUrl(s.trim_end_matches('/').to_string())
        } else {
            Source::MirrorDir(PathBuf::from(s))
        }
    }

    pub(crate) fn label(&self) -> String {
        match self {
            Source::MirrorUrl(u) => super::shown(u),
            Source::MirrorDir(d) => d.display().to_string(),
            Source::Upstream => "upstream".into(),
        }
    }
}

/// Tuning for a fetch run.
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Downloads in flight at once.
    pub concurrency: usize,
    /// The whole run must finish within this time.
    pub deadline: Duration,
    /// Connecting to a host must finish within this time.
    pub connect_timeout: Duration,
    /// A response that sends nothing for this long is treated as a dropped connection.
    pub idle_timeout: Duration,
    /// First backoff delay; doubled per retry.
    pub backoff_initial: Duration,
    /// Backoff never waits longer than this.
    pub backoff_max: Duration,
    /// Attempts per URL before moving to the next source.
    pub attempts_per_url: u32,
}

impl Default for FetchOptions {
    fn default() -> Self {
        FetchOptions {
            concurrency: 8,
            deadline: Duration::from_secs(3600),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            backoff_initial: Duration::from_millis(250),
            backoff_max: Duration::from_secs(10),
            attempts_per_url: 5,
        }
    }
}

/// The wait before retry number `attempt` (1-based): doubled per retry, capped.
pub(crate) fn backoff(opts: &FetchOptions, attempt: u32) -> Duration {
    let factor = 1u32 << attempt.saturating_sub(1).min(16);
    opts.backoff_initial
        .saturating_mul(factor)
        .min(opts.backoff_max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let o = FetchOptions {
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_millis(1000),
            ..FetchOptions::default()
        };
        let got: Vec<u64> = (1..=6).map(|a| backoff(&o, a).as_millis() as u64).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1000, 1000]);
    }

    #[test]
    fn mirror_parsing() {
        assert_eq!(
            Source::mirror("http://h/m/"),
            Source::MirrorUrl("http://h/m".into())
        );
        assert_eq!(Source::mirror("/srv/m"), Source::MirrorDir("/srv/m".into()));
    }
}
