//! `kiln image` against hostile and broken inputs: partition tables that lie (truncated,
//! bad CRC, overlapping, past the end), roots it cannot write, a layer that escapes the root,
//! a full filesystem, and a kill mid-run. Every failure names the file and what was wrong,
//! writes no OUT, and leaves no loop device, mount or temporary file behind.

#[path = "image_hostile/base_refs.rs"]
mod base_refs;
use crate::image_support;

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use image_support::*;
use kiln::image::partition::{read_table, ReadError, TableError};
use kiln::image::pick::{pick_root, PickError};

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

/// A small, valid (but not kiln's) layer with its SHA256SUMS: enough for `kiln image` to
/// reach the partition table.
fn plain_layer(dir: &Path) -> PathBuf {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o644);
    h.set_size(3);
    b.append_data(&mut h, "usr/share/x", &b"hi\n"[..]).unwrap();
    let p = dir.join("plain.tar.zst");
    std::fs::write(
        &p,
        zstd::encode_all(&b.into_inner().unwrap()[..], 3).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("SHA256SUMS"),
        format!("{}  plain.tar.zst\n", sha256_file(&p)),
    )
    .unwrap();
    p
}

/// A 16 MiB GPT disk with two Linux partitions (1 at 1 MiB, 2 at 6 MiB, 4 MiB each), no
/// filesystems.
fn two_part_disk(dir: &Path) -> PathBuf {
    let disk = dir.join("two.raw");
    gpt_disk(
        &disk,
        16,
        &[
            Part {
                start: 1,
                mib: 4,
                kind: LINUX_DATA,
                name: "root",
                fs: None,
            },
            Part {
                start: 6,
                mib: 4,
                kind: LINUX_DATA,
                name: "data",
                fs: None,
            },
        ],
    );
    disk
}

fn crc(b: &[u8]) -> u32 {
    let mut c = flate2::Crc::new();
    c.update(b);
    c.sum()
}

/// Rewrites the GPT's CRCs after a test edited the entry array (an independent CRC-32:
/// flate2's, not kiln's).
fn fix_crcs(disk: &Path) {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(disk)
        .unwrap();
    let mut array = vec![0u8; 128 * 128];
    f.read_exact_at(&mut array, 1024).unwrap();
    f.write_all_at(&crc(&array).to_le_bytes(), 512 + 88)
        .unwrap();
    let mut h = vec![0u8; 92];
    f.read_exact_at(&mut h, 512).unwrap();
    h[16..20].fill(0);
    f.write_all_at(&crc(&h).to_le_bytes(), 512 + 16).unwrap();
}

fn poke(disk: &Path, at: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(disk).unwrap();
    f.write_all_at(bytes, at).unwrap();
}

fn table_of(disk: &Path) -> Result<kiln::image::partition::Table, ReadError> {
    read_table(&std::fs::File::open(disk).unwrap())
}

