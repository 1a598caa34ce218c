//! `kiln plan IMAGE`: what a bake needs and would write, before any blob is read.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::cli::common::{done, exit, load_def, load_lock, Global, TrustArgs, DEFAULT_LOCK};
use crate::image_def::{Arch, Format, ImageDef};
use crate::plan::{plan, BakePlan, Dirs, FirstbootChoice};
use crate::supply::store::Store;

/// `kiln plan IMAGE`
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Image definition (`images/windows.toml`, …).
    pub image: PathBuf,
    /// Only this format (default: every format of the definition).
    #[arg(long)]
    pub format: Option<Format>,
    /// Only this architecture (default: every architecture of the definition).
    #[arg(long)]
    pub arch: Option<Arch>,
    /// The signed artifact lock.
    #[arg(long, default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    #[command(flatten)]
    pub trust: TrustArgs,
    /// The store a bake would read (default: as `kiln bake`: $KILN_STORE, else kiln fetch's
    /// cache). Only looked at, never created.
    #[arg(long, env = "KILN_STORE")]
    pub store: Option<PathBuf>,
    /// The kiln-firstboot binary a bake would ship (default: as `kiln bake`, by OS and arch).
    #[arg(long)]
    pub firstboot: Option<PathBuf>,
    /// Plan as if the definition's `[kubernetes] version` were this (as `kiln bake`).
    #[arg(long, value_name = "VERSION", env = "KILN_KUBERNETES_VERSION")]
    pub kubernetes_version: Option<String>,
}

/// Runs `kiln plan`: exit 0 when the lock pins everything the definition needs (missing
/// blobs or binaries are reported, `kiln bake --fetch` and `make firstboot` fill them), 3
/// when it does not or when the bake would refuse the lock's versions.
pub fn run_plan(a: PlanArgs, global: &Global) -> anyhow::Result<ExitCode> {
    done(plan_cmd(a, global))
}

fn plan_cmd(a: PlanArgs, global: &Global) -> anyhow::Result<ExitCode> {
    let def = load_def(&a.image, a.kubernetes_version.as_deref())?;
    let (lock, _) = load_lock(&a.lock, &a.trust)?;
    let store_dir = a.store.clone().unwrap_or_else(|| Dirs::from_env().store());
    let store = store_dir
        .join("blobs/sha256")
        .is_dir()
        .then(|| Store::open(&store_dir))
        .transpose()?;
    let formats: Vec<Format> = a.format.into_iter().collect();
    let arches: Vec<Arch> = a.arch.into_iter().collect();
    let firstboot = |arch: Arch| FirstbootChoice::resolve(a.firstboot.as_deref(), def.os, arch);
    let targets = plan(
        &a.image,
        &def,
        &lock,
        store.as_ref(),
        &formats,
        &arches,
        &firstboot,
    )?;

    if global.json {
        crate::cli::json::emit(
            "plan",
            crate::cli::json::Level::Info,
            serde_json::json!({
                "image": a.image, "name": def.name, "os": def.os.to_string(),
                "lock": a.lock, "store": store.as_ref().map(|_| &store_dir),
                "covered": targets.iter().all(BakePlan::covered),
                "ready": targets.iter().all(BakePlan::ready),
                "targets": targets,
            }),
        );
    } else if !global.quiet {
        print_plan(&a, &def, &targets, store.is_some().then_some(&store_dir));
    }
    let uncovered: Vec<String> = targets
        .iter()
        .flat_map(|t| {
            t.unpinned()
                .map(move |n| format!("{} for {}/{}", n.name, def.os, t.arch))
        })
        .collect();
    let refused: Vec<&str> = targets
        .iter()
        .filter_map(|t| t.refused.as_deref())
        .collect();
    if let Some(first) = refused.first() {
        return Ok(crate::cli::fail::ended(
            &anyhow::anyhow!("{first}"),
            exit::VERIFY,
        ));
    }
    if uncovered.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    Ok(crate::cli::fail::ended(
        &anyhow::anyhow!(
            "{} does not pin what {} needs: {}",
            a.lock.display(),
            a.image.display(),
            uncovered.join(", ")
        ),
        exit::VERIFY,
    ))
}

fn print_plan(a: &PlanArgs, def: &ImageDef, targets: &[BakePlan], store: Option<&PathBuf>) {
    println!(
        "plan for {} ({}, {}), lock {}, store {}",
        a.image.display(),
        def.name,
        def.os,
        a.lock.display(),
        store.map_or_else(|| "none found".to_string(), |s| s.display().to_string())
    );
    for t in targets {
        let state = if t.ready() {
            "ready to bake"
        } else if t.refused.is_some() {
            "REFUSED (below)"
        } else if t.covered() {
            "covered by the lock, not ready to bake (below)"
        } else {
            "NOT COVERED by the lock"
        };
        println!("\n{} {}: {state}", t.format, t.arch);
        for n in &t.artifacts {
            match &n.pin {
                None => match &n.optional {
                    Some(why) => println!(
                        "  {:<15} left out: not in the lock for {}/{} (optional: {why})",
                        n.name, def.os, t.arch
                    ),
                    None => {
                        println!("  {:<15} not in the lock for {}/{}", n.name, def.os, t.arch)
                    }
                },
                Some(p) => println!(
                    "  {:<15} {:<12} {}  {}",
                    n.name,
                    p.version,
                    &p.sha256[..12.min(p.sha256.len())],
                    if n.in_store {
                        "in the store"
                    } else {
                        "not in the store (kiln fetch, or bake --fetch)"
                    }
                ),
            }
        }
        for img in &t.images {
            let missing = t.images_missing.contains(&img.id());
            println!(
                "  {:<15} {}  {}",
                img.name,
                img.reference,
                if missing {
                    "not in the store (kiln fetch, or bake --fetch)"
                } else {
                    "in the store"
                }
            );
        }
        match &t.firstboot_missing {
            None => println!(
                "  {:<15} {}  present",
                "kiln-firstboot",
                t.firstboot.display()
            ),
            Some(why) => println!("  {:<15} {why}", "kiln-firstboot"),
        }
        if let Some(why) = &t.refused {
            println!("  refused: {why}");
        }
        if let Some(w) = &t.warning {
            println!("  warning: {w}");
        }
        println!("  writes: {}", t.outputs.join(", "));
        println!(
            "  inputs: {} bytes known (the lock's sizes, else the stored blobs'); the layer is of the same order",
            t.input_bytes
        );
    }
}
