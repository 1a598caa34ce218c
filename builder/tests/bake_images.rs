//! Container images baked into the layer (issue 16, "Baked into the node"): a lock with an
//! `[[image]]` whose blobs are in the store bakes, into rootfs and sysext layers alike, one OCI
//! archive per image under /usr/share/kiln/images holding only the layer's platform; skopeo and
//! umoci read it; containerd's config pins the sandbox image by digest; the import unit and
//! the SBOM name it. Hostile stores and locks are refused with errors naming image and digest.

// Both support trees include testkit/optout.rs; this test uses both.
#![allow(clippy::duplicate_mod)]

use crate::bake_support;
use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use bake_support::*;
use support::registry::{self, TestImage};

/// The reference the test lock pins: the one the shipped definitions name as their sandbox
/// image, so the bake pins containerd's sandbox_image to it. The image itself is the test's
/// (a busybox-static stand-in for pause), never anything registry.k8s.io served.
const REFERENCE: &str = "registry.k8s.io/pause:3.10.2";
const ARCHIVE: &str = "usr/share/kiln/images/pause.oci.tar";

struct ImgFx {
    fx: Fixture,
    img: TestImage,
    lock: PathBuf,
}

/// The bake fixture plus the test image (amd64: busybox-static as /pause; arm64 and s390x:
/// other bytes) in its store and an `[[image]]` for it in a copy of its lock.
fn image_fixture(bins: Bins, platforms: &[&str], lock_platforms: &str) -> ImgFx {
    let fx = fixture(bins);
    let plats: Vec<(&str, Vec<u8>)> = platforms
        .iter()
        .map(|a| match *a {
            "amd64" => (*a, std::fs::read("/bin/busybox").expect("busybox-static")),
            other => (other, format!("stand-in pause for {other}\n").into_bytes()),
        })
        .collect();
    let img = registry::build_image(&fx.dir.path().join("layout"), "t", &plats);
    registry::store_layout(&img.layout, &fx.store);
    let lock = fx.dir.path().join("images.lock");
    let text = std::fs::read_to_string(&fx.lock).unwrap();
    std::fs::write(
        &lock,
        format!(
            "{text}\n[[image]]\nname = \"pause\"\nreference = \"{REFERENCE}\"\ndigest = \"{}\"\nverified = \"test image built by the test\"\nplatforms = [{lock_platforms}]\n",
            img.index_digest
        ),
    )
    .unwrap();
    ImgFx { fx, img, lock }
}

fn bake(f: &ImgFx, image: &str, format: &str, arch: &str, out: &Path) -> std::process::Output {
    let fb = if arch == "arm64" {
        &f.fx.firstboot_arm64
    } else {
        &f.fx.firstboot
    };
    kiln()
        .arg("bake")
        .arg(repo().join("images").join(image))
        .args(["--format", format, "--arch", arch, "--out"])
        .arg(out)
        .arg("--lock")
        .arg(&f.lock)
        .arg("--allow-unsigned")
        .arg("--store")
        .arg(&f.fx.store)
        .arg("--firstboot")
        .arg(fb)
        .arg("--no-cache")
        .env("SOURCE_DATE_EPOCH", "1704067200")
        .output()
        .unwrap()
}

fn file_ending(dir: &Path, end: &str) -> PathBuf {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(end))
        .unwrap_or_else(|| panic!("no *{end} in {}", dir.display()))
}

/// Bakes the ubuntu rootfs and extracts it; returns the root.
fn baked_rootfs(f: &ImgFx) -> PathBuf {
    let out = f.fx.dir.path().join("out-rootfs");
    ok(
        &bake(f, "ubuntu.toml", "rootfs", "amd64", &out),
        "bake rootfs",
    );
    let root = f.fx.dir.path().join("root");
    std::fs::create_dir_all(&root).unwrap();
    let o = Command::new("tar")
        .arg("--zstd")
        .arg("-xf")
        .arg(file_ending(&out, ".tar.zst"))
        .arg("-C")
        .arg(&root)
        .output()
        .unwrap();
    ok(&o, "tar -x");
    root
}

