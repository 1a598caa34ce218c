//! `kiln lock update --to VERSION` / `--patch`: move pins to a newer release in one command.
//! Each new download is hashed as it streams and compared with upstream's own checksum file,
//! which the new `verified` names; the lock is re-signed when a key is given. A step into a
//! later minor needs `--allow-minor` and prints the Kubernetes version-skew rules.

use std::process::ExitCode;

use anyhow::Context as _;

use std::path::PathBuf;

use clap::Args;

use crate::cli::common::{runtime, FilterArgs, Global, NetArgs, DEFAULT_LOCK};
use crate::supply::lock;
use crate::supply::lock_edit::{sign_lock, write_lock};
use crate::supply::outdated::index::Fetcher;
use crate::supply::outdated::policy::{self, Step};
use crate::supply::outdated::{self, Upstream};

/// Runs `kiln lock update` with `--to` or `--patch`.
pub fn run(a: &LockUpdateArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (mut l, header) = crate::supply::lock_edit::read_for_edit(&a.lock)?;
    let selected = a.filter.apply(&l);
    anyhow::ensure!(
        !selected.is_empty(),
        "{}: no entry matches --name/--os/--arch",
        a.lock.display()
    );
    // Decide every target first, so a refused step changes nothing.
    let mut moves = Vec::new();
    let mut upstream = None;
    for art in &selected {
        let to = match &a.to {
            Some(v) => v.clone(),
            None => {
                let up = match &mut upstream {
                    Some(u) => u,
                    None => upstream.insert(Upstream::new(a.index.endpoints())?),
                };
                let f = outdated::check_one(art, up)?;
                match (f.newest_patch, f.status) {
                    (Some(v), _) => v,
                    (None, status) => {
                        if !global.quiet && !global.json {
                            if status == outdated::Status::Unknown {
                                println!("{}: skipped: {}", art.id(), f.source.join("; "));
                            } else {
                                println!("{}: already the newest patch of its minor", art.id());
                            }
                        }
                        continue;
                    }
                }
            }
        };
        let (version, step) = policy::step(art, &to, a.allow_minor)?;
        moves.push((art.clone(), version, step));
    }
    if moves
        .iter()
        .any(|(art, _, s)| *s == Step::Minor && policy::is_kubernetes(&art.name))
    {
        eprintln!("kiln: crossing a Kubernetes minor.\n{}", policy::SKEW_RULES);
    }
    if moves.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    let opts = a.net.options();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut sums = Fetcher::new()?;
    for (old, version, step) in moves {
        let mut new = policy::moved(&old, &version);
        let cu = policy::checksum_url(&new).with_context(|| {
            format!(
                "{}: kiln does not know where upstream publishes {}'s checksum; use `kiln lock add --checksum-url`",
                old.id(),
                old.name
            )
        })?;
        let published = policy::published_sha256(&sums.get(&cu)?, new.file_name())
            .with_context(|| format!("{cu} gives no sha256 for {}", new.file_name()))?;
        let (sha, size) = rt.block_on(crate::supply::fetch::hash_url(
            &new.url,
            lock::MAX_UNSIZED,
            &opts,
        ))?;
        if sha != published {
            return Err(crate::supply::store::StoreError::Mismatch {
                what: format!("{} (checked against {cu})", new.url),
                expected: published,
                found: sha,
            }
            .into());
        }
        let how = match step {
            Step::Patch => "a patch update",
            Step::Minor => "a minor update (--allow-minor)",
        };
        new.sha256 = sha;
        new.size = size;
        new.verified = format!(
            "sha256 matched upstream's published checksum file {cu} (its entry for {}) when `kiln lock update` moved this entry from {} to {} ({how}) on a connected machine; the download was hashed as it streamed",
            new.file_name(),
            old.version,
            new.version
        );
        if global.json {
            crate::cli::json::emit(
                "lock_entry_moved",
                crate::cli::json::Level::Info,
                serde_json::json!({"moved": old.id(), "to": new.id(), "sha256": new.sha256, "size": size, "checksum": cu}),
            );
        } else if !global.quiet {
            println!(
                "{} -> {}: sha256 {} ({size} bytes) matches {cu}",
                old.id(),
                new.version,
                new.sha256
            );
        }
        if let Some(slot) = l
            .artifacts
            .iter_mut()
            .find(|x| x.name == old.name && x.os == old.os && x.arch == old.arch)
        {
            *slot = new;
        }
    }
    crate::cli::common::say_signature_removed(&a.lock, write_lock(&a.lock, &header, &l)?);
    if let Some(sk) = &a.secret_key {
        let (sig, _) = sign_lock(&a.lock, sk, a.password_env.as_deref())?;
        if !global.quiet && !global.json {
            println!("signed {} -> {}", a.lock.display(), sig.display());
        }
    }
    Ok(ExitCode::SUCCESS)
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

pub(crate) fn lock_update(a: LockUpdateArgs, global: &Global) -> anyhow::Result<ExitCode> {
    if a.to.is_some() || a.patch {
        return run(&a, global);
    }
    let (mut l, header) = crate::supply::lock_edit::read_for_edit(&a.lock)?;
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
            crate::cli::json::emit(
                "checksum",
                crate::cli::json::Level::Info,
                serde_json::json!({"id": art.id(), "ok": true, "size": size}),
            );
        } else if !global.quiet {
            println!("{}: sha256 confirmed, {size} bytes", art.id());
        }
    }
    if changed {
        crate::cli::common::say_signature_removed(&a.lock, write_lock(&a.lock, &header, &l)?);
        if let Some(sk) = &a.secret_key {
            let (sig, _) = sign_lock(&a.lock, sk, a.password_env.as_deref())?;
            eprintln!("kiln: signed {} -> {}", a.lock.display(), sig.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
