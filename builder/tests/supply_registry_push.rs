//! A registry as the mirror (issue 16): `kiln mirror push --to oci://…` and
//! `kiln mirror sync --from oci://…` through the real `kiln` binary against Debian's
//! `docker-registry` on loopback (TLS from a test CA, htpasswd auth), with skopeo and curl as
//! independent clients of what kiln pushed, and the fault proxy serving wrong bytes.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use support::registry::{
    self, all_blobs_honest, hex, skopeo, ProxyFault, Registry, TestImage, PASSWORD, USER,
};
use support::server::Server;
use support::*;

const REPO: &str = "kiln/mirror";

/// A complete, signed mirror: two file artifacts served by the loopback file server and the
/// test image pulled from a plain loopback registry, made by `kiln mirror sync`.
struct Fx {
    dir: tempfile::TempDir,
    _files: Server,
    arts: Vec<FixtureArtifact>,
    img: TestImage,
    mirror: PathBuf,
    pk: PathBuf,
}

fn fixture() -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let files = Server::start();
    let arts = vec![
        FixtureArtifact::new("kubelet", "kubelet", noise(1_500_000, 7)),
        FixtureArtifact::new("crictl", "crictl.tar.gz", noise(200_000, 8)),
    ];
    for a in &arts {
        files.add(&format!("/up/{}", a.file_name), a.bytes.clone());
    }
    let img = registry::build_image(
        &dir.path().join("layout"),
        "test",
        &[
            (
                "amd64",
                std::fs::read("/bin/busybox").expect("busybox-static"),
            ),
            ("arm64", noise(300_000, 2)),
            ("s390x", noise(200_000, 3)),
        ],
    );
    let up = Registry::start(&dir.path().join("upstream"), false);
    up.push(&img.layout, "test", "kiln/pause");
    let (pk, sk) = test_keypair(dir.path(), "t");
    let text = format!(
        "{}{}",
        lock_text(&format!("{}/up", files.base()), &arts),
        registry::image_entry(&format!("{}/kiln/pause:test", up.host), &img)
    );
    let lock = write_signed_lock(dir.path(), &text, &sk);
    let mirror = dir.path().join("mirror");
    let o = run(kiln()
        .env("DOCKER_CONFIG", dir.path().join("no-docker-config"))
        .args(["mirror", "sync", "--backoff-ms", "10", "--to"])
        .arg(&mirror)
        .arg("--lock")
        .arg(&lock)
        .arg("--trusted-key")
        .arg(&pk)
        .args(["--registry-plain-http", &up.host]));
    assert!(o.status.success(), "{}", out_text(&o));
    Fx {
        dir,
        _files: files,
        arts,
        img,
        mirror,
        pk,
    }
}

