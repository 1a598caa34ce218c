//! The ubuntu node on arm64 (issue 23), a module of the scenarios test binary so it shares
//! their helpers: `cargo nextest run -p kiln-qemu-tests --test it ubuntu_aws_arm64`.

use std::time::Duration;

use kiln_qemu_tests::expect_ok;
use kiln_qemu_tests::node::{timeline, Metadata};

use super::{assert_aws_node, assert_doctor, assert_pod_ran, assert_registered, spec_with_pod};

/// The ubuntu node on arm64 (issue 23): baked with `--arch arm64` from the fixture mirror,
/// installed into the debootstrapped arm64 base, booted under `qemu-system-aarch64 -machine
/// virt` (TCG). The node config names its provider (`aws`): an arm64 kernel booted without
/// UEFI firmware has no SMBIOS tables to detect it from. Everything that runs is aarch64:
/// the kernel, systemd, Debian's containerd/runc/CNI, the stand-in kubelet, kiln-firstboot
/// and the pod (cri-smoke, pause and busybox built for arm64).
#[test]
fn ubuntu_aws_arm64() {
    use kiln_qemu_tests::arm64::{boot_rootfs_node_arm64, graviton_instance, EM_AARCH64};
    let i = graviton_instance();
    let mut s = spec_with_pod(
        "ubuntu_aws_arm64",
        "success",
        Metadata::AwsAs(i.clone()),
        420,
    );
    s.node.provider = "aws".into();
    s.timeout = Duration::from_secs(900);
    let b = expect_ok(boot_rootfs_node_arm64(&s));
    eprintln!(
        "ubuntu-aws-arm64 timeline ({}):\n{}",
        b.log.display(),
        timeline(&b)
    );
    eprintln!(
        "{}",
        kiln_qemu_tests::node::bench_line("ubuntu-aws-arm64", &b)
    );
    let o = &b.outcome;
    assert_eq!(o.result(), "success", "status: {}", o.status);
    assert_registered(o);
    // The guest is an aarch64 machine and what kiln installed is aarch64 code.
    assert_eq!(
        o.facts.get("uname-m").map(String::as_str),
        Some("aarch64"),
        "{:?}",
        o.facts
    );
    for b in ["kubelet", "containerd", "kiln-firstboot"] {
        assert_eq!(
            o.facts
                .get(&format!("elf-machine:/usr/bin/{b}"))
                .map(String::as_str),
            Some(EM_AARCH64),
            "/usr/bin/{b} is not an aarch64 program: {:?}",
            o.facts
        );
    }
    assert!(
        b.lines
            .iter()
            .any(|l| l.text.contains("Booting Linux on physical CPU")),
        "no arm64 kernel banner on the console"
    );
    assert_pod_ran(o, "ubuntu");
    // The aarch64 kiln-firstboot's doctor, on the arm64 node, finds what it finds on amd64.
    assert_doctor(o);
    assert_eq!(o.status["provider"], "aws");
    assert_aws_node(&b, &i, &[]);
}
