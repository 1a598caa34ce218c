//! Checks that need a real tool or a privilege either run or fail.
//!
//! A test that cannot do its real check here (no loop devices, no mount namespace, a tool
//! missing) calls [`cannot_run`]. Unless the check's name is listed in `KILN_TEST_OPT_OUT`
//! (comma-separated), the test fails with the reason; when it is listed, the test records
//! the check in `target/opted-out-checks.log` and returns, and `make test` prints that
//! file at its end. CI never sets the variable, so in CI every such check runs or fails.
//!
//! This file is included by path (`#[path = …] mod optout;`) into the test suites of
//! several crates: kiln-firstboot may not take even a dev-dependency.

#![allow(dead_code)]

use std::io::Write;
use std::path::PathBuf;

/// The variable that names the checks a developer knowingly opts out of.
pub const VAR: &str = "KILN_TEST_OPT_OUT";

/// Where opted-out checks are recorded (`KILN_OPT_OUT_LOG` overrides it).
pub fn log_path() -> PathBuf {
    std::env::var_os("KILN_OPT_OUT_LOG")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            // Every crate that includes this file sits one level below the workspace root.
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/opted-out-checks.log")
        })
}

/// Whether `check` is listed in `KILN_TEST_OPT_OUT`.
pub fn is_opted_out(check: &str) -> bool {
    std::env::var(VAR)
        .map(|v| v.split(',').any(|c| c.trim() == check))
        .unwrap_or(false)
}

/// The environment cannot run `check` because `why`. Panics (the test fails) unless the
/// check is opted out; then records it and returns, and the caller returns too.
#[track_caller]
pub fn cannot_run(check: &str, why: &str) {
    let caller = std::panic::Location::caller();
    if !is_opted_out(check) {
        panic!(
            "check `{check}` cannot run here: {why}\n\
             Fix the environment (`make deps` installs the tools), or set {VAR}={check} to \
             skip it knowingly; `make test` then lists it at its end."
        );
    }
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let line = format!(
        "{check}\t{}:{}\t{test}\t{}\n",
        caller.file(),
        caller.line(),
        why.replace(['\n', '\t'], " ")
    );
    eprintln!("OPTED OUT ({VAR}={check}): {test}: {why}");
    let path = log_path();
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    // One write of one short line with O_APPEND: lines of parallel tests never interleave.
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .unwrap_or_else(|e| {
            panic!(
                "cannot record the opted-out check in {}: {e}",
                path.display()
            )
        });
    f.write_all(line.as_bytes()).unwrap_or_else(|e| {
        panic!(
            "cannot record the opted-out check in {}: {e}",
            path.display()
        )
    });
}

/// Why this machine cannot make a private mount namespace and mount in it (`None` when it
/// can): probed with a tmpfs mount, so that a later failure of the real check is the real
/// tool's failure, not the environment's refusal.
#[cfg(unix)]
pub fn mount_namespace_unavailable() -> Option<String> {
    let dir = std::env::temp_dir().join(format!("kiln-ns-probe-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let out = std::process::Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            "mount",
            "-t",
            "tmpfs",
            "kiln-probe",
        ])
        .arg(&dir)
        .output();
    let _ = std::fs::remove_dir(&dir);
    match out {
        Err(e) => Some(format!("unshare(1) cannot be started: {e}")),
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`unshare -m` + mount is refused here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
    }
}
