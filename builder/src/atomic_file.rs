//! The one atomic file writer: a temp file in the destination's directory is filled, given its
//! mode, fsynced and renamed over the destination, and the directory is fsynced so the rename
//! survives a crash. Readers see the old file or the whole new one, never a torn one.
//!
//! The mode is the caller's: published outputs are 0644, stored blobs' indexes, lock files,
//! packs and cache entries keep the temp file's 0600.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// A step of an atomic write failed.
#[derive(Debug, thiserror::Error)]
#[error("{action} {path}: {source}")]
pub struct WriteError {
    /// What was being done ("creating temp file in", "writing", "syncing", "renaming into").
    pub action: &'static str,
    /// The directory, temp file or destination involved.
    pub path: PathBuf,
    /// The I/O error.
    pub source: io::Error,
}

fn err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> WriteError {
    let path = path.to_path_buf();
    move |source| WriteError {
        action,
        path,
        source,
    }
}

/// The directory a relative or bare `path` lives in (`.` for `name`).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A file being written next to its destination; [`AtomicFile::commit`] publishes it.
/// Dropped without a commit, the temp file is removed and the destination is untouched.
#[derive(Debug)]
pub struct AtomicFile {
    tmp: tempfile::NamedTempFile,
    dest: PathBuf,
}

impl AtomicFile {
    /// Creates a temp file named `prefix…suffix` in `dest`'s directory (which must exist).
    pub fn create(dest: &Path, prefix: &str, suffix: &str) -> Result<AtomicFile, WriteError> {
        let dir = dir_of(dest);
        let tmp = tempfile::Builder::new()
            .prefix(prefix)
            .suffix(suffix)
            .tempfile_in(dir)
            .map_err(err("creating temp file in", dir))?;
        Ok(AtomicFile {
            tmp,
            dest: dest.to_path_buf(),
        })
    }

    /// The open temp file, to fill.
    pub fn file_mut(&mut self) -> &mut File {
        self.tmp.as_file_mut()
    }

    /// The temp file's path, for a tool that writes it by name (mksquashfs, gpg).
    pub fn temp_path(&self) -> &Path {
        self.tmp.path()
    }

    /// The destination.
    pub fn dest(&self) -> &Path {
        &self.dest
    }

    /// Sets `mode`, fsyncs, renames over the destination and fsyncs its directory.
    pub fn commit(self, mode: u32) -> Result<(), WriteError> {
        let dest = self.dest;
        let f = self.tmp.as_file();
        set_mode(f, mode).map_err(err("setting the mode of", self.tmp.path()))?;
        f.sync_all().map_err(err("syncing", &dest))?;
        self.tmp.persist(&dest).map_err(|e| WriteError {
            action: "renaming into",
            path: dest.clone(),
            source: e.error,
        })?;
        sync_dir(dir_of(&dest));
        Ok(())
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.tmp.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.tmp.flush()
    }
}

/// Writes `bytes` to `dest` atomically with `mode`, through a temp file `prefix….tmp` (a
/// prefix lets the owner of a directory recognise its own leftovers). `dest`'s directory must
/// exist.
pub fn write(dest: &Path, prefix: &str, bytes: &[u8], mode: u32) -> Result<(), WriteError> {
    write_with(dest, prefix, mode, |f| f.write_all(bytes))
}

/// Like [`write()`], with a callback that streams the contents into the temp file.
pub fn write_with(
    dest: &Path,
    prefix: &str,
    mode: u32,
    fill: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), WriteError> {
    let mut f = AtomicFile::create(dest, prefix, ".tmp")?;
    let tmp = f.temp_path().to_path_buf();
    fill(f.file_mut()).map_err(err("writing", &tmp))?;
    f.commit(mode)
}

/// Makes a rename in `dir` durable. Best effort: some filesystems refuse fsync on directories.
pub fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(unix)]
fn set_mode(f: &File, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(std::fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_: &File, _: u32) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    fn mode_of(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn replaces_whole_file_with_the_given_mode() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out");
        std::fs::write(&p, b"old contents").unwrap();
        write(&p, ".t-", b"new", 0o644).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"new");
        #[cfg(unix)]
        assert_eq!(mode_of(&p), 0o644);
        write(&p, ".t-", b"secret", 0o600).unwrap();
        #[cfg(unix)]
        assert_eq!(mode_of(&p), 0o600);
        // No temp file is left behind.
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_failed_fill_leaves_the_destination_alone() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("out");
        std::fs::write(&p, b"old").unwrap();
        let e = write_with(&p, ".t-", 0o644, |f| {
            f.write_all(b"half")?;
            Err(io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert_eq!(e.action, "writing");
        assert_eq!(std::fs::read(&p).unwrap(), b"old");
        let names: Vec<_> = std::fs::read_dir(d.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_bare_name_is_written_in_the_current_directory_form() {
        assert_eq!(dir_of(Path::new("x")), Path::new("."));
        assert_eq!(dir_of(Path::new("a/x")), Path::new("a"));
    }

    #[test]
    fn a_missing_directory_is_named() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("nope/out");
        let e = write(&p, ".t-", b"x", 0o644).unwrap_err();
        assert_eq!(e.action, "creating temp file in");
        assert_eq!(e.path, d.path().join("nope"));
    }
}