fn run_ok(c: &mut Command, what: &str) -> String {
    let o = c
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e} (scripts/deps.sh installs it)"));
    ok(&o, what);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn blobs_of(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir.join("blobs/sha256"))
        .unwrap()
        .map(|e| format!("sha256:{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    v.sort();
    v
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario from its setup to its last assertion, each step depending on the one before; its helpers are in support/"
)]
fn the_layer_carries_the_platforms_image_and_tools_read_it() {
    if !registry::tools_or_skip("bake-images-tools") {
        return;
    }
    let f = image_fixture(
        Bins::Real,
        &["amd64", "arm64", "s390x"],
        "{ os = \"linux\", arch = \"amd64\" }, { os = \"linux\", arch = \"arm64\" }",
    );
    let root = baked_rootfs(&f);
    let archive = root.join(ARCHIVE);
    assert!(archive.is_file(), "{} missing", archive.display());

    // Only amd64's manifest, config and layer, plus the index as published.
    let x = f.fx.dir.path().join("x");
    std::fs::create_dir_all(&x).unwrap();
    run_ok(
        Command::new("tar")
            .arg("-xf")
            .arg(&archive)
            .arg("-C")
            .arg(&x),
        "tar -x archive",
    );
    let (_, _, amd_manifest, amd_blobs) = &f.img.platforms[0];
    let mut want = vec![f.img.index_digest.clone(), amd_manifest.clone()];
    want.extend(amd_blobs.iter().cloned());
    want.sort();
    assert_eq!(
        blobs_of(&x),
        want,
        "the archive holds exactly amd64's blobs"
    );
    for (_, arch, m, _) in &f.img.platforms[1..] {
        assert!(!blobs_of(&x).contains(m), "{arch}'s manifest was baked");
    }
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(x.join("index.json")).unwrap()).unwrap();
    let pinned = format!("registry.k8s.io/pause@{}", f.img.index_digest);
    let names: Vec<&str> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            m["annotations"]["io.containerd.image.name"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(names, [REFERENCE, pinned.as_str()]);

    // skopeo, an independent reader: the pinned index by tag and by digest, and its amd64
    // image (skopeo picks the host's platform from the index).
    let raw = run_ok(
        Command::new("skopeo")
            .args(["inspect", "--raw"])
            .arg(format!("oci-archive:{}:{REFERENCE}", archive.display())),
        "skopeo inspect --raw",
    );
    let idx_bytes = std::fs::read(
        f.img
            .layout
            .join("blobs/sha256")
            .join(f.img.index_digest.trim_start_matches("sha256:")),
    )
    .unwrap();
    assert_eq!(raw.as_bytes(), &idx_bytes[..]);
    let inspect = run_ok(
        Command::new("skopeo")
            .args([
                "inspect",
                "--override-arch",
                "amd64",
                "--override-os",
                "linux",
            ])
            .arg(format!("oci:{}:{pinned}", x.display())),
        "skopeo inspect oci:",
    );
    let v: serde_json::Value = serde_json::from_str(&inspect).unwrap();
    assert_eq!(v["Digest"], f.img.index_digest.as_str(), "{inspect}");
    assert_eq!(v["Architecture"], "amd64");
    assert_eq!(v["Layers"][0], amd_blobs[1].as_str(), "{inspect}");
    // umoci lists both names of the layout.
    let ls = run_ok(
        Command::new("umoci").args(["ls", "--layout"]).arg(&x),
        "umoci ls",
    );
    assert!(ls.lines().any(|l| l == REFERENCE), "{ls}");
    assert!(ls.lines().any(|l| l == pinned), "{ls}");

    // containerd's sandbox image is the baked one, by digest (tag kept for people).
    let cfg = std::fs::read_to_string(root.join("usr/lib/kiln/containerd/config.toml")).unwrap();
    assert!(
        cfg.contains(&format!(
            "sandbox_image = '{REFERENCE}@{}'",
            f.img.index_digest
        )),
        "{cfg}"
    );
    // The import unit, enabled, after containerd; nothing waits for it (contract, "Baked
    // images").
    let unit =
        std::fs::read_to_string(root.join("usr/lib/systemd/system/kiln-images.service")).unwrap();
    assert!(!unit.contains("Before="), "{unit}");
    for needle in [
        "After=containerd.service",
        "ExecStart=/usr/bin/ctr --namespace k8s.io images import --platform linux/amd64 /usr/share/kiln/images/pause.oci.tar",
    ] {
        assert!(unit.contains(needle), "{needle}\n{unit}");
    }
    let link = root.join("etc/systemd/system/multi-user.target.wants/kiln-images.service");
    assert_eq!(
        std::fs::read_link(&link).unwrap(),
        Path::new("/usr/lib/systemd/system/kiln-images.service")
    );
    // The layer's install manifest covers the archive like any other file.
    let manifest = std::fs::read_to_string(root.join("usr/lib/kiln/install.manifest")).unwrap();
    let sha = sha256_file(&archive);
    assert!(
        manifest.contains(&format!("{sha}  0644  /{ARCHIVE}")),
        "{manifest}"
    );

    // The SBOM: a package for the image with its digest, the archive generated from it.
    let out = f.fx.dir.path().join("out-rootfs");
    let sbom: serde_json::Value =
        serde_json::from_slice(&std::fs::read(file_ending(&out, ".spdx.json")).unwrap()).unwrap();
    let pkg = sbom["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["SPDXID"] == "SPDXRef-Image-pause")
        .expect("image package");
    assert_eq!(pkg["versionInfo"], f.img.index_digest.as_str());
    assert_eq!(
        pkg["checksums"][0]["checksumValue"],
        f.img.index_digest.trim_start_matches("sha256:")
    );
    let purl = pkg["externalRefs"][0]["referenceLocator"].as_str().unwrap();
    assert!(
        purl.starts_with(&format!(
            "pkg:oci/pause@sha256%3A{}?arch=amd64",
            f.img.index_digest.trim_start_matches("sha256:")
        )),
        "{purl}"
    );
    assert!(pkg["comment"].as_str().unwrap().contains(amd_manifest));
    let file = sbom["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["fileName"] == format!("./{ARCHIVE}"))
        .expect("archive in the SBOM");
    assert_eq!(file["checksums"][1]["checksumValue"], sha.as_str());
    assert!(sbom["relationships"].as_array().unwrap().iter().any(|r| {
        r["spdxElementId"] == file["SPDXID"]
            && r["relationshipType"] == "GENERATED_FROM"
            && r["relatedSpdxElement"] == "SPDXRef-Image-pause"
    }));

    // Valid SPDX 2.3 by the reference validator (as bake_sbom.rs checks layers without images).
    if let Some(v) = pyspdxtools() {
        assert_valid_spdx(&v, &file_ending(&out, ".spdx.json"));
    }

    // The sysext carries the same archive, byte for byte.
    let out = f.fx.dir.path().join("out-sysext");
    ok(
        &bake(&f, "flatcar.toml", "sysext", "amd64", &out),
        "bake sysext",
    );
    let sx = f.fx.dir.path().join("sx");
    run_ok(
        Command::new("unsquashfs")
            .arg("-d")
            .arg(&sx)
            .arg(file_ending(&out, ".raw")),
        "unsquashfs",
    );
    assert_eq!(sha256_file(&sx.join(ARCHIVE)), sha);
    let sunit =
        std::fs::read_to_string(sx.join("usr/lib/systemd/system/kiln-images.service")).unwrap();
    assert_eq!(sunit, unit);
    assert!(sx
        .join("usr/lib/systemd/system/multi-user.target.wants/kiln-images.service")
        .symlink_metadata()
        .is_ok());
}

#[test]
fn arm64_layers_get_arm64_and_lock_images_for_other_platforms_stay_out() {
    let f = image_fixture(
        Bins::Tiny,
        &["amd64", "arm64"],
        "{ os = \"linux\", arch = \"arm64\" }",
    );
    // arm64: its own manifest only, and the unit imports linux/arm64.
    let out = f.fx.dir.path().join("arm");
    ok(&bake(&f, "ubuntu.toml", "rootfs", "arm64", &out), "arm64");
    let list = run_ok(
        Command::new("tar")
            .arg("--zstd")
            .arg("-tvf")
            .arg(file_ending(&out, ".tar.zst")),
        "tar -t",
    );
    assert!(list.contains(ARCHIVE), "{list}");
    // amd64 is not pinned by this lock: no image, no unit, sandbox_image as the definition
    // wrote it.
    let out = f.fx.dir.path().join("amd");
    ok(&bake(&f, "ubuntu.toml", "rootfs", "amd64", &out), "amd64");
    let list = run_ok(
        Command::new("tar")
            .arg("--zstd")
            .arg("-tf")
            .arg(file_ending(&out, ".tar.zst")),
        "tar -t",
    );
    assert!(!list.contains("kiln/images"), "{list}");
    assert!(!list.contains("kiln-images.service"), "{list}");
}

fn fails_with(o: &std::process::Output, code: i32, needles: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!("{err}");
    assert_eq!(o.status.code(), Some(code), "{err}");
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in:\n{err}");
    }
}

#[test]
fn a_store_blob_that_is_not_its_digest_is_refused() {
    let f = image_fixture(
        Bins::Tiny,
        &["amd64"],
        "{ os = \"linux\", arch = \"amd64\" }",
    );
    // The layer blob: same size, other bytes (a store changed after it was verified).
    let layer = f.img.platforms[0].3[1].clone();
    let p =
        f.fx.store
            .join("blobs/sha256")
            .join(layer.trim_start_matches("sha256:"));
    let mut b = std::fs::read(&p).unwrap();
    b[100] ^= 0xff;
    std::fs::write(&p, &b).unwrap();
    let out = f.fx.dir.path().join("out");
    let o = bake(&f, "ubuntu.toml", "rootfs", "amd64", &out);
    fails_with(
        &o,
        3,
        &[
            "lock image pause (registry.k8s.io/pause:3.10.2)",
            &layer,
            "expected",
        ],
    );
    let published: Vec<_> = std::fs::read_dir(&out)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(
        published
            .iter()
            .all(|n| n.to_string_lossy().starts_with(".kiln-")),
        "{published:?}"
    );
    // A manifest that is not its digest is refused before anything is written.
    let f = image_fixture(
        Bins::Tiny,
        &["amd64"],
        "{ os = \"linux\", arch = \"amd64\" }",
    );
    let m = &f.img.platforms[0].2;
    let p =
        f.fx.store
            .join("blobs/sha256")
            .join(m.trim_start_matches("sha256:"));
    let text = std::fs::read_to_string(&p)
        .unwrap()
        .replace("layers", "layerz");
    std::fs::write(&p, text).unwrap();
    let o = bake(
        &f,
        "ubuntu.toml",
        "rootfs",
        "amd64",
        &f.fx.dir.path().join("o2"),
    );
    fails_with(&o, 3, &["lock image pause", m.as_str()]);
}

#[test]
fn a_lock_image_missing_from_the_store_is_named_with_its_digest() {
    let f = image_fixture(
        Bins::Tiny,
        &["amd64"],
        "{ os = \"linux\", arch = \"amd64\" }",
    );
    let config = f.img.platforms[0].3[0].clone();
    std::fs::remove_file(
        f.fx.store
            .join("blobs/sha256")
            .join(config.trim_start_matches("sha256:")),
    )
    .unwrap();
    let o = bake(
        &f,
        "ubuntu.toml",
        "rootfs",
        "amd64",
        &f.fx.dir.path().join("o"),
    );
    fails_with(
        &o,
        1,
        &[
            "lock image pause (registry.k8s.io/pause:3.10.2)",
            &config,
            "is not in the store",
            "kiln fetch",
        ],
    );
    // The whole image absent: the index digest is named.
    let f = image_fixture(
        Bins::Tiny,
        &["amd64"],
        "{ os = \"linux\", arch = \"amd64\" }",
    );
    std::fs::remove_file(
        f.fx.store
            .join("blobs/sha256")
            .join(f.img.index_digest.trim_start_matches("sha256:")),
    )
    .unwrap();
    let o = bake(
        &f,
        "ubuntu.toml",
        "rootfs",
        "amd64",
        &f.fx.dir.path().join("o"),
    );
    fails_with(
        &o,
        1,
        &["index", &f.img.index_digest, "is not in the store"],
    );
}

#[test]
fn an_image_for_another_platform_only_is_refused() {
    // The lock pins arm64, the image's index has amd64 only.
    let f = image_fixture(
        Bins::Tiny,
        &["amd64"],
        "{ os = \"linux\", arch = \"arm64\" }",
    );
    let o = bake(
        &f,
        "ubuntu.toml",
        "rootfs",
        "arm64",
        &f.fx.dir.path().join("o"),
    );
    fails_with(
        &o,
        1,
        &[
            "lock image pause",
            &f.img.index_digest,
            "no manifest for linux/arm64",
        ],
    );
}

#[test]
fn a_sandbox_tag_the_lock_does_not_pin_is_refused() {
    let f = image_fixture(
        Bins::Tiny,
        &["amd64"],
        "{ os = \"linux\", arch = \"amd64\" }",
    );
    let text = std::fs::read_to_string(&f.lock)
        .unwrap()
        .replace(REFERENCE, "registry.k8s.io/pause:3.10.1");
    std::fs::write(&f.lock, text).unwrap();
    let o = bake(
        &f,
        "ubuntu.toml",
        "rootfs",
        "amd64",
        &f.fx.dir.path().join("o"),
    );
    fails_with(
        &o,
        1,
        &[
            "containerd.sandbox_image (registry.k8s.io/pause:3.10.2)",
            "3.10.1",
        ],
    );
}

/// Debian's containerd on a temp root and socket, in a network namespace of its own (only a
/// loopback), started with the layer's own config.toml; killed on drop.
struct Containerd {
    child: std::process::Child,
    sock: PathBuf,
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ctr(sock: &Path, args: &[&str]) -> String {
    run_ok(
        Command::new("unshare")
            .arg("--net")
            .arg("/usr/bin/ctr")
            .arg("--address")
            .arg(sock)
            .args(args),
        &format!("ctr {args:?}"),
    )
}

fn start_containerd(root: &Path, dir: &Path) -> Option<Containerd> {
    for t in ["containerd", "ctr", "unshare", "ip"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()))
            .unwrap_or(false);
        if !found {
            optout::cannot_run(
                "bake-images-containerd",
                &format!("`{t}` is not installed (scripts/deps.sh installs containerd)"),
            );
            return None;
        }
    }
    let sock = dir.join("containerd.sock");
    let baked = std::fs::read_to_string(root.join("usr/lib/kiln/containerd/config.toml")).unwrap();
    let cfg = dir.join("config.toml");
    let (head, tables) = baked.split_at(baked.find("\n[").unwrap());
    std::fs::write(
        &cfg,
        format!(
            "{head}\nroot = '{r}'\nstate = '{s}'\n\n[grpc]\n  address = '{a}'\n{tables}",
            r = dir.join("root").display(),
            s = dir.join("state").display(),
            a = sock.display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
    let child = Command::new("unshare")
        .arg("--net")
        .arg("sh")
        .arg("-c")
        .arg("ip link set lo up && exec containerd --config \"$0\"")
        .arg(&cfg)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("unshare containerd");
    let c = Containerd { child, sock };
    let t = std::time::Instant::now();
    while !c.sock.exists() {
        assert!(
            t.elapsed() < std::time::Duration::from_secs(30),
            "containerd did not start: {}",
            std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    Some(c)
}

#[test]
fn containerd_imports_the_baked_image_offline_and_again_harmlessly() {
    if !registry::tools_or_skip("bake-images-tools") {
        return;
    }
    let f = image_fixture(
        Bins::Real,
        &["amd64", "arm64"],
        "{ os = \"linux\", arch = \"amd64\" }, { os = \"linux\", arch = \"arm64\" }",
    );
    let root = baked_rootfs(&f);
    let dir = f.fx.dir.path().join("ctd");
    std::fs::create_dir_all(&dir).unwrap();
    let Some(c) = start_containerd(&root, &dir) else {
        return;
    };
    // containerd 1.6 read the layer's config and took the sandbox image pinned by digest.
    let pinned = format!("registry.k8s.io/pause@{}", f.img.index_digest);
    let dump = run_ok(
        Command::new("containerd")
            .arg("--config")
            .arg(dir.join("config.toml"))
            .args(["config", "dump"]),
        "containerd config dump",
    );
    assert!(
        dump.contains(&format!(
            "sandbox_image = \"{REFERENCE}@{}\"",
            f.img.index_digest
        )),
        "{dump}"
    );
    // The snapshotters the config disables are ones containerd 1.6 knows (a misspelt ID
    // would be ignored silently and the probe would still run): none of them is loaded,
    // while the CRI plugin and its overlayfs snapshotter are.
    let cfg = std::fs::read_to_string(root.join("usr/lib/kiln/containerd/config.toml")).unwrap();
    let plugins = ctr(&c.sock, &["plugins", "ls"]);
    let status = |id: &str| {
        plugins.lines().find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.len() >= 4 && format!("{}.{}", w[0], w[1]) == id).then(|| w[w.len() - 1].to_string())
        })
    };
    for on in [
        "io.containerd.snapshotter.v1.overlayfs",
        "io.containerd.grpc.v1.cri",
    ] {
        assert_eq!(status(on).as_deref(), Some("ok"), "{on}:\n{plugins}");
    }
    for off in ["aufs", "btrfs", "devmapper", "zfs"] {
        let id = format!("io.containerd.snapshotter.v1.{off}");
        assert!(
            cfg.contains(&id),
            "{id} not disabled by the baked config:\n{cfg}"
        );
        assert_eq!(status(&id), None, "{id} was loaded:\n{plugins}");
    }
    // (Without the list, Debian's containerd 1.6 lists aufs, btrfs and zfs as `skip` and
    // devmapper as `error`: the check above fails on a config that does not disable them.)
    // The unit's own command lines, with the test's socket and the extracted layer's paths,
    // each in a namespace with no network: the import needs no registry.
    let unit =
        std::fs::read_to_string(root.join("usr/lib/systemd/system/kiln-images.service")).unwrap();
    let import = |what: &str| {
        let t = std::time::Instant::now();
        for line in unit.lines().filter_map(|l| l.strip_prefix("ExecStart=")) {
            let words: Vec<String> = line
                .split_whitespace()
                .skip(1)
                .map(|w| match w.strip_prefix('/') {
                    Some(rel) if rel.starts_with("usr/share/kiln") => {
                        root.join(rel).display().to_string()
                    }
                    _ => w.to_string(),
                })
                .collect();
            let args: Vec<&str> = words.iter().map(String::as_str).collect();
            ctr(&c.sock, &args);
        }
        eprintln!("{what}: {:?}", t.elapsed());
    };
    import("first import");
    let images = ctr(&c.sock, &["-n", "k8s.io", "images", "ls"]);
    for name in [REFERENCE, pinned.as_str()] {
        let line = images
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} not imported:\n{images}"));
        assert!(line.contains(&f.img.index_digest), "{line}");
        assert!(line.contains("linux/amd64"), "{line}");
    }
    // Unpacked into the overlayfs snapshotter, as the CRI plugin needs.
    let snaps = ctr(&c.sock, &["-n", "k8s.io", "snapshots", "ls"]);
    assert!(snaps.contains("Committed"), "{snaps}");
    // Ready for this host's platform (amd64): every blob there and unpacked; arm64's content
    // was never in the archive.
    let ready = ctr(&c.sock, &["-n", "k8s.io", "images", "check", "-q"]);
    for name in [REFERENCE, pinned.as_str()] {
        assert!(
            ready.lines().any(|l| l == name),
            "{name} not ready:\n{ready}"
        );
    }
    let index_json = run_ok(
        Command::new("tar")
            .arg("-xOf")
            .arg(root.join(ARCHIVE))
            .arg("index.json"),
        "tar -xO index.json",
    );
    let transient = format!("sha256:{}", support::sha256_hex(index_json.as_bytes()));
    let durable = |listing: String| -> Vec<String> {
        let mut v: Vec<String> = listing
            .lines()
            .filter(|l| *l != transient)
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    let content = durable(ctr(&c.sock, &["-n", "k8s.io", "content", "ls", "-q"]));
    // The index, amd64's manifest, config and layer: nothing else stays.
    let mut want = vec![f.img.index_digest.clone(), f.img.platforms[0].2.clone()];
    want.extend(f.img.platforms[0].3.iter().cloned());
    want.sort();
    assert_eq!(content, want);

    // A second boot imports again: same images, same content. The archive's own index.json is stored by the importer under
    // a lease and removed by containerd's garbage collector some time later, so whether it is
    // listed depends on timing: it is left out of both listings.
    import("second import");
    assert_eq!(ctr(&c.sock, &["-n", "k8s.io", "images", "ls"]), images);
    let again = durable(ctr(&c.sock, &["-n", "k8s.io", "content", "ls", "-q"]));
    assert_eq!(
        again, content,
        "the second import changed the content store"
    );
    drop(c);
}
