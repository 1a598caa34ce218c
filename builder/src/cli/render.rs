//! `kiln render`: node.toml → provisioner user data (or a file tree), with a size report;
//! `kiln render --check` reads user data back and lists the `/etc/kiln/` files it writes.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context};
use serde_json::json;

use crate::render::{
    self, files, limits, Checked, NodeConfig, NodeFile, Provisioner, RenderOptions,
};

use crate::cli::common::{exit, Global};

/// Provisioner names on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProvisionerArg {
    /// `#cloud-config` that only writes files (write_files; runs nothing).
    #[value(name = "cloud-init")]
    CloudInit,
    /// Ignition JSON (spec 3.4.0, see --ignition-spec) with data: URLs.
    Ignition,
    /// PowerShell user data for cloudbase-init / EC2Launch.
    Windows,
    /// The raw `etc/kiln/` tree, written under `--output DIR`.
    Files,
}

impl From<ProvisionerArg> for Provisioner {
    fn from(p: ProvisionerArg) -> Provisioner {
        match p {
            ProvisionerArg::CloudInit => Provisioner::CloudInit,
            ProvisionerArg::Ignition => Provisioner::Ignition,
            ProvisionerArg::Windows => Provisioner::Windows,
            ProvisionerArg::Files => Provisioner::Files,
        }
    }
}

/// Arguments of `kiln render`.
#[derive(Debug, clap::Args)]
#[command(after_help = "Examples:
  kiln render --provisioner cloud-init node.toml > user-data
  kiln render --provisioner ignition --gzip node.toml -o node.ign
  kiln render -p ignition node.toml --sysext out/kubernetes-v1.36.4-x86-64.raw -o node.ign
  kiln render --provisioner files node.toml -o rootfs/
  kiln render --check user-data")]
pub struct RenderArgs {
    /// The node config to render (see docs/render.md for its keys).
    #[arg(value_name = "NODE_TOML", required_unless_present = "check")]
    pub node: Option<PathBuf>,
    /// The provisioner format to write.
    #[arg(long, short = 'p', value_enum, required_unless_present = "check")]
    pub provisioner: Option<ProvisionerArg>,
    /// Where to write: a file for user data (mode 0600, written atomically; default stdout),
    /// a directory for `files`.
    #[arg(long, short = 'o', value_name = "PATH")]
    pub output: Option<PathBuf>,
    /// Compress: the whole user data (cloud-init, windows/cloudbase-init) or each file (ignition).
    #[arg(long)]
    pub gzip: bool,
    /// Ignition config spec version: 3.4.0 (Ignition 2.15+) or 3.3.0 (Ignition 2.11 to 2.14).
    #[arg(long, value_name = "VERSION", default_value = "3.4.0", value_parser = ["3.4.0", "3.3.0"])]
    pub ignition_spec: String,
    /// Ignition only: also place this baked Flatcar sysext (the `.raw` `kiln bake --format
    /// sysext` wrote, its `<name>.conf` beside it): fetched at first boot into
    /// /opt/extensions/ and checked against its sha512, linked into /etc/extensions/, updated
    /// by systemd-sysupdate within its Kubernetes minor.
    #[arg(long, value_name = "RAW")]
    pub sysext: Option<PathBuf>,
    /// Where nodes fetch the --sysext image (default: the transfer file's update URL plus the
    /// file name).
    #[arg(long, value_name = "URL", requires = "sysext")]
    pub sysext_url: Option<String>,
    /// Read user data (a file, `-` for stdin, or a `files` directory) back and list the
    /// /etc/kiln/ files it would write; fails if they break the node contract.
    #[arg(long, value_name = "FILE|DIR", conflicts_with_all = ["node", "provisioner", "output", "gzip", "sysext"])]
    pub check: Option<PathBuf>,
}

/// A command line clap accepts but that asks for something impossible: exit 2, like clap's.
fn usage(why: &str) -> anyhow::Result<ExitCode> {
    Ok(crate::cli::fail::ended(
        &anyhow::anyhow!("{why}"),
        exit::USAGE,
    ))
}

