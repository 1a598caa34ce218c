//! Builder limits: a lock fetched from a mirror URL is capped at 16 MiB even when the server
//! sends it chunked (no Content-Length), and a trusted key other than the embedded release
//! key is named on stderr, whether it came from `--trusted-key` or `KILN_TRUSTED_KEY`.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use support::*;

/// Answers every request with an endless chunked body (1 MiB chunks, up to 256 MiB) and
/// counts the bytes the client accepted before it hung up.
fn chunked_server() -> (String, Arc<AtomicU64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let sent = Arc::new(AtomicU64::new(0));
    let counter = sent.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { continue };
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut line = String::new();
                while r.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n",
                );
                let chunk = vec![b'#'; 1 << 20];
                for _ in 0..256 {
                    let head = format!("{:x}\r\n", chunk.len());
                    if s.write_all(head.as_bytes()).is_err()
                        || s.write_all(&chunk).is_err()
                        || s.write_all(b"\r\n").is_err()
                    {
                        return;
                    }
                    counter.fetch_add(chunk.len() as u64, Ordering::SeqCst);
                }
                let _ = s.write_all(b"0\r\n\r\n");
            });
        }
    });
    (base, sent)
}

#[test]
fn a_chunked_lock_larger_than_16_mib_is_refused_while_it_streams() {
    let (base, sent) = chunked_server();
    let t = tempfile::tempdir().unwrap();
    let o = run(kiln()
        .args(["mirror", "sync", "--backoff-ms", "10", "--from"])
        .arg(format!("{base}/mirror/"))
        .arg("--to")
        .arg(t.path().join("m")));
    let text = out_text(&o);
    assert!(!o.status.success(), "{text}");
    assert!(
        text.contains("larger than 16777216 bytes, the most kiln reads for it"),
        "{text}"
    );
    // A source that could not deliver: exit 4, as `kiln fetch` exits for it (docs/cli.md).
    assert_eq!(o.status.code(), Some(4), "{text}");
    // kiln hung up near the cap, not after reading all 256 MiB (socket buffers hold a few).
    let n = sent.load(Ordering::SeqCst);
    assert!(n < 64 << 20, "the server got {n} bytes out");
}

#[test]
fn a_non_embedded_trusted_key_is_named_on_every_use() {
    let t = tempfile::tempdir().unwrap();
    let (pk, sk) = test_keypair(t.path(), "other");
    let lock = write_signed_lock(
        t.path(),
        &lock_text(
            "http://127.0.0.1:9",
            &[FixtureArtifact::new("a", "a", b"a".to_vec())],
        ),
        &sk,
    );
    let id = kiln::supply::sign::TrustedKey::from_file(&pk)
        .unwrap()
        .id()
        .to_string();
    // From the flag, with --quiet: still said.
    let o = run(kiln()
        .args(["--quiet", "lock", "verify"])
        .arg(&lock)
        .arg("--trusted-key")
        .arg(&pk));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        e.contains(&format!("trusting minisign key {id} from {}", pk.display()))
            && e.contains("(--trusted-key)"),
        "{e}"
    );
    // From the environment: said, naming the variable.
    let o = run(kiln()
        .args(["lock", "verify"])
        .arg(&lock)
        .env("KILN_TRUSTED_KEY", &pk));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        e.contains(&format!("trusting minisign key {id}")) && e.contains("(KILN_TRUSTED_KEY)"),
        "{e}"
    );
    // The embedded key: nothing to announce (and this lock does not verify with it).
    let o = run(kiln().args(["lock", "verify"]).arg(&lock));
    assert!(!String::from_utf8_lossy(&o.stderr).contains("trusting minisign key"));
}

