//! `kiln lock update --to VERSION` / `--patch`: move pins to a newer release in one command.
//! Each new download is hashed as it streams and compared with upstream's own checksum file,
//! which the new `verified` names; the lock is re-signed when a key is given. A step into a
//! later minor needs `--allow-minor` and prints the Kubernetes version-skew rules.

use std::process::ExitCode;

use anyhow::Context as _;

use crate::cli::supply::{header_of, sign_lock, write_lock, LockUpdateArgs};
use crate::cli::Global;
use crate::supply::lock::{self, Lock};
use crate::supply::outdated::index::Fetcher;
use crate::supply::outdated::policy::{self, Step};
use crate::supply::outdated::{self, Upstream};

/// Runs `kiln lock update` with `--to` or `--patch`.
pub fn run(a: &LockUpdateArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let text = std::fs::read_to_string(&a.lock)
        .with_context(|| format!("reading lock {}", a.lock.display()))?;
    let mut l = Lock::parse(&text, &a.lock)?;
    let header = header_of(&text);
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
            println!(
                "{}",
                serde_json::json!({"moved": old.id(), "to": new.id(), "sha256": new.sha256, "size": size, "checksum": cu})
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
    write_lock(&a.lock, &header, &l)?;
    if let Some(sk) = &a.secret_key {
        let (sig, _) = sign_lock(&a.lock, sk, a.password_env.as_deref())?;
        if !global.quiet && !global.json {
            println!("signed {} -> {}", a.lock.display(), sig.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}
