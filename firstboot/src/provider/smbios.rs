//! `PROVIDER=auto` on Windows: the DMI values [`super::detect`] reads, from the two places
//! Windows publishes SMBIOS. Windows copies some SMBIOS strings into the registry at boot
//! (`HKLM\HARDWARE\DESCRIPTION\System\BIOS`: `SystemManufacturer`, `SystemProductName`, …),
//! but not the system serial number, UUID or chassis asset tag the rules need (Azure is
//! told from Hyper-V only by its chassis asset tag); those come from the raw table
//! `GetSystemFirmwareTable('RSMB')` returns, parsed here the way Linux's `dmi_decode`
//! (`drivers/firmware/dmi_scan.c`) fills `/sys/class/dmi/id`. Everything here is a pure
//! function of bytes and strings, so it is tested on every host; the Win32 calls are in
//! `windows/firmware.rs`.

use std::fmt::Write as _;

/// The registry key Windows fills from SMBIOS at every boot (volatile: rebuilt each boot).
pub const BIOS_KEY: &str = r"HARDWARE\DESCRIPTION\System\BIOS";

/// The registry value of [`BIOS_KEY`] that carries each DMI value (sysfs names). Values
/// not listed (serial, UUID, chassis asset tag) are only in the SMBIOS table.
pub const REGISTRY_VALUES: [(&str, &str); 5] = [
    ("sys_vendor", "SystemManufacturer"),
    ("product_name", "SystemProductName"),
    ("product_version", "SystemVersion"),
    ("bios_vendor", "BIOSVendor"),
    ("bios_version", "BIOSVersion"),
];

/// Where each string is in the table: (sysfs name, structure type, offset of its string
/// number), as Linux's `dmi_decode` saves them (SMBIOS 3.x: type 0 BIOS, 1 system,
/// 2 baseboard, 3 chassis).
const STRINGS: [(&str, u8, usize); 16] = [
    ("bios_vendor", 0, 0x04),
    ("bios_version", 0, 0x05),
    ("bios_date", 0, 0x08),
    ("sys_vendor", 1, 0x04),
    ("product_name", 1, 0x05),
    ("product_version", 1, 0x06),
    ("product_serial", 1, 0x07),
    ("product_sku", 1, 0x19),
    ("product_family", 1, 0x1A),
    ("board_vendor", 2, 0x04),
    ("board_name", 2, 0x05),
    ("board_version", 2, 0x06),
    ("board_serial", 2, 0x07),
    ("board_asset_tag", 2, 0x08),
    ("chassis_vendor", 3, 0x04),
    ("chassis_asset_tag", 3, 0x08),
];

/// The system UUID: 16 bytes at offset 8 of the type 1 structure.
const UUID_AT: usize = 0x08;

/// An SMBIOS table as Linux would show it in `/sys/class/dmi/id`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Table {
    /// SMBIOS major and minor version (from the RSMB header).
    pub version: (u8, u8),
    /// `(sysfs name, value)` for every string found non-blank, and `product_uuid`.
    pub fields: Vec<(&'static str, String)>,
    /// Where the walk stopped before the end-of-table structure or the data's end, and why:
    /// a structure cut short or malformed. What came before it is kept.
    pub truncated: Option<String>,
}

