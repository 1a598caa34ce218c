//! `kiln image --node NODE_TOML`: the node config's files (what `kiln render --provisioner
//! files` writes) placed in the image's `/etc/kiln/`, for a node image baked for one cluster
//! that needs no user data at boot.
//!
//! The root is a mounted copy of a base image kiln did not make: every write goes through
//! [`crate::install::root`]'s descriptors, so a symlink in the base (`/etc/kiln -> /etc` on the
//! host, `/etc -> /`) resolves inside the image or not at all, and each file is a temp file
//! renamed over its name, with its mode set before the rename.

use std::io::Write;
use std::path::Path;

use crate::image::error::ImageError;
use crate::install::root::{Dir, Node, Root};
use crate::render::model::{NodeFile, CONTRACT_FILES, LINUX_DIR};

fn io(root: &Root, rel: &str, e: std::io::Error) -> ImageError {
    ImageError::Io {
        path: root.host_path(rel),
        source: e,
    }
}

/// The contract directory inside the image, created (0755) when the base has none.
fn contract_dir(root: &Root) -> Result<Dir, ImageError> {
    let rel = LINUX_DIR.trim_start_matches('/');
    if let Some(d) = root.dir(rel).map_err(|e| io(root, rel, e))? {
        return Ok(d);
    }
    let (parent, name) = rel.rsplit_once('/').unwrap_or(("", rel));
    let Some(p) = root.dir(parent).map_err(|e| io(root, parent, e))? else {
        return Err(io(
            root,
            parent,
            std::io::Error::other("the base's root filesystem has no /etc directory"),
        ));
    };
    match p.node(name).map_err(|e| io(root, rel, e))? {
        Node::Missing => p.mkdir(name).map_err(|e| io(root, rel, e)),
        // A dangling symlink: `root.dir` found nothing to open through it.
        other => Err(io(
            root,
            rel,
            std::io::Error::other(format!(
                "expected a directory or nothing, found {other:?} that leads nowhere in the image"
            )),
        )),
    }
}

/// Writes `files` into the image mounted at `mountpoint` and removes contract files an earlier
/// config left that this one does not write (one credential, never two). Returns the paths
/// written, as the node sees them.
pub fn place_node_files(mountpoint: &Path, files: &[NodeFile]) -> Result<Vec<String>, ImageError> {
    let root = Root::open(mountpoint, None).map_err(|e| ImageError::Io {
        path: mountpoint.to_path_buf(),
        source: e,
    })?;
    let dir = contract_dir(&root)?;
    let mut written = Vec::new();
    for f in files {
        write_one(&dir, f).map_err(|e| ImageError::Io {
            path: dir.host(&f.name),
            source: e,
        })?;
        written.push(f.linux_path());
    }
    for (name, _) in CONTRACT_FILES {
        if files.iter().any(|f| f.name == *name) {
            continue;
        }
        match dir.node(name) {
            Ok(Node::Missing) => {}
            Ok(Node::Dir) => {
                return Err(ImageError::Io {
                    path: dir.host(name),
                    source: std::io::Error::other(
                        "is a directory where the contract has a file; remove it from the base",
                    ),
                })
            }
            Ok(_) => dir.unlink(name).map_err(|e| ImageError::Io {
                path: dir.host(name),
                source: e,
            })?,
            Err(e) => {
                return Err(ImageError::Io {
                    path: dir.host(name),
                    source: e,
                })
            }
        }
    }
    dir.sync();
    Ok(written)
}

fn write_one(dir: &Dir, f: &NodeFile) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.node(&f.name)? == Node::Dir {
        return Err(std::io::Error::other(
            "is a directory where the contract has a file; remove it from the base",
        ));
    }
    let (tmp, mut file) = dir.create_temp()?;
    let done = (|| {
        file.write_all(&f.contents)?;
        file.set_permissions(std::fs::Permissions::from_mode(f.mode))?;
        file.sync_all()?;
        dir.rename(&tmp, &f.name)
    })();
    if done.is_err() {
        let _ = dir.unlink(&tmp);
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(name: &str, mode: u32, text: &str) -> NodeFile {
        NodeFile {
            name: name.into(),
            mode,
            contents: text.as_bytes().to_vec(),
        }
    }

    #[test]
    fn writes_files_with_modes_and_drops_the_other_credential() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(t.path().join("etc/kiln")).unwrap();
        // An earlier config's token must not survive next to the new one's credential.
        std::fs::write(t.path().join("etc/kiln/bootstrap-token"), "old").unwrap();
        let files = [
            file("node.env", 0o644, "KILN_CONTRACT=1\n"),
            file("bootstrap-kubeconfig", 0o600, "secret"),
        ];
        let w = place_node_files(t.path(), &files).unwrap();
        assert_eq!(w, ["/etc/kiln/node.env", "/etc/kiln/bootstrap-kubeconfig"]);
        let meta = std::fs::metadata(t.path().join("etc/kiln/bootstrap-kubeconfig")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
        assert!(!t.path().join("etc/kiln/bootstrap-token").exists());
        let left: Vec<_> = std::fs::read_dir(t.path().join("etc/kiln"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left.len(), 2, "no temp file left: {left:?}");
    }

    #[test]
    fn a_symlink_out_of_the_image_stays_inside_it() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = t.path().join("root");
        std::fs::create_dir_all(root.join("etc")).unwrap();
        // A hostile base: /etc/kiln points at a host directory by absolute path.
        std::os::unix::fs::symlink(outside.path(), root.join("etc/kiln")).unwrap();
        let r = place_node_files(&root, &[file("node.env", 0o644, "A=1\n")]);
        assert!(
            std::fs::read_dir(outside.path()).unwrap().next().is_none(),
            "wrote outside the image"
        );
        // Resolved inside the image, the target does not exist: a named error.
        let e = r.unwrap_err().to_string();
        assert!(e.contains("etc/kiln"), "{e}");
    }
}
