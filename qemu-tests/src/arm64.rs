//! The arm64 node (issue 23): the ubuntu rootfs layer baked with `--arch arm64` (the
//! fixture's arm64 containerd, runc, CNI plugins and stand-in kubelet, and the static aarch64
//! kiln-firstboot), installed into the debootstrapped arm64 base and booted under
//! `qemu-system-aarch64 -machine virt` (TCG) with the IMDSv2 stand-in answering as a
//! Graviton instance. The pod check runs too, with `cri-smoke` and the pod images built for
//! arm64.

use std::time::Instant;

use crate::arch::Arch;
use crate::metadata::AwsInstance;
use crate::node::{boot, finish_root, rootfs_root, test_instance, Booted, NodeBoot};
use crate::scenario::{self};
use crate::Result;

/// The Graviton instance the arm64 node pretends to be: an m6g.large (the same ENI limits
/// as the amd64 scenarios' m5.large, so `MAX_PODS` is 29 again).
pub fn graviton_instance() -> AwsInstance {
    AwsInstance {
        instance_id: "i-0kiln0boot0arm64".into(),
        instance_type: "m6g.large".into(),
        local_ipv4: "10.0.5.11".into(),
        hostname: "ip-10-0-5-11.eu-west-1.compute.internal".into(),
        ..test_instance()
    }
}

/// The ELF `e_machine` of an aarch64 program (what the report unit prints for kubelet,
/// containerd and kiln-firstboot).
pub const EM_AARCH64: &str = "183";

/// The ubuntu rootfs node on arm64, end to end: bake for arm64, install into the arm64 base,
/// render the node's files, add the pod pieces for arm64, boot under qemu-system-aarch64.
pub fn boot_rootfs_node_arm64(spec: &NodeBoot) -> Result<Booted> {
    let t0 = Instant::now();
    let assets = crate::assets::ensure_arm64()?;
    let tools = scenario::tools()?;
    let work = tempfile::tempdir()?;
    let root = rootfs_root(tools, assets, work.path(), &spec.node)?;
    finish_root(&root, &spec.kubelet_mode, Arch::Arm64)?;
    if spec.pod {
        crate::pod::install_for(&root, "ubuntu", Arch::Arm64)?;
    }
    let disk = root.into_disk(&work.path().join("root.ext4"), 512)?;
    boot(
        assets,
        spec,
        disk,
        Vec::new(),
        t0.elapsed().as_millis() as u64,
    )
}
