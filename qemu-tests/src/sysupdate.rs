//! A patch update on a booted Flatcar-style node: the node's systemd-sysupdate, driven by the
//! transfer file and drop-in `kiln render --sysext` placed through Ignition, fetches the next
//! patch release of the extension from an update mirror, moves `/etc/extensions/<name>.raw`
//! to it and asks for a reboot (`/run/reboot-required`).
//!
//! - **The tools.** The guest's own: the trixie base carries systemd 257's systemd-sysupdate
//!   and systemd-pull (package systemd-container) with the stock
//!   `systemd-sysupdate.service`/`.timer`, as a stock Flatcar ships them, and libcurl for
//!   systemd-pull.
//! - **The mirror.** A loopback HTTP server holding the definition's update directory:
//!   `SHA256SUMS` and three images, the baked one, the next patch release and the next minor.
//!   The fixture has one kubelet version, so the two newer images are the baked bytes under
//!   the newer names: systemd-sysupdate chooses by the version in the name (its
//!   `MatchPattern`), which is what the test is about. The guest reaches the server at
//!   [`crate::vm::MIRROR_ADDR`] through a QEMU forward, the only address it can reach.

use std::path::Path;
use std::process::Command;

use crate::{io_err, run, Error, Result};

/// The update URL the boot tests' Flatcar definition names (`update_url`, rewritten by
/// [`crate::scenario::fixture_image_def`]): the mirror behind the guest's forward.
pub const UPDATE_URL: &str = "http://169.254.169.80/kiln/flatcar/";

/// Where the mirror serves the update directory.
const DIR: &str = "/kiln/flatcar/";

/// The images the mirror holds, by file name.
#[derive(Debug, Clone)]
pub struct Mirror {
    /// The loopback port.
    pub port: u16,
    /// The baked image (what Ignition placed).
    pub current: String,
    /// The next patch release of the same minor: what sysupdate must pick.
    pub next_patch: String,
    /// The next minor: what sysupdate must never pick (the version-skew policy).
    pub next_minor: String,
}

/// `kubernetes-v1.36.1-standin-x86-64.raw` → the same with the version changed by `bump`
/// (major, minor, patch → new minor, patch).
fn renamed(name: &str, bump: impl Fn(u32, u32) -> (u32, u32)) -> Result<String> {
    let bad = || Error::Command {
        command: "sysupdate mirror".into(),
        detail: format!("expected NAME-vMAJOR.MINOR.PATCH[-SUFFIX]-ARCH.raw, found {name}"),
    };
    let at = name.find("-v").ok_or_else(bad)?;
    let (prefix, rest) = name.split_at(at + 2);
    let mut parts = rest.splitn(3, '.');
    let major = parts.next().ok_or_else(bad)?;
    let minor: u32 = parts.next().and_then(|m| m.parse().ok()).ok_or_else(bad)?;
    let tail = parts.next().ok_or_else(bad)?;
    let digits = tail.chars().take_while(char::is_ascii_digit).count();
    let patch: u32 = tail[..digits].parse().map_err(|_| bad())?;
    let (m, p) = bump(minor, patch);
    Ok(format!("{prefix}{major}.{m}.{p}{}", &tail[digits..]))
}

fn sha256(path: &Path) -> Result<String> {
    let o = run(Command::new("sha256sum").arg(path))?;
    Ok(String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

/// Starts the mirror for the baked sysext `raw`.
pub fn start_mirror(raw: &Path) -> Result<Mirror> {
    let current = raw
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let next_patch = renamed(&current, |m, p| (m, p + 1))?;
    let next_minor = renamed(&current, |m, _| (m + 1, 0))?;
    let bytes = std::fs::read(raw).map_err(io_err(raw))?;
    let sum = sha256(raw)?;
    let names = [&current, &next_patch, &next_minor];
    let sums: String = names.iter().map(|n| format!("{sum}  {n}\n")).collect();
    let mut files = vec![(format!("{DIR}SHA256SUMS"), sums.into_bytes())];
    for n in names {
        files.push((format!("{DIR}{n}"), bytes.clone()));
    }
    let port = crate::serve::serve_files(files)?;
    Ok(Mirror {
        port,
        current,
        next_patch,
        next_minor,
    })
}

/// The after-join steps (see [`crate::after_join`]): where the extension link points, the
/// stock `systemd-sysupdate.service` started as its timer would start it, then the link, the
/// installed images and `/run/reboot-required`.
pub fn after_join_script() -> String {
    format!(
        "{}{}",
        crate::after_join::PRELUDE,
        r#"step sysupdate-before link=$(readlink -f /etc/extensions/kubernetes.raw)
if timeout 600 systemctl start systemd-sysupdate.service; then
  step sysupdate result=ran
else
  step sysupdate result=failed
  journalctl -b -u systemd-sysupdate.service --no-pager -o cat >/run/kiln-test-sysupdate.log 2>&1
  show sysupdate-journal /run/kiln-test-sysupdate.log
fi
step sysupdate-after link=$(readlink -f /etc/extensions/kubernetes.raw)
step sysupdate-installed files=$(ls /opt/extensions/kubernetes | sort | paste -sd, -)
if [ -e /run/reboot-required ]; then step reboot-required present=yes; else step reboot-required present=no; fi
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_bump_the_version_and_keep_the_rest() {
        let n = "kubernetes-v1.36.1-standin-x86-64.raw";
        assert_eq!(
            renamed(n, |m, p| (m, p + 1)).unwrap(),
            "kubernetes-v1.36.2-standin-x86-64.raw"
        );
        assert_eq!(
            renamed(n, |m, _| (m + 1, 0)).unwrap(),
            "kubernetes-v1.37.0-standin-x86-64.raw"
        );
        assert_eq!(
            renamed("kubernetes-v1.36.9-x86-64.raw", |m, p| (m, p + 1)).unwrap(),
            "kubernetes-v1.36.10-x86-64.raw"
        );
        assert!(renamed("kubernetes.raw", |m, p| (m, p)).is_err());
    }
}
