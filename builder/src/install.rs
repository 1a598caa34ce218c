//! `kiln install --root DIR LAYER.tar.zst`: applies a rootfs layer to a mounted root (or `/`
//! inside a Packer/image-builder VM). Idempotent, atomic per file, and it never touches a file
//! it does not own: ownership is recorded in `/usr/lib/kiln/install.manifest`.
//!
//! Paths are resolved the way a chroot would see them: a symlink in the root (merged `/usr`,
//! `/etc/systemd/system` on a separate mount…) is followed inside the root, never out of it.

use std::collections::{BTreeMap, VecDeque};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::bake::INSTALL_MANIFEST;

/// Why an install stopped. Nothing is written unless every check passed first.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// An I/O error on a named path.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The layer archive holds an entry kiln refuses to apply.
    #[error("{archive}: refusing layer entry {entry:?}: {why}")]
    Hostile {
        /// The layer archive.
        archive: PathBuf,
        /// The entry.
        entry: String,
        /// What is wrong with it.
        why: String,
    },
    /// A path in the root is not kiln's to change.
    #[error("{path}: {why}; kiln install changes only files it installed (listed in {manifest})")]
    NotOwned {
        /// The path in the root.
        path: PathBuf,
        /// What was found.
        why: String,
        /// The install manifest.
        manifest: PathBuf,
    },
    /// The root directory is unusable.
    #[error("root {root}: {why}")]
    Root {
        /// The root.
        root: PathBuf,
        /// What is wrong.
        why: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> InstallError {
    let path = path.to_path_buf();
    move |source| InstallError::Io { path, source }
}

/// What one install did, by layer path.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct InstallReport {
    /// Files and links written (new or updated).
    pub written: Vec<String>,
    /// Files and links already as the layer wants them.
    pub unchanged: Vec<String>,
    /// Files from an earlier install that this layer no longer has, removed.
    pub removed: Vec<String>,
    /// Files from an earlier install that were modified since; left alone.
    pub kept_modified: Vec<String>,
    /// Directories created.
    pub dirs_created: Vec<String>,
}

/// One layer entry to apply.
#[derive(Debug, Clone)]
enum Want {
    Dir,
    File { mode: u32, sha256: String },
    Link { target: String },
}

/// A manifest line: `sha256  mode  /path` (mode is octal, or `link`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    /// sha256 of the content (of the target, for links).
    pub sha256: String,
    /// `0755`, `0644` or `link`.
    pub mode: String,
}

/// Parses an install manifest; `path` names it in errors.
pub fn parse_manifest(text: &str, path: &Path) -> Result<BTreeMap<String, Owned>, InstallError> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let parts: Vec<&str> = line.splitn(3, "  ").collect();
        let ok = parts.len() == 3
            && parts[0].len() == 64
            && parts[0].bytes().all(|b| b.is_ascii_hexdigit())
            && parts[2].starts_with('/');
        if !ok {
            return Err(InstallError::Io {
                path: path.to_path_buf(),
                source: io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "line {}: expected `sha256  mode  /path`, found {line:?}",
                        i + 1
                    ),
                ),
            });
        }
        out.insert(
            parts[2].trim_start_matches('/').to_string(),
            Owned {
                sha256: parts[0].to_string(),
                mode: parts[1].to_string(),
            },
        );
    }
    Ok(out)
}

fn hostile(archive: &Path, entry: &str, why: impl Into<String>) -> InstallError {
    InstallError::Hostile {
        archive: archive.to_path_buf(),
        entry: entry.to_string(),
        why: why.into(),
    }
}

/// Checks a layer entry path and returns it without `./` and trailing `/`.
fn clean_path(archive: &Path, raw: &str) -> Result<String, InstallError> {
    let p = crate::lock::member_key(raw).trim_end_matches('/');
    if raw.starts_with('/') {
        return Err(hostile(archive, raw, "absolute path"));
    }
    if p.is_empty() || p.split('/').any(|c| c == ".." || c.is_empty() || c == ".") {
        return Err(hostile(archive, raw, "path with `..`, `.` or empty parts"));
    }
    Ok(p.to_string())
}

fn open_layer(archive: &Path) -> Result<tar::Archive<Box<dyn Read>>, InstallError> {
    let f = File::open(archive).map_err(io_err(archive))?;
    let dec = zstd::Decoder::new(f).map_err(io_err(archive))?;
    Ok(tar::Archive::new(Box::new(dec) as Box<dyn Read>))
}

