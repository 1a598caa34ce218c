//! `PROVIDER=auto`: which platform this is, from DMI (SMBIOS) values alone, offline. The
//! rules follow cloud-init's platform identification (sources in `docs/firstboot.md`);
//! [`detect`] is a pure function of a [`Dmi`] value, which [`Dmi::read`] fills from sysfs.

use std::fmt::Write as _;
use std::path::Path;

use crate::contract::paths;
use crate::contract::Provider;
use crate::fsutil;
use crate::provider::volume;

/// The DMI values detection looks at, trimmed; empty when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dmi {
    /// `/sys/class/dmi/id/sys_vendor` (SMBIOS system manufacturer).
    pub sys_vendor: String,
    /// `product_name` (system product name).
    pub product_name: String,
    /// `product_serial` (system serial number).
    pub product_serial: String,
    /// `product_uuid` (system UUID).
    pub product_uuid: String,
    /// `product_version`.
    pub product_version: String,
    /// `bios_vendor`.
    pub bios_vendor: String,
    /// `bios_version`.
    pub bios_version: String,
    /// `chassis_asset_tag`.
    pub chassis_asset_tag: String,
    /// `/sys/hypervisor/uuid` (Xen guests only).
    pub hypervisor_uuid: String,
    /// Whether QEMU's fw_cfg shows kiln's entries (`/sys/firmware/qemu_fw_cfg/…/opt/kiln`).
    pub qemu_fw_cfg: bool,
    /// Whether a volume labelled `config-2` is attached.
    pub config_drive: bool,
    /// Whether a volume labelled `cidata` is attached, or `ds=nocloud` is on the kernel
    /// command line or in the DMI serial.
    pub nocloud: bool,
}

/// The DMI files read, with the name each has in [`Dmi`] and in messages.
pub const DMI_FILES: [&str; 8] = [
    "sys_vendor",
    "product_name",
    "product_serial",
    "product_uuid",
    "product_version",
    "bios_vendor",
    "bios_version",
    "chassis_asset_tag",
];

/// The directory of the DMI files.
pub const DMI_DIR: &str = "/sys/class/dmi/id";
/// Xen's own UUID of the guest.
pub const HYPERVISOR_UUID: &str = "/sys/hypervisor/uuid";

/// One file's trimmed content, or empty when it is absent or unreadable (`product_serial`
/// and `product_uuid` are root-only on most kernels; firstboot runs as root).
fn read_trimmed(path: &Path) -> String {
    match fsutil::read_capped(path, 4096) {
        Ok(Some(s)) => s.trim().to_string(),
        _ => String::new(),
    }
}

impl Dmi {
    /// Reads the values: from sysfs under `root`; on Windows from the registry's copy of
    /// SMBIOS and the raw SMBIOS table (`provider/smbios.rs`), where `root` plays no part.
    pub fn read(root: &Path) -> Dmi {
        #[cfg(windows)]
        return Dmi {
            config_drive: volume::find(root, &volume::CONFIG_DRIVE).is_some(),
            nocloud: volume::find(root, &volume::NOCLOUD_SEED).is_some(),
            ..Dmi::with(&super::smbios::read_windows(&DMI_FILES))
        };
        #[cfg(not(windows))]
        Dmi::read_sysfs(root)
    }

    /// The values of [`DMI_FILES`], in that order.
    pub fn with(values: &[String]) -> Dmi {
        let mut d = Dmi::default();
        for (name, v) in DMI_FILES.iter().zip(values) {
            v.clone_into(d.field_mut(name));
        }
        d
    }

    /// Reads the sysfs files under `root` (Linux).
    pub fn read_sysfs(root: &Path) -> Dmi {
        let dir = paths::under(root, DMI_DIR);
        let mut d = Dmi {
            hypervisor_uuid: read_trimmed(&paths::under(root, HYPERVISOR_UUID)),
            qemu_fw_cfg: paths::under(root, crate::provider::qemu::FW_CFG_DIR).is_dir(),
            config_drive: volume::find(root, &volume::CONFIG_DRIVE).is_some(),
            nocloud: volume::find(root, &volume::NOCLOUD_SEED).is_some()
                || volume::nocloud_args(root).is_some(),
            ..Dmi::default()
        };
        for name in DMI_FILES {
            *d.field_mut(name) = read_trimmed(&dir.join(name));
        }
        d
    }

