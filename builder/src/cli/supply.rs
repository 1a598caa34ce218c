//! Command line for the supply chain: `kiln lock`, `kiln inspect`, `kiln fetch`, `kiln mirror`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::cli::fail::{classify, fail};
use crate::cli::{exit, Global};
use crate::supply::inspect;
use crate::supply::lock::{self, Arch, Lock, Os};
use crate::supply::sign::{self, Trust, TrustedKey, Verified};

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

/// `kiln lock …`
#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// Check a lock's signature and contents; exit 3 on any mismatch.
    Verify(LockVerifyArgs),
    /// Sign a lock with a minisign secret key (writes LOCK.minisig).
    Sign(LockSignArgs),
    /// Authoring (needs network): download an artifact, hash it, and add or replace its entry.
    #[command(disable_version_flag = true)]
    Add(LockAddArgs),
    /// Authoring (needs network): re-download entries, confirm their sha256, record sizes;
    /// --patch or --to moves them to a newer release, checked against upstream's checksum.
    Update(LockUpdateArgs),
    /// Report entries with a newer patch (exit 5) or minor upstream, or in another lock.
    Outdated(crate::cli::outdated::OutdatedArgs),
}

/// `kiln lock add`
#[derive(Debug, Args)]
// The evidence a new pin rests on is required before anything is downloaded.
#[command(group(
    clap::ArgGroup::new("evidence")
        .required(true)
        .multiple(true)
        .args(["checksum_url", "sha256", "verified"])
))]
pub struct LockAddArgs {
    /// The lock file (created if missing).
    #[arg(default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    /// Artifact name.
    #[arg(long)]
    pub name: String,
    /// Artifact version.
    #[arg(long)]
    pub version: String,
    /// Target OS.
    #[arg(long)]
    pub os: Os,
    /// Target architecture.
    #[arg(long)]
    pub arch: Arch,
    /// binary, tar.gz or zip.
    #[arg(long, value_parser = ["binary", "tar.gz", "zip"])]
    pub format: String,
    /// Upstream URL.
    #[arg(long)]
    pub url: String,
    /// More upstream URLs with the same bytes (repeatable).
    #[arg(long = "source")]
    pub sources: Vec<String>,
    /// FROM=TO member mapping (repeatable; for a binary, FROM is the URL's file name).
    #[arg(long = "member", required = true)]
    pub members: Vec<String>,
    /// Upstream's published checksum file (`HEX` or `HEX  NAME`); must match the download.
    #[arg(long, conflicts_with = "sha256")]
    pub checksum_url: Option<String>,
    /// The sha256 upstream publishes, checked against the download.
    #[arg(long)]
    pub sha256: Option<String>,
    /// What was checked, in words (required without --checksum-url).
    #[arg(long)]
    pub verified: Option<String>,
    /// Let this entry replace one of another minor (prints the Kubernetes version-skew rules).
    #[arg(long)]
    pub allow_minor: bool,
    #[command(flatten)]
    pub net: NetArgs,
}

/// `kiln lock update`
#[derive(Debug, Args)]
pub struct LockUpdateArgs {
    /// The lock file.
    #[arg(default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[command(flatten)]
    pub net: NetArgs,
    /// Move the selected entries (--name required) to this release: a newer patch of the
    /// pinned minor, or with --allow-minor a later minor.
    #[arg(
        long,
        value_name = "VERSION",
        requires = "names",
        conflicts_with = "patch"
    )]
    pub to: Option<String>,
    /// Move every selected entry to the newest patch of its minor that upstream lists.
    #[arg(long)]
    pub patch: bool,
    /// Let --to cross into a later minor (prints the Kubernetes version-skew rules).
    #[arg(long, requires = "to")]
    pub allow_minor: bool,
    #[command(flatten)]
    pub index: crate::cli::outdated::IndexArgs,
    /// Sign the lock after writing it, with this minisign secret key.
    #[arg(long, short = 's', value_name = "FILE", env = "KILN_SECRET_KEY")]
    pub secret_key: Option<PathBuf>,
    /// Name of an environment variable holding the secret key's password.
    #[arg(long, value_name = "VAR", requires = "secret_key")]
    pub password_env: Option<String>,
}

