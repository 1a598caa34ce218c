//! Provenance and signatures that tools outside kiln verify (issue 39): a bake from the
//! fixture mirror with `--attest-key` writes an in-toto Statement v1 / SLSA Provenance v1
//! naming the layer and every input with its digest, the layer's signature and the
//! statement's DSSE envelope; Debian's real cosign (trixie's 2.5, unpacked by
//! `scripts/attest-tools.sh` into `target/attest-tools`, `KILN_COSIGN` names another) accepts them with
//! kiln's public key, offline, and refuses a flipped byte or another key.

use crate::bake_support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::support::out_text as text;
use bake_support::fixture_mirror::{bake_from_fixture, fixture_flags, read_only_fixture, standin};
use bake_support::{kiln, repo, sha256_file};

#[path = "../../testkit/optout.rs"]
mod optout;

pub(crate) fn cosign() -> Option<PathBuf> {
    let p = std::env::var_os("KILN_COSIGN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target/attest-tools/cosign"));
    if p.is_file() {
        return Some(p);
    }
    optout::cannot_run(
        "cosign",
        &format!(
            "no cosign at {} (run `scripts/attest-tools.sh target/attest-tools`; `make unit` does), so \
             kiln's signatures cannot be checked by the real tool",
            p.display()
        ),
    );
    None
}

pub(crate) fn bake(fx: &Path, out: &Path, key: &Path) -> Output {
    let id = "https://ci.example/runner/7";
    bake_from_fixture(
        fx,
        "ubuntu",
        "amd64",
        out,
        &[&"--attest-key", &key, &"--builder-id", &id],
    )
}