/// `kiln mirror …` with the test key and no ambient docker credentials.
fn mirror(fx: &Fx, args: &[&str]) -> Output {
    run(kiln()
        .env_remove("KILN_REGISTRY_AUTH")
        .env("DOCKER_CONFIG", fx.dir.path().join("no-docker-config"))
        .arg("mirror")
        .args(args)
        .args(if args[0] == "verify" {
            &[][..]
        } else {
            &["--backoff-ms", "10"][..]
        })
        .arg("--trusted-key")
        .arg(&fx.pk))
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The TLS registry's client flags for kiln: credentials file and CA.
fn tls_args(fx: &Fx, reg: &Registry, password: &str) -> Vec<String> {
    let d = fx.dir.path().join(format!("creds-{}", password.len()));
    std::fs::create_dir_all(&d).unwrap();
    let creds = registry::docker_config(&d, &reg.host, USER, password);
    vec![
        "--registry-auth".into(),
        creds.display().to_string(),
        "--registry-ca".into(),
        reg.ca.as_ref().unwrap().display().to_string(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn skopeo_tls(reg: &Registry, args: &[&str]) -> Output {
    let cd = reg.cert_dir.as_ref().unwrap().display().to_string();
    let (dir_flag, creds) = if args[0] == "copy" {
        ("--src-cert-dir", format!("--src-creds={USER}:{PASSWORD}"))
    } else {
        ("--cert-dir", format!("--creds={USER}:{PASSWORD}"))
    };
    let mut all = vec![args[0], dir_flag, &cd, &creds];
    all.extend_from_slice(&args[1..]);
    skopeo(&all)
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario from its setup to its last assertion, each step depending on the one before; its helpers are in support/"
)]
fn push_then_skopeo_reads_it_then_sync_back_and_verify() {
    if !registry::tools_or_skip("oci-registry") {
        return;
    }
    let fx = fixture();
    let reg = Registry::start(&fx.dir.path().join("dst"), true);
    let to = format!("oci://{}/{REPO}", reg.host);
    let auth = tls_args(&fx, &reg, PASSWORD);
    let m = fx.mirror.to_str().unwrap();

    let o = mirror(&fx, &[&["push", m, "--to", &to][..], &strs(&auth)].concat());
    assert!(o.status.success(), "{}", out_text(&o));
    // 2 artifacts + 2 platform manifests + the image root + the lock = 6 manifests; blobs:
    // the empty config, 2 artifacts, 2 × (config, layer), the root, the lock and signature.
    assert!(
        stdout(&o).contains("6 manifests (0 already there), 10 blobs uploaded (0 already there)"),
        "{}",
        out_text(&o)
    );

    // skopeo reads each artifact: an OCI artifact whose one layer is the file, by its sha256.
    for a in &fx.arts {
        let tag = format!("{}-1.0.0-linux-amd64", a.name);
        let raw = skopeo_tls(
            &reg,
            &[
                "inspect",
                "--raw",
                &format!("docker://{}/{REPO}:{tag}", reg.host),
            ],
        );
        assert!(raw.status.success(), "{}", out_text(&raw));
        let v: serde_json::Value = serde_json::from_slice(&raw.stdout).unwrap();
        assert_eq!(v["artifactType"], "application/vnd.kiln.artifact.v1");
        let sha = sha256_hex(&a.bytes);
        assert_eq!(v["layers"][0]["digest"], format!("sha256:{sha}"));
        // One plain GET of the blob by the lock's sha256 gives the file (curl, not kiln).
        let got = Command::new("curl")
            .args(["-fsS", "--cacert"])
            .arg(reg.ca.as_ref().unwrap())
            .args(["-u", &format!("{USER}:{PASSWORD}")])
            .arg(format!("https://{}/v2/{REPO}/blobs/sha256:{sha}", reg.host))
            .output()
            .unwrap();
        assert!(got.status.success(), "{}", out_text(&got));
        assert!(got.stdout == a.bytes, "{} differs", a.name);
    }
    // The pinned platforms are images skopeo can copy, digests as pinned; s390x was not pushed.
    for (_, arch, md, blobs) in fx.img.platforms.iter().take(2) {
        let r = format!("docker://{}/{REPO}:image-pause-linux-{arch}", reg.host);
        let i = skopeo_tls(&reg, &["inspect", &r]);
        assert!(i.status.success(), "{}", out_text(&i));
        let v: serde_json::Value = serde_json::from_slice(&i.stdout).unwrap();
        assert_eq!(v["Digest"], md.as_str());
        let out = fx.dir.path().join(format!("copied-{arch}"));
        let cp = skopeo_tls(
            &reg,
            &["copy", "--quiet", &r, &format!("dir:{}", out.display())],
        );
        assert!(cp.status.success(), "{}", out_text(&cp));
        assert!(out.join(hex(&blobs[1])).is_file());
    }
    let s390x = skopeo_tls(
        &reg,
        &[
            "inspect",
            "--raw",
            &format!("docker://{}/{REPO}@{}", reg.host, fx.img.platforms[2].2),
        ],
    );
    assert!(!s390x.status.success(), "{}", out_text(&s390x));

    // Nothing new: nothing moves, and it is fast.
    let t = Instant::now();
    let o = mirror(&fx, &[&["push", m, "--to", &to][..], &strs(&auth)].concat());
    let took = t.elapsed();
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        stdout(&o).contains("6 manifests (6 already there), 0 blobs uploaded (1 already there)")
            && stdout(&o).contains(", 0 bytes uploaded"),
        "{}",
        out_text(&o)
    );
    eprintln!("re-push with nothing new took {took:?}");

    // Sync it back into an empty directory, the lock verified under the key.
    let back = fx.dir.path().join("back");
    let b = back.to_str().unwrap();
    let o = mirror(
        &fx,
        &[&["sync", "--from", &to, "--to", b][..], &strs(&auth)].concat(),
    );
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        stdout(&o).contains("1 images (7 manifests and blobs, 0 already present)"),
        "{}",
        out_text(&o)
    );
    assert!(stdout(&o).contains("2 artifacts in"), "{}", out_text(&o));
    assert_eq!(all_blobs_honest(&back), 2 + 7);
    assert_eq!(
        std::fs::read(back.join("artifacts.lock")).unwrap(),
        std::fs::read(fx.mirror.join("artifacts.lock")).unwrap()
    );
    let o = mirror(&fx, &["verify", b]);
    assert!(o.status.success(), "{}", out_text(&o));
    let reference = format!("oci:{}:", back.display());
    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(back.join("index.json")).unwrap()).unwrap();
    let name = idx["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"]
        .as_str()
        .unwrap();
    let raw = skopeo(&["inspect", "--raw", &format!("{reference}{name}")]);
    assert!(raw.status.success(), "{}", out_text(&raw));
    // Again: only what the directory lacks moves (nothing).
    let o = mirror(
        &fx,
        &[&["sync", "--from", &to, "--to", b][..], &strs(&auth)].concat(),
    );
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(stdout(&o).contains("7 already present"), "{}", out_text(&o));
    assert!(
        stdout(&o).contains("(2 already present), 0 bytes"),
        "{}",
        out_text(&o)
    );

    // `kiln fetch --mirror oci://…` fills a build cache from the registry mirror: artifacts
    // by their blob URL, images from the mirror (not their own, now gone, registry).
    let fetch = |cache: &Path, mirrors: &[&str]| {
        let mut c = kiln();
        c.env("DOCKER_CONFIG", fx.dir.path().join("no-docker-config"))
            .arg("fetch")
            .arg(fx.mirror.join("artifacts.lock"))
            .arg("--cache")
            .arg(cache)
            .arg("--trusted-key")
            .arg(&fx.pk)
            .args(["--backoff-ms", "10", "--attempts", "2"]);
        for m in mirrors {
            if m.starts_with("--") || !m.contains('/') {
                c.arg(m);
            } else {
                c.args(["--mirror", m]);
            }
        }
        run(c.args(strs(&auth)))
    };
    let cache = fx.dir.path().join("cache");
    let o = fetch(&cache, &[&to]);
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        stdout(&o).contains("fetch: 2 artifacts"),
        "{}",
        out_text(&o)
    );
    assert!(stdout(&o).contains("fetch: 1 images"), "{}", out_text(&o));
    assert_eq!(all_blobs_honest(&cache), 2 + 7);
    // A registry mirror that lacks the artifacts: the next mirror (a directory) delivers.
    let cache2 = fx.dir.path().join("cache2");
    let empty = format!("oci://{}/kiln/empty", reg.host);
    // (Only the file artifacts: images come from a registry, not from a directory.)
    let o = fetch(
        &cache2,
        &[&empty, m, "--name", "kubelet", "--name", "crictl"],
    );
    assert!(o.status.success(), "{}", out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("trying the next source"),
        "{}",
        out_text(&o)
    );
    assert!(cache2
        .join("blobs/sha256")
        .join(sha256_hex(&fx.arts[0].bytes))
        .is_file());

    // An unsigned lock in the registry is refused without --allow-unsigned.
    let unsigned = fx.dir.path().join("unsigned");
    std::fs::create_dir_all(&unsigned).unwrap();
    std::fs::copy(
        fx.mirror.join("artifacts.lock"),
        unsigned.join("artifacts.lock"),
    )
    .unwrap();
    copy_blobs(&fx.mirror, &unsigned);
    let to2 = format!("oci://{}/kiln/unsigned", reg.host);
    let push_unsigned = mirror(
        &fx,
        &[
            &[
                "push",
                unsigned.to_str().unwrap(),
                "--to",
                &to2,
                "--allow-unsigned",
            ][..],
            &strs(&auth),
        ]
        .concat(),
    );
    assert!(
        push_unsigned.status.success(),
        "{}",
        out_text(&push_unsigned)
    );
    let back2 = fx.dir.path().join("back2");
    let o = mirror(
        &fx,
        &[
            &["sync", "--from", &to2, "--to", back2.to_str().unwrap()][..],
            &strs(&auth),
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(!back2.join("artifacts.lock").exists());
}

fn copy_blobs(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.join("blobs/sha256")).unwrap();
    for e in std::fs::read_dir(from.join("blobs/sha256")).unwrap() {
        let e = e.unwrap();
        if !e.file_name().to_string_lossy().starts_with('.') {
            std::fs::copy(e.path(), to.join("blobs/sha256").join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn a_bad_password_names_the_registry_never_the_password_and_a_damaged_blob_is_refused() {
    if !registry::tools_or_skip("oci-registry") {
        return;
    }
    let fx = fixture();
    let reg = Registry::start(&fx.dir.path().join("dst"), true);
    let to = format!("oci://{}/{REPO}", reg.host);
    let m = fx.mirror.to_str().unwrap();
    let wrong = "WrongPass-99-hush";
    let o = mirror(
        &fx,
        &[
            &["push", m, "--to", &to, "--attempts", "1"][..],
            &strs(&tls_args(&fx, &reg, wrong)),
        ]
        .concat(),
    );
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(
        text.contains(&reg.host) && text.contains("HTTP 401"),
        "{text}"
    );
    assert!(!text.contains(wrong) && !text.contains(PASSWORD), "{text}");
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{wrong}"));
    assert!(!text.contains(&b64), "{text}");

    // A blob damaged on disk after the sync: the registry hashes the upload and refuses it;
    // kiln says which blob and exits 3, and pushes no lock naming it.
    let damaged = fx.dir.path().join("damaged");
    std::fs::create_dir_all(&damaged).unwrap();
    for f in ["artifacts.lock", "artifacts.lock.minisig"] {
        std::fs::copy(fx.mirror.join(f), damaged.join(f)).unwrap();
    }
    copy_blobs(&fx.mirror, &damaged);
    let sha = sha256_hex(&fx.arts[0].bytes);
    let p = damaged.join("blobs/sha256").join(&sha);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[1000] ^= 0xff;
    std::fs::write(&p, bytes).unwrap();
    let to2 = format!("oci://{}/kiln/damaged", reg.host);
    let o = mirror(
        &fx,
        &[
            &["push", damaged.to_str().unwrap(), "--to", &to2][..],
            &strs(&tls_args(&fx, &reg, PASSWORD)),
        ]
        .concat(),
    );
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains(&format!("do not hash to sha256:{sha}")),
        "{text}"
    );
    let lock = skopeo_tls(
        &reg,
        &[
            "inspect",
            "--raw",
            &format!("docker://{}/kiln/damaged:kiln-lock", reg.host),
        ],
    );
    assert!(
        !lock.status.success(),
        "no lock was pushed: {}",
        out_text(&lock)
    );

    // A blob missing from the mirror: named, exit 3, and nothing at all is sent.
    std::fs::remove_file(&p).unwrap();
    let to3 = format!("oci://{}/kiln/incomplete", reg.host);
    let o = mirror(
        &fx,
        &[
            &["push", damaged.to_str().unwrap(), "--to", &to3][..],
            &strs(&tls_args(&fx, &reg, PASSWORD)),
        ]
        .concat(),
    );
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains("nothing was pushed") && text.contains(&format!("blob {sha} is missing")),
        "{text}"
    );
    let tags = skopeo_tls(
        &reg,
        &[
            "list-tags",
            &format!("docker://{}/kiln/incomplete", reg.host),
        ],
    );
    assert!(
        !tags.status.success() || !stdout(&tags).contains("kiln-lock"),
        "{}",
        out_text(&tags)
    );
}

#[test]
fn wrong_bytes_from_the_registry_are_refused_and_nothing_wrong_is_stored() {
    if !registry::tools_or_skip("oci-registry") {
        return;
    }
    let fx = fixture();
    // A plain registry behind the token-auth fault proxy: pushed to and read through it.
    let reg = Registry::start(&fx.dir.path().join("plain"), false);
    let proxy = registry::Proxy::start(&reg.host);
    let d = fx.dir.path().join("pcreds");
    std::fs::create_dir_all(&d).unwrap();
    let creds = registry::docker_config(&d, &proxy.host(), USER, PASSWORD);
    let from = format!("oci://{}/{REPO}", proxy.host());
    let m = fx.mirror.to_str().unwrap();
    let push = |to: &str| {
        mirror(
            &fx,
            &[
                "push",
                m,
                "--to",
                to,
                "--registry-auth",
                creds.to_str().unwrap(),
                "--registry-plain-http",
                &proxy.host(),
            ],
        )
    };
    let o = push(&from);
    assert!(o.status.success(), "{}", out_text(&o));
    // The token was asked for with push scope on this repository.
    assert!(
        proxy.log().iter().any(|(p, s)| p.starts_with("/token")
            && p.contains("kiln%2Fmirror%3Apull%2Cpush")
            && *s == 200),
        "{:?}",
        proxy.log()
    );
    // An upload Location on another origin is refused: the token does not go there.
    proxy.fault("/blobs/uploads/", ProxyFault::ForeignLocation);
    let o = push(&format!("oci://{}/kiln/foreign", proxy.host()));
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(4), "{text}");
    assert!(text.contains("points to another origin"), "{text}");
    assert!(
        !text.contains(PASSWORD) && !text.contains("tok-4c1d-secret"),
        "{text}"
    );
    // A 503 on an upload's POST and on its PUT: retried (the PUT from a new POST), done.
    let art0 = sha256_hex(&fx.arts[0].bytes);
    proxy.fault("/kiln/retried/blobs/uploads/", ProxyFault::Status(503));
    proxy.fault(&format!("digest=sha256%3A{art0}"), ProxyFault::Status(503));
    let o = push(&format!("oci://{}/kiln/retried", proxy.host()));
    assert!(o.status.success(), "{}", out_text(&o));
    assert_eq!(proxy.pending(), 0, "{:?}", proxy.log());
    assert!(
        stdout(&o).contains("6 manifests (0 already there)"),
        "{}",
        out_text(&o)
    );
    let sync = |to: &Path| {
        mirror(
            &fx,
            &[
                "sync",
                "--from",
                &from,
                "--to",
                to.to_str().unwrap(),
                "--registry-auth",
                creds.to_str().unwrap(),
                "--registry-plain-http",
                &proxy.host(),
            ],
        )
    };
    let art = sha256_hex(&fx.arts[0].bytes);
    let layer = fx.img.platforms[1].3[1].clone();
    let into = fx.dir.path().join("into");
    proxy.fault(&art, ProxyFault::WrongBytes);
    let o = sync(&into);
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(text.contains(&format!("expected sha256 {art}")), "{text}");
    assert!(!into.join("blobs/sha256").join(&art).exists());
    assert!(
        !into.join("artifacts.lock").exists(),
        "no lock for an incomplete mirror"
    );
    all_blobs_honest(&into);
    // The same for an image layer.
    proxy.fault(&layer, ProxyFault::WrongBytes);
    let o = sync(&into);
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains(&format!("expected sha256 {}", hex(&layer))),
        "{text}"
    );
    assert!(!into.join("blobs/sha256").join(hex(&layer)).exists());
    assert!(!into.join("artifacts.lock").exists() && !into.join("index.json").exists());
    all_blobs_honest(&into);
    // A clean rerun completes that mirror, moving only what it lacks.
    let seen = proxy.log().len();
    let o = sync(&into);
    assert!(o.status.success(), "{}", out_text(&o));
    assert_eq!(all_blobs_honest(&into), 2 + 7);
    // A registry that moves a tag between two requests cannot mix two versions: a sync
    // resolves one tag (the lock artifact's) with one request, everything else by digest.
    let sync_log = &proxy.log()[seen..];
    let by_name: Vec<_> = sync_log
        .iter()
        .filter(|(p, _)| p.contains("/manifests/") || p.contains("/blobs/"))
        .filter(|(p, _)| !p.contains("sha256:") && !p.contains("sha256%3A"))
        .collect();
    assert_eq!(by_name.len(), 1, "{sync_log:?}");
    assert!(
        by_name[0].0.ends_with("/manifests/kiln-lock"),
        "{sync_log:?}"
    );
    // Transient faults (a reset mid-blob, a 503 for the lock) are survived.
    let fresh = fx.dir.path().join("fresh");
    proxy.fault(&art, ProxyFault::ResetAfter(100_000));
    proxy.fault("kiln-lock", ProxyFault::Status(503));
    let o = sync(&fresh);
    assert!(o.status.success(), "{}", out_text(&o));
    assert_eq!(proxy.pending(), 0);
    assert_eq!(all_blobs_honest(&fresh), 2 + 7);
    for d in [&into, &fresh] {
        let o = mirror(&fx, &["verify", d.to_str().unwrap()]);
        assert!(o.status.success(), "{}", out_text(&o));
    }
}

