//! Command line for `kiln image --base BASE --layer LAYER --out OUT`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cli::common::{exit, Global};
use crate::cli::install::{print_report, LayerChecks};
use crate::image::{Format, ImageOptions, Via};

/// `kiln image`
#[derive(Debug, Args)]
#[command(
    after_help = "Modes (--via): loop, as root: the root partition of a copy of the base is \
loop-mounted in a private mount namespace; ext4, xfs and btrfs roots. debugfs, without \
privileges: e2fsprogs' debugfs edits the ext4 root inside the copy (no mount, no loop \
device, no FUSE), then every written file is read back and e2fsck -fn checks the \
filesystem. auto (the default) takes loop when kiln may mount, debugfs otherwise."
)]
pub struct ImageArgs {
    /// The base disk image: raw, qcow2, VHD, VHDX or a single-file VMDK, read by format
    /// (never probed by qemu-img). Never written.
    #[arg(long, value_name = "FILE")]
    pub base: PathBuf,
    /// The rootfs layer (`kiln bake --format rootfs`), applied as `kiln install` applies it;
    /// or a sysext (`--format sysext`, NAME.raw) for a Flatcar base, placed in
    /// /etc/extensions/ of its ROOT partition.
    #[arg(long, value_name = "FILE")]
    pub layer: PathBuf,
    /// The node image to write (through a temporary file in its directory and a rename).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// The output format (vhd: fixed, whole MiB, for Azure; vmdk: stream-optimised).
    #[arg(long, value_enum, default_value_t = Format::Qcow2)]
    pub format: Format,
    /// The root partition's number (as `sgdisk -p` counts), instead of finding it by GPT
    /// type, label (cloudimg-rootfs, root, ROOT) or MBR type 0x83.
    #[arg(long, value_name = "N")]
    pub partition: Option<u32>,
    /// Upgrade a base that is already a kiln node of another image (files the old layer
    /// installed and the new one lacks are removed, as `kiln install` does).
    #[arg(long)]
    pub replace: bool,
    /// A node config (node.toml): its files (what `kiln render --provisioner files` writes)
    /// go into the image's /etc/kiln/, so the node needs no user data at boot.
    #[arg(long, value_name = "NODE_TOML")]
    pub node: Option<PathBuf>,
    /// How the root filesystem is written: loop (root), debugfs (no privileges, ext4), or
    /// auto.
    #[arg(long, value_enum, default_value_t = Via::Auto)]
    pub via: Via,
    /// Let a qcow2 base read its backing files and external data file from DIR (only
    /// regular files inside DIR, symlinks and `..` resolved first). Without it a base that
    /// names any other file (backing file, data file, VMDK extent or parent, VHD parent) is
    /// refused before qemu-img opens it.
    #[arg(long, value_name = "DIR")]
    pub allow_backing_dir: Option<PathBuf>,
    /// How the layer is checked.
    #[command(flatten)]
    pub checks: LayerChecks,
}

/// Runs `kiln image`: exit 3 when a check refused the layer, 1 for other failures.
pub fn run_image(a: ImageArgs, global: &Global) -> anyhow::Result<ExitCode> {
    // Read before anything is copied: a node config that does not validate stops here.
    let node_files = match &a.node {
        Some(p) => crate::render::NodeConfig::load(p)?.files(),
        None => Vec::new(),
    };
    if let Err(e) = a.checks.check_provenance(&a.layer) {
        let code = crate::cli::fail::classify(&e);
        return Ok(crate::cli::fail::ended(&e, code));
    }
    let opts = ImageOptions {
        base: a.base.clone(),
        layer: a.layer.clone(),
        out: a.out.clone(),
        format: a.format,
        partition: a.partition,
        replace: a.replace,
        install: a.checks.options()?,
        node_files,
        via: a.via,
        allow_backing_dir: a.allow_backing_dir.clone(),
    };
    let r = match crate::image::build(&opts) {
        Ok(r) => r,
        Err(e) => {
            let refused = e.is_refusal();
            return Ok(crate::cli::fail::ended(
                &anyhow::Error::from(e),
                if refused { exit::VERIFY } else { exit::FAILURE },
            ));
        }
    };
    if global.json {
        crate::cli::json::emit(
            "image",
            crate::cli::json::Level::Info,
            serde_json::to_value(&r).unwrap_or_default(),
        );
        return Ok(ExitCode::SUCCESS);
    }
    if !global.quiet && !r.swept.is_empty() {
        for p in &r.swept {
            println!("removed {} (left by a killed kiln image)", p.display());
        }
    }
    if !global.quiet {
        println!(
            "base {} ({}, {} table): root is partition {} ({}) at byte {} ({} bytes), {} bytes free; written via {}",
            a.base.display(),
            r.base_format,
            r.table,
            r.partition,
            r.filesystem,
            r.offset,
            r.size,
            r.free_before,
            clap::ValueEnum::to_possible_value(&r.via)
                .map(|v| v.get_name().to_string())
                .unwrap_or_default()
        );
        if let Some(old) = &r.replaced {
            println!("replaced kiln node {old}");
        }
    }
    print_report(&r.install, &a.layer, false, global);
    if !global.quiet && !r.node_files.is_empty() {
        println!("node config: wrote {}", r.node_files.join(" "));
    }
    if !global.quiet {
        println!("wrote {} (SPDX SBOM)", r.sbom.display());
        println!(
            "wrote {} ({}), image id {}",
            r.out.display(),
            clap::ValueEnum::to_possible_value(&a.format)
                .map(|v| v.get_name().to_string())
                .unwrap_or_default(),
            r.image_id.as_deref().unwrap_or("(none)")
        );
    }
    Ok(ExitCode::SUCCESS)
}
