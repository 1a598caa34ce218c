//! `kiln mirror push --to oci://…` and `kiln mirror sync --from oci://…`: a mirror kept in
//! an OCI registry repository (see `docs/mirror.md`, "A registry as the mirror").

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;

use crate::cli::common::{
    load_lock, runtime, FilterArgs, Global, NetArgs, RegistryArgs, TrustArgs,
};
use crate::cli::fetch::{report_summary, run_pull_images};
use crate::cli::progress;
use crate::supply::lock::Lock;
use crate::supply::mirror::LOCK_NAME;
use crate::supply::registry::{oci_mirror, ImageSource, OciTarget};

/// `kiln mirror push`
#[derive(Debug, Args)]
pub struct MirrorPushArgs {
    /// The mirror directory to push (its signed lock says what it holds).
    pub dir: PathBuf,
    /// The registry repository: oci://HOST/REPOSITORY (HOST may carry a :PORT).
    #[arg(long, value_name = "oci://HOST/REPO")]
    pub to: String,
    #[command(flatten)]
    pub net: NetArgs,
    #[command(flatten)]
    pub registry: RegistryArgs,
    #[command(flatten)]
    pub trust: TrustArgs,
}

/// Runs `kiln mirror push`: verifies the mirror's lock, then moves every artifact, image and
/// the lock into the registry, uploading only what it lacks.
pub(crate) fn mirror_push(a: MirrorPushArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let target = OciTarget::parse(&a.to).map_err(|e| anyhow::anyhow!("--to {e}"))?;
    // Checked before opening: opening a mirror creates its directories.
    let lock_path = a.dir.join(LOCK_NAME);
    anyhow::ensure!(
        lock_path.is_file(),
        "{} has no artifacts.lock: not a kiln mirror (fill it with kiln mirror sync first)",
        a.dir.display()
    );
    let mirror = crate::supply::mirror::Mirror::open(&a.dir)?;
    let (lock, _) = load_lock(&lock_path, &a.trust)?;
    let lock_bytes = std::fs::read(&lock_path)?;
    let sig = match std::fs::read(crate::supply::sign::signature_path(&lock_path)) {
        Ok(s) => Some(s),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    let ropts = a.registry.options()?;
    let rt = runtime()?;
    let s = rt.block_on(oci_mirror::push_mirror(
        mirror.store(),
        &lock,
        lock_bytes,
        sig,
        &target,
        &ropts,
        &a.net.options(),
    ))?;
    let secs = started.elapsed().as_secs_f64();
    if global.json {
        crate::cli::json::emit(
            "summary",
            crate::cli::json::Level::Info,
            serde_json::json!({"event": "summary", "command": "mirror push", "to": target.to_string(), "push": s, "seconds": secs}),
        );
    } else if !global.quiet {
        println!(
            "mirror push: {} artifacts, {} images to {target}: {} manifests ({} already there), {} blobs uploaded ({} already there), {} bytes uploaded in {secs:.2} s",
            lock.artifacts.len(),
            lock.images.len(),
            s.manifests,
            s.manifests_present,
            s.blobs_uploaded,
            s.blobs_present,
            s.bytes_uploaded,
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// What `kiln mirror sync --from oci://…` needs from the sync command line.
pub(crate) struct SyncFromOci<'a> {
    pub to: &'a std::path::Path,
    pub from: &'a str,
    pub lock: Option<&'a std::path::Path>,
    pub filter: &'a FilterArgs,
    pub net: &'a NetArgs,
    pub registry: &'a RegistryArgs,
    pub trust: &'a TrustArgs,
}

/// Runs `kiln mirror sync --from oci://…`: the registry's lock artifact (verified under the
/// trust flags, unless `--lock` names another), then each artifact blob by its sha256 and each
/// pinned image, verified while streaming; the lock goes into the mirror last.
pub(crate) fn sync_from_oci(a: SyncFromOci<'_>, global: &Global) -> anyhow::Result<ExitCode> {
    let target = OciTarget::parse(a.from).map_err(|e| anyhow::anyhow!("--from {e}"))?;
    let ropts = a.registry.options()?;
    let opts = a.net.options();
    let rt = runtime()?;
    let staging = tempfile::tempdir()?;
    let (lock_path, shown) = match a.lock {
        Some(l) => (l.to_path_buf(), l.to_path_buf()),
        None => {
            let staged = rt.block_on(oci_mirror::fetch_lock(
                &target,
                &ropts,
                &opts,
                staging.path(),
            ))?;
            // Errors name the registry's lock artifact, not the staging file.
            let shown = format!("{target}:{}/{}", oci_mirror::LOCK_TAG, LOCK_NAME);
            (staged, PathBuf::from(shown))
        }
    };
    let (lock, _) = Lock::load_verified_as(&lock_path, &shown, &a.trust.trust()?)?;
    let mirror = crate::supply::mirror::Mirror::open(a.to)?;
    let artifacts = a.filter.apply(&lock);
    let reporter = progress::reporter(global, &artifacts);
    let r = rt.block_on(oci_mirror::pull_artifacts(
        mirror.store(),
        &artifacts,
        &target,
        &ropts,
        &opts,
        reporter.clone(),
    ));
    progress::finish(&reporter);
    let summary = r?;
    let images = a.filter.apply_images(&lock);
    run_pull_images(
        "mirror sync",
        mirror.store(),
        &images,
        &[ImageSource::Oci(target)],
        a.registry,
        a.net,
        global,
    )?;
    mirror.install_lock_file(&lock_path)?;
    report_summary("mirror sync", a.to, &summary, global);
    Ok(ExitCode::SUCCESS)
}
