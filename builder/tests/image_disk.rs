//! `kiln image`: real base disks (sgdisk/sfdisk + mkfs.ext4 -d + dd), run as root through a
//! loop device, and the output read back with debugfs and `qemu-img check`/`info`.

use crate::image_support;

use std::path::Path;
use std::process::Command;

use image_support::*;

const TOOLS: &[&str] = &[
    "sgdisk",
    "sfdisk",
    "mkfs.ext4",
    "debugfs",
    "qemu-img",
    "losetup",
    "mount",
];

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn stdout(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `qemu-img info`. A fixed VHD probes as raw (its only header is a footer), so the
/// driver is named for it, as importers that are told "VHD" do.
fn qemu_info(p: &Path, driver: Option<&str>) -> serde_json::Value {
    let mut c = Command::new("qemu-img");
    c.args(["info", "--output=json"]);
    if let Some(d) = driver {
        c.args(["-f", d]);
    }
    let o = sh(c.arg(p));
    serde_json::from_slice(&o.stdout).unwrap()
}

fn to_raw(p: &Path, fmt: &str, raw: &Path) {
    sh(Command::new("qemu-img")
        .args(["convert", "-f", fmt, "-O", "raw"])
        .arg(p)
        .arg(raw));
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario from its setup to its last assertion, each step depending on the one before; its helpers are in support/"
)]
fn qcow2_gpt_base_becomes_a_node_in_every_format() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let layer = layer(&fx, "3.10", &d.join("out"));
    let raw_base = gpt_base(d);
    let root_at = part_offset(&raw_base, 2);
    let base = d.join("base.qcow2");
    sh(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&raw_base)
        .arg(&base));
    let base_sum = sha256_file(&base);
    let before = tree_at(&raw_base, root_at, d);
    let outdir = d.join("images");
    std::fs::create_dir_all(&outdir).unwrap();

    // raw first: its tree is what every other format must hold.
    let raw_out = outdir.join("node.raw");
    let o = image(&[
        &"--base",
        &base,
        &"--layer",
        &layer,
        &"--out",
        &raw_out,
        &"--format",
        &"raw",
    ]);
    ok(&o, "kiln image --format raw");
    let text = stdout(&o);
    assert!(
        text.contains("root is partition 2 (ext4) at byte 8388608"),
        "{text}"
    );
    assert!(text.contains("(qcow2, GPT table)"), "{text}");
    assert_eq!(sha256_file(&base), base_sum, "the base was written");
    let after = tree_at(&raw_out, root_at, d);
    // The base's own files are kept; the layer's are added, with the install manifest.
    for line in &before {
        assert!(after.contains(line), "lost or changed: {line}\n{after:#?}");
    }
    let has = |p: &str| after.iter().any(|l| l.split(' ').nth(4) == Some(p));
    for p in [
        "usr/bin/kubelet",
        "usr/lib/kiln/install.manifest",
        "usr/lib/kiln/image.env",
    ] {
        assert!(has(p), "{p} missing: {after:#?}");
    }
    let link = "etc/systemd/system/multi-user.target.wants/kiln-firstboot.service";
    let l = after
        .iter()
        .find(|l| l.ends_with(&format!("{link} ")))
        .unwrap();
    assert!(
        l.starts_with("l 777 ") && l.contains("/usr/lib/systemd/system/kiln-firstboot.service"),
        "{l}"
    );
    // The partition table and the other partition are the base's.
    let table = |p: &Path| {
        let o = sh(Command::new("sgdisk").arg("-p").arg(p));
        // The first line names the file.
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .skip(1)
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(table(&raw_out), table(&raw_base));

    for (fmt, driver) in [
        ("qcow2", "qcow2"),
        ("vhd", "vpc"),
        ("vhdx", "vhdx"),
        ("vmdk", "vmdk"),
    ] {
        let out = outdir.join(format!("node.{fmt}"));
        let o = image(&[
            &"--base",
            &base,
            &"--layer",
            &layer,
            &"--out",
            &out,
            &"--format",
            &fmt,
        ]);
        ok(&o, &format!("kiln image --format {fmt}"));
        let info = qemu_info(&out, (fmt == "vhd").then_some(driver));
        assert_eq!(info["format"], driver, "{fmt}: {info}");
        if fmt == "vmdk" {
            let sub = &info["format-specific"]["data"]["create-type"];
            assert_eq!(sub, "streamOptimized", "{info}");
        }
        if fmt == "vhd" {
            // Azure: a fixed VHD, whole MiB, the "conectix" footer as the last 512 bytes.
            let bytes = std::fs::read(&out).unwrap();
            let footer = &bytes[bytes.len() - 512..];
            assert_eq!(&footer[..8], b"conectix");
            assert_eq!(
                u32::from_be_bytes(footer[60..64].try_into().unwrap()),
                2,
                "disk type fixed"
            );
            assert_eq!(info["virtual-size"].as_u64().unwrap() % (1 << 20), 0);
        } else {
            // qemu-img check: the format's own consistency check (vpc has none).
            let c = Command::new("qemu-img")
                .args(["check", "-f", driver])
                .arg(&out)
                .output()
                .unwrap();
            assert!(
                c.status.success(),
                "qemu-img check {fmt}: {}{}",
                stdout(&c),
                stderr(&c)
            );
        }
        let back = d.join(format!("back-{fmt}.raw"));
        to_raw(&out, driver, &back);
        assert_eq!(
            tree_at(&back, root_at, d),
            after,
            "{fmt} holds another tree"
        );
        std::fs::remove_file(&back).unwrap();
    }
    // A fixed VHD as the base: read as a VHD (its footer is not part of the disk).
    let again = outdir.join("again.raw");
    let o = image(&[
        &"--base",
        &outdir.join("node.vhd"),
        &"--layer",
        &layer,
        &"--out",
        &again,
        &"--format",
        &"raw",
    ]);
    ok(&o, "kiln image on a VHD base");
    assert!(stdout(&o).contains("(vpc, GPT table)"), "{}", stdout(&o));
    assert_eq!(std::fs::metadata(&again).unwrap().len(), 64 << 20);
    assert_eq!(tree_at(&again, root_at, d), after);
    std::fs::remove_file(&again).unwrap();
    std::fs::remove_file(d.join("images/again.raw.spdx.json")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&raw_out).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    assert_eq!(
        leftovers(
            &outdir,
            &[
                "node.raw",
                "node.qcow2",
                "node.vhd",
                "node.vhdx",
                "node.vmdk"
            ]
        ),
        Vec::<String>::new()
    );
    assert_eq!(loops_in(&outdir), Vec::<String>::new());
    assert_eq!(sha256_file(&base), base_sum, "the base was written");
}

