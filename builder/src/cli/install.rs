//! Command line for `kiln install --root DIR LAYER.tar.zst`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::archive_rules::DEFAULT_MAX_BYTES;
use crate::cli::common::{announce_key, exit, Global};
use crate::install::{InstallError, InstallOptions, InstallReport, LayerTrust};
use crate::supply::sign::TrustedKey;

/// `kiln install`
#[derive(Debug, Args)]
pub struct InstallArgs {
    /// The rootfs layer (`kiln bake --format rootfs`).
    pub layer: PathBuf,
    /// The root to apply it to (a mounted image, or `/` inside the build VM).
    #[arg(long)]
    pub root: PathBuf,
    /// Check and report, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// How the layer is checked.
    #[command(flatten)]
    pub checks: LayerChecks,
}

/// The flags that say what a layer must prove and may contain, shared by `kiln install`
/// and `kiln image`.
#[derive(Debug, Args)]
pub struct LayerChecks {
    /// The checksum file to check the layer against (default: the `SHA256SUMS` beside the
    /// layer, as `kiln bake` writes it).
    #[arg(long, value_name = "FILE")]
    pub sums: Option<PathBuf>,
    /// Also require `SHA256SUMS.minisig`, a minisign signature of the checksum file by this
    /// public key.
    #[arg(long, value_name = "FILE", conflicts_with = "allow_unverified")]
    pub trusted_key: Option<PathBuf>,
    /// Install a layer that has no checksum file (one that exists is still checked).
    #[arg(long)]
    pub allow_unverified: bool,
    /// A path (`/usr/bin/x`) the layer may install setuid or setgid; repeat for more. By
    /// default no setuid/setgid file is installed.
    #[arg(long = "allow-setid", value_name = "PATH")]
    pub allow_setid: Vec<String>,
    /// Refuse a layer that unpacks to more than this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_BYTES)]
    pub max_size: u64,
    /// Also require what `kiln bake --attest-key` wrote beside the layer: its signature
    /// (`<layer>.sig`) and signed provenance (`<base>.provenance.dsse.json`) by this public key
    /// (kiln key generate's PREFIX.pub), the provenance's subject being the layer, and every
    /// lock entry and image it names being in --lock.
    #[arg(long, value_name = "FILE")]
    pub verify_key: Option<PathBuf>,
    /// The signed lock the layer's provenance must agree with (with --verify-key), trusted as
    /// every lock is: the embedded release key, or KILN_TRUSTED_KEY.
    #[arg(long, value_name = "FILE", default_value = crate::cli::common::DEFAULT_LOCK)]
    pub lock: PathBuf,
}

impl LayerChecks {
    /// With `--verify-key`: checks the layer's signature and provenance (exit 3 when refused).
    pub fn check_provenance(&self, layer: &Path) -> anyhow::Result<()> {
        use crate::supply::layer_trust::{check, LayerFiles, Untrusted};
        let Some(key) = &self.verify_key else {
            return Ok(());
        };
        let key = crate::attest::VerifyKey::load(key)?;
        let trust = crate::cli::common::TrustArgs {
            trusted_key: std::env::var_os("KILN_TRUSTED_KEY").map(PathBuf::from),
            allow_unsigned: false,
        };
        let lock = crate::cli::common::lock_in_use(&self.lock);
        let (lock, _) = crate::cli::common::load_lock(&lock, &trust)?;
        let files = LayerFiles::beside(layer).map_err(Untrusted)?;
        let c = check(&files, &key, &lock)
            .with_context(|| format!("layer {}: refused", layer.display()))?;
        eprintln!(
            "kiln: layer {} is signed by key {} and its provenance ({} inputs) is in the signed lock",
            layer.display(),
            key.id(),
            c.dependencies
        );
        Ok(())
    }

    /// The install options these flags make (announcing a `--trusted-key`).
    pub fn options(&self) -> anyhow::Result<InstallOptions> {
        let a = self;
        let trust = match (&a.trusted_key, a.allow_unverified) {
            (Some(p), _) => {
                let key = TrustedKey::from_file(p)?;
                announce_key(&key, p, "--trusted-key");
                LayerTrust::Signed {
                    sums: a.sums.clone(),
                    key,
                }
            }
            (None, true) => LayerTrust::AllowUnverified {
                sums: a.sums.clone(),
            },
            (None, false) => LayerTrust::Sums {
                sums: a.sums.clone(),
            },
        };
        let mut opts = InstallOptions::new(trust);
        opts.max_bytes = a.max_size;
        opts.allow_setid = a
            .allow_setid
            .iter()
            .map(|p| p.trim_start_matches('/').to_string())
            .collect();
        Ok(opts)
    }
}

/// Runs `kiln install`: exit 3 when a check refused the layer (hostile entry, checksum or
/// signature), 1 for other failures (a file kiln does not own, I/O).
pub fn run_install(a: InstallArgs, global: &Global) -> anyhow::Result<ExitCode> {
    match install_inner(a, global) {
        Ok(code) => Ok(code),
        Err(e) => {
            let refused = e.chain().any(|c| {
                c.downcast_ref::<InstallError>()
                    .is_some_and(InstallError::is_refusal)
                    || c.downcast_ref::<crate::supply::layer_trust::Untrusted>()
                        .is_some()
            });
            Ok(crate::cli::fail::ended(
                &e,
                if refused { exit::VERIFY } else { exit::FAILURE },
            ))
        }
    }
}

fn install_inner(a: InstallArgs, global: &Global) -> anyhow::Result<ExitCode> {
    a.checks.check_provenance(&a.layer)?;
    let mut opts = a.checks.options()?;
    opts.dry_run = a.dry_run;
    let r = crate::install::install(&a.layer, &a.root, &opts)
        .with_context(|| format!("installing {} into {}", a.layer.display(), a.root.display()))?;
    if global.json {
        crate::cli::json::emit(
            "installed",
            crate::cli::json::Level::Info,
            serde_json::to_value(&r).unwrap_or_default(),
        );
        return Ok(ExitCode::SUCCESS);
    }
    print_report(&r, &a.layer, a.dry_run, global);
    Ok(ExitCode::SUCCESS)
}

/// Prints what an install did (or, `dry_run`, would do): the verification, then the counts
/// and paths, as `kiln install` and `kiln image` both report it.
pub fn print_report(r: &InstallReport, layer: &Path, dry_run: bool, global: &Global) {
    if let Some(v) = &r.verified {
        if v.sums.is_none() {
            eprintln!("kiln: warning: {}", v.describe(layer));
        } else if !global.quiet {
            println!("{}", v.describe(layer));
        }
    }
    if !global.quiet {
        let verb = if dry_run { "would write" } else { "wrote" };
        println!(
            "{verb} {}, unchanged {}, removed {}, kept (modified) {}, new directories {}",
            r.written.len(),
            r.unchanged.len(),
            r.removed.len(),
            r.kept_modified.len(),
            r.dirs_created.len()
        );
        for p in &r.written {
            println!("  {verb} /{p}");
        }
        for p in &r.removed {
            println!("  removed /{p}");
        }
        for p in &r.kept_modified {
            println!("  kept /{p} (modified since install)");
        }
    }
}