impl Table {
    /// A value by its sysfs name; empty when absent.
    pub fn get(&self, name: &str) -> &str {
        self.fields
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// Parses what `GetSystemFirmwareTable('RSMB', 0, …)` returns: the 8-byte `RawSMBIOSData`
/// header (calling method, major, minor, DMI revision, u32 length), then the structures.
/// Every read is bounds-checked: a table cut short keeps what precedes the cut. `None`:
/// not even the header is there.
pub fn parse(raw: &[u8]) -> Option<Table> {
    let header = raw.get(..8)?;
    let declared = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
    let body = &raw[8..];
    let mut t = Table {
        version: (header[1], header[2]),
        ..Table::default()
    };
    let data = if declared > body.len() {
        t.truncated = Some(format!(
            "the header declares {declared} bytes of structures, {} are there",
            body.len()
        ));
        body
    } else {
        &body[..declared]
    };
    let mut at = 0;
    let mut seen = [false; 4];
    while at < data.len() {
        let Some(&[kind, len]) = data.get(at..at + 2) else {
            t.truncated = Some(format!("structure header cut short at offset {at}"));
            break;
        };
        let len = len as usize;
        if len < 4 || at + len > data.len() {
            t.truncated = Some(format!(
                "type {kind} structure at offset {at}: length {len} does not fit"
            ));
            break;
        }
        let formatted = &data[at..at + len];
        // The string set: NUL-terminated strings, ended by one more NUL ("\0\0" when empty).
        let Some(end) = data[at + len..].windows(2).position(|w| w == [0, 0]) else {
            t.truncated = Some(format!(
                "type {kind} structure at offset {at}: its strings have no end"
            ));
            break;
        };
        let strings = &data[at + len..at + len + end];
        at += len + end + 2;
        if kind == 127 {
            return Some(t);
        }
        // The first structure of each type counts, as for Linux.
        let Some(first) = seen.get_mut(kind as usize) else {
            continue;
        };
        if std::mem::replace(first, true) {
            continue;
        }
        for (name, _, offset) in STRINGS.iter().filter(|(_, k, _)| *k == kind) {
            let v = formatted.get(*offset).map_or("", |&n| string(strings, n));
            if !v.is_empty() {
                t.fields.push((name, v.to_string()));
            }
        }
        if kind == 1 {
            if let Some(uuid) = formatted.get(UUID_AT..UUID_AT + 16) {
                if let Some(u) = uuid_text(uuid, t.version) {
                    t.fields.push(("product_uuid", u));
                }
            }
        }
    }
    Some(t)
}

/// String number `n` (1-based; 0 is "none") of a string set, trimmed; empty when absent.
fn string(set: &[u8], n: u8) -> &str {
    if n == 0 {
        return "";
    }
    set.split(|&b| b == 0)
        .nth(n as usize - 1)
        .and_then(|s| std::str::from_utf8(s).ok())
        .map_or("", str::trim)
}

/// The UUID as Linux prints `product_uuid`: lower-case; from SMBIOS 2.6 on, the first three
/// fields are little-endian (`%pUl`), before that big-endian (`%pUb`). All zeros or all
/// 0xFF means "not set": none.
fn uuid_text(b: &[u8], version: (u8, u8)) -> Option<String> {
    if b.iter().all(|&x| x == 0) || b.iter().all(|&x| x == 0xFF) {
        return None;
    }
    let order: [usize; 16] = if version >= (2, 6) {
        [3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15]
    } else {
        [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    };
    let mut s = String::with_capacity(36);
    for (i, &k) in order.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        let _ = write!(s, "{:02x}", b[k]);
    }
    Some(s)
}

/// The values of `names` (sysfs names, in that order) from Windows' two sources: the
/// registry value of [`BIOS_KEY`] when it is set and not blank (`registry` reads one by
/// its value name), else the SMBIOS table's string; trimmed, empty when neither has it.
pub fn windows_values(
    names: &[&str],
    registry: &dyn Fn(&str) -> Option<String>,
    table: Option<&Table>,
) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            let from_registry = REGISTRY_VALUES
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, value)| registry(value))
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty());
            from_registry.unwrap_or_else(|| table.map_or("", |t| t.get(name)).trim().to_string())
        })
        .collect()
}

