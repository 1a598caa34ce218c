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
    /// release archive, `PREFIX/lib/kiln/<os>-<arch>/` beside `PREFIX/bin/kiln`; in kiln's
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
    /// Sign the layer (`<layer>.sig`, for `cosign verify-blob --key`) and its provenance
    /// (`<base>.provenance.dsse.json`, for `cosign verify-blob-attestation --key`) with this
    /// ECDSA P-256 private key (PEM, mode 0600; `kiln key generate` makes one).
    #[arg(long, env = "KILN_ATTEST_KEY", value_name = "FILE")]
    pub attest_key: Option<PathBuf>,
    /// Bake the sysext as a signed Discoverable Disk Image (GPT: the squashfs, its dm-verity
    /// hash tree, and the root hash signed with --attest-key), which systemd-sysext verifies
    /// before it merges; writes `<name>.verity.crt`, the certificate nodes trust in
    /// /etc/verity.d/ (`kiln render --sysext` places it).
    #[arg(long)]
    pub sysext_ddi: bool,
    /// The provenance's `builder.id`: who ran this bake (a CI system's runner identity).
    #[arg(long, env = "KILN_BUILDER_ID", value_name = "URI", default_value = crate::bake::provenance::LOCAL_BUILDER)]
    pub builder_id: String,
    /// SOURCE_DATE_EPOCH for this bake when not the environment's (`kiln verify --rebuild`
    /// bakes with the one the provenance records).
    #[arg(skip)]
    pub epoch: Option<u64>,
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
    let (out, def) = bake_core(&a, global)?;
    let (format, arch) = (
        a.format.unwrap_or(def.formats[0]),
        a.arch.unwrap_or(def.arch[0]),
    );
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

/// Bakes as `kiln bake` does and returns every file written, the main one first
/// (`kiln verify --rebuild`).
pub(crate) fn bake_files(a: BakeArgs, global: &Global) -> anyhow::Result<Vec<PathBuf>> {
    Ok(bake_core(&a, global)?.0.files)
}

fn bake_core(
    a: &BakeArgs,
    global: &Global,
) -> anyhow::Result<(bake::BakeOutput, crate::image_def::ImageDef)> {
    let started = now();
    // A key kiln cannot use is refused before anything is read or written.
    let attest_key = a
        .attest_key
        .as_deref()
        .map(crate::attest::AttestKey::load)
        .transpose()?;
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
        fetch_missing(a, &plan, &store, &store_dir, global)?;
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
    let epoch = match a.epoch {
        Some(e) => e,
        None => bake::epoch_from_env().map_err(anyhow::Error::msg)?,
    };
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
    let ddi = ddi_signing(a.sysext_ddi, format, attest_key.as_ref())?;
    let opts = WriteOptions {
        threads: a.threads,
        mksquashfs: a.mksquashfs.clone(),
        sign,
        ddi,
    };
    let phases = PhaseDisplay::new(global);
    let out = bake::bake_with(&req, &a.out, &opts, &phases);
    phases.finish();
    let mut out =
        out.with_context(|| format!("baking {} ({format}, {arch})", a.image.display()))?;
    let facts = AttestInputs {
        a,
        def: &def,
        firstboot: &firstboot,
        inputs: &inputs,
        images: &images,
        epoch,
        started,
    };
    let written = attest_outputs(&facts, &out, attest_key.as_ref())?;
    out.files.extend(written);
    Ok((out, def))
}

/// `--sysext-ddi`: the key and certificate the sysext's root hash is signed with.
fn ddi_signing(
    ddi: bool,
    format: Format,
    attest_key: Option<&crate::attest::AttestKey>,
) -> anyhow::Result<Option<bake::options::DdiSigning>> {
    Ok(match (ddi, format, attest_key) {
        (false, _, _) => None,
        (true, Format::Sysext, Some(k)) => Some(bake::options::DdiSigning {
            key: k.signing_key().clone(),
            // Its identity depends on the key only (a fixed notBefore), so every bake signed
            // by one key ships the same certificate.
            cert_der: bake::ddi::pkcs7::self_signed_certificate(
                k.signing_key(),
                &format!("kiln sysext signing key {}", k.id()),
                0,
            ),
        }),
        (true, Format::Sysext, None) => anyhow::bail!(
            "--sysext-ddi signs the extension's dm-verity root hash with --attest-key (KILN_ATTEST_KEY): give one (kiln key generate makes one)"
        ),
        (true, f, _) => anyhow::bail!(
            "--sysext-ddi makes a signed disk image of a sysext; this bake's format is {f}"
        ),
    })
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// What a bake's provenance is made of, beside its output.
struct AttestInputs<'a> {
    a: &'a BakeArgs,
    def: &'a crate::image_def::ImageDef,
    firstboot: &'a std::path::Path,
    inputs: &'a [bake::layer::ArtifactInput],
    images: &'a [bake::images::ImageInput],
    epoch: u64,
    started: u64,
}