#[test]
fn same_base_and_layer_give_the_same_tree_and_rerunning_changes_nothing() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let layer = layer(&fx, "3.10", &d.join("out"));
    let base = gpt_base(d);
    let at = part_offset(&base, 2);
    let (a, b) = (d.join("a.raw"), d.join("b.raw"));
    ok(
        &image(&[
            &"--base",
            &base,
            &"--layer",
            &layer,
            &"--out",
            &a,
            &"--format",
            &"raw",
        ]),
        "first",
    );
    ok(
        &image(&[
            &"--base",
            &base,
            &"--layer",
            &layer,
            &"--out",
            &b,
            &"--format",
            &"raw",
        ]),
        "second",
    );
    let ta = tree_at(&a, at, d);
    assert_eq!(ta, tree_at(&b, at, d));
    // A node image as the base, with the same layer: nothing to write (kiln install's
    // idempotence), no --replace needed.
    let c = d.join("c.raw");
    let o = image(&[
        &"--base",
        &a,
        &"--layer",
        &layer,
        &"--out",
        &c,
        &"--format",
        &"raw",
    ]);
    ok(&o, "node as base, same layer");
    assert!(stdout(&o).contains("wrote 0, unchanged"), "{}", stdout(&o));
    assert_eq!(tree_at(&c, at, d), ta);
}

#[test]
fn a_node_of_another_image_needs_replace() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let v1 = layer(&fx, "3.10", &d.join("v1"));
    let v2 = layer(&fx, "3.9", &d.join("v2"));
    let base = gpt_base(d);
    let at = part_offset(&base, 2);
    let node = d.join("node-v1.raw");
    ok(
        &image(&[
            &"--base",
            &base,
            &"--layer",
            &v1,
            &"--out",
            &node,
            &"--format",
            &"raw",
        ]),
        "v1",
    );
    let out = d.join("node-v2.raw");
    let o = image(&[
        &"--base",
        &node,
        &"--layer",
        &v2,
        &"--out",
        &out,
        &"--format",
        &"raw",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("is already a kiln node (sha256:") && e.contains("pass --replace"),
        "{e}"
    );
    assert!(!out.exists());
    let o = image(&[
        &"--base",
        &node,
        &"--layer",
        &v2,
        &"--out",
        &out,
        &"--format",
        &"raw",
        &"--replace",
    ]);
    ok(&o, "v2 --replace");
    assert!(
        stdout(&o).contains("replaced kiln node sha256:"),
        "{}",
        stdout(&o)
    );
    // The result is what v2 makes of the stock base, file for file.
    let fresh = d.join("fresh-v2.raw");
    ok(
        &image(&[
            &"--base",
            &base,
            &"--layer",
            &v2,
            &"--out",
            &fresh,
            &"--format",
            &"raw",
        ]),
        "v2 fresh",
    );
    let upgraded = tree_at(&out, at, d);
    assert_eq!(upgraded, tree_at(&fresh, at, d));
    assert_ne!(upgraded, tree_at(&node, at, d));
}

