//! Images from OCI registries (issue 16), through the real `kiln` binary against Debian's
//! `docker-registry` on loopback (TLS from a test CA, htpasswd auth), with skopeo and umoci
//! as independent readers of kiln's store, a fault-injecting token proxy in front of a
//! registry, and a fake registry serving crafted manifests.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::registry::{
    self, all_blobs_honest, hex, skopeo, ProxyFault, Registry, TestImage, PASSWORD, USER,
};
use support::server::Server;
use support::*;

fn amd64_pause() -> Vec<u8> {
    // A real static x86-64 binary (busybox-static) stands in for pause.
    std::fs::read("/bin/busybox").expect("busybox-static provides /bin/busybox")
}

struct Fx {
    dir: tempfile::TempDir,
    img: TestImage,
    pk: PathBuf,
    sk: PathBuf,
}

fn fixture() -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let img = registry::build_image(
        &dir.path().join("layout"),
        "test",
        &[
            ("amd64", amd64_pause()),
            ("arm64", noise(300_000, 2)),
            ("s390x", noise(200_000, 3)),
        ],
    );
    let (pk, sk) = test_keypair(dir.path(), "t");
    Fx { dir, img, pk, sk }
}

fn lock_for(fx: &Fx, reference: &str) -> PathBuf {
    let d = fx.dir.path().join("lock");
    std::fs::create_dir_all(&d).unwrap();
    let text = format!("version = 1\n{}", registry::image_entry(reference, &fx.img));
    write_signed_lock(&d, &text, &fx.sk)
}

fn sync(fx: &Fx, lock: &Path, to: &Path, extra: &[&str]) -> Output {
    run(kiln()
        .env_remove("KILN_REGISTRY_AUTH")
        .env("DOCKER_CONFIG", fx.dir.path().join("no-docker-config"))
        .args(["mirror", "sync", "--backoff-ms", "10"])
        .arg("--to")
        .arg(to)
        .arg("--lock")
        .arg(lock)
        .arg("--trusted-key")
        .arg(&fx.pk)
        .args(extra))
}

#[test]
fn sync_from_a_tls_registry_with_htpasswd_then_skopeo_and_umoci_read_the_store() {
    if !registry::tools_or_skip("oci-registry") {
        return;
    }
    let fx = fixture();
    let reg = Registry::start(&fx.dir.path().join("reg"), true);
    reg.push(&fx.img.layout, "test", "kiln/pause");
    let reference = format!("{}/kiln/pause:test", reg.host);
    let lock = lock_for(&fx, &reference);
    let creds = registry::docker_config(fx.dir.path(), &reg.host, USER, PASSWORD);
    let ca = reg.ca.clone().unwrap();
    let m = fx.dir.path().join("mirror");
    let args = [
        "--registry-auth",
        creds.to_str().unwrap(),
        "--registry-ca",
        ca.to_str().unwrap(),
    ];
    let o = sync(&fx, &lock, &m, &args);
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("1 images"),
        "{}",
        out_text(&o)
    );

    // The pinned platforms are there, the third (s390x) is not.
    let store = |d: &str| m.join("blobs/sha256").join(hex(d));
    assert!(store(&fx.img.index_digest).is_file());
    for (_, arch, md, blobs) in &fx.img.platforms {
        let want = arch != "s390x";
        assert_eq!(store(md).is_file(), want, "{arch} manifest");
        for b in blobs {
            assert_eq!(store(b).is_file(), want, "{arch} blob {b}");
        }
    }
    assert_eq!(all_blobs_honest(&m), 1 + 2 * 3);

    // A valid OCI layout that independent tools read.
    assert!(m.join("oci-layout").is_file());
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(m.join("index.json")).unwrap()).unwrap();
    assert_eq!(
        index["manifests"][0]["digest"],
        fx.img.index_digest.as_str()
    );
    assert_eq!(
        index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
        reference.as_str()
    );
    let oci = format!("oci:{}:{reference}", m.display());
    let raw = skopeo(&["inspect", "--raw", &oci]);
    assert!(raw.status.success(), "{}", out_text(&raw));
    // skopeo prints the document with a newline after it.
    let printed = raw.stdout.strip_suffix(b"\n").unwrap_or(&raw.stdout);
    assert_eq!(
        format!("sha256:{}", sha256_hex(printed)),
        fx.img.index_digest
    );
    let arm = skopeo(&["inspect", "--override-arch", "arm64", &oci]);
    assert!(arm.status.success(), "{}", out_text(&arm));
    let v: serde_json::Value = serde_json::from_slice(&arm.stdout).unwrap();
    assert_eq!(v["Architecture"], "arm64");
    assert_eq!(v["Layers"][0], fx.img.platforms[1].3[1].as_str());
    // skopeo copies the amd64 image out of kiln's store, checking every digest itself.
    let out = fx.dir.path().join("copied");
    let cp = skopeo(&[
        "copy",
        "--override-arch",
        "amd64",
        &oci,
        &format!("dir:{}", out.display()),
    ]);
    assert!(cp.status.success(), "{}", out_text(&cp));
    assert!(out.join(hex(&fx.img.platforms[0].3[1])).is_file());
    let ls = Command::new("umoci")
        .args(["ls", "--layout"])
        .arg(&m)
        .output()
        .unwrap();
    assert!(ls.status.success(), "{}", out_text(&ls));
    assert!(String::from_utf8_lossy(&ls.stdout).contains(&reference));

    // A second sync moves nothing.
    let o = sync(&fx, &lock, &m, &args);
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .contains("(7 manifests and blobs, 7 already present) in"),
        "{}",
        out_text(&o)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("present) in"));
    assert!(String::from_utf8_lossy(&o.stdout).contains(", 0 bytes transferred\n"));

    // kiln mirror verify: clean, then a corrupted layer is caught and a missing config named.
    let verify = || {
        run(kiln()
            .args(["mirror", "verify"])
            .arg(&m)
            .arg("--trusted-key")
            .arg(&fx.pk))
    };
    let o = verify();
    assert!(o.status.success(), "{}", out_text(&o));
    let arm_layer = store(&fx.img.platforms[1].3[1]);
    let mut bytes = std::fs::read(&arm_layer).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&arm_layer, bytes).unwrap();
    std::fs::remove_file(store(&fx.img.platforms[0].3[0])).unwrap();
    let o = verify();
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    let text = out_text(&o);
    assert!(
        text.contains("BAD blob") && text.contains(hex(&fx.img.platforms[1].3[1])),
        "{text}"
    );
    assert!(
        text.contains("MISSING")
            && text.contains(&format!("blob {} is missing", fx.img.platforms[0].3[0])),
        "{text}"
    );
}

