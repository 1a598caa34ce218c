//! Takes named members out of upstream archives (tar.gz, zip) without ever turning an
//! archive path into a filesystem path: every wanted member is streamed into a file the
//! caller names, hashed on the way. Every entry, wanted or not, must pass the same rules as
//! a layer `kiln install` applies ([`crate::archive_rules`]); one hostile entry refuses the
//! whole archive, and so does an archive that unpacks to more than the cap.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use sha2::{Digest, Sha256};

use crate::archive_rules::{self, Capped, EntryCheck, Kind, Policy, Rule};

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
    /// The archive holds an entry kiln will not unpack, or unpacks to more than the cap.
    #[error("{archive}: refusing hostile archive entry {entry:?}: {why}")]
    Hostile {
        /// The archive.
        archive: PathBuf,
        /// The entry's path as stored.
        entry: String,
        /// The rule it breaks.
        why: Rule,
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

pub use crate::supply::lock::member_key;

/// Copies `r` into a new file at `out`, hashing (sha256, SHA1) as it goes; fsyncs it when
/// `durable` (a bake cache entry, not a scratch file the bake deletes).
fn copy_hashed(r: &mut impl Read, out: &Path, durable: bool) -> io::Result<(u64, String, String)> {
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
    let f = f.into_inner().map_err(|e| e.into_error())?;
    if durable {
        f.sync_all()?;
    }
    Ok((n, hex::encode(h.finalize()), hex::encode(h1.finalize())))
}

/// The bytes of the first gzip member of `inner` (flate2's `GzDecoder` semantics, which
/// kiln used before; upstream release archives are one member), inflated by zlib-rs: header,
/// deflate data and the CRC32/size trailer are all checked, and what follows the first
/// member is never read.
struct Gunzip<R> {
    inner: R,
    z: zlib_rs::Inflate,
    buf: Box<[u8]>,
    pos: usize,
    len: usize,
    done: bool,
}

impl<R: Read> Gunzip<R> {
    fn new(inner: R) -> Self {
        Gunzip {
            inner,
            // 16 + 15: a gzip header and a 32 KiB window.
            z: zlib_rs::Inflate::new(true, 16 + 15),
            buf: vec![0u8; 1 << 20].into_boxed_slice(),
            pos: 0,
            len: 0,
            done: false,
        }
    }
}

impl<R: Read> Read for Gunzip<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.done || out.is_empty() {
            return Ok(0);
        }
        loop {
            if self.pos == self.len {
                self.len = self.inner.read(&mut self.buf)?;
                self.pos = 0;
                if self.len == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "gzip data ends before its trailer (truncated archive)",
                    ));
                }
            }
            let (in0, out0) = (self.z.total_in(), self.z.total_out());
            let status = self
                .z
                .decompress(
                    &self.buf[self.pos..self.len],
                    out,
                    zlib_rs::InflateFlush::NoFlush,
                )
                .map_err(|e| {
                    let why = self.z.error_message().unwrap_or(e.as_str());
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("corrupt gzip data: {why}"),
                    )
                })?;
            let used = (self.z.total_in() - in0) as usize;
            let made = (self.z.total_out() - out0) as usize;
            self.pos += used;
            if status == zlib_rs::Status::StreamEnd {
                self.done = true;
                return Ok(made);
            }
            if made > 0 {
                return Ok(made);
            }
            if used == 0 && self.pos < self.len {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "corrupt gzip data: the decoder made no progress",
                ));
            }
        }
    }
}

/// The number of central directory records a zip's end record announces (`None` for a
/// zip64 archive, whose count lives elsewhere).
fn zip_records(f: &mut File) -> io::Result<Option<u64>> {
    use std::io::{Seek, SeekFrom};
    let len = f.seek(SeekFrom::End(0))?;
    // The end record is 22 bytes plus a comment of at most 64 KiB.
    let tail = len.min(22 + 0xFFFF);
    f.seek(SeekFrom::Start(len - tail))?;
    let mut b = Vec::new();
    f.read_to_end(&mut b)?;
    let Some(at) = b.windows(4).rposition(|w| w == b"PK\x05\x06") else {
        return Ok(None);
    };
    if at + 12 > b.len() {
        return Ok(None);
    }
    let n = u16::from_le_bytes([b[at + 10], b[at + 11]]);
    Ok((n != 0xFFFF).then_some(u64::from(n)))
}

