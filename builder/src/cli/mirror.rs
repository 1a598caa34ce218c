//! `kiln mirror sync|verify|pack|unpack|push`: keep an air-gapped artifact mirror.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::cli::common::{
    describe, done, exit, load_lock, runtime, FilterArgs, Global, NetArgs, RegistryArgs, TrustArgs,
    DEFAULT_LOCK,
};
use crate::cli::fetch::{report_summary, run_fetch_all, run_pull_images};
use crate::supply::registry::OciTarget;
use crate::supply::sign::{self, Verified};

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
    /// Push a mirror into an OCI registry repository (oci://HOST/REPO), uploading only what
    /// the registry lacks.
    Push(crate::cli::mirror_oci::MirrorPushArgs),
}

/// `kiln mirror sync`
#[derive(Debug, Args)]
pub struct MirrorSyncArgs {
    /// The mirror directory to fill.
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    /// Another mirror (http(s) URL or directory) to copy from, tried in order; or one registry
    /// mirror made by `kiln mirror push` (oci://HOST/REPO). Without --lock, the first one's
    /// signed lock is used.
    #[arg(long = "from", value_name = "URL|DIR|oci://HOST/REPO")]
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
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub trust: TrustArgs,
    /// From an oci:// mirror: also bring in this layer (its main file's name, as `kiln mirror
    /// push --layer` pushed it) into DIR/layers/, with its signatures, provenance and SBOM,
    /// once they verify. Repeatable; needs --verify-key.
    #[arg(long = "layer", value_name = "NAME", requires = "verify_key")]
    pub layers: Vec<String>,
    /// The public key (kiln key generate's PREFIX.pub) every --layer must be signed by.
    #[arg(long, value_name = "FILE")]
    pub verify_key: Option<PathBuf>,
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

/// Runs `kiln mirror …`.
pub fn run_mirror(cmd: MirrorCommand, global: &Global) -> anyhow::Result<ExitCode> {
    done(match cmd {
        MirrorCommand::Sync(a) => mirror_sync(a, global),
        MirrorCommand::Verify(a) => mirror_verify(a, global),
        MirrorCommand::Pack(a) => mirror_pack(a, global),
        MirrorCommand::Unpack(a) => mirror_unpack(a, global),
        MirrorCommand::Push(a) => crate::cli::mirror_oci::mirror_push(a, global),
    })
}

/// Copies a remote mirror's lock and signature into `dir` (so it can be verified as files).
/// Transient failures (connect errors, resets, timeouts, 408, 429, 5xx) are retried with the
/// same capped backoff as blob downloads.
fn fetch_remote_lock(base: &str, dir: &Path, net: &NetArgs) -> anyhow::Result<PathBuf> {
    use crate::bounded_read::{MAX_KEY, MAX_LOCK};
    let rt = runtime()?;
    let opts = net.options();
    let lock_path = dir.join(crate::supply::mirror::LOCK_NAME);
    rt.block_on(async {
        let client = crate::supply::fetch::client(&opts)?;
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
            let cap = if required { MAX_LOCK } else { MAX_KEY };
            match crate::supply::fetch::get_small(&client, &url, cap, &opts).await? {
                Some(b) => std::fs::write(&path, &b)
                    .with_context(|| format!("writing {}", path.display()))?,
                None if required => anyhow::bail!(
                    "fetching {}: HTTP 404 Not Found",
                    crate::supply::fetch::shown(&url)
                ),
                None => {}
            }
        }
        anyhow::Ok(())
    })?;
    Ok(lock_path)
}

fn mirror_sync(a: MirrorSyncArgs, global: &Global) -> anyhow::Result<ExitCode> {
    if let Some(oci) = a.from.iter().find(|f| OciTarget::is_oci(f)) {
        anyhow::ensure!(
            a.from.len() == 1 && !a.upstream,
            "--from {oci}: a registry mirror is synced on its own (no other --from, no --upstream)"
        );
        return crate::cli::mirror_oci::sync_from_oci(
            crate::cli::mirror_oci::SyncFromOci {
                to: &a.to,
                from: oci,
                lock: a.lock.as_deref(),
                filter: &a.filter,
                net: &a.net,
                registry: &a.registry,
                trust: &a.trust,
                layers: &a.layers,
                verify_key: a.verify_key.as_deref(),
            },
            global,
        );
    }
    anyhow::ensure!(
        a.layers.is_empty(),
        "--layer: layers come from a registry mirror only (--from oci://HOST/REPO)"
    );
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
    let images = a.filter.apply_images(&lock);
    let image_sources = crate::cli::fetch::image_sources(&a.from, a.upstream)?;
    run_pull_images(
        "mirror sync",
        mirror.store(),
        &images,
        &image_sources,
        &a.registry,
        &a.net,
        global,
    )?;
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
            crate::cli::json::emit(
                "blob",
                if b.ok {
                    crate::cli::json::Level::Info
                } else {
                    crate::cli::json::Level::Error
                },
                serde_json::json!({"event": "blob", "blob": b}),
            );
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
    let mut report = report;
    if let Some(lock) = &lock {
        for img in &lock.images {
            report
                .missing
                .extend(crate::supply::registry::layout::missing(
                    mirror.store(),
                    img,
                ));
        }
    }
    for m in &report.missing {
        if !global.json {
            eprintln!("kiln: MISSING {m}: the mirror's lock names it but no blob is present");
        }
    }
    let bad = report.bad().count();
    if global.json {
        crate::cli::json::emit(
            "summary",
            crate::cli::json::Level::Info,
            serde_json::json!({"event": "summary", "blobs": report.blobs.len(), "bad": bad, "missing": report.missing, "bytes": report.bytes}),
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
        crate::cli::json::emit(
            "packed",
            crate::cli::json::Level::Info,
            serde_json::json!({"pack": a.out, "artifacts": lock.artifacts.len(), "bytes": bytes}),
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
        crate::cli::json::emit(
            "unpacked",
            crate::cli::json::Level::Info,
            serde_json::json!({"mirror": a.to, "artifacts": lock.artifacts.len(), "signed": matches!(verified, Verified::Signed{..})}),
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
