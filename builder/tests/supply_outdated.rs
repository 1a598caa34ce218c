//! `kiln lock outdated` against a loopback "upstream" serving release indexes
//! (`builder/tests/data/outdated/`): newer patches are flagged (exit 5), a newer minor is
//! reported apart, pre-releases, drafts and withdrawn releases are ignored, an up-to-date lock
//! exits 0; offline against a second lock or a mirror; an unreachable index exits 4.

use crate::support;

use std::path::{Path, PathBuf};

use support::server::{Fault, Server};
use support::*;

fn data(name: &str) -> Vec<u8> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/outdated")
        .join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The fixture upstream: Kubernetes labels under `/k8s`, GitHub listings under `/gh`.
fn upstream() -> Server {
    let s = Server::start();
    s.add("/k8s/release/stable-1.36.txt", data("stable-1.36.txt"));
    s.add("/k8s/release/stable.txt", data("stable.txt"));
    for (repo, file) in [
        ("containerd/containerd", "containerd-releases.json"),
        ("opencontainers/runc", "runc-releases.json"),
        ("containernetworking/plugins", "cni-plugins-releases.json"),
        ("kubernetes-sigs/cri-tools", "cri-tools-releases.json"),
    ] {
        s.add(
            &format!("/gh/repos/{repo}/releases?per_page=100"),
            data(file),
        );
    }
    s
}

fn outdated(lock: &Path, server: &Server, json: bool) -> std::process::Output {
    let mut c = kiln();
    c.args(["lock", "outdated"]).arg(lock);
    c.arg("--kubernetes-index")
        .arg(format!("{}/k8s", server.base()));
    c.arg("--github-api").arg(format!("{}/gh", server.base()));
    if json {
        c.arg("--json");
    }
    run(&mut c)
}

fn committed_lock() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/artifacts.lock")
}

fn json_lines(o: &std::process::Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

fn entry<'a>(lines: &'a [serde_json::Value], id: &str) -> &'a serde_json::Value {
    lines
        .iter()
        .find(|l| l["entry"]["id"] == id)
        .unwrap_or_else(|| panic!("no entry {id} in {lines:?}"))
        .get("entry")
        .unwrap()
}

/// One entry of a test lock; `version` is written into the URL the way upstream names files.
fn entry_text(name: &str, version: &str, os: &str, url: &str) -> String {
    let file = url.rsplit('/').next().unwrap();
    format!(
        "\n[[artifact]]\nname = \"{name}\"\nversion = \"{version}\"\nos = \"{os}\"\narch = \"amd64\"\nformat = \"binary\"\nurl = \"{url}\"\nsha256 = \"{}\"\nverified = \"test\"\nmembers = [{{ from = \"{file}\", to = \"bin/{name}\" }}]\n",
        "0".repeat(64)
    )
}

fn small_lock(containerd: &str, kube: &str, runc: &str) -> String {
    let mut s = String::from("version = 1\n");
    s += &entry_text(
        "containerd",
        containerd,
        "linux",
        &format!("https://github.com/containerd/containerd/releases/download/v{containerd}/containerd-{containerd}-linux-amd64.tar.gz"),
    );
    s += &entry_text(
        "kubelet",
        kube,
        "linux",
        &format!("https://dl.k8s.io/release/{kube}/bin/linux/amd64/kubelet"),
    );
    s += &entry_text(
        "runc",
        runc,
        "linux",
        &format!("https://github.com/opencontainers/runc/releases/download/v{runc}/runc.amd64"),
    );
    s
}

