//! The outside tools the DDI tests check kiln's bytes with (cryptsetup, gdisk, fdisk,
//! OpenSSL). A missing tool fails the test and names the script that installs it.

use std::path::PathBuf;
use std::process::Command;

/// The path of `name`, found in `PATH` or the sbin directories; panics naming the Debian
/// package and `scripts/deps.sh` when it is missing.
pub(crate) fn tool(name: &str, package: &str) -> PathBuf {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs = path.split(':').chain(["/usr/sbin", "/sbin"]);
    for dir in dirs.filter(|d| !d.is_empty()) {
        let candidate = PathBuf::from(dir).join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("{name} not found: run scripts/deps.sh, which installs Debian's {package}")
}

/// Runs `program` with `args`; its stdout on success, stdout and stderr on failure.
pub(crate) fn run(program: &PathBuf, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(stdout)
    } else {
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(format!(
            "{} {args:?}: {}\n{stdout}{stderr}",
            program.display(),
            out.status
        ))
    }
}
