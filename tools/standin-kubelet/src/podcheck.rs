//! The boot tests' real pod: after its pretend TLS bootstrap the stand-in runs the command
//! named by `STANDIN_POD_CHECK` (the boot tests' `cri-smoke`, which speaks CRI to the
//! node's containerd), with kubelet's runtime endpoint and cgroup driver, and counts as
//! joined only when it succeeded. Std only: the program does the gRPC, this file only starts it.

use std::io::Write;
use std::process::{Command, Stdio};

/// The command line: `STANDIN_POD_CHECK`'s words (split on whitespace, no quoting), then
/// kubelet's endpoint and cgroup driver.
pub fn command_line(check: &str, endpoint: &str, driver: &str) -> Vec<String> {
    let mut words: Vec<String> = check.split_whitespace().map(str::to_string).collect();
    words.extend([
        "--endpoint".to_string(),
        endpoint.to_string(),
        "--cgroup-driver".to_string(),
        driver.to_string(),
    ]);
    words
}

/// Runs the check. Its stdout goes to the stand-in's (kubelet's journal); its stderr is
/// relayed there too, and its last line becomes part of the error, so what the runtime said
/// is in the line kiln-firstboot diagnoses from.
pub fn run(words: &[String]) -> Result<(), String> {
    let Some((program, args)) = words.split_first() else {
        return Err("STANDIN_POD_CHECK is empty".into());
    };
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let _ = std::io::stderr().write_all(stderr.as_bytes());
    if out.status.success() {
        return Ok(());
    }
    let last = stderr
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no error output)");
    Err(format!("{program} {}: {last}", out.status))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_appends_kubelets_settings() {
        assert_eq!(
            command_line(" /opt/x  --image a:1 ", "unix:///s", "systemd"),
            [
                "/opt/x",
                "--image",
                "a:1",
                "--endpoint",
                "unix:///s",
                "--cgroup-driver",
                "systemd"
            ]
        );
    }

    #[test]
    fn failures_name_the_program() {
        let e = run(&["/nonexistent/cri-smoke".to_string()]).unwrap_err();
        assert!(e.contains("/nonexistent/cri-smoke"), "{e}");
        assert!(run(&[]).is_err());
        #[cfg(unix)]
        {
            let e = run(&["false".to_string()]).unwrap_err();
            assert!(e.contains("false exit status: 1: (no error output)"), "{e}");
            let sh = |script: &str| ["sh", "-c", script].map(str::to_string).to_vec();
            let e = run(&sh(
                "echo first >&2; echo 'the runtime said no' >&2; exit 3",
            ))
            .unwrap_err();
            assert!(e.ends_with("exit status: 3: the runtime said no"), "{e}");
            assert!(run(&["true".to_string()]).is_ok());
        }
    }
}
