//! The partition table of a disk image (GPT or MBR), parsed from bytes with every field
//! checked (the `pick` module chooses the root partition from it).
//!
//! Layouts: UEFI Specification 2.10 §5.2.1 (legacy MBR, protective MBR §5.2.3) and §5.3
//! (GPT header §5.3.2, partition entry array §5.3.3). Type GUIDs: the UAPI Group's
//! Discoverable Partitions Specification and the CoreOS/Flatcar disk layout.

use std::fmt;

/// The sector size kiln reads tables with (cloud images use 512-byte logical sectors).
pub const SECTOR: u64 = 512;
/// The most partition entries kiln reads (the spec's minimum array is 128; 4 KiB-sector
/// tools write up to 256).
const MAX_ENTRIES: u32 = 1024;

/// GPT type GUIDs kiln knows, in the text form `sgdisk` prints.
pub mod guid {
    /// Root partition, x86-64 (Discoverable Partitions Specification).
    pub const ROOT_X86_64: &str = "4f68bce3-e8cd-4db1-96e7-fbcaf984b709";
    /// Root partition, 64-bit ARM (Discoverable Partitions Specification).
    pub const ROOT_ARM64: &str = "b921b045-1df0-41c3-af44-4c6f280d3fae";
    /// Generic Linux filesystem data (Discoverable Partitions Specification).
    pub const LINUX_DATA: &str = "0fc63daf-8483-4772-8e79-3d69d8477de4";
    /// CoreOS/Flatcar "resizable root" (partition 9, `ROOT`, in Flatcar's disk layout).
    pub const COREOS_ROOT: &str = "3884dd41-8582-4404-b9a8-e9b84f2df50e";
}

/// Which table a disk has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// GUID Partition Table.
    Gpt,
    /// A legacy MBR (DOS) table.
    Mbr,
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Scheme::Gpt => "GPT",
            Scheme::Mbr => "MBR",
        })
    }
}

/// One partition, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// 1-based number, as `/dev/sda1` and `sgdisk` count (a GPT entry's index + 1).
    pub number: u32,
    /// Byte offset on the disk.
    pub offset: u64,
    /// Length in bytes.
    pub size: u64,
    /// GPT type GUID (lower-case text) or the MBR type as `0x83`.
    pub kind: String,
    /// GPT partition name (empty for MBR).
    pub label: String,
}

/// A parsed table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    /// GPT or MBR.
    pub scheme: Scheme,
    /// The partitions in use, by number.
    pub partitions: Vec<Partition>,
}

/// Why a table was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// Neither an MBR signature nor a GPT.
    #[error("no partition table: expected the MBR signature 55 aa at byte 510, found {found}")]
    NoTable {
        /// What is there instead, in words (never the bytes).
        found: String,
    },
    /// The disk ends before a structure the table needs.
    #[error("truncated: the {what} needs bytes up to {need}, the image has {have}")]
    Truncated {
        /// The structure.
        what: &'static str,
        /// Bytes needed.
        need: u64,
        /// Bytes there.
        have: u64,
    },
    /// A field holds a value the spec does not allow.
    #[error("{scheme} {what}: expected {expected}, found {found}")]
    Bad {
        /// GPT or MBR.
        scheme: Scheme,
        /// The field.
        what: String,
        /// What the spec says.
        expected: String,
        /// What the image says.
        found: String,
    },
    /// Two partitions share sectors.
    #[error("{scheme} partitions {a} and {b} overlap (sectors {a_range} and {b_range})")]
    Overlap {
        /// GPT or MBR.
        scheme: Scheme,
        /// One partition.
        a: u32,
        /// The other.
        b: u32,
        /// Its sectors.
        a_range: String,
        /// Its sectors.
        b_range: String,
    },
}

