//! Debian's containerd started for a test: a config file the test wrote, its own socket, a
//! log file; ready when the socket exists and containerd logged `containerd successfully
//! booted` (the socket comes before the plugins: a loaded machine found the CRI service not
//! registered yet). Included by path into the test suites that need it.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Starts `containerd --config CONFIG` with `env` added, its output in `log`, and waits up to
/// 60 s for `sock` and the booted line; panics (the test fails) with the log otherwise.
pub fn start(config: &Path, sock: &Path, log: &Path, env: &[(&str, String)]) -> Child {
    let out = std::fs::File::create(log).unwrap();
    let child = Command::new("containerd")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg("--config")
        .arg(config)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start containerd");
    let until = Instant::now() + Duration::from_secs(60);
    let booted =
        || std::fs::read_to_string(log).is_ok_and(|l| l.contains("containerd successfully booted"));
    while !(sock.exists() && booted()) {
        assert!(
            Instant::now() < until,
            "containerd did not boot: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child
}
