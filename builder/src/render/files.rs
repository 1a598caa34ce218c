//! The plain file tree: `DIR/etc/kiln/…` with the contract's modes, for Talos machine-config
//! files, Packer file provisioners or anything else that copies a tree onto `/`.

use std::path::{Path, PathBuf};

use crate::render::model::{write_atomic, NodeFile, RenderError, CONTRACT_FILES, LINUX_DIR};
use crate::render::registries::{CERTS_D, HOST_FILES};

/// `DIR/etc/kiln`.
pub fn kiln_dir(root: &Path) -> PathBuf {
    root.join(LINUX_DIR.trim_start_matches('/'))
}

/// Writes the files under `root` (each atomically, with its mode) and removes contract files
/// a previous render left that this one does not write, so the tree never holds two
/// credentials.
pub fn write_tree(root: &Path, files: &[NodeFile]) -> Result<PathBuf, RenderError> {
    let dir = kiln_dir(root);
    std::fs::create_dir_all(&dir).map_err(|e| RenderError::io(&dir, e))?;
    set_dir_mode(&dir)?;
    for f in files {
        let path = dir.join(&f.name);
        if let Some(parent) = path.parent().filter(|p| *p != dir) {
            std::fs::create_dir_all(parent).map_err(|e| RenderError::io(parent, e))?;
            for d in parent.ancestors().take_while(|d| *d != dir) {
                set_dir_mode(d)?;
            }
        }
        write_atomic(&path, &f.contents, f.mode)?;
    }
    // A registry directory an earlier render left would still be containerd's
    // configuration for that registry.
    let certs = dir.join(CERTS_D);
    if let Ok(entries) = std::fs::read_dir(&certs) {
        for entry in entries {
            let entry = entry.map_err(|e| RenderError::io(&certs, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let prefix = format!("{CERTS_D}/{name}/");
            let path = entry.path();
            if files.iter().any(|f| f.name.starts_with(&prefix)) {
                for stale in HOST_FILES {
                    if !files.iter().any(|f| f.name == format!("{prefix}{stale}")) {
                        remove_if_there(&path.join(stale))?;
                    }
                }
            } else if entry.file_type().is_ok_and(|t| t.is_dir()) {
                std::fs::remove_dir_all(&path).map_err(|e| RenderError::io(&path, e))?;
            } else {
                remove_if_there(&path)?;
            }
        }
    }
    for (name, _) in CONTRACT_FILES {
        if files.iter().any(|f| f.name == *name) {
            continue;
        }
        remove_if_there(&dir.join(name))?;
    }
    Ok(dir)
}

fn remove_if_there(path: &Path) -> Result<(), RenderError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RenderError::io(path, e)),
    }
}

#[cfg(unix)]
fn set_dir_mode(dir: &Path) -> Result<(), RenderError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| RenderError::io(dir, e))
}

#[cfg(not(unix))]
fn set_dir_mode(_dir: &Path) -> Result<(), RenderError> {
    Ok(())
}

/// Reads a tree written by [`write_tree`] (or by hand) back: every regular file directly in
/// `DIR/etc/kiln/`, in the directories of the contract's files in subdirectories (`trust.d/`,
/// `containerd/conf.d/`) and in its registry host directories (`containerd/certs.d/*/`),
/// sorted by the contract's order, then by name.
pub fn read_tree(root: &Path) -> Result<Vec<NodeFile>, RenderError> {
    let dir = kiln_dir(root);
    let mut files = read_files(&dir, "")?;
    for (name, _) in CONTRACT_FILES {
        if let Some((sub, _)) = name.rsplit_once('/') {
            if dir.join(sub).is_dir() {
                files.extend(read_files(&dir.join(sub), &format!("{sub}/"))?);
            }
        }
    }
    let certs = dir.join(CERTS_D);
    if let Ok(entries) = std::fs::read_dir(&certs) {
        for entry in entries {
            let entry = entry.map_err(|e| RenderError::io(&certs, e))?;
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let name = entry.file_name().to_string_lossy().into_owned();
                files.extend(read_files(&entry.path(), &format!("{CERTS_D}/{name}/"))?);
            }
        }
    }
    let rank = |n: &str| {
        CONTRACT_FILES
            .iter()
            .position(|(c, _)| *c == n)
            .unwrap_or(CONTRACT_FILES.len())
    };
    files.sort_by(|a, b| (rank(&a.name), &a.name).cmp(&(rank(&b.name), &b.name)));
    Ok(files)
}

/// The regular files directly in `dir`, named `prefix` + their name.
fn read_files(dir: &Path, prefix: &str) -> Result<Vec<NodeFile>, RenderError> {
    let entries = std::fs::read_dir(dir).map_err(|e| RenderError::io(dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| RenderError::io(dir, e))?;
        let path = entry.path();
        let meta = entry.metadata().map_err(|e| RenderError::io(&path, e))?;
        if !meta.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(".kiln-render-") {
            continue;
        }
        let contents = std::fs::read(&path).map_err(|e| RenderError::io(&path, e))?;
        files.push(NodeFile {
            name: format!("{prefix}{name}"),
            mode: mode_of(&meta),
            contents,
        });
    }
    Ok(files)
}

#[cfg(unix)]
fn mode_of(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn mode_of(_meta: &std::fs::Metadata) -> u32 {
    crate::render::model::PUBLIC_MODE
}
