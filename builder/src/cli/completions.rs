//! `kiln completions SHELL` and `kiln man --out DIR`: shell completions and man pages made
//! from the clap definition itself, so neither can drift from what the parser accepts.
//! kiln-firstboot's page comes from its own `--help` text ([`crate::firstboot_man`]).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::cli::common::Global;

/// `kiln completions SHELL`
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: clap_complete::Shell,
}

/// `kiln man --out DIR`
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Directory for the pages: `kiln.1`, `kiln-<command>.1` for every subcommand
    /// (`kiln-mirror-sync.1`, …) and kiln-firstboot's `kiln-firstboot.8`. Created when
    /// missing.
    #[arg(long, short, value_name = "DIR")]
    pub out: PathBuf,
}

/// Prints the completion script for `a.shell` on stdout.
///
/// Install it where the shell looks, e.g. for bash:
/// `kiln completions bash > /etc/bash_completion.d/kiln` (or
/// `~/.local/share/bash-completion/completions/kiln`).
pub fn run_completions(a: CompletionsArgs, mut cmd: clap::Command) -> anyhow::Result<ExitCode> {
    // stdout is the script: `--json` events go to stderr.
    crate::cli::json::events_to_stderr();
    let mut out = Vec::new();
    clap_complete::generate(a.shell, &mut cmd, "kiln", &mut out);
    std::io::stdout()
        .lock()
        .write_all(&out)
        .context("writing the completion script to stdout")?;
    Ok(ExitCode::SUCCESS)
}

/// Writes one man page per command into `a.out`, each atomically ([`crate::atomic_file`]).
pub fn run_man(a: ManArgs, mut cmd: clap::Command, global: &Global) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&a.out).with_context(|| format!("creating {}", a.out.display()))?;
    cmd.build();
    let mut written = Vec::new();
    write_pages(&cmd, "kiln", &a.out, &mut written)?;
    // kiln-firstboot's page, from its --help text (the one the rootfs layer installs).
    let page = crate::firstboot_man::page().map_err(anyhow::Error::msg)?;
    let path = a.out.join(crate::firstboot_man::PAGE);
    crate::atomic_file::write(&path, ".kiln-man-", page.as_bytes(), 0o644)
        .with_context(|| format!("writing {}", path.display()))?;
    written.push(crate::firstboot_man::PAGE.to_string());
    if global.json {
        crate::cli::json::emit(
            "man_pages",
            crate::cli::json::Level::Info,
            serde_json::json!({ "man_pages": written }),
        );
    } else if !global.quiet {
        println!("kiln man: {} pages in {}", written.len(), a.out.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The page for `cmd` (named `name`, e.g. `kiln-mirror-sync`), then its subcommands'.
fn write_pages(
    cmd: &clap::Command,
    name: &str,
    dir: &Path,
    written: &mut Vec<String>,
) -> anyhow::Result<()> {
    // The page's title and synopsis name the command as it is typed (`kiln-mirror-sync`
    // is `kiln mirror sync`), as git's and cargo's pages do.
    let page = cmd.clone().name(name.to_string());
    let mut roff = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut roff)
        .with_context(|| format!("rendering the man page of {name}"))?;
    roff.extend_from_slice(crate::cli::man_sections::roff(&name.replace('-', " ")).as_bytes());
    let file = format!("{name}.1");
    let path = dir.join(&file);
    crate::atomic_file::write(&path, ".kiln-man-", &roff, 0o644)
        .with_context(|| format!("writing {}", path.display()))?;
    written.push(file);
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}