#[test]
fn the_committed_lock_is_flagged_against_a_newer_upstream() {
    let server = upstream();
    let o = outdated(&committed_lock(), &server, false);
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(5), "{text}");
    // The Linux pins are at the fixture upstream's newest patches; the Windows containerd pin
    // stays at 2.3.4 (no public record of a newer Windows tarball), so the lock is behind.
    assert!(
        text.contains(
            "containerd@2.3.4/windows/amd64: BEHIND: patch 2.3.6 is out; newer minor: 2.4.1"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "kubelet@v1.36.4/linux/amd64: current patch; newer minor: v1.37.0 (not applied by patch updates)"
        ),
        "{text}"
    );

    let o = outdated(&committed_lock(), &server, true);
    assert_eq!(o.status.code(), Some(5), "{}", out_text(&o));
    let lines = json_lines(&o);
    let c = entry(&lines, "containerd@2.3.6/linux/amd64");
    assert_eq!(c["status"], "current");
    assert_eq!(c["newest_patch"], serde_json::Value::Null, "{c}");
    assert_eq!(c["newest_minor"], "2.4.1");
    let ignored: Vec<(String, String)> = c["ignored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["tag"].as_str().unwrap().into(),
                i["why"].as_str().unwrap().into(),
            )
        })
        .collect();
    let why = |tag: &str| {
        ignored
            .iter()
            .find(|(t, _)| t == tag)
            .map(|(_, w)| w.as_str())
            .unwrap_or_else(|| panic!("{tag} not among the ignored: {ignored:?}"))
    };
    assert_eq!(why("v2.3.7"), "pre-release");
    assert_eq!(why("v2.3.8-beta.0"), "pre-release");
    assert_eq!(why("v2.3.9"), "withdrawn (its title says \"withdrawn\")");
    assert_eq!(why("v2.3.10"), "withdrawn (it lists no downloads)");
    assert_eq!(why("v2.4.2"), "draft");
    assert_eq!(why("v2.4.0-rc.1"), "pre-release");
    // Windows containerd is judged by its own download name, present in the fixture's 2.3.6.
    let w = entry(&lines, "containerd@2.3.4/windows/amd64");
    assert_eq!(w["status"], "patch_behind");
    assert_eq!(w["newest_patch"], "2.3.6");
    let k = entry(&lines, "kubeadm@v1.36.4/linux/arm64");
    // `newest_patch` is set only when a newer patch than the pin exists.
    assert_eq!(
        (&k["status"], &k["newest_patch"], &k["newest_minor"]),
        (
            &"current".into(),
            &serde_json::Value::Null,
            &"v1.37.0".into()
        )
    );
    assert_eq!(entry(&lines, "runc@1.5.2/linux/arm64")["status"], "current");
    let cni = entry(&lines, "cni-plugins@1.9.1/linux/amd64");
    assert_eq!(
        (&cni["status"], &cni["newest_minor"]),
        (&"current".into(), &serde_json::Value::Null)
    );
    let crictl = entry(&lines, "crictl@1.37.0/linux/arm64");
    assert_eq!(
        (&crictl["status"], &crictl["newest_minor"]),
        (&"current".into(), &serde_json::Value::Null)
    );
    let summary = lines
        .iter()
        .rev()
        .find(|l| l["event"] == "summary")
        .unwrap();
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["patch_behind"], 1, "{summary}");
    // Each index was read once, however many entries share it.
    assert_eq!(
        server.hits("/gh/repos/containerd/containerd/releases?per_page=100"),
        2
    );
}

#[test]
fn an_up_to_date_lock_exits_0() {
    let server = upstream();
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("current.lock");
    std::fs::write(&lock, small_lock("2.3.6", "v1.36.4", "1.5.2")).unwrap();
    let o = outdated(&lock, &server, false);
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains("0 of 3 entries miss a patch release"),
        "{text}"
    );
    assert!(
        text.contains("containerd@2.3.6/linux/amd64: current patch; newer minor: 2.4.1"),
        "{text}"
    );

    // An artifact kiln has no index for is reported, not counted.
    std::fs::write(
        &lock,
        format!(
            "{}{}",
            small_lock("2.3.6", "v1.36.4", "1.5.2"),
            entry_text(
                "site-agent",
                "3.1.0",
                "linux",
                "https://example.invalid/agent"
            )
        ),
    )
    .unwrap();
    let o = outdated(&lock, &server, false);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("site-agent@3.1.0/linux/amd64: unknown: no release index is known"),
        "{}",
        out_text(&o)
    );
}

#[test]
fn offline_against_a_second_lock_or_a_mirror() {
    let d = tempfile::tempdir().unwrap();
    let old = d.path().join("old.lock");
    let new = d.path().join("new.lock");
    std::fs::write(&old, small_lock("2.3.4", "v1.36.1", "1.5.1")).unwrap();
    std::fs::write(&new, small_lock("2.3.6", "v1.37.0", "1.5.1")).unwrap();
    let against = |lock: &Path, other: &Path| {
        run(kiln()
            .args(["lock", "outdated", "--json"])
            .arg(lock)
            .arg("--against")
            .arg(other))
    };
    let o = against(&old, &new);
    assert_eq!(o.status.code(), Some(5), "{}", out_text(&o));
    let lines = json_lines(&o);
    assert_eq!(
        entry(&lines, "containerd@2.3.4/linux/amd64")["newest_patch"],
        "2.3.6"
    );
    let k = entry(&lines, "kubelet@v1.36.1/linux/amd64");
    assert_eq!(
        (&k["status"], &k["newest_minor"]),
        (&"current".into(), &"v1.37.0".into())
    );
    assert_eq!(entry(&lines, "runc@1.5.1/linux/amd64")["status"], "current");

    let o = against(&new, &old);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));

    // A mirror directory is read through its lock.
    let mirror = d.path().join("mirror");
    std::fs::create_dir(&mirror).unwrap();
    std::fs::copy(&new, mirror.join("artifacts.lock")).unwrap();
    let o = against(&old, &mirror);
    assert_eq!(o.status.code(), Some(5), "{}", out_text(&o));
}