/// Runs `kiln image` on `base`, expects failure with exit `code` and every `needle` in its
/// stderr, and checks it left nothing behind.
fn refused(base: &Path, layer: &Path, extra: &[&str], code: i32, needles: &[&str]) {
    let outdir = base.parent().unwrap().join(format!(
        "out-{}",
        base.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&outdir).unwrap();
    let out = outdir.join("node.qcow2");
    let mut args: Vec<&dyn AsRef<std::ffi::OsStr>> =
        vec![&"--base", &base, &"--layer", &layer, &"--out", &out];
    for e in extra {
        args.push(e);
    }
    let o = image(&args);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(code), "{}: {e}", base.display());
    for n in needles {
        assert!(e.contains(n), "{}: {n:?} not in: {e}", base.display());
    }
    assert_eq!(leftovers(&outdir, &[]), Vec::<String>::new(), "{e}");
    assert_eq!(
        loops_in(&outdir),
        Vec::<String>::new(),
        "a loop device left behind"
    );
    assert_eq!(
        kiln_mounts(),
        Vec::<String>::new(),
        "a mount visible on the host"
    );
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario from its setup to its last assertion, each step depending on the one before; its helpers are in support/"
)]
fn partition_tables_that_lie_are_refused_by_name() {
    if !require(&["sgdisk", "sfdisk", "qemu-img"], false) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let layer = plain_layer(d);
    let good = two_part_disk(d);
    let t = table_of(&good).unwrap();
    assert_eq!(t.partitions.len(), 2);
    assert_eq!(
        (t.partitions[1].offset, t.partitions[1].size),
        (6 << 20, 4 << 20)
    );
    assert_eq!(t.partitions[0].label, "root");
    // Two Linux partitions, one labelled root: that one.
    assert_eq!(pick_root(&t, None).unwrap().number, 1);
    assert_eq!(pick_root(&t, Some(2)).unwrap().number, 2);
    assert!(matches!(
        pick_root(&t, Some(7)),
        Err(PickError::NoSuchPartition { number: 7, .. })
    ));

    let case = |name: &str, edit: &dyn Fn(&Path)| {
        let p = d.join(format!("{name}.raw"));
        std::fs::copy(&good, &p).unwrap();
        edit(&p);
        p
    };
    let truncated = case("truncated", &|p| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(600)
            .unwrap()
    });
    assert!(matches!(
        table_of(&truncated),
        Err(ReadError::Table(TableError::Truncated { .. }))
    ));
    refused(
        &truncated,
        &layer,
        &[],
        1,
        &[
            "truncated.raw",
            "truncated: the GPT header (LBA 1) needs bytes up to 1024, the image has 600",
        ],
    );

    let bad_header = case("bad-header", &|p| poke(p, 512 + 60, b"\xff"));
    refused(
        &bad_header,
        &layer,
        &[],
        1,
        &["bad-header.raw", "GPT header CRC32: expected"],
    );
    let bad_array = case("bad-array", &|p| poke(p, 1024 + 56, b"X"));
    refused(
        &bad_array,
        &layer,
        &[],
        1,
        &["bad-array.raw", "partition entry array CRC32: expected"],
    );

    // Partition 2 starts inside partition 1 (first LBA 4096, inside 2048..10239).
    let overlap = case("overlap", &|p| {
        poke(p, 1024 + 128 + 32, &4096u64.to_le_bytes());
        fix_crcs(p);
    });
    assert!(matches!(
        table_of(&overlap),
        Err(ReadError::Table(TableError::Overlap { a: 1, b: 2, .. }))
    ));
    refused(
        &overlap,
        &layer,
        &[],
        1,
        &["overlap.raw", "GPT partitions 1 and 2 overlap"],
    );

    // Partition 2 ends past the usable sectors (and past the disk).
    let past = case("past-end", &|p| {
        poke(p, 1024 + 128 + 40, &100_000u64.to_le_bytes());
        fix_crcs(p);
    });
    refused(
        &past,
        &layer,
        &[],
        1,
        &[
            "past-end.raw",
            "GPT partition 2: expected sectors inside the usable",
        ],
    );

    // The entry array's LBA is 2^63-1: an error naming the field, not an overflow (issue 34:
    // it panicked in a debug build and wrapped in a release one).
    let far = case("lba-overflow", &|p| {
        poke(p, 512 + 72, &(u64::MAX >> 1).to_le_bytes());
        fix_crcs(p);
    });
    assert!(matches!(
        table_of(&far),
        Err(ReadError::Table(TableError::Bad { .. }))
    ));
    refused(
        &far,
        &layer,
        &[],
        1,
        &[
            "lba-overflow.raw",
            "GPT partition entry array LBA: expected 2..",
            "found 9223372036854775807",
        ],
    );

    // The disk is cut short: the header says more sectors than the image has.
    let short = case("short", &|p| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(8 << 20)
            .unwrap()
    });
    refused(
        &short,
        &layer,
        &[],
        1,
        &[
            "short.raw",
            "GPT usable sectors: expected first <= last < 16384",
        ],
    );

    // An MBR whose partition runs past the end of the disk.
    let mbr = d.join("mbr-past.raw");
    sh(Command::new("truncate").arg("-s8M").arg(&mbr));
    let mut c = Command::new("sfdisk");
    c.args(["-q", "-X", "dos"])
        .arg(&mbr)
        .stdin(std::process::Stdio::piped());
    let mut child = c.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"start=2048, size=8192, type=83\n")
        .unwrap();
    assert!(child.wait().unwrap().success());
    std::fs::OpenOptions::new()
        .write(true)
        .open(&mbr)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    refused(
        &mbr,
        &layer,
        &[],
        1,
        &[
            "mbr-past.raw",
            "MBR partition 1: expected sectors inside the disk",
        ],
    );

    let none = d.join("zeros.raw");
    sh(Command::new("truncate").arg("-s4M").arg(&none));
    refused(
        &none,
        &layer,
        &[],
        1,
        &[
            "zeros.raw",
            "no partition table: expected the MBR signature 55 aa at byte 510, found zero bytes",
        ],
    );
}

