//! Messages a user reads and the exit codes of refused command lines (issue 23's list): no
//! Rust `Debug` text, no repeated cause, a URL named once per line, no temporary path, and
//! exit 2 for a command line that cannot work.

use crate::support;

use std::path::Path;

use support::*;

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn render_files_without_output_and_lock_add_without_evidence_are_usage_errors() {
    let d = tempfile::tempdir().unwrap();
    let node = repo().join("docs/examples/render/node.toml");
    let o = run(kiln().args(["render", "-p", "files"]).arg(&node));
    assert_eq!(o.status.code(), Some(2), "{}", out_text(&o));
    assert!(out_text(&o).contains("--output DIR"), "{}", out_text(&o));
    let o = run(kiln()
        .args(["render", "-p", "files", "--gzip", "-o"])
        .arg(d.path().join("t"))
        .arg(&node));
    assert_eq!(o.status.code(), Some(2), "{}", out_text(&o));
    let o = run(kiln().args(["render", "-p", "cloud-init"]));
    assert_eq!(o.status.code(), Some(2), "{}", out_text(&o));

    // No checksum, no --sha256, no --verified: refused by the parser, before any download
    // (the URL is a closed loopback port, so a download attempt would also fail, differently).
    let o = run(kiln()
        .arg("lock")
        .arg("add")
        .arg(d.path().join("new.lock"))
        .args(["--name", "crictl", "--version", "1.36.0", "--os", "linux"])
        .args(["--arch", "amd64", "--format", "binary"])
        .args([
            "--url",
            "http://127.0.0.1:9/crictl",
            "--member",
            "crictl=crictl",
        ]));
    assert_eq!(o.status.code(), Some(2), "{}", out_text(&o));
    let text = out_text(&o);
    assert!(
        text.contains("--checksum-url") && text.contains("--sha256") && text.contains("--verified"),
        "{text}"
    );
    assert!(!d.path().join("new.lock").exists());
}

#[test]
fn a_format_the_definition_lacks_is_named_in_words() {
    let d = tempfile::tempdir().unwrap();
    let o = run(kiln()
        .current_dir(repo())
        .arg("bake")
        .arg("images/flatcar.toml")
        .args(["--format", "windows", "--store"])
        .arg(d.path())
        .arg("--out")
        .arg(d.path().join("out")));
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(1), "{text}");
    assert!(
        text.contains("format windows is not one of the definition's formats (sysext"),
        "{text}"
    );
    assert!(
        !text.contains("[Sysext") && !text.contains("Rootfs"),
        "{text}"
    );
}

#[test]
fn a_cause_already_in_the_message_is_not_repeated() {
    let io = std::io::Error::other("disk on fire");
    let err = anyhow::Error::new(io).context("writing out/x: disk on fire");
    assert_eq!(
        kiln::cli::fail::chain_text(&err),
        "kiln: error: writing out/x: disk on fire\n"
    );
    let io = std::io::Error::other("disk on fire");
    let err = anyhow::Error::new(io).context("writing out/x");
    assert_eq!(
        kiln::cli::fail::chain_text(&err),
        "kiln: error: writing out/x\n  caused by: disk on fire\n"
    );
}

#[test]
fn a_refused_connection_names_the_url_once_per_line() {
    let d = tempfile::tempdir().unwrap();
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}/dl");
    let arts = [FixtureArtifact::new("art0", "art0.bin", noise(1000, 1))];
    let (pk, sk) = test_keypair(d.path(), "t");
    let lock = write_signed_lock(d.path(), &lock_text(&base, &arts), &sk);
    let o = run(kiln()
        .arg("fetch")
        .arg(&lock)
        .arg("--cache")
        .arg(d.path().join("cache"))
        .arg("--trusted-key")
        .arg(&pk)
        .args(["--backoff-ms", "10", "--attempts", "2"]));
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    let url = format!("{base}/art0.bin");
    assert!(text.contains(&url), "{text}");
    for line in text.lines() {
        assert!(line.matches(&url).count() <= 1, "URL repeated in: {line}");
    }
}