    fn field_mut(&mut self, name: &str) -> &mut String {
        match name {
            "sys_vendor" => &mut self.sys_vendor,
            "product_name" => &mut self.product_name,
            "product_serial" => &mut self.product_serial,
            "product_uuid" => &mut self.product_uuid,
            "product_version" => &mut self.product_version,
            "bios_vendor" => &mut self.bios_vendor,
            "bios_version" => &mut self.bios_version,
            "chassis_asset_tag" => &mut self.chassis_asset_tag,
            _ => &mut self.hypervisor_uuid,
        }
    }

    /// Every non-empty value as `name="value"`, space-separated, for messages; `no DMI
    /// values` when there are none.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let mut put = |name: &str, v: &str| {
            if !v.is_empty() {
                if !out.is_empty() {
                    out.push(' ');
                }
                let _ = write!(out, "{name}={v:?}");
            }
        };
        put("sys_vendor", &self.sys_vendor);
        put("product_name", &self.product_name);
        put("product_serial", &self.product_serial);
        put("product_uuid", &self.product_uuid);
        put("product_version", &self.product_version);
        put("bios_vendor", &self.bios_vendor);
        put("bios_version", &self.bios_version);
        put("chassis_asset_tag", &self.chassis_asset_tag);
        put("hypervisor_uuid", &self.hypervisor_uuid);
        if out.is_empty() {
            out.push_str("no DMI values");
        }
        out
    }
}

/// What detection concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detected {
    /// A supported platform (the rule that matched is in the comment beside each return,
    /// and in docs/firstboot.md).
    Provider(Provider),
    /// A cloud kiln recognises but has no provider for.
    Unsupported {
        /// The cloud's name.
        cloud: &'static str,
        /// The rule that matched.
        rule: &'static str,
    },
    /// Values that carry a known cloud's marker without matching its rule in full: the
    /// markers seen. Guessing here would be silent and maybe wrong, so `auto` stops.
    Partial {
        /// The cloud the markers point at.
        cloud: &'static str,
        /// Each marker, as `name="value"`.
        markers: Vec<String>,
    },
    /// Nothing known: no metadata source (bare metal, an unknown hypervisor).
    Nothing,
}

/// Azure's chassis asset tag (cloud-init `ChassisAssetTag.AZURE_CLOUD`).
pub const AZURE_ASSET_TAG: &str = "7783-7084-3265-9085-8269-3286-77";
/// GCE product names (cloud-init `platform_reports_gce`).
const GCE_PRODUCTS: [&str; 2] = ["Google Compute Engine", "Google"];
/// OpenStack product names (cloud-init `VALID_DMI_PRODUCT_NAMES`).
const OPENSTACK_PRODUCTS: [&str; 2] = ["OpenStack Nova", "OpenStack Compute"];
/// Asset tags of OpenStack clouds, branded or not (cloud-init `VALID_DMI_ASSET_TAGS`).
const OPENSTACK_ASSET_TAGS: [&str; 6] = [
    "OpenStack Nova",
    "OpenStack Compute",
    "HUAWEICLOUD",
    "OpenTelekomCloud",
    "Samsung Cloud Platform",
    "SAP CCloud VM",
];

/// True when `uuid` starts with `ec2` in either byte order, as cloud-init's `identify_aws`
/// checks: EC2 writes the UUID's first group big-endian on some instance types and
/// little-endian on others (`45E12AEC-…` reads `ec2ae145-…` the other way round).
fn ec2_uuid(uuid: &str) -> bool {
    let u = uuid.to_ascii_lowercase();
    if u.starts_with("ec2") {
        return true;
    }
    let first = u.split('-').next().unwrap_or("");
    first.len() == 8
        && u.len() == 36
        && first.bytes().all(|b| b.is_ascii_hexdigit())
        && &first[6..8] == "ec"
        && first.as_bytes()[4] == b'2'
}

