//! What every subcommand shares: the global flags, the exit codes, the default lock, the
//! trust, network and filter options, the default cache, and how a result becomes an exit
//! code. A leaf of `cli/`: the commands import it, it imports none of them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::cli::fail::fail;
use crate::supply::lock::{self, Arch, Lock, Os};
use crate::supply::sign::{Trust, TrustedKey, Verified};

/// Exit codes shared by every subcommand (documented in `docs/cli.md`).
pub mod exit {
    /// Everything worked.
    pub const OK: u8 = 0;
    /// Any failure not covered below.
    pub const FAILURE: u8 = crate::exit::ExitClass::Failure.code();
    /// Bad command line (clap's own code).
    pub const USAGE: u8 = 2;
    /// A check failed: lock signature, artifact digest or size, or the binary gate.
    pub const VERIFY: u8 = crate::exit::ExitClass::Verify.code();
    /// A source could not deliver (network errors after retries, 404, deadline).
    pub const FETCH: u8 = crate::exit::ExitClass::Fetch.code();
    /// `kiln lock outdated`: a newer patch release of a pinned minor exists.
    pub const OUTDATED: u8 = 5;
    /// `kiln lock audit`: a pin carries a known advisory without an unexpired waiver.
    pub const ADVISORY: u8 = 6;
    /// The reader of standard output went away (`kiln … | head -1`): 128 + SIGPIPE, what a
    /// shell reports for a tool that SIGPIPE ended.
    pub const BROKEN_PIPE: u8 = crate::cli::fail::BROKEN_PIPE;
}

/// Flags every subcommand understands.
#[derive(Debug, clap::Args)]
pub struct Global {
    /// Print machine-readable JSON lines instead of human text.
    #[arg(long, global = true)]
    pub json: bool,
    /// Only print errors.
    #[arg(long, short, global = true)]
    pub quiet: bool,
}

/// The lock kiln reads when none is named.
pub const DEFAULT_LOCK: &str = "images/artifacts.lock";

/// How to trust a lock: `--trusted-key`, `--allow-unsigned`.
#[derive(Debug, Clone, Args)]
pub struct TrustArgs {
    /// minisign public key to trust instead of the embedded kiln release key.
    #[arg(long, value_name = "FILE", env = "KILN_TRUSTED_KEY")]
    pub trusted_key: Option<PathBuf>,
    /// Accept a lock without a signature (a present but bad signature is still refused).
    #[arg(long)]
    pub allow_unsigned: bool,
}

impl TrustArgs {
    /// The trust policy these flags describe.
    pub fn trust(&self) -> anyhow::Result<Trust> {
        let key = match &self.trusted_key {
            Some(p) => {
                let key = TrustedKey::from_file(p)?;
                let from_env = std::env::var_os("KILN_TRUSTED_KEY").is_some_and(|v| *p == v);
                announce_key(
                    &key,
                    p,
                    if from_env {
                        "KILN_TRUSTED_KEY"
                    } else {
                        "--trusted-key"
                    },
                );
                key
            }
            None => TrustedKey::release(),
        };
        Ok(if self.allow_unsigned {
            Trust::AllowUnsigned(key)
        } else {
            Trust::Key(key)
        })
    }
}

/// Says, on stderr and whatever `--quiet` says, which key kiln trusts when it is not the
/// embedded release key: a key swapped in through the environment must never go unnoticed.
pub fn announce_key(key: &TrustedKey, path: &Path, via: &str) {
    eprintln!(
        "kiln: trusting minisign key {} from {} ({via}), not the embedded kiln release key",
        key.id(),
        path.display()
    );
}

pub(crate) fn done(r: anyhow::Result<ExitCode>) -> anyhow::Result<ExitCode> {
    Ok(r.unwrap_or_else(|e| fail(&e)))
}

pub(crate) fn describe(v: &Verified) -> String {
    match v {
        Verified::Signed {
            key_id,
            trusted_comment,
        } => format!("signed by key {key_id} ({trusted_comment})"),
        Verified::Unsigned => "UNSIGNED (accepted because of --allow-unsigned)".into(),
    }
}

/// Loads a lock under the trust flags, naming the lock in errors.
pub fn load_lock(path: &Path, trust: &TrustArgs) -> anyhow::Result<(Lock, Verified)> {
    let trust = trust.trust()?;
    let installed = installed_lock(path);
    if let Some(p) = &installed {
        eprintln!(
            "kiln: using the lock {} (no {DEFAULT_LOCK} here; the release lock installed with \
             this kiln; --lock names another)",
            p.display()
        );
    }
    Ok(Lock::load_verified(
        installed.as_deref().unwrap_or(path),
        &trust,
    )?)
}

/// The lock file [`load_lock`] reads for `path`: `path`, or the installed release lock.
pub(crate) fn lock_in_use(path: &Path) -> PathBuf {
    installed_lock(path).unwrap_or_else(|| path.to_path_buf())
}

/// When `path` is the default lock and the current directory has none, the release lock of
/// an unpacked release archive or installed prefix (`PREFIX/bin/kiln` beside
/// `PREFIX/share/kiln/images/artifacts.lock`, as `make dist` lays it out), if there is one.
/// It is verified like any lock: the embedded release key signs it.
fn installed_lock(path: &Path) -> Option<PathBuf> {
    if path != Path::new(DEFAULT_LOCK) || path.exists() {
        return None;
    }
    let exe = std::env::current_exe().ok()?;
    let lock = exe
        .parent()?
        .parent()?
        .join("share/kiln")
        .join(DEFAULT_LOCK);
    lock.is_file().then_some(lock)
}

