//! What a base disk image is, read by kiln itself before `qemu-img` opens it, and which other
//! files it names. A qcow2 backing file or external data file, a VMDK descriptor's extents or
//! parent, a differencing VHD's parent: each would make `qemu-img convert` read another file
//! of the build host (or dial a URL) into the node image, so each is refused unless the user
//! allowed a directory for them ([`Allow`]).
//!
//! Layouts: QEMU's `docs/interop/qcow2.txt` (header, header extensions, incompatible feature
//! bits); VMware's "Virtual Disk Format 5.0" (sparse extent header, embedded descriptor);
//! Microsoft's "Virtual Hard Disk Image Format Specification" (footer, disk type); QEMU's
//! format probes for the magics of the formats kiln refuses by name.

use std::path::{Component, Path, PathBuf};

use crate::image::partition::ReadAt;

/// The formats kiln reads a base in, each passed to `qemu-img` explicitly (`-f`), never probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseFormat {
    /// Raw bytes (anything without a known magic).
    Raw,
    /// qcow2 (version 2 or 3).
    Qcow2,
    /// VHD, fixed or dynamic (`qemu-img`'s `vpc`).
    Vpc,
    /// VHDX.
    Vhdx,
    /// A single-file VMDK (monolithicSparse, streamOptimized).
    Vmdk,
}

impl BaseFormat {
    /// The `qemu-img` driver name.
    pub fn driver(self) -> &'static str {
        match self {
            BaseFormat::Raw => "raw",
            BaseFormat::Qcow2 => "qcow2",
            BaseFormat::Vpc => "vpc",
            BaseFormat::Vhdx => "vhdx",
            BaseFormat::Vmdk => "vmdk",
        }
    }

    fn from_driver(name: &str) -> Option<BaseFormat> {
        [
            BaseFormat::Raw,
            BaseFormat::Qcow2,
            BaseFormat::Vpc,
            BaseFormat::Vhdx,
            BaseFormat::Vmdk,
        ]
        .into_iter()
        .find(|f| f.driver() == name)
    }
}

/// Why a base (or a file it names) is refused. Never quotes the file's bytes, only the names
/// it gives other files (which the user needs to see to decide).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BaseError {
    /// The base names another file and no directory was allowed for it.
    #[error("names another file as its {what}, {name:?}, which kiln would read into the node image; kiln reads only the base unless --allow-backing-dir DIR names the directory such files may come from")]
    NamesFile {
        /// `backing file`, `external data file`, …
        what: &'static str,
        /// The name as the image gives it.
        name: String,
    },
    /// The base names another file kiln never reads, allowed directory or not.
    #[error("{what}: kiln reads only single-file images; {hint}")]
    Refused {
        /// What the image is or does.
        what: String,
        /// What to do instead.
        hint: &'static str,
    },
    /// A referenced file resolves outside the allowed directory (or is not a regular file).
    #[error("its {what} {name:?} resolves to {resolved}, {why}")]
    Outside {
        /// `backing file` or `external data file`.
        what: &'static str,
        /// The name as the image gives it.
        name: String,
        /// Where it resolves.
        resolved: String,
        /// Why that is refused.
        why: String,
    },
    /// A header field holds a value the format does not allow.
    #[error("{format} {field}: expected {expected}, found {found}")]
    Bad {
        /// The format.
        format: &'static str,
        /// The field.
        field: &'static str,
        /// What the format allows.
        expected: String,
        /// What the image holds.
        found: String,
    },
    /// Reading the image failed.
    #[error("reading it: {0}")]
    Read(String),
}

/// Where a base may take other files from (`--allow-backing-dir`), resolved once.
#[derive(Debug, Clone)]
pub struct Allow {
    /// The directory, canonical (symlinks and `..` resolved).
    pub dir: PathBuf,
}

