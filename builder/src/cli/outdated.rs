//! `kiln lock outdated`: reports, per lock entry, the newest patch of its minor and the newest
//! minor; exits [`exit::OUTDATED`] when a patch is missing.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cli::common::{exit, Global, DEFAULT_LOCK};
use crate::supply::lock::Lock;
use crate::supply::outdated::index::{Endpoints, GITHUB_API, KUBERNETES_INDEX};
use crate::supply::outdated::{self, Finding, OtherLock, Status, Upstream};

/// `kiln lock outdated`
#[derive(Debug, Args)]
pub struct OutdatedArgs {
    /// The lock file.
    #[arg(default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    /// Compare with another lock, or a mirror directory's lock, instead of upstream (offline).
    #[arg(long, value_name = "LOCK|MIRROR_DIR")]
    pub against: Option<PathBuf>,
    #[command(flatten)]
    pub index: IndexArgs,
}

/// Where upstream's release indexes are (`lock outdated`, `lock update --patch`).
#[derive(Debug, Clone, Args)]
pub struct IndexArgs {
    /// Base URL of the Kubernetes release labels (`BASE/release/stable-1.N.txt`).
    #[arg(long, value_name = "URL", default_value = KUBERNETES_INDEX, env = "KILN_KUBERNETES_INDEX")]
    pub kubernetes_index: String,
    /// Base URL of the GitHub API (`BASE/repos/OWNER/REPO/releases`).
    #[arg(long, value_name = "URL", default_value = GITHUB_API, env = "KILN_GITHUB_API")]
    pub github_api: String,
}

impl IndexArgs {
    /// The endpoints these flags name.
    pub fn endpoints(&self) -> Endpoints {
        Endpoints {
            kubernetes: self.kubernetes_index.clone(),
            github_api: self.github_api.clone(),
        }
    }
}

/// Runs `kiln lock outdated`.
pub fn run(a: OutdatedArgs, global: &Global) -> anyhow::Result<ExitCode> {
    // Only names and versions are read; no byte of any artifact is used, so the signature is
    // not needed (a lock kiln would refuse to parse is still refused).
    let lock = Lock::load_unverified(&a.lock)?;
    let findings = match &a.against {
        Some(other) => {
            let path = if other.is_dir() {
                other.join(crate::supply::mirror::LOCK_NAME)
            } else {
                other.clone()
            };
            outdated::check(&lock, &mut OtherLock(Lock::load_unverified(&path)?))?
        }
        None => outdated::check(&lock, &mut Upstream::new(a.index.endpoints())?)?,
    };
    let behind = findings
        .iter()
        .filter(|f| f.status == Status::PatchBehind)
        .count();
    for f in &findings {
        if global.json {
            crate::cli::json::emit(
                "entry",
                crate::cli::json::Level::Info,
                serde_json::json!({"event": "entry", "entry": f}),
            );
        } else if !global.quiet || f.status == Status::PatchBehind {
            println!("{}", line(f));
        }
    }
    if global.json {
        crate::cli::json::emit(
            "summary",
            crate::cli::json::Level::Info,
            serde_json::json!({"event": "summary", "lock": a.lock, "entries": findings.len(), "patch_behind": behind}),
        );
    } else if !global.quiet {
        println!(
            "{}: {behind} of {} entries miss a patch release of their minor",
            a.lock.display(),
            findings.len()
        );
    }
    Ok(if behind > 0 {
        ExitCode::from(exit::OUTDATED)
    } else {
        ExitCode::SUCCESS
    })
}

fn line(f: &Finding) -> String {
    let minor = f.newest_minor.as_ref().map_or(String::new(), |m| {
        format!("; newer minor: {m} (not applied by patch updates)")
    });
    let ignored = if f.ignored.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = f
            .ignored
            .iter()
            .map(|i| format!("{} [{}]", i.tag, i.why))
            .collect();
        format!("; ignored: {}", list.join(", "))
    };
    match f.status {
        Status::PatchBehind => format!(
            "{}: BEHIND: patch {} is out{minor}{ignored}",
            f.id,
            f.newest_patch.as_deref().unwrap_or("?")
        ),
        Status::Current => format!("{}: current patch{minor}{ignored}", f.id),
        Status::Unknown => format!("{}: unknown: {}", f.id, f.source.join("; ")),
    }
}
