//! Metadata volumes for the guest's second drive, made as their producers make them: a
//! NoCloud seed as `cloud-localds`/Proxmox write one (FAT, label `CIDATA`) and an OpenStack
//! config drive as Nova writes one (`genisoimage -ldots -allow-lowercase -allow-multidot -l
//! -J -r -V config-2`, nova/virt/configdrive.py `_make_iso9660`). kiln-firstboot finds each
//! by label and mounts it itself; the node has no metadata network.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::node::test_instance;
use crate::{io_err, Result};

/// The name and address the volumes give the node.
pub const HOSTNAME: &str = "flatcar-node-1";
/// The node's address in the volumes.
pub const NODE_IP: &str = "10.0.4.9";

fn write(dir: &Path, rel: &str, text: &str) -> Result<PathBuf> {
    let p = dir.join(rel);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).map_err(io_err(parent))?;
    }
    std::fs::write(&p, text).map_err(io_err(&p))?;
    Ok(p)
}

/// A 2 MiB FAT image labelled `label` holding `files` (name, text) in its root.
pub fn vfat(dir: &Path, label: &str, files: &[(&str, &str)]) -> Result<PathBuf> {
    let src = dir.join(format!("{label}.files"));
    let mut paths = Vec::new();
    for (name, text) in files {
        paths.push(write(&src, name, text)?);
    }
    let img = dir.join(format!("{label}.vfat"));
    let f = std::fs::File::create(&img).map_err(io_err(&img))?;
    f.set_len(2 << 20).map_err(io_err(&img))?;
    drop(f);
    crate::run(Command::new("mkfs.vfat").args(["-n", label]).arg(&img))?;
    crate::run(
        Command::new("mcopy")
            .arg("-i")
            .arg(&img)
            .args(&paths)
            .arg("::/"),
    )?;
    Ok(img)
}

/// The NoCloud volume: `meta-data` with the test instance's ID and [`HOSTNAME`], and a
/// netplan v2 `network-config` with [`NODE_IP`] (a flow sequence, as netplan examples
/// write it).
pub fn nocloud_volume(dir: &Path) -> Result<PathBuf> {
    let i = test_instance();
    vfat(
        dir,
        "CIDATA",
        &[
            (
                "meta-data",
                &format!("instance-id: {}\nlocal-hostname: {HOSTNAME}\n", i.instance_id),
            ),
            (
                "network-config",
                &format!("version: 2\nethernets:\n  eth0:\n    addresses: [{NODE_IP}/24]\n    dhcp4: false\n"),
            ),
        ],
    )
}

/// The config drive: Nova's `meta_data.json` (uuid, name, availability zone) and the EC2
/// document with the flavor and [`NODE_IP`], in an ISO 9660 image with Joliet and Rock Ridge.
pub fn config_drive(dir: &Path) -> Result<PathBuf> {
    let i = test_instance();
    let src = dir.join("config-2.files");
    write(
        &src,
        "openstack/latest/meta_data.json",
        &format!(
            "{{\"uuid\": \"{}\", \"name\": \"{HOSTNAME}\", \"hostname\": \"{HOSTNAME}.novalocal\", \"availability_zone\": \"{}\", \"launch_index\": 0}}\n",
            i.instance_id, i.zone
        ),
    )?;
    write(
        &src,
        "ec2/latest/meta-data.json",
        &format!(
            "{{\"instance-type\": \"{}\", \"local-ipv4\": \"{NODE_IP}\", \"placement\": {{\"availability-zone\": \"{}\"}}}}\n",
            i.instance_type, i.zone
        ),
    )?;
    let img = dir.join("config-2.iso");
    crate::run(
        Command::new("genisoimage")
            .args([
                "-quiet",
                "-ldots",
                "-allow-lowercase",
                "-allow-multidot",
                "-l",
                "-J",
                "-r",
            ])
            .args(["-V", "config-2", "-o"])
            .arg(&img)
            .arg(&src),
    )?;
    Ok(img)
}
