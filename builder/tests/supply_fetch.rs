//! `kiln fetch` and the fetch library against a loopback server with faults: retries on
//! transient failures only, Range resume, wrong bytes, a server that ignores Range, slow and
//! stalled bodies, the deadline, and mirrors tried before upstream.

#[path = "../../testkit/deadline.rs"]
mod deadline;
use crate::support;

use std::sync::Arc;
use std::time::Duration;

use kiln::supply::fetch::{fetch_all, FetchError, FetchOptions, Silent, Source};
use kiln::supply::lock::Lock;
use kiln::supply::store::Store;
use support::server::{Fault, Server};
use support::*;

fn opts() -> FetchOptions {
    FetchOptions {
        concurrency: 4,
        deadline: Duration::from_secs(60),
        idle_timeout: Duration::from_secs(5),
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        attempts_per_url: 4,
        ..FetchOptions::default()
    }
}

struct Setup {
    server: Server,
    arts: Vec<FixtureArtifact>,
    lock: Lock,
    dir: tempfile::TempDir,
}

fn setup(n: usize, size: usize) -> Setup {
    let server = Server::start();
    let arts: Vec<FixtureArtifact> = (0..n)
        .map(|i| {
            FixtureArtifact::new(
                &format!("art{i}"),
                &format!("art{i}.bin"),
                noise(size + i * 1000, i as u64 + 10),
            )
        })
        .collect();
    for a in &arts {
        server.add(&format!("/dl/{}", a.file_name), a.bytes.clone());
    }
    let text = lock_text(&format!("{}/dl", server.base()), &arts);
    let lock = Lock::parse(&text, std::path::Path::new("test.lock")).unwrap();
    Setup {
        server,
        arts,
        lock,
        dir: tempfile::tempdir().unwrap(),
    }
}

fn fetch(
    s: &Setup,
    sources: &[Source],
    o: &FetchOptions,
) -> Result<kiln::supply::fetch::Summary, FetchError> {
    let store = Store::open(s.dir.path().join("cache")).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(fetch_all(
        &store,
        &s.lock.artifacts,
        sources,
        o,
        Arc::new(Silent),
    ))
}

fn assert_all_present(s: &Setup) {
    let store = Store::open(s.dir.path().join("cache")).unwrap();
    for a in &s.arts {
        let p = store.blob_path(&sha256_hex(&a.bytes));
        assert_eq!(std::fs::read(&p).unwrap(), a.bytes, "{}", a.name);
    }
}

fn leftovers(s: &Setup) -> Vec<String> {
    let dir = s.dir.path().join("cache/blobs/sha256");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect()
}

#[test]
fn parallel_fetch_then_cache_hit() {
    let s = setup(6, 300_000);
    let sum = fetch(&s, &[Source::Upstream], &opts()).unwrap();
    assert_eq!(sum.artifacts, 6);
    assert_eq!(sum.cached, 0);
    assert_eq!(sum.transferred, s.lock.total_size());
    assert_all_present(&s);
    let sent = s.server.bytes_sent();
    let sum = fetch(&s, &[Source::Upstream], &opts()).unwrap();
    assert_eq!(sum.cached, 6);
    assert_eq!(s.server.bytes_sent(), sent, "a warm cache sends nothing");
    // The index maps every entry to its blob.
    let store = Store::open(s.dir.path().join("cache")).unwrap();
    for a in &s.lock.artifacts {
        assert_eq!(store.index_entry(a).unwrap().sha256, a.sha256);
    }
}

#[test]
fn server_errors_are_retried_then_succeed() {
    let s = setup(1, 100_000);
    let p = "/dl/art0.bin";
    s.server.fault(p, Fault::Status(500));
    s.server.fault(p, Fault::Status(503));
    s.server.fault(p, Fault::Status(429));
    fetch(&s, &[Source::Upstream], &opts()).unwrap();
    assert_eq!(s.server.hits(p), 4);
    assert_all_present(&s);
}

#[test]
fn not_found_is_not_retried() {
    let s = setup(1, 1000);
    s.server.fault("/dl/art0.bin", Fault::Status(404));
    let err = fetch(&s, &[Source::Upstream], &opts()).unwrap_err();
    assert_eq!(s.server.hits("/dl/art0.bin"), 1, "404 is final");
    let msg = err.to_string();
    assert!(msg.contains("/dl/art0.bin: HTTP 404"), "{msg}");
    assert!(matches!(
        err,
        FetchError::Failed {
            wrong_bytes: false,
            ..
        }
    ));
}