/// Reads the whole layer once: every entry checked, every file hashed.
fn scan(archive: &Path) -> Result<BTreeMap<String, Want>, InstallError> {
    let mut out = BTreeMap::new();
    let mut tar = open_layer(archive)?;
    for e in tar.entries().map_err(io_err(archive))? {
        let mut e = e.map_err(io_err(archive))?;
        let raw = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let path = clean_path(archive, &raw)?;
        let mode = e.header().mode().map_err(io_err(archive))? & 0o7777;
        let want = match e.header().entry_type() {
            tar::EntryType::Directory => Want::Dir,
            tar::EntryType::Regular | tar::EntryType::Continuous => {
                if mode & 0o6000 != 0 {
                    return Err(hostile(archive, &raw, "setuid/setgid file"));
                }
                let mut h = Sha256::new();
                io::copy(&mut e, &mut h).map_err(io_err(archive))?;
                Want::File {
                    mode,
                    sha256: hex::encode(h.finalize()),
                }
            }
            tar::EntryType::Symlink => {
                let target = e
                    .link_name_bytes()
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                if target.is_empty() || target.contains('\0') {
                    return Err(hostile(archive, &raw, "empty symlink target"));
                }
                if !target.starts_with('/') {
                    let depth = path.split('/').count() as i64 - 1;
                    let mut d = depth;
                    for c in target.split('/') {
                        match c {
                            "" | "." => {}
                            ".." => d -= 1,
                            _ => d += 1,
                        }
                        if d < 0 {
                            return Err(hostile(archive, &raw, "symlink points outside the root"));
                        }
                    }
                }
                Want::Link { target }
            }
            tar::EntryType::Link => return Err(hostile(archive, &raw, "hard link")),
            tar::EntryType::Char | tar::EntryType::Block => {
                return Err(hostile(archive, &raw, "device node"))
            }
            tar::EntryType::Fifo => return Err(hostile(archive, &raw, "FIFO")),
            other => return Err(hostile(archive, &raw, format!("entry type {other:?}"))),
        };
        if out.insert(path, want).is_some() {
            return Err(hostile(archive, &raw, "path appears twice"));
        }
    }
    Ok(out)
}

/// Resolves `rel` inside `root` like a chroot would: parent symlinks are followed within the
/// root (`..` stops at the root); the last component is not followed.
pub fn resolve_in_root(root: &Path, rel: &str) -> Result<PathBuf, InstallError> {
    let comps: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
    let Some((last, parents)) = comps.split_last() else {
        return Ok(root.to_path_buf());
    };
    let mut queue: VecDeque<String> = parents.iter().map(|s| s.to_string()).collect();
    let mut cur: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = queue.pop_front() {
        match c.as_str() {
            "" | "." => continue,
            ".." => {
                cur.pop();
                continue;
            }
            _ => {}
        }
        let mut host = root.to_path_buf();
        host.extend(&cur);
        host.push(&c);
        match fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                hops += 1;
                if hops > 40 {
                    return Err(InstallError::Root {
                        root: root.to_path_buf(),
                        why: format!("too many symlinks resolving /{rel}"),
                    });
                }
                let t = fs::read_link(&host).map_err(io_err(&host))?;
                let t = t.to_string_lossy().into_owned();
                if t.starts_with('/') {
                    cur.clear();
                }
                for (i, p) in t.split('/').filter(|p| !p.is_empty()).enumerate() {
                    queue.insert(i, p.to_string());
                }
            }
            Ok(m) if m.is_dir() => cur.push(c),
            Ok(_) => {
                return Err(InstallError::NotOwned {
                    path: host,
                    why: format!("is not a directory, but /{rel} needs it to be one"),
                    manifest: root.join(INSTALL_MANIFEST),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => cur.push(c),
            Err(e) => return Err(io_err(&host)(e)),
        }
    }
    let mut host = root.to_path_buf();
    host.extend(&cur);
    host.push(last);
    Ok(host)
}

/// What is at a path now: `None`, a dir, or (sha256, mode-string) of a file or link.
fn current(path: &Path) -> Result<Option<Option<Owned>>, InstallError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path)(e)),
        Ok(m) if m.is_dir() => Ok(Some(None)),
        Ok(m) if m.file_type().is_symlink() => {
            let t = fs::read_link(path).map_err(io_err(path))?;
            Ok(Some(Some(Owned {
                sha256: hex::encode(Sha256::digest(t.to_string_lossy().as_bytes())),
                mode: "link".into(),
            })))
        }
        Ok(m) if m.is_file() => {
            let mut f = File::open(path).map_err(io_err(path))?;
            let mut h = Sha256::new();
            io::copy(&mut f, &mut h).map_err(io_err(path))?;
            Ok(Some(Some(Owned {
                sha256: hex::encode(h.finalize()),
                mode: format!("{:04o}", m.mode() & 0o7777),
            })))
        }
        Ok(_) => Ok(Some(Some(Owned {
            sha256: String::new(),
            mode: "special".into(),
        }))),
    }
}

