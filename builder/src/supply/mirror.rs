//! The air-gap mirror: a store directory that also carries the signed lock, so any static HTTP
//! server can serve it and `kiln mirror pack`/`unpack` can carry it across a gap as one file.
//!
//! Layout (see `docs/mirror.md`):
//! ```text
//! DIR/artifacts.lock            the signed lock this mirror holds
//! DIR/artifacts.lock.minisig
//! DIR/blobs/sha256/<hex>        content-addressed artifacts
//! DIR/index/<name>/<version>/<os>-<arch>.json
//! DIR/quarantine/<hex>          blobs `verify` found corrupt
//! ```

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use crate::atomic_file::{self, AtomicFile};
use crate::digest::FileDigest;
use crate::exit::ExitClass;
use crate::supply::lock::{is_sha256_hex, Lock, LockError};
use crate::supply::mirror_images;
use crate::supply::registry::layout;
use crate::supply::registry::manifest::Parsed;
use crate::supply::sign::{self, Trust, Verified};
use crate::supply::store::{self, Expect, Store, StoreError};

/// The lock's file name inside a mirror.
pub const LOCK_NAME: &str = "artifacts.lock";

/// Why a mirror operation failed.
#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The lock failed to load or verify.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// An I/O error on a named path.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A pack file does not have the expected shape.
    #[error("pack {path}: {reason}")]
    BadPack {
        /// The pack file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Blobs the lock names are missing after an operation that should have provided them.
    #[error("{where_}: {} artifacts of the lock are missing: {}", missing.len(), missing.join(", "))]
    Missing {
        /// The mirror or pack.
        where_: String,
        /// Artifact ids.
        missing: Vec<String>,
    },
}

impl MirrorError {
    /// A bad pack, missing blobs, wrong bytes or a refused lock exit 3; the rest is a failure.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            MirrorError::BadPack { .. } | MirrorError::Missing { .. } => ExitClass::Verify,
            MirrorError::Store(e) => e.exit_class(),
            MirrorError::Lock(e) => e.exit_class(),
            MirrorError::Io { .. } => ExitClass::Failure,
        }
    }
}