/// A checked image and the chain of checked files it reads, each by its canonical path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// The format `qemu-img` is told.
    pub format: BaseFormat,
    /// The file (absolute; canonical for every file but the base itself).
    pub path: PathBuf,
    /// Its backing image, checked, if it has one and it was allowed.
    pub backing: Option<Box<Node>>,
    /// Its external data file, checked, if it has one and it was allowed.
    pub data_file: Option<PathBuf>,
}

/// How many backing images deep a chain may go.
const MAX_CHAIN: usize = 8;
/// The most bytes of a header kiln reads (a qcow2 header and its extensions live in cluster
/// 0, at most 2 MiB).
const HEAD: u64 = 2 << 20;

/// What one image file says about itself, before any referenced file is looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Its format.
    pub format: BaseFormat,
    /// The backing file it names, and the backing format it names.
    pub backing: Option<(String, Option<String>)>,
    /// The external data file it names.
    pub data_file: Option<String>,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn bad(
    format: &'static str,
    field: &'static str,
    expected: impl Into<String>,
    found: impl ToString,
) -> BaseError {
    BaseError::Bad {
        format,
        field,
        expected: expected.into(),
        found: found.to_string(),
    }
}

fn read(img: &(impl ReadAt + ?Sized), at: u64, len: u64) -> Result<Vec<u8>, BaseError> {
    let end = at.checked_add(len).filter(|&e| e <= img.size());
    if end.is_none() {
        return Err(BaseError::Read(format!(
            "expected {len} bytes at byte {at}, the file has {}",
            img.size()
        )));
    }
    img.read_at(at, len as usize)
        .map_err(|e| BaseError::Read(e.to_string()))
}

fn refused(what: impl Into<String>, hint: &'static str) -> BaseError {
    BaseError::Refused {
        what: what.into(),
        hint,
    }
}

const CONVERT_HINT: &str = "convert it to one file where its parts are trusted (qemu-img convert -O qcow2), and give kiln that";

/// Reads the header of an image: its format, and every other file it names. Pure but for
/// reads at offsets; nothing is followed.
pub fn read_header(img: &(impl ReadAt + ?Sized)) -> Result<Header, BaseError> {
    let len = img.size();
    let head = read(img, 0, len.min(HEAD))?;
    let plain = |format| Header {
        format,
        backing: None,
        data_file: None,
    };
    if head.starts_with(b"QFI\xfb") && head.len() >= 72 {
        return match be32(&head, 4) {
            2 | 3 => qcow2(img, &head),
            v => Err(refused(
                format!("a qcow image of version {v}"),
                "kiln reads qcow2 (versions 2 and 3)",
            )),
        };
    }
    if head.starts_with(b"KDMV") {
        vmdk_sparse(img, &head)?;
        return Ok(plain(BaseFormat::Vmdk));
    }
    if head.starts_with(b"COWD") {
        return Err(refused(
            "a VMDK version 3 (COWD) image",
            "kiln reads monolithicSparse and streamOptimized VMDKs; convert it with qemu-img convert -O vmdk -o subformat=streamOptimized",
        ));
    }
    if head.starts_with(b"# Disk DescriptorFile") {
        return Err(refused(
            "a VMDK descriptor file, which names its data in other files (extents)",
            CONVERT_HINT,
        ));
    }
    if head.starts_with(b"conectix") && head.len() >= 512 {
        vhd_type(&head[..512])?;
        return Ok(plain(BaseFormat::Vpc));
    }
    if head.starts_with(b"vhdxfile") {
        return Ok(plain(BaseFormat::Vhdx));
    }
    if len >= 512 {
        let tail = read(img, len - 512, 512)?;
        if tail.starts_with(b"conectix") {
            // A fixed VHD: raw bytes and a footer qemu-img's probe does not look for.
            vhd_type(&tail)?;
            return Ok(plain(BaseFormat::Vpc));
        }
        if tail.starts_with(b"koly") {
            return Err(refused(
                "a DMG image",
                "kiln reads raw, qcow2, VHD, VHDX and VMDK bases",
            ));
        }
    }
    let other = if head.starts_with(b"QED\0") {
        Some("a QED image")
    } else if head.len() >= 0x44 && head[0x40..0x44] == [0x7f, 0x10, 0xda, 0xbe] {
        Some("a VDI image")
    } else if head.starts_with(b"LUKS\xba\xbe") {
        Some("a LUKS volume")
    } else if head.starts_with(b"WithoutFreeSpace") || head.starts_with(b"WithouFreSpacExt") {
        Some("a Parallels image")
    } else if head.starts_with(b"Bochs Virtual HD Image") {
        Some("a Bochs image")
    } else {
        None
    };
    if let Some(what) = other {
        return Err(refused(
            what,
            "kiln reads raw, qcow2, VHD, VHDX and VMDK bases; convert it with qemu-img convert -O qcow2",
        ));
    }
    Ok(plain(BaseFormat::Raw))
}

