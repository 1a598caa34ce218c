//! `kiln verify --rebuild LAYER`: bake the layer again from the inputs its provenance records
//! and compare bytes (issue 39). Exit 0 only when the rebuild is identical; 3 when it
//! differs (naming the first differing file) or when an input on this machine is not the one
//! the provenance names (naming which).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, FromArgMatches as _};
use serde_json::Value;

use crate::bake::compare::{compare, Difference, Mismatch};
use crate::cli::common::{done, Global, TrustArgs, DEFAULT_LOCK};

/// `kiln verify --rebuild LAYER`
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The layer's main file, as `kiln bake` wrote it (`.raw`, `.tar.zst`, `.zip`).
    pub layer: PathBuf,
    /// Rebuild the layer from its provenance's inputs and compare bytes.
    #[arg(long)]
    pub rebuild: bool,
    /// The layer's provenance (default: the `*.provenance.json` beside it whose subject is
    /// the layer's file name).
    #[arg(long, value_name = "FILE")]
    pub provenance: Option<PathBuf>,
    /// The image definition (default: the path the provenance records, from here).
    #[arg(long, value_name = "FILE")]
    pub definition: Option<PathBuf>,
    /// The signed lock; its sha256 must be the one the provenance records.
    #[arg(long, default_value = DEFAULT_LOCK)]
    pub lock: PathBuf,
    #[command(flatten)]
    pub trust: TrustArgs,
    /// The store holding the lock's blobs (as `kiln bake`).
    #[arg(long, env = "KILN_STORE")]
    pub store: Option<PathBuf>,
    /// The kiln-firstboot to ship (as `kiln bake`); its sha256 must be the recorded one.
    #[arg(long)]
    pub firstboot: Option<PathBuf>,
    /// The key a signed sysext disk image (`kiln bake --sysext-ddi`) was signed with: its
    /// signature partition is part of the bytes compared, and ECDSA (RFC 6979) signs the
    /// same root hash the same way, so the rebuild needs the same key.
    #[arg(long, env = "KILN_ATTEST_KEY", value_name = "FILE")]
    pub attest_key: Option<PathBuf>,
}

/// Runs `kiln verify`.
pub fn run_verify(a: VerifyArgs, global: &Global) -> anyhow::Result<ExitCode> {
    done(verify(&a, global))
}

