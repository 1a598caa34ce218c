//! The GPT of a DDI, laid out as `systemd-repart` 257 lays out a new image file: 512-byte
//! sectors, a protective MBR, the first partition at 1 MiB, partitions back to back in
//! 4 KiB steps, and the backup table in the last 33 sectors.

use crate::digest::crc32;
use crate::supply::lock::Arch;

/// The sector size of an image file.
pub const SECTOR: u64 = 512;
/// Partition sizes and the image size are multiples of this.
pub const GRAIN: u64 = 4096;
/// The first usable LBA: the first partition starts at 1 MiB.
const FIRST_LBA: u64 = 2048;
/// Entries in each partition array, and their size.
const ENTRIES: usize = 128;
const ENTRY_SIZE: usize = 128;
/// Sectors of one entry array (128 × 128 bytes).
const ARRAY_SECTORS: u64 = (ENTRIES * ENTRY_SIZE) as u64 / SECTOR;
/// What repart's automatic size adds to the partitions: 1 MiB in front, 20 KiB behind.
const OVERHEAD: u64 = 1044 * 1024;

/// The Discoverable Partitions Specification's root types of one architecture, and the
/// architecture's name in partition names (`root-x86-64`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootTypes {
    /// The architecture as systemd spells it.
    pub arch: &'static str,
    /// The root (data) partition type.
    pub data: &'static str,
    /// The root verity (hash tree) partition type.
    pub verity: &'static str,
    /// The root verity signature partition type.
    pub signature: &'static str,
}

/// The root partition types of `arch`.
pub fn root_types(arch: Arch) -> RootTypes {
    match arch {
        Arch::Amd64 => RootTypes {
            arch: "x86-64",
            data: "4f68bce3-e8cd-4db1-96e7-fbcaf984b709",
            verity: "2c7357ed-ebd2-46d9-aec1-23d437ec2bf5",
            signature: "41092b05-9fc8-4523-994f-2def0408b176",
        },
        Arch::Arm64 => RootTypes {
            arch: "arm64",
            data: "b921b045-1df0-41c3-af44-4c6f280d3fae",
            verity: "df3300ce-d69f-4c92-978c-9bfb0f38d820",
            signature: "6db69de6-29f4-4758-a7a5-962190f00ce3",
        },
    }
}

/// A UUID's 16 bytes in the order of its text form (how systemd's `sd_id128_t` holds it).
pub fn uuid_bytes(text: &str) -> [u8; 16] {
    let hex: String = text.chars().filter(|&c| c != '-').collect();
    let mut out = [0u8; 16];
    hex::decode_to_slice(&hex, &mut out).expect("a UUID constant in 8-4-4-4-12 hex");
    out
}

/// A UUID as GPT stores it: the first three fields little-endian (UEFI Appendix A).
pub fn on_disk(uuid: [u8; 16]) -> [u8; 16] {
    let mut b = uuid;
    b[0..4].reverse();
    b[4..6].reverse();
    b[6..8].reverse();
    b
}

/// One partition to place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionSpec {
    /// Type UUID, text order.
    pub type_uuid: [u8; 16],
    /// Partition UUID, text order.
    pub uuid: [u8; 16],
    /// Size in bytes, a multiple of [`GRAIN`].
    pub size: u64,
    /// Attribute bits (bit 60: read-only).
    pub attributes: u64,
    /// The partition name (at most 36 UTF-16 units).
    pub name: String,
}

/// A placed partition: where it lies, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Byte offset in the image.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
}

/// A disk of partitions placed back to back from 1 MiB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GptDisk {
    disk_uuid: [u8; 16],
    total: u64,
    parts: Vec<(PartitionSpec, Extent)>,
}

impl GptDisk {
    /// Places `specs` in order; the image is as large as repart's `--size=auto` makes it.
    pub fn new(disk_uuid: [u8; 16], specs: Vec<PartitionSpec>) -> GptDisk {
        assert!(
            specs.len() <= ENTRIES,
            "a GPT holds at most {ENTRIES} partitions"
        );
        let mut offset = FIRST_LBA * SECTOR;
        let mut parts = Vec::with_capacity(specs.len());
        for spec in specs {
            assert_eq!(
                spec.size % GRAIN,
                0,
                "partition {} not in 4 KiB units",
                spec.name
            );
            let extent = Extent {
                offset,
                size: spec.size,
            };
            offset += spec.size;
            parts.push((spec, extent));
        }
        let total = OVERHEAD.next_multiple_of(GRAIN) + (offset - FIRST_LBA * SECTOR);
        GptDisk {
            disk_uuid,
            total,
            parts,
        }
    }

    /// The image size in bytes.
    pub fn total_size(&self) -> u64 {
        self.total
    }