/// `kiln lock verify`
#[derive(Debug, Args)]
pub struct LockVerifyArgs {
    /// The lock file.
    #[arg(default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// `kiln lock sign`
#[derive(Debug, Args)]
pub struct LockSignArgs {
    /// The lock file.
    #[arg(default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    /// minisign secret key file.
    #[arg(long, short = 's', value_name = "FILE", env = "KILN_SECRET_KEY")]
    pub secret_key: PathBuf,
    /// Name of an environment variable holding the key's password (unencrypted keys need none).
    #[arg(long, value_name = "VAR")]
    pub password_env: Option<String>,
}

/// `kiln inspect`
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Binaries to inspect.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Refuse (exit 3) any file not built for this OS.
    #[arg(long, requires = "arch")]
    pub os: Option<Os>,
    /// Refuse (exit 3) any file not built for this architecture.
    #[arg(long, requires = "os")]
    pub arch: Option<Arch>,
}

fn done(r: anyhow::Result<ExitCode>) -> anyhow::Result<ExitCode> {
    Ok(r.unwrap_or_else(|e| fail(&e)))
}

/// Runs `kiln lock …`.
pub fn run_lock(cmd: LockCommand, global: &Global) -> anyhow::Result<ExitCode> {
    done(match cmd {
        LockCommand::Verify(a) => lock_verify(a, global),
        LockCommand::Sign(a) => lock_sign(a, global),
        LockCommand::Add(a) => lock_add(a, global),
        LockCommand::Update(a) => lock_update(a, global),
        LockCommand::Outdated(a) => crate::cli::outdated::run(a, global),
    })
}

fn describe(v: &Verified) -> String {
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
    Ok(Lock::load_verified(path, &trust)?)
}

