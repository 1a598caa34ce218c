//! Bases that name other files (issue 34): a qcow2 backing file or external data file on the
//! build host, a `json:` or `nbd:` base name, a backing URL, a VMDK descriptor whose extent
//! is a host file, a VMDK delta, a differencing VHD. None may make kiln read (or dial) anything
//! but the base, unless `--allow-backing-dir` names where such files may come from; and a
//! corrupt GPT's entry-array LBA is an error, not an overflow.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{plain_layer, poke, stderr};
use crate::image_support::*;

/// What the host disk holds where nothing else writes (between the GPT and partition 1).
const MARKER: &[u8] = b"KILN-HOST-DISK-MARKER-7f3a";

/// A valid base disk (the usual one) with [`MARKER`] at byte 64 KiB: a host file that, read
/// into a node image, would show.
fn host_disk(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let disk = gpt_base(dir);
    poke(&disk, 64 << 10, MARKER);
    disk
}

fn qemu_img(args: &[&dyn AsRef<std::ffi::OsStr>]) {
    let mut c = Command::new("qemu-img");
    for a in args {
        c.arg(a);
    }
    sh(&mut c);
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// A loopback listener that records whether anyone connected.
fn listener() -> (u16, Arc<AtomicBool>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hit = Arc::new(AtomicBool::new(false));
    let h = hit.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            h.store(true, Ordering::SeqCst);
            drop(c);
        }
    });
    (port, hit)
}

/// Runs `kiln image` on `base` (raw output), expects exit 1 with every needle in stderr, no
/// OUT, and neither the host disk's marker nor `secret` in stderr.
fn refused_base(base: &Path, layer: &Path, extra: &[&str], needles: &[&str], secret: &[&[u8]]) {
    let outdir = base.parent().unwrap().join("out");
    std::fs::create_dir_all(&outdir).unwrap();
    let out = outdir.join("node.raw");
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> = vec![
        &"--base",
        &base,
        &"--layer",
        &layer,
        &"--out",
        &out,
        &"--format",
        &"raw",
    ];
    for e in extra {
        args.push(e);
    }
    let o = image(&args);
    let e = stderr(&o);
    if let Ok(bytes) = std::fs::read(&out) {
        assert!(
            !contains(&bytes, MARKER),
            "{}: the host disk's bytes are in the node image",
            base.display()
        );
    }
    assert_eq!(o.status.code(), Some(1), "{}: {e}", base.display());
    for n in needles {
        assert!(e.contains(n), "{}: {n:?} not in: {e}", base.display());
    }
    for s in secret.iter().chain([&MARKER]) {
        assert!(
            !contains(&o.stderr, s) && !contains(&o.stdout, s),
            "{}: echoed {s:?}: {e}",
            base.display()
        );
    }
    assert!(!out.exists());
    assert_eq!(leftovers(&outdir, &[]), Vec::<String>::new(), "{e}");
}

