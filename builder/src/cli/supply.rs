//! Command line for the supply chain: `kiln lock`, `kiln inspect`, `kiln fetch`, `kiln mirror`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::cli::{exit, Global};
use crate::inspect;
use crate::lock::{self, Arch, Lock, Os};
use crate::sign::{self, Trust, TrustedKey, Verified};

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
            Some(p) => TrustedKey::from_file(p)?,
            None => TrustedKey::release(),
        };
        Ok(if self.allow_unsigned {
            Trust::AllowUnsigned(key)
        } else {
            Trust::Key(key)
        })
    }
}

/// `kiln lock …`
#[derive(Debug, Subcommand)]
pub enum LockCommand {
    /// Check a lock's signature and contents; exit 3 on any mismatch.
    Verify(LockVerifyArgs),
    /// Sign a lock with a minisign secret key (writes LOCK.minisig).
    Sign(LockSignArgs),
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

/// Prints an error chain and picks the exit code for it.
pub fn fail(err: &anyhow::Error) -> ExitCode {
    eprintln!("kiln: error: {err}");
    for cause in err.chain().skip(1) {
        eprintln!("  caused by: {cause}");
    }
    ExitCode::from(classify(err))
}

/// Verification failures (signature, digest, size, binary gate) exit 3; sources that could not
/// deliver exit 4; everything else 1.
pub fn classify(err: &anyhow::Error) -> u8 {
    for cause in err.chain() {
        if cause.downcast_ref::<sign::SignError>().is_some() {
            return exit::VERIFY;
        }
        if let Some(e) = cause.downcast_ref::<lock::LockError>() {
            return match e {
                lock::LockError::Read { .. } => exit::FAILURE,
                _ => exit::VERIFY,
            };
        }
        if let Some(e) = cause.downcast_ref::<crate::store::StoreError>() {
            use crate::store::StoreError as S;
            return match e {
                S::Mismatch { .. } | S::TooLong { .. } | S::TooShort { .. } => exit::VERIFY,
                _ => exit::FAILURE,
            };
        }
        if let Some(
            inspect::InspectError::Mismatch { .. } | inspect::InspectError::NotExecutable { .. },
        ) = cause.downcast_ref::<inspect::InspectError>()
        {
            return exit::VERIFY;
        }
    }
    exit::FAILURE
}

fn done(r: anyhow::Result<ExitCode>) -> anyhow::Result<ExitCode> {
    Ok(r.unwrap_or_else(|e| fail(&e)))
}

/// Runs `kiln lock …`.
pub fn run_lock(cmd: LockCommand, global: &Global) -> anyhow::Result<ExitCode> {
    done(match cmd {
        LockCommand::Verify(a) => lock_verify(a, global),
        LockCommand::Sign(a) => lock_sign(a, global),
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
        println!(
            "ok: {} {}; {} artifacts, {} bytes",
            a.lock.display(),
            describe(&verified),
            lock.artifacts.len(),
            lock.total_size()
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn lock_sign(a: LockSignArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let bytes =
        std::fs::read(&a.lock).with_context(|| format!("reading lock {}", a.lock.display()))?;
    let text = std::str::from_utf8(&bytes)
        .with_context(|| format!("lock {} is not UTF-8", a.lock.display()))?;
    // Never sign something kiln itself would refuse to read.
    let lock = Lock::parse(text, &a.lock)?;
    let password = match &a.password_env {
        Some(var) => {
            Some(std::env::var(var).with_context(|| format!("reading password from ${var}"))?)
        }
        None => None,
    };
    let name = a
        .lock
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let comment = format!("timestamp:{now}\tfile:{name}");
    let sig = sign::sign(&bytes, &a.secret_key, password, &comment)?;
    let sig_path = lock::signature_path(&a.lock);
    crate::store::write_atomic(&sig_path, sig.as_bytes())?;
    if global.json {
        println!(
            "{}",
            serde_json::json!({"lock": a.lock, "signature": sig_path, "artifacts": lock.artifacts.len()})
        );
    } else if !global.quiet {
        println!("signed {} -> {}", a.lock.display(), sig_path.display());
    }
    Ok(ExitCode::SUCCESS)
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
