//! One bake per input, shared by every scenario (issue 35: nothing is built twice). Most
//! scenarios boot the same ubuntu rootfs layer; each used to run `kiln bake` for it again.
//! A bake's output is kept under `target/qemu-bake/<key>/`, where the key hashes everything
//! the bake reads: the `kiln` and `kiln-firstboot` binaries and this test binary (size and
//! modification time), the fixture lock, every file under `images/`, the pod image archive's
//! path (content-addressed by `cri-images.sh`), the image, the format and the architecture.
//! A lock file makes parallel test processes bake each key once; the output is baked into a
//! temporary directory and renamed into place, so a half-written bake is never used. The
//! files are shared read-only by convention: every user reads them (`kiln install`,
//! `kiln image --layer`, Ignition's fetch, the update mirror).

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};

use crate::{io_err, Error, Result};

/// Where bakes are kept: `target/qemu-bake/` of the target directory this test binary runs
/// from (as the console logs' `target/qemu-logs/`), else the system's temp directory.
pub fn cache_root() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "target"))
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir)
        .join("qemu-bake")
}

/// What a bake depends on, hashed into its key.
#[derive(Debug, Default)]
pub struct Inputs {
    hasher: DefaultHasher,
}

impl Inputs {
    /// A value (a name, an architecture, a path).
    pub fn value(&mut self, v: impl Hash) -> &mut Self {
        v.hash(&mut self.hasher);
        self
    }

    /// A file's bytes.
    pub fn file(&mut self, p: &Path) -> Result<&mut Self> {
        let bytes = std::fs::read(p).map_err(io_err(p))?;
        p.hash(&mut self.hasher);
        bytes.hash(&mut self.hasher);
        Ok(self)
    }

    /// A large binary by path, size and modification time (a rebuild changes them).
    pub fn binary(&mut self, p: &Path) -> Result<&mut Self> {
        let m = std::fs::metadata(p).map_err(io_err(p))?;
        p.hash(&mut self.hasher);
        m.len().hash(&mut self.hasher);
        m.modified().map_err(io_err(p))?.hash(&mut self.hasher);
        Ok(self)
    }

    /// Every file under `dir`, in name order.
    pub fn tree(&mut self, dir: &Path) -> Result<&mut Self> {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io_err(dir))?
            .map(|e| e.map(|e| e.path()).map_err(io_err(dir)))
            .collect::<Result<_>>()?;
        entries.sort();
        for p in entries {
            if p.is_dir() {
                self.tree(&p)?;
            } else {
                self.file(&p)?;
            }
        }
        Ok(self)
    }

    fn key(&self) -> String {
        format!("{:016x}", self.hasher.finish())
    }
}

/// The files of the bake named `name` with `inputs`: from the cache, or made by `bake` into
/// the directory it is given (returning the files it wrote, all inside that directory) and
/// kept. Older bakes of the same `name` are removed when a new one is kept.
pub fn cached(
    name: &str,
    inputs: &Inputs,
    bake: impl FnOnce(&Path) -> Result<Vec<PathBuf>>,
) -> Result<Vec<PathBuf>> {
    let root = cache_root();
    std::fs::create_dir_all(&root).map_err(io_err(&root))?;
    let key = format!("{name}-{}", inputs.key());
    let dir = root.join(&key);
    let list = dir.join("files.list");
    let lock_path = root.join(format!("{key}.lock"));
    let _lock = FileLock::take(&lock_path)?;
    if !list.is_file() {
        let tmp = root.join(format!("{key}.tmp"));
        let _ = std::fs::remove_dir_all(&tmp);
        let files = bake(&tmp)?;
        let mut rel = String::new();
        for f in &files {
            let r = f.strip_prefix(&tmp).map_err(|_| Error::Command {
                command: format!("bake {name}"),
                detail: format!("wrote {} outside {}", f.display(), tmp.display()),
            })?;
            rel.push_str(&r.to_string_lossy());
            rel.push('\n');
        }
        let tmp_list = tmp.join("files.list");
        std::fs::write(&tmp_list, rel).map_err(io_err(&tmp_list))?;
        prune(&root, name);
        std::fs::rename(&tmp, &dir).map_err(io_err(&dir))?;
    }
    let text = std::fs::read_to_string(&list).map_err(io_err(&list))?;
    Ok(text.lines().map(|l| dir.join(l)).collect())
}

/// An exclusive `flock(1)` on a file (the asset scripts' lock tool; `File::lock` is newer
/// than the workspace's MSRV), held by a child `flock … cat` until this is dropped or this
/// process dies (either closes the child's stdin).
struct FileLock(std::process::Child);

impl FileLock {
    fn take(path: &Path) -> Result<FileLock> {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let command = format!("flock {}", path.display());
        let mut child = Command::new("flock")
            .arg(path)
            .args(["-c", "echo locked; exec cat >/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| Error::Command {
                command: command.clone(),
                detail: format!("could not start: {e}"),
            })?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = std::io::BufReader::new(out).read_line(&mut line);
        }
        if line.trim() != "locked" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(Error::Command {
                command,
                detail: "ended without taking the lock".into(),
            });
        }
        Ok(FileLock(child))
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// Removes the kept bakes of `name` (their inputs changed: a rebuilt kiln, a new lock).
fn prune(root: &Path, name: &str) {
    let prefix = format!("{name}-");
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if n.starts_with(&prefix)
            && n.len() == prefix.len() + 16
            && e.path().join("files.list").is_file()
        {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bake_is_made_once_per_key_and_a_new_key_replaces_the_old() {
        let tmp = tempfile::tempdir().unwrap();
        let input = tmp.path().join("in");
        std::fs::write(&input, "one").unwrap();
        let mut runs = 0;
        let mut bake_with = |text: &str| {
            std::fs::write(&input, text).unwrap();
            let mut i = Inputs::default();
            i.value("t").file(&input).unwrap();
            cached("unit-test-bake", &i, |out| {
                runs += 1;
                std::fs::create_dir_all(out.join("sub")).unwrap();
                let f = out.join("sub/layer.tar");
                std::fs::write(&f, text).unwrap();
                Ok(vec![f])
            })
            .unwrap()
        };
        let first = bake_with("one");
        let again = bake_with("one");
        assert_eq!(first, again);
        assert_eq!(std::fs::read_to_string(&first[0]).unwrap(), "one");
        let second = bake_with("two");
        assert_ne!(first, second);
        assert_eq!(std::fs::read_to_string(&second[0]).unwrap(), "two");
        assert!(!first[0].exists(), "the old bake is pruned");
        assert_eq!(runs, 2);
        for e in std::fs::read_dir(cache_root()).unwrap().flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with("unit-test-bake-")
            {
                let _ = std::fs::remove_file(e.path());
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
