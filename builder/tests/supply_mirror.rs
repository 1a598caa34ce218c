//! `kiln mirror sync/verify/pack/unpack` through the real binary: sync from upstream and from
//! another mirror (URL and directory), tampered blobs quarantined, tampered packs refused,
//! concurrent syncs into one mirror, and a download killed mid-way then resumed.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::server::{Fault, Server};
use support::*;

struct Fx {
    server: Server,
    dir: tempfile::TempDir,
    arts: Vec<FixtureArtifact>,
    lock: PathBuf,
    pk: PathBuf,
}

fn fixture(n: usize, size: usize) -> Fx {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let arts: Vec<FixtureArtifact> = (0..n)
        .map(|i| {
            FixtureArtifact::new(
                &format!("a{i}"),
                &format!("a{i}.bin"),
                noise(size + 17 * i, 100 + i as u64),
            )
        })
        .collect();
    for a in &arts {
        server.add(&format!("/up/{}", a.file_name), a.bytes.clone());
    }
    let (pk, sk) = test_keypair(dir.path(), "t");
    let lock = write_signed_lock(
        dir.path(),
        &lock_text(&format!("{}/up", server.base()), &arts),
        &sk,
    );
    Fx {
        server,
        dir,
        arts,
        lock,
        pk,
    }
}

fn mirror_cmd(fx: &Fx, args: &[&str]) -> Command {
    let mut c = kiln();
    c.arg("mirror").args(args).arg("--trusted-key").arg(&fx.pk);
    c
}

fn sync(fx: &Fx, to: &Path) -> Command {
    let mut c = mirror_cmd(fx, &["sync", "--backoff-ms", "10"]);
    c.arg("--to").arg(to).arg("--lock").arg(&fx.lock);
    c
}

/// Serves a mirror directory's files over the fault server.
fn serve_dir(server: &Server, prefix: &str, dir: &Path) {
    for rel in ["artifacts.lock", "artifacts.lock.minisig"] {
        server.add(
            &format!("{prefix}/{rel}"),
            std::fs::read(dir.join(rel)).unwrap(),
        );
    }
    for e in std::fs::read_dir(dir.join("blobs/sha256")).unwrap() {
        let e = e.unwrap();
        let n = e.file_name().to_string_lossy().into_owned();
        server.add(
            &format!("{prefix}/blobs/sha256/{n}"),
            std::fs::read(e.path()).unwrap(),
        );
    }
}

#[test]
fn sync_verify_tamper_quarantine() {
    let fx = fixture(4, 50_000);
    let m = fx.dir.path().join("mirror");
    let o = run(&mut sync(&fx, &m));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(m.join("artifacts.lock").is_file() && m.join("artifacts.lock.minisig").is_file());
    let o = run(mirror_cmd(&fx, &["verify"]).arg(&m));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("4 blobs"),
        "{}",
        out_text(&o)
    );

    // Flip one byte of one blob on disk.
    let victim = sha256_hex(&fx.arts[2].bytes);
    let p = m.join("blobs/sha256").join(&victim);
    let mut b = std::fs::read(&p).unwrap();
    b[1234] ^= 0xff;
    std::fs::write(&p, &b).unwrap();
    let o = run(mirror_cmd(&fx, &["verify"]).arg(&m));
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains(&format!("BAD blob {victim}")),
        "{}",
        out_text(&o)
    );
    assert!(m.join("quarantine").join(&victim).is_file());
    assert!(!p.exists());
    // Now it is reported missing; a re-sync repairs it from upstream.
    let o = run(mirror_cmd(&fx, &["verify"]).arg(&m));
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("MISSING a2@1.0.0"),
        "{}",
        out_text(&o)
    );
    let o = run(&mut sync(&fx, &m));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let o = run(mirror_cmd(&fx, &["verify", "--json"]).arg(&m));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
}

