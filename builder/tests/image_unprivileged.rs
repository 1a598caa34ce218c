//! `kiln image --via debugfs`, run as the unprivileged user `nobody` (setpriv): the tree it
//! writes is the tree the rootful mode writes (listed with owners, read back with debugfs),
//! `e2fsck -fn` finds the filesystem clean, re-runs and upgrades follow `kiln install`'s
//! rules, and what the mode cannot write is refused by name.

use crate::image_support;

use std::path::Path;
use std::process::Command;

use image_support::*;

const TOOLS: &[&str] = &[
    "sgdisk",
    "mkfs.ext4",
    "debugfs",
    "e2fsck",
    "qemu-img",
    "setpriv",
    "losetup",
    "mount",
];

#[test]
fn unprivileged_writes_the_tree_the_rootful_mode_writes() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let other = layer(&fx, "3.9", &d.join("out-3.9"));
    let layer = layer(&fx, "3.10", &d.join("out"));
    let base = gpt_base(d);
    let at = part_offset(&base, 2);
    let out = nobody_dir(d);
    let (a, b) = (d.join("loop.raw"), out.join("debugfs.raw"));
    let args = |out: &Path, layer: &Path, base: &Path, via: &'static str| {
        let v: Vec<std::ffi::OsString> = vec![
            "--base".into(),
            base.into(),
            "--layer".into(),
            layer.into(),
            "--out".into(),
            out.into(),
            "--format".into(),
            "raw".into(),
            "--via".into(),
            via.into(),
        ];
        v
    };
    let run_root = |v: Vec<std::ffi::OsString>| kiln().arg("image").args(v).output().unwrap();
    let run_nobody = |v: Vec<std::ffi::OsString>| {
        let r: Vec<&dyn AsRef<std::ffi::OsStr>> =
            v.iter().map(|x| x as &dyn AsRef<std::ffi::OsStr>).collect();
        as_nobody(&r)
    };
    ok(&run_root(args(&a, &layer, &base, "loop")), "rootful");
    let o = run_nobody(args(&b, &layer, &base, "debugfs"));
    ok(&o, "unprivileged");
    assert!(text(&o).contains("written via debugfs"), "{}", text(&o));
    assert_eq!(tree_at(&a, at, d), tree_at(&b, at, d));
    let dirs = [
        "/usr/bin",
        "/usr/lib/kiln",
        "/usr/lib/systemd/system",
        "/etc/systemd/system/multi-user.target.wants",
    ];
    let own = owners(&b, at, &dirs);
    assert!(own.len() > 10, "{own:#?}");
    assert_eq!(own, owners(&a, at, &dirs));
    assert!(own.iter().all(|l| l.ends_with(" 0:0")), "{own:#?}");
    fsck_clean(&b, at);
    // Only OUT and its SBOM are left: no staging or check copies.
    assert_eq!(
        leftovers(&out, &["debugfs.raw"]),
        Vec::<String>::new(),
        "leftovers"
    );

    // The node image as the base, the same layer: nothing written (kiln install's
    // idempotence), even though the filesystem could not hold the layer a second time.
    let c = out.join("again.raw");
    let o = run_nobody(args(&c, &layer, &b, "debugfs"));
    ok(&o, "unprivileged re-run");
    assert!(text(&o).contains("wrote 0, unchanged"), "{}", text(&o));
    assert_eq!(tree_at(&c, at, d), tree_at(&a, at, d));

    // Another image: refused without --replace, upgraded with it, to the tree the rootful
    // upgrade gives.
    let up = out.join("up.raw");
    let o = run_nobody(args(&up, &other, &b, "debugfs"));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("--replace"), "{}", text(&o));
    let mut v = args(&up, &other, &b, "debugfs");
    v.push("--replace".into());
    ok(&run_nobody(v), "unprivileged upgrade");
    let root_up = d.join("root-up.raw");
    let mut v = args(&root_up, &other, &a, "loop");
    v.push("--replace".into());
    ok(&run_root(v), "rootful upgrade");
    assert_eq!(tree_at(&up, at, d), tree_at(&root_up, at, d));
    fsck_clean(&up, at);

    // Byte-identical outputs: debugfs stamps SOURCE_DATE_EPOCH, not the clock (runs a
    // second apart), for raw and qcow2.
    for fmt in ["raw", "qcow2"] {
        let sums: Vec<String> = ["r1", "r2"]
            .iter()
            .map(|n| {
                std::thread::sleep(std::time::Duration::from_millis(1100));
                let p = out.join(format!("{n}.{fmt}"));
                let mut v = args(&p, &layer, &base, "debugfs");
                v.truncate(6);
                v.extend([
                    "--format".into(),
                    fmt.into(),
                    "--via".into(),
                    "debugfs".into(),
                ]);
                ok(&run_nobody(v), "reproducible");
                sha256_file(&p)
            })
            .collect();
        assert_eq!(sums[0], sums[1], "{fmt} outputs differ");
    }
}