#[test]
fn a_refused_pack_names_the_pack_not_a_temporary_copy() {
    let d = tempfile::tempdir().unwrap();
    let (pk, sk) = test_keypair(d.path(), "a");
    let (other, _) = test_keypair(d.path(), "b");
    let m = d.path().join("m");
    std::fs::create_dir_all(&m).unwrap();
    // The mirror's lock is DIR/artifacts.lock, where write_signed_lock puts it.
    write_signed_lock(&m, &lock_text("http://127.0.0.1:9", &[]), &sk);
    let pack = d.path().join("p.tar.zst");
    let o = run(kiln()
        .args(["mirror", "pack"])
        .arg(&m)
        .arg("--out")
        .arg(&pack)
        .arg("--trusted-key")
        .arg(&pk));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let o = run(kiln()
        .args(["mirror", "unpack"])
        .arg(&pack)
        .arg("--to")
        .arg(d.path().join("m2"))
        .arg("--trusted-key")
        .arg(&other));
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(!text.contains(".unpack-"), "{text}");
    assert!(
        text.contains(&format!("{}/artifacts.lock", pack.display())),
        "{text}"
    );
}

/// Issue 38: every command that prints, with and without `--json`, whose reader is gone before
/// it writes a byte (stdout a pipe whose read end is already closed) ends quietly with 141,
/// or 0 when it had nothing to print: never 101 (a panic in `println!`) nor 1 with "Broken
/// pipe" (a `write_all` error), whichever way it writes.
#[test]
fn every_printing_command_ends_quietly_when_stdout_is_gone() {
    let node = repo().join("docs/examples/render/node.toml");
    let lock = repo().join("images/artifacts.lock");
    let d = tempfile::tempdir().unwrap();
    let user_data = d.path().join("user-data");
    let o = run(kiln()
        .args(["render", "-p", "cloud-init"])
        .arg(&node)
        .arg("--output")
        .arg(&user_data));
    assert!(o.status.success(), "{}", out_text(&o));
    let n = node.to_str().unwrap();
    let l = lock.to_str().unwrap();
    let u = user_data.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["contract"],
        vec!["lock", "verify", l],
        vec!["lock", "outdated", l, "--against", l],
        vec!["inspect", "/bin/true", "/bin/sh"],
        vec!["plan", "images/windows.toml"],
        vec!["render", "-p", "cloud-init", n],
        vec!["render", "-p", "ignition", n],
        vec!["render", "--check", u],
        vec!["completions", "bash"],
    ];
    for json in [false, true] {
        for args in &cases {
            let (r, w) = std::io::pipe().unwrap();
            drop(r);
            let mut c = kiln();
            c.current_dir(repo())
                .stdout(w)
                .stderr(std::process::Stdio::piped());
            if json {
                c.arg("--json");
            }
            let o = c.args(args).output().unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                matches!(o.status.code(), Some(0 | 141)),
                "kiln {args:?} (json {json}): exit {:?}: {err}",
                o.status.code()
            );
            assert!(
                !err.contains("panicked") && !err.contains("Broken pipe"),
                "kiln {args:?} (json {json}): {err}"
            );
        }
    }
}

/// Issue 38: a listing piped into `head -1` ends kiln quietly with 141 (what a shell shows for
/// a tool SIGPIPE ended), never with a panic (exit 101 and "failed printing to stdout").
#[test]
fn a_reader_that_closes_stdout_early_ends_kiln_quietly_with_141() {
    use std::io::{BufRead, BufReader};
    // `kiln inspect` prints a line per file: 4000 lines are far more than a pipe buffers
    // (64 KiB), so kiln is still writing when the reader goes.
    let listings: Vec<Vec<std::ffi::OsString>> = vec![std::iter::once("inspect".into())
        .chain(std::iter::repeat_n("/bin/true".into(), 4000))
        .collect()];
    for args in listings {
        let mut child = kiln()
            .current_dir(repo())
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        // The reader is gone now (dropped): kiln's next writes find a closed pipe.
        let o = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        let cmd = args[0].to_string_lossy();
        assert!(!first.is_empty(), "kiln {cmd}: no first line; {err}");
        assert_eq!(o.status.code(), Some(141), "kiln {cmd}: {err}");
        assert!(
            !err.contains("panicked") && !err.contains("Broken pipe"),
            "{err}"
        );
    }
}
