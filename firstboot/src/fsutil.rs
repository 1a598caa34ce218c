//! File helpers with the contract's guarantees: atomic writes (temp file in the same
//! directory, fsync, mode set, rename, directory fsync) and reads with a size cap.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path;

/// Writes `data` to `path` so that readers see the old file or the new one, never a torn one.
/// The mode is set on the temp file before the rename, so a secret is never briefly open.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
    let result = write_then_rename(&tmp, path, data, mode);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

fn write_then_rename(tmp: &Path, path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let mut f = create_with_mode(tmp, mode)?;
    f.write_all(data)?;
    set_mode(&f, mode)?;
    f.sync_all()?;
    drop(f);
    fs::rename(tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")));
    Ok(())
}

#[cfg(unix)]
fn create_with_mode(path: &Path, mode: u32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)
}

#[cfg(not(unix))]
fn create_with_mode(path: &Path, _mode: u32) -> io::Result<File> {
    File::create(path)
}

/// Sets the mode exactly: `open(2)` applies the umask, this does not.
#[cfg(unix)]
fn set_mode(f: &File, mode: u32) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_f: &File, _mode: u32) -> io::Result<()> {
    Ok(())
}

/// Makes the rename itself durable; best effort, since some filesystems refuse it.
#[cfg(unix)]
fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(not(unix))]
fn sync_dir(_dir: &Path) {}

/// Reads a text file of at most `cap` bytes. `Ok(None)` when it does not exist.
pub fn read_capped(path: &Path, cap: u64) -> Result<Option<String>, String> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: cannot open: {e}", path.display())),
    };
    let mut buf = Vec::new();
    f.take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
    if buf.len() as u64 > cap {
        return Err(format!(
            "{}: expected at most {cap} bytes, found more",
            path.display()
        ));
    }
    String::from_utf8(buf).map(Some).map_err(|e| {
        format!(
            "{}: expected UTF-8 text, found an invalid byte at offset {}",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// The permission bits of `path` when they let group or others read it (unix only).
#[cfg(unix)]
pub fn too_open(path: &Path) -> io::Result<Option<u32>> {
    use std::os::unix::fs::PermissionsExt;
    let mode = fs::metadata(path)?.permissions().mode() & 0o777;
    Ok((mode & 0o077 != 0).then_some(mode))
}

/// The owner of `path` when it is neither root nor the user running this process: a secret
/// someone else owns could have been swapped under us (unix only).
#[cfg(unix)]
pub fn foreign_owner(path: &Path) -> io::Result<Option<u32>> {
    use std::os::unix::fs::MetadataExt;
    let owner = fs::metadata(path)?.uid();
    // /proc/self belongs to the process's effective user: its uid without libc.
    let me = fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0);
    Ok((owner != 0 && owner != me).then_some(owner))
}

/// Windows has no uid; ACLs are the provisioner's job there.
#[cfg(not(unix))]
pub fn foreign_owner(path: &Path) -> io::Result<Option<u32>> {
    fs::metadata(path).map(|_| None)
}

/// Windows has no mode bits; ACLs are the provisioner's job there.
#[cfg(not(unix))]
pub fn too_open(path: &Path) -> io::Result<Option<u32>> {
    fs::metadata(path).map(|_| None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn tempdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "kiln-fsutil-{tag}-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp() {
        let d = tempdir("aw");
        let p = d.join("sub/kubelet.env");
        write_atomic(&p, b"one\n", 0o644).unwrap();
        write_atomic(&p, b"two\n", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two\n");
        let names: Vec<_> = fs::read_dir(d.join("sub")).unwrap().collect();
        assert_eq!(names.len(), 1, "a temp file was left behind");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                fs::metadata(&p).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn failed_write_leaves_nothing() {
        let d = tempdir("fail");
        // The target is a directory, so the rename fails after the temp file was written.
        let p = d.join("target");
        fs::create_dir_all(p.join("x")).unwrap();
        assert!(write_atomic(&p, b"data", 0o644).is_err());
        let names: Vec<_> = fs::read_dir(&d)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["target"]);
        fs::remove_dir_all(d).unwrap();
    }

    #[test]
    fn capped_reads() {
        let d = tempdir("cap");
        let p = d.join("f");
        assert_eq!(read_capped(&p, 10), Ok(None));
        fs::write(&p, "12345").unwrap();
        assert_eq!(read_capped(&p, 5), Ok(Some("12345".into())));
        assert!(read_capped(&p, 4).unwrap_err().contains("at most 4 bytes"));
        fs::write(&p, b"ok\xff").unwrap();
        assert!(read_capped(&p, 10).unwrap_err().contains("offset 2"));
        fs::remove_dir_all(d).unwrap();
    }
}