/// A qcow2 header: the backing file (bytes 8..20), the external data file (incompatible
/// feature bit 2 and header extension 0x44415441), the backing format (extension 0xe2792aca).
fn qcow2(img: &(impl ReadAt + ?Sized), head: &[u8]) -> Result<Header, BaseError> {
    const F: &str = "qcow2";
    let version = be32(head, 4);
    let (bf_offset, bf_size) = (be64(head, 8), be32(head, 16));
    let cluster_bits = be32(head, 20);
    if !(9..=21).contains(&cluster_bits) {
        return Err(bad(F, "cluster_bits", "9..=21", cluster_bits));
    }
    let (incompat, header_len) = if version >= 3 {
        if head.len() < 104 {
            return Err(bad(F, "header", "104 bytes or more", head.len()));
        }
        (be64(head, 72), u64::from(be32(head, 100)))
    } else {
        (0, 72)
    };
    let cluster = 1u64 << cluster_bits;
    if header_len < 72 || header_len > cluster || header_len % 8 != 0 && version >= 3 {
        return Err(bad(
            F,
            "header_length",
            format!("72..={cluster}, a multiple of 8"),
            header_len,
        ));
    }
    let mut backing = None;
    if bf_offset != 0 || bf_size != 0 {
        if bf_size == 0
            || bf_size > 1023
            || bf_offset
                .checked_add(u64::from(bf_size))
                .is_none_or(|e| e > cluster)
        {
            return Err(bad(
                F,
                "backing file name",
                format!("1..=1023 bytes inside the first cluster ({cluster} bytes)"),
                format!("{bf_size} bytes at byte {bf_offset}"),
            ));
        }
        let name = read(img, bf_offset, u64::from(bf_size))?;
        backing = Some((String::from_utf8_lossy(&name).into_owned(), None));
    }
    let mut data_file = None;
    // Header extensions, from the end of the header to the end-of-extensions marker, all in
    // the first cluster.
    let mut at = header_len;
    loop {
        if at
            .checked_add(8)
            .is_none_or(|e| e > cluster.min(head.len() as u64))
        {
            return Err(bad(
                F,
                "header extensions",
                format!("an end marker inside the first cluster ({cluster} bytes)"),
                format!("none before byte {at}"),
            ));
        }
        let (kind, len) = (
            be32(head, at as usize),
            u64::from(be32(head, at as usize + 4)),
        );
        if kind == 0 {
            break;
        }
        let data = at + 8;
        let end = data + len;
        if end > cluster.min(head.len() as u64) {
            return Err(bad(
                F,
                "header extension length",
                format!("inside the first cluster ({cluster} bytes)"),
                format!("{len} bytes at byte {data}"),
            ));
        }
        let value = String::from_utf8_lossy(&head[data as usize..end as usize]).into_owned();
        match kind {
            0xe279_2aca => {
                if let Some(b) = &mut backing {
                    b.1 = Some(value);
                }
            }
            0x4441_5441 => data_file = Some(value),
            _ => {}
        }
        at = end.div_ceil(8) * 8;
    }
    if incompat & 0b100 != 0 && data_file.is_none() {
        return Err(refused(
            "a qcow2 image with an external data file it does not name (incompatible feature bit 2)",
            CONVERT_HINT,
        ));
    }
    Ok(Header {
        format: BaseFormat::Qcow2,
        backing,
        data_file,
    })
}

