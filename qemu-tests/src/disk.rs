//! Guest disks: a private copy of a base root to change per test, and ext4 images built
//! from a directory with `mkfs.ext4 -d` (no root, no loop mounts).

use std::path::Path;
use std::process::Command;

use crate::{io_err, run, Error, Result};

/// Copies `base` to `dest` preserving owners, modes, links and times (`cp -a`), so a test
/// can change its own root without touching the cached base.
pub fn copy_tree(base: &Path, dest: &Path) -> Result<()> {
    cp(base, dest, "-a")
}

/// Like [`copy_tree`] but regular files are hard links to the base's (`cp -al`): ten times
/// faster for a 230 MB root. Safe only when every change to the copy replaces a file
/// (write a new file and rename it, or unlink first) instead of writing into it, which is
/// what [`crate::guest::Root`] and `kiln install` do.
///
/// Hard links need the copy on the base's filesystem; when it is elsewhere (a tmpfs `/tmp`),
/// this falls back to a full copy.
pub fn link_tree(base: &Path, dest: &Path) -> Result<()> {
    match cp(base, dest, "-al") {
        Ok(()) => Ok(()),
        Err(Error::Command { detail, .. }) if detail.contains("cross-device") => {
            std::fs::remove_dir_all(dest).map_err(io_err(dest))?;
            copy_tree(base, dest)
        }
        Err(e) => Err(e),
    }
}

fn cp(base: &Path, dest: &Path, flags: &str) -> Result<()> {
    std::fs::create_dir_all(dest).map_err(io_err(dest))?;
    let mut src = base.as_os_str().to_owned();
    src.push("/.");
    run(Command::new("cp").arg(flags).arg(src).arg(dest))?;
    Ok(())
}

/// Bytes used by a tree (`du -sb`).
pub fn tree_bytes(dir: &Path) -> Result<u64> {
    let out = run(Command::new("du").arg("-sb").arg(dir))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0))
}

/// Builds an ext4 image at `image` holding `dir`, with `free_mib` of room to spare for what
/// the guest writes (containerd's state, logs). The file is sparse.
pub fn make_ext4(dir: &Path, image: &Path, label: &str, free_mib: u64) -> Result<()> {
    let used = tree_bytes(dir)?;
    // ext4's own metadata takes a few percent; round up to whole MiB.
    let size = (used + used / 8) / (1 << 20) + free_mib + 16;
    let f = std::fs::File::create(image).map_err(io_err(image))?;
    f.set_len(size << 20).map_err(io_err(image))?;
    drop(f);
    run(Command::new("mkfs.ext4")
        .args(["-q", "-F", "-L", label, "-E", "root_owner=0:0", "-d"])
        .arg(dir)
        .arg(image))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ext4_image_holds_the_tree() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("root");
        std::fs::create_dir_all(dir.join("etc/kiln")).unwrap();
        std::fs::write(dir.join("etc/kiln/node.env"), "KILN_CONTRACT=1\n").unwrap();
        let copy = tmp.path().join("copy");
        copy_tree(&dir, &copy).unwrap();
        let linked = tmp.path().join("linked");
        link_tree(&dir, &linked).unwrap();
        use std::os::unix::fs::MetadataExt;
        let ino = |p: &Path| {
            std::fs::metadata(p.join("etc/kiln/node.env"))
                .unwrap()
                .ino()
        };
        assert_eq!(ino(&dir), ino(&linked));
        assert_ne!(ino(&dir), ino(&copy));
        let img = tmp.path().join("root.ext4");
        make_ext4(&copy, &img, "root", 8).unwrap();
        // /dev/shm is a tmpfs, another filesystem than the temp dir: hard links cannot
        // cross, so link_tree must fall back to a copy.
        let shm = tempfile::tempdir_in("/dev/shm").unwrap();
        let across = shm.path().join("root");
        link_tree(&dir, &across).unwrap();
        assert_eq!(
            std::fs::read_to_string(across.join("etc/kiln/node.env")).unwrap(),
            "KILN_CONTRACT=1\n"
        );
        assert_ne!(ino(&dir), ino(&across));
        // debugfs (e2fsprogs) reads the image back without mounting it.
        let out = Command::new("debugfs")
            .args(["-R", "cat /etc/kiln/node.env"])
            .arg(&img)
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "KILN_CONTRACT=1\n");
    }
}
