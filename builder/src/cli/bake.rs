//! Command line for `kiln bake` and `kiln diff`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::bake::{self, manifest, BakeRequest, WriteOptions};
use crate::cli::common::{
    load_def, load_lock, Global, NetArgs, RegistryArgs, TrustArgs, DEFAULT_LOCK,
};
use crate::cli::fail::classify;
use crate::cli::fetch::{fetch_into, FetchFrom};
use crate::cli::phases::PhaseDisplay;
use crate::image_def::{Arch, Format};
use crate::plan::{BakePlan, Dirs, FirstbootChoice};
use crate::supply::store::Store;

/// `kiln bake IMAGE --format F --out DIR`
#[derive(Debug, Args)]
pub struct BakeArgs {
    /// Image definition (`images/flatcar.toml`, …).
    pub image: PathBuf,
    /// Output format: sysext, rootfs or windows (default: the definition's first format).
    #[arg(long)]
    pub format: Option<Format>,
    /// Target architecture (default: the definition's first).
    #[arg(long)]
    pub arch: Option<Arch>,
    /// Output directory.
    #[arg(long, short)]
    pub out: PathBuf,
    /// The signed artifact lock.
    #[arg(long, default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    #[command(flatten)]
    pub trust: TrustArgs,
    /// Store or mirror directory holding the lock's blobs (`blobs/sha256/<hex>`). Default:
    /// the cache `kiln fetch` fills ($KILN_CACHE, else $XDG_CACHE_HOME/kiln or ~/.cache/kiln).
    #[arg(long, env = "KILN_STORE")]
    pub store: Option<PathBuf>,
    /// Fetch the artifacts the store lacks before baking, from the --mirror sources (upstream
    /// only with --upstream), verified as `kiln fetch` verifies them.
    #[arg(long)]
    pub fetch: bool,
    /// With --fetch: a mirror (http(s) URL, directory or registry mirror oci://HOST/REPO) to
    /// fetch from, tried in order (oci:// mirrors first).
    #[arg(
        long = "mirror",
        value_name = "URL|DIR|oci://HOST/REPO",
        requires = "fetch"
    )]
    pub mirrors: Vec<String>,
    /// With --fetch: fall back to the lock's upstream URLs after the mirrors.
    #[arg(long, requires = "fetch")]
    pub upstream: bool,
    #[command(flatten, next_help_heading = "Fetching (with --fetch)")]
    pub net: NetArgs,
    #[command(flatten, next_help_heading = "Fetching (with --fetch)")]
    pub registry: RegistryArgs,
    /// The kiln-firstboot binary to ship. Default, by the image's OS and `--arch`: from a
    /// release archive, PREFIX/lib/kiln/<os>-<arch>/ beside PREFIX/bin/kiln; in kiln's
    /// repository, what `make firstboot` / `make windows` put in target/firstboot/ (found from
    /// kiln's own location, else the current directory).
    #[arg(long)]
    pub firstboot: Option<PathBuf>,
    /// Bake as if the definition's `[kubernetes] version` were this: it must equal the lock's
    /// kubelet version, and names the layer (a lock of another patch release, or a mirror of
    /// stand-ins such as the fixture's `v1.36.4-standin`).
    #[arg(long, value_name = "VERSION", env = "KILN_KUBERNETES_VERSION")]
    pub kubernetes_version: Option<String>,
    /// Print what changed against an earlier layer's `.manifest.json`, and why.
    #[arg(long, value_name = "OLD_MANIFEST")]
    pub explain: Option<PathBuf>,
    /// Compression threads (0: all cores). Never changes the output bytes.
    #[arg(long, default_value_t = 0)]
    pub threads: u32,
    /// Bake cache: extracted archive members and hashes, keyed by content, so re-baking from
    /// a warm mirror skips decompression and hashing. Default: `$XDG_CACHE_HOME/kiln/bake`.
    #[arg(long, env = "KILN_BAKE_CACHE")]
    pub cache: Option<PathBuf>,
    /// Do not use or fill the bake cache.
    #[arg(long, conflicts_with = "cache")]
    pub no_cache: bool,
    /// The mksquashfs binary (xz sysext images only; zstd and gzip use kiln's own writer).
    #[arg(long, default_value = "mksquashfs")]
    pub mksquashfs: PathBuf,
    /// Sign the sysext's SHA256SUMS with this gpg key (fingerprint, key id or user id) into
    /// SHA256SUMS.gpg, and write `Verify=true` in the transfer file. Unsigned: `Verify=false`.
    #[arg(long, env = "KILN_SIGN_KEY", value_name = "KEY")]
    pub sign_key: Option<String>,
    /// gpg home directory holding the signing key (default: gpg's, `$GNUPGHOME` or ~/.gnupg).
    // No `requires = "sign_key"`: a KILN_GPG_HOMEDIR exported for sysext bakes must not
    // break the other formats.
    #[arg(long, env = "KILN_GPG_HOMEDIR", value_name = "DIR")]
    pub gpg_homedir: Option<PathBuf>,
    /// The gpg binary.
    #[arg(long, default_value = "gpg", value_name = "PATH")]
    pub gpg: PathBuf,
}