/// A VMDK sparse extent header: with a capacity of 0 QEMU reads the embedded descriptor as a
/// descriptor file and opens the extents it names; `parentFileNameHint` there opens a parent.
fn vmdk_sparse(img: &(impl ReadAt + ?Sized), head: &[u8]) -> Result<(), BaseError> {
    if head.len() < 44 {
        return Err(bad(
            "VMDK",
            "sparse extent header",
            "44 bytes or more",
            head.len(),
        ));
    }
    if le64(head, 12) == 0 {
        return Err(refused(
            "a VMDK whose header has capacity 0 (QEMU then opens the extents its embedded descriptor names)",
            CONVERT_HINT,
        ));
    }
    let (offset, size) = (le64(head, 28), le64(head, 36));
    if offset == 0 && size == 0 {
        return Ok(());
    }
    let (at, len) = match (offset.checked_mul(512), size.checked_mul(512)) {
        (Some(a), Some(l)) if l <= 1 << 20 && a.checked_add(l).is_some_and(|e| e <= img.size()) => {
            (a, l)
        }
        _ => {
            return Err(bad(
                "VMDK",
                "embedded descriptor",
                "at most 1 MiB inside the file",
                format!("{size} sectors at sector {offset}"),
            ))
        }
    };
    let desc = read(img, at, len)?;
    if desc.windows(18).any(|w| w == b"parentFileNameHint") {
        return Err(refused(
            "a VMDK delta disk (its descriptor names a parent, parentFileNameHint)",
            CONVERT_HINT,
        ));
    }
    Ok(())
}

/// A VHD footer's disk type (bytes 60..64): 2 fixed, 3 dynamic; 4, differencing, names its
/// parent in locators.
fn vhd_type(footer: &[u8]) -> Result<(), BaseError> {
    match be32(footer, 60) {
        2 | 3 => Ok(()),
        4 => Err(refused(
            "a differencing VHD (its parent locators name another file)",
            CONVERT_HINT,
        )),
        t => Err(bad("VHD", "disk type", "2 (fixed) or 3 (dynamic)", t)),
    }
}

/// The protocol QEMU would see in `name` (`json:`, `nbd:`, `http:`, …): a colon before the
/// first slash (QEMU's `path_has_protocol`).
pub fn protocol(name: &str) -> Option<&str> {
    let end = name.find([':', '/', '\\'])?;
    (name.as_bytes()[end] == b':').then(|| &name[..end])
}

/// Checks the base and every file it names, and returns the chain `qemu-img` may read.
pub fn check(base: &Path, allow: Option<&Allow>) -> Result<Node, BaseError> {
    let abs = std::path::absolute(base).map_err(|e| BaseError::Read(e.to_string()))?;
    open_node(&abs, None, allow, 0)
}

