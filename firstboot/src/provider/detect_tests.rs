//! detect's tests.
use super::*;
use crate::contract::Provider as P;

/// A [`Dmi`] from `name=value` pairs.
fn dmi(pairs: &[(&str, &str)]) -> Dmi {
    let mut d = Dmi::default();
    for (k, v) in pairs {
        if *k == "qemu_fw_cfg" {
            d.qemu_fw_cfg = true;
        } else if *k == "config_drive" {
            d.config_drive = true;
        } else if *k == "nocloud" {
            d.nocloud = true;
        } else if *k == "hypervisor_uuid" {
            d.hypervisor_uuid = v.to_string();
        } else {
            *d.field_mut(k) = v.to_string();
        }
    }
    d
}

fn provider(d: &Detected) -> Option<P> {
    match d {
        Detected::Provider(p) => Some(*p),
        _ => None,
    }
}

#[test]
fn supported_platforms() {
    let xen_t2 = [
        ("sys_vendor", "Xen"),
        ("product_name", "HVM domU"),
        ("product_version", "4.2.amazon"),
        ("bios_vendor", "Xen"),
        ("bios_version", "4.2.amazon"),
        ("product_uuid", "EC23E5E6-3996-D6A8-C001-0CAFDB88A415"),
        ("product_serial", "ec23e5e6-3996-d6a8-c001-0cafdb88a415"),
    ];
    let table: &[(&[(&str, &str)], P)] = &[
        (
            &[("sys_vendor", "Amazon EC2"), ("product_name", "t4g.large")],
            P::Aws,
        ),
        (
            &[("sys_vendor", "Xen"), ("bios_vendor", "Amazon EC2")],
            P::Aws,
        ),
        (&xen_t2, P::Aws),
        // The same without the serial: UUID and BIOS version still agree.
        (&xen_t2[..6], P::Aws),
        (
            &[("hypervisor_uuid", "ec2a59ce-6314-efdb-3e42-da23b011c047")],
            P::Aws,
        ),
        // The other byte order (cloud-init's example).
        (
            &[
                ("product_uuid", "45E12AEC-DCD1-B213-94ED-012345ABCDEF"),
                ("bios_version", "4.11.amazon"),
            ],
            P::Aws,
        ),
        (&[("chassis_asset_tag", AZURE_ASSET_TAG)], P::Azure),
        (
            &[
                ("sys_vendor", "Microsoft Corporation"),
                ("product_name", "Virtual Machine"),
                ("chassis_asset_tag", AZURE_ASSET_TAG),
            ],
            P::Azure,
        ),
        (&[("product_name", "Google Compute Engine")], P::Gcp),
        (&[("product_name", "Google")], P::Gcp),
        (
            &[("product_serial", "GoogleCloud-0123456789ABCDEF")],
            P::Gcp,
        ),
        (&[("product_name", "OpenStack Nova")], P::Openstack),
        (&[("product_name", "OpenStack Compute")], P::Openstack),
        (&[("sys_vendor", "OpenStack Foundation")], P::Openstack),
        (&[("chassis_asset_tag", "HUAWEICLOUD")], P::Openstack),
        (&[("chassis_asset_tag", "OpenTelekomCloud")], P::Openstack),
        (
            &[("chassis_asset_tag", "Samsung Cloud Platform")],
            P::Openstack,
        ),
        (&[("chassis_asset_tag", "SAP CCloud VM")], P::Openstack),
        (&[("sys_vendor", "VMware, Inc.")], P::Vmware),
        (&[("sys_vendor", "QEMU"), ("qemu_fw_cfg", "")], P::Qemu),
        (&[("chassis_asset_tag", "OracleCloud.com")], P::Oraclecloud),
        (&[("sys_vendor", "DigitalOcean")], P::Digitalocean),
        (&[("sys_vendor", "Hetzner")], P::Hetzner),
        (&[("sys_vendor", "Linode")], P::Akamai),
        (&[("sys_vendor", "Akamai")], P::Akamai),
        (&[("sys_vendor", "Scaleway")], P::Scaleway),
        (&[("config_drive", "")], P::Configdrive),
        (&[("nocloud", "")], P::Nocloud),
        // A config drive beside fw_cfg: the drive (it carries the identity).
        (
            &[
                ("sys_vendor", "QEMU"),
                ("qemu_fw_cfg", ""),
                ("config_drive", ""),
            ],
            P::Configdrive,
        ),
        // A cloud's own rule wins over a volume it also attaches.
        (
            &[("sys_vendor", "DigitalOcean"), ("config_drive", "")],
            P::Digitalocean,
        ),
        (
            &[
                ("product_serial", "ds=nocloud;s=http://127.0.0.1/"),
                ("config_drive", ""),
            ],
            P::Nocloud,
        ),
    ];
    for (pairs, want) in table {
        let got = detect(&dmi(pairs));
        assert_eq!(provider(&got), Some(*want), "{pairs:?}: {got:?}");
    }
}