#[test]
fn reset_and_truncation_resume_with_range() {
    for fault in [Fault::ResetAfter(150_000), Fault::TruncateAfter(150_000)] {
        let s = setup(1, 400_000);
        let p = "/dl/art0.bin";
        s.server.fault(p, fault.clone());
        fetch(&s, &[Source::Upstream], &opts()).unwrap();
        assert_all_present(&s);
        let log = s.server.log();
        assert_eq!(log.len(), 2, "{fault:?}: {log:?}");
        let resumed_at = log[1].range_start.expect("second request resumes");
        assert!(
            resumed_at > 0 && resumed_at <= 150_000,
            "{fault:?}: {log:?}"
        );
        assert_eq!(log[1].status, 206);
        assert!(s.server.bytes_sent() <= 400_000 + 150_000, "{fault:?}");
        assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
    }
}

#[test]
fn server_that_ignores_range_restarts_cleanly() {
    let s = setup(1, 300_000);
    let p = "/dl/art0.bin";
    s.server.fault(p, Fault::ResetAfter(100_000));
    s.server.fault(p, Fault::IgnoreRange);
    fetch(&s, &[Source::Upstream], &opts()).unwrap();
    assert_all_present(&s);
    let log = s.server.log();
    assert!(
        log[1].range_start.is_some() && log[1].status == 200,
        "{log:?}"
    );
}