fn bad(
    scheme: Scheme,
    what: impl Into<String>,
    expected: impl Into<String>,
    found: impl fmt::Display,
) -> TableError {
    TableError::Bad {
        scheme,
        what: what.into(),
        expected: expected.into(),
        found: found.to_string(),
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

pub use crate::digest::crc32;

/// A GUID's text form: the first three fields are little-endian on disk (UEFI spec
/// Appendix A), the last two big-endian.
pub fn guid_text(b: &[u8]) -> String {
    format!(
        "{:08x}-{:04x}-{:04x}-{}-{}",
        u32_at(b, 0),
        u16::from_le_bytes([b[4], b[5]]),
        u16::from_le_bytes([b[6], b[7]]),
        hex::encode(&b[8..10]),
        hex::encode(&b[10..16])
    )
}

/// How a caller hands the parser bytes at an offset (a file, or a slice in tests).
pub trait ReadAt {
    /// The image's size in bytes.
    fn size(&self) -> u64;
    /// Exactly `len` bytes at `offset`; the caller has checked they exist.
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>>;
}

impl ReadAt for [u8] {
    fn size(&self) -> u64 {
        <[u8]>::len(self) as u64
    }
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let o = offset as usize;
        Ok(self[o..o + len].to_vec())
    }
}

impl ReadAt for std::fs::File {
    fn size(&self) -> u64 {
        self.metadata().map(|m| m.len()).unwrap_or(0)
    }
    fn read_at(&self, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
        let mut b = vec![0; len];
        std::os::unix::fs::FileExt::read_exact_at(self, &mut b, offset)?;
        Ok(b)
    }
}

/// Why reading a table failed: the table, or the read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The table is refused.
    #[error(transparent)]
    Table(#[from] TableError),
    /// Reading failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

fn need(disk: &(impl ReadAt + ?Sized), what: &'static str, end: u64) -> Result<(), TableError> {
    if end > disk.size() {
        return Err(TableError::Truncated {
            what,
            need: end,
            have: disk.size(),
        });
    }
    Ok(())
}

/// Reads the table of `disk`: a GPT when the MBR is protective (type 0xEE), else the MBR.
pub fn read_table(disk: &(impl ReadAt + ?Sized)) -> Result<Table, ReadError> {
    need(disk, "MBR", SECTOR)?;
    let mbr = disk.read_at(0, SECTOR as usize)?;
    if mbr[510..512] != [0x55, 0xaa] {
        // The bytes are not quoted: a base that is not a disk may be any file (issue 34).
        return Err(TableError::NoTable {
            found: if mbr[510..512] == [0, 0] {
                "zero bytes".into()
            } else {
                "other bytes".into()
            },
        }
        .into());
    }
    let entries: Vec<(u8, u32, u32)> = (0..4)
        .map(|i| {
            let e = &mbr[446 + 16 * i..446 + 16 * (i + 1)];
            (e[4], u32_at(e, 8), u32_at(e, 12))
        })
        .collect();
    if entries.iter().any(|e| e.0 == 0xee) {
        return read_gpt(disk);
    }
    let mut parts = Vec::new();
    for (i, (kind, start, count)) in entries.into_iter().enumerate() {
        if kind == 0 || count == 0 {
            continue;
        }
        let number = i as u32 + 1;
        let offset = u64::from(start) * SECTOR;
        let size = u64::from(count) * SECTOR;
        if start == 0 || offset + size > disk.size() {
            return Err(bad(
                Scheme::Mbr,
                format!("partition {number}"),
                format!("sectors inside the disk (1..{})", disk.size() / SECTOR),
                format!("sectors {start}..{}", u64::from(start) + u64::from(count)),
            )
            .into());
        }
        parts.push(Partition {
            number,
            offset,
            size,
            kind: format!("0x{kind:02x}"),
            label: String::new(),
        });
    }
    check_overlap(Scheme::Mbr, &parts)?;
    Ok(Table {
        scheme: Scheme::Mbr,
        partitions: parts,
    })
}

fn read_gpt(disk: &(impl ReadAt + ?Sized)) -> Result<Table, ReadError> {
    let g = Scheme::Gpt;
    need(disk, "GPT header (LBA 1)", 2 * SECTOR)?;
    let h = disk.read_at(SECTOR, SECTOR as usize)?;
    if &h[0..8] != b"EFI PART" {
        return Err(bad(
            g,
            "header signature at LBA 1",
            "\"EFI PART\"",
            "other bytes",
        )
        .into());
    }
    let size = u32_at(&h, 12);
    if !(92..=SECTOR as u32).contains(&size) {
        return Err(bad(g, "header size", "92..=512 bytes", size).into());
    }
    let mut copy = h[..size as usize].to_vec();
    copy[16..20].fill(0);
    let (want, got) = (u32_at(&h, 16), crc32(&copy));
    if want != got {
        return Err(bad(
            g,
            "header CRC32",
            format!("{got:08x} (computed over the header)"),
            format!("{want:08x}"),
        )
        .into());
    }
    if u64_at(&h, 24) != 1 {
        return Err(bad(g, "header's own LBA", "1", u64_at(&h, 24)).into());
    }
    let (first, last) = (u64_at(&h, 40), u64_at(&h, 48));
    let sectors = disk.size() / SECTOR;
    if first > last || last >= sectors {
        return Err(bad(
            g,
            "usable sectors",
            format!("first <= last < {sectors} (the disk's sectors)"),
            format!("{first}..={last}"),
        )
        .into());
    }
    let (array_lba, count, esize) = (u64_at(&h, 72), u32_at(&h, 80), u32_at(&h, 84));
    if esize < 128 || esize % 8 != 0 || esize > 4096 {
        return Err(bad(
            g,
            "partition entry size",
            "a multiple of 8, 128..=4096",
            esize,
        )
        .into());
    }
    if count > MAX_ENTRIES {
        return Err(bad(
            g,
            "number of partition entries",
            format!("at most {MAX_ENTRIES}"),
            count,
        )
        .into());
    }
    // Both bounded above (1024 entries of at most 4 KiB), so the product fits.
    let array_len = u64::from(count) * u64::from(esize);
    // The array's LBA is any 64-bit number on disk: checked before it becomes an offset.
    let array_at = array_lba.checked_mul(SECTOR).filter(|&at| {
        array_lba >= 2 && at.checked_add(array_len).is_some_and(|e| e <= disk.size())
    });
    let Some(array_at) = array_at else {
        return Err(bad(
            g,
            "partition entry array LBA",
            format!("2..{sectors} with its {array_len} bytes inside the disk"),
            array_lba,
        )
        .into());
    };
    let array = disk.read_at(array_at, array_len as usize)?;
    let (want, got) = (u32_at(&h, 88), crc32(&array));
    if want != got {
        return Err(bad(
            g,
            "partition entry array CRC32",
            format!("{got:08x} (computed over the array)"),
            format!("{want:08x}"),
        )
        .into());
    }
    let mut parts = Vec::new();
    for (i, e) in array.chunks(esize as usize).enumerate() {
        if e[..16].iter().all(|&b| b == 0) {
            continue;
        }
        let number = i as u32 + 1;
        let (lo, hi) = (u64_at(e, 32), u64_at(e, 40));
        if lo < first || hi > last || lo > hi {
            return Err(bad(
                g,
                format!("partition {number}"),
                format!("sectors inside the usable {first}..={last}"),
                format!("{lo}..={hi}"),
            )
            .into());
        }
        let name: Vec<u16> = e[56..128]
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|&c| c != 0)
            .collect();
        parts.push(Partition {
            number,
            offset: lo * SECTOR,
            size: (hi - lo + 1) * SECTOR,
            kind: guid_text(&e[..16]),
            label: String::from_utf16_lossy(&name),
        });
    }
    check_overlap(g, &parts)?;
    Ok(Table {
        scheme: g,
        partitions: parts,
    })
}

fn check_overlap(scheme: Scheme, parts: &[Partition]) -> Result<(), TableError> {
    let mut sorted: Vec<&Partition> = parts.iter().collect();
    sorted.sort_by_key(|p| p.offset);
    let range = |p: &Partition| format!("{}..{}", p.offset / SECTOR, (p.offset + p.size) / SECTOR);
    for w in sorted.windows(2) {
        if w[0].offset + w[0].size > w[1].offset {
            return Err(TableError::Overlap {
                scheme,
                a: w[0].number,
                b: w[1].number,
                a_range: range(w[0]),
                b_range: range(w[1]),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32_check_value() {
        // The CRC-32/ISO-HDLC check value of "123456789".
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn guid_text_is_mixed_endian() {
        // The x86-64 root type as it sits on disk.
        let b = [
            0xe3, 0xbc, 0x68, 0x4f, 0xcd, 0xe8, 0xb1, 0x4d, 0x96, 0xe7, 0xfb, 0xca, 0xf9, 0x84,
            0xb7, 0x09,
        ];
        assert_eq!(guid_text(&b), guid::ROOT_X86_64);
    }

    #[test]
    fn mbr_overlap_and_bounds() {
        let mut d = vec![0u8; 64 * 512];
        d[510] = 0x55;
        d[511] = 0xaa;
        let mut entry = |i: usize, kind: u8, start: u32, count: u32| {
            let e = &mut d[446 + 16 * i..446 + 16 * (i + 1)];
            e[4] = kind;
            e[8..12].copy_from_slice(&start.to_le_bytes());
            e[12..16].copy_from_slice(&count.to_le_bytes());
        };
        entry(0, 0x83, 2, 20);
        entry(1, 0x82, 22, 10);
        let t = read_table(&d[..]).unwrap();
        assert_eq!(t.scheme, Scheme::Mbr);
        assert_eq!(t.partitions[1].offset, 22 * 512);
        let mut overlap = d.clone();
        overlap[446 + 16 + 8] = 10;
        assert!(matches!(
            read_table(&overlap[..]),
            Err(ReadError::Table(TableError::Overlap { a: 1, b: 2, .. }))
        ));
        let mut past = d.clone();
        past[446 + 16 + 12] = 200;
        let e = read_table(&past[..]).unwrap_err().to_string();
        assert!(
            e.contains("MBR partition 2: expected sectors inside the disk"),
            "{e}"
        );
    }
}
