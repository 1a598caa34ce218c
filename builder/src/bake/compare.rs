//! Which file differs between two layers of the same format (`kiln verify --rebuild`): each
//! entry of both archives is read in order and hashed, and the first path whose kind, mode,
//! size, link target or contents differ (or that only one has) is named. rootfs `.tar.zst` and
//! Windows `.zip` are read here; a sysext's squashfs is compared by its bytes only (kiln
//! writes squashfs but does not read it back), with the first differing offset.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;

use sha2::Digest as _;

/// A layer that is not what its provenance says, or an input that is not the recorded one
/// (`kiln verify`: exit 3, a check failed).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Mismatch(pub String);

impl Mismatch {
    /// A failed check.
    pub fn exit_class(&self) -> crate::exit::ExitClass {
        crate::exit::ExitClass::Verify
    }
}

/// What a layer's entry is, as far as the comparison goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    kind: String,
    mode: u32,
    size: u64,
    sha256: String,
    link: String,
}

/// A layer's entries in archive order.
type Entries = std::io::Result<Vec<(String, Entry)>>;

/// The outcome of comparing two layers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Difference {
    /// Byte for byte the same.
    None,
    /// The first path (in the first layer's order, then the second's) that differs.
    File {
        /// The entry's path in the archive.
        path: String,
        /// How it differs.
        how: String,
    },
    /// The entries are the same but the archives' bytes are not (order, compression, or a
    /// format whose entries kiln does not read): the first differing byte.
    Bytes {
        /// Offset of the first differing byte.
        offset: u64,
    },
}

/// A reading budget: a layer handed to `verify` may be hostile (a decompression bomb); no
/// more than `left` bytes are decompressed from it.
struct Budget {
    left: u64,
}

fn read_all(r: &mut impl Read, budget: &mut Budget, what: &str) -> std::io::Result<(u64, String)> {
    let mut h = sha2::Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut n_total = 0u64;
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        n_total += n as u64;
        budget.left = budget.left.checked_sub(n as u64).ok_or_else(|| {
            std::io::Error::other(format!(
                "{what}: unpacks to more than kiln reads from a layer to compare it"
            ))
        })?;
        h.update(&buf[..n]);
    }
    Ok((n_total, hex::encode(h.finalize())))
}

fn tar_entries(path: &Path, budget: &mut Budget) -> Entries {
    let f = std::fs::File::open(path)?;
    let mut ar = tar::Archive::new(zstd::stream::read::Decoder::new(f)?);
    let mut out = Vec::new();
    for e in ar.entries()? {
        let mut e = e?;
        let name = String::from_utf8_lossy(&e.path_bytes())
            .trim_start_matches("./")
            .to_string();
        let h = e.header();
        let kind = format!("{:?}", h.entry_type());
        let mode = h.mode().unwrap_or(0);
        let link = e
            .link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default();
        let (size, sha256) = read_all(&mut e, budget, &name)?;
        out.push((
            name,
            Entry {
                kind,
                mode,
                size,
                sha256,
                link,
            },
        ));
    }
    Ok(out)
}

fn zip_entries(path: &Path, budget: &mut Budget) -> Entries {
    let f = std::fs::File::open(path)?;
    let mut z = zip::ZipArchive::new(f).map_err(std::io::Error::other)?;
    let mut out = Vec::new();
    for i in 0..z.len() {
        let mut e = z.by_index(i).map_err(std::io::Error::other)?;
        let name = e.name().to_string();
        let kind = if e.is_dir() { "dir" } else { "file" }.to_string();
        let mode = e.unix_mode().unwrap_or(0);
        let (size, sha256) = read_all(&mut e, budget, &name)?;
        out.push((
            name,
            Entry {
                kind,
                mode,
                size,
                sha256,
                link: String::new(),
            },
        ));
    }
    Ok(out)
}

fn magic(path: &Path) -> std::io::Result<[u8; 4]> {
    let mut m = [0u8; 4];
    std::fs::File::open(path)?.read_exact(&mut m)?;
    Ok(m)
}

fn first_byte_difference(a: &Path, b: &Path) -> std::io::Result<Option<u64>> {
    let (mut fa, mut fb) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    let (mut ba, mut bb) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let mut offset = 0u64;
    loop {
        let na = read_full(&mut fa, &mut ba)?;
        let nb = read_full(&mut fb, &mut bb)?;
        if let Some(i) = ba[..na].iter().zip(&bb[..nb]).position(|(x, y)| x != y) {
            return Ok(Some(offset + i as u64));
        }
        if na != nb {
            return Ok(Some(offset + na.min(nb) as u64));
        }
        if na == 0 {
            return Ok(None);
        }
        offset += na as u64;
    }
}

