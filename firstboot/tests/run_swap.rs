//! `SWAP_FILE_SIZE`: the swap file is made under `--root` before kubelet starts, as mkswap
//! would make it (read back by util-linux's own `swaplabel`), mode 0600, made again at every
//! run; a link there is replaced, never followed; a failure is a warning, not a stop. Turning
//! it on (`swapon(2)`) happens only on the real root: the boot test `cloud_init` checks that.
#![cfg(unix)]

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use common::*;

fn run(root: &Root) -> Outcome {
    crate::run_providers::start_ok(root, &[], &crate::run_providers::imdsv2().url)
}

#[test]
fn the_swap_file_is_made_as_mkswap_makes_it() {
    let root = Root::node("Amazon EC2");
    root.node_env("PROVIDER=aws\nSWAP_FILE_SIZE=1048576\n");
    // A link at the name, to a file outside the node's tree: replaced, not followed.
    let elsewhere = Root::empty();
    elsewhere.write("precious", "not yours");
    std::fs::create_dir_all(root.path("var/lib/kiln")).unwrap();
    std::os::unix::fs::symlink(
        elsewhere.path("precious"),
        root.path("var/lib/kiln/swapfile"),
    )
    .unwrap();
    run(&root);
    assert_eq!(elsewhere.read("precious"), "not yours");
    let file = root.path("var/lib/kiln/swapfile");
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(meta.len(), 1 << 20);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    // Allocated, not sparse (the kernel refuses holes).
    assert!(std::os::unix::fs::MetadataExt::blocks(&meta) * 512 >= 1 << 20);
    let label = Command::new("swaplabel")
        .arg(&file)
        .output()
        .expect("util-linux swaplabel");
    assert!(
        label.status.success(),
        "swaplabel refused the file: {}",
        String::from_utf8_lossy(&label.stderr)
    );
    let blkid = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&blkid.stdout).trim(), "swap");
    // The write phase's console line says what was done.
    let console = root.read("console.log");
    assert!(
        console.lines().any(
            |l| l.contains("phase=write result=success") && l.contains("max_pods=29 swap=made")
        ),
        "{console}"
    );

    // A directory at the name: a warning, and the boot goes on.
    std::fs::remove_file(&file).unwrap();
    std::fs::create_dir(&file).unwrap();
    let out = run(&root);
    assert!(
        out.stderr
            .contains("warning: swap file not on: /var/lib/kiln/swapfile: "),
        "{}",
        out.stderr
    );
    let status = root.read("run/kiln/status.json");
    assert!(
        status.contains("swap file not on: /var/lib/kiln/swapfile: "),
        "{status}"
    );
}

#[test]
fn a_size_that_is_not_whole_pages_is_refused() {
    let root = Root::node("Amazon EC2");
    root.node_env("PROVIDER=aws\nSWAP_FILE_SIZE=1000\n");
    let srv = crate::run_providers::imdsv2();
    let out = firstboot(&root, &["--metadata-url", &srv.url, "--deadline", "5"]);
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(
        out.stderr.contains(
            "SWAP_FILE_SIZE: expected bytes: a multiple of 4096, at least 40960, found \"1000\""
        ),
        "{}",
        out.stderr
    );
}
