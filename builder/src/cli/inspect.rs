//! `kiln inspect`: what binaries are, checked against an OS and architecture.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cli::common::{done, Global};
use crate::cli::fail::classify;
use crate::supply::inspect;
use crate::supply::lock::{Arch, Os};

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
                    crate::cli::json::emit(
                        "file",
                        crate::cli::json::Level::Info,
                        serde_json::json!({"file": f, "ok": true, "info": info}),
                    );
                } else if !global.quiet {
                    println!("{what}: {info}");
                }
            }
            Err(e) => {
                if global.json {
                    crate::cli::json::emit(
                        "file",
                        crate::cli::json::Level::Error,
                        serde_json::json!({"file": f, "ok": false, "error": e.to_string()}),
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
