//! A baked layer published with its proof and brought back only when it verifies (issue 39):
//! `kiln mirror push --layer` into Debian's `docker-registry` on loopback (distribution 2.8,
//! which has no referrers API, so the referrers tag schema is what is exercised), checked by
//! the real tools from outside kiln — trixie's `cosign verify` (its legacy `.sig` tag and its
//! OCI 1.1 referrer lookup), `cosign verify-attestation`, `oras discover`, and the in-toto
//! project's own schemas (`testkit/in_toto_check.py`) — then `kiln mirror sync --layer
//! --verify-key` and `kiln install --verify-key`, and each hostile change refused by name.

use crate::bake_provenance::{cosign, cosign_ok};
use crate::bake_support;
use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use bake_support::fixture_mirror::{bake_from_fixture, read_only_fixture, standin};
use bake_support::{kiln, repo};
use support::out_text as text;
use support::registry::Registry;

const REPO: &str = "kiln/mirror";

fn tools() -> PathBuf {
    repo().join("target/attest-tools")
}

/// A bake of the fixture's Ubuntu layer for `arch`, signed with `key`; its main file.
fn bake(fx: &Path, out: &Path, key: &Path, arch: &str) -> PathBuf {
    let o = bake_from_fixture(fx, "ubuntu", arch, out, &[&"--attest-key", &key]);
    assert!(o.status.success(), "{}", text(&o));
    out.join(format!("ubuntu-{}-{arch}.tar.zst", standin()))
}

fn keypair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let o = kiln()
        .args(["key", "generate"])
        .arg(dir.join(name))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    (
        dir.join(format!("{name}.key")),
        dir.join(format!("{name}.pub")),
    )
}

/// `kiln mirror push` of the fixture mirror to `reg`, with `layers` signed by `key`.
fn push(fx: &Path, reg: &Registry, layers: &[&Path], key: &Path) -> Output {
    let mut c = kiln();
    c.arg("mirror")
        .arg("push")
        .arg(fx.join("mirror"))
        .arg("--to")
        .arg(format!("oci://{}/{REPO}", reg.host))
        .args(["--registry-plain-http", &reg.host, "--trusted-key"])
        .arg(fx.join("keys/fixture.pub"))
        .arg("--attest-key")
        .arg(key);
    for l in layers {
        c.arg("--layer").arg(l);
    }
    c.output().unwrap()
}

/// `kiln mirror sync --from oci://… --layer NAME --verify-key PUB --to DIR`.
fn sync(fx: &Path, reg: &Registry, name: &str, public: &Path, to: &Path) -> Output {
    kiln()
        .args(["mirror", "sync", "--to"])
        .arg(to)
        .arg("--from")
        .arg(format!("oci://{}/{REPO}", reg.host))
        .args(["--registry-plain-http", &reg.host, "--trusted-key"])
        .arg(fx.join("keys/fixture.pub"))
        .args(["--layer", name, "--verify-key"])
        .arg(public)
        .output()
        .unwrap()
}

/// The layer manifest's digest `mirror push` printed for `name`.
fn pushed_digest(o: &Output, name: &str) -> String {
    let out = String::from_utf8_lossy(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.contains(&format!("layer {name} ")))
        .unwrap_or_else(|| panic!("no line for {name}: {out}"));
    let at = line.find("(sha256:").unwrap() + 1;
    line[at..at + 71].to_string()
}

fn cosign_verify(cosign: &Path, reference: &str, key: &Path, args: &[&str]) -> (bool, String) {
    let mut all: Vec<&dyn AsRef<std::ffi::OsStr>> = Vec::new();
    for a in args {
        all.push(a);
    }
    let key = key.to_path_buf();
    all.extend([
        &"--key" as &dyn AsRef<std::ffi::OsStr>,
        &key,
        &"--insecure-ignore-tlog",
        &"--allow-http-registry",
        &reference,
    ]);
    cosign_ok(cosign, &all)
}

fn curl(args: &[&str]) -> Vec<u8> {
    let o = Command::new("curl")
        .args(["-sSf"])
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "curl {args:?}: {}", text(&o));
    o.stdout
}

/// Stores `bytes` as manifest `reference` in the registry, as any client with push access can.
fn put_manifest(reg: &Registry, reference: &str, bytes: &[u8], media_type: &str) {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), bytes).unwrap();
    curl(&[
        "-X",
        "PUT",
        "-H",
        &format!("Content-Type: {media_type}"),
        "--data-binary",
        &format!("@{}", f.path().display()),
        &format!("http://{}/v2/{REPO}/manifests/{reference}", reg.host),
    ]);
}