#[test]
fn sync_from_another_mirror_by_url_and_dir() {
    let fx = fixture(3, 30_000);
    let m1 = fx.dir.path().join("m1");
    assert!(run(&mut sync(&fx, &m1)).status.success());
    let up_hits = fx.server.log().len();

    // By directory: the lock comes from the source mirror itself.
    let m2 = fx.dir.path().join("m2");
    let o = run(mirror_cmd(&fx, &["sync"])
        .arg("--from")
        .arg(&m1)
        .arg("--to")
        .arg(&m2));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert_eq!(fx.server.log().len(), up_hits, "upstream not contacted");

    // By URL, from a mirror served over HTTP.
    let web = Server::start();
    serve_dir(&web, "/mirror", &m2);
    let m3 = fx.dir.path().join("m3");
    let o = run(
        mirror_cmd(&fx, &["sync", "--from", &format!("{}/mirror/", web.base())])
            .arg("--to")
            .arg(&m3),
    );
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert_eq!(fx.server.log().len(), up_hits, "upstream not contacted");
    assert!(run(mirror_cmd(&fx, &["verify"]).arg(&m3)).status.success());

    // A source mirror with a tampered lock is refused before any blob is copied.
    let text = std::fs::read_to_string(m2.join("artifacts.lock")).unwrap();
    std::fs::write(
        m2.join("artifacts.lock"),
        text.replace("test fixture", "test fixturE"),
    )
    .unwrap();
    let m4 = fx.dir.path().join("m4");
    let o = run(mirror_cmd(&fx, &["sync"])
        .arg("--from")
        .arg(&m2)
        .arg("--to")
        .arg(&m4));
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        !m4.join("blobs/sha256").exists()
            || std::fs::read_dir(m4.join("blobs/sha256")).unwrap().count() == 0
    );
}

#[test]
fn pack_and_unpack_round_trip_and_refuse_tampering() {
    let fx = fixture(3, 40_000);
    let m = fx.dir.path().join("m");
    assert!(run(&mut sync(&fx, &m)).status.success());
    let pack = fx.dir.path().join("carry.tar.zst");
    let o = run(mirror_cmd(&fx, &["pack"]).arg(&m).arg("--out").arg(&pack));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    // The pack is a plain tar.zst readable by the system tools, lock first.
    let listing = Command::new("tar")
        .arg("--zstd")
        .arg("-tf")
        .arg(&pack)
        .output()
        .unwrap();
    let names = String::from_utf8_lossy(&listing.stdout).to_string();
    assert!(
        names.starts_with("artifacts.lock\nartifacts.lock.minisig\nblobs/sha256/"),
        "{names}"
    );

    let dest = fx.dir.path().join("airgapped");
    let o = run(mirror_cmd(&fx, &["unpack"])
        .arg(&pack)
        .arg("--to")
        .arg(&dest));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(run(mirror_cmd(&fx, &["verify"]).arg(&dest))
        .status
        .success());
    for a in &fx.arts {
        assert_eq!(
            std::fs::read(dest.join("blobs/sha256").join(sha256_hex(&a.bytes))).unwrap(),
            a.bytes
        );
    }

    // Re-pack with a tampered lock inside (signature no longer matches): refused, nothing stored.
    let work = fx.dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    assert!(Command::new("tar")
        .arg("--zstd")
        .arg("-xf")
        .arg(&pack)
        .arg("-C")
        .arg(&work)
        .status()
        .unwrap()
        .success());
    let t = std::fs::read_to_string(work.join("artifacts.lock")).unwrap();
    std::fs::write(
        work.join("artifacts.lock"),
        t.replacen("size = ", "size =  ", 1),
    )
    .unwrap();
    let bad = fx.dir.path().join("bad.tar.zst");
    let blobs: Vec<String> = names
        .lines()
        .filter(|l| l.starts_with("blobs/"))
        .map(String::from)
        .collect();
    assert!(Command::new("tar")
        .arg("--zstd")
        .arg("-cf")
        .arg(&bad)
        .arg("-C")
        .arg(&work)
        .args(["artifacts.lock", "artifacts.lock.minisig"])
        .args(&blobs)
        .status()
        .unwrap()
        .success());
    let dest2 = fx.dir.path().join("airgapped2");
    let o = run(mirror_cmd(&fx, &["unpack"])
        .arg(&bad)
        .arg("--to")
        .arg(&dest2));
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("does not match its signature"),
        "{}",
        out_text(&o)
    );
    assert!(!dest2.join("artifacts.lock").exists());

    // A blob altered inside the pack is refused by its hash.
    std::fs::write(work.join("artifacts.lock"), t).unwrap();
    let victim = work.join(&blobs[0]);
    let mut b = std::fs::read(&victim).unwrap();
    b[10] ^= 1;
    std::fs::write(&victim, b).unwrap();
    assert!(Command::new("tar")
        .arg("--zstd")
        .arg("-cf")
        .arg(&bad)
        .arg("-C")
        .arg(&work)
        .args(["artifacts.lock", "artifacts.lock.minisig"])
        .args(&blobs)
        .status()
        .unwrap()
        .success());
    let dest3 = fx.dir.path().join("airgapped3");
    let o = run(mirror_cmd(&fx, &["unpack"])
        .arg(&bad)
        .arg("--to")
        .arg(&dest3));
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(out_text(&o).contains("expected sha256"), "{}", out_text(&o));
    assert!(!dest3.join("artifacts.lock").exists());
}