#[test]
fn wrong_or_missing_credentials_fail_and_never_print_them() {
    if !registry::tools_or_skip("oci-registry") {
        return;
    }
    let fx = fixture();
    let reg = Registry::start(&fx.dir.path().join("reg"), true);
    reg.push(&fx.img.layout, "test", "kiln/pause");
    let lock = lock_for(&fx, &format!("{}/kiln/pause:test", reg.host));
    let ca = reg.ca.clone().unwrap();
    let m = fx.dir.path().join("mirror");
    let wrong = "WrongPass-77-hush";
    let creds = registry::docker_config(fx.dir.path(), &reg.host, USER, wrong);
    let o = sync(
        &fx,
        &lock,
        &m,
        &[
            "--registry-auth",
            creds.to_str().unwrap(),
            "--registry-ca",
            ca.to_str().unwrap(),
        ],
    );
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(text.contains("HTTP 401"), "{text}");
    assert!(!text.contains(wrong) && !text.contains(PASSWORD), "{text}");
    let b64 = std::fs::read_to_string(&creds).unwrap();
    let b64 = b64
        .split("\"auth\":\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap();
    assert!(!text.contains(b64), "{text}");
    // No credentials at all: the message says where kiln looked.
    let o = sync(&fx, &lock, &m, &["--registry-ca", ca.to_str().unwrap()]);
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(text.contains("no credentials for it were found"), "{text}");
    // Without the test CA the TLS handshake fails (the certificate is not trusted).
    let o = sync(
        &fx,
        &lock,
        &m,
        &[
            "--registry-auth",
            creds.to_str().unwrap(),
            "--attempts",
            "1",
        ],
    );
    assert_eq!(o.status.code(), Some(4), "{}", out_text(&o));
    assert!(!m
        .join("blobs/sha256")
        .join(hex(&fx.img.index_digest))
        .exists());
}

#[test]
fn the_fault_proxy_is_survived_and_no_wrong_blob_is_stored() {
    if !registry::tools_or_skip("oci-registry") {
        return;
    }
    let fx = fixture();
    let reg = Registry::start(&fx.dir.path().join("reg"), false);
    reg.push(&fx.img.layout, "test", "kiln/pause");
    let proxy = registry::Proxy::start(&reg.host);
    let lock = lock_for(&fx, &format!("{}/kiln/pause:test", proxy.host()));
    let creds = registry::docker_config(fx.dir.path(), &proxy.host(), USER, PASSWORD);
    let m = fx.dir.path().join("mirror");
    let args = [
        "--registry-auth",
        creds.to_str().unwrap(),
        "--registry-plain-http",
        &proxy.host(),
    ];
    let amd_layer = fx.img.platforms[0].3[1].clone();
    let arm_config = fx.img.platforms[1].3[0].clone();
    // Transient faults: retried (with Range resume) until the bytes are right.
    proxy.fault("/v2/", ProxyFault::Status(503));
    proxy.fault(&fx.img.index_digest, ProxyFault::Status(503));
    proxy.fault(&amd_layer, ProxyFault::ResetAfter(100_000));
    proxy.fault(&amd_layer, ProxyFault::TruncateAfter(50_000));
    proxy.fault(&amd_layer, ProxyFault::Status(429));
    proxy.fault(&arm_config, ProxyFault::ResetAfter(10));
    let o = sync(&fx, &lock, &m, &args);
    assert!(o.status.success(), "{}", out_text(&o));
    assert_eq!(proxy.pending(), 0, "every fault was served");
    assert_eq!(all_blobs_honest(&m), 7);
    // The layer was resumed: a request for it carried a Range (the proxy forwards it and the
    // registry answered 206).
    assert!(
        proxy
            .log()
            .iter()
            .any(|(p, s)| p.contains(&amd_layer) && *s == 206),
        "{:?}",
        proxy.log()
    );

    // Wrong bytes are refused (exit 3), nothing is stored under that digest; a clean rerun
    // completes.
    let m2 = fx.dir.path().join("mirror2");
    proxy.fault(&arm_config, ProxyFault::WrongBytes);
    let o = sync(&fx, &lock, &m2, &args);
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains(&format!("expected sha256 {}", hex(&arm_config))),
        "{text}"
    );
    assert!(!m2.join("blobs/sha256").join(hex(&arm_config)).exists());
    all_blobs_honest(&m2);
    assert!(
        !m2.join("index.json").exists(),
        "no layout entry for an incomplete image"
    );
    let o = sync(&fx, &lock, &m2, &args);
    assert!(o.status.success(), "{}", out_text(&o));
    assert_eq!(all_blobs_honest(&m2), 7);

    // A proxy that always answers 503 for a blob: the run ends (exit 4), naming the URL.
    let m3 = fx.dir.path().join("mirror3");
    proxy.always(&amd_layer, ProxyFault::Status(503));
    let o = sync(&fx, &lock, &m3, &[&args[..], &["--attempts", "2"]].concat());
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(
        text.contains(&format!("/v2/kiln/pause/blobs/{amd_layer}: HTTP 503")),
        "{text}"
    );
    assert!(!text.contains(PASSWORD), "{text}");
}