#[test]
fn unprivileged_refuses_what_it_cannot_write_by_name() {
    if !require(TOOLS, true) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let layer = layer(&fx, "3.10", &d.join("out"));
    let out = nobody_dir(d);

    let sub = |n: &str| {
        let p = d.join(n);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    // A base whose /usr/lib is a symlink: debugfs would not follow it.
    let tree = base_tree(&sub("linked"));
    std::fs::rename(tree.join("usr/lib"), tree.join("usr/lib64")).unwrap();
    std::os::unix::fs::symlink("lib64", tree.join("usr/lib")).unwrap();
    let fs = ext4(&sub("linked"), &tree, 48, "root");
    let linked = d.join("linked.raw");
    gpt_disk(
        &linked,
        64,
        &[Part {
            start: 8,
            mib: 48,
            kind: ROOT_X86_64,
            name: "root",
            fs: Some(&fs),
        }],
    );
    let target = out.join("n.raw");
    let run = |base: &Path| {
        as_nobody(&[
            &"--base", &base, &"--layer", &layer, &"--out", &target, &"--via", &"debugfs",
        ])
    };
    let o = run(&linked);
    assert!(!o.status.success());
    let t = text(&o);
    assert!(
        t.contains("/usr/lib: is a symbolic link in the base") && t.contains("--via loop"),
        "{t}"
    );
    // As root, the same base is written: the symlink resolves inside the image.
    let o = kiln()
        .arg("image")
        .args(["--base".as_ref(), linked.as_os_str()])
        .args(["--layer".as_ref(), layer.as_os_str()])
        .args(["--out".as_ref(), d.join("linked-node.raw").as_os_str()])
        .args(["--via", "loop", "--format", "raw"])
        .output()
        .unwrap();
    ok(&o, "rootful through the symlink");

    // A journal that needs recovery: debugfs does not replay it.
    let dirty = d.join("dirty.raw");
    std::fs::copy(gpt_base(&sub("dirty")), &dirty).unwrap();
    let at = part_offset(&dirty, 2);
    sh(Command::new("debugfs")
        .args(["-w", "-R", "feature needs_recovery"])
        .arg(format!("{}?offset={at}", dirty.display())));
    let o = run(&dirty);
    assert!(!o.status.success());
    assert!(text(&o).contains("journal needs recovery"), "{}", text(&o));

    // An XFS superblock where the root is: the unprivileged mode writes ext4 only.
    let xfs = d.join("xfs.raw");
    std::fs::copy(gpt_base(&sub("xfs")), &xfs).unwrap();
    let at = part_offset(&xfs, 2);
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&xfs).unwrap();
        f.write_all_at(b"XFSB", at).unwrap();
        f.write_all_at(&[0u8; 2], at + 1024 + 56).unwrap();
    }
    let o = run(&xfs);
    assert!(!o.status.success());
    assert!(
        text(&o).contains("xfs (the unprivileged mode writes ext4 only"),
        "{}",
        text(&o)
    );

    // Not a disk image file at all.
    let o = run(Path::new("/dev/zero"));
    assert!(!o.status.success());
    assert!(
        text(&o).contains(
            "/dev/zero: expected a disk image file (or a block device), found a character device"
        ),
        "{}",
        text(&o)
    );
    assert_eq!(leftovers(&out, &[]), Vec::<String>::new());
}

/// `--node` without privileges: the contract files land with their modes, and a credential
/// an earlier config left in the base is removed (one credential, never two), as in the
/// rootful mode.
#[test]
fn unprivileged_node_config_replaces_the_old_credential() {
    if !require(TOOLS, true) || !require(&["openssl"], false) {
        return;
    }
    let fx = fixture(Bins::Tiny);
    let d = fx.dir.path();
    let layer = layer(&fx, "3.10", &d.join("out"));
    // A base whose /etc/kiln already holds another config's bootstrap token.
    let tree = base_tree(&d.join("b"));
    std::fs::create_dir_all(tree.join("etc/kiln")).unwrap();
    std::fs::write(
        tree.join("etc/kiln/bootstrap-token"),
        "old.token-of-another-config",
    )
    .unwrap();
    let fs = ext4(&d.join("b"), &tree, 48, "root");
    let base = d.join("base.raw");
    gpt_disk(
        &base,
        64,
        &[Part {
            start: 8,
            mib: 48,
            kind: ROOT_X86_64,
            name: "root",
            fs: Some(&fs),
        }],
    );
    let node = d.join("node");
    std::fs::create_dir_all(&node).unwrap();
    sh(Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args([
            "-nodes",
            "-subj",
            "/CN=kiln-test-ca",
            "-days",
            "2",
            "-keyout",
        ])
        .arg(node.join("ca.key"))
        .arg("-out")
        .arg(node.join("ca.crt")));
    let toml = node.join("node.toml");
    std::fs::write(
        &toml,
        "api_server = \"https://127.0.0.1:6443\"\ncluster_name = \"image-test\"\n\
         join_mode = \"kubelet\"\nprovider = \"aws\"\n\n[ca]\nfile = \"ca.crt\"\n\n\
         [bootstrap]\nkubeconfig_file = \"bootstrap.kubeconfig\"\n",
    )
    .unwrap();
    std::fs::write(
        node.join("bootstrap.kubeconfig"),
        "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
    )
    .unwrap();
    let out = nobody_dir(d).join("node.raw");
    let o = as_nobody(&[
        &"--base",
        &base,
        &"--layer",
        &layer,
        &"--node",
        &toml,
        &"--out",
        &out,
        &"--format",
        &"raw",
        &"--via",
        &"debugfs",
    ]);
    ok(&o, "unprivileged --node");
    let at = part_offset(&out, 1);
    let own = owners(&out, at, &["/etc/kiln"]);
    assert!(
        !own.iter().any(|l| l.contains("bootstrap-token")),
        "the old credential survived: {own:#?}"
    );
    let entry = |name: &str| {
        own.iter()
            .find(|l| l.starts_with(&format!("/etc/kiln/{name} ")))
            .unwrap_or_else(|| panic!("{name} not in /etc/kiln: {own:#?}"))
            .clone()
    };
    assert!(entry("node.env").ends_with(" 100644 0:0"), "{own:#?}");
    assert!(
        entry("bootstrap-kubeconfig").ends_with(" 100600 0:0"),
        "{own:#?}"
    );
    fsck_clean(&out, at);
}