#[test]
fn mbr_base_with_one_linux_partition() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let layer = layer(&fx, "3.10", &d.join("out"));
    let tree = base_tree(d);
    let fs = ext4(d, &tree, 40, "cloudimg-rootfs");
    let disk = d.join("mbr.raw");
    sh(Command::new("truncate").arg("-s48M").arg(&disk));
    let mut c = Command::new("sfdisk");
    c.args(["-q", "-X", "dos"])
        .arg(&disk)
        .stdin(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"start=2048, size=81920, type=83\n")
        .unwrap();
    assert!(child.wait().unwrap().success());
    dd(&fs, &disk, 1);
    let out = d.join("node.qcow2");
    let o = image(&[&"--base", &disk, &"--layer", &layer, &"--out", &out]);
    ok(&o, "kiln image on MBR");
    assert!(
        stdout(&o).contains("(raw, MBR table): root is partition 1 (ext4) at byte 1048576"),
        "{}",
        stdout(&o)
    );
    let back = d.join("back.raw");
    to_raw(&out, "qcow2", &back);
    let t = tree_at(&back, 1 << 20, d);
    assert!(t.iter().any(|l| l.contains(" usr/bin/kubelet ")), "{t:#?}");
}

/// Issue 38: an amd64 layer into a base whose root partition has the arm64 GPT root type is
/// refused naming both architectures, before anything is written to --out (it exited 0 and
/// made a node whose kubelet could not run).
#[test]
fn a_layer_for_another_architecture_than_the_root_partition_is_refused() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let layer = layer(&fx, "3.10", &d.join("out"));
    let tree = base_tree(d);
    let fs = ext4(d, &tree, 48, "root");
    let disk = d.join("arm64.raw");
    gpt_disk(
        &disk,
        64,
        &[Part {
            start: 8,
            mib: 48,
            kind: ROOT_ARM64,
            name: "root",
            fs: Some(&fs),
        }],
    );
    let out = d.join("node.qcow2");
    let o = image(&[&"--base", &disk, &"--layer", &layer, &"--out", &out]);
    let err = stderr(&o);
    assert_ne!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("partition 1")
            && err.contains("is the arm64 root")
            && err.contains("baked for amd64"),
        "{err}"
    );
    assert!(!out.exists(), "an output was written");
}