/// Reads both sources on this machine: the registry's values and the raw table.
#[cfg(windows)]
pub fn read_windows(names: &[&str]) -> Vec<String> {
    use crate::windows::firmware;
    let table = firmware::smbios_table().and_then(|raw| parse(&raw));
    windows_values(
        names,
        &|value| firmware::registry_string(BIOS_KEY, value),
        table.as_ref(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Provider as P;
    use crate::provider::detect::{detect, Detected, Dmi};

    /// A table from `(type, formatted bytes after the 4-byte header, strings)`, behind an
    /// RSMB header of `version`.
    fn build(version: (u8, u8), structs: &[(u8, Vec<u8>, &[&str])]) -> Vec<u8> {
        let mut data = Vec::new();
        for (i, (kind, formatted, strings)) in structs.iter().enumerate() {
            data.extend_from_slice(&[*kind, (formatted.len() + 4) as u8, i as u8, 0]);
            data.extend_from_slice(formatted);
            for s in strings.iter() {
                data.extend_from_slice(s.as_bytes());
                data.push(0);
            }
            if strings.is_empty() {
                data.push(0);
            }
            data.push(0);
        }
        let mut raw = vec![0, version.0, version.1, 0];
        raw.extend_from_slice(&(data.len() as u32).to_le_bytes());
        raw.extend_from_slice(&data);
        raw
    }

    /// Type 0 (BIOS): vendor 1, version 2, release date 3.
    fn bios(strings: &'static [&'static str]) -> (u8, Vec<u8>, &'static [&'static str]) {
        let mut f = vec![0; 14];
        (f[0], f[1], f[4]) = (1, 2, 3);
        (0, f, strings)
    }

    /// Type 1 (system): manufacturer 1, product 2, version 3, serial 4, `uuid`, SKU 5.
    fn system(
        uuid: [u8; 16],
        strings: &'static [&'static str],
    ) -> (u8, Vec<u8>, &'static [&'static str]) {
        let mut f = vec![1, 2, 3, 4];
        f.extend_from_slice(&uuid);
        f.extend_from_slice(&[6, 5, 0]);
        (1, f, strings)
    }

    /// Type 3 (chassis): manufacturer 1, type 1 ("other"), version 2, serial 3, asset tag 4.
    fn chassis(strings: &'static [&'static str]) -> (u8, Vec<u8>, &'static [&'static str]) {
        (3, vec![1, 1, 2, 3, 4, 3, 3, 3, 2], strings)
    }

    fn end() -> (u8, Vec<u8>, &'static [&'static str]) {
        (127, vec![], &[])
    }

    /// EC2's UUID bytes as the firmware stores them (AWS's example `EC2AE145-D1DC-…`).
    const EC2_UUID: [u8; 16] = [
        0xEC, 0x2A, 0xE1, 0x45, 0xD1, 0xDC, 0x13, 0xB2, 0x94, 0xED, 0x01, 0x23, 0x45, 0xAB, 0xCD,
        0xEF,
    ];

    fn xen_ec2(version: (u8, u8)) -> Vec<u8> {
        build(
            version,
            &[
                bios(&["Xen", "4.11.amazon", "08/24/2006"]),
                system(
                    EC2_UUID,
                    &[
                        "Xen",
                        "HVM domU",
                        "4.11.amazon",
                        "ec2ae145-d1dc-13b2-94ed-012345abcdef",
                        "t2.micro",
                    ],
                ),
                (2, vec![1, 2, 0, 0, 0], &["Amazon", "Board"]),
                chassis(&["Xen"]),
                end(),
            ],
        )
    }

    #[test]
    fn strings_and_uuid_land_under_their_sysfs_names() {
        let t = parse(&xen_ec2((2, 4))).unwrap();
        assert_eq!(t.truncated, None);
        assert_eq!(t.version, (2, 4));
        for (name, want) in [
            ("bios_vendor", "Xen"),
            ("bios_version", "4.11.amazon"),
            ("bios_date", "08/24/2006"),
            ("sys_vendor", "Xen"),
            ("product_name", "HVM domU"),
            ("product_version", "4.11.amazon"),
            ("product_serial", "ec2ae145-d1dc-13b2-94ed-012345abcdef"),
            ("product_sku", "t2.micro"),
            ("product_family", ""),
            ("board_vendor", "Amazon"),
            ("board_name", "Board"),
            ("board_version", ""),
            ("chassis_vendor", "Xen"),
            ("chassis_asset_tag", ""),
            // SMBIOS 2.4: printed as stored.
            ("product_uuid", "ec2ae145-d1dc-13b2-94ed-012345abcdef"),
        ] {
            assert_eq!(t.get(name), want, "{name}");
        }
        // From 2.6 on the first three fields are little-endian, as Linux prints them: the
        // byte-swapped form AWS documents for Windows (`45E12AEC-DCD1-B213-…`).
        let t = parse(&xen_ec2((2, 7))).unwrap();
        assert_eq!(
            t.get("product_uuid"),
            "45e12aec-dcd1-b213-94ed-012345abcdef"
        );
    }

    #[test]
    fn absent_blank_and_repeated_values() {
        let raw = build(
            (3, 4),
            &[
                // String number 0, a number past the set, and a blank string.
                (1, vec![0, 9, 1], &["   "]),
                // Only the first structure of a type counts.
                system([7; 16], &["Second"]),
                // A chassis too short to hold the asset tag's string number.
                (3, vec![1, 1, 0, 0], &["Maker"]),
                (
                    3,
                    vec![1, 1, 0, 0, 2],
                    &["Other", "7783-7084-3265-9085-8269-3286-77"],
                ),
                end(),
                // Nothing after the end-of-table structure is read.
                bios(&["After", "the", "end"]),
            ],
        );
        let t = parse(&raw).unwrap();
        assert_eq!(t.fields, [("chassis_vendor", "Maker".to_string())], "{t:?}");
        // A system structure too short for the UUID has its strings and no UUID; a UUID of
        // all zeros or all 0xFF is "not set".
        for (uuid, want) in [([0u8; 16], ""), ([0xFF; 16], "")] {
            let t = parse(&build((2, 8), &[system(uuid, &["A", "B"])])).unwrap();
            assert_eq!((t.get("sys_vendor"), t.get("product_uuid")), ("A", want));
        }
        let t = parse(&build((2, 8), &[(1, vec![1, 2, 0, 0, 0xEC], &["A", "B"])])).unwrap();
        assert_eq!((t.get("product_name"), t.get("product_uuid")), ("B", ""));
    }

    #[test]
    fn cut_and_malformed_tables_keep_what_precedes_the_damage() {
        let good = xen_ec2((2, 7));
        assert_eq!(parse(&good[..7]), None);
        // Every cut: never a panic; whatever was complete before the cut is kept.
        for cut in 8..good.len() {
            let t = parse(&good[..cut]).unwrap();
            assert!(t.truncated.is_some(), "cut at {cut}: {t:?}");
            let whole = parse(&good).unwrap();
            for (name, v) in &t.fields {
                assert_eq!(whole.get(name), v, "cut at {cut}");
            }
        }
        // A cut whose header agrees with it (the length field rewritten).
        let mut agreed = good[..40].to_vec();
        agreed[4..8].copy_from_slice(&32u32.to_le_bytes());
        assert!(parse(&agreed)
            .unwrap()
            .truncated
            .unwrap()
            .contains("strings have no end"));
        // A length below the 4-byte header stops the walk.
        let mut bad = build(
            (3, 0),
            &[bios(&["V", "1.0", "x"]), system(EC2_UUID, &["S"])],
        );
        // RSMB header 8, BIOS structure 4 + 14, its strings "V\01.0\0x\0" and the end NUL.
        bad[8 + 18 + 9 + 1] = 2;
        let t = parse(&bad).unwrap();
        assert_eq!((t.get("bios_vendor"), t.get("sys_vendor")), ("V", ""));
        assert!(t.truncated.unwrap().contains("length 2 does not fit"));
        // A length past the data.
        let mut long = build((3, 0), &[system(EC2_UUID, &["S"])]);
        long[8 + 1] = 200;
        assert!(parse(&long)
            .unwrap()
            .truncated
            .unwrap()
            .contains("does not fit"));
        // A string that is not UTF-8 is left out, not misread.
        let mut latin1 = build((3, 0), &[(1, vec![1, 2], &["X", "Y"])]);
        latin1[8 + 6] = 0xE9;
        let t = parse(&latin1).unwrap();
        assert_eq!((t.get("sys_vendor"), t.get("product_name")), ("", "Y"));
    }

    /// Detection from Windows' sources: `reg` are the registry's BIOS values, `raw` the table.
    fn dmi(reg: &[(&str, &str)], raw: Option<&[u8]>) -> Dmi {
        let t = raw.map(|r| parse(r).unwrap());
        let read = |v: &str| {
            reg.iter()
                .find(|(n, _)| *n == v)
                .map(|(_, x)| x.to_string())
        };
        Dmi::with(&windows_values(
            &crate::provider::detect::DMI_FILES,
            &read,
            t.as_ref(),
        ))
    }

    fn provider(d: &Dmi) -> Option<P> {
        match detect(d) {
            Detected::Provider(p) => Some(p),
            _ => None,
        }
    }

    #[test]
    fn registry_first_then_the_table() {
        let raw = xen_ec2((2, 7));
        let d = dmi(
            &[
                ("SystemManufacturer", " Amazon EC2 "),
                ("SystemProductName", ""),
            ],
            Some(&raw),
        );
        // The registry's value wins; a blank one falls back to the table, as do the values
        // the registry never has.
        assert_eq!(d.sys_vendor, "Amazon EC2");
        assert_eq!(d.product_name, "HVM domU");
        assert_eq!(d.product_serial, "ec2ae145-d1dc-13b2-94ed-012345abcdef");
        assert_eq!(d.product_uuid, "45e12aec-dcd1-b213-94ed-012345abcdef");
        assert_eq!((d.hypervisor_uuid.as_str(), d.qemu_fw_cfg), ("", false));
        assert_eq!(dmi(&[], None), Dmi::default());
    }

    #[test]
    fn each_clouds_windows_values_meet_the_linux_rules() {
        let azure_table = build(
            (3, 1),
            &[
                bios(&[
                    "Microsoft Corporation",
                    "Hyper-V UEFI Release v4.1",
                    "04/06/2022",
                ]),
                system(
                    [0x5A; 16],
                    &[
                        "Microsoft Corporation",
                        "Virtual Machine",
                        "Hyper-V UEFI Release v4.1",
                        "0000-0016-4375-6453-2618-7401-45",
                    ],
                ),
                chassis(&[
                    "Microsoft Corporation",
                    "Hyper-V UEFI Release v4.1",
                    "0000-0016-4375-6453-2618-7401-45",
                    "7783-7084-3265-9085-8269-3286-77",
                ]),
                end(),
            ],
        );
        let hyperv = [
            ("SystemManufacturer", "Microsoft Corporation"),
            ("SystemProductName", "Virtual Machine"),
            ("BIOSVendor", "Microsoft Corporation"),
            ("BIOSVersion", "Hyper-V UEFI Release v4.1"),
        ];
        let xen_reg = [
            ("SystemManufacturer", "Xen"),
            ("SystemProductName", "HVM domU"),
            ("BIOSVendor", "Xen"),
            ("BIOSVersion", "4.11.amazon"),
        ];
        let xen = xen_ec2((2, 4));
        // (registry values, the table if any, the provider detected)
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<&'a [u8]>, Option<P>);
        let table: &[Case<'_>] = &[
            // EC2 Nitro.
            (
                &[
                    ("SystemManufacturer", "Amazon EC2"),
                    ("SystemProductName", "m5.large"),
                    ("BIOSVendor", "Amazon EC2"),
                ],
                None,
                Some(P::Aws),
            ),
            // EC2 Xen: the registry's BIOS version alone is one marker; the table's UUID
            // and serial make the rule.
            (&xen_reg, Some(&xen), Some(P::Aws)),
            (&xen_reg, None, None),
            // Azure: Hyper-V's values plus the chassis asset tag from the table.
            (&hyperv, Some(&azure_table), Some(P::Azure)),
            (&hyperv, None, None),
            (
                &[
                    ("SystemManufacturer", "Google"),
                    ("SystemProductName", "Google Compute Engine"),
                    ("BIOSVendor", "Google"),
                ],
                None,
                Some(P::Gcp),
            ),
            (
                &[
                    ("SystemManufacturer", "OpenStack Foundation"),
                    ("SystemProductName", "OpenStack Nova"),
                ],
                None,
                Some(P::Openstack),
            ),
            (
                &[
                    ("SystemManufacturer", "VMware, Inc."),
                    ("SystemProductName", "VMware7,1"),
                ],
                None,
                Some(P::Vmware),
            ),
        ];
        for (reg, raw, want) in table {
            let d = dmi(reg, *raw);
            assert_eq!(provider(&d), *want, "{}", d.describe());
        }
        // The Xen instance without its table stops on AWS's marker rather than guessing.
        assert!(matches!(
            detect(&dmi(&xen_reg, None)),
            Detected::Partial { cloud: "AWS", .. }
        ));
    }
}