/// `cosign ARGS`; its verdict.
pub(crate) fn cosign_ok(cosign: &Path, args: &[&dyn AsRef<std::ffi::OsStr>]) -> (bool, String) {
    let mut c = Command::new(cosign);
    for a in args {
        c.arg(a);
    }
    // Offline: no Rekor, no TUF root; nothing may leave the machine.
    c.env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("SIGSTORE_NO_CACHE", "1")
        .env("TUF_ROOT", "/nonexistent");
    let o = c.output().unwrap();
    (o.status.success(), text(&o))
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one bake, then each verifier's acceptance and each tampering's refusal, in order"
)]
fn cosign_verifies_the_layer_and_its_provenance_and_refuses_tampering() {
    let Some(cosign) = cosign() else { return };
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let prefix = d.path().join("attest");
    let o = kiln()
        .args(["key", "generate"])
        .arg(&prefix)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let (key, public) = (d.path().join("attest.key"), d.path().join("attest.pub"));
    let out = d.path().join("out");
    let o = bake(&fx, &out, &key);
    assert!(o.status.success(), "{}", text(&o));
    let v = standin();
    let layer = out.join(format!("ubuntu-{v}-amd64.tar.zst"));
    let sig = out.join(format!("ubuntu-{v}-amd64.tar.zst.sig"));
    let statement = out.join(format!("ubuntu-{v}-amd64.provenance.json"));
    let envelope = out.join(format!("ubuntu-{v}-amd64.provenance.dsse.json"));

    // The statement: the layer as subject, the definition and every input with its digest.
    let st: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&statement).unwrap()).unwrap();
    assert_eq!(st["_type"], "https://in-toto.io/Statement/v1");
    assert_eq!(st["predicateType"], "https://slsa.dev/provenance/v1");
    assert_eq!(st["subject"][0]["digest"]["sha256"], sha256_file(&layer));
    let bd = &st["predicate"]["buildDefinition"];
    assert_eq!(
        bd["externalParameters"]["definition"]["sha256"],
        sha256_file(&repo().join("images/ubuntu.toml"))
    );
    assert_eq!(bd["externalParameters"]["kubernetesVersion"], v);
    assert_eq!(
        st["predicate"]["runDetails"]["builder"]["id"],
        "https://ci.example/runner/7"
    );
    let deps = bd["resolvedDependencies"].as_array().unwrap();
    let digest_of = |name: &str| {
        deps.iter()
            .find(|d| d["name"] == name)
            .map(|d| d["digest"]["sha256"].as_str().unwrap().to_string())
    };
    assert_eq!(
        digest_of("artifacts.lock"),
        Some(sha256_file(&fx.join("artifacts.lock")))
    );
    let lock = kiln::supply::lock::Lock::parse(
        &std::fs::read_to_string(fx.join("artifacts.lock")).unwrap(),
        &fx.join("artifacts.lock"),
    )
    .unwrap();
    for name in ["kubelet", "containerd", "runc", "cni-plugins", "crictl"] {
        let entry = lock
            .find(
                name,
                kiln::supply::lock::Os::Linux,
                kiln::supply::lock::Arch::Amd64,
            )
            .unwrap();
        assert_eq!(digest_of(name), Some(entry.sha256.clone()), "{name}");
    }
    assert!(digest_of("kiln-firstboot").is_some());
    // Nothing of it is in the layer's checksum file.
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).unwrap();
    assert!(
        !sums.contains("provenance") && !sums.contains(".sig"),
        "{sums}"
    );

    // cosign accepts both with kiln's public key.
    let (ok, t) = cosign_ok(
        &cosign,
        &[
            &"verify-blob",
            &"--key",
            &public,
            &"--signature",
            &sig,
            &"--insecure-ignore-tlog",
            &layer,
        ],
    );
    assert!(ok, "cosign verify-blob: {t}");
    let attestation = |blob: &Path, key: &Path| {
        cosign_ok(
            &cosign,
            &[
                &"verify-blob-attestation",
                &"--key",
                &key,
                &"--signature",
                &envelope,
                &"--type",
                &"slsaprovenance1",
                &"--insecure-ignore-tlog",
                &blob,
            ],
        )
    };
    let (ok, t) = attestation(&layer, &public);
    assert!(ok, "cosign verify-blob-attestation: {t}");

    // A flipped byte in the layer: both refuse.
    let tampered = d.path().join("tampered.tar.zst");
    let mut bytes = std::fs::read(&layer).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&tampered, &bytes).unwrap();
    let (ok, t) = cosign_ok(
        &cosign,
        &[
            &"verify-blob",
            &"--key",
            &public,
            &"--signature",
            &sig,
            &"--insecure-ignore-tlog",
            &tampered,
        ],
    );
    assert!(!ok, "verify-blob accepted a tampered layer: {t}");
    let (ok, t) = attestation(&tampered, &public);
    assert!(
        !ok,
        "verify-blob-attestation accepted a tampered layer: {t}"
    );
    // Another key: refused.
    let o = kiln()
        .args(["key", "generate"])
        .arg(d.path().join("other"))
        .output()
        .unwrap();
    assert!(o.status.success());
    let (ok, t) = attestation(&layer, &d.path().join("other.pub"));
    assert!(!ok, "verify-blob-attestation accepted another key: {t}");
    // A changed statement inside the envelope: refused.
    let mut env: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&envelope).unwrap()).unwrap();
    let payload = env["payload"].as_str().unwrap().to_string();
    env["payload"] = payload.replacen('A', "B", 1).into();
    let forged = d.path().join("forged.dsse.json");
    std::fs::write(&forged, env.to_string()).unwrap();
    let (ok, t) = cosign_ok(
        &cosign,
        &[
            &"verify-blob-attestation",
            &"--key",
            &public,
            &"--signature",
            &forged,
            &"--type",
            &"slsaprovenance1",
            &"--insecure-ignore-tlog",
            &layer,
        ],
    );
    assert!(!ok, "a changed statement verified: {t}");

    // The same inputs bake the same layer and the same layer signature (RFC 6979).
    let out2 = d.path().join("out2");
    let o = bake(&fx, &out2, &key);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read(&layer).unwrap(),
        std::fs::read(out2.join(layer.file_name().unwrap())).unwrap()
    );
    assert_eq!(
        std::fs::read(&sig).unwrap(),
        std::fs::read(out2.join(sig.file_name().unwrap())).unwrap()
    );
}