/// Runs `kiln render`.
pub fn run(args: RenderArgs, global: &Global) -> anyhow::Result<ExitCode> {
    if let Some(path) = &args.check {
        // A contract break found while reading the user data exits 3, like one found after.
        return crate::cli::common::done(check(path, global));
    }
    let (Some(node_path), Some(provisioner)) = (&args.node, args.provisioner) else {
        return usage("kiln render needs NODE_TOML and --provisioner (or --check FILE)");
    };
    let provisioner = Provisioner::from(provisioner);
    let node = NodeConfig::load(node_path)?;
    let node_files = node.files();

    if provisioner == Provisioner::Files {
        let Some(root) = &args.output else {
            return usage("--provisioner files writes a directory tree: give it with --output DIR");
        };
        if args.gzip {
            return usage("--gzip has no meaning for --provisioner files (it writes plain files)");
        }
        let dir = files::write_tree(root, &node_files)?;
        if !global.quiet {
            report_files(
                &mut std::io::stdout(),
                &node_files,
                global.json,
                &dir.display().to_string(),
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }

    let ignition_spec = match args.ignition_spec.as_str() {
        "3.3.0" => render::ignition::Spec::V3_3,
        _ => render::ignition::Spec::V3_4,
    };
    let sysext = match &args.sysext {
        Some(_) if provisioner != Provisioner::Ignition => {
            return usage(
                "--sysext places a Flatcar extension through Ignition: use --provisioner ignition",
            );
        }
        Some(raw) => Some(render::sysext::Sysext::from_bake(
            raw,
            args.sysext_url.as_deref(),
        )?),
        None => None,
    };
    let options = RenderOptions {
        gzip: args.gzip,
        ignition_spec,
        sysext: sysext.as_ref(),
    };
    let payload = render::render_payload(&node_files, provisioner, options)?;
    match &args.output {
        Some(path) if path.as_os_str() != "-" => {
            render::write_atomic(path, &payload, render::SECRET_MODE)?;
        }
        _ => {
            // stdout is the user data: `--json` events go to stderr.
            crate::cli::json::events_to_stderr();
            let mut out = std::io::stdout().lock();
            if args.gzip && out.is_terminal() {
                bail!("refusing to write gzip data to a terminal: redirect stdout or use --output FILE");
            }
            out.write_all(&payload)
                .context("writing user data to stdout")?;
            out.flush().context("writing user data to stdout")?;
        }
    }
    if !global.quiet {
        // The report may use stdout only when the payload went to a file.
        let report_to_stdout = args.output.as_ref().is_some_and(|p| p.as_os_str() != "-");
        let gzipped_len = (!args.gzip && provisioner.accepts_gzip())
            .then(|| {
                render::render_payload(
                    &node_files,
                    provisioner,
                    RenderOptions {
                        gzip: true,
                        ..options
                    },
                )
            })
            .transpose()?
            .map(|p| p.len());
        let mut report = Vec::new();
        report_payload(
            &mut report,
            provisioner,
            &node_files,
            payload.len(),
            gzipped_len,
            args.gzip,
            global.json,
        )?;
        if report_to_stdout {
            std::io::stdout().write_all(&report)?;
        } else {
            std::io::stderr().write_all(&report)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn report_files(
    out: &mut dyn Write,
    node_files: &[NodeFile],
    json: bool,
    dir: &str,
) -> anyhow::Result<()> {
    if json {
        for f in node_files {
            writeln!(
                out,
                "{}",
                crate::cli::json::line("file", crate::cli::json::Level::Info, file_json(f))
            )?;
        }
    } else {
        writeln!(
            out,
            "kiln render: wrote {} files under {dir}",
            node_files.len()
        )?;
        write_file_table(out, node_files, Provisioner::Files)?;
    }
    Ok(())
}

fn report_payload(
    out: &mut dyn Write,
    provisioner: Provisioner,
    node_files: &[NodeFile],
    len: usize,
    gzipped_len: Option<usize>,
    gzipped: bool,
    json: bool,
) -> anyhow::Result<()> {
    let lines = limits::report(len);
    if json {
        let limits: Vec<_> = lines
            .iter()
            .map(|l| {
                json!({"platform": l.limit.platform, "field": l.limit.field, "limit": l.limit.bytes,
                       "counted": format!("{:?}", l.limit.counted).to_lowercase(), "size": l.size, "fits": l.fits})
            })
            .collect();
        let report = json!({
            "provisioner": provisioner.name(), "bytes": len, "gzip": gzipped,
            "gzip_bytes": gzipped_len, "files": node_files.iter().map(file_json).collect::<Vec<_>>(),
            "limits": limits,
        });
        writeln!(
            out,
            "{}",
            crate::cli::json::line("rendered", crate::cli::json::Level::Info, report)
        )?;
        return Ok(());
    }
    writeln!(
        out,
        "kiln render: {} user data, {len} bytes{}, {} files",
        provisioner.name(),
        if gzipped { " (gzip)" } else { "" },
        node_files.len()
    )?;
    write_file_table(out, node_files, provisioner)?;
    writeln!(
        out,
        "  {:<10} {:<32} {:>8} {:>8}  fits",
        "platform", "limit", "bytes", "size"
    )?;
    for l in &lines {
        let counted = match l.limit.counted {
            limits::Counted::Raw => "raw",
            limits::Counted::Base64 => "base64",
        };
        writeln!(
            out,
            "  {:<10} {:<32} {:>8} {:>8}  {} ({}%)",
            l.limit.platform,
            format!("{} ({counted})", l.limit.field),
            l.limit.bytes,
            l.size,
            if l.fits { "yes" } else { "NO" },
            l.size * 100 / l.limit.bytes
        )?;
    }
    if let Some(z) = gzipped_len {
        if lines.iter().any(|l| !l.fits) {
            writeln!(out, "  hint: --gzip makes it {z} bytes")?;
        }
    }
    Ok(())
}

fn file_json(f: &NodeFile) -> serde_json::Value {
    json!({"path": f.linux_path(), "mode": format!("{:04o}", f.mode), "size": f.contents.len(), "sha256": f.sha256()})
}

fn write_file_table(
    out: &mut dyn Write,
    node_files: &[NodeFile],
    provisioner: Provisioner,
) -> std::io::Result<()> {
    let path = |f: &NodeFile| {
        if provisioner == Provisioner::Windows {
            f.windows_path()
        } else {
            f.linux_path()
        }
    };
    // Paths padded to the longest (at least 36), so a registry's files line up too.
    let width = node_files
        .iter()
        .map(|f| path(f).len())
        .max()
        .unwrap_or(0)
        .max(36);
    for f in node_files {
        writeln!(
            out,
            "  {:<width$} {:04o} {:>6}  sha256:{}",
            path(f),
            f.mode,
            f.contents.len(),
            f.sha256()
        )?;
    }
    Ok(())
}

fn check(path: &Path, global: &Global) -> anyhow::Result<ExitCode> {
    let name = path.display().to_string();
    let checked = if path.as_os_str() == "-" {
        let mut data = Vec::new();
        std::io::stdin()
            .read_to_end(&mut data)
            .context("reading user data from stdin")?;
        render::check_payload(&data, "stdin")?
    } else if path.is_dir() {
        Checked {
            provisioner: Provisioner::Files,
            gzipped: false,
            files: files::read_tree(path)?,
            notes: Vec::new(),
        }
    } else {
        // Regular files only, and no more than a gzipped payload may unpack to.
        let data = render::input::read_regular(path, render::MAX_GUNZIPPED)
            .with_context(|| format!("reading {name}"))?;
        render::check_payload(&data, &name)?
    };
    let problems = render::contract_problems(&checked.files);
    let mut out = std::io::stdout().lock();
    if global.json {
        for f in &checked.files {
            writeln!(
                out,
                "{}",
                crate::cli::json::line("file", crate::cli::json::Level::Info, file_json(f))
            )?;
        }
        writeln!(
            out,
            "{}",
            crate::cli::json::line(
                "checked",
                crate::cli::json::Level::Info,
                json!({"input": name, "provisioner": checked.provisioner.name(),
                       "gzip": checked.gzipped, "files": checked.files.len(),
                       "notes": checked.notes, "problems": problems}),
            )
        )?;
    } else if !global.quiet {
        writeln!(
            out,
            "{name}: {} user data{}, writes {} kiln contract files",
            checked.provisioner.name(),
            if checked.gzipped { " (gzip)" } else { "" },
            checked.files.len()
        )?;
        write_file_table(&mut out, &checked.files, checked.provisioner)?;
        for note in &checked.notes {
            writeln!(out, "  note: {note}")?;
        }
    }
    out.flush()?;
    if !problems.is_empty() {
        // A failed check, not a failure to run it: exit 3 like the other verifications.
        return Ok(crate::cli::fail::ended(
            &anyhow::anyhow!(
                "{name} breaks node contract v1:\n  {}",
                problems.join("\n  ")
            ),
            exit::VERIFY,
        ));
    }
    Ok(ExitCode::SUCCESS)
}