/// `kiln diff OLD NEW`
#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The older layer's `.manifest.json`.
    pub old: PathBuf,
    /// The newer layer's `.manifest.json`.
    pub new: PathBuf,
}

/// Runs `kiln bake`: exit 3 when a check refused an input (signature, inspection gate,
/// hostile archive, a blob that does not match the lock), 1 for other failures.
pub fn run_bake(a: BakeArgs, global: &Global) -> anyhow::Result<ExitCode> {
    Ok(bake_inner(a, global).unwrap_or_else(|e| crate::cli::fail::ended(&e, classify(&e))))
}

fn bake_inner(a: BakeArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let def = load_def(&a.image, a.kubernetes_version.as_deref())?;
    let format = a.format.unwrap_or(def.formats[0]);
    let arch = a.arch.unwrap_or(def.arch[0]);
    let (lock, _verified) = load_lock(&a.lock, &a.trust)?;
    let dirs = Dirs::from_env();
    // The same default as `kiln fetch`, so `kiln fetch && kiln bake` chain without flags.
    let store_dir = match &a.store {
        Some(dir) => dir.clone(),
        None => {
            let dir = dirs.store();
            if !global.quiet && !global.json {
                eprintln!(
                    "kiln: using the store {} (kiln fetch's cache; --store or KILN_STORE picks another)",
                    dir.display()
                );
            }
            dir
        }
    };
    let store = Store::open(&store_dir)
        .with_context(|| format!("opening store {}", store_dir.display()))?;
    let firstboot = FirstbootChoice::resolve(a.firstboot.as_deref(), def.os, arch);
    // Every decision about this bake's inputs, made once; the bake below asserts them.
    let mut plan = BakePlan::new(&a.image, &def, &lock, Some(&store), format, arch, firstboot)?;
    // Versions the bake would refuse are refused before a byte is fetched or read, as is a
    // missing kiln-firstboot (`kiln plan` reports both the same way).
    if let Some(skew) = plan.skew() {
        return Err(bake::BakeError::Skew {
            image: def.name.clone(),
            source: skew.clone(),
        }
        .into());
    }
    if let Some(why) = &plan.refused {
        return Err(bake::BakeError::Version(why.clone()).into());
    }
    // One for another OS or architecture is refused by the inspection gate below (exit 3).
    if let (Some(why), false) = (&plan.firstboot_missing, plan.firstboot_exists) {
        anyhow::bail!("{why}");
    }
    if !global.quiet && !global.json && a.firstboot.is_none() {
        eprintln!("kiln: shipping kiln-firstboot {}", plan.firstboot.display());
    }
    let firstboot = plan.firstboot.clone();
    if let (Some(w), false) = (&plan.warning, global.quiet) {
        eprintln!("kiln: warning: {}: {w}", a.lock.display());
    }
    if a.fetch {
        fetch_missing(&a, &plan, &store, &store_dir, global)?;
        plan.restat(&store);
    }
    if !global.quiet {
        for n in plan.left_out() {
            eprintln!(
                "kiln: warning: {} left out of the {} {} layer: {} does not pin it for {}/{} \
                 (optional: {})",
                n.name,
                def.name,
                arch,
                a.lock.display(),
                def.os,
                arch,
                n.optional.as_deref().unwrap_or("")
            );
        }
    }
    let inputs = bake::inputs_from_lock(&lock, &store, &def, arch)?;
    let images = bake::images::images_from_lock(&lock, &store, &def, arch)?;
    let epoch = bake::epoch_from_env().map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    let work = tempfile::Builder::new()
        .prefix(".kiln-bake-")
        .tempdir_in(&a.out)
        .with_context(|| format!("creating a scratch directory in {}", a.out.display()))?;
    let gate = bake::inspect_gate(def.os, arch);
    let cache = if a.no_cache {
        None
    } else {
        Some(a.cache.clone().unwrap_or_else(|| dirs.bake_cache()))
    };
    let req = BakeRequest {
        cache: cache.as_deref(),
        def: &def,
        arch,
        format,
        artifacts: &inputs,
        images: &images,
        firstboot: &firstboot,
        epoch,
        work: work.path(),
        gate: &gate,
    };
    let sign = match (&a.sign_key, format) {
        (Some(key), Format::Sysext) => {
            let s = bake::gpg::GpgSigner {
                gpg: a.gpg.clone(),
                key: key.clone(),
                homedir: a.gpg_homedir.clone(),
            };
            s.check()?;
            Some(s)
        }
        (None, Format::Sysext) => {
            if !global.quiet {
                eprintln!(
                    "kiln: warning: SHA256SUMS is not signed (no --sign-key or KILN_SIGN_KEY): \
                     the sysupdate transfer file says Verify=false, so nodes trust whatever \
                     the update URL serves (docs/bake.md#signing-sha256sums)"
                );
            }
            None
        }
        // Only a sysext publishes SHA256SUMS; a KILN_SIGN_KEY in the environment is no error
        // for the other formats.
        (_, _) => None,
    };
    let opts = WriteOptions {
        threads: a.threads,
        mksquashfs: a.mksquashfs.clone(),
        sign,
    };
    let phases = PhaseDisplay::new(global);
    let out = bake::bake_with(&req, &a.out, &opts, &phases);
    phases.finish();
    let out = out.with_context(|| format!("baking {} ({format}, {arch})", a.image.display()))?;
    if global.json {
        let files: Vec<String> = out.files.iter().map(|p| p.display().to_string()).collect();
        crate::cli::json::emit(
            "baked",
            crate::cli::json::Level::Info,
            serde_json::json!({"image_id": out.image_id, "format": format.to_string(), "arch": arch.to_string(), "files": files}),
        );
    } else if !global.quiet {
        println!("baked {} {format} {arch}: {}", def.name, out.image_id);
        for f in &out.files {
            println!("  {}", f.display());
        }
    }
    if let Some(old) = &a.explain {
        let old = manifest::Manifest::load(old)?;
        print_diff(&old, &out.manifest, global);
    }
    Ok(ExitCode::SUCCESS)
}