/// Runs `kiln ARGS` and waits at most `secs` for it: a reader that blocks on a FIFO or reads
/// `/dev/zero` to the end fails the test instead of hanging it.
fn kiln_within(args: &[&std::ffi::OsStr], secs: u64) -> std::process::Output {
    let mut child = kiln()
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kiln {args:?} did not end within {secs} s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The lock, its signature, a trusted key and the advisory file are regular files of bounded
/// size: a FIFO is refused at once (it would block kiln forever), `/dev/zero` before a byte is
/// read (it would be read until memory ran out), each error naming the file and what it is.
#[test]
fn special_files_named_as_lock_signature_key_or_advisories_are_refused_at_once() {
    use std::ffi::OsStr;
    let d = tempfile::tempdir().unwrap();
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let lock = repo.join("images/artifacts.lock");
    let fifo = d.path().join("fifo");
    let st = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(st.success());
    let expect = |o: &std::process::Output, file: &std::path::Path, kind: &str| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_ne!(o.status.code(), Some(0), "{err}");
        assert!(
            err.contains(&file.display().to_string()) && err.contains(&format!("found a {kind}")),
            "{file:?}: {err}"
        );
    };
    // kiln lock audit --advisories: /dev/zero and a FIFO.
    for (adv, kind) in [
        (std::path::Path::new("/dev/zero"), "character device"),
        (&fifo, "FIFO"),
    ] {
        let o = kiln_within(
            &[
                OsStr::new("lock"),
                OsStr::new("audit"),
                lock.as_os_str(),
                OsStr::new("--advisories"),
                adv.as_os_str(),
            ],
            30,
        );
        expect(&o, adv, kind);
    }
    // The lock itself, for a command that verifies it (plan) and one that does not (audit).
    for cmd in [["plan", "images/ubuntu.toml"], ["lock", "audit"]] {
        let mut args: Vec<&OsStr> = cmd.iter().map(OsStr::new).collect();
        if cmd[0] == "plan" {
            args.push(OsStr::new("--lock"));
        }
        args.push(fifo.as_os_str());
        let o = kiln()
            .current_dir(&repo)
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut o = o;
        while o.try_wait().unwrap().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "kiln {cmd:?} FIFO hung"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        expect(&o.wait_with_output().unwrap(), &fifo, "FIFO");
    }
    // kiln lock sign of a FIFO, and of /dev/zero (it read /dev/zero until memory ran out).
    let (_, sk) = test_keypair(d.path(), "k");
    for (file, kind) in [
        (fifo.as_path(), "FIFO"),
        (std::path::Path::new("/dev/zero"), "character device"),
    ] {
        let o = kiln_within(
            &[
                OsStr::new("lock"),
                OsStr::new("sign"),
                file.as_os_str(),
                OsStr::new("--secret-key"),
                sk.as_os_str(),
            ],
            30,
        );
        expect(&o, file, kind);
    }
    // A signature that is a FIFO, and a trusted key that is /dev/zero.
    let copy = d.path().join("artifacts.lock");
    std::fs::copy(&lock, &copy).unwrap();
    let sig = d.path().join("artifacts.lock.minisig");
    let st = std::process::Command::new("mkfifo")
        .arg(&sig)
        .status()
        .unwrap();
    assert!(st.success());
    let o = kiln_within(
        &[OsStr::new("lock"), OsStr::new("verify"), copy.as_os_str()],
        30,
    );
    expect(&o, &sig, "FIFO");
    let o = kiln_within(
        &[
            OsStr::new("lock"),
            OsStr::new("verify"),
            lock.as_os_str(),
            OsStr::new("--trusted-key"),
            OsStr::new("/dev/zero"),
        ],
        30,
    );
    expect(&o, std::path::Path::new("/dev/zero"), "character device");
}

/// Issue 38: `mirror sync --from` an HTTP mirror nobody answers on exits 4 (a source that
/// could not deliver, as `kiln fetch` exits), and the error says why: the connection was
/// refused, not only "error sending request".
#[test]
fn an_unreachable_http_mirror_exits_4_naming_the_cause() {
    // A port that was just free: nothing listens there.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let t = tempfile::tempdir().unwrap();
    let o = run(kiln()
        .args(["mirror", "sync", "--backoff-ms", "10", "--from"])
        .arg(format!("http://127.0.0.1:{port}/mirror/"))
        .arg("--to")
        .arg(t.path().join("m")));
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(
        text.contains(&format!("http://127.0.0.1:{port}/mirror/artifacts.lock"))
            && text.to_lowercase().contains("connection refused"),
        "{text}"
    );
}

/// Credentials in a mirror URL (`http://user:password@host/`, a token before `@`) are never
/// printed: not in the error that names the URL, not in a `--json` event. Both ways in: the
/// lock `mirror sync` fetches first, and the blobs `kiln fetch` downloads.
#[test]
fn credentials_in_a_mirror_url_never_reach_the_output() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://kiln:s3cret-pass@127.0.0.1:{port}/mirror/");
    let t = tempfile::tempdir().unwrap();
    let sync = run(kiln()
        .args(["mirror", "sync", "--backoff-ms", "10", "--from"])
        .arg(&url)
        .arg("--to")
        .arg(t.path().join("m")));
    let fetch = run(kiln()
        .args(["fetch", "--json", "--attempts", "2", "--backoff-ms", "10"])
        .args(["--name", "runc", "--arch", "amd64", "--mirror"])
        .arg(&url)
        .arg("--cache")
        .arg(t.path().join("cache"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../images/artifacts.lock"
        )));
    for (what, o) in [("mirror sync", &sync), ("fetch", &fetch)] {
        let text = out_text(o);
        assert_eq!(o.status.code(), Some(4), "{what}: {text}");
        assert!(!text.contains("s3cret"), "{what}: {text}");
        assert!(
            text.contains(&format!("http://***@127.0.0.1:{port}/mirror/")),
            "{what}: {text}"
        );
    }
    // The retry and source-failed events name the masked URL too.
    let events = String::from_utf8_lossy(&fetch.stdout);
    assert!(events.contains("\"event\":\"retry\""), "{events}");
}