#[test]
fn an_unreachable_index_exits_4_and_a_bad_one_exits_1() {
    let server = upstream();
    let d = tempfile::tempdir().unwrap();
    let lock = d.path().join("a.lock");
    std::fs::write(&lock, small_lock("2.3.6", "v1.36.4", "1.5.2")).unwrap();
    let label = "/k8s/release/stable-1.36.txt";
    // A transient failure is retried.
    server.fault(label, Fault::Status(503));
    let o = outdated(&lock, &server, false);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert_eq!(server.hits(label), 2);

    server.always(label, Fault::Status(404));
    let o = outdated(&lock, &server, false);
    assert_eq!(o.status.code(), Some(4), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("stable-1.36.txt: HTTP 404"),
        "{}",
        out_text(&o)
    );
    server.heal(label);

    // A label that names another minor is not "no newer patch".
    server.add(label, b"v1.37.0\n".to_vec());
    let o = outdated(&lock, &server, false);
    assert_eq!(o.status.code(), Some(1), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("names v1.37.0, which is not a 1.36 release"),
        "{}",
        out_text(&o)
    );

    server.add(label, b"<html>rate limited</html>".to_vec());
    let o = outdated(&lock, &server, false);
    assert_eq!(o.status.code(), Some(1), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("not in the expected format"),
        "{}",
        out_text(&o)
    );
}

/// `kiln lock update --patch` moves every entry to the newest patch upstream lists, checks each
/// download against upstream's checksum file (named in `verified`) and re-signs; `--to` into
/// a later minor is refused without `--allow-minor`, and with it prints the skew rules.
#[test]
fn update_follows_patches_in_one_command_and_minors_only_when_asked() {
    let server = upstream();
    let d = tempfile::tempdir().unwrap();
    let (pk, sk) = test_keypair(d.path(), "site");
    let base = server.base();
    let kubelet = |v: &str| format!("/dl/k8s/release/{v}/bin/linux/amd64/kubelet");
    let ctd = |v: &str| format!("/dl/ctd/v{v}/containerd-{v}-linux-amd64.tar.gz");
    let (k4, k7, c6) = (noise(5000, 4), noise(6000, 7), noise(7000, 6));
    server.add(&kubelet("v1.36.4"), k4.clone());
    server.add(
        &format!("{}.sha256", kubelet("v1.36.4")),
        format!("{}\n", sha256_hex(&k4)).into_bytes(),
    );
    server.add(&kubelet("v1.37.0"), k7.clone());
    server.add(
        &format!("{}.sha256", kubelet("v1.37.0")),
        format!("{}\n", sha256_hex(&k7)).into_bytes(),
    );
    server.add(&ctd("2.3.6"), c6.clone());
    server.add(
        &format!("{}.sha256sum", ctd("2.3.6")),
        format!("{}  containerd-2.3.6-linux-amd64.tar.gz\n", sha256_hex(&c6)).into_bytes(),
    );
    let mut text = String::from("# a site's own lock\nversion = 1\n");
    text += &entry_text(
        "kubelet",
        "v1.36.1",
        "linux",
        &format!("{base}{}", kubelet("v1.36.1")),
    );
    text += &entry_text(
        "containerd",
        "2.3.4",
        "linux",
        &format!("{base}{}", ctd("2.3.4")),
    );
    let lock = write_signed_lock(d.path(), &text, &sk);
    let update = |extra: &[&str]| {
        let mut c = kiln();
        c.args(["lock", "update"]).arg(&lock);
        c.arg("--kubernetes-index").arg(format!("{base}/k8s"));
        c.arg("--github-api").arg(format!("{base}/gh"));
        c.args(extra);
        run(&mut c)
    };

    // A minor is never crossed by accident, and nothing is written when it is refused.
    let o = update(&["--name", "kubelet", "--to", "v1.37.0"]);
    assert_eq!(o.status.code(), Some(1), "{}", out_text(&o));
    assert!(out_text(&o).contains("--allow-minor"), "{}", out_text(&o));
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), text);
    let o = update(&["--to", "v1.36.4"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "--to without --name: {}",
        out_text(&o)
    );

    // One command: newest patches, checked against upstream's checksum files, re-signed.
    let o = update(&["--patch", "--secret-key", sk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let l = kiln::supply::lock::Lock::load_unverified(&lock).unwrap();
    let k = &l.artifacts[0];
    assert_eq!(
        (k.version.as_str(), k.sha256.as_str()),
        ("v1.36.4", sha256_hex(&k4).as_str())
    );
    assert_eq!(k.url, format!("{base}{}", kubelet("v1.36.4")));
    assert!(
        k.verified
            .contains(&format!("{base}{}.sha256", kubelet("v1.36.4"))),
        "{}",
        k.verified
    );
    assert!(
        k.verified
            .contains("from v1.36.1 to v1.36.4 (a patch update)"),
        "{}",
        k.verified
    );
    let c = &l.artifacts[1];
    assert_eq!((c.version.as_str(), c.size), ("2.3.6", 7000));
    assert!(
        c.verified
            .contains("containerd-2.3.6-linux-amd64.tar.gz.sha256sum"),
        "{}",
        c.verified
    );
    assert!(std::fs::read_to_string(&lock)
        .unwrap()
        .starts_with("# a site's own lock\n"));
    let o = run(kiln()
        .args(["lock", "verify"])
        .arg(&lock)
        .arg("--trusted-key")
        .arg(&pk));
    assert_eq!(o.status.code(), Some(0), "re-signed: {}", out_text(&o));
    // Now current: outdated exits 0, and --patch has nothing to do.
    assert_eq!(outdated(&lock, &server, false).status.code(), Some(0));
    let o = update(&["--patch"]);
    assert!(
        out_text(&o).contains("already the newest patch"),
        "{}",
        out_text(&o)
    );
    assert!(
        d.path().join("artifacts.lock.minisig").exists(),
        "an unchanged lock keeps its signature"
    );

    // Crossing the minor when asked: the skew rules are printed.
    let o = update(&["--name", "kubelet", "--to", "v1.37.0", "--allow-minor"]);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("may be up to three\n    minor versions older"),
        "{}",
        out_text(&o)
    );
    assert!(
        out_text(&o).contains("kubernetes.io/releases/version-skew-policy"),
        "{}",
        out_text(&o)
    );

    // A download that does not match upstream's checksum file is refused (exit 3).
    server.add(&ctd("2.3.6"), noise(7000, 99));
    let mut t = String::from("version = 1\n");
    t += &entry_text(
        "containerd",
        "2.3.4",
        "linux",
        &format!("{base}{}", ctd("2.3.4")),
    );
    std::fs::write(&lock, &t).unwrap();
    let o = update(&["--patch"]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), t);
}