fn sync_parent(path: &Path) {
    if let Some(d) = path.parent() {
        if let Ok(f) = File::open(d) {
            let _ = f.sync_all();
        }
    }
}

/// Applies the rootfs layer `archive` to `root`. With `dry_run`, only checks and reports.
pub fn install(archive: &Path, root: &Path, dry_run: bool) -> Result<InstallReport, InstallError> {
    let meta = fs::metadata(root).map_err(io_err(root))?;
    if !meta.is_dir() {
        return Err(InstallError::Root {
            root: root.to_path_buf(),
            why: "is not a directory".into(),
        });
    }
    let wants = scan(archive)?;
    if !matches!(wants.get(INSTALL_MANIFEST), Some(Want::File { .. })) {
        return Err(hostile(
            archive,
            INSTALL_MANIFEST,
            "missing: not a kiln rootfs layer (bake it with --format rootfs)",
        ));
    }
    let manifest_host = resolve_in_root(root, INSTALL_MANIFEST)?;
    let old = match fs::read_to_string(&manifest_host) {
        Ok(t) => parse_manifest(&t, &manifest_host)?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => BTreeMap::new(),
        Err(e) => return Err(io_err(&manifest_host)(e)),
    };
    let not_owned = |path: &Path, why: String| InstallError::NotOwned {
        path: path.to_path_buf(),
        why,
        manifest: manifest_host.clone(),
    };

    // Plan: every check before the first write.
    let mut report = InstallReport::default();
    let mut to_write: Vec<(String, PathBuf)> = Vec::new();
    let mut to_mkdir: Vec<(String, PathBuf)> = Vec::new();
    for (path, want) in &wants {
        let host = resolve_in_root(root, path)?;
        let now = current(&host)?;
        let new = match want {
            Want::Dir => {
                match now {
                    None => to_mkdir.push((path.clone(), host)),
                    Some(None) => {}
                    Some(Some(cur)) if cur.mode == "link" => {
                        // A symlink to a directory (merged /usr, a bind layout) is followed
                        // inside the root, like every other parent.
                        let inner = resolve_in_root(root, &format!("{path}/probe"))?;
                        if !inner.parent().is_some_and(Path::is_dir) {
                            return Err(not_owned(
                                &host,
                                "is a symlink that does not lead to a directory, the layer has one here".into(),
                            ));
                        }
                    }
                    Some(Some(_)) => {
                        return Err(not_owned(
                            &host,
                            "is not a directory, the layer has one here".into(),
                        ))
                    }
                }
                continue;
            }
            Want::File { mode, sha256 } => Owned {
                sha256: sha256.clone(),
                mode: format!("{mode:04o}"),
            },
            Want::Link { target } => Owned {
                sha256: hex::encode(Sha256::digest(target.as_bytes())),
                mode: "link".into(),
            },
        };
        if path == INSTALL_MANIFEST {
            continue;
        }
        match now {
            None => to_write.push((path.clone(), host)),
            Some(None) => return Err(not_owned(&host, "is a directory, the layer has a file here".into())),
            Some(Some(cur)) if cur == new => report.unchanged.push(path.clone()),
            Some(Some(cur)) => match old.get(path) {
                Some(o) if *o == cur => to_write.push((path.clone(), host)),
                Some(o) => {
                    return Err(not_owned(
                        &host,
                        format!(
                            "was modified since kiln installed it (sha256 {} mode {}, installed {} mode {}); restore or remove it",
                            cur.sha256, cur.mode, o.sha256, o.mode
                        ),
                    ))
                }
                None => {
                    return Err(not_owned(
                        &host,
                        format!(
                            "exists and was not installed by kiln (sha256 {} mode {}); remove it or the package that owns it",
                            cur.sha256, cur.mode
                        ),
                    ))
                }
            },
        }
    }
    let mut to_remove: Vec<(String, PathBuf)> = Vec::new();
    for (path, o) in &old {
        if wants.contains_key(path) || path == INSTALL_MANIFEST {
            continue;
        }
        let host = resolve_in_root(root, path)?;
        match current(&host)? {
            None => {}
            Some(Some(cur)) if cur == *o => to_remove.push((path.clone(), host)),
            Some(_) => report.kept_modified.push(path.clone()),
        }
    }
    if dry_run {
        report.written = to_write.into_iter().map(|(p, _)| p).collect();
        report.removed = to_remove.into_iter().map(|(p, _)| p).collect();
        report.dirs_created = to_mkdir.into_iter().map(|(p, _)| p).collect();
        return Ok(report);
    }

    for (path, host) in to_mkdir {
        fs::create_dir(&host).map_err(io_err(&host))?;
        fs::set_permissions(&host, fs::Permissions::from_mode(0o755)).map_err(io_err(&host))?;
        report.dirs_created.push(path);
    }
    // Second pass over the archive writes what the plan says, re-checking each hash.
    let write_set: BTreeMap<String, PathBuf> = to_write
        .into_iter()
        .chain(std::iter::once((
            INSTALL_MANIFEST.to_string(),
            manifest_host.clone(),
        )))
        .collect();
    let mut manifest_bytes = None;
    let mut tar = open_layer(archive)?;
    for e in tar.entries().map_err(io_err(archive))? {
        let mut e = e.map_err(io_err(archive))?;
        let raw = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let path = clean_path(archive, &raw)?;
        let Some(host) = write_set.get(&path) else {
            continue;
        };
        match wants.get(&path) {
            Some(Want::File { mode, sha256 }) => {
                if path == INSTALL_MANIFEST {
                    let mut b = Vec::new();
                    e.read_to_end(&mut b).map_err(io_err(archive))?;
                    manifest_bytes = Some((b, *mode));
                    continue;
                }
                write_file(host, &mut e, *mode, sha256, archive, &raw)?;
            }
            Some(Want::Link { target }) => {
                let dir = host.parent().unwrap_or(root);
                let tmp = dir.join(format!(".kiln-link-{}.tmp", std::process::id()));
                let _ = fs::remove_file(&tmp);
                std::os::unix::fs::symlink(target, &tmp).map_err(io_err(&tmp))?;
                fs::rename(&tmp, host).map_err(io_err(host))?;
                sync_parent(host);
            }
            _ => continue,
        }
        report.written.push(path);
    }
    for (path, host) in to_remove {
        fs::remove_file(&host).map_err(io_err(&host))?;
        sync_parent(&host);
        report.removed.push(path);
    }
    // The manifest goes last, so an interrupted install still lists every file it owned.
    if let Some((bytes, mode)) = manifest_bytes {
        let want = match wants.get(INSTALL_MANIFEST) {
            Some(Want::File { sha256, .. }) => sha256.clone(),
            _ => String::new(),
        };
        write_file(
            &manifest_host,
            &mut &bytes[..],
            mode,
            &want,
            archive,
            INSTALL_MANIFEST,
        )?;
    }
    Ok(report)
}