#[test]
fn wrong_bytes_are_refused_and_next_source_used() {
    let s = setup(1, 200_000);
    s.server.always("/dl/art0.bin", Fault::WrongBytes);
    let err = fetch(&s, &[Source::Upstream], &opts()).unwrap_err();
    assert!(
        matches!(
            err,
            FetchError::Failed {
                wrong_bytes: true,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("expected sha256"), "{err}");
    let store = Store::open(s.dir.path().join("cache")).unwrap();
    assert!(
        store.blobs().unwrap().is_empty(),
        "no wrong blob is ever visible"
    );

    // A mirror with the right bytes, listed first, wins; upstream is never asked again.
    let mirror = Server::start();
    let a = &s.arts[0];
    mirror.add(
        &format!("/m/blobs/sha256/{}", sha256_hex(&a.bytes)),
        a.bytes.clone(),
    );
    let hits = s.server.hits("/dl/art0.bin");
    fetch(
        &s,
        &[
            Source::MirrorUrl(format!("{}/m", mirror.base())),
            Source::Upstream,
        ],
        &opts(),
    )
    .unwrap();
    assert_all_present(&s);
    assert_eq!(s.server.hits("/dl/art0.bin"), hits);
}

#[test]
fn oversized_download_is_cut_off() {
    let s = setup(1, 50_000);
    // Serve more bytes than the lock allows.
    s.server.add("/dl/art0.bin", noise(80_000, 99));
    let err = fetch(&s, &[Source::Upstream], &opts()).unwrap_err();
    assert!(
        err.to_string()
            .contains("expected 50000 bytes, received more"),
        "{err}"
    );
}

#[test]
fn slow_bodies_finish_and_stalls_are_retried() {
    let s = setup(1, 200_000);
    let p = "/dl/art0.bin";
    s.server.fault(
        p,
        Fault::Slow {
            chunk: 20_000,
            delay_ms: 30,
        },
    );
    fetch(&s, &[Source::Upstream], &opts()).unwrap();
    assert_eq!(s.server.hits(p), 1, "slow but steady is not a failure");

    let s = setup(1, 200_000);
    s.server.fault(
        p,
        Fault::Stall {
            after: 50_000,
            ms: 5_000,
        },
    );
    let o = FetchOptions {
        idle_timeout: Duration::from_millis(500),
        ..opts()
    };
    fetch(&s, &[Source::Upstream], &o).unwrap();
    // Only this artifact's requests: the port is the OS's pick, and another test's probe
    // of a port it had picked (a registry's readiness GET /) can land here.
    let log: Vec<_> = s.server.log().into_iter().filter(|r| r.path == p).collect();
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log[1].range_start.unwrap() > 0);
    assert_all_present(&s);
}

#[test]
fn deadline_ends_endless_retries() {
    let s = setup(1, 1000);
    s.server.always("/dl/art0.bin", Fault::Status(503));
    let o = FetchOptions {
        deadline: Duration::from_secs(3),
        attempts_per_url: 1000,
        backoff_max: Duration::from_millis(100),
        ..opts()
    };
    let t = std::time::Instant::now();
    let err = fetch(&s, &[Source::Upstream], &o).unwrap_err();
    assert!(matches!(err, FetchError::Deadline(_)), "{err}");
    // The 3 s deadline, not 1000 attempts with up to 100 ms of backoff each (about 100 s),
    // ended it; 3 s leave room for several attempts even on a loaded machine.
    deadline::bounded(t.elapsed(), 3);
    assert!(s.server.hits("/dl/art0.bin") > 2);
}

#[test]
fn mirror_dir_source_and_no_upstream_when_mirrored() {
    let s = setup(3, 10_000);
    // Build a mirror directory by fetching into it.
    let mdir = s.dir.path().join("mirror");
    let mstore = Store::open(&mdir).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(fetch_all(
        &mstore,
        &s.lock.artifacts,
        &[Source::Upstream],
        &opts(),
        Arc::new(Silent),
    ))
    .unwrap();
    let sent = s.server.bytes_sent();
    fetch(&s, &[Source::MirrorDir(mdir.clone())], &opts()).unwrap();
    assert_all_present(&s);
    assert_eq!(
        s.server.bytes_sent(),
        sent,
        "the directory mirror served everything"
    );
}

#[test]
fn cli_fetch_exit_codes() {
    let s = setup(2, 20_000);
    let (pk, sk) = test_keypair(s.dir.path(), "t");
    let text = lock_text(&format!("{}/dl", s.server.base()), &s.arts);
    let lock = write_signed_lock(s.dir.path(), &text, &sk);
    let cache = s.dir.path().join("cli-cache");
    let cache2 = s.dir.path().join("cli-cache2");
    let base_in = |cache: &std::path::Path| {
        let mut c = kiln();
        c.arg("fetch")
            .arg(&lock)
            .arg("--cache")
            .arg(cache)
            .arg("--trusted-key")
            .arg(&pk);
        c.args(["--backoff-ms", "10", "--attempts", "2"]);
        c
    };
    let base = || base_in(&cache);
    let o = run(&mut base());
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("art0@1.0.0/linux/amd64: ok from http://127.0.0.1"),
        "{out}"
    );

    let o = run(base().arg("--json"));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let last = String::from_utf8_lossy(&o.stdout)
        .lines()
        .find(|l| l.contains("\"event\":\"summary\""))
        .unwrap()
        .to_string();
    let v: serde_json::Value = serde_json::from_str(&last).unwrap();
    assert_eq!(v["summary"]["cached"], 2);

    s.server.always("/dl/art1.bin", Fault::Status(404));
    let o = run(&mut base_in(&cache2));
    assert_eq!(o.status.code(), Some(4), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("art1@1.0.0/linux/amd64"),
        "{}",
        out_text(&o)
    );
    s.server.always("/dl/art1.bin", Fault::WrongBytes);
    let o = run(&mut base_in(&cache2));
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));

    // A mirror given means upstream is not contacted.
    s.server.heal("/dl/art1.bin");
    let hits = s.server.log().len();
    let o = run(base_in(&cache2)
        .arg("--mirror")
        .arg(s.dir.path().join("nowhere")));
    assert_eq!(o.status.code(), Some(4), "{}", out_text(&o));
    assert_eq!(s.server.log().len(), hits);
    let o = run(base_in(&cache2)
        .arg("--mirror")
        .arg(&cache)
        .arg("--upstream"));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert_eq!(
        s.server.log().len(),
        hits,
        "the directory mirror had everything"
    );
}

