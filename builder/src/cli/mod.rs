//! The command line: one subcommand per job. Each area owns its own file under `cli/`.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches as _, Parser, Subcommand};
use kiln_firstboot::contract;

pub mod audit;
pub mod bake;
pub mod common;
pub mod completions;
pub mod fail;
pub mod fetch;
pub mod image;
pub mod inspect;
pub mod install;
pub mod json;
pub mod key;
pub mod lock;
pub mod lock_move;
pub mod man_sections;
pub mod mirror;
pub mod mirror_oci;
pub mod outdated;
pub mod phases;
pub mod plan;
pub mod progress;
pub mod render;
pub mod verify;

pub use common::{exit, Global};

/// kiln builds immutable Kubernetes node images from a signed, pinned artifact lock.
#[derive(Debug, Parser)]
#[command(name = "kiln", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the node contract version this kiln bakes and renders for.
    Contract,
    /// Check or sign the artifact lock.
    #[command(subcommand)]
    Lock(lock::LockCommand),
    /// Report what binaries are (ELF/PE, machine, linkage) and check them against an OS/arch.
    Inspect(inspect::InspectArgs),
    /// Render a node.toml into cloud-init, Ignition, Windows user data or a file tree
    /// (or `--check` user data).
    Render(render::RenderArgs),
    /// Fill the local cache with a lock's artifacts (mirrors, then upstream), verified.
    Fetch(fetch::FetchArgs),
    /// Keep an air-gapped artifact mirror: sync, verify, pack, unpack.
    #[command(subcommand)]
    Mirror(mirror::MirrorCommand),
    /// What a bake needs and would write, per format and arch, before any blob is read.
    Plan(plan::PlanArgs),
    /// Bake a reproducible node image layer (sysext, rootfs overlay, Windows zip) + SBOM.
    Bake(bake::BakeArgs),
    /// Rebuild a baked layer from its provenance's inputs and compare bytes (exit 0 only when
    /// identical; 3 naming the first differing file or input).
    Verify(verify::VerifyArgs),
    /// Explain what changed between two baked layers (their .manifest.json files).
    Diff(bake::DiffArgs),
    /// Apply a rootfs layer to a root directory (a Packer/image-builder step).
    Install(install::InstallArgs),
    /// Turn a base disk image into a node image without booting it (rootful, loop device).
    Image(image::ImageArgs),
    /// Make the key pair `kiln bake --attest-key` signs layers and provenance with.
    #[command(subcommand)]
    Key(key::KeyCommand),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(completions::CompletionsArgs),
    /// Write kiln's man pages (one per command) into a directory.
    Man(completions::ManArgs),
}

/// Parses the command line, runs it, and turns the outcome into an exit code.
pub fn main() -> ExitCode {
    // A reader that closes its end early (`kiln plan … | head -1`) makes std's print macros
    // panic with "failed printing to stdout: Broken pipe". Other Unix tools die of SIGPIPE
    // there: kiln unwinds (so scratch directories are removed), prints nothing and exits 141,
    // the status a shell shows for SIGPIPE. Every other panic is reported as before.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !is_stdout_broken_pipe(info.payload()) {
            default_hook(info);
        }
    }));
    let matches = match Cli::command().try_get_matches() {
        Ok(m) => m,
        Err(e) => {
            use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
            if !matches!(e.kind(), DisplayHelp | DisplayVersion)
                && std::env::args_os().any(|a| a == "--json")
            {
                json::usage_error(&e.to_string());
            }
            e.exit()
        }
    };
    let name = command_name(&matches);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    if cli.global.json {
        json::enable(name);
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(cli))) {
        Ok(Ok(code)) => {
            json::result(
                (0..=u8::MAX)
                    .find(|&n| ExitCode::from(n) == code)
                    .unwrap_or(1),
            );
            code
        }
        // The same cause exits with the same code whichever command met it.
        Ok(Err(err)) => fail::fail(&err),
        Err(payload) if is_stdout_broken_pipe(&*payload) => ExitCode::from(exit::BROKEN_PIPE),
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

/// The command's name from its matches: `bake`, `lock verify`, `mirror sync`.
fn command_name(m: &clap::ArgMatches) -> String {
    let mut words = Vec::new();
    let mut m = m;
    while let Some((name, sub)) = m.subcommand() {
        words.push(name.to_string());
        m = sub;
    }
    words.join(" ")
}

/// Whether a panic is std's print macros failing on a closed stdout.
fn is_stdout_broken_pipe(payload: &(dyn std::any::Any + Send)) -> bool {
    let msg = payload
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| payload.downcast_ref::<&str>().copied());
    msg.is_some_and(|m| m.starts_with("failed printing to stdout") && m.contains("Broken pipe"))
}

/// Dispatches one parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Contract => {
            if cli.global.json {
                json::emit(
                    "contract",
                    json::Level::Info,
                    serde_json::json!({ "kiln_contract": contract::VERSION }),
                );
            } else {
                println!("{}={}", contract::KILN_CONTRACT, contract::VERSION);
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Lock(c) => lock::run_lock(c, &cli.global),
        Command::Inspect(a) => inspect::run_inspect(a, &cli.global),
        Command::Render(args) => render::run(args, &cli.global),
        Command::Fetch(a) => fetch::run_fetch(a, &cli.global),
        Command::Mirror(c) => mirror::run_mirror(c, &cli.global),
        Command::Plan(a) => plan::run_plan(a, &cli.global),
        Command::Bake(a) => bake::run_bake(a, &cli.global),
        Command::Diff(a) => bake::run_diff(a, &cli.global),
        Command::Verify(a) => verify::run_verify(a, &cli.global),
        Command::Install(a) => install::run_install(a, &cli.global),
        Command::Image(a) => image::run_image(a, &cli.global),
        Command::Key(c) => key::run_key(c, &cli.global),
        Command::Completions(a) => completions::run_completions(a, Cli::command()),
        Command::Man(a) => completions::run_man(a, Cli::command(), &cli.global),
    }
}