#[test]
fn roots_kiln_cannot_write_are_refused() {
    if !require(TOOLS, false) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let layer = plain_layer(d);
    let disk = two_part_disk(d);
    refused(&disk, &layer, &[], 1, &["two.raw, partition 1: expected a root filesystem kiln can write (ext4, xfs, btrfs), found only zero bytes (no filesystem)"]);
    // An XFS magic and nothing else: the kernel refuses to mount it, and says so.
    poke(&disk, 1 << 20, b"XFSB");
    refused(
        &disk,
        &layer,
        &["--via", "loop"],
        1,
        &["mounting the xfs filesystem at byte 1048576"],
    );
    // No partition looks like a root: both are called something else.
    let other = d.join("other.raw");
    gpt_disk(
        &other,
        16,
        &[
            Part {
                start: 1,
                mib: 4,
                kind: LINUX_DATA,
                name: "data",
                fs: None,
            },
            Part {
                start: 6,
                mib: 4,
                kind: LINUX_DATA,
                name: "home",
                fs: None,
            },
        ],
    );
    refused(
        &other,
        &layer,
        &[],
        1,
        &[
            "other.raw: has no root partition",
            "name it with --partition N",
            "1 type 0fc63daf-8483-4772-8e79-3d69d8477de4 label \"data\"",
        ],
    );
    refused(
        &other,
        &layer,
        &["--partition", "9"],
        1,
        &["other.raw: has no partition 9"],
    );
    // Not root, --via loop: refused before the base is copied (run as nobody).
    if require(&["setpriv"], true) {
        let outdir = d.join("unpriv");
        std::fs::create_dir_all(&outdir).unwrap();
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&outdir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
            .unwrap();
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_kiln"))
            .arg("image")
            .arg("--base")
            .arg(&other)
            .arg("--layer")
            .arg(&layer)
            .arg("--out")
            .arg(outdir.join("node.qcow2"))
            .args(["--via", "loop"])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(1));
        assert!(
            stderr(&o).contains("--via loop mounts the root partition through a loop device and needs root; --via debugfs needs no privileges"),
            "{}",
            stderr(&o)
        );
        assert_eq!(leftovers(&outdir, &[]), Vec::<String>::new());
    }
    // --out naming the base.
    let o = image(&[&"--base", &other, &"--layer", &layer, &"--out", &other]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("is the base image; kiln image never writes the base"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn errors_after_the_mount_unmount_and_detach() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    // A layer with a symlink out of the root: install's confinement refuses it (exit 3).
    let hostile_dir = d.join("hostile");
    std::fs::create_dir_all(&hostile_dir).unwrap();
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    b.append_link(&mut h, "usr/x", "../../../outside").unwrap();
    let evil = hostile_dir.join("evil.tar.zst");
    std::fs::write(
        &evil,
        zstd::encode_all(&b.into_inner().unwrap()[..], 3).unwrap(),
    )
    .unwrap();
    std::fs::write(
        hostile_dir.join("SHA256SUMS"),
        format!("{}  evil.tar.zst\n", sha256_file(&evil)),
    )
    .unwrap();
    let base = gpt_base(d);
    refused(
        &base,
        &evil,
        &[],
        3,
        &[
            "refusing layer entry \"usr/x\"",
            "symlink points outside the root",
            "installing into partition 2 of",
        ],
    );

    // A root filesystem too small for the layer: refused before anything is written.
    let tree = base_tree(&d.join("small"));
    let fs = ext4(d, &tree, 8, "root");
    let small = d.join("small.raw");
    gpt_disk(
        &small,
        16,
        &[Part {
            start: 1,
            mib: 8,
            kind: ROOT_X86_64,
            name: "root",
            fs: Some(&fs),
        }],
    );
    let layer = layer(&fx, "3.10", &d.join("out"));
    refused(
        &small,
        &layer,
        &[],
        1,
        &[
            "small.raw, partition 1: the root filesystem has",
            "inodes free, the layer unpacks to",
            "grow the partition",
        ],
    );
}

#[test]
fn a_kill_mid_run_leaves_no_loop_device_or_mount() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let layer = layer(&fx, "3.10", &d.join("out"));
    let base = gpt_base(d);
    let outdir = d.join("images");
    std::fs::create_dir_all(&outdir).unwrap();
    // The checksum file is a FIFO nobody writes: kiln blocks opening it in the install's
    // verification, which runs after the mount.
    let fifo = d.join("sums.fifo");
    sh(Command::new("mkfifo").arg(&fifo));
    for signal in ["KILL", "TERM"] {
        let mut child = kiln()
            .arg("image")
            .arg("--base")
            .arg(&base)
            .arg("--layer")
            .arg(&layer)
            .arg("--out")
            .arg(outdir.join("node.qcow2"))
            .arg("--sums")
            .arg(&fifo)
            .spawn()
            .unwrap();
        let t = Instant::now();
        while loops_in(&outdir).is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "kiln never attached a loop device"
            );
            assert!(child.try_wait().unwrap().is_none(), "kiln exited early");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        // Mounted in kiln's own namespace: invisible here while it runs.
        assert_eq!(kiln_mounts(), Vec::<String>::new());
        sh(Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string()));
        child.wait().unwrap();
        let t = Instant::now();
        while !loops_in(&outdir).is_empty() {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{signal}: loop device left: {:?}",
                loops_in(&outdir)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!outdir.join("node.qcow2").exists());
        // What a kill does leave: the working copy and the (empty, unmounted) mount point.
        let left = leftovers(&outdir, &[]);
        assert_eq!(left.len(), 2, "{left:?}");
        let (dirs, files): (Vec<&String>, Vec<&String>) = left
            .iter()
            .partition(|n| n.starts_with(".kiln-image-root-"));
        assert_eq!(dirs.len(), 1, "{left:?}");
        assert!(
            files[0].starts_with(".kiln-image-") && files[0].ends_with(".raw"),
            "{left:?}"
        );
        // The next run in that directory removes them (once a minute old: a live run names
        // a file a moment before it locks it), says so, and leaves nothing of its own.
        for n in &left {
            let f = std::fs::File::open(outdir.join(n)).unwrap();
            f.set_modified(std::time::SystemTime::now() - Duration::from_secs(120))
                .unwrap();
        }
        let out = outdir.join("node.qcow2");
        let o = image(&[&"--base", &base, &"--layer", &layer, &"--out", &out]);
        ok(&o, "kiln image after a killed run");
        let said = String::from_utf8_lossy(&o.stdout).into_owned();
        for n in &left {
            assert!(
                said.contains(&format!("{n} (left by a killed kiln image)")),
                "{said}"
            );
        }
        assert_eq!(leftovers(&outdir, &["node.qcow2"]), Vec::<String>::new());
        std::fs::remove_file(&out).unwrap();
        std::fs::remove_file(outdir.join("node.qcow2.spdx.json")).unwrap();
    }
}

