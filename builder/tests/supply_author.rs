//! Lock authoring against a loopback "upstream": `kiln lock add` downloads, hashes and checks
//! upstream's published checksum; `kiln lock update` confirms pins and records sizes.

use crate::support;

use support::server::Server;
use support::*;

#[test]
fn add_checks_published_checksum_and_update_fills_sizes() {
    let server = Server::start();
    let d = tempfile::tempdir().unwrap();
    let bytes = noise(300_000, 7);
    let sha = sha256_hex(&bytes);
    server.add("/dl/tool", bytes.clone());
    server.add("/dl/tool.sha256", format!("{sha}  tool\n").into_bytes());
    server.add(
        "/dl/bad.sha256",
        format!("{}\n", "0".repeat(64)).into_bytes(),
    );
    let lock = d.path().join("a.lock");
    std::fs::write(&lock, "# header comment survives\nversion = 1\n").unwrap();
    let add = |checksum: &str| {
        let mut c = kiln();
        c.args(["lock", "add"]).arg(&lock);
        c.args([
            "--name",
            "tool",
            "--version",
            "1.0",
            "--os",
            "linux",
            "--arch",
            "amd64",
            "--format",
            "binary",
        ]);
        c.arg("--url").arg(format!("{}/dl/tool", server.base()));
        c.args(["--member", "tool=bin/tool"]);
        c.arg("--checksum-url")
            .arg(format!("{}/dl/{checksum}", server.base()));
        run(&mut c)
    };
    let o = add("bad.sha256");
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("expected sha256 0000"),
        "{}",
        out_text(&o)
    );

    let o = add("tool.sha256");
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let text = std::fs::read_to_string(&lock).unwrap();
    assert!(text.starts_with("# header comment survives\n"), "{text}");
    let l = kiln::supply::lock::Lock::parse(&text, &lock).unwrap();
    let a = &l.artifacts[0];
    assert_eq!(
        (a.sha256.as_str(), a.size),
        (sha.as_str(), bytes.len() as u64)
    );
    assert!(a.verified.contains("/dl/tool.sha256"), "{}", a.verified);

    // Drop the size, sign, then update: the size comes back and the stale signature goes.
    let (_pk, sk) = test_keypair(d.path(), "k");
    let unsized_text: String = text
        .lines()
        .filter(|l| !l.starts_with("size"))
        .map(|l| format!("{l}\n"))
        .collect();
    write_signed_lock(d.path(), &unsized_text, &sk);
    let lock2 = d.path().join("artifacts.lock");
    let o = run(kiln().args(["lock", "update"]).arg(&lock2));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(out_text(&o).contains("sign it again"), "{}", out_text(&o));
    assert!(!d.path().join("artifacts.lock.minisig").exists());
    let l = kiln::supply::lock::Lock::load_unverified(&lock2).unwrap();
    assert_eq!(l.artifacts[0].size, bytes.len() as u64);

    // Upstream changing the bytes behind a pinned URL is caught.
    server.add("/dl/tool", noise(300_000, 8));
    let o = run(kiln().args(["lock", "update"]).arg(&lock2));
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("upstream now serves different bytes"),
        "{}",
        out_text(&o)
    );
}
