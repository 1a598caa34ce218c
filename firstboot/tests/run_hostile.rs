//! A hostile node, against the real binary (issue 34): programs that leave processes holding
//! their output pipes, or ignore SIGTERM, must not hold the run past its deadline; a
//! `/run/kiln` or `/run/cluster-api` that is a symlink must not redirect a write out of
//! `--root`; a metadata hostname that is no DNS name must not reach kubelet.env.

// The stand-ins are /bin/sh scripts and the checks use Unix process groups and symlinks.
#![cfg(unix)]

use crate::common;

use std::fs;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// How long past its deadline a run may take before this file calls it hung: the doctor's
/// checks after a failure and the diagnosis's reads are bounded, a wait for a pipe that a
/// 300 s `sleep` holds is not.
const PAST_DEADLINE: Duration = Duration::from_secs(5);

/// Runs firstboot `run --root ROOT ARGS…` with its output in files, killing it (and saying
/// so) when it is still running `bound` after the start, so a hang fails the test instead
/// of stalling the suite.
fn run_watched(root: &Root, args: &[&str], bound: Duration) -> (Outcome, bool) {
    let out_path = root.path("firstboot.stdout");
    let err_path = root.path("firstboot.stderr");
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"))
        .arg("run")
        .arg("--root")
        .arg(&root.dir)
        .arg("--console")
        .arg(root.path("console.log"))
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(fs::File::create(&out_path).unwrap())
        .stderr(fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("run kiln-firstboot");
    let mut hung = false;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if started.elapsed() > bound {
            hung = true;
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let outcome = Outcome {
        code: status.code().unwrap_or(-1),
        stdout: fs::read_to_string(&out_path).unwrap_or_default(),
        stderr: fs::read_to_string(&err_path).unwrap_or_default(),
        elapsed: started.elapsed(),
    };
    (outcome, hung)
}

/// A stand-in that leaves `sleep 300` behind holding its stdout and stderr, its pid noted
/// in `<name>.pids`, then runs `rest`.
fn leaves_a_sleeper(root: &Root, name: &str, rest: &str) -> String {
    let pids = root.path(&format!("stubs/{name}.pids"));
    root.stub(
        name,
        &format!("sleep 300 &\necho $! >> '{}'\n{rest}", pids.display()),
    )
}

/// The pids a stand-in noted.
fn sleepers(root: &Root, name: &str) -> Vec<String> {
    fs::read_to_string(root.path(&format!("stubs/{name}.pids")))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Whether `pid` still runs: a zombie (killed, not yet reaped by whoever inherited it) does
/// not.
fn alive(pid: &str) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat.rsplit_once(") ").map_or("", |(_, rest)| rest);
    !state.starts_with('Z') && !state.starts_with('X')
}

/// Kills whatever the stand-ins left behind, so no test leaves a `sleep 300`.
fn reap(root: &Root, names: &[&str]) {
    for name in names {
        for pid in sleepers(root, name) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A loopback URL nothing listens on: kubelet never becomes healthy.
fn refused_url() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    format!("http://{}/healthz", l.local_addr().unwrap())
}

#[test]
fn a_service_manager_that_leaves_a_process_holding_its_output_does_not_hold_the_run() {
    // The case: every systemctl and journalctl call exits at once but leaves
    // `sleep 300` with the output pipes; kubelet never becomes healthy, so the run waits to
    // its deadline and then diagnoses (more systemctl and journalctl calls).
    let root = Root::node("");
    root.node_env("NODE_NAME=node-1\nNODE_IP=127.0.0.1\n");
    let systemctl = leaves_a_sleeper(&root, "systemctl", "exit 0");
    let journalctl = leaves_a_sleeper(&root, "journalctl", "echo kubelet said nothing");
    let healthz = refused_url();
    let deadline = 8;
    let (out, hung) = run_watched(
        &root,
        &[
            "--provider",
            "none",
            "--systemctl",
            &systemctl,
            "--journalctl",
            &journalctl,
            "--healthz-url",
            &healthz,
            "--deadline",
            &deadline.to_string(),
        ],
        Duration::from_secs(deadline) + PAST_DEADLINE + Duration::from_secs(20),
    );
    reap(&root, &["systemctl", "journalctl"]);
    assert!(
        !hung,
        "still running {:?} after the start: {out:#?}",
        out.elapsed
    );
    assert!(
        out.elapsed < Duration::from_secs(deadline) + PAST_DEADLINE,
        "ran {:?} with a {deadline} s deadline: {out:#?}",
        out.elapsed
    );
    assert!(
        !root.calls("systemctl").is_empty(),
        "the service manager was never asked"
    );
    // The run ended at its deadline in the wait for kubelet, and says so.
    assert_ne!(out.code, 0, "{out:#?}");
    assert!(
        out.stderr.contains("KUBELET_UNHEALTHY") || out.stderr.contains("JOIN_TIMEOUT"),
        "{}",
        out.stderr
    );
    let status = root.read("run/kiln/status.json");
    assert!(status.contains("\"result\":\"failure\""), "{status}");
}

#[test]
fn a_service_manager_that_ignores_sigterm_and_forks_is_killed_with_its_group_at_the_deadline() {
    let root = Root::node("");
    root.node_env("NODE_NAME=node-1\nNODE_IP=127.0.0.1\n");
    // Ignores SIGTERM, leaves a sleeper with the pipes and waits for it.
    let systemctl = leaves_a_sleeper(&root, "systemctl", "trap '' TERM\nwait");
    let deadline = 3;
    let (out, hung) = run_watched(
        &root,
        &[
            "--provider",
            "none",
            "--systemctl",
            &systemctl,
            "--healthz-url",
            &refused_url(),
            "--deadline",
            &deadline.to_string(),
        ],
        Duration::from_secs(deadline) + PAST_DEADLINE + Duration::from_secs(20),
    );
    let left: Vec<String> = sleepers(&root, "systemctl")
        .into_iter()
        .filter(|p| alive(p))
        .collect();
    reap(&root, &["systemctl"]);
    assert!(
        !hung,
        "still running {:?} after the start: {out:#?}",
        out.elapsed
    );
    assert!(
        out.elapsed < Duration::from_secs(deadline) + PAST_DEADLINE,
        "ran {:?} with a {deadline} s deadline: {out:#?}",
        out.elapsed
    );
    assert_eq!(out.code, 6, "{out:#?}");
    assert!(
        out.stderr.contains("START_FAILED")
            && out.stderr.contains("was still running at the deadline"),
        "{}",
        out.stderr
    );
    assert!(
        left.is_empty(),
        "the service manager's process group outlived the run: {left:?}"
    );
}

#[test]
fn a_wedged_service_manager_cannot_stretch_the_wait_or_the_diagnosis() {
    // `systemctl show` and `journalctl` hang (ignoring SIGTERM) with a sleeper holding their
    // pipes; starting kubelet works. The checks during the wait end at the deadline; the
    // diagnosis after it gives each of its four reads 2 s (was 5 s each, and the wait's
    // check could run 5 s past the deadline).
    let root = Root::node("");
    root.node_env("NODE_NAME=node-1\nNODE_IP=127.0.0.1\n");
    let wedged = "trap '' TERM\nwait";
    let systemctl = leaves_a_sleeper(
        &root,
        "systemctl",
        &format!("case \"$1\" in show) {wedged};; esac\nexit 0"),
    );
    let journalctl = leaves_a_sleeper(&root, "journalctl", wedged);
    let deadline = 4;
    let diagnosis = Duration::from_secs(4 * 2);
    let (out, hung) = run_watched(
        &root,
        &[
            "--provider",
            "none",
            "--systemctl",
            &systemctl,
            "--journalctl",
            &journalctl,
            "--healthz-url",
            &refused_url(),
            "--deadline",
            &deadline.to_string(),
        ],
        Duration::from_secs(deadline) + diagnosis + PAST_DEADLINE + Duration::from_secs(30),
    );
    reap(&root, &["systemctl", "journalctl"]);
    assert!(
        !hung,
        "still running {:?} after the start: {out:#?}",
        out.elapsed
    );
    assert!(
        out.elapsed < Duration::from_secs(deadline) + diagnosis + PAST_DEADLINE,
        "ran {:?} with a {deadline} s deadline: {out:#?}",
        out.elapsed
    );
    assert_eq!(out.code, 7, "{out:#?}");
    assert!(out.stderr.contains("JOIN_TIMEOUT"), "{}", out.stderr);
    assert!(
        out.stderr.contains("journalctl -u kubelet.service")
            && out.stderr.contains("was still running"),
        "the diagnosis says which read it gave up on: {}",
        out.stderr
    );
}

#[test]
fn run_dirs_symlinked_out_of_the_root_are_refused_and_nothing_is_written_there() {
    // `run/kiln` and `run` hold kubelet.env and the 0600 bootstrap kubeconfig: the write
    // phase fails. `run/cluster-api` is written only by a run that ends (here a service
    // manager that fails): its failure file is refused with a warning naming the link.
    for (link, code) in [("run/kiln", 5), ("run", 5), ("run/cluster-api", 6)] {
        let outside = Root::empty();
        let root = Root::node("");
        root.node_env("NODE_NAME=node-1\nNODE_IP=127.0.0.1\n");
        fs::create_dir_all(root.path("run/kiln")).unwrap();
        if link == "run" {
            fs::remove_dir_all(root.path("run")).unwrap();
        } else {
            fs::remove_dir_all(root.path(link)).ok();
        }
        std::os::unix::fs::symlink(&outside.dir, root.path(link)).unwrap();
        let systemctl = root.stub("systemctl", "exit 1");
        let (out, hung) = run_watched(
            &root,
            &[
                "--provider",
                "none",
                "--systemctl",
                &systemctl,
                "--healthz-url",
                &refused_url(),
                "--deadline",
                "10",
            ],
            Duration::from_secs(30),
        );
        assert!(!hung, "{link}: {out:#?}");
        let written = list(&outside.dir);
        assert!(
            written.is_empty(),
            "{link} -> {}: written outside the root: {written:?}\n{out:#?}",
            outside.dir.display()
        );
        assert_eq!(out.code, code, "{link}: {out:#?}");
        let named = format!("{} is a symbolic link", root.path(link).display());
        assert!(
            out.stderr.contains(&named),
            "{link}: expected the error to say {named:?}: {}",
            out.stderr
        );
    }
}

#[test]
fn no_write_or_removal_goes_through_a_linked_directory() {
    // The fsutil calls themselves, each way firstboot writes: atomic writes, removals, the
    // in-place update of the Azure KVP pool.
    use kiln_firstboot::fsutil::{open_in_place, real_dir, remove_file, write_atomic};
    use std::os::unix::fs::symlink;
    let (root, elsewhere) = (Root::empty(), Root::empty());
    let (d, outside) = (&root.dir, &elsewhere.dir);
    fs::write(outside.join("failure"), "theirs").unwrap();
    fs::create_dir_all(d.join("run")).unwrap();
    symlink(outside, d.join("run/kiln")).unwrap();
    let want = format!("{} is a symbolic link", d.join("run/kiln").display());
    for e in [
        write_atomic(&d.join("run/kiln/kubelet.env"), b"x", 0o600).unwrap_err(),
        write_atomic(&d.join("run/kiln/patches/p.json"), b"x", 0o644).unwrap_err(),
        remove_file(&d.join("run/kiln/failure")).unwrap_err(),
        open_in_place(&d.join("run/kiln/pool")).unwrap_err(),
    ] {
        assert!(e.to_string().starts_with(&want), "{e}");
    }
    let e = real_dir(&d.join("run/kiln"), true).unwrap_err();
    assert!(e.to_string().starts_with(&want), "{e}");
    assert_eq!(
        fs::read_to_string(outside.join("failure")).unwrap(),
        "theirs"
    );
    assert_eq!(fs::read_dir(outside).unwrap().count(), 1, "written outside");
    // Missing directories are made as real ones and used.
    fs::remove_file(d.join("run/kiln")).unwrap();
    write_atomic(&d.join("run/kiln/patches/p.json"), b"x", 0o644).unwrap();
    assert!(fs::symlink_metadata(d.join("run/kiln/patches"))
        .unwrap()
        .is_dir());
    remove_file(&d.join("run/kiln/patches/p.json")).unwrap();
    remove_file(&d.join("run/kiln/patches/p.json")).unwrap();
    remove_file(&d.join("absent/dir/f")).unwrap();
    // The in-place open refuses a link or a FIFO at the name, and opens a file.
    symlink(outside.join("failure"), d.join("run/kiln/pool")).unwrap();
    let e = open_in_place(&d.join("run/kiln/pool")).unwrap_err();
    assert!(e.to_string().contains("pool is a symbolic link"), "{e}");
    let fifo = d.join("run/kiln/fifo");
    let made = Command::new("mkfifo").arg(&fifo).status();
    assert!(made.unwrap().success(), "mkfifo {}", fifo.display());
    let e = open_in_place(&fifo).unwrap_err();
    assert!(e.to_string().ends_with("fifo is not a regular file"), "{e}");
    open_in_place(&d.join("run/kiln/new")).unwrap();
    assert!(d.join("run/kiln/new").is_file());
}

/// Every entry under `dir`, recursively.
fn list(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = fs::read_dir(dir) {
        for e in rd.flatten() {
            out.push(e.path().display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                out.extend(list(&e.path()));
            }
        }
    }
    out
}

#[test]
fn a_metadata_hostname_that_is_no_dns_name_is_refused_before_kubelet_env() {
    let base = fixtures().join("aws");
    for (hostname, why) in [
        ("ip_10_0_3_7.ec2.internal", "another character at offset 2"),
        ("ip-10-0-3-7..internal", "an empty label at offset 12"),
        ("-ip-10-0-3-7", "starts or ends with '-' at offset 0"),
    ] {
        let root = Root::node("");
        let base = base.clone();
        let srv = Server::start(move |r| match r.route() {
            "/latest/api/token" => ok("TOKEN-abc"),
            "/latest/meta-data/local-hostname" => ok(hostname),
            _ => fixture_reply(&base, &[], r),
        });
        let systemctl = root.stub("systemctl", "exit 0");
        let out = firstboot(
            &root,
            &[
                "--provider",
                "aws",
                "--metadata-url",
                &srv.url,
                "--systemctl",
                &systemctl,
                "--deadline",
                "10",
            ],
        );
        assert_eq!(out.code, 4, "{hostname}: {out:#?}");
        assert!(
            out.stderr.contains("METADATA_INVALID")
                && out.stderr.contains("hostname as the node name")
                && out.stderr.contains(why)
                && out.stderr.contains("set NODE_NAME"),
            "{hostname}: {}",
            out.stderr
        );
        assert!(!root.exists("run/kiln/kubelet.env"), "{hostname}");
        assert!(root.calls("systemctl").is_empty(), "{hostname}");
    }
    // Upper case is what kubelet lowercases, not an error.
    let root = Root::node("");
    let srv = Server::start(move |r| match r.route() {
        "/latest/api/token" => ok("TOKEN-abc"),
        "/latest/meta-data/local-hostname" => ok("IP-10-0-3-7.EC2.Internal"),
        _ => fixture_reply(&base, &[], r),
    });
    let out = firstboot(
        &root,
        &[
            "--provider",
            "aws",
            "--metadata-url",
            &srv.url,
            "--no-start",
        ],
    );
    assert_eq!(out.code, 0, "{out:#?}");
    assert!(
        root.read("run/kiln/kubelet.env")
            .contains("NODE_NAME=ip-10-0-3-7.ec2.internal\n"),
        "{}",
        root.read("run/kiln/kubelet.env")
    );
}