/// Takes `wanted` members (lock `from` paths) out of `archive` into `out_dir`, the i-th
/// wanted member into `out_dir/member-<i>`. Every entry of the archive is checked, wanted
/// or not, under [`Policy::upstream`].
pub fn extract_members(
    archive: &Path,
    kind: ArchiveKind,
    wanted: &[String],
    out_dir: &Path,
    durable: bool,
) -> Result<BTreeMap<String, Extracted>, ExtractError> {
    extract_members_with(archive, kind, wanted, out_dir, durable, &Policy::upstream())
}

/// [`extract_members`] under an explicit policy (tests lower the size cap with it).
pub fn extract_members_with(
    archive: &Path,
    kind: ArchiveKind,
    wanted: &[String],
    out_dir: &Path,
    durable: bool,
    policy: &Policy,
) -> Result<BTreeMap<String, Extracted>, ExtractError> {
    let file = File::open(archive).map_err(|source| ExtractError::Io {
        path: archive.to_path_buf(),
        source,
    })?;
    extract_members_from(&file, archive, kind, wanted, out_dir, durable, policy)
}

/// [`extract_members_with`] from an archive already open as `file` (named `archive` in
/// messages): a caller that checked the file's digest through this descriptor extracts the
/// very bytes it checked, whatever is renamed over the name meanwhile.
#[allow(
    clippy::too_many_lines,
    reason = "one pass over the archive's entries; every entry's checks (archive rules, member map, size caps) must run in that pass, before its bytes are written"
)]
pub fn extract_members_from(
    file: &File,
    archive: &Path,
    kind: ArchiveKind,
    wanted: &[String],
    out_dir: &Path,
    durable: bool,
    policy: &Policy,
) -> Result<BTreeMap<String, Extracted>, ExtractError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ExtractError::Io { path, source }
    };
    let reopen = || -> io::Result<File> {
        use std::io::{Seek, SeekFrom};
        let mut f = file.try_clone()?;
        f.seek(SeekFrom::Start(0))?;
        Ok(f)
    };
    let hostile = |entry: &str, why: Rule| ExtractError::Hostile {
        archive: archive.to_path_buf(),
        entry: entry.to_string(),
        why,
    };
    // A read error after the cap tripped is the cap, whatever the decoder made of it.
    let gap = archive_rules::Gap::new();
    let read_err = |flag: &AtomicBool, entry: &str, e: io::Error| {
        if gap.tripped() {
            hostile(
                entry,
                Rule::HeaderTooLarge {
                    cap: archive_rules::MAX_HEADER_BYTES,
                },
            )
        } else if archive_rules::tripped(flag) {
            hostile(
                entry,
                Rule::TooLarge {
                    cap: policy.max_bytes,
                },
            )
        } else {
            io_err(archive)(e)
        }
    };
    let index: BTreeMap<&str, usize> = wanted
        .iter()
        .enumerate()
        .map(|(i, w)| (member_key(w), i))
        .collect();
    let mut got: BTreeMap<String, Extracted> = BTreeMap::new();
    let mut check = EntryCheck::new(policy.clone());
    let not_regular = |name: &str, found: &str| ExtractError::Member {
        archive: archive.to_path_buf(),
        member: name.to_string(),
        expected: "a regular file",
        found: found.to_string(),
    };
    match kind {
        ArchiveKind::TarGz => {
            let f = reopen().map_err(io_err(archive))?;
            let gz = Gunzip::new(f);
            let gz = archive_rules::Gapped::new(gz, gap.clone());
            let (gz, flag) = Capped::new(gz, policy.stream_cap());
            let mut tar = tar::Archive::new(gz);
            let mut last = String::from("(before the first entry)");
            let entries = tar.entries().map_err(|e| read_err(&flag, &last, e))?;
            for entry in entries {
                let mut entry = entry.map_err(|e| read_err(&flag, &last, e))?;
                gap.allow(entry.size());
                let raw = entry.path_bytes().into_owned();
                last = String::from_utf8_lossy(&raw).into_owned();
                let Some(kind) = archive_rules::tar_kind(&mut entry) else {
                    continue;
                };
                let mode = entry.header().mode().unwrap_or(0);
                let Some(name) = check
                    .check(&raw, &kind, mode)
                    .map_err(|r| hostile(&last, r))?
                else {
                    continue;
                };
                let Some(&i) = index.get(name.as_str()) else {
                    continue;
                };
                match kind {
                    Kind::File { .. } => {
                        let out = out_dir.join(format!("member-{i}"));
                        let (size, sha256, sha1) =
                            copy_hashed(&mut entry, &out, durable).map_err(|e| {
                                if archive_rules::tripped(&flag) {
                                    read_err(&flag, &last, e)
                                } else {
                                    io_err(&out)(e)
                                }
                            })?;
                        got.insert(
                            name,
                            Extracted {
                                path: out,
                                size,
                                sha256,
                                sha1,
                            },
                        );
                    }
                    Kind::Dir => return Err(not_regular(&last, "a directory")),
                    _ => return Err(not_regular(&last, "a link")),
                }
            }
            // tar stops at its end-of-archive blocks, before the gzip trailer: read on to the
            // end of the gzip member so its CRC32 and size are checked, as `gzip -d` checks
            // them (still under the stream cap; the gap between entries no longer applies).
            gap.allow(u64::MAX);
            io::copy(&mut tar.into_inner(), &mut io::sink())
                .map_err(|e| read_err(&flag, "(after the last entry)", e))?;
        }
        ArchiveKind::Zip => {
            let bad_zip = |e: zip::result::ZipError| ExtractError::Io {
                path: archive.to_path_buf(),
                source: io::Error::new(io::ErrorKind::InvalidData, e),
            };
            let f = reopen().map_err(io_err(archive))?;
            let records =
                zip_records(&mut reopen().map_err(io_err(archive))?).map_err(io_err(archive))?;
            let mut z = zip::ZipArchive::new(io::BufReader::new(f)).map_err(bad_zip)?;
            // The zip reader keeps one member per name: a second record under the same name
            // would silently shadow the first, so count the records themselves.
            if records.is_some_and(|n| n != z.len() as u64) {
                return Err(hostile(
                    &format!(
                        "(central directory: {} records, {} names)",
                        records.unwrap_or(0),
                        z.len()
                    ),
                    Rule::Duplicate,
                ));
            }
            // A zip's sizes are claims: what members actually inflate to is counted too.
            let flag = std::sync::Arc::new(AtomicBool::new(false));
            let mut budget = policy.max_bytes;
            for i in 0..z.len() {
                let mut entry = z.by_index(i).map_err(bad_zip)?;
                let name = entry.name().to_string();
                let umode = entry.unix_mode().unwrap_or(0);
                let kind = match umode & 0o170000 {
                    _ if entry.is_dir() => Kind::Dir,
                    0o040000 => Kind::Dir,
                    0 | 0o100000 => Kind::File { size: entry.size() },
                    0o120000 => {
                        let mut target = String::new();
                        (&mut entry)
                            .take(4096)
                            .read_to_string(&mut target)
                            .map_err(io_err(archive))?;
                        Kind::Symlink(target)
                    }
                    0o010000 => Kind::Special("FIFO"),
                    0o020000 => Kind::Special("character device"),
                    0o060000 => Kind::Special("block device"),
                    0o140000 => Kind::Special("socket"),
                    t => Kind::Unknown(format!("mode {t:06o}")),
                };
                let Some(key) = check
                    .check(name.as_bytes(), &kind, umode & 0o7777)
                    .map_err(|r| hostile(&name, r))?
                else {
                    continue;
                };
                let Some(&w) = index.get(key.as_str()) else {
                    continue;
                };
                match kind {
                    Kind::File { .. } => {
                        let out = out_dir.join(format!("member-{w}"));
                        let mut capped = Capped::with_flag(&mut entry, budget, flag.clone());
                        let (size, sha256, sha1) = copy_hashed(&mut capped, &out, durable)
                            .map_err(|e| {
                                if archive_rules::tripped(&flag) {
                                    read_err(&flag, &name, e)
                                } else {
                                    io_err(&out)(e)
                                }
                            })?;
                        budget = capped.left();
                        got.insert(
                            key,
                            Extracted {
                                path: out,
                                size,
                                sha256,
                                sha1,
                            },
                        );
                    }
                    Kind::Dir => return Err(not_regular(&name, "a directory")),
                    _ => return Err(not_regular(&name, "a symlink")),
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `data` compressed by the real `gzip` (which writes the name field, FNAME).
    fn gzip_cli(dir: &Path, data: &[u8]) -> Vec<u8> {
        let p = dir.join("member.bin");
        std::fs::write(&p, data).unwrap();
        let out = std::process::Command::new("gzip")
            .args(["-c", "-N", "-6"])
            .arg(&p)
            .output()
            .expect("gzip runs (scripts/deps.sh installs it)");
        assert!(out.status.success());
        out.stdout
    }

    fn gunzip(bytes: &[u8], chunk: usize) -> io::Result<Vec<u8>> {
        // A reader that hands out at most `chunk` bytes per read: every split of the header,
        // the deflate data and the trailer across reads.
        struct Dribble<'a>(&'a [u8], usize);
        impl Read for Dribble<'_> {
            fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(self.1).min(b.len());
                b[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut out = Vec::new();
        Gunzip::new(Dribble(bytes, chunk)).read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn gunzip_reads_what_gzip_wrote_and_only_the_first_member() {
        let d = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i * 7 / 13 % 251) as u8)
            .collect();
        let gz = gzip_cli(d.path(), &data);
        for chunk in [1, 7, 4096, usize::MAX] {
            assert_eq!(gunzip(&gz, chunk).unwrap(), data, "reads of {chunk} bytes");
        }
        // What follows the first member is not read (flate2's GzDecoder did the same).
        let mut two = gz.clone();
        two.extend_from_slice(&gzip_cli(d.path(), b"second member"));
        assert_eq!(gunzip(&two, 4096).unwrap(), data);
    }

    #[test]
    fn gunzip_refuses_truncated_and_corrupt_data() {
        let d = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 97) as u8).collect();
        let gz = gzip_cli(d.path(), &data);
        // Cut anywhere, including inside the 8-byte trailer: never a silent short read.
        for cut in [0, 5, gz.len() / 2, gz.len() - 8, gz.len() - 1] {
            let e = gunzip(&gz[..cut], 4096).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "cut at {cut}: {e}");
        }
        // A flipped bit in the CRC32 trailer, and a header that is not gzip's.
        let mut bad_crc = gz.clone();
        let at = gz.len() - 8;
        bad_crc[at] ^= 1;
        let e = gunzip(&bad_crc, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("corrupt gzip data"), "{e}");
        let mut not_gzip = gz.clone();
        not_gzip[0] = b'P';
        let e = gunzip(&not_gzip, 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn what_follows_the_tar_end_is_read_under_the_cap() {
        // The tar ends after one small member; the gzip member goes on with zeros. They are
        // read (so the trailer is reached and checked), and never past the stream cap.
        let d = tempfile::tempdir().unwrap();
        let mut t = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(4);
        h.set_mode(0o755);
        t.append_data(&mut h, "bin/containerd", &b"\x7fELF"[..])
            .unwrap();
        let raw = t.into_inner().unwrap();
        let tail = |raw: &[u8], zeros: usize, path: &Path| {
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(raw).unwrap();
            gz.write_all(&vec![0u8; zeros]).unwrap();
            std::fs::write(path, gz.finish().unwrap()).unwrap();
        };
        let mut p = Policy::upstream();
        p.max_bytes = 1 << 20;
        p.max_entries = 4;
        let wanted = ["bin/containerd".to_string()];
        let small = d.path().join("small.tar.gz");
        tail(&raw, 64 << 10, &small);
        let got =
            extract_members_with(&small, ArchiveKind::TarGz, &wanted, d.path(), false, &p).unwrap();
        assert_eq!(got["bin/containerd"].size, 4);
        let big = d.path().join("big.tar.gz");
        tail(&raw, 4 << 20, &big);
        let err = extract_members_with(&big, ArchiveKind::TarGz, &wanted, d.path(), false, &p)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("big.tar.gz") && err.contains("more than 1 MiB"),
            "{err}"
        );
    }

    #[test]
    fn a_zip_that_inflates_past_its_declared_size_hits_the_cap() {
        // Declared sizes pass (the header says 1 KiB); what the member really inflates to
        // is counted against the cap.
        let d = tempfile::tempdir().unwrap();
        let zpath = d.path().join("bomb.zip");
        let mut z = zip::ZipWriter::new(File::create(&zpath).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        z.start_file("bin/containerd", opts).unwrap();
        z.write_all(&vec![0u8; 4 << 20]).unwrap();
        z.finish().unwrap();
        // Make both headers claim 1 KiB.
        let mut b = std::fs::read(&zpath).unwrap();
        let patch = |b: &mut Vec<u8>, sig: &[u8; 4], at: usize| {
            let i = b.windows(4).position(|w| w == sig).unwrap();
            b[i + at..i + at + 4].copy_from_slice(&1024u32.to_le_bytes());
        };
        patch(&mut b, b"PK\x03\x04", 22);
        patch(&mut b, b"PK\x01\x02", 24);
        std::fs::write(&zpath, b).unwrap();
        let mut p = Policy::upstream();
        p.max_bytes = 1 << 20;
        let err = extract_members_with(
            &zpath,
            ArchiveKind::Zip,
            &["bin/containerd".to_string()],
            d.path(),
            false,
            &p,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("bomb.zip") && err.contains("more than 1 MiB"),
            "{err}"
        );
    }
}