/// Bad `oci://` command lines are refused before anything is contacted or created.
#[test]
fn bad_oci_command_lines_are_refused_before_anything_happens() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).display().to_string();
    let cases: [(&[&str], &str); 4] = [
        (
            &["push", &d("none"), "--to", "oci://127.0.0.1:9/kiln/m"],
            "has no artifacts.lock: not a kiln mirror",
        ),
        (
            &["push", &d("none"), "--to", "oci://127.0.0.1:9/kiln/m:tag"],
            "without a :tag",
        ),
        (
            &["push", &d("none"), "--to", "https://127.0.0.1:9/kiln/m"],
            "expected oci://HOST[:PORT]/REPOSITORY",
        ),
        (
            &[
                "sync",
                "--from",
                "oci://127.0.0.1:9/kiln/m",
                "--from",
                &d("other"),
                "--to",
                &d("to"),
            ],
            "a registry mirror is synced on its own",
        ),
    ];
    for (args, want) in cases {
        let o = run(kiln().arg("mirror").args(args));
        let text = out_text(&o);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {text}");
        assert!(text.contains(want), "{args:?} wants {want:?}: {text}");
    }
    for n in ["none", "other", "to"] {
        assert!(!dir.path().join(n).exists(), "{n} was created");
    }
}

/// Issue 34 item 9c: a lock pulled from a registry mirror and signed by another key than the
/// trusted one is refused naming the registry's lock artifact, not a staging file deleted by
/// the time the message is read.
#[test]
fn a_wrong_key_on_a_registry_lock_names_the_registry() {
    if !registry::tools_or_skip("oci-registry") {
        return;
    }
    let fx = fixture();
    let reg = Registry::start(&fx.dir.path().join("dst"), true);
    let to = format!("oci://{}/{REPO}", reg.host);
    let auth = tls_args(&fx, &reg, PASSWORD);
    let m = fx.mirror.to_str().unwrap();
    let o = mirror(&fx, &[&["push", m, "--to", &to][..], &strs(&auth)].concat());
    assert!(o.status.success(), "{}", out_text(&o));
    let (other, _) = test_keypair(fx.dir.path(), "other");
    let back = fx.dir.path().join("back");
    let o = run(kiln()
        .env_remove("KILN_REGISTRY_AUTH")
        .env("DOCKER_CONFIG", fx.dir.path().join("no-docker-config"))
        .args([
            "mirror",
            "sync",
            "--backoff-ms",
            "10",
            "--from",
            &to,
            "--to",
        ])
        .arg(&back)
        .arg("--trusted-key")
        .arg(&other)
        .args(strs(&auth)));
    let text = out_text(&o);
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        text.contains(&format!("{to}:kiln-lock/artifacts.lock")),
        "{text}"
    );
    // Every lock file named is the registry's.
    assert_eq!(
        text.matches("artifacts.lock").count(),
        text.matches("kiln-lock/artifacts.lock").count(),
        "{text}"
    );
}