/// A key others can read, a symlink, or something that is not a P-256 key is refused before
/// the bake reads or writes anything, naming the file and what to do.
#[test]
fn a_key_kiln_should_not_use_is_refused_before_the_bake() {
    use std::os::unix::fs::PermissionsExt as _;
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let o = kiln()
        .args(["key", "generate"])
        .arg(d.path().join("k"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let key = d.path().join("k.key");
    let readable = d.path().join("readable.key");
    std::fs::copy(&key, &readable).unwrap();
    std::fs::set_permissions(&readable, std::fs::Permissions::from_mode(0o644)).unwrap();
    let link = d.path().join("link.key");
    std::os::unix::fs::symlink(&key, &link).unwrap();
    let public = d.path().join("k.pub");
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o600)).unwrap();
    for (bad, says) in [
        (&readable, "chmod 600"),
        (&link, "not a symlink"),
        (&public, "expected a PEM private key"),
    ] {
        let out = d.path().join("out");
        let o = bake(&fx, &out, bad);
        let t = text(&o);
        assert_eq!(o.status.code(), Some(1), "{}: {t}", bad.display());
        assert!(
            t.contains(&bad.display().to_string()) && t.contains(says),
            "{}: {t}",
            bad.display()
        );
        assert!(!out.exists(), "nothing written");
        assert!(
            !t.contains("PRIVATE KEY-----\n"),
            "no key material in the message"
        );
    }
}

/// `kiln verify --rebuild`: a fresh bake is identical to its rebuild (exit 0); a layer with
/// one file changed is not, and the message names that file (exit 3); a lock other than the
/// recorded one is refused before anything is rebuilt, naming it.
#[test]
fn verify_rebuild_passes_on_a_fresh_bake_and_names_a_changed_file() {
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let o = kiln()
        .args(["key", "generate"])
        .arg(d.path().join("k"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let out = d.path().join("out");
    let o = bake(&fx, &out, &d.path().join("k.key"));
    assert!(o.status.success(), "{}", text(&o));
    let layer = out.join(format!("ubuntu-{}-amd64.tar.zst", standin()));
    let verify = |layer: &Path, lock: &Path, provenance: Option<&Path>| {
        let mut c = kiln();
        c.args(["verify", "--rebuild"]).arg(layer);
        fixture_flags(&mut c, &fx).arg("--lock").arg(lock);
        if let Some(p) = provenance {
            c.arg("--provenance").arg(p);
        }
        c.output().unwrap()
    };
    let o = verify(&layer, &fx.join("artifacts.lock"), None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("identical to its rebuild"),
        "{}",
        text(&o)
    );

    // One file changed, everything else as baked: named.
    let changed = out.join(format!(
        "changed-{}",
        layer.file_name().unwrap().to_string_lossy()
    ));
    rewrite_one(&layer, &changed, "usr/lib/kiln/image.env");
    std::fs::copy(
        out.join(format!("ubuntu-{}-amd64.provenance.json", standin())),
        d.path().join("prov.json"),
    )
    .unwrap();
    let o = verify(
        &changed,
        &fx.join("artifacts.lock"),
        Some(&d.path().join("prov.json")),
    );
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(
        t.contains("first differing file usr/lib/kiln/image.env") && t.contains("contents differ"),
        "{t}"
    );

    // A special file is not read (a FIFO or /dev/zero would never end).
    let o = kiln()
        .args(["verify", "--rebuild", "/dev/zero"])
        .output()
        .unwrap();
    assert!(
        o.status.code() == Some(1) && text(&o).contains("found a character device"),
        "{}",
        text(&o)
    );

    // Another lock: refused, naming it, before a rebuild.
    let other = d.path().join("other.lock");
    let mut text_lock = std::fs::read_to_string(fx.join("artifacts.lock")).unwrap();
    text_lock.push_str("\n# another lock\n");
    std::fs::write(&other, text_lock).unwrap();
    let o = verify(&layer, &other, None);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(3), "{t}");
    assert!(t.contains(&format!("lock {}", other.display())), "{t}");
}

/// Writes `to`: the rootfs layer `from` with the contents of `path` changed (one byte more),
/// every other entry as it was, in the same order.
fn rewrite_one(from: &Path, to: &Path, path: &str) {
    let f = std::fs::File::open(from).unwrap();
    let mut ar = tar::Archive::new(zstd::stream::read::Decoder::new(f).unwrap());
    let w = zstd::stream::write::Encoder::new(std::fs::File::create(to).unwrap(), 3).unwrap();
    let mut b = tar::Builder::new(w);
    let mut hit = false;
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let mut h = e.header().clone();
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data).unwrap();
        if e.path().unwrap().to_string_lossy().trim_start_matches("./") == path {
            data.push(b'\n');
            h.set_size(data.len() as u64);
            h.set_cksum();
            hit = true;
        }
        b.append(&h, &data[..]).unwrap();
    }
    assert!(hit, "{path} is not in {}", from.display());
    b.into_inner().unwrap().finish().unwrap();
}
