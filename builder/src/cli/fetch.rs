//! `kiln fetch`: fill the local cache with a lock's artifacts, verified.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::cli::common::{
    default_cache, done, load_lock, runtime, FilterArgs, Global, NetArgs, RegistryArgs, TrustArgs,
    DEFAULT_LOCK,
};
use crate::cli::progress;
use crate::supply::lock;
use crate::supply::registry::{ImageSource, OciTarget};

/// `kiln fetch`
#[derive(Debug, Args)]
pub struct FetchArgs {
    /// The lock file.
    #[arg(default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    /// The local cache (a store) to fill. Default: $XDG_CACHE_HOME/kiln or ~/.cache/kiln.
    #[arg(long, env = "KILN_CACHE", value_name = "DIR")]
    pub cache: Option<PathBuf>,
    /// A mirror (http(s) URL, directory, or a registry mirror oci://HOST/REPO made by `kiln
    /// mirror push`), tried in the order given (oci:// mirrors first). With any --mirror,
    /// upstream is not contacted unless --upstream is also given.
    #[arg(long = "mirror", value_name = "URL|DIR|oci://HOST/REPO")]
    pub mirrors: Vec<String>,
    /// Fall back to the upstream URLs after the mirrors.
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
}

/// Runs `kiln fetch`.
pub fn run_fetch(a: FetchArgs, global: &Global) -> anyhow::Result<ExitCode> {
    done(fetch_cmd(a, global))
}

fn fetch_cmd(a: FetchArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (lock, _) = load_lock(&a.lock, &a.trust)?;
    let cache = a.cache.clone().unwrap_or_else(default_cache);
    let store = crate::supply::store::Store::open(&cache)?;
    let from = FetchFrom::new(&a.mirrors, a.upstream, &a.registry, &a.net);
    let artifacts = a.filter.apply(&lock);
    let images = a.filter.apply_images(&lock);
    fetch_into("fetch", &store, &cache, &artifacts, &images, &from, global)?;
    Ok(ExitCode::SUCCESS)
}

/// Where a fetch may take bytes from, as its command line says.
pub(crate) struct FetchFrom<'a> {
    /// `--mirror` values, in order.
    pub mirrors: &'a [String],
    /// `--upstream`: fall back to the lock's URLs and the images' registries.
    pub upstream: bool,
    pub registry: &'a RegistryArgs,
    pub net: &'a NetArgs,
}

impl<'a> FetchFrom<'a> {
    pub(crate) fn new(
        mirrors: &'a [String],
        upstream: bool,
        registry: &'a RegistryArgs,
        net: &'a NetArgs,
    ) -> FetchFrom<'a> {
        FetchFrom {
            mirrors,
            upstream,
            registry,
            net,
        }
    }
}

/// Fetches `artifacts` into `store` (at `dir`), then pulls `images`, from the sources `from`
/// names, reporting each step as `what`. An empty list is skipped.
pub(crate) fn fetch_into(
    what: &str,
    store: &crate::supply::store::Store,
    dir: &Path,
    artifacts: &[lock::Artifact],
    images: &[lock::Image],
    from: &FetchFrom<'_>,
    global: &Global,
) -> anyhow::Result<()> {
    if !artifacts.is_empty() {
        mirror_dirs_hold_some(store, artifacts, from)?;
        let summary = run_fetch_sources(
            store,
            artifacts,
            from.mirrors,
            from.upstream,
            from.registry,
            from.net,
            global,
        )?;
        report_summary(what, dir, &summary, global);
    }
    let sources = image_sources(from.mirrors, from.upstream)?;
    run_pull_images(
        what,
        store,
        images,
        &sources,
        from.registry,
        from.net,
        global,
    )
}

/// Refuses at once, in one message, a fetch whose only sources are mirror directories that
/// hold none of the artifacts the store lacks — typically a mirror made from another lock
/// (the fixture mirror, whose lock pins stand-ins, asked for kiln's release lock) — instead of
/// one "not in this mirror" per artifact. A mirror holding some of them fetches as usual and
/// names each one missing.
fn mirror_dirs_hold_some(
    store: &crate::supply::store::Store,
    artifacts: &[lock::Artifact],
    from: &FetchFrom<'_>,
) -> Result<(), crate::supply::fetch::FetchError> {
    let dirs: Vec<&Path> = from
        .mirrors
        .iter()
        .map(|m| Path::new(m.as_str()))
        .filter(|m| !m.as_os_str().is_empty() && m.is_dir())
        .collect();
    if from.upstream || dirs.is_empty() || dirs.len() != from.mirrors.len() {
        return Ok(());
    }
    let wanted: Vec<&lock::Artifact> = artifacts
        .iter()
        .filter(|a| store.lookup(a).is_none())
        .collect();
    let held = |d: &Path, a: &lock::Artifact| d.join("blobs/sha256").join(&a.sha256).is_file();
    if wanted.is_empty() || wanted.iter().any(|a| dirs.iter().any(|d| held(d, a))) {
        return Ok(());
    }
    let mut msg =
        format!(
        "the mirror{} {} hold{} none of the {} artifacts wanted (kubelet {} among them): {} made \
         from another lock, or filtered to other names or platforms",
        if dirs.len() == 1 { "" } else { "s" },
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        if dirs.len() == 1 { "s" } else { "" },
        wanted.len(),
        wanted
            .iter()
            .find(|a| a.name == "kubelet")
            .map_or("-", |a| a.version.as_str()),
        if dirs.len() == 1 { "it was" } else { "they were" },
    );
    for d in &dirs {
        let own = d.join("artifacts.lock");
        if own.is_file() {
            msg.push_str(&format!(
                ". {} has its own lock: use it with `--lock {}` (kiln bake, plan) or as kiln \
                 fetch's LOCK, with --trusted-key for the key that signed it",
                d.display(),
                own.display()
            ));
        }
    }
    msg.push_str(
        ". To fetch this lock, sync a mirror of it where the internet is reachable \
         (kiln mirror sync, docs/mirror.md) or pass --upstream",
    );
    Err(crate::supply::fetch::FetchError::NotInMirrors(msg))
}