/// Writes one file atomically, refusing it if its bytes do not hash to `sha256`.
fn write_file(
    host: &Path,
    r: &mut impl Read,
    mode: u32,
    sha256: &str,
    archive: &Path,
    entry: &str,
) -> Result<(), InstallError> {
    let dir = host.parent().unwrap_or(Path::new("/"));
    let mut tmp = tempfile::Builder::new()
        .prefix(".kiln-")
        .suffix(".tmp")
        .tempfile_in(dir)
        .map_err(io_err(dir))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = r.read(&mut buf).map_err(io_err(archive))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        tmp.write_all(&buf[..n]).map_err(io_err(tmp.path()))?;
    }
    if hex::encode(h.finalize()) != sha256 {
        return Err(hostile(
            archive,
            entry,
            "content changed between the check and the write",
        ));
    }
    tmp.as_file()
        .set_permissions(fs::Permissions::from_mode(mode))
        .map_err(io_err(tmp.path()))?;
    tmp.as_file().sync_all().map_err(io_err(tmp.path()))?;
    tmp.persist(host).map_err(|e| InstallError::Io {
        path: host.to_path_buf(),
        source: e.error,
    })?;
    sync_parent(host);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_symlinks_inside_the_root() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
        std::os::unix::fs::symlink("/usr/lib", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../../../..", root.join("up")).unwrap();
        let cases: &[(&str, PathBuf)] = &[
            ("lib/x", root.join("usr/lib/x")),
            ("abs/x", root.join("usr/lib/x")),
            ("up/etc/passwd", root.join("etc/passwd")),
            ("new/dir/x", root.join("new/dir/x")),
            ("lib", root.join("lib")),
        ];
        for (rel, want) in cases {
            assert_eq!(&resolve_in_root(root, rel).unwrap(), want, "{rel}");
        }
    }

    #[test]
    fn manifest_lines_parse_or_name_the_line() {
        let sha = "a".repeat(64);
        let ok = format!("# c\n{sha}  0755  /usr/bin/x\n{sha}  link  /etc/y\n");
        let m = parse_manifest(&ok, Path::new("m")).unwrap();
        assert_eq!(m["usr/bin/x"].mode, "0755");
        assert_eq!(m["etc/y"].mode, "link");
        let err = parse_manifest("zz  0755  /x\n", Path::new("m")).unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
    }
}