#[test]
fn concurrent_syncs_into_one_mirror() {
    let fx = fixture(6, 400_000);
    for a in &fx.arts {
        // Slow enough that the syncs really overlap.
        fx.server.always(
            &format!("/up/{}", a.file_name),
            Fault::Slow {
                chunk: 50_000,
                delay_ms: 10,
            },
        );
    }
    let m = fx.dir.path().join("shared");
    let children: Vec<_> = (0..4)
        .map(|_| {
            sync(&fx, &m)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    }
    let o = run(mirror_cmd(&fx, &["verify"]).arg(&m));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let stray: Vec<_> = std::fs::read_dir(m.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
    // Each blob crossed the wire about once, not once per process.
    let total: u64 = fx.arts.iter().map(|a| a.bytes.len() as u64).sum();
    assert!(
        fx.server.bytes_sent() <= total + total / 2,
        "sent {} for {total}",
        fx.server.bytes_sent()
    );
}

#[test]
fn killed_download_resumes_without_refetching() {
    let size = 8 * 1024 * 1024;
    let fx = fixture(1, size);
    let path = "/up/a0.bin";
    fx.server.always(
        path,
        Fault::Slow {
            chunk: 64 * 1024,
            delay_ms: 15,
        },
    );
    let cache = fx.dir.path().join("cache");
    let fetch = || {
        let mut c = kiln();
        c.arg("fetch")
            .arg(&fx.lock)
            .arg("--cache")
            .arg(&cache)
            .arg("--trusted-key")
            .arg(&fx.pk);
        c.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    let mut child = fetch().spawn().unwrap();
    let t = Instant::now();
    while fx.server.bytes_sent() < size as u64 / 2 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "download never reached half way"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL: no cleanup runs
    child.wait().unwrap();
    let first = fx.server.bytes_sent();
    // Nothing under the final name yet: only the partial file.
    let blob = cache
        .join("blobs/sha256")
        .join(sha256_hex(&fx.arts[0].bytes));
    assert!(!blob.exists());
    fx.server.heal(path);
    let o = fetch().output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("resumed"),
        "{}",
        out_text(&o)
    );
    let total = fx.server.bytes_sent();
    let log = fx.server.log();
    let resumed_from = log.last().unwrap().range_start.unwrap();
    // The resumed request asked for the rest of what kiln had kept, and got only that: nothing
    // kiln had written was fetched again. (What the server sent but kiln had not yet written
    // when it was killed, in socket buffers, is gone with the process; on a busy machine that
    // can be a megabyte, so it is not counted against the resume.)
    assert!(
        resumed_from >= size as u64 / 4,
        "killed at {first} bytes sent, but resumed from {resumed_from}: {log:?}"
    );
    assert!(
        total - first <= size as u64 - resumed_from + 64 * 1024,
        "resumed from {resumed_from}, yet {} bytes were sent after the kill for {size}",
        total - first
    );
    assert_eq!(std::fs::read(&blob).unwrap(), fx.arts[0].bytes);
}

/// Every name under `blobs/sha256/` that is a digest holds exactly the bytes of that digest.
fn assert_visible_blobs_are_whole(m: &Path) {
    let Ok(dir) = std::fs::read_dir(m.join("blobs/sha256")) else {
        return;
    };
    for e in dir {
        let e = e.unwrap();
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with('.') {
            continue;
        }
        assert_eq!(
            sha256_hex(&std::fs::read(e.path()).unwrap()),
            n,
            "a visible blob does not hash to its name"
        );
    }
}

#[test]
fn sync_killed_again_and_again_never_shows_a_bad_blob() {
    let size = 3 * 1024 * 1024;
    let fx = fixture(4, size);
    for a in &fx.arts {
        fx.server.always(
            &format!("/up/{}", a.file_name),
            // Slow enough that a loaded machine's polling below cannot miss the last kill
            // point and let the sync finish (seen under CI load with 8 ms).
            Fault::Slow {
                chunk: 64 * 1024,
                delay_ms: 20,
            },
        );
    }
    let m = fx.dir.path().join("m");
    let total: u64 = fx.arts.iter().map(|a| a.bytes.len() as u64).sum();
    // Kill -9 at five points spread over the first 5/7 of the transfer (what is left after
    // the last one must be resumed); after each kill the mirror shows only whole blobs and no
    // lock (a lock is only advertised once everything is there).
    for k in 1..=5u64 {
        let mark = total * k / 7;
        let mut child = sync(&fx, &m)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t = Instant::now();
        while fx.server.bytes_sent() < mark {
            assert!(t.elapsed() < Duration::from_secs(60), "stuck before {mark}");
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        child.kill().ok(); // SIGKILL: no cleanup runs
        child.wait().unwrap();
        assert_visible_blobs_are_whole(&m);
        assert!(
            !m.join("artifacts.lock").exists(),
            "the lock was installed before the blobs (kill {k})"
        );
    }
    // What the kills left behind, per artifact still missing.
    let mut left = Vec::new();
    for a in &fx.arts {
        fx.server.heal(&format!("/up/{}", a.file_name));
        let sha = sha256_hex(&a.bytes);
        let partial = m.join("blobs/sha256").join(format!(".partial-{sha}"));
        if !m.join("blobs/sha256").join(&sha).exists() {
            let len = std::fs::metadata(&partial).map_or(0, |md| md.len());
            left.push((format!("/up/{}", a.file_name), len));
        }
    }
    assert!(
        left.iter().any(|(_, len)| *len > 0),
        "the kills left no partial download to resume: {left:?}"
    );
    let before = fx.server.log().len();
    let o = run(&mut sync(&fx, &m));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let o = run(mirror_cmd(&fx, &["verify"]).arg(&m));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(m.join("artifacts.lock").is_file());
    // Each interrupted download resumed exactly where its partial file ended.
    let log = fx.server.log();
    for (path, len) in left {
        let first = log[before..]
            .iter()
            .find(|s| s.path == path)
            .unwrap_or_else(|| panic!("{path} was not requested again"));
        let want = (len > 0).then_some(len);
        assert_eq!(first.range_start, want, "{path}: {log:?}");
    }
}

#[test]
fn concurrent_syncs_through_resets_truncation_and_errors() {
    let fx = fixture(6, 600_000);
    for (i, a) in fx.arts.iter().enumerate() {
        let p = format!("/up/{}", a.file_name);
        // Each process meets some of these; whoever does retries and resumes.
        fx.server.fault(&p, Fault::Status(503));
        fx.server.fault(&p, Fault::ResetAfter(100_000 + 1000 * i));
        fx.server.fault(&p, Fault::TruncateAfter(300_000));
        fx.server.fault(&p, Fault::Status(500));
    }
    let m = fx.dir.path().join("shared");
    let children: Vec<_> = (0..4)
        .map(|_| {
            sync(&fx, &m)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let o = c.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    }
    assert_visible_blobs_are_whole(&m);
    let o = run(mirror_cmd(&fx, &["verify"]).arg(&m));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let stray: Vec<_> = std::fs::read_dir(m.join("blobs/sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
    for a in &fx.arts {
        assert_eq!(
            std::fs::read(m.join("blobs/sha256").join(sha256_hex(&a.bytes))).unwrap(),
            a.bytes
        );
    }
}

#[test]
fn sync_and_fetch_from_a_mirror_url_through_faults() {
    let fx = fixture(3, 400_000);
    let m1 = fx.dir.path().join("m1");
    assert!(run(&mut sync(&fx, &m1)).status.success());
    let up_hits = fx.server.log().len();
    let web = Server::start();
    serve_dir(&web, "/mirror", &m1);
    let blob = |i: usize| format!("/mirror/blobs/sha256/{}", sha256_hex(&fx.arts[i].bytes));
    // The remote lock answers 503 then resets; blobs reset, truncate and fail with 500 once.
    web.fault("/mirror/artifacts.lock", Fault::Status(503));
    web.fault("/mirror/artifacts.lock", Fault::ResetAfter(10));
    web.fault("/mirror/artifacts.lock.minisig", Fault::Status(502));
    web.fault(&blob(0), Fault::ResetAfter(150_000));
    web.fault(&blob(1), Fault::TruncateAfter(200_000));
    web.fault(&blob(2), Fault::Status(500));
    let m2 = fx.dir.path().join("m2");
    let o = run(mirror_cmd(
        &fx,
        &[
            "sync",
            "--backoff-ms",
            "10",
            "--from",
            &format!("{}/mirror", web.base()),
        ],
    )
    .arg("--to")
    .arg(&m2));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert_eq!(fx.server.log().len(), up_hits, "upstream not contacted");
    assert!(run(mirror_cmd(&fx, &["verify"]).arg(&m2)).status.success());
    // The interrupted blobs resumed with Range instead of starting over.
    let log = web.log();
    for i in [0, 1] {
        let resumed = log
            .iter()
            .filter(|s| s.path == blob(i))
            .any(|s| s.range_start.is_some_and(|r| r > 0));
        assert!(resumed, "{}: {log:?}", blob(i));
    }

    // `kiln fetch --mirror URL` through the same kinds of faults.
    web.fault(&blob(0), Fault::Status(503));
    web.fault(&blob(1), Fault::ResetAfter(50_000));
    web.fault(
        &blob(2),
        Fault::Stall {
            after: 1000,
            ms: 3000,
        },
    );
    let cache = fx.dir.path().join("cache");
    let o = run(kiln()
        .arg("fetch")
        .arg(m2.join("artifacts.lock"))
        .arg("--trusted-key")
        .arg(&fx.pk)
        .args(["--backoff-ms", "10", "--idle-timeout", "1", "--mirror"])
        .arg(format!("{}/mirror", web.base()))
        .arg("--cache")
        .arg(&cache));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert_eq!(fx.server.log().len(), up_hits, "upstream not contacted");
    for a in &fx.arts {
        assert_eq!(
            std::fs::read(cache.join("blobs/sha256").join(sha256_hex(&a.bytes))).unwrap(),
            a.bytes
        );
    }
}
