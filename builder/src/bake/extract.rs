//! Takes named members out of upstream archives (tar.gz, zip) without ever turning an
//! archive path into a filesystem path: every wanted member is streamed into a file the
//! caller names, hashed on the way. Hostile archives — `..`, absolute paths, symlinks or
//! hard links that leave the archive, device nodes, FIFOs — are refused as a whole.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Why members could not be taken from an archive.
#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    /// Reading the archive or writing a member failed.
    #[error("{path}: {source}")]
    Io {
        /// The archive or output file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The archive holds an entry kiln will not unpack.
    #[error("{archive}: refusing hostile archive entry {entry:?}: {why}")]
    Hostile {
        /// The archive.
        archive: PathBuf,
        /// The entry's path as stored.
        entry: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A wanted member is absent, or is not a regular file.
    #[error("{archive}: member {member:?}: expected {expected}, found {found}")]
    Member {
        /// The archive.
        archive: PathBuf,
        /// The member path from the lock.
        member: String,
        /// What the lock promised.
        expected: &'static str,
        /// What the archive holds.
        found: String,
    },
}

/// An archive kind kiln can unpack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveKind {
    /// gzip-compressed tar.
    TarGz,
    /// zip.
    Zip,
}

/// One member written out.
#[derive(Debug, Clone)]
pub struct Extracted {
    /// Where its bytes now are.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex sha256.
    pub sha256: String,
    /// Lowercase hex SHA1 (the SBOM needs it).
    pub sha1: String,
}

pub use crate::lock::member_key;

/// Checks an entry path; returns why it is hostile.
fn path_problem(name: &str) -> Option<&'static str> {
    if name.starts_with('/') || name.starts_with('\\') || name.contains(":\\") {
        return Some("absolute path");
    }
    if name.split(['/', '\\']).any(|c| c == "..") {
        return Some("path contains `..`");
    }
    if name.contains('\0') {
        return Some("NUL in path");
    }
    None
}

/// Whether `target`, relative to the directory holding `entry`, stays inside the archive.
fn link_escapes(entry: &str, target: &str) -> bool {
    if target.starts_with('/') {
        return true;
    }
    let mut depth: i64 = 0;
    let entry = member_key(entry).trim_end_matches('/');
    let parent: Vec<&str> = entry
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    let start = parent.len().saturating_sub(1);
    depth += start as i64;
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return true;
                }
            }
            _ => depth += 1,
        }
    }
    false
}