/// Writes `<base>.provenance.json` beside the layer and, with a key, the layer's signature
/// `<main>.sig` and the provenance's DSSE envelope `<base>.provenance.dsse.json`; returns
/// what it wrote. None of it is in SHA256SUMS or the manifest: the times it records would
/// make the layer's own files differ from run to run.
fn attest_outputs(
    f: &AttestInputs<'_>,
    out: &bake::BakeOutput,
    key: Option<&crate::attest::AttestKey>,
) -> anyhow::Result<Vec<PathBuf>> {
    use crate::bake::provenance::{statement, Facts, Named};
    let main = &out.files[0];
    let hash = |p: &std::path::Path| -> anyhow::Result<String> {
        Ok(crate::digest::hash_file(p, crate::digest::Sums::Sha256)
            .with_context(|| format!("hashing {}", p.display()))?
            .sha256)
    };
    let name = |p: &std::path::Path| {
        p.file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    };
    let lock = crate::cli::common::lock_in_use(&f.a.lock);
    let arch = f.a.arch.unwrap_or(f.def.arch[0]).to_string();
    let format = f.a.format.unwrap_or(f.def.formats[0]).to_string();
    let main_sha = hash(main)?;
    let size = std::fs::metadata(main)
        .with_context(|| format!("reading {}", main.display()))?
        .len();
    let oci = crate::supply::registry::layer_oci::layer_manifest(&name(main), &main_sha, size);
    let mut byproducts = Vec::new();
    for p in out.files.iter().filter(|p| name(p).ends_with(".spdx.json")) {
        byproducts.push(Named {
            name: name(p),
            sha256: hash(p)?,
        });
    }
    let facts = Facts {
        subject: Named {
            name: name(main),
            sha256: main_sha.clone(),
        },
        oci_manifest: crate::supply::registry::layer_oci::sha256_hex(&oci),
        definition: Named {
            name: f.a.image.display().to_string(),
            sha256: hash(&f.a.image)?,
        },
        lock: Named {
            name: name(&lock),
            sha256: hash(&lock)?,
        },
        firstboot: Named {
            name: name(f.firstboot),
            sha256: hash(f.firstboot)?,
        },
        format: &format,
        arch: &arch,
        kubernetes_version: &f.def.kubernetes.version,
        epoch: f.epoch,
        sysext_ddi: f.a.sysext_ddi,
        artifacts: f.inputs,
        images: f.images,
        image_id: &out.image_id,
        builder_id: &f.a.builder_id,
        byproducts: &byproducts,
        started: f.started,
        finished: now(),
    };
    let text = statement(&facts);
    let base = bake::target::base_name(f.def, f.a.arch.unwrap_or(f.def.arch[0]));
    let dir = main.parent().unwrap_or(std::path::Path::new("."));
    let write = |file: String, bytes: &[u8]| -> anyhow::Result<PathBuf> {
        let p = dir.join(file);
        crate::atomic_file::write(&p, ".kiln-attest-", bytes, 0o644)
            .map_err(|e| anyhow::anyhow!("writing {}: {}", e.path.display(), e.source))?;
        Ok(p)
    };
    let mut written = vec![write(format!("{base}.provenance.json"), text.as_bytes())?];
    if let Some(key) = key {
        let digest = hex::decode(&main_sha).context("the layer's sha256")?;
        let sig = key.sign_sha256(&digest).map_err(anyhow::Error::msg)?;
        written.push(write(format!("{}.sig", name(main)), sig.as_bytes())?);
        let env = key.dsse(crate::attest::IN_TOTO, text.as_bytes());
        written.push(write(
            format!("{base}.provenance.dsse.json"),
            env.as_bytes(),
        )?);
    }
    Ok(written)
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
