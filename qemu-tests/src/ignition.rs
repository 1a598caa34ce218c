//! The Flatcar way of adding kiln to a node: `kiln render -p ignition --sysext` and Debian's
//! real Ignition (2.14; what Flatcar's initramfs runs is the same engine) running its
//! `fetch-offline` and `files` stages on the guest's root before the disk is made, fetching
//! the baked sysext from a loopback HTTP server. The initramfs does this on a Flatcar node
//! with `/sysroot`; here the root is the guest's directory on the host.

use std::path::Path;
use std::process::Command;

use crate::guest::Root;
use crate::scenario::Tools;
use crate::{io_err, run, Error, Result};

/// Debian's Ignition binary (package `ignition`, installed by `scripts/deps.sh`).
pub const IGNITION: &str = "/usr/lib/dracut/modules.d/30ignition/ignition";

use crate::serve;

/// Renders the Ignition config for `node_toml` with the baked sysext `raw` and runs real
/// Ignition on `root`: the /etc/kiln files, the image fetched into `/opt/extensions/` and
/// verified, the `/etc/extensions/` link, the sysupdate transfer file and units.
pub fn place(tools: &Tools, node_toml: &Path, raw: &Path, root: &Root, work: &Path) -> Result<()> {
    let bytes = std::fs::read(raw).map_err(io_err(raw))?;
    let port = serve::serve_bytes(bytes)?;
    let name = raw
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    std::fs::create_dir_all(work).map_err(io_err(work))?;
    let config = work.join("node.ign");
    run(Command::new(&tools.kiln)
        .args([
            "--quiet",
            "render",
            "-p",
            "ignition",
            "--ignition-spec",
            "3.3.0",
        ])
        .arg(node_toml)
        .arg("--sysext")
        .arg(raw)
        .arg("--sysext-url")
        .arg(format!("http://127.0.0.1:{port}/kiln/flatcar/{name}"))
        .arg("-o")
        .arg(&config))?;
    // Debian builds Ignition with SELinux relabelling on: a no-op `setfiles` on PATH and a
    // config that says SELinux is disabled (removed again: the guest has no SELinux).
    let bin = work.join("bin");
    std::fs::create_dir_all(&bin).map_err(io_err(&bin))?;
    let setfiles = bin.join("setfiles");
    std::fs::write(&setfiles, "#!/bin/sh\ncat >/dev/null\n").map_err(io_err(&setfiles))?;
    std::fs::set_permissions(
        &setfiles,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .map_err(io_err(&setfiles))?;
    let selinux = root.dir.join("etc/selinux");
    let had_selinux = selinux.exists();
    std::fs::create_dir_all(&selinux).map_err(io_err(&selinux))?;
    let selinux_config = selinux.join("config");
    std::fs::write(&selinux_config, "SELINUX=disabled\nSELINUXTYPE=targeted\n")
        .map_err(io_err(&selinux_config))?;
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for stage in ["fetch-offline", "files"] {
        let out = Command::new(IGNITION)
            .env("IGNITION_CONFIG_FILE", &config)
            .env("PATH", &path)
            .args(["-platform", "file", "-log-to-stdout", "-stage", stage])
            .arg("-root")
            .arg(&root.dir)
            .arg("-config-cache")
            .arg(work.join("ignition.json"))
            .arg("-state-file")
            .arg(work.join("state"))
            .arg("-neednet")
            .arg(work.join("neednet"))
            .output()
            .map_err(|e| Error::Missing {
                what: format!("Ignition at {IGNITION}"),
                hint: format!("{e}; `scripts/deps.sh` installs Debian's ignition package"),
            })?;
        if !out.status.success() {
            let log = String::from_utf8_lossy(&out.stdout);
            let tail: Vec<&str> = log.lines().rev().take(15).collect();
            return Err(Error::Command {
                command: format!("ignition -stage {stage} -root {}", root.dir.display()),
                detail: format!(
                    "{}; last lines:\n{}",
                    out.status,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ),
            });
        }
    }
    if had_selinux {
        let _ = std::fs::remove_file(&selinux_config);
    } else {
        let _ = std::fs::remove_dir_all(&selinux);
    }
    Ok(())
}
