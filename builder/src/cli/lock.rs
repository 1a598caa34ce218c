//! `kiln lock verify|sign|add|update|outdated|audit`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Subcommand};

use crate::cli::common::{
    describe, done, load_lock, runtime, Global, NetArgs, TrustArgs, DEFAULT_LOCK,
};
use crate::cli::lock_move::{lock_update, LockUpdateArgs};
use crate::supply::lock::{self, Arch, Lock, Os};
use crate::supply::lock_edit::{sign_lock, write_lock};
use crate::supply::sign::Verified;

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
    /// Report pins that carry a known advisory (exit 6 unless a signed, unexpired waiver
    /// in the lock covers it).
    Audit(crate::cli::audit::AuditArgs),
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

/// Runs `kiln lock …`.
pub fn run_lock(cmd: LockCommand, global: &Global) -> anyhow::Result<ExitCode> {
    done(match cmd {
        LockCommand::Verify(a) => lock_verify(a, global),
        LockCommand::Sign(a) => lock_sign(a, global),
        LockCommand::Add(a) => lock_add(a, global),
        LockCommand::Update(a) => lock_update(a, global),
        LockCommand::Outdated(a) => crate::cli::outdated::run(a, global),
        LockCommand::Audit(a) => crate::cli::audit::run(a, global),
    })
}

fn lock_verify(a: LockVerifyArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (lock, verified) = load_lock(&a.lock, &a.trust)?;
    if global.json {
        let (signed, key) = match &verified {
            Verified::Signed { key_id, .. } => (true, Some(key_id.clone())),
            Verified::Unsigned => (false, None),
        };
        crate::cli::json::emit(
            "lock_verified",
            crate::cli::json::Level::Info,
            serde_json::json!({
                "lock": a.lock, "ok": true, "signed": signed, "key_id": key,
                "artifacts": lock.artifacts.len(), "total_size": lock.total_size(),
            }),
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
        crate::cli::json::emit(
            "lock_signed",
            crate::cli::json::Level::Info,
            serde_json::json!({"lock": a.lock, "signature": sig_path, "artifacts": artifacts}),
        );
    } else if !global.quiet {
        println!("signed {} -> {}", a.lock.display(), sig_path.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn first_sha256(text: &str) -> Option<String> {
    text.split_whitespace()
        .map(|w| w.trim_start_matches('*').to_ascii_lowercase())
        .find(|w| lock::is_sha256_hex(w))
}

fn lock_add(a: LockAddArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (mut l, header) = if a.lock.exists() {
        crate::supply::lock_edit::read_for_edit(&a.lock)?
    } else {
        (
            Lock {
                path: a.lock.clone(),
                artifacts: Vec::new(),
                images: Vec::new(),
                waivers: Vec::new(),
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
    crate::cli::common::say_signature_removed(&a.lock, write_lock(&a.lock, &header, &l)?);
    if global.json {
        crate::cli::json::emit(
            "lock_entry_added",
            crate::cli::json::Level::Info,
            serde_json::json!({"added": entry.id(), "sha256": sha, "size": size}),
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