fn marker(name: &str, value: &str) -> String {
    format!("{name}={value:?}")
}

/// The platform the DMI values name. Rules in order; the first that matches wins:
///
/// 1. Azure: `chassis_asset_tag` is Azure's tag.
/// 2. AWS: `sys_vendor` or `bios_vendor` is `Amazon EC2` (Nitro); or `/sys/hypervisor/uuid`
///    starts with `ec2` (Xen); or two of: `product_uuid` starts with `ec2` (either byte
///    order), `product_serial` starts with `ec2`, `bios_version` ends with `.amazon` (Xen).
///    One of those three alone is a partial match.
/// 3. GCE: `product_name` is `Google Compute Engine` or `Google`, or `product_serial` starts
///    with `GoogleCloud-`.
/// 4. OpenStack: `product_name` is `OpenStack Nova` or `OpenStack Compute`, or
///    `chassis_asset_tag` is one of the OpenStack tags, or `sys_vendor` is `OpenStack
///    Foundation`.
/// 5. VMware: `sys_vendor` is `VMware, Inc.`.
/// 6. Oracle Cloud (`chassis_asset_tag` `OracleCloud.com`), DigitalOcean, Hetzner, Akamai
///    (`Linode` or `Akamai`) and Scaleway (`sys_vendor`).
/// 7. NoCloud named by the DMI serial (`ds=nocloud…`); then a volume labelled `config-2`
///    (a config drive); then a volume labelled `cidata`, or `ds=nocloud` on the kernel
///    command line (NoCloud). A cloud's own DMI rule wins over its volume.
/// 8. Recognised, unsupported: Alibaba (`product_name` `Alibaba Cloud ECS`).
/// 9. QEMU with kiln's fw_cfg entries.
/// 10. A marker of a known cloud anywhere (`amazon`, `google`, `openstack`, `vmware`,
///     `alibaba`, `oracle`, `digitalocean`, `hetzner`, `linode`, `akamai`, `scaleway`,
///     case-insensitive) is a partial match.
pub fn detect(d: &Dmi) -> Detected {
    use Detected::*;
    if d.chassis_asset_tag == AZURE_ASSET_TAG {
        // chassis_asset_tag is Azure's
        return Provider(crate::contract::Provider::Azure);
    }
    if d.sys_vendor == "Amazon EC2" || d.bios_vendor == "Amazon EC2" {
        // vendor is Amazon EC2 (Nitro)
        return Provider(crate::contract::Provider::Aws);
    }
    if d.hypervisor_uuid.to_ascii_lowercase().starts_with("ec2") {
        // /sys/hypervisor/uuid starts with ec2 (Xen)
        return Provider(crate::contract::Provider::Aws);
    }
    let mut aws = Vec::new();
    if ec2_uuid(&d.product_uuid) {
        aws.push(marker("product_uuid", &d.product_uuid));
    }
    if d.product_serial.to_ascii_lowercase().starts_with("ec2") {
        aws.push(marker("product_serial", &d.product_serial));
    }
    if d.bios_version.ends_with(".amazon") {
        aws.push(marker("bios_version", &d.bios_version));
    }
    if aws.len() >= 2 {
        // two of product_uuid/product_serial starting with ec2, bios_version ending .amazon
        return Provider(crate::contract::Provider::Aws);
    }
    if GCE_PRODUCTS.contains(&d.product_name.as_str()) {
        // product_name is Google's
        return Provider(crate::contract::Provider::Gcp);
    }
    if d.product_serial.starts_with("GoogleCloud-") {
        // product_serial starts with GoogleCloud-
        return Provider(crate::contract::Provider::Gcp);
    }
    if OPENSTACK_PRODUCTS.contains(&d.product_name.as_str()) {
        // product_name is OpenStack's
        return Provider(crate::contract::Provider::Openstack);
    }
    if OPENSTACK_ASSET_TAGS.contains(&d.chassis_asset_tag.as_str()) {
        // chassis_asset_tag is an OpenStack cloud's
        return Provider(crate::contract::Provider::Openstack);
    }
    if d.sys_vendor == "OpenStack Foundation" {
        // sys_vendor is OpenStack Foundation
        return Provider(crate::contract::Provider::Openstack);
    }
    if d.sys_vendor == "VMware, Inc." {
        // sys_vendor is VMware, Inc.
        return Provider(crate::contract::Provider::Vmware);
    }
    use crate::contract::Provider as P;
    let sys_vendor = d.sys_vendor.as_str();
    for (p, hit) in [
        // chassis_asset_tag is OracleCloud.com (bare metal and VMs)
        (P::Oraclecloud, d.chassis_asset_tag == "OracleCloud.com"),
        (P::Digitalocean, sys_vendor == "DigitalOcean"),
        (P::Hetzner, sys_vendor == "Hetzner"),
        (P::Akamai, sys_vendor == "Linode" || sys_vendor == "Akamai"),
        (P::Scaleway, sys_vendor == "Scaleway"),
        // the DMI serial says ds=nocloud (QEMU's -smbios type=1,serial=ds=nocloud;…)
        (P::Nocloud, d.product_serial.starts_with("ds=nocloud")),
        // a volume labelled config-2
        (P::Configdrive, d.config_drive),
        // a volume labelled cidata, or ds=nocloud on the kernel command line
        (P::Nocloud, d.nocloud),
    ] {
        if hit {
            return Provider(p);
        }
    }
    if d.product_name == "Alibaba Cloud ECS" {
        return Unsupported {
            cloud: "Alibaba Cloud",
            rule: "product_name is Alibaba Cloud ECS",
        };
    }
    if d.sys_vendor == "QEMU" && d.qemu_fw_cfg {
        // sys_vendor is QEMU, fw_cfg has opt/kiln
        return Provider(crate::contract::Provider::Qemu);
    }
    if !aws.is_empty() {
        return Partial {
            cloud: "AWS",
            markers: aws,
        };
    }
    partial_markers(d)
}