/// Pulls the lock's images into `store` (an OCI image layout) from `sources`, in order, and
/// reports what was done.
pub(crate) fn run_pull_images(
    what: &str,
    store: &crate::supply::store::Store,
    images: &[lock::Image],
    sources: &[ImageSource],
    registry: &RegistryArgs,
    net: &NetArgs,
    global: &Global,
) -> anyhow::Result<()> {
    if images.is_empty() {
        return Ok(());
    }
    let ropts = registry.options()?;
    let reporter = progress::reporter(global, &[]);
    let rt = runtime()?;
    let r = rt.block_on(crate::supply::registry::pull_images(
        store,
        images,
        sources,
        &ropts,
        &net.options(),
        reporter.clone(),
    ));
    progress::finish(&reporter);
    let s = r?;
    if global.json {
        crate::cli::json::emit(
            "summary",
            crate::cli::json::Level::Info,
            serde_json::json!({"event": "summary", "command": what, "dir": store.root(), "images": s}),
        );
    } else if !global.quiet {
        println!(
            "{what}: {} images ({} manifests and blobs, {} already present) in {}, {} bytes transferred",
            s.images,
            s.blobs,
            s.cached,
            store.root().display(),
            s.transferred
        );
    }
    Ok(())
}

/// Where a fetch takes images from: registry mirrors (`oci://…`) first, then URL and
/// directory mirrors in the order given (their `blobs/sha256/` holds images like files), then
/// each image's own registry when `upstream` or when no mirror is given.
pub(crate) fn image_sources(
    mirrors: &[String],
    upstream: bool,
) -> anyhow::Result<Vec<ImageSource>> {
    let mut out = Vec::new();
    for m in mirrors.iter().filter(|m| OciTarget::is_oci(m)) {
        let t = OciTarget::parse(m).map_err(|e| anyhow::anyhow!("--mirror {e}"))?;
        out.push(ImageSource::Oci(t));
    }
    for m in mirrors.iter().filter(|m| !OciTarget::is_oci(m)) {
        out.push(ImageSource::Mirror(crate::supply::fetch::Source::mirror(m)));
    }
    if mirrors.is_empty() || upstream {
        out.push(ImageSource::Upstream);
    }
    Ok(out)
}

/// Fetches `artifacts` from `mirrors` (registry mirrors `oci://…` first, each artifact's blob by
/// its sha256, then URL and directory mirrors in order) and upstream when `upstream` or when
/// no mirror is given. What one source could not deliver is asked of the next; the last
/// source's failure is the error.
pub(crate) fn run_fetch_sources(
    store: &crate::supply::store::Store,
    artifacts: &[lock::Artifact],
    mirrors: &[String],
    upstream: bool,
    registry: &RegistryArgs,
    net: &NetArgs,
    global: &Global,
) -> anyhow::Result<crate::supply::fetch::Summary> {
    use crate::supply::fetch::Source;
    let (oci, rest): (Vec<&String>, Vec<&String>) =
        mirrors.iter().partition(|m| OciTarget::is_oci(m));
    let mut sources: Vec<Source> = rest.iter().map(|m| Source::mirror(m)).collect();
    if mirrors.is_empty() || upstream {
        sources.push(Source::Upstream);
    }
    let mut summary = crate::supply::fetch::Summary::default();
    let mut pending: Vec<lock::Artifact> = artifacts.to_vec();
    if !oci.is_empty() {
        let ropts = registry.options()?;
        let rt = runtime()?;
        for (i, m) in oci.iter().enumerate() {
            let target = OciTarget::parse(m).map_err(|e| anyhow::anyhow!("--mirror {e}"))?;
            let reporter = progress::reporter(global, &pending);
            let r = rt.block_on(crate::supply::registry::oci_mirror::pull_artifacts(
                store,
                &pending,
                &target,
                &ropts,
                &net.options(),
                reporter.clone(),
            ));
            progress::finish(&reporter);
            match r {
                Ok(s) => {
                    summary.cached += s.cached;
                    summary.transferred += s.transferred;
                    pending.clear();
                    break;
                }
                Err(e) if i + 1 == oci.len() && sources.is_empty() => return Err(e.into()),
                Err(e) => {
                    eprintln!(
                        "kiln: {target}: {e}\nkiln: trying the next source for what is missing"
                    );
                    pending.retain(|a| store.lookup(a).is_none());
                }
            }
        }
    }
    if !pending.is_empty() {
        let s = run_fetch_all(store, &pending, &sources, net, global)?;
        summary.cached += s.cached;
        summary.transferred += s.transferred;
        summary.resumed += s.resumed;
    }
    summary.artifacts = artifacts.len();
    Ok(summary)
}

pub(crate) fn run_fetch_all(
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

pub(crate) fn report_summary(
    what: &str,
    dir: &Path,
    s: &crate::supply::fetch::Summary,
    global: &Global,
) {
    if global.json {
        crate::cli::json::emit(
            "summary",
            crate::cli::json::Level::Info,
            serde_json::json!({"event": "summary", "command": what, "dir": dir, "summary": s}),
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