    /// Where each partition lies, in the order given.
    pub fn extents(&self) -> Vec<Extent> {
        self.parts.iter().map(|(_, e)| *e).collect()
    }

    fn sectors(&self) -> u64 {
        self.total / SECTOR
    }

    /// The first 34 sectors: protective MBR, primary header and primary entry array.
    pub fn head(&self) -> Vec<u8> {
        let mut out = self.protective_mbr();
        let array = self.entry_array();
        out.extend_from_slice(&self.header(1, self.sectors() - 1, 2, &array));
        out.extend_from_slice(&array);
        out
    }

    /// The last 33 sectors: backup entry array, then backup header.
    pub fn tail(&self) -> Vec<u8> {
        let last = self.sectors() - 1;
        let mut out = self.entry_array();
        let header = self.header(last, 1, last - ARRAY_SECTORS, &out);
        out.extend_from_slice(&header);
        out
    }

    /// libfdisk's protective MBR: one 0xEE record from LBA 1 over the disk (capped at 2^32-1).
    fn protective_mbr(&self) -> Vec<u8> {
        let mut mbr = vec![0u8; SECTOR as usize];
        let count = (self.sectors() - 1).min(u64::from(u32::MAX)) as u32;
        let record = &mut mbr[446..462];
        record[1..4].copy_from_slice(&[0x00, 0x02, 0x00]); // CHS of LBA 1
        record[4] = 0xee;
        record[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
        record[8..12].copy_from_slice(&1u32.to_le_bytes());
        record[12..16].copy_from_slice(&count.to_le_bytes());
        mbr[510..512].copy_from_slice(&[0x55, 0xaa]);
        mbr
    }

    fn header(&self, my_lba: u64, alternate: u64, entries_lba: u64, array: &[u8]) -> Vec<u8> {
        let mut h = vec![0u8; SECTOR as usize];
        h[0..8].copy_from_slice(b"EFI PART");
        h[8..12].copy_from_slice(&0x0001_0000u32.to_le_bytes());
        h[12..16].copy_from_slice(&92u32.to_le_bytes());
        h[24..32].copy_from_slice(&my_lba.to_le_bytes());
        h[32..40].copy_from_slice(&alternate.to_le_bytes());
        h[40..48].copy_from_slice(&FIRST_LBA.to_le_bytes());
        let last_usable = self.sectors() - 2 - ARRAY_SECTORS;
        h[48..56].copy_from_slice(&last_usable.to_le_bytes());
        h[56..72].copy_from_slice(&on_disk(self.disk_uuid));
        h[72..80].copy_from_slice(&entries_lba.to_le_bytes());
        h[80..84].copy_from_slice(&(ENTRIES as u32).to_le_bytes());
        h[84..88].copy_from_slice(&(ENTRY_SIZE as u32).to_le_bytes());
        h[88..92].copy_from_slice(&crc32(array).to_le_bytes());
        let crc = crc32(&h[..92]);
        h[16..20].copy_from_slice(&crc.to_le_bytes());
        h
    }

    fn entry_array(&self) -> Vec<u8> {
        let mut array = vec![0u8; ENTRIES * ENTRY_SIZE];
        for ((spec, extent), e) in self.parts.iter().zip(array.chunks_mut(ENTRY_SIZE)) {
            e[0..16].copy_from_slice(&on_disk(spec.type_uuid));
            e[16..32].copy_from_slice(&on_disk(spec.uuid));
            let first = extent.offset / SECTOR;
            e[32..40].copy_from_slice(&first.to_le_bytes());
            e[40..48].copy_from_slice(&(first + extent.size / SECTOR - 1).to_le_bytes());
            e[48..56].copy_from_slice(&spec.attributes.to_le_bytes());
            let name: Vec<u16> = spec.name.encode_utf16().collect();
            assert!(
                name.len() <= 36,
                "partition name {:?} over 36 units",
                spec.name
            );
            for (unit, slot) in name.iter().zip(e[56..128].chunks_mut(2)) {
                slot.copy_from_slice(&unit.to_le_bytes());
            }
        }
        array
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bake::ddi::test_tools::{run, tool};
    use crate::image::partition::{guid_text, read_table};

    const RO: u64 = 1 << 60;

    /// The research spec's worked example: a 10 MiB squashfs.
    fn example(arch: Arch) -> GptDisk {
        let t = root_types(arch);
        let spec = |ty: &str, n: u8, size: u64, attributes: u64, suffix: &str| PartitionSpec {
            type_uuid: uuid_bytes(ty),
            uuid: [n; 16],
            size,
            attributes,
            name: format!("root-{}{suffix}", t.arch),
        };
        GptDisk::new(
            uuid_bytes("358235cc-87c0-46b1-a612-e72eea06c4f4"),
            vec![
                spec(t.data, 1, 10 << 20, RO, ""),
                spec(t.verity, 2, 90112, RO, "-verity"),
                spec(t.signature, 3, 16384, 0, "-verity-sig"),
            ],
        )
    }

    fn image(disk: &GptDisk) -> Vec<u8> {
        let mut img = disk.head();
        img.resize((disk.total_size() - 33 * SECTOR) as usize, 0);
        img.extend_from_slice(&disk.tail());
        img
    }

    #[test]
    fn worked_example_geometry() {
        let disk = example(Arch::Amd64);
        assert_eq!(disk.total_size(), 11_661_312);
        let lbas: Vec<(u64, u64)> = disk
            .extents()
            .iter()
            .map(|e| (e.offset / SECTOR, e.size / SECTOR))
            .collect();
        assert_eq!(lbas, [(2048, 20480), (22528, 176), (22704, 32)]);
        let img = image(&disk);
        let h = &img[512..1024];
        assert_eq!(u64::from_le_bytes(h[32..40].try_into().unwrap()), 22775);
        assert_eq!(u64::from_le_bytes(h[48..56].try_into().unwrap()), 22742);
        let backup = &img[img.len() - 512..];
        assert_eq!(
            u64::from_le_bytes(backup[72..80].try_into().unwrap()),
            22743
        );
        assert_eq!(
            guid_text(&h[56..72]),
            "358235cc-87c0-46b1-a612-e72eea06c4f4"
        );
        assert_eq!(
            &img[446..462],
            [0, 0, 2, 0, 0xee, 0xff, 0xff, 0xff, 1, 0, 0, 0, 0xf7, 0x58, 0, 0]
        );
        assert_eq!(&img[510..512], [0x55, 0xaa]);
    }

    /// kiln's own GPT reader (which checks the CRCs) finds the three partitions.
    #[test]
    fn kiln_reader_reads_it() {
        let table = read_table(image(&example(Arch::Arm64)).as_slice()).unwrap();
        let kinds: Vec<(&str, &str, u64)> = table
            .partitions
            .iter()
            .map(|p| (p.kind.as_str(), p.label.as_str(), p.offset))
            .collect();
        let t = root_types(Arch::Arm64);
        assert_eq!(
            kinds,
            [
                (t.data, "root-arm64", 1 << 20),
                (t.verity, "root-arm64-verity", 11_534_336),
                (t.signature, "root-arm64-verity-sig", 11_624_448),
            ]
        );
    }

    /// `sgdisk -v` finds no problem (CRCs, overlaps, backup placement) and `sfdisk --json`
    /// reads the types, names, UUIDs, extents and attributes kiln meant.
    #[test]
    fn gdisk_and_sfdisk_agree() {
        let sgdisk = tool("sgdisk", "gdisk");
        let sfdisk = tool("sfdisk", "fdisk");
        let dir = tempfile::tempdir().unwrap();
        for arch in [Arch::Amd64, Arch::Arm64] {
            let disk = example(arch);
            let path = dir.path().join("disk.img");
            std::fs::write(&path, image(&disk)).unwrap();
            let p = path.to_str().unwrap();
            let verify = run(&sgdisk, &["-v", p]).unwrap();
            assert!(verify.contains("No problems found"), "{verify}");
            let json: serde_json::Value =
                serde_json::from_str(&run(&sfdisk, &["--json", p]).unwrap()).unwrap();
            let table = &json["partitiontable"];
            assert_eq!(table["label"], "gpt");
            assert_eq!(table["id"], "358235CC-87C0-46B1-A612-E72EEA06C4F4");
            assert_eq!(table["firstlba"], 2048);
            assert_eq!(table["lastlba"], 22742);
            let t = root_types(arch);
            let parts = table["partitions"].as_array().unwrap();
            let want = [
                (t.data, "", 2048, 20480, "GUID:60", 1u8),
                (t.verity, "-verity", 22528, 176, "GUID:60", 2),
                (t.signature, "-verity-sig", 22704, 32, "", 3),
            ];
            assert_eq!(parts.len(), 3);
            for (got, (ty, suffix, start, size, attrs, n)) in parts.iter().zip(want) {
                assert_eq!(got["type"], ty.to_uppercase(), "{got}");
                assert_eq!(got["name"], format!("root-{}{suffix}", t.arch), "{got}");
                assert_eq!(got["start"], start, "{got}");
                assert_eq!(got["size"], size, "{got}");
                assert_eq!(got["attrs"].as_str().unwrap_or(""), attrs, "{got}");
                assert_eq!(got["uuid"], guid_text(&[n; 16]).to_uppercase(), "{got}");
            }
        }
    }
}