fn sha256(p: &Path) -> anyhow::Result<String> {
    Ok(crate::digest::hash_file(p, crate::digest::Sums::Sha256)
        .with_context(|| format!("hashing {}", p.display()))?
        .sha256)
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// Bakes the layer again into a scratch directory (kept alive by the returned guard) with
/// `[format, arch, kubernetes version]` and `epoch` as recorded; returns what it wrote.
fn rebuild(
    a: &VerifyArgs,
    definition: &Path,
    [format, arch, version]: [&String; 3],
    epoch: u64,
    ddi: bool,
) -> anyhow::Result<(tempfile::TempDir, Vec<PathBuf>)> {
    anyhow::ensure!(
        !ddi || a.attest_key.is_some(),
        "{} is a signed sysext disk image (kiln bake --sysext-ddi): its rebuild is signed again, \
         so give the key it was signed with (--attest-key, KILN_ATTEST_KEY)",
        a.layer.display()
    );
    let scratch = tempfile::Builder::new()
        .prefix(".kiln-verify-")
        .tempdir()
        .context("creating a scratch directory")?;
    let mut argv: Vec<std::ffi::OsString> = vec![
        "bake".into(),
        definition.into(),
        "--format".into(),
        format.into(),
        "--arch".into(),
        arch.into(),
        "--kubernetes-version".into(),
        version.into(),
        "--lock".into(),
        a.lock.clone().into(),
        "--out".into(),
        scratch.path().into(),
    ];
    for (flag, v) in [
        ("--store", &a.store),
        ("--firstboot", &a.firstboot),
        ("--trusted-key", &a.trust.trusted_key),
    ] {
        if let Some(v) = v {
            argv.push(flag.into());
            argv.push(v.clone().into());
        }
    }
    if a.trust.allow_unsigned {
        argv.push("--allow-unsigned".into());
    }
    if let (true, Some(k)) = (ddi, &a.attest_key) {
        argv.push("--sysext-ddi".into());
        argv.push("--attest-key".into());
        argv.push(k.clone().into());
    }
    let cmd = crate::cli::bake::BakeArgs::augment_args(clap::Command::new("bake"));
    let mut bake = crate::cli::bake::BakeArgs::from_arg_matches(&cmd.try_get_matches_from(argv)?)?;
    bake.epoch = Some(epoch);
    let quiet = Global {
        json: false,
        quiet: true,
    };
    let rebuilt = crate::cli::bake::bake_files(bake, &quiet)?;
    Ok((scratch, rebuilt))
}

/// The provenance `--provenance` names, else the one beside the layer whose subject is it.
fn find_provenance(a: &VerifyArgs) -> anyhow::Result<(PathBuf, Value)> {
    crate::supply::layer_trust::find_provenance(&a.layer, a.provenance.as_deref())
        .map_err(|e| anyhow::anyhow!("{e}, or --provenance FILE"))
}

/// Only a regular file is read (hashed, decompressed): a FIFO or /dev/zero never ends.
fn regular_layer(layer: &Path) -> anyhow::Result<()> {
    let meta =
        std::fs::metadata(layer).with_context(|| format!("reading layer {}", layer.display()))?;
    anyhow::ensure!(
        meta.is_file(),
        "layer {}: expected a regular file (the main file kiln bake wrote), found a {}",
        layer.display(),
        crate::bounded_read::type_name(&meta)
    );
    Ok(())
}

fn verify(a: &VerifyArgs, global: &Global) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        a.rebuild,
        "kiln verify checks a layer by rebuilding it: pass --rebuild"
    );
    regular_layer(&a.layer)?;
    let (prov_path, prov) = find_provenance(a)?;
    let params = &prov["predicate"]["buildDefinition"]["externalParameters"];
    let text = |v: &Value, what: &str| -> anyhow::Result<String> {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("provenance {}: no {what}", prov_path.display()))
    };
    let recorded_layer = text(&prov["subject"][0]["digest"]["sha256"], "subject digest")?;
    let definition = match &a.definition {
        Some(d) => d.clone(),
        None => PathBuf::from(text(&params["definition"]["path"], "definition path")?),
    };
    let format = text(&params["format"], "format")?;
    let arch = text(&params["arch"], "arch")?;
    let version = text(&params["kubernetesVersion"], "kubernetesVersion")?;
    let epoch = params["sourceDateEpoch"]
        .as_u64()
        .ok_or_else(|| anyhow::anyhow!("provenance {}: no sourceDateEpoch", prov_path.display()))?;
    let deps = prov["predicate"]["buildDefinition"]["resolvedDependencies"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let recorded = |name: &str| {
        deps.iter()
            .find(|d| d["name"] == name)
            .and_then(|d| d["digest"]["sha256"].as_str())
            .map(str::to_string)
    };
    let recorded_lock = deps
        .iter()
        .find(|d| d["annotations"]["role"] == "lock")
        .and_then(|d| d["digest"]["sha256"].as_str())
        .map(str::to_string);

    // The inputs on this machine must be the recorded ones before a byte is rebuilt.
    let want = text(&params["definition"]["sha256"], "definition digest")?;
    let have = sha256(&definition)?;
    if have != want {
        return Err(Mismatch(format!(
            "definition {} has sha256 {have}; the provenance {} records {want}",
            definition.display(),
            prov_path.display()
        ))
        .into());
    }
    let lock = crate::cli::common::lock_in_use(&a.lock);
    let have = sha256(&lock)?;
    if let Some(want) = recorded_lock.filter(|w| *w != have) {
        return Err(Mismatch(format!(
            "lock {} has sha256 {have}; the provenance records {want}: rebuild with the lock \
             the layer was baked from (--lock)",
            lock.display()
        ))
        .into());
    }

    let ddi = params["sysextDdi"] == true;
    let (_scratch, rebuilt) = rebuild(a, &definition, [&format, &arch, &version], epoch, ddi)?;
    let main = &rebuilt[0];

    // The rebuild's own provenance names what it shipped: kiln-firstboot and every
    // artifact must be the recorded ones.
    let mine: Value = serde_json::from_str(
        &std::fs::read_to_string(
            rebuilt
                .iter()
                .find(|p| file_name(p).ends_with(".provenance.json"))
                .unwrap_or(main),
        )
        .unwrap_or_default(),
    )
    .unwrap_or_default();
    for d in mine["predicate"]["buildDefinition"]["resolvedDependencies"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = d["name"].as_str().unwrap_or_default();
        let have = d["digest"]["sha256"].as_str().unwrap_or_default();
        if d["annotations"]["role"] == "lock" {
            continue; // checked above, before the rebuild
        }
        if let Some(want) = recorded(name).filter(|w| w != have) {
            return Err(Mismatch(format!(
                "{name}: sha256 {have} here; the provenance records {want}{}",
                if name == "kiln-firstboot" {
                    " (--firstboot names the one the layer shipped)"
                } else {
                    ""
                }
            ))
            .into());
        }
    }

    let diff = compare(&a.layer, main, 64 << 20)
        .with_context(|| format!("comparing {} with its rebuild", a.layer.display()))?;
    // Identical bytes have the rebuild's digest (its provenance computed it); a layer that
    // differs is hashed for the message only.
    let rebuilt_sha = mine["subject"][0]["digest"]["sha256"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let given = if diff == Difference::None {
        rebuilt_sha
    } else {
        sha256(&a.layer)?
    };
    if diff == Difference::None && given != recorded_layer {
        return Err(Mismatch(format!(
            "{} is identical to its rebuild, but {} records another subject (sha256 \
             {recorded_layer}, the layer is {given}): that provenance is not this layer's",
            a.layer.display(),
            prov_path.display()
        ))
        .into());
    }
    let subject_note = if given == recorded_layer {
        String::new()
    } else {
        format!(" (and it is not the provenance's subject either: sha256 {given}, recorded {recorded_layer})")
    };
    let emit = |event: &str, fields: Value| {
        if global.json {
            crate::cli::json::emit(event, crate::cli::json::Level::Info, fields);
        }
    };
    match diff {
        Difference::None => {
            emit(
                "identical",
                serde_json::json!({"layer": a.layer, "sha256": given, "provenance": prov_path}),
            );
            if !global.quiet && !global.json {
                println!(
                    "{}: identical to its rebuild from {} (sha256 {given})",
                    a.layer.display(),
                    prov_path.display()
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Difference::File { path, how } => Err(Mismatch(format!(
            "{} differs from its rebuild: first differing file {path}: {how}{subject_note}",
            a.layer.display()
        ))
        .into()),
        Difference::Bytes { offset } => Err(Mismatch(format!(
            "{} differs from its rebuild at byte {offset} (every file the same, or a format \
             whose files kiln does not read back){subject_note}",
            a.layer.display()
        ))
        .into()),
    }
}