#[test]
fn a_base_that_names_a_host_file_is_refused_and_nothing_of_it_is_read() {
    if !require(&["sgdisk", "mkfs.ext4", "debugfs", "qemu-img"], false) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let layer = plain_layer(d);
    let host = host_disk(&d.join("host"));
    // Something like /etc/shadow: not a disk, distinctive bytes where the MBR signature is.
    let shadow = d.join("host/shadow");
    let mut secret = b"root:$6$kilnsalt$SECRETHASHSECRETHASH:19000:0:99999:7:::\n".to_vec();
    secret.resize(1024, b'x');
    secret[510..512].copy_from_slice(b"ZQ");
    std::fs::write(&shadow, &secret).unwrap();
    // SAFETY: geteuid has no preconditions and cannot fail.
    let vias: &[&str] = if unsafe { libc::geteuid() } == 0 {
        &["debugfs", "loop"]
    } else {
        &["debugfs"]
    };

    // qcow2 with a backing file on the host, in both modes.
    let backed = d.join("backed/e.qcow2");
    std::fs::create_dir_all(backed.parent().unwrap()).unwrap();
    qemu_img(&[
        &"create", &"-q", &"-f", &"qcow2", &"-b", &host, &"-F", &"raw", &backed,
    ]);
    for via in vias {
        refused_base(
            &backed,
            &layer,
            &["--via", via],
            &[
                "e.qcow2: names another file as its backing file",
                "--allow-backing-dir",
            ],
            &[],
        );
    }
    // Backed by the shadow-like file: not one of its bytes in the message (it printed two).
    let backed_shadow = d.join("backed-shadow/s.qcow2");
    std::fs::create_dir_all(backed_shadow.parent().unwrap()).unwrap();
    qemu_img(&[
        &"create",
        &"-q",
        &"-f",
        &"qcow2",
        &"-b",
        &shadow,
        &"-F",
        &"raw",
        &backed_shadow,
        &"1M",
    ]);
    refused_base(
        &backed_shadow,
        &layer,
        &["--via", "debugfs"],
        &["backing file"],
        &[b"ZQ", b"5a51", b"SECRET", b"root:"],
    );
    // The shadow-like file as the base itself: refused as no table, its bytes not quoted.
    let own = d.join("own");
    std::fs::create_dir_all(&own).unwrap();
    std::fs::copy(&shadow, own.join("shadow.raw")).unwrap();
    refused_base(
        &own.join("shadow.raw"),
        &layer,
        &[],
        &["no partition table"],
        &[b"ZQ", b"5a51", b"SECRET"],
    );

    // qcow2 whose external data file is the host disk (made on a scratch file, then pointed
    // at the host's by `qemu-img amend`, which writes nothing to it).
    let dataf = d.join("data/e.qcow2");
    std::fs::create_dir_all(dataf.parent().unwrap()).unwrap();
    let scratch = d.join("data/scratch.raw");
    let size = std::fs::metadata(&host).unwrap().len().to_string();
    qemu_img(&[
        &"create",
        &"-q",
        &"-f",
        &"qcow2",
        &"-o",
        &format!("data_file={},data_file_raw=on", scratch.display()),
        &dataf,
        &size,
    ]);
    qemu_img(&[
        &"amend",
        &"-f",
        &"qcow2",
        &"-o",
        &format!("data_file={}", host.display()),
        &dataf,
    ]);
    refused_base(
        &dataf,
        &layer,
        &["--via", "debugfs"],
        &["names another file as its external data file"],
        &[],
    );

    // A VMDK descriptor whose flat extent is the host disk.
    let vmdk = d.join("vmdk/flat.vmdk");
    std::fs::create_dir_all(vmdk.parent().unwrap()).unwrap();
    let sectors = std::fs::metadata(&host).unwrap().len() / 512;
    std::fs::write(&vmdk, format!("# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\n\nRW {sectors} FLAT \"{}\" 0\n\nddb.adapterType = \"ide\"\n", host.display())).unwrap();
    refused_base(
        &vmdk,
        &layer,
        &["--via", "debugfs"],
        &["a VMDK descriptor file", "extents"],
        &[],
    );

    // A base whose name QEMU reads as a JSON description of another file: a real file by
    // that name in the working directory, the host disk beside it.
    let jdir = d.join("json");
    std::fs::create_dir_all(&jdir).unwrap();
    std::fs::copy(&host, jdir.join("disk.raw")).unwrap();
    let jname = r#"json:{"driver":"raw","file":{"driver":"file","filename":"disk.raw"}}"#;
    std::fs::copy(&backed, jdir.join(jname)).unwrap();
    let jout = jdir.join("out");
    std::fs::create_dir_all(&jout).unwrap();
    let o = kiln()
        .current_dir(&jdir)
        .args(["image", "--base", jname, "--layer"])
        .arg(&layer)
        .args([
            "--out",
            "out/node.raw",
            "--format",
            "raw",
            "--via",
            "debugfs",
        ])
        .output()
        .unwrap();
    if let Ok(b) = std::fs::read(jout.join("node.raw")) {
        assert!(!contains(&b, MARKER), "a json: base name read another file");
    }
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("a json: name"), "{}", stderr(&o));
}