/// `--node`: the node config's files land in the image's /etc/kiln with the contract's modes
/// (the token 0600), the token never reaches kiln's output, and a node config that does not
/// validate stops the run before the base is copied.
#[test]
fn node_config_goes_into_the_image() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let layer = layer(&fx, "3.10", &d.join("out"));
    let base = gpt_base(d);
    let node = d.join("node");
    std::fs::create_dir_all(&node).unwrap();
    sh(Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args([
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=kiln-test-ca",
        ])
        .args(["-days", "2", "-keyout"])
        .arg(node.join("ca.key"))
        .arg("-out")
        .arg(node.join("ca.crt")));
    let token = "07401b.f395accd246ae52d";
    let toml = node.join("node.toml");
    std::fs::write(
        &toml,
        format!(
            "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"image-test\"\n\
             join_mode = \"kubelet\"\nprovider = \"aws\"\n\n[ca]\nfile = \"ca.crt\"\n\n\
             [bootstrap]\ntoken = \"{token}\"\n"
        ),
    )
    .unwrap();
    let bad = node.join("bad.toml");
    std::fs::write(&bad, "api_server = 1\n").unwrap();

    let out_dir = d.join("images");
    std::fs::create_dir_all(&out_dir).unwrap();
    let out = out_dir.join("node.raw");
    let args = |n: &Path| -> Vec<std::ffi::OsString> {
        [
            "--base".as_ref(),
            base.as_os_str(),
            "--layer".as_ref(),
            layer.as_os_str(),
            "--node".as_ref(),
            n.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
            "--format".as_ref(),
            "raw".as_ref(),
        ]
        .into_iter()
        .map(Into::into)
        .collect()
    };
    let o = kiln().arg("image").args(args(&bad)).output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("bad.toml"), "{}", stderr(&o));
    assert_eq!(leftovers(&out_dir, &[]), Vec::<String>::new());

    let o = kiln().arg("image").args(args(&toml)).output().unwrap();
    ok(&o, "kiln image --node");
    assert!(
        stdout(&o).contains("node config: wrote /etc/kiln/node.env /etc/kiln/ca.crt"),
        "{}",
        stdout(&o)
    );
    for text in [stdout(&o), stderr(&o)] {
        assert!(
            !text.contains("f395accd246ae52d"),
            "the token leaked: {text}"
        );
    }
    let t = tree_at(&out, part_offset(&out, 2), d);
    let entry = |name: &str| {
        t.iter()
            .find(|l| l.split(' ').nth(4) == Some(name))
            .unwrap_or_else(|| panic!("{name} not in the image: {t:#?}"))
            .clone()
    };
    assert!(entry("etc/kiln").starts_with("d 755 "), "{t:#?}");
    assert!(entry("etc/kiln/node.env").starts_with("f 644 "), "{t:#?}");
    assert!(
        entry("etc/kiln/bootstrap-token").starts_with("f 600 "),
        "{t:#?}"
    );
    assert_eq!(leftovers(&out_dir, &["node.raw"]), Vec::<String>::new());

    // The SBOM beside OUT: valid SPDX 2.3 by the reference validator, the base and the layer
    // by their sha256, the layer's own SBOM referenced by its SHA1, no token.
    let sbom_path = out_dir.join("node.raw.spdx.json");
    let text = std::fs::read_to_string(&sbom_path).unwrap();
    assert!(
        !text.contains("f395accd246ae52d"),
        "the token is in the SBOM"
    );
    if let Some(v) = pyspdxtools() {
        assert_valid_spdx(&v, &sbom_path);
    }
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let pkg = |id: &str| {
        doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["SPDXID"] == id)
            .unwrap_or_else(|| panic!("no {id}: {text}"))
            .clone()
    };
    assert_eq!(
        pkg("SPDXRef-Base")["checksums"][0]["checksumValue"],
        sha256_file(&base).as_str()
    );
    assert_eq!(
        pkg("SPDXRef-LayerFile")["checksums"][0]["checksumValue"],
        sha256_file(&layer).as_str()
    );
    let layer_sbom = layer.with_file_name(
        layer
            .file_name()
            .unwrap()
            .to_string_lossy()
            .replace(".tar.zst", ".spdx.json"),
    );
    let sha1 = String::from_utf8_lossy(&sh(Command::new("sha1sum").arg(&layer_sbom)).stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert_eq!(
        doc["externalDocumentRefs"][0]["checksum"]["checksumValue"],
        sha1.as_str()
    );
    assert!(
        text.contains("\"DocumentRef-layer:SPDXRef-Layer\""),
        "{text}"
    );
}

/// `kiln image` measures a kiln layer without decompressing its big files' frames: reading
/// the baked layer with `image::frames` skips frames and still sees every entry, with the
/// sizes a plain streaming read sees.
#[test]
fn a_baked_layer_is_measured_frame_by_frame() {
    use std::io::Read;
    let fx = fixture(Bins::Real);
    let layer = layer(&fx, "3.10", &fx.dir.path().join("out"));
    let streamed: Vec<(String, u64)> = {
        let dec = zstd::Decoder::new(std::fs::File::open(&layer).unwrap()).unwrap();
        let mut a = tar::Archive::new(dec);
        a.entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.path().unwrap().display().to_string(), e.size())
            })
            .collect()
    };
    let mut frames = kiln::image::frames::Frames::new(std::fs::File::open(&layer).unwrap());
    let mut seen = Vec::new();
    {
        let mut a = tar::Archive::new(&mut frames);
        for e in a.entries_with_seek().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            if name == "usr/lib/kiln/image.env" {
                let mut t = String::new();
                e.read_to_string(&mut t).unwrap();
                assert!(t.contains("KILN_IMAGE_ID="), "{t}");
            }
            seen.push((name, e.size()));
        }
    }
    assert_eq!(seen, streamed);
    assert!(
        frames.skipped > 0,
        "skipped {} frames, decompressed {}",
        frames.skipped,
        frames.decompressed
    );
    let facts = kiln::image::layer::peek(&layer).unwrap();
    assert_eq!(facts.entries as usize, streamed.len());
    assert_eq!(
        facts.unpacked_bytes,
        streamed.iter().map(|(_, s)| s).sum::<u64>()
    );
    assert!(facts.image_id.is_some() && facts.manifest.is_some());
}