fn from_write(e: atomic_file::WriteError) -> MirrorError {
    MirrorError::Io {
        action: e.action,
        path: e.path,
        source: e.source,
    }
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> MirrorError {
    let path = path.to_path_buf();
    move |source| MirrorError::Io {
        action,
        path,
        source,
    }
}

/// A mirror directory.
#[derive(Debug, Clone)]
pub struct Mirror {
    store: Store,
}

/// One blob's verdict from [`Mirror::verify`].
#[derive(Debug, Clone, Serialize)]
pub struct BlobReport {
    /// The blob's name (its expected digest).
    pub sha256: String,
    /// Its size on disk.
    pub size: u64,
    /// True when the bytes hash to the name (and match the lock's size, if it names it).
    pub ok: bool,
    /// The digest actually found, when different.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub found: Option<String>,
    /// Where a bad blob was moved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<PathBuf>,
}

/// The result of [`Mirror::verify`].
#[derive(Debug, Clone, Default, Serialize)]
pub struct VerifyReport {
    /// Every blob checked.
    pub blobs: Vec<BlobReport>,
    /// Lock entries (by id) with no blob in the mirror.
    pub missing: Vec<String>,
    /// Bytes hashed.
    pub bytes: u64,
}

impl VerifyReport {
    /// Bad blobs.
    pub fn bad(&self) -> impl Iterator<Item = &BlobReport> {
        self.blobs.iter().filter(|b| !b.ok)
    }

    /// True when every blob is good and nothing the lock names is missing.
    pub fn is_clean(&self) -> bool {
        self.bad().next().is_none() && self.missing.is_empty()
    }
}

impl Mirror {
    /// Opens (creating) a mirror directory.
    pub fn open(dir: impl AsRef<Path>) -> Result<Mirror, MirrorError> {
        Ok(Mirror {
            store: Store::open(dir)?,
        })
    }

    /// The mirror's store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The mirror's root directory.
    pub fn root(&self) -> &Path {
        self.store.root()
    }

    /// The path of the mirror's lock.
    pub fn lock_path(&self) -> PathBuf {
        self.root().join(LOCK_NAME)
    }

    /// Loads the mirror's own lock under `trust`.
    pub fn lock(&self, trust: &Trust) -> Result<(Lock, Verified), MirrorError> {
        Ok(Lock::load_verified(&self.lock_path(), trust)?)
    }

    /// Installs a lock (and its signature, if any) as the mirror's lock. The signature goes in
    /// first, so a reader never sees a new lock next to an old signature that fails for it…
    /// and a reader that races with a replacement sees a mismatch and refuses, never accepts.
    pub fn install_lock(&self, lock_bytes: &[u8], sig: Option<&[u8]>) -> Result<(), MirrorError> {
        let dest = self.lock_path();
        let sig_dest = sign::signature_path(&dest);
        match sig {
            Some(s) => store::write_atomic(&sig_dest, s)?,
            None => match std::fs::remove_file(&sig_dest) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("removing", &sig_dest)(e)),
            },
        }
        store::write_atomic(&dest, lock_bytes)?;
        Ok(())
    }

    /// Copies a lock file and its `.minisig` into the mirror.
    pub fn install_lock_file(&self, lock_path: &Path) -> Result<(), MirrorError> {
        use crate::bounded_read::{read_regular, MAX_KEY, MAX_LOCK};
        let bytes = read_regular(lock_path, MAX_LOCK).map_err(io("reading", lock_path))?;
        let sig_path = sign::signature_path(lock_path);
        let sig = match read_regular(&sig_path, MAX_KEY) {
            Ok(s) => Some(s),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io("reading", &sig_path)(e)),
        };
        self.install_lock(&bytes, sig.as_deref())
    }

    /// Re-hashes every blob (with `threads` workers), moves bad ones into `quarantine/`, and
    /// lists lock entries whose blob is missing (when `lock` is given).
    pub fn verify(&self, lock: Option<&Lock>, threads: usize) -> Result<VerifyReport, MirrorError> {
        let names = self.store.blobs()?;
        let next = AtomicUsize::new(0);
        let results: Mutex<Vec<Result<BlobReport, MirrorError>>> = Mutex::new(Vec::new());
        let quarantine = self.root().join("quarantine");
        std::thread::scope(|s| {
            for _ in 0..threads.max(1) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(name) = names.get(i) else { break };
                    let r = self.verify_one(name, lock, &quarantine);
                    results.lock().unwrap_or_else(|p| p.into_inner()).push(r);
                });
            }
        });
        let mut report = VerifyReport::default();
        for r in results.into_inner().unwrap_or_else(|p| p.into_inner()) {
            let b = r?;
            report.bytes += b.size;
            report.blobs.push(b);
        }
        report.blobs.sort_by(|a, b| a.sha256.cmp(&b.sha256));
        if let Some(lock) = lock {
            for a in &lock.artifacts {
                if !self.store.contains(&a.sha256) {
                    report.missing.push(a.id());
                }
            }
        }
        Ok(report)
    }

    fn verify_one(
        &self,
        name: &str,
        lock: Option<&Lock>,
        quarantine: &Path,
    ) -> Result<BlobReport, MirrorError> {
        let FileDigest {
            size,
            sha256: found,
            ..
        } = self.store.rehash(name)?;
        let size_ok = lock
            .and_then(|l| l.artifacts.iter().find(|a| a.sha256 == name))
            .and_then(|a| a.known_size())
            .is_none_or(|known| known == size);
        let ok = found == name && size_ok;
        let mut quarantined = None;
        if !ok {
            std::fs::create_dir_all(quarantine).map_err(io("creating", quarantine))?;
            let dest = quarantine.join(name);
            std::fs::rename(self.store.blob_path(name), &dest)
                .map_err(io("quarantining into", &dest))?;
            atomic_file::sync_dir(quarantine);
            quarantined = Some(dest);
        }
        Ok(BlobReport {
            sha256: name.to_string(),
            size,
            ok,
            found: (found != name).then_some(found),
            quarantined,
        })
    }

    /// Writes the mirror as one `.tar.zst`: the lock and its signature first, then every blob
    /// the lock names, in lock order. Entries have fixed owners and mtimes. Written to a temp
    /// file next to `out` and renamed when complete.
    pub fn pack(&self, lock: &Lock, out: &Path, level: i32) -> Result<u64, MirrorError> {
        let mut missing: Vec<String> = lock
            .artifacts
            .iter()
            .filter(|a| !self.store.contains(&a.sha256))
            .map(|a| a.id())
            .collect();
        let mut image_blobs = Vec::new();
        for img in &lock.images {
            match mirror_images::closure(&self.store, img) {
                Ok(b) => image_blobs.extend(b),
                Err(e) => missing.push(e),
            }
        }
        if !missing.is_empty() {
            return Err(MirrorError::Missing {
                where_: self.root().display().to_string(),
                missing,
            });
        }
        let tmp = AtomicFile::create(out, ".pack-", "").map_err(from_write)?;
        let enc = zstd::Encoder::new(tmp, level).map_err(io("starting zstd for", out))?;
        let mut tar = tar::Builder::new(enc);
        tar.mode(tar::HeaderMode::Deterministic);
        let lock_path = self.lock_path();
        use crate::bounded_read::{read_regular, MAX_KEY, MAX_LOCK};
        let lock_bytes = read_regular(&lock_path, MAX_LOCK).map_err(io("reading", &lock_path))?;
        append_bytes(&mut tar, LOCK_NAME, &lock_bytes, out)?;
        let sig_path = sign::signature_path(&lock_path);
        if let Ok(sig) = read_regular(&sig_path, MAX_KEY) {
            append_bytes(&mut tar, &format!("{LOCK_NAME}.minisig"), &sig, out)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut total = 0;
        for a in &lock.artifacts {
            if !seen.insert(a.sha256.clone()) {
                continue;
            }
            total += self.append_blob(&mut tar, &a.sha256, a.known_size(), out)?;
        }
        // Images after the files, each blob after the manifest or index that names it, so
        // unpack can check every blob against a parent it already verified.
        for (hex, size) in image_blobs {
            if seen.insert(hex.clone()) {
                total += self.append_blob(&mut tar, &hex, Some(size), out)?;
            }
        }
        let enc = tar.into_inner().map_err(io("finishing tar in", out))?;
        let tmp = enc.finish().map_err(io("finishing zstd in", out))?;
        tmp.commit(0o600).map_err(from_write)?;
        Ok(total)
    }

    fn append_blob<W: Write>(
        &self,
        tar: &mut tar::Builder<W>,
        hex: &str,
        size: Option<u64>,
        out: &Path,
    ) -> Result<u64, MirrorError> {
        let p = self.store.blob_path(hex);
        let f = std::fs::File::open(&p).map_err(io("opening", &p))?;
        let len = match size {
            Some(n) => n,
            None => f.metadata().map_err(io("reading", &p))?.len(),
        };
        let mut h = tar::Header::new_gnu();
        h.set_size(len);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_uid(0);
        h.set_gid(0);
        h.set_entry_type(tar::EntryType::Regular);
        // Limit to the recorded size so a blob grown on disk cannot smuggle extra bytes.
        tar.append_data(&mut h, format!("blobs/sha256/{hex}"), f.take(len))
            .map_err(io("writing pack", out))?;
        Ok(len)
    }

    /// Unpacks a `.tar.zst` made by [`Mirror::pack`] into this mirror: the lock inside is
    /// verified under `trust` before any blob is accepted, every blob is hashed as it streams
    /// and must be named by the lock, and the lock is installed last.
    pub fn unpack(&self, pack: &Path, trust: &Trust) -> Result<(Lock, Verified), MirrorError> {
        let bad = |reason: String| MirrorError::BadPack {
            path: pack.to_path_buf(),
            reason,
        };
        let f = std::fs::File::open(pack).map_err(io("opening", pack))?;
        let dec = zstd::Decoder::new(f).map_err(io("reading zstd", pack))?;
        let mut ar = tar::Archive::new(dec);
        let mut lock_bytes: Option<Vec<u8>> = None;
        let mut sig_bytes: Option<Vec<u8>> = None;
        let mut lock: Option<(Lock, Verified)> = None;
        let mut images: Option<mirror_images::Unpacking> = None;
        for entry in ar.entries().map_err(io("reading tar", pack))? {
            let mut entry = entry.map_err(io("reading tar", pack))?;
            let name = entry
                .path()
                .map_err(io("reading tar", pack))?
                .to_string_lossy()
                .into_owned();
            if name == LOCK_NAME || name == format!("{LOCK_NAME}.minisig") {
                if lock.is_some() {
                    return Err(bad(format!("{name} appears after the blobs or twice")));
                }
                let mut buf = Vec::new();
                (&mut entry)
                    .take(16 << 20)
                    .read_to_end(&mut buf)
                    .map_err(io("reading tar", pack))?;
                if name == LOCK_NAME {
                    lock_bytes = Some(buf);
                } else {
                    sig_bytes = Some(buf);
                }
                continue;
            }
            let Some(hex) = name.strip_prefix("blobs/sha256/") else {
                return Err(bad(format!("unexpected entry {name:?}")));
            };
            if lock.is_none() {
                // Verify the lock before the first blob is accepted.
                let lb = lock_bytes.as_ref().ok_or_else(|| {
                    bad(format!(
                        "the lock must come before the blobs; found {name} first"
                    ))
                })?;
                lock = Some(packed_lock(pack, lb, sig_bytes.as_deref(), trust)?);
            }
            let (l, _) = lock.as_ref().ok_or_else(|| bad("no lock".into()))?;
            let imgs =
                images.get_or_insert_with(|| mirror_images::Unpacking::new(l.images.clone()));
            let expect = match l
                .artifacts
                .iter()
                .find(|a| is_sha256_hex(hex) && a.sha256 == hex)
            {
                Some(a) => Expect::for_artifact(a),
                None => imgs.expect(hex).ok_or_else(|| {
                    bad(format!(
                        "blob {hex} is not named by the lock inside the pack (nor reached from its images)"
                    ))
                })?,
            };
            self.store.put_reader(&mut entry, &expect)?;
            imgs.stored(&self.store, hex)
                .map_err(|e| bad(format!("blob {hex}: {e}")))?;
        }
        if lock.is_none() {
            // A pack of an empty lock, or one with only the lock in it.
            let lb = lock_bytes
                .as_ref()
                .ok_or_else(|| bad(format!("no {LOCK_NAME} inside")))?;
            lock = Some(packed_lock(pack, lb, sig_bytes.as_deref(), trust)?);
        }
        let (l, v) = lock.ok_or_else(|| bad("no lock".into()))?;
        let mut missing: Vec<String> = l
            .artifacts
            .iter()
            .filter(|a| !self.store.contains(&a.sha256))
            .map(|a| a.id())
            .collect();
        for img in &l.images {
            missing.extend(layout::missing(&self.store, img));
        }
        if !missing.is_empty() {
            return Err(MirrorError::Missing {
                where_: pack.display().to_string(),
                missing,
            });
        }
        for a in &l.artifacts {
            self.store.record(a)?;
        }
        for img in &l.images {
            let (root, len) = layout::read_manifest(&self.store, &img.digest)
                .map_err(|e| bad(format!("{}: {e}", img.id())))?;
            let media_type = match root {
                Parsed::Index { media_type, .. } | Parsed::Manifest { media_type, .. } => {
                    media_type
                }
            };
            layout::record(&self.store, img, &media_type, len)?;
        }
        self.install_lock(
            lock_bytes.as_deref().unwrap_or_default(),
            sig_bytes.as_deref(),
        )?;
        Ok((l, v))
    }
}