/// Known clouds' words anywhere in the values: a rule that did not match in full.
fn partial_markers(d: &Dmi) -> Detected {
    const WORDS: [(&str, &str); 11] = [
        ("amazon", "AWS"),
        ("google", "GCE"),
        ("openstack", "OpenStack"),
        ("vmware", "VMware"),
        ("alibaba", "Alibaba Cloud"),
        ("oraclecloud", "Oracle Cloud"),
        ("digitalocean", "DigitalOcean"),
        ("hetzner", "Hetzner"),
        ("linode", "Akamai"),
        ("akamai", "Akamai"),
        ("scaleway", "Scaleway"),
    ];
    let fields = [
        ("sys_vendor", &d.sys_vendor),
        ("product_name", &d.product_name),
        ("product_serial", &d.product_serial),
        ("product_version", &d.product_version),
        ("bios_vendor", &d.bios_vendor),
        ("bios_version", &d.bios_version),
        ("chassis_asset_tag", &d.chassis_asset_tag),
    ];
    for (word, cloud) in WORDS {
        let markers: Vec<String> = fields
            .iter()
            .filter(|(_, v)| v.to_ascii_lowercase().contains(word))
            .map(|(n, v)| marker(n, v))
            .collect();
        if !markers.is_empty() {
            return Detected::Partial { cloud, markers };
        }
    }
    Detected::Nothing
}

/// One of [`DMI_FILES`] by its sysfs name ([`Dmi::read`]: on Windows from SMBIOS), trimmed;
/// empty when absent, unreadable or not one of them.
pub fn dmi_field(root: &Path, field: &str) -> String {
    if !DMI_FILES.contains(&field) {
        return String::new();
    }
    std::mem::take(Dmi::read(root).field_mut(field))
}

#[cfg(test)]
#[path = "detect_tests.rs"]
mod tests;