/// `bake --fetch`: fetches what the plan found missing from the store — the definition's
/// artifacts for this platform and the layer's images — from the `--mirror` sources (and
/// upstream only with `--upstream`).
fn fetch_missing(
    a: &BakeArgs,
    plan: &BakePlan,
    store: &Store,
    store_dir: &std::path::Path,
    global: &Global,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        !a.mirrors.is_empty() || a.upstream,
        "--fetch needs a source: --mirror URL|DIR (or --upstream to allow the lock's upstream URLs)"
    );
    let from = FetchFrom::new(&a.mirrors, a.upstream, &a.registry, &a.net);
    fetch_into(
        "bake --fetch",
        store,
        store_dir,
        &plan.missing_artifacts(),
        &plan.missing_images(store),
        &from,
        global,
    )
}

fn print_diff(old: &manifest::Manifest, new: &manifest::Manifest, global: &Global) {
    let changes = manifest::diff(old, new);
    if global.json {
        for c in &changes {
            crate::cli::json::emit(
                "change",
                crate::cli::json::Level::Info,
                serde_json::to_value(c).unwrap_or_default(),
            );
        }
    } else {
        print!("{}", manifest::render_diff(old, new, &changes));
    }
}

/// Runs `kiln diff`: exit 0 when the layers are identical, 1 when they differ (like `diff`).
pub fn run_diff(a: DiffArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let old = manifest::Manifest::load(&a.old)?;
    let new = manifest::Manifest::load(&a.new)?;
    let changes = manifest::diff(&old, &new);
    print_diff(&old, &new, global);
    Ok(if changes.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