fn read_full(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// Compares `given` (a layer from elsewhere) with `rebuilt` (kiln's own rebuild of it);
/// What is decompressed from `given` is bounded by the rebuild's own unpacked size plus
/// `margin`: a layer that unpacks to more than that already differs, and a decompression bomb
/// stops there.
pub fn compare(given: &Path, rebuilt: &Path, margin: u64) -> std::io::Result<Difference> {
    let Some(offset) = first_byte_difference(given, rebuilt)? else {
        return Ok(Difference::None);
    };
    let m = magic(rebuilt)?;
    let read: fn(&Path, &mut Budget) -> Entries = match m {
        [0x28, 0xb5, 0x2f, 0xfd] => tar_entries,
        [b'P', b'K', 3, 4] => zip_entries,
        _ => return Ok(Difference::Bytes { offset }),
    };
    let mut unbounded = Budget { left: u64::MAX };
    let ours = read(rebuilt, &mut unbounded)?;
    let unpacked = u64::MAX - unbounded.left;
    let theirs = match read(
        given,
        &mut Budget {
            left: unpacked.saturating_add(margin),
        },
    ) {
        Ok(e) => e,
        Err(e) => {
            return Ok(Difference::File {
                path: String::new(),
                how: format!("the layer cannot be read as the rebuild's format: {e}"),
            })
        }
    };
    let ours: BTreeMap<String, Entry> = ours.into_iter().collect();
    let mut seen = std::collections::BTreeSet::new();
    for (path, e) in &theirs {
        seen.insert(path.clone());
        match ours.get(path) {
            None => {
                return Ok(Difference::File {
                    path: path.clone(),
                    how: "not in the rebuild".into(),
                })
            }
            Some(o) if o != e => {
                let how = if o.sha256 != e.sha256 {
                    format!(
                        "contents differ (sha256 {} in the layer, {} rebuilt)",
                        e.sha256, o.sha256
                    )
                } else {
                    format!("metadata differ ({e:?} in the layer, {o:?} rebuilt)")
                };
                return Ok(Difference::File {
                    path: path.clone(),
                    how,
                });
            }
            Some(_) => {}
        }
    }
    if let Some(path) = ours.keys().find(|p| !seen.contains(*p)) {
        return Ok(Difference::File {
            path: path.clone(),
            how: "missing from the layer".into(),
        });
    }
    Ok(Difference::Bytes { offset })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(path: &Path, files: &[(&str, Vec<u8>)]) {
        let w = zstd::stream::write::Encoder::new(std::fs::File::create(path).unwrap(), 3).unwrap();
        let mut b = tar::Builder::new(w);
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, &data[..]).unwrap();
        }
        b.into_inner().unwrap().finish().unwrap();
    }

    #[test]
    fn the_changed_file_is_named_and_a_bomb_stops_at_the_rebuilds_size() {
        let d = tempfile::tempdir().unwrap();
        let (ours, same, changed, bomb) = (
            d.path().join("ours"),
            d.path().join("same"),
            d.path().join("changed"),
            d.path().join("bomb"),
        );
        layer(&ours, &[("a", b"x".to_vec()), ("b", b"y".to_vec())]);
        layer(&same, &[("a", b"x".to_vec()), ("b", b"y".to_vec())]);
        layer(&changed, &[("a", b"x".to_vec()), ("b", b"z".to_vec())]);
        // 64 MiB of zeros: a few KiB compressed, far over the rebuild's size plus 1 MiB.
        layer(&bomb, &[("a", vec![0; 64 << 20])]);
        assert_eq!(compare(&same, &ours, 1 << 20).unwrap(), Difference::None);
        match compare(&changed, &ours, 1 << 20).unwrap() {
            Difference::File { path, how } => {
                assert_eq!(path, "b");
                assert!(how.contains("contents differ"), "{how}");
            }
            other => panic!("{other:?}"),
        }
        match compare(&bomb, &ours, 1 << 20).unwrap() {
            Difference::File { how, .. } => {
                assert!(how.contains("unpacks to more than"), "{how}")
            }
            other => panic!("{other:?}"),
        }
    }
}
