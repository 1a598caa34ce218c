//! `kiln mirror push --to oci://…` and `kiln mirror sync --from oci://…`: a mirror kept in
//! an OCI registry repository (see `docs/mirror.md`, "A registry as the mirror").

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use clap::Args;

use crate::cli::common::{
    load_lock, runtime, FilterArgs, Global, NetArgs, RegistryArgs, TrustArgs,
};
use crate::cli::fetch::{report_summary, run_pull_images};
use crate::cli::progress;
use crate::supply::layer_trust::LayerFiles;
use crate::supply::lock::Lock;
use crate::supply::mirror::LOCK_NAME;
use crate::supply::registry::layer_io::{pull_layer, push_layers, LayerUpload};
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
    /// A layer `kiln bake --attest-key` wrote (its main file), pushed after the mirror and
    /// tagged `layer-<file name>`, with its image signature, provenance attestation, SBOM and
    /// file signature attached as OCI 1.1 referrers. Repeatable; needs --attest-key.
    #[arg(long = "layer", value_name = "FILE", requires = "attest_key")]
    pub layers: Vec<PathBuf>,
    /// The key the layers were signed with at bake time: their signatures are checked with
    /// its public half before anything is pushed, and it signs each layer's image signature
    /// (what `cosign verify --key` checks).
    #[arg(long, env = "KILN_ATTEST_KEY", value_name = "FILE")]
    pub attest_key: Option<PathBuf>,
}

/// The signing key and each layer to push with its sha256.
type Layers = (crate::attest::AttestKey, Vec<(LayerFiles, String)>);

/// The layers to push, each checked with the key's public half against `lock`.
fn checked_layers(a: &MirrorPushArgs, lock: &Lock) -> anyhow::Result<Option<Layers>> {
    let Some(key_path) = a.attest_key.as_deref().filter(|_| !a.layers.is_empty()) else {
        return Ok(None);
    };
    let key = crate::attest::AttestKey::load(key_path)?;
    let vk = key.verify_key();
    let mut out = Vec::new();
    for l in &a.layers {
        let files = LayerFiles::beside(l).map_err(crate::supply::layer_trust::Untrusted)?;
        let checked = crate::supply::layer_trust::check(&files, &vk, lock)
            .with_context(|| format!("--layer {}: not pushed", l.display()))?;
        out.push((files, checked.sha256));
    }
    Ok(Some((key, out)))
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
    let layers = checked_layers(&a, &lock)?;
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
    let pushed = match &layers {
        Some((key, files)) => {
            let ups: Vec<LayerUpload<'_>> = files
                .iter()
                .map(|(f, sha)| LayerUpload {
                    files: f,
                    sha256: sha,
                })
                .collect();
            rt.block_on(push_layers(&target, &ropts, &a.net.options(), &ups, key))?
        }
        None => Vec::new(),
    };
    let secs = started.elapsed().as_secs_f64();
    if global.json {
        crate::cli::json::emit(
            "summary",
            crate::cli::json::Level::Info,
            serde_json::json!({"event": "summary", "command": "mirror push", "to": target.to_string(), "push": s, "layers": pushed, "seconds": secs}),
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
        for p in &pushed {
            let how = if p.referrers_api {
                "the registry's referrers API".to_string()
            } else {
                format!("tag {}", p.digest.replace(':', "-"))
            };
            println!(
                "mirror push: layer {} as {target}:{} ({}), signature, provenance, SBOM and file signature attached (listed by {how})",
                p.name, p.tag, p.digest
            );
        }
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
    /// Layers to bring in (their main file names), into `<to>/layers/`.
    pub layers: &'a [String],
    /// The public key each layer must be signed by.
    pub verify_key: Option<&'a std::path::Path>,
}

/// Runs `kiln mirror sync --from oci://…`: the registry's lock artifact (verified under the
/// trust flags, unless `--lock` names another), then each artifact blob by its sha256 and each
/// pinned image, verified while streaming; the lock goes into the mirror last.
pub(crate) fn sync_from_oci(a: SyncFromOci<'_>, global: &Global) -> anyhow::Result<ExitCode> {
    let target = OciTarget::parse(a.from).map_err(|e| anyhow::anyhow!("--from {e}"))?;
    for name in a.layers {
        plain_layer_name(name)?;
    }
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
        &[ImageSource::Oci(target.clone())],
        a.registry,
        a.net,
        global,
    )?;
    if !a.layers.is_empty() {
        let key = a
            .verify_key
            .ok_or_else(|| anyhow::anyhow!("--layer needs --verify-key PUB: a layer is brought in only with a signature kiln can check"))?;
        let key = crate::attest::VerifyKey::load(key)?;
        for name in a.layers {
            let dir = pull_verified_layer(&rt, &target, &ropts, &opts, name, &key, &lock, a.to)?;
            if !global.quiet && !global.json {
                println!("mirror sync: layer {name} from {target}: signatures and provenance verified with key {}, in {}", key.id(), dir.display());
            }
        }
    }
    mirror.install_lock_file(&lock_path)?;
    report_summary("mirror sync", a.to, &summary, global);
    Ok(ExitCode::SUCCESS)
}

/// A `--layer` NAME is a file name (it names a file in `DIR/layers/`), never a path.
fn plain_layer_name(name: &str) -> Result<(), crate::supply::layer_trust::Untrusted> {
    let plain = std::path::Path::new(name)
        .file_name()
        .is_some_and(|n| n == std::ffi::OsStr::new(name))
        && !name.starts_with('.');
    if plain {
        Ok(())
    } else {
        Err(crate::supply::layer_trust::Untrusted(format!(
            "--layer {name:?}: expected the layer's file name (as kiln mirror push printed it), not a path"
        )))
    }
}

/// Pulls layer `name` and its referrers into a scratch directory under `<to>/layers/`,
/// checks the image signature, the file signature and the provenance with `key` against
/// `lock`, then moves each file into `<to>/layers/`: nothing unverified is left there.
#[allow(clippy::too_many_arguments)]
fn pull_verified_layer(
    rt: &tokio::runtime::Runtime,
    target: &OciTarget,
    ropts: &crate::supply::registry::RegistryOptions,
    opts: &crate::supply::fetch::FetchOptions,
    name: &str,
    key: &crate::attest::VerifyKey,
    lock: &Lock,
    to: &std::path::Path,
) -> anyhow::Result<PathBuf> {
    let dir = to.join("layers");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let scratch = tempfile::Builder::new()
        .prefix(".kiln-pull-")
        .tempdir_in(&dir)
        .with_context(|| format!("creating a scratch directory in {}", dir.display()))?;
    let got = rt.block_on(pull_layer(target, ropts, opts, name, scratch.path(), key))?;
    let shown = format!(
        "{target}:{}",
        crate::supply::registry::layer_oci::layer_tag(name)
    );
    let checked = crate::supply::layer_trust::check_known(&got.files, key, lock, &got.sha256)
        .with_context(|| format!("layer {shown}: refused, nothing kept"))?;
    crate::atomic_file::write(
        &got.files.provenance,
        ".kiln-pull-",
        &checked.statement,
        0o644,
    )
    .map_err(|e| anyhow::anyhow!("writing {}: {}", e.path.display(), e.source))?;
    // The main file last: where it is, its companions are.
    let f = &got.files;
    for p in [&f.sig, &f.dsse, &f.sbom, &f.provenance, &f.main] {
        let dest = dir.join(p.file_name().unwrap_or_default());
        std::fs::rename(p, &dest)
            .with_context(|| format!("moving {} into place", dest.display()))?;
    }
    Ok(dir)
}