/// Download tuning shared by `fetch` and `mirror sync`.
#[derive(Debug, Clone, Args)]
pub struct NetArgs {
    /// Downloads in flight at once.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Give up on the whole run after this many seconds (partial downloads are kept).
    #[arg(long, default_value_t = 3600, value_name = "SECONDS")]
    pub deadline: u64,
    /// Attempts per URL before the next source is tried.
    #[arg(long, default_value_t = 5)]
    pub attempts: u32,
    /// First retry delay in milliseconds (doubles per retry, capped at 10 s).
    #[arg(long, default_value_t = 250, value_name = "MS")]
    pub backoff_ms: u64,
    /// Treat a response that sends nothing for this many seconds as dropped.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub idle_timeout: u64,
}

impl NetArgs {
    pub(crate) fn options(&self) -> crate::supply::fetch::FetchOptions {
        use std::time::Duration;
        crate::supply::fetch::FetchOptions {
            concurrency: self.concurrency.max(1),
            deadline: Duration::from_secs(self.deadline),
            idle_timeout: Duration::from_secs(self.idle_timeout.max(1)),
            backoff_initial: Duration::from_millis(self.backoff_ms),
            attempts_per_url: self.attempts.max(1),
            ..crate::supply::fetch::FetchOptions::default()
        }
    }
}

/// How to reach OCI registries for the lock's `[[image]]` entries.
#[derive(Debug, Clone, Args)]
pub struct RegistryArgs {
    /// Docker-style registry credentials (`auths.<host>.auth`). Default:
    /// $DOCKER_CONFIG/config.json, else ~/.docker/config.json, else anonymous.
    #[arg(long, value_name = "FILE", env = "KILN_REGISTRY_AUTH")]
    pub registry_auth: Option<PathBuf>,
    /// Extra CA certificates (PEM) to trust for registries, on top of the built-in roots.
    #[arg(long, value_name = "FILE", env = "KILN_REGISTRY_CA")]
    pub registry_ca: Option<PathBuf>,
    /// Speak plain HTTP (no TLS) to this registry (HOST:PORT, repeatable). For loopback
    /// registries only: credentials would cross the network in clear.
    #[arg(long, value_name = "HOST:PORT")]
    pub registry_plain_http: Vec<String>,
}

impl RegistryArgs {
    pub(crate) fn options(&self) -> anyhow::Result<crate::supply::registry::RegistryOptions> {
        use anyhow::Context as _;
        let credentials =
            crate::supply::registry::CredentialStore::load(self.registry_auth.as_deref())
                .map_err(anyhow::Error::msg)?;
        let extra_ca_pem = match &self.registry_ca {
            Some(p) => Some(
                std::fs::read(p).with_context(|| format!("reading registry CA {}", p.display()))?,
            ),
            None => None,
        };
        Ok(crate::supply::registry::RegistryOptions {
            credentials,
            extra_ca_pem,
            plain_http: self.registry_plain_http.clone(),
        })
    }
}

/// Which lock entries to act on.
#[derive(Debug, Clone, Args)]
pub struct FilterArgs {
    /// Only artifacts for this OS.
    #[arg(long)]
    pub os: Option<Os>,
    /// Only artifacts for this architecture.
    #[arg(long)]
    pub arch: Option<Arch>,
    /// Only artifacts with this name (repeatable).
    #[arg(long = "name", value_name = "NAME")]
    pub names: Vec<String>,
}

impl FilterArgs {
    pub(crate) fn apply(&self, lock: &Lock) -> Vec<lock::Artifact> {
        lock.artifacts
            .iter()
            .filter(|a| self.os.is_none_or(|o| a.os == o))
            .filter(|a| self.arch.is_none_or(|x| a.arch == x))
            .filter(|a| self.names.is_empty() || self.names.contains(&a.name))
            .cloned()
            .collect()
    }

    /// The lock's images these filters select, each keeping only the selected platforms.
    pub(crate) fn apply_images(&self, lock: &Lock) -> Vec<lock::Image> {
        lock.images
            .iter()
            .filter(|i| self.names.is_empty() || self.names.contains(&i.name))
            .filter_map(|i| {
                let mut i = i.clone();
                i.platforms.retain(|p| {
                    self.os.is_none_or(|o| p.os == o) && self.arch.is_none_or(|x| p.arch == x)
                });
                (!i.platforms.is_empty()).then_some(i)
            })
            .collect()
    }
}

/// Reads an image definition, with `kubernetes.version` replaced when
/// `--kubernetes-version` gives one.
pub(crate) fn load_def(
    path: &Path,
    kubernetes_version: Option<&str>,
) -> Result<crate::image_def::ImageDef, crate::image_def::DefError> {
    let def = crate::image_def::ImageDef::load(path)?;
    match kubernetes_version {
        Some(v) => def.with_kubernetes_version(v),
        None => Ok(def),
    }
}

/// kiln's cache directory ([`crate::plan::Dirs`], the one owner of the defaults).
pub(crate) fn default_cache() -> PathBuf {
    crate::plan::Dirs::from_env().cache
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .min(4),
        )
        .enable_all()
        .build()?)
}

/// `SOURCE failed: WHY`, naming the source once when the error text already starts with it.
pub(crate) fn failed_at(source: &str, error: &str) -> String {
    let why = error
        .strip_prefix(source)
        .and_then(|r| r.strip_prefix(": "))
        .unwrap_or(error);
    format!("{source} failed: {why}")
}

/// Says that editing `lock` removed its now-stale signature `sig` (from
/// [`crate::supply::lock_edit::write_lock`]).
pub(crate) fn say_signature_removed(lock: &Path, sig: Option<PathBuf>) {
    if let Some(sig) = sig {
        eprintln!(
            "kiln: {} changed; its old signature {} was removed: sign it again with `kiln lock sign`",
            lock.display(),
            sig.display()
        );
    }
}
