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
        text.contains("larger than 16777216 bytes (16 MiB), not a lock"),
        "{text}"
    );
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