fn get_manifest(reg: &Registry, reference: &str) -> Vec<u8> {
    curl(&[
        "-H",
        "Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json",
        &format!("http://{}/v2/{REPO}/manifests/{reference}", reg.host),
    ])
}

fn in_toto_check(file: &Path) -> (bool, String) {
    let o = Command::new(tools().join("venv/bin/python"))
        .arg(repo().join("testkit/in_toto_check.py"))
        .arg(file)
        .output()
        .unwrap();
    (o.status.success(), text(&o))
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|r| {
            r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one bake and push, then each outside verifier, the way back, and a forged signature"
)]
fn a_published_layer_is_what_cosign_oras_and_in_toto_accept_and_comes_back_verified() {
    if !support::registry::tools_or_skip("registry") {
        return;
    }
    let Some(cosign) = cosign() else { return };
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let (key, public) = keypair(d.path(), "attest");
    let (_, other) = keypair(d.path(), "other");
    let out = d.path().join("out");
    let layer = bake(&fx, &out, &key, "amd64");
    let name = layer.file_name().unwrap().to_string_lossy().into_owned();
    let base = name.trim_end_matches(".tar.zst");
    let envelope = out.join(format!("{base}.provenance.dsse.json"));

    // The in-toto project's schemas accept the statement, and refuse a misnamed field.
    let (ok, t) = in_toto_check(&envelope);
    assert!(ok && t.contains("2 subjects"), "{t}");
    let bad = d.path().join("bad.json");
    let st = std::fs::read_to_string(out.join(format!("{base}.provenance.json"))).unwrap();
    std::fs::write(
        &bad,
        st.replace("\"resolvedDependencies\"", "\"resolvedDependency\""),
    )
    .unwrap();
    let (ok, t) = in_toto_check(&bad);
    assert!(!ok && t.contains("resolvedDependency"), "{t}");

    let reg = Registry::start(&d.path().join("reg"), false);
    let o = push(&fx, &reg, &[&layer], &key);
    assert!(o.status.success(), "{}", text(&o));
    let digest = pushed_digest(&o, &name);
    assert!(
        text(&o).contains(&format!("listed by tag {}", digest.replace(':', "-"))),
        "distribution 2.8 has no referrers API: {}",
        text(&o)
    );
    let reference = format!("{}/{REPO}@{digest}", reg.host);

    // cosign: the image signature by its tag and as an OCI 1.1 referrer, and the provenance
    // attestation; another key is refused by each.
    for args in [&["verify"][..], &["verify", "--experimental-oci11"]] {
        let (ok, t) = cosign_verify(&cosign, &reference, &public, args);
        assert!(ok, "cosign {args:?}: {t}");
        let (ok, t) = cosign_verify(&cosign, &reference, &other, args);
        assert!(!ok, "cosign {args:?} accepted another key: {t}");
    }
    let att = ["verify-attestation", "--type", "slsaprovenance1"];
    let (ok, t) = cosign_verify(&cosign, &reference, &public, &att);
    assert!(ok, "cosign verify-attestation: {t}");
    let (ok, t) = cosign_verify(&cosign, &reference, &other, &att);
    assert!(!ok, "cosign verify-attestation accepted another key: {t}");

    // oras lists the four referrers.
    let o = Command::new(tools().join("oras"))
        .args(["discover", "--plain-http", "--format", "json", &reference])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let list = v["referrers"]
        .as_array()
        .or(v["manifests"].as_array())
        .unwrap();
    let mut types: Vec<&str> = list
        .iter()
        .map(|r| r["artifactType"].as_str().unwrap())
        .collect();
    types.sort_unstable();
    assert_eq!(
        types,
        [
            "application/spdx+json",
            "application/vnd.dev.cosign.artifact.sig.v1+json",
            "application/vnd.in-toto+json",
            "application/vnd.kiln.layer.signature.v1",
        ]
    );

    // Back into a mirror directory: the same five files, byte for byte.
    let back = d.path().join("back");
    let o = sync(&fx, &reg, &name, &public, &back);
    assert!(o.status.success(), "{}", text(&o));
    let layers = back.join("layers");
    for f in [
        name.clone(),
        format!("{name}.sig"),
        format!("{base}.provenance.json"),
        format!("{base}.provenance.dsse.json"),
        format!("{base}.spdx.json"),
    ] {
        assert_eq!(
            std::fs::read(layers.join(&f)).unwrap(),
            std::fs::read(out.join(&f)).unwrap(),
            "{f}"
        );
    }
    assert_eq!(names_in(&layers).len(), 5, "{:?}", names_in(&layers));
    // And installable with its provenance checked (no SHA256SUMS came with it).
    let root = d.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let o = kiln()
        .env("KILN_TRUSTED_KEY", fx.join("keys/fixture.pub"))
        .arg("install")
        .arg(layers.join(&name))
        .arg("--root")
        .arg(&root)
        .args(["--dry-run", "--allow-unverified", "--verify-key"])
        .arg(&public)
        .arg("--lock")
        .arg(fx.join("artifacts.lock"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("its provenance"), "{}", text(&o));

    // The key rotated: the same layer baked and pushed again with a new key. Both keys'
    // referrers are listed now, and a sync with either key takes the one that verifies.
    let (new_key, new_public) = keypair(d.path(), "rotated");
    let again = d.path().join("again");
    bake(&fx, &again, &new_key, "amd64");
    let o = push(&fx, &reg, &[&again.join(&name)], &new_key);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        pushed_digest(&o, &name),
        digest,
        "the same bytes, the same manifest"
    );
    for (k, to) in [(&new_public, "rotated-new"), (&public, "rotated-old")] {
        let o = sync(&fx, &reg, &name, k, &d.path().join(to));
        assert!(o.status.success(), "{}", text(&o));
    }

    // A forged image signature (one character of it changed): cosign and kiln refuse it.
    let hex = digest.trim_start_matches("sha256:");
    let sig_tag = format!("sha256-{hex}.sig");
    let m = String::from_utf8(get_manifest(&reg, &sig_tag)).unwrap();
    let v: serde_json::Value = serde_json::from_str(&m).unwrap();
    let sig = v["layers"][0]["annotations"]["dev.cosignproject.cosign/signature"]
        .as_str()
        .unwrap();
    let flipped = if sig.starts_with('M') { "N" } else { "M" };
    let forged = m.replacen(sig, &format!("{flipped}{}", &sig[1..]), 1);
    put_manifest(
        &reg,
        &sig_tag,
        forged.as_bytes(),
        "application/vnd.oci.image.manifest.v1+json",
    );
    let (ok, t) = cosign_verify(&cosign, &reference, &public, &["verify"]);
    assert!(!ok, "cosign verify accepted a forged signature: {t}");
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one fixture and registry, then each hostile change and its refusal, in order"
)]
fn hostile_layers_are_refused_naming_the_check_and_nothing_is_kept() {
    if !support::registry::tools_or_skip("registry") {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let fx = read_only_fixture(d.path());
    let (key, public) = keypair(d.path(), "attest");
    let (other_key, _) = keypair(d.path(), "other");
    let out = d.path().join("out");
    let amd = bake(&fx, &out, &key, "amd64");
    let arm = bake(&fx, &out, &key, "arm64");
    let name = |p: &Path| p.file_name().unwrap().to_string_lossy().into_owned();
    let reg = Registry::start(&d.path().join("reg"), false);

    // Pushed with another key than the one that signed it at bake time: nothing is sent.
    let o = push(&fx, &reg, &[&amd], &other_key);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("signed by another key"), "{}", text(&o));
    // The repository does not exist: the registry answers 404 NAME_UNKNOWN.
    let o = Command::new("curl")
        .args(["-s", &format!("http://{}/v2/{REPO}/tags/list", reg.host)])
        .output()
        .unwrap();
    let tags = String::from_utf8_lossy(&o.stdout);
    assert!(tags.contains("NAME_UNKNOWN"), "{tags}");

    let o = push(&fx, &reg, &[&amd, &arm], &key);
    assert!(o.status.success(), "{}", text(&o));
    let (da, db) = (
        pushed_digest(&o, &name(&amd)),
        pushed_digest(&o, &name(&arm)),
    );

    // A referrer pointing at another digest: the arm64 layer's referrers listed for amd64.
    let tag_of = |d: &str| format!("sha256-{}", d.trim_start_matches("sha256:"));
    let amd_index = get_manifest(&reg, &tag_of(&da));
    let arm_index = get_manifest(&reg, &tag_of(&db));
    put_manifest(
        &reg,
        &tag_of(&da),
        &arm_index,
        "application/vnd.oci.image.index.v1+json",
    );
    let to = d.path().join("m1");
    let o = sync(&fx, &reg, &name(&amd), &public, &to);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains(&format!("not the layer's manifest {da}")),
        "{}",
        text(&o)
    );
    assert!(
        names_in(&to.join("layers")).is_empty(),
        "{:?}",
        names_in(&to.join("layers"))
    );
    put_manifest(
        &reg,
        &tag_of(&da),
        &amd_index,
        "application/vnd.oci.image.index.v1+json",
    );

    // The attestation re-titled by the registry (its title is not signed) to overwrite
    // another layer's provenance files in DIR/layers/: refused, names come from the
    // signed statement.
    let mut index: serde_json::Value = serde_json::from_slice(&amd_index).unwrap();
    let att = index["manifests"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|e| e["artifactType"] == "application/vnd.in-toto+json")
        .unwrap();
    let m = get_manifest(&reg, att["digest"].as_str().unwrap());
    let mut v: serde_json::Value = serde_json::from_slice(&m).unwrap();
    v["layers"][0]["annotations"]["org.opencontainers.image.title"] =
        "victim.provenance.dsse.json".into();
    let forged = serde_json::to_vec(&v).unwrap();
    let digest = {
        use sha2::Digest as _;
        format!("sha256:{}", hex::encode(sha2::Sha256::digest(&forged)))
    };
    put_manifest(
        &reg,
        &digest,
        &forged,
        "application/vnd.oci.image.manifest.v1+json",
    );
    att["digest"] = digest.clone().into();
    att["size"] = forged.len().into();
    put_manifest(
        &reg,
        &tag_of(&da),
        &serde_json::to_vec(&index).unwrap(),
        "application/vnd.oci.image.index.v1+json",
    );
    let to = d.path().join("m0");
    let o = sync(&fx, &reg, &name(&amd), &public, &to);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("victim.provenance.dsse.json"),
        "{}",
        text(&o)
    );
    assert!(
        names_in(&to.join("layers")).is_empty(),
        "{:?}",
        names_in(&to.join("layers"))
    );
    put_manifest(
        &reg,
        &tag_of(&da),
        &amd_index,
        "application/vnd.oci.image.index.v1+json",
    );

    // The layer's bytes changed in the registry's own storage: refused, nothing kept.
    let lm: serde_json::Value =
        serde_json::from_slice(&get_manifest(&reg, &format!("layer-{}", name(&amd)))).unwrap();
    let blob = lm["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:");
    let data = reg
        .dir
        .join("data/docker/registry/v2/blobs/sha256")
        .join(&blob[..2])
        .join(blob)
        .join("data");
    let original = std::fs::read(&data).unwrap();
    let mut bytes = original.clone();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&data, &bytes).unwrap();
    let to = d.path().join("m2");
    let o = sync(&fx, &reg, &name(&amd), &public, &to);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains(blob), "{}", text(&o));
    assert!(
        names_in(&to.join("layers")).is_empty(),
        "{:?}",
        names_in(&to.join("layers"))
    );
    std::fs::write(&data, &original).unwrap();
    let o = sync(&fx, &reg, &name(&amd), &public, &to);
    assert!(o.status.success(), "restored: {}", text(&o));

    // Locally: a layer changed after signing, a provenance naming an entry the lock lacks.
    let install = |layer: &Path, lock: &Path| {
        let root = tempfile::tempdir().unwrap();
        kiln()
            .env("KILN_TRUSTED_KEY", fx.join("keys/fixture.pub"))
            .arg("install")
            .arg(layer)
            .arg("--root")
            .arg(root.path())
            .args(["--dry-run", "--allow-unverified", "--verify-key"])
            .arg(&public)
            .arg("--lock")
            .arg(lock)
            .output()
            .unwrap()
    };
    let lock = fx.join("artifacts.lock");
    let o = install(&amd, &lock);
    assert!(o.status.success(), "{}", text(&o));
    let edited = d.path().join("edited.lock");
    let text_lock = std::fs::read_to_string(&lock).unwrap();
    let kept: Vec<&str> = text_lock.split("\n[[artifact]]").collect();
    let without: Vec<&str> = kept
        .iter()
        .copied()
        .filter(|b| !(b.contains("name = \"runc\"") && b.contains("arch = \"amd64\"")))
        .collect();
    assert_eq!(
        without.len() + 1,
        kept.len(),
        "exactly one runc amd64 entry"
    );
    std::fs::write(&edited, without.join("\n[[artifact]]")).unwrap();
    let o = kiln()
        .args(["lock", "sign"])
        .arg(&edited)
        .arg("--secret-key")
        .arg(fx.join("keys/fixture.key"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = install(&amd, &edited);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("names lock entry runc") && text(&o).contains("does not have"),
        "{}",
        text(&o)
    );
    let changed = d.path().join("changed");
    std::fs::create_dir(&changed).unwrap();
    for f in names_in(&out) {
        std::fs::copy(out.join(&f), changed.join(&f)).unwrap();
    }
    let mut bytes = std::fs::read(&amd).unwrap();
    bytes.push(0);
    std::fs::write(changed.join(name(&amd)), bytes).unwrap();
    let o = install(&changed.join(name(&amd)), &lock);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("changed after it was signed"),
        "{}",
        text(&o)
    );
}
