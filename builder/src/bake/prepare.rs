//! Gets every artifact file ready to bake: archive members extracted, every file hashed
//! (sha256 and SHA1) and passed through the inspection gate. Artifacts are prepared in
//! parallel, and the costly part (decompressing, hashing) is kept in a content-addressed bake
//! cache keyed by the download's sha256, so a re-bake from a warm mirror only re-reads files.
//!
//! Cache layout (`--cache DIR`, per kiln version because extraction rules may change):
//! `DIR/<kiln version>/blob-<sha256>.sha1` (SHA1 of a single-binary download, written after
//! its sha256 was checked against the lock) and `DIR/<kiln version>/members-<sha256>-<key>/`
//! (`member-N` files plus `meta.json` with their sizes and hashes), each published by an
//! atomic rename so a reader never sees half an entry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::digest::{self, Sums};

use crate::bake::error::{io_err, BakeError};
use crate::bake::extract;
use crate::bake::layer::{ArtifactInput, InputKind, MemberMap};

/// One file ready to place.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The member's `from` path.
    pub from: String,
    /// The member's relative destination.
    pub to: String,
    /// Where the bytes are.
    pub path: PathBuf,
    /// Size in bytes.
    pub size: u64,
    /// sha256.
    pub sha256: String,
    /// SHA1.
    pub sha1: String,
}

fn version_dir(cache: &Path) -> PathBuf {
    cache.join(env!("CARGO_PKG_VERSION"))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Meta {
    members: BTreeMap<String, (u64, String, String)>,
}

/// Writes `bytes` to `path` atomically, ignoring failures (the cache is an optimisation).
fn cache_put(path: &Path, bytes: &[u8]) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
        let _ = crate::atomic_file::write(path, ".tmp", bytes, 0o600);
    }
}

/// A store blob whose bytes are not the lock's.
fn corrupt_blob(a: &ArtifactInput, found: &str) -> BakeError {
    BakeError::Blob {
        name: format!("{} {} ({})", a.name, a.version, a.blob.display()),
        expected: format!("sha256 {} (the lock's)", a.sha256),
        found: format!("sha256 {found}: the store is corrupt (run `kiln mirror verify`)"),
    }
}

