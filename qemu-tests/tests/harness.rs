//! The harness's failure paths with a real QEMU: a deadline kills QEMU and fails with the
//! console's tail, a guest that dies early fails the same way, and dropping a `Vm` kills it.

use std::path::Path;
use std::time::Duration;

use kiln_qemu_tests::guest::log_path;
use kiln_qemu_tests::vm::{Vm, VmConfig};
use kiln_qemu_tests::{assets, expect_ok, Error};

fn alive(pid: u32) -> bool {
    // A zombie still has /proc/<pid>; its state letter says it is dead.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn deadline_fails_with_the_console_tail_and_drop_kills_qemu() {
    let assets = expect_ok(assets::ensure());
    // No root disk: the kernel and initramfs run, nothing ever prints the awaited line.
    let cfg = VmConfig::new(assets, expect_ok(log_path("harness_deadline")));
    let vm = expect_ok(Vm::start(&cfg, assets));
    let pid = vm.pid();
    let err = vm
        .wait_for("a line that never comes", Duration::from_secs(6), |l| {
            l == "never"
        })
        .unwrap_err();
    match &err {
        Error::Timeout { secs, tail, .. } => {
            assert_eq!(*secs, 6);
            assert!(
                !tail.is_empty(),
                "the tail must show what the guest printed"
            );
            assert!(tail.lines().count() <= 50, "{tail}");
        }
        // Under heavy load the initramfs may already have given up and powered off.
        Error::Exited { tail, .. } => assert!(tail.contains("kiln-initramfs"), "{tail}"),
        other => panic!("unexpected error: {other}"),
    }
    assert!(err.to_string().contains("a line that never comes"), "{err}");
    drop(vm);
    assert!(!alive(pid), "QEMU (pid {pid}) still runs after drop");
    assert!(Path::new(&cfg.log).is_file());
}

#[test]
fn guest_that_powers_off_early_fails_with_its_last_lines() {
    let assets = expect_ok(assets::ensure());
    let cfg = VmConfig::new(assets, expect_ok(log_path("harness_early_exit")));
    let vm = expect_ok(Vm::start(&cfg, assets));
    let err = vm
        .wait_for("KILN-STATUS", Duration::from_secs(120), |l| {
            l.starts_with("KILN-STATUS")
        })
        .unwrap_err();
    let Error::Exited { tail, .. } = &err else {
        panic!("expected the guest to power off first: {err}");
    };
    assert!(
        tail.contains("kiln-initramfs: FATAL: root device /dev/vda did not appear"),
        "{tail}"
    );
}