/// The guard itself, in process: dropped on return or while unwinding from a panic, it
/// unmounts and the loop device goes (kiln's namespace is not what cleans up here: the test
/// thread's namespace lives on).
#[test]
fn the_mount_guard_unmounts_and_detaches_on_drop_and_unwind() {
    if !require(TOOLS, true) {
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let d = d.path();
    let base = gpt_base(d);
    let at = part_offset(&base, 2);
    kiln::image::mount::private_namespace().unwrap();
    let mine = || std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap();
    for unwind in [false, true] {
        let seen = std::sync::Mutex::new(String::new());
        let r = std::panic::catch_unwind(|| {
            let m = kiln::image::mount::Mounted::new(&base, at, 48 << 20, "ext4", d).unwrap();
            assert!(m.path().join("usr/bin/bash").is_file());
            *seen.lock().unwrap() = m.path().to_string_lossy().into_owned();
            assert!(mine().contains(&*seen.lock().unwrap()));
            assert_eq!(loops_in(d).len(), 1, "{:?}", loops_in(d));
            if unwind {
                panic!("an error while mounted");
            }
        });
        assert_eq!(r.is_err(), unwind);
        let path = seen.lock().unwrap().clone();
        assert!(!path.is_empty());
        assert!(!mine().contains(&path), "still mounted after drop");
        assert!(!Path::new(&path).exists(), "mount point left");
        assert_eq!(loops_in(d), Vec::<String>::new(), "loop device left");
    }
}
