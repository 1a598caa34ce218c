//! Command line for `kiln install --root DIR LAYER.tar.zst`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::cli::Global;

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
}

/// Runs `kiln install`.
pub fn run_install(a: InstallArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let r = crate::install::install(&a.layer, &a.root, a.dry_run)
        .with_context(|| format!("installing {} into {}", a.layer.display(), a.root.display()))?;
    if global.json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else if !global.quiet {
        let verb = if a.dry_run { "would write" } else { "wrote" };
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
    Ok(ExitCode::SUCCESS)
}