fn append_bytes<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    bytes: &[u8],
    out: &Path,
) -> Result<(), MirrorError> {
    let mut h = tar::Header::new_gnu();
    h.set_size(bytes.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut h, name, bytes)
        .map_err(io("writing pack", out))
}

/// Verifies and parses the lock read from a pack, in memory; messages name it as
/// `PACK/artifacts.lock` (never a temporary copy).
fn packed_lock(
    pack: &Path,
    lock_bytes: &[u8],
    sig_bytes: Option<&[u8]>,
    trust: &Trust,
) -> Result<(Lock, Verified), MirrorError> {
    let label = pack.join(LOCK_NAME);
    let sig_label = sign::signature_path(&label);
    let key = match trust {
        Trust::Key(k) | Trust::AllowUnsigned(k) => k,
    };
    let verified = match (sig_bytes, trust) {
        (Some(sig), _) => sign::verify(
            &label,
            lock_bytes,
            &sig_label,
            &String::from_utf8_lossy(sig),
            key,
        )
        .map_err(LockError::from)?,
        (None, Trust::AllowUnsigned(_)) => Verified::Unsigned,
        (None, Trust::Key(_)) => Err(LockError::from(sign::SignError::Missing {
            file: label.clone(),
            sig: sig_label,
        }))?,
    };
    let text = std::str::from_utf8(lock_bytes).map_err(|e| LockError::Parse {
        path: label.clone(),
        message: format!("not UTF-8: {e}"),
    })?;
    Ok((Lock::parse(text, &label)?, verified))
}