fn lock_verify(a: LockVerifyArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (lock, verified) = load_lock(&a.lock, &a.trust)?;
    if global.json {
        let (signed, key) = match &verified {
            Verified::Signed { key_id, .. } => (true, Some(key_id.clone())),
            Verified::Unsigned => (false, None),
        };
        println!(
            "{}",
            serde_json::json!({
                "lock": a.lock, "ok": true, "signed": signed, "key_id": key,
                "artifacts": lock.artifacts.len(), "total_size": lock.total_size(),
            })
        );
    } else if !global.quiet {
        let unsized_ = lock
            .artifacts
            .iter()
            .filter(|x| x.known_size().is_none())
            .count();
        println!(
            "ok: {} {}; {} artifacts, {} bytes recorded ({} without a recorded size)",
            a.lock.display(),
            describe(&verified),
            lock.artifacts.len(),
            lock.total_size(),
            unsized_
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn lock_sign(a: LockSignArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (sig_path, artifacts) = sign_lock(&a.lock, &a.secret_key, a.password_env.as_deref())?;
    if global.json {
        println!(
            "{}",
            serde_json::json!({"lock": a.lock, "signature": sig_path, "artifacts": artifacts})
        );
    } else if !global.quiet {
        println!("signed {} -> {}", a.lock.display(), sig_path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Validates the lock at `path` and writes `path.minisig` signed with `secret_key`; returns
/// the signature path and the number of artifacts.
pub(crate) fn sign_lock(
    path: &Path,
    secret_key: &Path,
    password_env: Option<&str>,
) -> anyhow::Result<(PathBuf, usize)> {
    let bytes = std::fs::read(path).with_context(|| format!("reading lock {}", path.display()))?;
    let text = std::str::from_utf8(&bytes)
        .with_context(|| format!("lock {} is not UTF-8", path.display()))?;
    // Never sign something kiln itself would refuse to read.
    let lock = Lock::parse(text, path)?;
    let password = match password_env {
        Some(var) => {
            Some(std::env::var(var).with_context(|| format!("reading password from ${var}"))?)
        }
        None => None,
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let comment = format!("timestamp:{now}\tfile:{name}");
    let sig = sign::sign(&bytes, secret_key, password, &comment)?;
    let sig_path = sign::signature_path(path);
    crate::supply::store::write_atomic(&sig_path, sig.as_bytes())?;
    Ok((sig_path, lock.artifacts.len()))
}

/// Runs `kiln inspect`.
pub fn run_inspect(a: InspectArgs, global: &Global) -> anyhow::Result<ExitCode> {
    done(inspect_files(a, global))
}

fn inspect_files(a: InspectArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let mut worst: Option<anyhow::Error> = None;
    for f in &a.files {
        let what = f.display().to_string();
        let result = inspect::inspect_file(f).and_then(|info| {
            if let (Some(os), Some(arch)) = (a.os, a.arch) {
                info.check(&what, os, arch)?;
            }
            Ok(info)
        });
        match result {
            Ok(info) => {
                if global.json {
                    println!(
                        "{}",
                        serde_json::json!({"file": f, "ok": true, "info": info})
                    );
                } else if !global.quiet {
                    println!("{what}: {info}");
                }
            }
            Err(e) => {
                if global.json {
                    println!(
                        "{}",
                        serde_json::json!({"file": f, "ok": false, "error": e.to_string()})
                    );
                }
                eprintln!("kiln: error: {e}");
                worst = Some(e.into());
            }
        }
    }
    Ok(match worst {
        None => ExitCode::SUCCESS,
        Some(e) => ExitCode::from(classify(&e)),
    })
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
}

/// `kiln fetch`
#[derive(Debug, Args)]
pub struct FetchArgs {
    /// The lock file.
    #[arg(default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    /// The local cache (a store) to fill. Default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln.
    #[arg(long, env = "KILN_CACHE", value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// A mirror (http(s) URL or directory), tried in the order given. With any --mirror,
    /// upstream is not contacted unless --upstream is also given.
    #[arg(long = "mirror", value_name = "URL|DIR")]
    pub mirrors: Vec<String>,
    /// Fall back to the upstream URLs after the mirrors.
    #[arg(long)]
    pub upstream: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// `kiln mirror …`
#[derive(Debug, Subcommand)]
pub enum MirrorCommand {
    /// Fill a mirror directory with every artifact of a lock (from upstream or another mirror).
    Sync(MirrorSyncArgs),
    /// Re-hash every blob of a mirror, report, and move bad blobs into DIR/quarantine/.
    Verify(MirrorVerifyArgs),
    /// Write a mirror as one .tar.zst (signed lock inside) to carry across an air gap.
    Pack(MirrorPackArgs),
    /// Unpack a .tar.zst made by `mirror pack` into a mirror, verifying lock and blobs.
    Unpack(MirrorUnpackArgs),
}

/// `kiln mirror sync`
#[derive(Debug, Args)]
pub struct MirrorSyncArgs {
    /// The mirror directory to fill.
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    /// Another mirror (http(s) URL or directory) to copy from, tried in order. Without --lock,
    /// the first one's signed lock is used.
    #[arg(long = "from", value_name = "URL|DIR")]
    pub from: Vec<String>,
    /// The lock to mirror (default: the first --from mirror's lock, else images/artifacts.lock).
    #[arg(long)]
    pub lock: Option<PathBuf>,
    /// Fall back to upstream URLs after the --from mirrors (always on without --from).
    #[arg(long)]
    pub upstream: bool,
    #[command(flatten)]
    pub filter: FilterArgs,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// `kiln mirror verify`
#[derive(Debug, Args)]
pub struct MirrorVerifyArgs {
    /// The mirror directory.
    pub dir: PathBuf,
    /// Hashing threads (default: all CPUs).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// `kiln mirror pack`
#[derive(Debug, Args)]
pub struct MirrorPackArgs {
    /// The mirror directory.
    pub dir: PathBuf,
    /// The .tar.zst to write.
    #[arg(long, short)]
    pub out: PathBuf,
    /// zstd level (1-19).
    #[arg(long, default_value_t = 3)]
    pub level: i32,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// `kiln mirror unpack`
#[derive(Debug, Args)]
pub struct MirrorUnpackArgs {
    /// The .tar.zst made by `kiln mirror pack`.
    pub pack: PathBuf,
    /// The mirror directory to fill.
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    #[command(flatten)]
    pub trust: TrustArgs,
}

fn default_cache() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("kiln");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("kiln")
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .min(4),
        )
        .enable_all()
        .build()?)
}

/// Runs `kiln fetch`.
pub fn run_fetch(a: FetchArgs, global: &Global) -> anyhow::Result<ExitCode> {
    done(fetch_cmd(a, global))
}

fn fetch_cmd(a: FetchArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (lock, _) = load_lock(&a.lock, &a.trust)?;
    let cache = a.cache.clone().unwrap_or_else(default_cache);
    let store = crate::supply::store::Store::open(&cache)?;
    let mut sources: Vec<crate::supply::fetch::Source> = a
        .mirrors
        .iter()
        .map(|m| crate::supply::fetch::Source::mirror(m))
        .collect();
    if sources.is_empty() || a.upstream {
        sources.push(crate::supply::fetch::Source::Upstream);
    }
    let artifacts = a.filter.apply(&lock);
    let summary = run_fetch_all(&store, &artifacts, &sources, &a.net, global)?;
    report_summary("fetch", &cache, &summary, global);
    Ok(ExitCode::SUCCESS)
}

fn run_fetch_all(
    store: &crate::supply::store::Store,
    artifacts: &[lock::Artifact],
    sources: &[crate::supply::fetch::Source],
    net: &NetArgs,
    global: &Global,
) -> anyhow::Result<crate::supply::fetch::Summary> {
    let reporter = progress::reporter(global, artifacts);
    let rt = runtime()?;
    let r = rt.block_on(crate::supply::fetch::fetch_all(
        store,
        artifacts,
        sources,
        &net.options(),
        reporter.clone(),
    ));
    progress::finish(&reporter);
    Ok(r?)
}

fn report_summary(what: &str, dir: &Path, s: &crate::supply::fetch::Summary, global: &Global) {
    if global.json {
        println!(
            "{}",
            serde_json::json!({"event": "summary", "command": what, "dir": dir, "summary": s})
        );
    } else if !global.quiet {
        println!(
            "{what}: {} artifacts in {} ({} already present), {} bytes transferred, {} bytes resumed",
            s.artifacts,
            dir.display(),
            s.cached,
            s.transferred,
            s.resumed
        );
    }
}

/// Runs `kiln mirror …`.
pub fn run_mirror(cmd: MirrorCommand, global: &Global) -> anyhow::Result<ExitCode> {
    done(match cmd {
        MirrorCommand::Sync(a) => mirror_sync(a, global),
        MirrorCommand::Verify(a) => mirror_verify(a, global),
        MirrorCommand::Pack(a) => mirror_pack(a, global),
        MirrorCommand::Unpack(a) => mirror_unpack(a, global),
    })
}

/// Copies a remote mirror's lock and signature into `dir` (so it can be verified as files).
/// Transient failures (connect errors, resets, timeouts, 408, 429, 5xx) are retried with the
/// same capped backoff as blob downloads.
fn fetch_remote_lock(base: &str, dir: &Path, net: &NetArgs) -> anyhow::Result<PathBuf> {
    let rt = runtime()?;
    let opts = net.options();
    let lock_path = dir.join(crate::supply::mirror::LOCK_NAME);
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .connect_timeout(opts.connect_timeout)
            .no_gzip()
            .build()?;
        for (name, path, required) in [
            (
                crate::supply::mirror::LOCK_NAME.to_string(),
                lock_path.clone(),
                true,
            ),
            (
                format!("{}.minisig", crate::supply::mirror::LOCK_NAME),
                sign::signature_path(&lock_path),
                false,
            ),
        ] {
            let url = format!("{base}/{name}");
            let mut attempt = 0;
            let bytes = loop {
                attempt += 1;
                match get_small(&client, &url, &opts).await {
                    Ok(b) => break b,
                    Err(SmallGet::Transient(e)) if attempt < opts.attempts_per_url => {
                        let wait = opts
                            .backoff_initial
                            .saturating_mul(1 << (attempt - 1).min(16))
                            .min(opts.backoff_max);
                        tracing::debug!("{url}: {e}; retrying in {wait:?}");
                        tokio::time::sleep(wait).await;
                    }
                    Err(SmallGet::Transient(e) | SmallGet::Fatal(e)) => {
                        anyhow::bail!("fetching {url}: {e}")
                    }
                };
            };
            match bytes {
                Some(b) => std::fs::write(&path, &b)
                    .with_context(|| format!("writing {}", path.display()))?,
                None if required => anyhow::bail!("fetching {url}: HTTP 404 Not Found"),
                None => {}
            }
        }
        anyhow::Ok(())
    })?;
    Ok(lock_path)
}

/// How fetching a small file (a lock, a signature) failed.
enum SmallGet {
    Transient(String),
    Fatal(String),
}

/// GETs a file of at most 16 MiB, with or without a Content-Length; `None` for 404.
async fn get_small(
    client: &reqwest::Client,
    url: &str,
    opts: &crate::supply::fetch::FetchOptions,
) -> Result<Option<Vec<u8>>, SmallGet> {
    let net_err = |e: reqwest::Error| SmallGet::Transient(e.to_string());
    let resp = tokio::time::timeout(opts.idle_timeout, client.get(url).send())
        .await
        .map_err(|_| SmallGet::Transient(format!("no response within {:?}", opts.idle_timeout)))?
        .map_err(net_err)?;
    let status = resp.status();
    if status == reqwest::StatusCode::NOT_FOUND {
        return Ok(None);
    }
    if status.as_u16() == 408 || status.as_u16() == 429 || status.is_server_error() {
        return Err(SmallGet::Transient(format!("HTTP {status}")));
    }
    if !status.is_success() {
        return Err(SmallGet::Fatal(format!("HTTP {status} (expected 200)")));
    }
    let too_big = || {
        SmallGet::Fatal(format!(
            "larger than {MAX_SMALL_GET} bytes (16 MiB), not a lock"
        ))
    };
    if resp.content_length().unwrap_or(0) > MAX_SMALL_GET {
        return Err(too_big());
    }
    // A chunked response has no Content-Length: the cap holds on the bytes as they come.
    let mut resp = resp;
    let mut body = Vec::new();
    while let Some(chunk) = tokio::time::timeout(opts.idle_timeout, resp.chunk())
        .await
        .map_err(|_| SmallGet::Transient(format!("no data for {:?}", opts.idle_timeout)))?
        .map_err(net_err)?
    {
        if (body.len() + chunk.len()) as u64 > MAX_SMALL_GET {
            return Err(too_big());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(Some(body))
}

/// The most a fetched lock or signature may hold.
const MAX_SMALL_GET: u64 = 16 << 20;

fn mirror_sync(a: MirrorSyncArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let staging = tempfile::tempdir()?;
    let lock_path = match (&a.lock, a.from.first()) {
        (Some(l), _) => l.clone(),
        (None, Some(from)) => match crate::supply::fetch::Source::mirror(from) {
            crate::supply::fetch::Source::MirrorUrl(u) => {
                fetch_remote_lock(&u, staging.path(), &a.net)?
            }
            crate::supply::fetch::Source::MirrorDir(d) => d.join(crate::supply::mirror::LOCK_NAME),
            crate::supply::fetch::Source::Upstream => unreachable_source(),
        },
        (None, None) => PathBuf::from(DEFAULT_LOCK),
    };
    let (lock, _) = load_lock(&lock_path, &a.trust)?;
    let mirror = crate::supply::mirror::Mirror::open(&a.to)?;
    let mut sources: Vec<crate::supply::fetch::Source> = a
        .from
        .iter()
        .map(|m| crate::supply::fetch::Source::mirror(m))
        .collect();
    if sources.is_empty() || a.upstream {
        sources.push(crate::supply::fetch::Source::Upstream);
    }
    let artifacts = a.filter.apply(&lock);
    let summary = run_fetch_all(mirror.store(), &artifacts, &sources, &a.net, global)?;
    // The lock goes in last: a mirror only advertises a lock once its blobs are present.
    mirror.install_lock_file(&lock_path)?;
    report_summary("mirror sync", &a.to, &summary, global);
    Ok(ExitCode::SUCCESS)
}

fn unreachable_source() -> ! {
    panic!("Source::mirror never returns Upstream")
}

fn mirror_verify(a: MirrorVerifyArgs, global: &Global) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        a.dir.is_dir(),
        "mirror {} is not a directory",
        a.dir.display()
    );
    let mirror = crate::supply::mirror::Mirror::open(&a.dir)?;
    let lock = if mirror.lock_path().exists() {
        Some(mirror.lock(&a.trust.trust()?)?.0)
    } else {
        None
    };
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let report = mirror.verify(lock.as_ref(), threads)?;
    for b in &report.blobs {
        if global.json {
            println!("{}", serde_json::json!({"event": "blob", "blob": b}));
        } else if !b.ok {
            eprintln!(
                "kiln: BAD blob {} ({} bytes, hashes to {}), moved to {}",
                b.sha256,
                b.size,
                b.found
                    .as_deref()
                    .unwrap_or("the right digest but the wrong size"),
                b.quarantined
                    .as_ref()
                    .map_or(String::new(), |p| p.display().to_string())
            );
        }
    }
    for m in &report.missing {
        if !global.json {
            eprintln!("kiln: MISSING {m}: the mirror's lock names it but no blob is present");
        }
    }
    let bad = report.bad().count();
    if global.json {
        println!(
            "{}",
            serde_json::json!({"event": "summary", "blobs": report.blobs.len(), "bad": bad, "missing": report.missing, "bytes": report.bytes})
        );
    } else if !global.quiet {
        println!(
            "mirror verify: {} blobs, {} bytes re-hashed, {} bad, {} missing",
            report.blobs.len(),
            report.bytes,
            bad,
            report.missing.len()
        );
    }
    Ok(if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::VERIFY)
    })
}

fn mirror_pack(a: MirrorPackArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let mirror = crate::supply::mirror::Mirror::open(&a.dir)?;
    let (lock, _) = mirror.lock(&a.trust.trust()?)?;
    let bytes = mirror.pack(&lock, &a.out, a.level)?;
    if global.json {
        println!(
            "{}",
            serde_json::json!({"pack": a.out, "artifacts": lock.artifacts.len(), "bytes": bytes})
        );
    } else if !global.quiet {
        println!(
            "packed {} artifacts ({bytes} bytes) from {} into {}",
            lock.artifacts.len(),
            a.dir.display(),
            a.out.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn mirror_unpack(a: MirrorUnpackArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let mirror = crate::supply::mirror::Mirror::open(&a.to)?;
    let (lock, verified) = mirror.unpack(&a.pack, &a.trust.trust()?)?;
    if global.json {
        println!(
            "{}",
            serde_json::json!({"mirror": a.to, "artifacts": lock.artifacts.len(), "signed": matches!(verified, Verified::Signed{..})})
        );
    } else if !global.quiet {
        println!(
            "unpacked {} artifacts into {}; lock {}",
            lock.artifacts.len(),
            a.to.display(),
            describe(&verified)
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Progress display: indicatif bars on a terminal, one line per artifact otherwise, JSON lines
/// with `--json`.
mod progress {
    use std::collections::HashMap;
    use std::io::IsTerminal as _;
    use std::sync::{Arc, Mutex};

    use super::failed_at;
    use crate::cli::Global;
    use crate::supply::fetch::{Event, Reporter};
    use crate::supply::lock::Artifact;

    pub(super) enum Mode {
        Json,
        Lines,
        Bar(
            indicatif::ProgressBar,
            Mutex<HashMap<String, u64>>,
            HashMap<String, u64>,
        ),
        Quiet,
    }

    pub(super) struct Display(Mode);

    impl Reporter for Display {
        fn event(&self, e: &Event) {
            match &self.0 {
                Mode::Quiet => {}
                Mode::Json => {
                    if !matches!(e, Event::Progress { .. }) {
                        if let Ok(s) = serde_json::to_string(e) {
                            println!("{s}");
                        }
                    }
                }
                Mode::Lines => match e {
                    Event::Done {
                        id,
                        source,
                        transferred,
                        resumed,
                    } => {
                        println!("{id}: ok from {source} ({transferred} bytes, {resumed} resumed)")
                    }
                    Event::Retry {
                        id,
                        url,
                        attempt,
                        error,
                        wait_ms,
                    } => {
                        eprintln!(
                            "{id}: attempt {attempt}: {}; retrying in {wait_ms} ms",
                            failed_at(url, error)
                        )
                    }
                    Event::SourceFailed { id, source, error } => {
                        eprintln!("{id}: {}", failed_at(source, error))
                    }
                    _ => {}
                },
                Mode::Bar(bar, seen, sizes) => match e {
                    Event::Progress { id, bytes } => {
                        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                        let last = seen.insert(id.clone(), *bytes).unwrap_or(0);
                        if *bytes >= last {
                            bar.inc(bytes - last);
                        }
                    }
                    Event::Done { id, source, .. } => {
                        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
                        let last = seen.remove(id).unwrap_or(0);
                        if source == "cache" {
                            bar.inc(sizes.get(id).copied().unwrap_or(0));
                        } else if let Some(size) = sizes.get(id) {
                            bar.inc(size.saturating_sub(last));
                        }
                        bar.println(format!("{id}: ok from {source}"));
                    }
                    Event::Retry {
                        id, error, wait_ms, ..
                    } => bar.println(format!("{id}: retrying in {wait_ms} ms: {error}")),
                    Event::SourceFailed { id, source, error } => {
                        bar.println(format!("{id}: {}", failed_at(source, error)))
                    }
                    Event::Start { .. } => {}
                },
            }
        }
    }

    pub(super) fn reporter(global: &Global, artifacts: &[Artifact]) -> Arc<Display> {
        let mode = if global.json {
            Mode::Json
        } else if global.quiet {
            Mode::Quiet
        } else if std::io::stderr().is_terminal() {
            let total: u64 = artifacts.iter().map(|a| a.size).sum();
            let bar = indicatif::ProgressBar::new(total);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            Mode::Bar(
                bar,
                Mutex::new(HashMap::new()),
                artifacts.iter().map(|a| (a.id(), a.size)).collect(),
            )
        } else {
            Mode::Lines
        };
        Arc::new(Display(mode))
    }

    pub(super) fn finish(d: &Display) {
        if let Mode::Bar(bar, _, _) = &d.0 {
            bar.finish_and_clear();
        }
    }
}

/// Comment and blank lines at the top of a lock, kept when kiln rewrites it.
pub(crate) fn header_of(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() {
            out.push_str(line);
            out.push('\n');
        } else {
            break;
        }
    }
    out
}

/// Writes an edited lock (validated first) and removes its now-stale signature.
pub(crate) fn write_lock(path: &Path, header: &str, lock: &Lock) -> anyhow::Result<()> {
    let text = format!("{header}{}", lock.to_toml());
    Lock::parse(&text, path)?;
    crate::supply::store::write_atomic(path, text.as_bytes())?;
    let sig = sign::signature_path(path);
    match std::fs::remove_file(&sig) {
        Ok(()) => eprintln!(
            "kiln: {} changed; its old signature {} was removed: sign it again with `kiln lock sign`",
            path.display(),
            sig.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", sig.display())),
    }
    Ok(())
}

fn first_sha256(text: &str) -> Option<String> {
    text.split_whitespace()
        .map(|w| w.trim_start_matches('*').to_ascii_lowercase())
        .find(|w| lock::is_sha256_hex(w))
}

fn lock_add(a: LockAddArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (mut l, header) = if a.lock.exists() {
        let text = std::fs::read_to_string(&a.lock)
            .with_context(|| format!("reading lock {}", a.lock.display()))?;
        (Lock::parse(&text, &a.lock)?, header_of(&text))
    } else {
        (
            Lock {
                path: a.lock.clone(),
                artifacts: Vec::new(),
            },
            String::new(),
        )
    };
    if let Some(old) = l.find(&a.name, a.os, a.arch) {
        use crate::supply::outdated::policy;
        if policy::replacing(old, &a.version, a.allow_minor)? && policy::is_kubernetes(&a.name) {
            eprintln!("kiln: crossing a Kubernetes minor.\n{}", policy::SKEW_RULES);
        }
    }
    let opts = a.net.options();
    let rt = runtime()?;
    let (sha, size) = rt.block_on(crate::supply::fetch::hash_url(
        &a.url,
        lock::MAX_UNSIZED,
        &opts,
    ))?;
    let verified = if let Some(cu) = &a.checksum_url {
        let (text, _) = rt.block_on(async {
            let r = reqwest::get(cu)
                .await
                .with_context(|| format!("fetching {cu}"))?;
            anyhow::ensure!(
                r.status().is_success(),
                "fetching {cu}: HTTP {}",
                r.status()
            );
            let t = r.text().await.with_context(|| format!("reading {cu}"))?;
            anyhow::Ok((t, ()))
        })?;
        let published = first_sha256(&text)
            .with_context(|| format!("{cu} holds no sha256 (expected 64 hex digits)"))?;
        if published != sha {
            return Err(crate::supply::store::StoreError::Mismatch {
                what: format!("{} (checked against {cu})", a.url),
                expected: published,
                found: sha,
            }
            .into());
        }
        a.verified.clone().unwrap_or_else(|| {
            format!(
                "sha256 matched upstream's published checksum {cu} when this entry was authored"
            )
        })
    } else if let Some(want) = &a.sha256 {
        if *want != sha {
            return Err(crate::supply::store::StoreError::Mismatch {
                what: a.url.clone(),
                expected: want.clone(),
                found: sha,
            }
            .into());
        }
        a.verified
            .clone()
            .unwrap_or_else(|| "sha256 given by the author (--sha256) matched the download".into())
    } else {
        a.verified.clone().context(
            "say what upstream checksum or signature was checked: --checksum-url, --sha256 or --verified",
        )?
    };
    let members = a
        .members
        .iter()
        .map(|m| {
            let (from, to) = m
                .split_once('=')
                .with_context(|| format!("--member {m:?}: expected FROM=TO"))?;
            Ok(lock::Member {
                from: from.into(),
                to: to.into(),
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let format = match a.format.as_str() {
        "binary" => lock::Format::Binary,
        "zip" => lock::Format::Zip,
        _ => lock::Format::TarGz,
    };
    let entry = lock::Artifact {
        name: a.name.clone(),
        version: a.version.clone(),
        os: a.os,
        arch: a.arch,
        format,
        url: a.url.clone(),
        sources: a.sources.clone(),
        size,
        sha256: sha.clone(),
        verified,
        members,
    };
    match l
        .artifacts
        .iter_mut()
        .find(|x| x.name == a.name && x.os == a.os && x.arch == a.arch)
    {
        Some(slot) => *slot = entry.clone(),
        None => l.artifacts.push(entry.clone()),
    }
    write_lock(&a.lock, &header, &l)?;
    if global.json {
        println!(
            "{}",
            serde_json::json!({"added": entry.id(), "sha256": sha, "size": size})
        );
    } else if !global.quiet {
        println!(
            "{}: sha256 {sha}, {size} bytes -> {}",
            entry.id(),
            a.lock.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn lock_update(a: LockUpdateArgs, global: &Global) -> anyhow::Result<ExitCode> {
    if a.to.is_some() || a.patch {
        return crate::cli::lock_move::run(&a, global);
    }
    let text = std::fs::read_to_string(&a.lock)
        .with_context(|| format!("reading lock {}", a.lock.display()))?;
    let mut l = Lock::parse(&text, &a.lock)?;
    let header = header_of(&text);
    let selected: std::collections::BTreeSet<String> =
        a.filter.apply(&l).iter().map(|x| x.id()).collect();
    let opts = a.net.options();
    let rt = runtime()?;
    let mut changed = false;
    for art in l
        .artifacts
        .iter_mut()
        .filter(|x| selected.contains(&x.id()))
    {
        let (sha, size) = rt.block_on(crate::supply::fetch::hash_url(
            &art.url,
            lock::MAX_UNSIZED,
            &opts,
        ))?;
        if sha != art.sha256 {
            return Err(crate::supply::store::StoreError::Mismatch {
                what: format!(
                    "{} from {}: upstream now serves different bytes than the lock pins",
                    art.id(),
                    art.url
                ),
                expected: art.sha256.clone(),
                found: sha,
            }
            .into());
        }
        if art.size != size {
            anyhow::ensure!(
                art.size == 0,
                "{}: the lock records {} bytes, upstream serves {size} bytes with the same sha256",
                art.id(),
                art.size
            );
            art.size = size;
            changed = true;
        }
        if global.json {
            println!(
                "{}",
                serde_json::json!({"id": art.id(), "ok": true, "size": size})
            );
        } else if !global.quiet {
            println!("{}: sha256 confirmed, {size} bytes", art.id());
        }
    }
    if changed {
        write_lock(&a.lock, &header, &l)?;
        if let Some(sk) = &a.secret_key {
            let (sig, _) = sign_lock(&a.lock, sk, a.password_env.as_deref())?;
            eprintln!("kiln: signed {} -> {}", a.lock.display(), sig.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `SOURCE failed: WHY`, naming the source once when the error text already starts with it.
fn failed_at(source: &str, error: &str) -> String {
    let why = error
        .strip_prefix(source)
        .and_then(|r| r.strip_prefix(": "))
        .unwrap_or(error);
    format!("{source} failed: {why}")
}
