//! `kiln lock sign/verify` and `kiln inspect` through the real binary: good, tampered,
//! wrongly-keyed, truncated and unsigned locks, and interop with the minisign CLI.

use crate::support;

use support::*;

fn signed_fixture() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    std::path::PathBuf,
    std::path::PathBuf,
) {
    let dir = tempfile::tempdir().unwrap();
    let (pk, sk) = test_keypair(dir.path(), "test");
    let lock_body = lock_text(
        "https://example.invalid/dl",
        &[
            FixtureArtifact::new("runc", "runc.amd64", noise(1000, 1)),
            FixtureArtifact::new("kubelet", "kubelet", noise(2000, 2)),
        ],
    );
    let lock = write_signed_lock(dir.path(), &lock_body, &sk);
    (dir, lock, pk, sk)
}

fn verify(lock: &std::path::Path, extra: &[&str]) -> std::process::Output {
    run(kiln().args(["lock", "verify"]).arg(lock).args(extra))
}

#[test]
fn good_signature_verifies() {
    let (_d, lock, pk, _) = signed_fixture();
    let o = verify(&lock, &["--trusted-key", pk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("signed by key") && out.contains("2 artifacts, 3000 bytes recorded"),
        "{out}"
    );

    let o = verify(&lock, &["--trusted-key", pk.to_str().unwrap(), "--json"]);
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(v["signed"], true);
    assert_eq!(v["artifacts"], 2);
}

#[test]
fn tampered_lock_is_refused() {
    let (_d, lock, pk, _) = signed_fixture();
    let body = std::fs::read_to_string(&lock).unwrap();
    // A one-character change to a size keeps the lock valid TOML and a valid lock.
    std::fs::write(&lock, body.replacen("size = 1000", "size = 1001", 1)).unwrap();
    let o = verify(&lock, &["--trusted-key", pk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("does not match its signature"),
        "{}",
        out_text(&o)
    );
    // --allow-unsigned does not excuse a bad signature.
    let o = verify(
        &lock,
        &["--trusted-key", pk.to_str().unwrap(), "--allow-unsigned"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
}

#[test]
fn tampered_and_truncated_signatures_are_refused() {
    let (_d, lock, pk, _) = signed_fixture();
    let sig = lock.with_extension("lock.minisig");
    let orig = std::fs::read_to_string(&sig).unwrap();
    let mut lines: Vec<String> = orig.lines().map(String::from).collect();
    // Flip one base64 character of the signature itself.
    let l = &mut lines[1];
    let c = if l.ends_with('A') { 'B' } else { 'A' };
    l.pop();
    l.push(c);
    std::fs::write(&sig, lines.join("\n") + "\n").unwrap();
    let o = verify(&lock, &["--trusted-key", pk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));

    // The trusted comment is covered by the global signature.
    let mut lines: Vec<String> = orig.lines().map(String::from).collect();
    lines[2] = "trusted comment: something else".into();
    std::fs::write(&sig, lines.join("\n") + "\n").unwrap();
    let o = verify(&lock, &["--trusted-key", pk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));

    std::fs::write(&sig, &orig[..orig.len() / 3]).unwrap();
    let o = verify(&lock, &["--trusted-key", pk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("is not a minisign signature"),
        "{}",
        out_text(&o)
    );
}

#[test]
fn wrong_key_and_default_key_are_refused() {
    let (d, lock, _pk, _) = signed_fixture();
    let (other, _) = test_keypair(d.path(), "other");
    let o = verify(&lock, &["--trusted-key", other.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(out_text(&o).contains("was made by key"), "{}", out_text(&o));
    // The embedded release key did not sign this test lock.
    let o = verify(&lock, &[]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("the trusted key is"),
        "{}",
        out_text(&o)
    );
}

#[test]
fn unsigned_lock_needs_allow_unsigned() {
    let (_d, lock, pk, _) = signed_fixture();
    std::fs::remove_file(lock.with_extension("lock.minisig")).unwrap();
    let o = verify(&lock, &["--trusted-key", pk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(out_text(&o).contains("is not signed"), "{}", out_text(&o));
    let o = verify(
        &lock,
        &["--trusted-key", pk.to_str().unwrap(), "--allow-unsigned"],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(out_text(&o).contains("UNSIGNED"), "{}", out_text(&o));
}

#[test]
fn signed_but_invalid_lock_names_the_field() {
    let d = tempfile::tempdir().unwrap();
    let (pk, sk) = test_keypair(d.path(), "t");
    let good = lock_text(
        "https://x.invalid",
        &[FixtureArtifact::new("runc", "runc", noise(10, 3))],
    );
    let lock = write_signed_lock(d.path(), &good, &sk);
    std::fs::write(
        &lock,
        good.replace("format = \"binary\"", "format = \"binary\"\nextra = 1"),
    )
    .unwrap();
    // Sign the bad text directly with the library (kiln lock sign refuses invalid locks).
    let bytes = std::fs::read(&lock).unwrap();
    let sig = kiln::supply::sign::sign(&bytes, &sk, None, "t").unwrap();
    std::fs::write(lock.with_extension("lock.minisig"), sig).unwrap();
    let o = verify(&lock, &["--trusted-key", pk.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("unknown field `extra`"),
        "{}",
        out_text(&o)
    );
    assert!(out_text(&o).contains("artifacts.lock"), "{}", out_text(&o));
    let o = run(kiln()
        .args(["lock", "sign"])
        .arg(&lock)
        .arg("--secret-key")
        .arg(&sk));
    assert_ne!(o.status.code(), Some(0), "{}", out_text(&o));
}

/// Signatures interoperate with the reference minisign tool both ways.
#[test]
fn minisign_cli_interop() {
    if std::process::Command::new("minisign")
        .arg("-v")
        .output()
        .is_err()
    {
        panic!("minisign is not installed: run `make deps` (scripts/deps.sh installs it)");
    }
    let (d, lock, pk, _) = signed_fixture();
    let o = run(std::process::Command::new("minisign")
        .arg("-Vm")
        .arg(&lock)
        .arg("-p")
        .arg(&pk));
    assert!(
        o.status.success(),
        "minisign rejected kiln's signature: {}",
        out_text(&o)
    );

    let pk2 = d.path().join("cli.pub");
    let sk2 = d.path().join("cli.key");
    let o = run(std::process::Command::new("minisign")
        .args(["-G", "-W", "-p"])
        .arg(&pk2)
        .arg("-s")
        .arg(&sk2));
    assert!(o.status.success(), "{}", out_text(&o));
    let o = run(std::process::Command::new("minisign")
        .args(["-S", "-s"])
        .arg(&sk2)
        .arg("-m")
        .arg(&lock));
    assert!(o.status.success(), "{}", out_text(&o));
    let o = verify(&lock, &["--trusted-key", pk2.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    // And kiln signs with a CLI-made (unencrypted) key.
    let o = run(kiln().args(["lock", "sign"]).arg(&lock).arg("-s").arg(&sk2));
    assert!(o.status.success(), "{}", out_text(&o));
    let o = verify(&lock, &["--trusted-key", pk2.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
}

#[test]
fn inspect_real_elf_and_built_pe() {
    let d = tempfile::tempdir().unwrap();
    let pe = d.path().join("kubelet.exe");
    std::fs::write(&pe, kiln::supply::inspect::minimal_pe(0x8664, 3)).unwrap();
    // /bin/ls is a real Debian dynamic executable on the test machine's own architecture.
    let o = run(kiln().arg("inspect").arg("/bin/ls").arg(&pe));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("/bin/ls: ELF 64-bit") && out.contains("dynamic, interpreter /lib"),
        "{out}"
    );
    assert!(
        out.contains("PE32+ x86-64 (windows/amd64), subsystem console"),
        "{out}"
    );

    let o = run(kiln()
        .args(["inspect", "--os", "linux", "--arch", "amd64"])
        .arg(&pe));
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("expected a linux/amd64 binary, found windows/amd64"),
        "{}",
        out_text(&o)
    );

    let o = run(kiln().args(["--json", "inspect"]).arg(&pe));
    let v: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&o.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(v["info"]["format"], "pe");
    assert_eq!(v["info"]["subsystem"], "console");
}

/// The committed lock stays signed by the embedded release key and valid.
#[test]
fn the_real_lock_verifies_with_the_embedded_key() {
    let lock = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/artifacts.lock");
    let o = run(kiln().args(["lock", "verify"]).arg(&lock));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let l = kiln::supply::lock::Lock::load_unverified(&lock).unwrap();
    use kiln::supply::lock::{Arch, Os};
    for (name, os, arch) in [
        ("kubelet", Os::Linux, Arch::Amd64),
        ("kubelet", Os::Linux, Arch::Arm64),
        ("kubelet", Os::Windows, Arch::Amd64),
        ("kubeadm", Os::Linux, Arch::Amd64),
        ("kubectl", Os::Windows, Arch::Amd64),
        ("containerd", Os::Linux, Arch::Arm64),
        ("containerd", Os::Windows, Arch::Amd64),
        ("runc", Os::Linux, Arch::Amd64),
        ("cni-plugins", Os::Linux, Arch::Amd64),
        ("crictl", Os::Linux, Arch::Arm64),
    ] {
        let a = l
            .find(name, os, arch)
            .unwrap_or_else(|| panic!("{name} {os}/{arch} missing"));
        assert!(a.verified.contains("sha256"), "{}", a.id());
    }
}

/// Every artifact the shipped image definitions require, for every arch they build, is in
/// the committed lock (so `kiln bake` gets past the lock lookup); the only ones it lacks are
/// the optional ones docs/lock-format.md names, each marked `optional` with a reason in its
/// definition; and the kube* entries carry the definitions' version.
#[test]
fn the_real_lock_covers_the_image_definitions() {
    use kiln::image_def::ImageDef;
    use kiln::supply::lock::{Arch, Os};
    // No public sha256 record of Windows crictl 1.36.0 was found, and none of the Windows CNI
    // plugins 1.9.1 when the lock was signed (docs/lock-format.md).
    let known_gaps = [
        ("crictl", Os::Windows, Arch::Amd64),
        ("cni-plugins", Os::Windows, Arch::Amd64),
    ];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let l = kiln::supply::lock::Lock::load_unverified(&root.join("images/artifacts.lock")).unwrap();
    let mut gaps_seen = Vec::new();
    for image in ["flatcar", "ubuntu", "windows"] {
        let path = root.join(format!("images/{image}.toml"));
        let def = ImageDef::parse(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
        for &arch in &def.arch {
            for p in &def.artifacts {
                match l.find(&p.name, def.os, arch) {
                    Some(a) => {
                        if ["kubelet", "kubeadm", "kubectl"].contains(&p.name.as_str()) {
                            assert_eq!(a.version, def.kubernetes.version, "{image}: {}", a.id());
                        }
                    }
                    None if known_gaps.contains(&(p.name.as_str(), def.os, arch)) => {
                        assert!(
                            p.optional && p.reason.as_deref().is_some_and(|r| r.len() > 40),
                            "{image}: {} is not in the lock, so it must be optional with a reason",
                            p.name
                        );
                        gaps_seen.push((p.name.clone(), def.os, arch));
                    }
                    None => panic!("{image}: {} {}/{arch} is not in the lock", p.name, def.os),
                }
            }
        }
    }
    // A gap that got pinned must leave the list (and docs/lock-format.md's table).
    for g in known_gaps {
        assert!(
            gaps_seen.iter().any(|s| (s.0.as_str(), s.1, s.2) == g),
            "{g:?} is pinned now: drop it from known_gaps and from docs/lock-format.md"
        );
    }
}

/// Every pin of the committed lock says how strong its record is, and cites only what a
/// reader can open (a repository, path and commit, or upstream's checksum URL), never a
/// search-index id: Linux pins cite two independent records or say `ONE SOURCE` /
/// `UNCITED RECORDS` first; Windows pins (one record at best) say `ONE SOURCE` first; each
/// OS carries one Kubernetes version.
#[test]
fn the_real_lock_states_the_strength_of_every_pin() {
    use kiln::supply::lock::{Lock, Os};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    assert!(
        !root.join("images/artifacts.lock.proposed").exists(),
        "the proposal was signed as the lock; a new proposal needs its own test"
    );
    let lock = Lock::load_unverified(&root.join("images/artifacts.lock")).unwrap();
    let commit = |t: &str| {
        t.split("at commit ")
            .skip(1)
            .any(|rest| rest.len() >= 40 && rest.as_bytes()[..40].iter().all(u8::is_ascii_hexdigit))
    };
    for a in &lock.artifacts {
        let v = &a.verified;
        for internal in ["find_string", "read_file", "search-index", "index id"] {
            assert!(
                !v.contains(internal),
                "{}: cites an internal id: {v}",
                a.id()
            );
        }
        assert!(
            v.contains(&format!("{}.sha256", a.url))
                || v.contains(".sha256sum")
                || v.contains(".sha256 file"),
            "{}: name upstream's checksum file: {v}",
            a.id()
        );
        let strong = v.contains("independent records") && commit(v);
        match a.os {
            Os::Linux => assert!(
                strong || v.starts_with("ONE SOURCE") || v.starts_with("UNCITED RECORDS"),
                "{}: a Linux pin cites two independent records or says it does not: {v}",
                a.id()
            ),
            Os::Windows => assert!(
                v.starts_with("ONE SOURCE") && commit(v),
                "{}: say how strong a Windows pin is and cite its record: {v}",
                a.id()
            ),
        }
    }
    for os in [Os::Linux, Os::Windows] {
        let mut kube: Vec<&str> = lock
            .artifacts
            .iter()
            .filter(|a| a.os == os && ["kubelet", "kubeadm", "kubectl"].contains(&a.name.as_str()))
            .map(|a| a.version.as_str())
            .collect();
        kube.dedup();
        assert_eq!(kube.len(), 1, "{os}: {kube:?}");
    }
}

/// `kiln lock audit` through the real binary: a signed lock whose containerd carries a known
/// advisory fails (exit 6) naming the pin, the advisory and the fixed release; a signed
/// waiver makes it pass until the waiver's last day and fail the day after; a waiver added
/// after signing is refused with the lock itself (exit 3); `--json` is one event per line.
#[test]
fn lock_audit_fails_on_an_unwaived_advisory_and_honours_signed_waivers() {
    let dir = tempfile::tempdir().unwrap();
    let (pk, sk) = test_keypair(dir.path(), "audit");
    let body = lock_text(
        "https://example.invalid/dl",
        &[
            FixtureArtifact::new("containerd", "containerd", noise(100, 7)),
            FixtureArtifact::new("runc", "runc.amd64", noise(100, 8)),
        ],
    )
    .replacen("version = \"1.0.0\"", "version = \"2.3.4\"", 1);
    let adv = dir.path().join("advisories.toml");
    std::fs::write(
        &adv,
        r#"version = 1

[[advisory]]
id = "CVE-2026-00001"
artifacts = ["containerd"]
affected = [{ introduced = "2.3.0", fixed = "2.3.6" }]
severity = "high"
summary = "crafted index exhausts memory"
published = ["https://www.cve.org/CVERecord?id=CVE-2026-00001"]

[[advisory]]
id = "CVE-2026-00002"
artifacts = ["runc"]
affected = [{ introduced = "1.5.0", fixed = "1.5.3" }]
severity = "low"
summary = "not the pinned runc's line"
published = ["https://www.cve.org/CVERecord?id=CVE-2026-00002"]
"#,
    )
    .unwrap();
    let audit = |lock: &std::path::Path, extra: &[&str]| {
        run(kiln()
            .args(["lock", "audit"])
            .arg(lock)
            .arg("--advisories")
            .arg(&adv)
            .arg("--trusted-key")
            .arg(&pk)
            .args(extra))
    };
    let lock = write_signed_lock(dir.path(), &body, &sk);
    let o = audit(&lock, &["--on", "2026-11-27"]);
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(6), "{text}");
    assert!(
        text.contains(
            "containerd@2.3.4/linux/amd64: CVE-2026-00001 (high, fixed in 2.3.6): NOT WAIVED"
        ),
        "{text}"
    );
    assert!(
        !text.contains("CVE-2026-00002"),
        "runc 1.0.0 is outside 1.5.x: {text}"
    );

    let waiver = "\n[[waiver]]\nadvisory = \"CVE-2026-00001\"\nartifact = \"containerd\"\nreason = \"no record of 2.3.6 yet\"\nmitigation = \"pull only from the site registry\"\nexpires = \"2026-12-31\"\n";
    // Added after signing: the lock no longer matches its signature, so nothing is audited.
    let unsigned_edit = format!("{body}{waiver}");
    std::fs::write(&lock, &unsigned_edit).unwrap();
    let o = audit(&lock, &["--on", "2026-11-27"]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));

    let lock = write_signed_lock(dir.path(), &unsigned_edit, &sk);
    let o = audit(&lock, &["--on", "2026-12-31"]);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("waived until 2026-12-31"),
        "{}",
        out_text(&o)
    );
    let o = audit(&lock, &["--on", "2027-01-01"]);
    assert_eq!(o.status.code(), Some(6), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("WAIVER EXPIRED on 2026-12-31"),
        "{}",
        out_text(&o)
    );

    let o = audit(&lock, &["--on", "2027-01-01", "--json"]);
    assert_eq!(o.status.code(), Some(6));
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert_eq!(events[0]["event"], "advisory");
    assert_eq!(events[0]["status"], "waiver_expired");
    assert_eq!(events[0]["fixed_in"], "2.3.6");
    let last = events.last().unwrap();
    assert_eq!(
        (last["event"].as_str(), last["ok"].as_bool()),
        (Some("result"), Some(false))
    );

    // A bad advisory file is refused naming it and the field.
    std::fs::write(&adv, "version = 1\n[[advisory]]\nid = \"X\"\nartifacts = [\"runc\"]\naffected = []\nseverity = \"low\"\nsummary = \"s\"\npublished = [\"https://x\"]\n").unwrap();
    let o = audit(&lock, &[]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        out_text(&o).contains("field `affected`"),
        "{}",
        out_text(&o)
    );
}

/// The committed lock carries no advisory of `images/advisories.toml` without a signed,
/// unexpired waiver (the same check `make test` runs as `make lock-audit`).
#[test]
fn the_real_lock_passes_its_advisory_audit() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = run(kiln()
        .args(["lock", "audit"])
        .arg(root.join("images/artifacts.lock"))
        .arg("--advisories")
        .arg(root.join("images/advisories.toml")));
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
}