/// `kiln lock add` over an existing entry of another minor is the same decision as
/// `update --to`: refused before any download without `--allow-minor`, skew rules with it.
#[test]
fn add_over_another_minor_needs_allow_minor() {
    let server = Server::start();
    let d = tempfile::tempdir().unwrap();
    let base = server.base();
    let path = "/dl/release/v1.37.0/bin/linux/amd64/kubelet";
    let bytes = noise(4000, 37);
    server.add(path, bytes.clone());
    server.add(
        &format!("{path}.sha256"),
        format!("{}\n", sha256_hex(&bytes)).into_bytes(),
    );
    let lock = d.path().join("a.lock");
    let text = format!(
        "version = 1\n{}",
        entry_text(
            "kubelet",
            "v1.36.1",
            "linux",
            &format!("{base}/dl/release/v1.36.1/bin/linux/amd64/kubelet")
        )
    );
    std::fs::write(&lock, &text).unwrap();
    let add = |extra: &[&str]| {
        let mut c = kiln();
        c.args(["lock", "add"]).arg(&lock);
        c.args([
            "--name",
            "kubelet",
            "--version",
            "v1.37.0",
            "--os",
            "linux",
            "--arch",
            "amd64",
        ]);
        c.args(["--format", "binary", "--member", "kubelet=bin/kubelet"]);
        c.arg("--url").arg(format!("{base}{path}"));
        c.arg("--checksum-url").arg(format!("{base}{path}.sha256"));
        c.args(extra);
        run(&mut c)
    };
    let o = add(&[]);
    assert_eq!(o.status.code(), Some(1), "{}", out_text(&o));
    assert!(out_text(&o).contains("--allow-minor"), "{}", out_text(&o));
    assert_eq!(server.hits(path), 0, "refused before downloading");
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), text);

    let o = add(&["--allow-minor"]);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("must not be newer than kube-apiserver"),
        "{}",
        out_text(&o)
    );
    let l = kiln::supply::lock::Lock::load_unverified(&lock).unwrap();
    assert_eq!(l.artifacts[0].version, "v1.37.0");
}