#[test]
fn unsized_entries_are_bound_by_their_hash() {
    let mut s = setup(1, 120_000);
    let text = lock_text(&format!("{}/dl", s.server.base()), &s.arts);
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("size ="))
        .collect::<Vec<_>>()
        .join("\n");
    s.lock = Lock::parse(&text, std::path::Path::new("unsized.lock")).unwrap();
    assert_eq!(s.lock.artifacts[0].known_size(), None);
    s.server.fault("/dl/art0.bin", Fault::TruncateAfter(40_000));
    s.server.fault("/dl/art0.bin", Fault::WrongBytes);
    let err = fetch(&s, &[Source::Upstream], &opts()).unwrap_err();
    assert!(err.to_string().contains("expected sha256"), "{err}");
    fetch(&s, &[Source::Upstream], &opts()).unwrap();
    assert_all_present(&s);
}

/// Issue 34 item 3: names planted at the store's partial files (a shared mirror directory is a
/// documented use) are never followed: a symlink to an outside file must not truncate it or
/// append to it, and must not become the blob; a FIFO must not hang the download; a hard link
/// to an outside file must not be written through.
#[test]
fn planted_partial_names_are_never_followed() {
    use std::os::unix::fs::MetadataExt;
    let s = setup(4, 50_000);
    let blobs = s.dir.path().join("cache/blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let outside = s.dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let partial = |i: usize| blobs.join(format!(".partial-{}", sha256_hex(&s.arts[i].bytes)));
    // 0: a symlink to an unrelated file (truncated to 0 bytes before the fix).
    let precious = outside.join("precious");
    std::fs::write(&precious, b"not kiln's").unwrap();
    std::os::unix::fs::symlink(&precious, partial(0)).unwrap();
    // 1: a symlink to a file holding the blob's prefix (appended to, then renamed as the blob).
    let prefix = outside.join("prefix");
    std::fs::write(&prefix, &s.arts[1].bytes[..1000]).unwrap();
    std::os::unix::fs::symlink(&prefix, partial(1)).unwrap();
    // 2: a FIFO.
    let c = std::ffi::CString::new(partial(2).to_str().unwrap()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path that outlives the call.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    // 3: a hard link to an outside file holding the blob's prefix.
    let linked = outside.join("linked");
    std::fs::write(&linked, &s.arts[3].bytes[..1000]).unwrap();
    std::fs::hard_link(&linked, partial(3)).unwrap();

    let s = Arc::new(s);
    let (tx, rx) = std::sync::mpsc::channel();
    let s2 = Arc::clone(&s);
    std::thread::spawn(move || {
        let r = fetch(&s2, &[Source::Upstream], &opts()).map(|_| ());
        let _ = tx.send(r.map_err(|e| e.to_string()));
    });
    rx.recv_timeout(Duration::from_secs(60))
        .expect("the fetch hung on a planted partial name")
        .unwrap();
    assert_eq!(std::fs::read(&precious).unwrap(), b"not kiln's");
    assert_eq!(std::fs::read(&prefix).unwrap(), &s.arts[1].bytes[..1000]);
    assert_eq!(std::fs::read(&linked).unwrap(), &s.arts[3].bytes[..1000]);
    assert_eq!(std::fs::metadata(&linked).unwrap().nlink(), 1);
    for a in &s.arts {
        let p = blobs.join(sha256_hex(&a.bytes));
        let m = std::fs::symlink_metadata(&p).unwrap();
        assert!(m.file_type().is_file() && m.nlink() == 1, "{}", a.name);
    }
    assert_all_present(&s);
    assert!(leftovers(&s).is_empty(), "{:?}", leftovers(&s));
}

/// A symlink planted at a blob's own name is not a blob: the download replaces the link and
/// never reads or writes what it points at.
#[test]
fn a_symlink_at_a_blob_name_is_replaced() {
    let s = setup(1, 20_000);
    let blobs = s.dir.path().join("cache/blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let outside = s.dir.path().join("outside");
    std::fs::write(&outside, b"outside").unwrap();
    let blob = blobs.join(sha256_hex(&s.arts[0].bytes));
    std::os::unix::fs::symlink(&outside, &blob).unwrap();
    let sum = fetch(&s, &[Source::Upstream], &opts()).unwrap();
    assert_eq!(sum.cached, 0, "a symlink was taken for the blob");
    assert!(std::fs::symlink_metadata(&blob)
        .unwrap()
        .file_type()
        .is_file());
    assert_eq!(std::fs::read(&outside).unwrap(), b"outside");
    assert_all_present(&s);
}