fn open_node(
    path: &Path,
    format: Option<BaseFormat>,
    allow: Option<&Allow>,
    depth: usize,
) -> Result<Node, BaseError> {
    let file = std::fs::File::open(path)
        .map_err(|e| BaseError::Read(format!("{}: {e}", path.display())))?;
    let h = read_header(&file)?;
    let format = format.unwrap_or(h.format);
    if format != h.format && format != BaseFormat::Raw {
        return Err(bad("backing", "format", format.driver(), h.format.driver()));
    }
    if format == BaseFormat::Raw {
        // Named as raw by its overlay: read as bytes, whatever it looks like.
        return Ok(Node {
            format,
            path: path.to_path_buf(),
            backing: None,
            data_file: None,
        });
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let backing = match h.backing {
        None => None,
        Some((name, fmt)) => {
            let Some(allow) = allow else {
                return Err(BaseError::NamesFile {
                    what: "backing file",
                    name,
                });
            };
            if depth + 1 >= MAX_CHAIN {
                return Err(bad(
                    "qcow2",
                    "backing chain",
                    format!("at most {MAX_CHAIN} images"),
                    "more",
                ));
            }
            let target = resolve(dir, &name, "backing file", allow)?;
            let fmt = match fmt {
                None => None,
                Some(f) => Some(BaseFormat::from_driver(&f).ok_or_else(|| {
                    bad(
                        "qcow2",
                        "backing format",
                        "raw, qcow2, vpc, vhdx or vmdk",
                        format!("{f:?}"),
                    )
                })?),
            };
            Some(Box::new(open_node(&target, fmt, Some(allow), depth + 1)?))
        }
    };
    let data_file = match h.data_file {
        None => None,
        Some(name) => {
            let Some(allow) = allow else {
                return Err(BaseError::NamesFile {
                    what: "external data file",
                    name,
                });
            };
            Some(resolve(dir, &name, "external data file", allow)?)
        }
    };
    Ok(Node {
        format,
        path: path.to_path_buf(),
        backing,
        data_file,
    })
}

/// Resolves a name an image gives another file, as QEMU would (relative to the image's
/// directory), to a canonical path, and checks it is a regular file inside the allowed
/// directory.
fn resolve(
    dir: &Path,
    name: &str,
    what: &'static str,
    allow: &Allow,
) -> Result<PathBuf, BaseError> {
    let outside = |resolved: &Path, why: String| BaseError::Outside {
        what,
        name: name.to_string(),
        resolved: resolved.display().to_string(),
        why,
    };
    if let Some(p) = protocol(name) {
        return Err(outside(
            Path::new(name),
            format!("a {p}: name, which QEMU would open as a protocol; kiln reads only files"),
        ));
    }
    let joined = dir.join(name);
    let real = std::fs::canonicalize(&joined)
        .map_err(|e| outside(&joined, format!("which cannot be resolved ({e})")))?;
    if !real.starts_with(&allow.dir) || real.components().any(|c| c == Component::ParentDir) {
        return Err(outside(
            &real,
            format!("outside the allowed directory {}", allow.dir.display()),
        ));
    }
    match std::fs::metadata(&real) {
        Ok(m) if m.is_file() => Ok(real),
        _ => Err(outside(&real, "which is not a regular file".into())),
    }
}

/// The image `qemu-img` is given: a `json:` description naming every file of the checked
/// chain and nothing else (`"backing": null` at its end), so QEMU opens no file kiln did not
/// check, whatever the headers say by then.
/// With `chain` false the image alone (`"backing": null` at once), for `qemu-img info`, which
/// opens no backing image and refuses options for one.
pub fn qemu_spec(node: &Node, chain: bool) -> Result<String, BaseError> {
    Ok(format!("json:{}", spec(node, chain)?))
}

fn spec(node: &Node, chain: bool) -> Result<serde_json::Value, BaseError> {
    let name = |p: &Path| {
        p.to_str().map(str::to_string).ok_or_else(|| {
            BaseError::Read(format!(
                "{}: the path is not UTF-8, which QEMU's json: names need; rename it",
                p.display()
            ))
        })
    };
    let mut v = serde_json::json!({
        "driver": node.format.driver(),
        "file": {"driver": "file", "filename": name(&node.path)?},
    });
    if matches!(node.format, BaseFormat::Qcow2 | BaseFormat::Vmdk) {
        v["backing"] = match &node.backing {
            Some(b) if chain => spec(b, chain)?,
            _ => serde_json::Value::Null,
        };
    }
    if let Some(d) = &node.data_file {
        v["data-file"] = serde_json::json!({"driver": "file", "filename": name(d)?});
    }
    Ok(v)
}
