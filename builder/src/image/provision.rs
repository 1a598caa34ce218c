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
        let (parent, base) = f.name.rsplit_once('/').unwrap_or(("", &f.name));
        let at = |e| ImageError::Io {
            path: dir.host(&f.name),
            source: e,
        };
        let sub = subdirs(&dir, parent).map_err(at)?;
        write_one(sub.as_ref().unwrap_or(&dir), base, f).map_err(at)?;
        written.push(f.linux_path());
    }
    stale_registries(&dir, files)?;
    for (name, _) in CONTRACT_FILES {
        if files.iter().any(|f| f.name == *name) {
            continue;
        }
        // A nested name's directories are opened one by one, never through a link.
        let (parent, base) = name.rsplit_once('/').unwrap_or(("", name));
        let at = |e| ImageError::Io {
            path: dir.host(name),
            source: e,
        };
        let sub = match existing_subdirs(&dir, parent).map_err(at)? {
            Some(sub) => sub,
            None => continue,
        };
        let d = sub.as_ref().unwrap_or(&dir);
        match d.node(base).map_err(at)? {
            Node::Missing => {}
            Node::Dir => {
                return Err(at(std::io::Error::other(
                    "is a directory where the contract has a file; remove it from the base",
                )))
            }
            _ => d.unlink(base).map_err(at)?,
        }
    }
    dir.sync();
    Ok(written)
}

/// Opens (or creates, 0755) each directory of `rel` under `dir` in turn, refusing a symlink
/// or anything else that is not a directory on the way; `None` for `""`.
fn subdirs(dir: &Dir, rel: &str) -> std::io::Result<Option<Dir>> {
    let mut cur: Option<Dir> = None;
    for c in rel.split('/').filter(|c| !c.is_empty()) {
        let here = cur.as_ref().unwrap_or(dir);
        let next = match here.node(c)? {
            Node::Missing => here.mkdir(c)?,
            Node::Dir => here.subdir(c)?,
            other => {
                return Err(std::io::Error::other(format!(
                    "expected a directory or nothing at {}, found {other:?}",
                    here.host(c).display()
                )))
            }
        };
        cur = Some(next);
    }
    Ok(cur)
}

/// Opens each existing directory of `rel` under `dir` (never through a link); `None` when one
/// is missing (nothing to remove there), `Some(None)` for `""`.
fn existing_subdirs(dir: &Dir, rel: &str) -> std::io::Result<Option<Option<Dir>>> {
    let mut cur: Option<Dir> = None;
    for c in rel.split('/').filter(|c| !c.is_empty()) {
        let here = cur.as_ref().unwrap_or(dir);
        match here.node(c)? {
            Node::Dir => cur = Some(here.subdir(c)?),
            Node::Missing => return Ok(None),
            other => {
                return Err(std::io::Error::other(format!(
                    "expected a directory or nothing at {}, found {other:?}",
                    here.host(c).display()
                )))
            }
        }
    }
    Ok(Some(cur))
}

/// A registry host directory the base holds and this config does not write would still be
/// containerd's configuration for that registry (the first root with the host's directory
/// wins): refused, never left in place or guessed at. In the directories this config does
/// write, a CA file it does not write is removed.
fn stale_registries(dir: &Dir, files: &[NodeFile]) -> Result<(), ImageError> {
    use crate::render::registries::{CERTS_D, HOST_FILES};
    let io_at = |p: std::path::PathBuf| move |e| ImageError::Io { path: p, source: e };
    let Some(certs) = (match dir
        .node("containerd")
        .map_err(io_at(dir.host("containerd")))?
    {
        Node::Dir => {
            let c = dir
                .subdir("containerd")
                .map_err(io_at(dir.host("containerd")))?;
            match c.node("certs.d").map_err(io_at(dir.host(CERTS_D)))? {
                Node::Dir => Some(c.subdir("certs.d").map_err(io_at(dir.host(CERTS_D)))?),
                _ => None,
            }
        }
        _ => None,
    }) else {
        return Ok(());
    };
    for host in certs.names().map_err(io_at(dir.host(CERTS_D)))? {
        let prefix = format!("{CERTS_D}/{host}/");
        let ours: Vec<&str> = files
            .iter()
            .filter_map(|f| f.name.strip_prefix(&prefix))
            .collect();
        if ours.is_empty() {
            return Err(ImageError::Io {
                path: certs.host(&host),
                source: std::io::Error::other(
                    "a registry configuration this node.toml does not write (from an earlier \
                     `kiln image --node`?): containerd would still use it; start from a base \
                     without it",
                ),
            });
        }
        let sub = certs.subdir(&host).map_err(io_at(certs.host(&host)))?;
        for name in HOST_FILES.iter().filter(|n| !ours.contains(n)) {
            match sub.node(name).map_err(io_at(sub.host(name)))? {
                Node::Missing => {}
                _ => sub.unlink(name).map_err(io_at(sub.host(name)))?,
            }
        }
    }
    Ok(())
}

fn write_one(dir: &Dir, name: &str, f: &NodeFile) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if dir.node(name)? == Node::Dir {
        return Err(std::io::Error::other(
            "is a directory where the contract has a file; remove it from the base",
        ));
    }
    let (tmp, mut file) = dir.create_temp()?;
    let done = (|| {
        file.write_all(&f.contents)?;
        file.set_permissions(std::fs::Permissions::from_mode(f.mode))?;
        file.sync_all()?;
        dir.rename(&tmp, name)
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

    #[test]
    fn registry_directories_are_made_inside_and_a_stale_one_is_refused() {
        let t = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("etc/kiln")).unwrap();
        let hosts = "containerd/certs.d/r.example_5000_/hosts.toml";
        let ca = "containerd/certs.d/r.example_5000_/ca.crt";
        let files = [
            file("node.env", 0o644, "A=1\n"),
            file(ca, 0o644, "PEM"),
            file(hosts, 0o644, "server = 'https://r.example:5000'\n"),
        ];
        place_node_files(root, &files).unwrap();
        let dir = root.join("etc/kiln/containerd/certs.d/r.example_5000_");
        assert_eq!(std::fs::read_to_string(dir.join("ca.crt")).unwrap(), "PEM");
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o755);
        // The same registry without its CA: the old CA goes.
        place_node_files(root, &[files[0].clone(), files[2].clone()]).unwrap();
        assert!(!dir.join("ca.crt").exists() && dir.join("hosts.toml").exists());
        // A config without that registry: refused, named, nothing guessed.
        let e = place_node_files(root, &files[..1]).unwrap_err().to_string();
        assert!(
            e.contains("r.example_5000_") && e.contains("does not write"),
            "{e}"
        );
        // A base whose `containerd` is a link out of the image: nothing written outside.
        std::fs::remove_dir_all(root.join("etc/kiln/containerd")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.join("etc/kiln/containerd")).unwrap();
        let e = place_node_files(root, &files).unwrap_err().to_string();
        assert!(
            std::fs::read_dir(outside.path()).unwrap().next().is_none(),
            "wrote outside the image"
        );
        assert!(e.contains("containerd"), "{e}");
    }
}