/// Prepares one artifact's chosen members. `work` is a scratch directory for this artifact
/// when there is no usable cache.
pub fn prepare(
    a: &ArtifactInput,
    members: &[&MemberMap],
    cache: Option<&Path>,
    work: &Path,
) -> Result<Vec<Prepared>, BakeError> {
    match a.kind {
        InputKind::Binary => {
            let m = members[0];
            let cached = cache.map(|c| version_dir(c).join(format!("blob-{}.sha1", a.sha256)));
            let hit = cached
                .as_ref()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .filter(|s| s.len() == 40);
            // The blob is checked against the lock on every bake, a cached one too: the cache
            // only saves the SHA1, and a store blob can change after the bake that filled it.
            let sums = match hit {
                Some(_) => Sums::Sha256,
                None => Sums::Sha256AndSha1,
            };
            let d = digest::hash_file(&a.blob, sums).map_err(io_err(&a.blob))?;
            if d.sha256 != a.sha256 {
                return Err(corrupt_blob(a, &d.sha256));
            }
            let size = d.size;
            let sha1 = match hit {
                Some(s) => s,
                None => {
                    let sha1 = d.sha1.unwrap_or_default();
                    if let Some(p) = &cached {
                        cache_put(p, sha1.as_bytes());
                    }
                    sha1
                }
            };
            Ok(vec![Prepared {
                from: m.from.clone(),
                to: m.to.clone(),
                path: a.blob.clone(),
                size,
                sha256: a.sha256.clone(),
                sha1,
            }])
        }
        InputKind::Archive(kind) => {
            let wanted: Vec<String> = members.iter().map(|m| m.from.clone()).collect();
            let key = hex::encode(&Sha256::digest(wanted.join("\n").as_bytes())[..8]);
            let entry = cache.map(|c| {
                version_dir(c).join(format!(
                    "members-r{}-{}-{key}",
                    crate::archive_rules::RULES_VERSION,
                    a.sha256
                ))
            });
            let load = |dir: &Path| -> Option<Vec<Prepared>> {
                let meta: Meta =
                    serde_json::from_slice(&std::fs::read(dir.join("meta.json")).ok()?).ok()?;
                members
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        let (size, sha256, sha1) =
                            meta.members.get(extract::member_key(&m.from))?.clone();
                        let path = dir.join(format!("member-{i}"));
                        (std::fs::metadata(&path).ok()?.len() == size).then(|| Prepared {
                            from: m.from.clone(),
                            to: m.to.clone(),
                            path,
                            size,
                            sha256,
                            sha1,
                        })
                    })
                    .collect()
            };
            if let Some(hit) = entry.as_deref().and_then(load) {
                return Ok(hit);
            }
            // The download is checked against the lock before anything is taken out of it, as
            // a single binary is: a corrupt or replaced store blob must not reach a layer, nor
            // a cache entry keyed by the lock's digest.
            // One descriptor for the check and the extraction: a blob renamed over this name
            // in between (a shared store, a concurrent fetch) cannot slip members of another
            // archive into a cache entry keyed by the lock's digest.
            let mut file = std::fs::File::open(&a.blob).map_err(io_err(&a.blob))?;
            let sha256 = digest::hash_reader(&mut file, Sums::Sha256)
                .map_err(io_err(&a.blob))?
                .sha256;
            if sha256 != a.sha256 {
                return Err(corrupt_blob(a, &sha256));
            }
            // Extract into a fresh directory next to the cache entry (or in the scratch dir),
            // then publish it with one rename.
            let staging = match &entry {
                Some(e) => e
                    .parent()
                    .and_then(|p| std::fs::create_dir_all(p).ok().map(|_| p.to_path_buf()))
                    .and_then(|p| {
                        tempfile::Builder::new()
                            .prefix(".members-")
                            .tempdir_in(p)
                            .ok()
                    }),
                None => None,
            };
            let (dir, staging) = match staging {
                Some(t) => (t.path().to_path_buf(), Some(t)),
                None => {
                    std::fs::create_dir_all(work).map_err(io_err(work))?;
                    (work.to_path_buf(), None)
                }
            };
            // A cache entry is fsynced before it is published; scratch files are not.
            let got = extract::extract_members_from(
                &file,
                &a.blob,
                kind,
                &wanted,
                &dir,
                staging.is_some(),
                &crate::archive_rules::Policy::upstream(),
            )?;
            let meta = Meta {
                members: got
                    .iter()
                    .map(|(k, e)| (k.clone(), (e.size, e.sha256.clone(), e.sha1.clone())))
                    .collect(),
            };
            let final_dir = match (staging, &entry) {
                (Some(t), Some(e)) => {
                    let json = serde_json::to_vec(&meta).unwrap_or_default();
                    std::fs::write(t.path().join("meta.json"), json).map_err(io_err(t.path()))?;
                    let tmp = t.keep();
                    match std::fs::rename(&tmp, e) {
                        Ok(()) => e.clone(),
                        // Another bake published the same entry first: use theirs.
                        Err(_) if load(e).is_some() => {
                            let _ = std::fs::remove_dir_all(&tmp);
                            e.clone()
                        }
                        Err(_) => tmp,
                    }
                }
                _ => dir,
            };
            Ok(members
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    let e = &got[extract::member_key(&m.from)];
                    Prepared {
                        from: m.from.clone(),
                        to: m.to.clone(),
                        path: final_dir.join(format!("member-{i}")),
                        size: e.size,
                        sha256: e.sha256.clone(),
                        sha1: e.sha1.clone(),
                    }
                })
                .collect())
        }
    }
}