/// A fake registry (the loopback file server) serving crafted documents under pinned digests.
#[test]
fn crafted_manifests_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (pk, sk) = test_keypair(dir.path(), "t");
    let srv = Server::start();
    srv.add("/v2/", b"{}".to_vec());
    let put = |doc: &str| {
        let d = format!("sha256:{}", sha256_hex(doc.as_bytes()));
        srv.add(&format!("/v2/x/manifests/{d}"), doc.as_bytes().to_vec());
        d
    };
    let sized = |doc: &str| (put(doc), doc.len());
    let traversal = sized(
        r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"x","digest":"sha256:../../../../etc/passwd","size":3},"layers":[]}"#,
    );
    let index = |m: &str, size: usize| {
        put(&format!(
            r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{m}","size":{size},"platform":{{"os":"linux","architecture":"amd64"}}}}]}}"#
        ))
    };
    let cases = [
        (
            index(&traversal.0, traversal.1),
            "config: digest: expected sha256:",
        ),
        // The index states a smaller size than the manifest has: cut off, refused.
        (index(&traversal.0, 40), "received more"),
        (
            put(r#"{"schemaVersion":2,"mediaType":"text/html","manifests":[]}"#),
            "is not an OCI index",
        ),
        (put(r#"{"schemaVersion":1,"fsLayers":[]}"#), "schema 1"),
        (
            put(&format!(
                "{{\"schemaVersion\":2,\"pad\":\"{}\"}}",
                "x".repeat(5 << 20)
            )),
            "received more",
        ),
    ];
    let host = srv.addr.to_string();
    for (i, (digest, want)) in cases.iter().enumerate() {
        let d = dir.path().join(format!("case{i}"));
        std::fs::create_dir_all(&d).unwrap();
        let text = format!(
            "version = 1\n\n[[image]]\nname = \"x\"\nreference = \"{host}/x:t\"\ndigest = \"{digest}\"\nverified = \"crafted\"\nplatforms = [{{ os = \"linux\", arch = \"amd64\" }}]\n"
        );
        let lock = write_signed_lock(&d, &text, &sk);
        let m = d.join("m");
        let o = run(kiln()
            .args(["mirror", "sync", "--backoff-ms", "1", "--attempts", "1"])
            .arg("--to")
            .arg(&m)
            .arg("--lock")
            .arg(&lock)
            .arg("--trusted-key")
            .arg(&pk)
            .args(["--registry-plain-http", &host]));
        let out = out_text(&o);
        assert!(!o.status.success(), "case {i}: {out}");
        assert!(out.contains(want), "case {i} wants {want:?}: {out}");
        assert!(!m.join("index.json").exists(), "case {i}");
        assert!(!d.join("etc").exists() && !m.join("blobs/etc").exists());
    }
}

/// `kiln mirror pack` carries the images (each blob after the document naming it) and
/// `unpack` accepts only blobs reached from the lock's pinned digests.
#[test]
fn a_pack_carries_the_images_across_the_gap() {
    if !registry::tools_or_skip("oci-registry") {
        return;
    }
    let fx = fixture();
    let reg = Registry::start(&fx.dir.path().join("reg"), false);
    reg.push(&fx.img.layout, "test", "kiln/pause");
    let reference = format!("{}/kiln/pause:test", reg.host);
    let lock = lock_for(&fx, &reference);
    let m = fx.dir.path().join("mirror");
    let o = sync(&fx, &lock, &m, &["--registry-plain-http", &reg.host]);
    assert!(o.status.success(), "{}", out_text(&o));
    let pack = fx.dir.path().join("m.tar.zst");
    let mirror = |args: &[&str]| {
        run(kiln()
            .arg("mirror")
            .args(args)
            .arg("--trusted-key")
            .arg(&fx.pk))
    };
    let o = mirror(&["pack", m.to_str().unwrap(), "-o", pack.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out_text(&o));
    // `kiln fetch` pulls the same images into a build cache.
    let cache = fx.dir.path().join("cache");
    let o = run(kiln()
        .env("DOCKER_CONFIG", fx.dir.path().join("no-docker-config"))
        .arg("fetch")
        .arg(&lock)
        .arg("--cache")
        .arg(&cache)
        .arg("--trusted-key")
        .arg(&fx.pk)
        .args(["--registry-plain-http", &reg.host]));
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("fetch: 1 images"),
        "{}",
        out_text(&o)
    );
    assert_eq!(all_blobs_honest(&cache), 7);
    assert!(cache.join("index.json").is_file());
    drop(reg); // the far side of the gap has no registry
    let far = fx.dir.path().join("far");
    let o = mirror(&[
        "unpack",
        pack.to_str().unwrap(),
        "--to",
        far.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", out_text(&o));
    assert_eq!(all_blobs_honest(&far), 7);
    let raw = skopeo(&[
        "inspect",
        "--raw",
        &format!("oci:{}:{reference}", far.display()),
    ]);
    assert!(raw.status.success(), "{}", out_text(&raw));
    let o = mirror(&["verify", far.to_str().unwrap()]);
    assert!(o.status.success(), "{}", out_text(&o));

    // A pack that slips in a blob the lock does not reach (the unpinned s390x manifest, named
    // by the index but not kept) is refused.
    let s390x = &fx.img.platforms[2];
    let evil = fx.dir.path().join("evil.tar.zst");
    {
        let f = std::fs::File::create(&evil).unwrap();
        let mut t = tar::Builder::new(zstd::Encoder::new(f, 3).unwrap().auto_finish());
        let mut add = |name: &str, bytes: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.set_size(bytes.len() as u64);
            h.set_mode(0o644);
            h.set_entry_type(tar::EntryType::Regular);
            t.append_data(&mut h, name, bytes).unwrap();
        };
        add("artifacts.lock", &std::fs::read(&lock).unwrap());
        add(
            "artifacts.lock.minisig",
            &std::fs::read(format!("{}.minisig", lock.display())).unwrap(),
        );
        for d in [&fx.img.index_digest, &s390x.2] {
            let path = m.join("blobs/sha256").join(hex(d));
            let bytes = std::fs::read(&path)
                .or_else(|_| std::fs::read(fx.img.layout.join("blobs/sha256").join(hex(d))))
                .unwrap();
            add(&format!("blobs/sha256/{}", hex(d)), &bytes);
        }
        t.into_inner().unwrap();
    }
    let far2 = fx.dir.path().join("far2");
    let o = mirror(&[
        "unpack",
        evil.to_str().unwrap(),
        "--to",
        far2.to_str().unwrap(),
    ]);
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains(&format!("blob {} is not named by the lock", hex(&s390x.2))),
        "{text}"
    );
    assert!(!far2.join("blobs/sha256").join(hex(&s390x.2)).exists());
}