#[test]
fn recognised_but_unsupported() {
    for (pairs, want) in [([("product_name", "Alibaba Cloud ECS")], "Alibaba Cloud")] {
        match detect(&dmi(&pairs)) {
            Detected::Unsupported { cloud, .. } => assert_eq!(cloud, want),
            other => panic!("{pairs:?}: {other:?}"),
        }
    }
}

#[test]
fn a_marker_without_its_rule_is_partial() {
    // (DMI values, the cloud named, the markers named)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a str, &'a [&'a str]);
    let table: &[Case<'_>] = &[
        // A Xen guest whose BIOS says Amazon but whose UUID does not.
        (
            &[("sys_vendor", "Xen"), ("bios_version", "4.11.amazon")],
            "AWS",
            &["bios_version=\"4.11.amazon\""],
        ),
        // One ec2 UUID alone: 1 in 4096 random UUIDs start so.
        (
            &[("product_uuid", "ec2a59ce-6314-efdb-3e42-da23b011c047")],
            "AWS",
            &["product_uuid=\"ec2a59ce-6314-efdb-3e42-da23b011c047\""],
        ),
        (
            &[("sys_vendor", "Amazon"), ("product_name", "x")],
            "AWS",
            &["sys_vendor=\"Amazon\""],
        ),
        (
            &[("sys_vendor", "Google"), ("product_name", "Unknown")],
            "GCE",
            &["sys_vendor=\"Google\""],
        ),
        (
            &[("sys_vendor", "RDO"), ("product_name", "OpenStack Kilo")],
            "OpenStack",
            &["product_name=\"OpenStack Kilo\""],
        ),
        (
            &[("product_name", "VMware7,1")],
            "VMware",
            &["product_name=\"VMware7,1\""],
        ),
    ];
    for (pairs, cloud, markers) in table {
        match detect(&dmi(pairs)) {
            Detected::Partial {
                cloud: c,
                markers: m,
            } => {
                assert_eq!(
                    (&c, m.as_slice()),
                    (
                        cloud,
                        &markers.iter().map(|s| s.to_string()).collect::<Vec<_>>()[..]
                    ),
                    "{pairs:?}"
                )
            }
            other => panic!("{pairs:?}: {other:?}"),
        }
    }
}

#[test]
fn nothing_known() {
    for pairs in [
        &[][..],
        &[
            ("sys_vendor", "QEMU"),
            ("product_name", "Standard PC (Q35 + ICH9, 2009)"),
        ],
        &[
            ("sys_vendor", "Dell Inc."),
            ("product_name", "PowerEdge R640"),
        ],
        &[
            ("sys_vendor", "Microsoft Corporation"),
            ("product_name", "Virtual Machine"),
        ],
        &[("product_uuid", "12345678-1234-1234-1234-123456789abc")],
    ] {
        assert_eq!(detect(&dmi(pairs)), Detected::Nothing, "{pairs:?}");
    }
}

#[test]
fn values_are_described_for_messages() {
    let d = dmi(&[
        ("sys_vendor", "Dell Inc."),
        ("product_name", "PowerEdge R640"),
    ]);
    assert_eq!(
        d.describe(),
        "sys_vendor=\"Dell Inc.\" product_name=\"PowerEdge R640\""
    );
    assert_eq!(Dmi::default().describe(), "no DMI values");
}

#[test]
fn values_are_read_from_sysfs_under_the_root() {
    let root = std::env::temp_dir().join(format!("kiln-dmi-{}", std::process::id()));
    let dir = paths::under(&root, DMI_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("sys_vendor"), "Xen\n").unwrap();
    std::fs::write(dir.join("bios_version"), "4.2.amazon\n").unwrap();
    let hv = paths::under(&root, HYPERVISOR_UUID);
    std::fs::create_dir_all(hv.parent().unwrap()).unwrap();
    std::fs::write(&hv, "ec23e5e6-3996-d6a8-c001-0cafdb88a415\n").unwrap();
    let d = Dmi::read_sysfs(&root);
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(
        (
            d.sys_vendor.as_str(),
            d.bios_version.as_str(),
            d.qemu_fw_cfg
        ),
        ("Xen", "4.2.amazon", false)
    );
    assert_eq!(d.hypervisor_uuid, "ec23e5e6-3996-d6a8-c001-0cafdb88a415");
    assert_eq!(provider(&detect(&d)), Some(P::Aws));
}
