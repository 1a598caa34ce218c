//! `kiln key generate`: the key pair `kiln bake --attest-key` signs with.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::cli::common::{done, Global};

/// `kiln key …`
#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Make an ECDSA P-256 key pair: PREFIX.key (PKCS#8 PEM, 0600) and PREFIX.pub (PEM), the
    /// pair `kiln bake --attest-key` signs with and `cosign … --key PREFIX.pub` verifies with.
    Generate(KeyGenerateArgs),
}

/// `kiln key generate [PREFIX]`
#[derive(Debug, Args)]
pub struct KeyGenerateArgs {
    /// Where the pair goes: PREFIX.key and PREFIX.pub (never over existing files).
    #[arg(default_value = "kiln-attest")]
    pub prefix: PathBuf,
}

/// Runs `kiln key …`.
pub fn run_key(cmd: KeyCommand, global: &Global) -> anyhow::Result<ExitCode> {
    done(match cmd {
        KeyCommand::Generate(a) => generate(&a, global),
    })
}

fn generate(a: &KeyGenerateArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let (private, public, id) = crate::attest::generate(&a.prefix)?;
    if global.json {
        crate::cli::json::emit(
            "key_generated",
            crate::cli::json::Level::Info,
            serde_json::json!({"private": private, "public": public, "key_id": id}),
        );
    } else if !global.quiet {
        println!(
            "key {id}: private {} (0600: keep it secret, e.g. in your CI's secret store), public {}",
            private.display(),
            public.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