#[test]
fn a_base_that_names_a_url_is_refused_and_nothing_is_dialled() {
    if !require(&["sgdisk", "qemu-img"], false) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let layer = plain_layer(d);
    for scheme in ["http", "nbd"] {
        let (port, hit) = listener();
        let p = d.join(format!("{scheme}/u.qcow2"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let url = format!("{scheme}://127.0.0.1:{port}/disk");
        qemu_img(&[
            &"create", &"-q", &"-u", &"-f", &"qcow2", &"-b", &url, &"-F", &"raw", &p, &"16M",
        ]);
        refused_base(
            &p,
            &layer,
            &["--via", "debugfs"],
            &["backing file", &url],
            &[],
        );
        // Allowing a directory does not allow a URL.
        refused_base(
            &p,
            &layer,
            &[
                "--via",
                "debugfs",
                "--allow-backing-dir",
                d.to_str().unwrap(),
            ],
            &["which QEMU would open as a protocol"],
            &[],
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert!(
            !hit.load(Ordering::SeqCst),
            "{scheme}: kiln image dialled {url}"
        );
    }
    // A base named like an NBD address (a real file by that name, beside it).
    let (port, hit) = listener();
    let ndir = d.join("nbdname");
    std::fs::create_dir_all(&ndir).unwrap();
    let name = format!("nbd:127.0.0.1:{port}");
    std::fs::copy(d.join("nbd/u.qcow2"), ndir.join(&name)).unwrap();
    let o = kiln()
        .current_dir(&ndir)
        .args(["image", "--base", &name, "--layer"])
        .arg(&layer)
        .args(["--out", "node.raw", "--via", "debugfs"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("a nbd: name"), "{}", stderr(&o));
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!hit.load(Ordering::SeqCst), "kiln image dialled {name}");
}

/// Headers that name other files in the formats kiln reads: a VMDK whose sparse header has
/// capacity 0 (QEMU then opens the embedded descriptor's extents), a VMDK delta
/// (`parentFileNameHint`), a differencing VHD. Each is refused by kiln's own reading of the
/// header, before qemu-img opens it.
#[test]
fn other_formats_naming_files_are_refused() {
    if !require(&["sgdisk", "mkfs.ext4", "qemu-img"], false) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let layer = plain_layer(d);
    let host = host_disk(&d.join("host"));
    let cases = d.join("cases");
    std::fs::create_dir_all(&cases).unwrap();

    // monolithicSparse, then its capacity zeroed and its embedded descriptor's extent turned
    // into the host disk as a FLAT extent.
    let sparse = cases.join("cap0.vmdk");
    qemu_img(&[&"convert", &"-f", &"raw", &"-O", &"vmdk", &host, &sparse]);
    let mut b = std::fs::read(&sparse).unwrap();
    let desc_at = u64::from_le_bytes(b[28..36].try_into().unwrap()) as usize * 512;
    let desc_len = u64::from_le_bytes(b[36..44].try_into().unwrap()) as usize * 512;
    let sectors = std::fs::metadata(&host).unwrap().len() / 512;
    let desc = format!("# Disk DescriptorFile\nversion=1\nCID=fffffffe\nparentCID=ffffffff\ncreateType=\"monolithicFlat\"\nRW {sectors} FLAT \"{}\" 0\n", host.display());
    b[desc_at..desc_at + desc_len].fill(0);
    b[desc_at..desc_at + desc.len()].copy_from_slice(desc.as_bytes());
    b[12..20].fill(0);
    std::fs::write(&sparse, &b).unwrap();
    refused_base(&sparse, &layer, &["--via", "debugfs"], &["capacity 0"], &[]);

    // A VMDK delta disk: parentFileNameHint names the host disk.
    let parent = d.join("host/parent.vmdk");
    qemu_img(&[&"convert", &"-f", &"raw", &"-O", &"vmdk", &host, &parent]);
    let delta = cases.join("delta.vmdk");
    qemu_img(&[
        &"create", &"-q", &"-f", &"vmdk", &"-b", &parent, &"-F", &"vmdk", &delta,
    ]);
    refused_base(
        &delta,
        &layer,
        &["--via", "debugfs"],
        &["parentFileNameHint"],
        &[],
    );

    // A dynamic VHD turned differencing (disk type 4 in both footer copies).
    let vhd = cases.join("diff.vhd");
    qemu_img(&[&"convert", &"-f", &"raw", &"-O", &"vpc", &host, &vhd]);
    let len = std::fs::metadata(&vhd).unwrap().len();
    poke(&vhd, 60, &4u32.to_be_bytes());
    poke(&vhd, len - 512 + 60, &4u32.to_be_bytes());
    refused_base(
        &vhd,
        &layer,
        &["--via", "debugfs"],
        &["a differencing VHD"],
        &[],
    );

    // A QED image (which has backing files of its own): not a format kiln reads.
    let qed = cases.join("b.qed");
    qemu_img(&[
        &"create", &"-q", &"-f", &"qed", &"-b", &host, &"-F", &"raw", &qed,
    ]);
    refused_base(&qed, &layer, &["--via", "debugfs"], &["a QED image"], &[]);
}

/// `--allow-backing-dir DIR`: a backing file inside DIR is read; one that leaves DIR through
/// `..` or a symlink, or a non-file, is refused.
#[test]
fn backing_files_only_from_the_allowed_directory() {
    if !require(&["sgdisk", "mkfs.ext4", "debugfs", "qemu-img"], false) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let layer = plain_layer(d);
    let allowed = d.join("allowed");
    let host = host_disk(&d.join("host"));
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::copy(&host, allowed.join("vendor.raw")).unwrap();
    std::os::unix::fs::symlink(&host, allowed.join("link.raw")).unwrap();
    let ov = d.join("ov");
    std::fs::create_dir_all(&ov).unwrap();
    let allow = allowed.to_str().unwrap();
    for (name, backing, why) in [
        (
            "dotdot.qcow2",
            "../allowed/../host/base.raw",
            "outside the allowed directory",
        ),
        (
            "link.qcow2",
            "../allowed/link.raw",
            "outside the allowed directory",
        ),
        ("dir.qcow2", "../allowed", "not a regular file"),
    ] {
        let p = ov.join(name);
        qemu_img(&[
            &"create", &"-q", &"-u", &"-f", &"qcow2", &"-b", &backing, &"-F", &"raw", &p, &"64M",
        ]);
        refused_base(
            &p,
            &layer,
            &["--via", "debugfs", "--allow-backing-dir", allow],
            &[why, name],
            &[],
        );
    }
    // Inside: the chain is read (kiln converts the overlay with its backing file).
    let p = ov.join("good.qcow2");
    qemu_img(&[
        &"create",
        &"-q",
        &"-f",
        &"qcow2",
        &"-b",
        &"../allowed/vendor.raw",
        &"-F",
        &"raw",
        &p,
    ]);
    refused_base(&p, &layer, &["--via", "debugfs"], &["backing file"], &[]);
    let out = ov.join("good.raw");
    let o = image(&[
        &"--base",
        &p,
        &"--layer",
        &layer,
        &"--out",
        &out,
        &"--format",
        &"raw",
        &"--via",
        &"debugfs",
        &"--allow-backing-dir",
        &allow,
    ]);
    let e = stderr(&o);
    // The plain layer is not a kiln layer, so the install refuses it (exit 3): reaching it
    // means the table and the root filesystem were read through the backing file (the
    // overlay alone holds neither).
    assert_eq!(o.status.code(), Some(3), "{e}");
    assert!(e.contains("installing into partition 2 of"), "{e}");
}

/// `--via debugfs` opens the working copy as `PATH?offset=N`, and e2fsprogs cuts the name at
/// its first `?`: with OUT in `x?offset=0/`, debugfs opened the file `x` beside it instead of
/// the working copy. Refused; `x` is never read or written.
#[test]
fn a_question_mark_in_the_out_directory_is_refused_with_debugfs() {
    if !require(&["sgdisk", "mkfs.ext4", "debugfs", "qemu-img"], false) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let layer = plain_layer(d);
    let host = host_disk(&d.join("host"));
    let base = d.join("base.raw");
    std::fs::copy(&host, &base).unwrap();
    let decoy = d.join("x");
    std::fs::copy(&host, &decoy).unwrap();
    let before = std::fs::read(&decoy).unwrap();
    let outdir = d.join("x?offset=0");
    std::fs::create_dir_all(&outdir).unwrap();
    let out = outdir.join("node.raw");
    let o = image(&[
        &"--base", &base, &"--layer", &layer, &"--out", &out, &"--via", &"debugfs",
    ]);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(e.contains("has a '?' in its path"), "{e}");
    assert!(
        std::fs::read(&decoy).unwrap() == before,
        "debugfs wrote the file beside OUT's directory"
    );
}
