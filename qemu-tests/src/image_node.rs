//! A node made by `kiln image` and booted from its own bootloader: the Packer-free pipeline
//! (docs/image.md) end to end. A vendor-style bootable disk ([`crate::bootdisk`]) stands in
//! for the cloud's base image; `kiln image` applies the layer (ubuntu's rootfs layer, or
//! flatcar's sysext) and the node config to a copy and writes qcow2; QEMU boots that file
//! through the image's GRUB: from SeaBIOS for the Ubuntu-style disk, from UEFI firmware
//! (OVMF) for the Flatcar-style one, which has no BIOS boot partition.
//!
//! The harness's own pieces (the report unit, the stand-in kubelet's mode, the pod check's
//! images) are in the vendor disk before `kiln image` runs, as a vendor's agents would be:
//! everything kiln contributes reaches the node through `kiln image` alone.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::arch::Arch;
use crate::guest::Root;
use crate::node::{boot_with, finish_root, make_flatcar_like, Booted, NodeBoot};
use crate::{bootdisk, run, scenario, Result};

/// Which vendor image the node is made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Vendor {
    /// An Ubuntu-style cloud image and the ubuntu rootfs layer.
    Ubuntu,
    /// A Flatcar-style image (partition 9 `ROOT`, `ID=flatcar`, systemd-sysext at boot) and
    /// the flatcar sysext, which `kiln image` places in `/etc/extensions/`.
    Flatcar,
}

/// What `kiln image` printed and the disk it wrote.
#[derive(Debug)]
pub struct Imaged {
    /// The node image (qcow2).
    pub image: PathBuf,
    /// `kiln image`'s stdout.
    pub report: String,
    /// The layer's file name (the sysext's `NAME.raw` for Flatcar).
    pub layer_name: String,
}

/// Builds the vendor disk under `work` and turns it into a node image with `kiln image`.
pub fn make_image(work: &Path, spec: &NodeBoot, vendor: Vendor) -> Result<Imaged> {
    let assets = crate::assets::ensure()?;
    let tools = scenario::tools()?;
    let layer = match vendor {
        Vendor::Ubuntu => crate::node::ubuntu_layer(tools, assets)?,
        Vendor::Flatcar => {
            let baked = scenario::bake(tools, "flatcar", "sysext")?;
            scenario::pick(&baked, ".raw")?
        }
    };

    // The node config (and the CA the stand-in's "cluster" signs with) first: the signed
    // client certificate below is issued by that CA.
    let node_toml = scenario::node_toml(&work.join("node"), &spec.node)?;
    let root = Root::from_base(&assets.base, work)?;
    root.write(
        scenario::SIGNED_CLIENT,
        scenario::signed_client(&work.join("node"))?,
        0o600,
    )?;
    let (layout, image_name) = match vendor {
        Vendor::Ubuntu => (bootdisk::UBUNTU, "ubuntu"),
        Vendor::Flatcar => {
            make_flatcar_like(&root)?;
            // Metadata comes from a volume: no NIC for network-online.target to wait for.
            root.mask("systemd-networkd-wait-online.service")?;
            (bootdisk::FLATCAR, "flatcar")
        }
    };
    finish_root(&root, &spec.kubelet_mode, Arch::Amd64)?;
    if spec.pod {
        crate::pod::install(&root, image_name)?;
    }
    let base = bootdisk::vendor_disk(root, assets, layout, &work.join("vendor.raw"), 1024)?;
    let _ = std::fs::remove_dir_all(work.join("root"));

    let image = work.join("node.qcow2");
    let out = run(Command::new(&tools.kiln)
        .arg("image")
        .arg("--base")
        .arg(&base)
        .arg("--layer")
        .arg(&layer)
        .arg("--node")
        .arg(&node_toml)
        .arg("--out")
        .arg(&image)
        .args(["--format", "qcow2"]))?;
    Ok(Imaged {
        image,
        report: String::from_utf8_lossy(&out.stdout).into_owned(),
        layer_name: layer
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
    })
}

/// [`make_image`], then a boot of the node image from its own bootloader.
pub fn boot_image_node(spec: &NodeBoot, vendor: Vendor) -> Result<(Booted, Imaged)> {
    let t0 = Instant::now();
    let work = tempfile::tempdir()?;
    let imaged = make_image(work.path(), spec, vendor)?;
    let assets = crate::assets::ensure()?;
    let disk = imaged.image.clone();
    let firmware = match vendor {
        Vendor::Ubuntu => None,
        Vendor::Flatcar => {
            let ovmf = PathBuf::from(bootdisk::OVMF);
            if !ovmf.is_file() {
                return Err(crate::Error::Missing {
                    what: format!("UEFI firmware ({})", ovmf.display()),
                    hint: "install ovmf with `make deps-qemu` (scripts/deps.sh qemu)".into(),
                });
            }
            Some(ovmf)
        }
    };
    let booted = boot_with(assets, spec, t0.elapsed().as_millis() as u64, |cfg| {
        cfg.root = Some(disk);
        cfg.root_format = "qcow2";
        cfg.from_disk = true;
        cfg.firmware = firmware;
    })?;
    Ok((booted, imaged))
}
