//! `kiln image --via loop` on xfs and btrfs roots (made by the real mkfs.xfs and
//! mkfs.btrfs): the layer lands as it does on ext4, read back through the kernel's own
//! driver, and the filesystem's own checker (xfs_repair -n, btrfs check) finds it clean.

use crate::image_support;

use std::path::Path;
use std::process::Command;

use image_support::*;

const TOOLS: &[&str] = &[
    "sgdisk",
    "mkfs.xfs",
    "xfs_repair",
    "mkfs.btrfs",
    "btrfs",
    "qemu-img",
    "losetup",
    "mount",
    "unshare",
];

/// `type mode size path sha256` of every entry under the layer's top directories, read from
/// the filesystem at `offset` of `disk` mounted read-only in a mount namespace of its own.
fn layer_tree(disk: &Path, offset: u64, fstype: &str) -> Vec<String> {
    let script = format!(
        "set -e; m=$(mktemp -d); mount -t {fstype} -o ro,loop,offset={offset} \"$1\" \"$m\"; \
         cd \"$m\"; find usr/bin usr/lib/kiln usr/lib/systemd/system etc/systemd/system \
         -printf '%y %m %l %p\\n' | sort; \
         find usr/bin usr/lib/kiln -type f -print0 | sort -z | xargs -0 sha256sum"
    );
    let o = sh(Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(disk));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn disk_with(d: &Path, fstype: &str) -> std::path::PathBuf {
    let fs = d.join(format!("{fstype}.img"));
    sh(Command::new("truncate").arg("-s320M").arg(&fs));
    let tree = base_tree(&d.join(fstype));
    match fstype {
        // mkfs.xfs fills a filesystem only from a proto file: copy the tree in through a
        // mount in a namespace of its own instead.
        "xfs" => {
            sh(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(&fs));
            sh(Command::new("unshare")
                .args(["-m", "--propagation", "private", "sh", "-c"])
                .arg("set -e; m=$(mktemp -d); mount -o loop \"$1\" \"$m\"; cp -a \"$2\"/. \"$m\"/; umount \"$m\"")
                .arg("sh")
                .arg(&fs)
                .arg(&tree))
        }
        _ => sh(Command::new("mkfs.btrfs")
            .args(["-q", "-f", "--rootdir"])
            .arg(&tree)
            .arg(&fs)),
    };
    let disk = d.join(format!("{fstype}.raw"));
    gpt_disk(
        &disk,
        340,
        &[Part {
            start: 8,
            mib: 320,
            kind: ROOT_X86_64,
            name: "root",
            fs: Some(&fs),
        }],
    );
    disk
}

#[test]
fn xfs_and_btrfs_roots_take_the_layer_as_ext4_does() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let layer = layer(&fx, "3.10", &d.join("out"));
    let base = gpt_base(d);
    let reference = d.join("ext4-node.raw");
    ok(
        &image(&[
            &"--base",
            &base,
            &"--layer",
            &layer,
            &"--out",
            &reference,
            &"--format",
            &"raw",
        ]),
        "ext4",
    );
    let want = layer_tree(&reference, part_offset(&reference, 2), "ext4");
    assert!(want.len() > 20, "{want:#?}");
    for fstype in ["xfs", "btrfs"] {
        let disk = disk_with(d, fstype);
        let out = d.join(format!("{fstype}-node.raw"));
        let o = image(&[
            &"--base",
            &disk,
            &"--layer",
            &layer,
            &"--out",
            &out,
            &"--format",
            &"raw",
        ]);
        ok(&o, fstype);
        assert!(
            String::from_utf8_lossy(&o.stdout).contains(&format!("root is partition 1 ({fstype})")),
            "{}",
            String::from_utf8_lossy(&o.stdout)
        );
        let at = part_offset(&out, 1);
        assert_eq!(layer_tree(&out, at, fstype), want, "{fstype}");
        // The filesystem's own checker, read-only, on the partition copied out.
        let part = d.join(format!("{fstype}-part.img"));
        sh(Command::new("dd")
            .arg(format!("if={}", out.display()))
            .arg(format!("of={}", part.display()))
            .args(["bs=1M", "skip=8", "count=320", "status=none"]));
        let check = match fstype {
            "xfs" => Command::new("xfs_repair")
                .args(["-n", "-f"])
                .arg(&part)
                .output(),
            _ => Command::new("btrfs")
                .args(["check", "--readonly"])
                .arg(&part)
                .output(),
        }
        .unwrap();
        assert!(
            check.status.success(),
            "{fstype} check: {}{}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );
        // The unprivileged mode says it cannot, by name.
        let o = image(&[
            &"--base",
            &disk,
            &"--layer",
            &layer,
            &"--out",
            &d.join("x.raw"),
            &"--via",
            &"debugfs",
        ]);
        assert!(!o.status.success());
        assert!(
            String::from_utf8_lossy(&o.stderr).contains(&format!(
                "found {fstype} (the unprivileged mode writes ext4 only"
            )),
            "{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