/// Copies `r` into a new file at `out`, hashing (sha256, SHA1) as it goes.
fn copy_hashed(r: &mut impl Read, out: &Path) -> io::Result<(u64, String, String)> {
    let mut f = BufWriter::with_capacity(1 << 20, File::create(out)?);
    let mut h = Sha256::new();
    let mut h1 = sha1::Sha1::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n = 0u64;
    loop {
        let k = r.read(&mut buf)?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        h1.update(&buf[..k]);
        f.write_all(&buf[..k])?;
        n += k as u64;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    Ok((n, hex::encode(h.finalize()), hex::encode(h1.finalize())))
}

/// Takes `wanted` members (lock `from` paths) out of `archive` into `out_dir`, the i-th
/// wanted member into `out_dir/member-<i>`. Every entry of the archive is checked, wanted
/// or not.
pub fn extract_members(
    archive: &Path,
    kind: ArchiveKind,
    wanted: &[String],
    out_dir: &Path,
) -> Result<BTreeMap<String, Extracted>, ExtractError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ExtractError::Io { path, source }
    };
    let hostile = |entry: &str, why| ExtractError::Hostile {
        archive: archive.to_path_buf(),
        entry: entry.to_string(),
        why,
    };
    let index: BTreeMap<&str, usize> = wanted
        .iter()
        .enumerate()
        .map(|(i, w)| (member_key(w), i))
        .collect();
    let mut got: BTreeMap<String, Extracted> = BTreeMap::new();
    let mut take = |name: &str, r: &mut dyn Read| -> Result<(), ExtractError> {
        let key = member_key(name);
        let Some(&i) = index.get(key) else {
            return Ok(());
        };
        if got.contains_key(key) {
            return Err(hostile(name, "wanted member appears twice"));
        }
        let out = out_dir.join(format!("member-{i}"));
        let (size, sha256, sha1) = copy_hashed(&mut ReadRef(r), &out).map_err(io_err(&out))?;
        got.insert(
            key.to_string(),
            Extracted {
                path: out,
                size,
                sha256,
                sha1,
            },
        );
        Ok(())
    };
    let not_regular = |name: &str, found: &str| ExtractError::Member {
        archive: archive.to_path_buf(),
        member: name.to_string(),
        expected: "a regular file",
        found: found.to_string(),
    };
    match kind {
        ArchiveKind::TarGz => {
            let f = File::open(archive).map_err(io_err(archive))?;
            let gz = flate2::read::GzDecoder::new(io::BufReader::with_capacity(1 << 20, f));
            let mut tar = tar::Archive::new(gz);
            for entry in tar.entries().map_err(io_err(archive))? {
                let mut entry = entry.map_err(io_err(archive))?;
                let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
                if let Some(why) = path_problem(&name) {
                    return Err(hostile(&name, why));
                }
                let et = entry.header().entry_type();
                use tar::EntryType as E;
                match et {
                    E::Regular | E::Continuous | E::GNUSparse => {
                        take(&name, &mut entry)?;
                    }
                    E::Directory => {}
                    E::Symlink | E::Link => {
                        let target = entry
                            .link_name_bytes()
                            .map(|b| String::from_utf8_lossy(&b).into_owned())
                            .unwrap_or_default();
                        let escapes = if et == E::Link {
                            path_problem(&target).is_some()
                        } else {
                            link_escapes(&name, &target)
                        };
                        if escapes {
                            return Err(hostile(&name, "link points outside the archive"));
                        }
                        if index.contains_key(member_key(&name)) {
                            return Err(not_regular(&name, "a link"));
                        }
                    }
                    E::Char | E::Block | E::Fifo => {
                        return Err(hostile(&name, "device node or FIFO"));
                    }
                    // PAX and GNU long-name headers are consumed by the tar crate; anything
                    // else is unknown and not unpacked.
                    _ => {
                        if index.contains_key(member_key(&name)) {
                            return Err(not_regular(&name, "an unknown entry type"));
                        }
                    }
                }
            }
        }
        ArchiveKind::Zip => {
            let f = File::open(archive).map_err(io_err(archive))?;
            let mut z =
                zip::ZipArchive::new(io::BufReader::new(f)).map_err(|e| ExtractError::Io {
                    path: archive.to_path_buf(),
                    source: io::Error::new(io::ErrorKind::InvalidData, e),
                })?;
            for i in 0..z.len() {
                let mut entry = z.by_index(i).map_err(|e| ExtractError::Io {
                    path: archive.to_path_buf(),
                    source: io::Error::new(io::ErrorKind::InvalidData, e),
                })?;
                let name = entry.name().to_string();
                if let Some(why) = path_problem(&name) {
                    return Err(hostile(&name, why));
                }
                let ftype = entry.unix_mode().map(|m| m & 0o170000).unwrap_or(0);
                match ftype {
                    0 | 0o100000 | 0o040000 => {}
                    0o120000 => {
                        let mut target = String::new();
                        entry.read_to_string(&mut target).map_err(io_err(archive))?;
                        if link_escapes(&name, &target) {
                            return Err(hostile(&name, "link points outside the archive"));
                        }
                        if index.contains_key(member_key(&name)) {
                            return Err(not_regular(&name, "a symlink"));
                        }
                        continue;
                    }
                    _ => return Err(hostile(&name, "device node or FIFO")),
                }
                if entry.is_dir() {
                    continue;
                }
                take(&name, &mut entry)?;
            }
        }
    }
    for w in wanted {
        if !got.contains_key(member_key(w)) {
            return Err(ExtractError::Member {
                archive: archive.to_path_buf(),
                member: w.clone(),
                expected: "a member of the archive",
                found: "no such entry".into(),
            });
        }
    }
    Ok(got)
}

/// Lets a `&mut dyn Read` be passed where `impl Read` is wanted.
struct ReadRef<'a>(&'a mut dyn Read);

impl Read for ReadRef<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_link_checks() {
        let paths: &[(&str, Option<&str>)] = &[
            ("bin/containerd", None),
            ("./bridge", None),
            ("/etc/passwd", Some("absolute path")),
            ("a/../../x", Some("path contains `..`")),
            ("..", Some("path contains `..`")),
            ("C:\\Windows\\x", Some("absolute path")),
        ];
        for (p, want) in paths {
            assert_eq!(path_problem(p), *want, "{p}");
        }
        let links: &[(&str, &str, bool)] = &[
            ("bin/a", "b", false),
            ("bin/a", "../b", false),
            ("bin/a", "../../b", true),
            ("a", "../x", true),
            ("./a", "./b", false),
            ("bin/a", "/usr/bin/b", true),
            ("bin/a", "c/../../..", true),
        ];
        for (e, t, want) in links {
            assert_eq!(link_escapes(e, t), *want, "{e} -> {t}");
        }
    }
}
