//! The plain file tree: `DIR/etc/kiln/…` with the contract's modes, for Talos machine-config
//! files, Packer file provisioners or anything else that copies a tree onto `/`.

use std::path::{Path, PathBuf};

use crate::render::model::{write_atomic, NodeFile, RenderError, CONTRACT_FILES, LINUX_DIR};

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
        write_atomic(&dir.join(&f.name), &f.contents, f.mode)?;
    }
    for (name, _) in CONTRACT_FILES {
        if files.iter().any(|f| f.name == *name) {
            continue;
        }
        let stale = dir.join(name);
        match std::fs::remove_file(&stale) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RenderError::io(&stale, e)),
        }
    }
    Ok(dir)
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
/// `DIR/etc/kiln/`, sorted by the contract's order, then by name.
pub fn read_tree(root: &Path) -> Result<Vec<NodeFile>, RenderError> {
    let dir = kiln_dir(root);
    let entries = std::fs::read_dir(&dir).map_err(|e| RenderError::io(&dir, e))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| RenderError::io(&dir, e))?;
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
            name,
            mode: mode_of(&meta),
            contents,
        });
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

#[cfg(unix)]
fn mode_of(meta: &std::fs::Metadata) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o7777
}

#[cfg(not(unix))]
fn mode_of(_meta: &std::fs::Metadata) -> u32 {
    crate::render::model::PUBLIC_MODE
}
