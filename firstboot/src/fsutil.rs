//! File helpers with the contract's guarantees: atomic writes (temp file in the same
//! directory, fsync, mode set, rename, directory fsync) and reads with a size cap.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path;

/// Writes `data` to `path` so that readers see the old file or the new one, never a torn one.
/// The temp file is created with its final mode ([`create_temp`]), so a secret is never
/// briefly open to others, and a name planted beside the target cannot redirect the write.
/// The directories on the way are real ones ([`real_dir`]): a symlink among them is refused,
/// never followed out of `--root`.
pub fn write_atomic(path: &Path, data: &[u8], mode: u32) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    real_dir(dir, true)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy())
        .unwrap_or_default();
    let (mut f, tmp) = create_temp(dir, &name, mode)?;
    let result = write_then_rename(&mut f, &tmp, path, data, mode);
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Removes the file `path` when it is there, through real directories only ([`real_dir`]):
/// a symlinked parent is refused, so nothing outside `--root` is removed. The name itself is
/// never followed (`unlink(2)` removes a link, not its target).
pub fn remove_file(path: &Path) -> io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    match real_dir(dir, false) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    match fs::remove_file(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

/// Checks that every component of `dir` is a directory and none is a symbolic link,
/// creating the missing ones (mode 0755) when `create` says so, and checking each again
/// after creating it. The whole path is checked, from the file system's root: `--root`
/// itself was resolved once when the command line was read (`cli`), so a link here was
/// planted under it (`ROOT/run/kiln -> /elsewhere` would send kubelet's bootstrap
/// kubeconfig out of the root). The error names the component and what it is.
///
/// The check and the use are separate calls (std has no `openat`): this defends against a
/// link planted before the run, not a process swapping directories during it, which needs
/// write access to the root's `/run` and so is root already.
pub fn real_dir(dir: &Path, create: bool) -> io::Result<()> {
    use std::path::Component;
    let mut at = std::path::PathBuf::new();
    for c in dir.components() {
        at.push(c);
        if !matches!(c, Component::Normal(_)) {
            continue;
        }
        let meta = match fs::symlink_metadata(&at) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && create => {
                match make_dir(&at) {
                    Ok(()) => {}
                    // Made by someone else meanwhile: checked below like any other.
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("{} cannot be created: {e}", at.display()),
                        ))
                    }
                }
                fs::symlink_metadata(&at)
            }
            m => m,
        };
        let meta = meta.map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", at.display())))?;
        if meta.file_type().is_symlink() {
            return Err(io::Error::other(format!(
                "{} is a symbolic link: expected a directory (links are never followed when writing, so a write cannot leave the root)",
                at.display()
            )));
        }
        if !meta.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a directory", at.display()),
            ));
        }
    }
    Ok(())
}

/// `mkdir(2)` with mode 0755 (before the umask), which never follows a link at the name.
#[cfg(unix)]
fn make_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    fs::DirBuilder::new().mode(0o755).create(dir)
}

#[cfg(not(unix))]
fn make_dir(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new().create(dir)
}

fn write_then_rename(
    f: &mut File,
    tmp: &Path,
    path: &Path,
    data: &[u8],
    mode: u32,
) -> io::Result<()> {
    f.write_all(data)?;
    set_mode(f, mode)?;
    f.sync_all()?;
    fs::rename(tmp, path)?;
    sync_dir(path.parent().unwrap_or(Path::new(".")));
    Ok(())
}

/// How many names [`create_temp`] tries before giving up: each try fails only when
/// something already sits at a fresh random name.
const TEMP_TRIES: u32 = 16;

/// Creates a new temp file `.<stem>.<random>.tmp` in `dir` with `mode`, opened
/// `O_CREAT|O_EXCL|O_NOFOLLOW`: the kernel refuses the open when anything, a symlink
/// included, already has the name, so a planted name can make one try fail but never
/// redirects the write. The random part (from `/dev/urandom`, else the clock, the pid and
/// a counter) only makes planting names in advance pointless; safety comes from `O_EXCL`.
pub fn create_temp(dir: &Path, stem: &str, mode: u32) -> io::Result<(File, std::path::PathBuf)> {
    let mut last = io::Error::from(io::ErrorKind::AlreadyExists);
    for _ in 0..TEMP_TRIES {
        let tmp = dir.join(format!(".{stem}.{:016x}.tmp", random_u64()));
        match create_new(&tmp, mode) {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = e,
            Err(e) => return Err(e),
        }
    }
    Err(last)
}

/// 64 random bits: `/dev/urandom`, or (where it cannot be read) the clock, the process id
/// and a counter mixed together, which are guessable but distinct per call.
pub fn random_u64() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut b = [0u8; 8];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut x = t
        ^ (u64::from(std::process::id()) << 32)
        ^ COUNTER
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // splitmix64's finaliser, so consecutive calls differ in every bit.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// `O_NOFOLLOW` in the Linux generic ABI (x86-64, aarch64, riscv64) and on the BSDs/macOS.
#[cfg(all(unix, target_os = "linux"))]
const O_NOFOLLOW: i32 = 0o400000;
#[cfg(all(unix, not(target_os = "linux")))]
const O_NOFOLLOW: i32 = 0x0100;

/// Creates `path` as a new file with `mode` (`O_CREAT|O_EXCL|O_NOFOLLOW`): fails with
/// `AlreadyExists` when anything, a dangling symlink included, has the name.
#[cfg(unix)]
pub fn create_new(path: &Path, mode: u32) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(O_NOFOLLOW)
        .mode(mode)
        .open(path)
}

/// Creates `path` as a new file (`CREATE_NEW`).
#[cfg(not(unix))]
pub fn create_new(path: &Path, _mode: u32) -> io::Result<File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

/// Opens the regular file `path` for reading and writing in place, creating it (mode 0644)
/// and its directories ([`real_dir`]) when missing: `O_NOFOLLOW`, so a symlink at the name
/// is refused, and a name that is not a regular file (a FIFO, a device) is refused on the
/// open descriptor.
pub fn open_in_place(path: &Path) -> io::Result<File> {
    real_dir(path.parent().unwrap_or(Path::new(".")), true)?;
    let mut o = fs::OpenOptions::new();
    o.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(O_NOFOLLOW | O_NONBLOCK_NOCTTY).mode(0o644);
    }
    #[cfg(not(unix))]
    if fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(io::Error::from_raw_os_error(ELOOP));
    }
    let f = o.open(path).map_err(|e| {
        if e.raw_os_error() == Some(ELOOP) {
            io::Error::other(format!(
                "{} is a symbolic link: expected a regular file (never followed)",
                path.display()
            ))
        } else {
            e
        }
    })?;
    if !f.metadata()?.is_file() {
        return Err(io::Error::other(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    Ok(f)
}

/// Why a secret file was refused.
#[derive(Debug)]
pub enum SecretError {
    /// It does not exist.
    Missing,
    /// The name is a symbolic link (never followed).
    Symlink,
    /// It is not a regular file.
    NotAFile,
    /// Group or others may read or write it: its mode.
    TooOpen(u32),
    /// Someone other than root or this process's user owns it: their uid.
    ForeignOwner(u32),
    /// It is larger than the cap.
    TooLarge(u64),
    /// It is not UTF-8 text.
    NotText,
    /// Another I/O error.
    Io(io::Error),
}

impl std::fmt::Display for SecretError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretError::Missing => f.write_str("not found"),
            SecretError::Symlink => {
                f.write_str("expected a regular file, found a symbolic link (never followed)")
            }
            SecretError::NotAFile => f.write_str("expected a regular file, found another type"),
            SecretError::TooOpen(m) => write!(f, "expected mode 0600, found 0{m:o}"),
            SecretError::ForeignOwner(uid) => {
                write!(f, "expected to be owned by root, found owner uid {uid}")
            }
            SecretError::TooLarge(cap) => write!(f, "expected at most {cap} bytes, found more"),
            SecretError::NotText => f.write_str("expected UTF-8 text"),
            SecretError::Io(e) => write!(f, "cannot read: {e}"),
        }
    }
}

/// Reads a secret file of at most `cap` bytes the safe way: opened `O_NOFOLLOW` (a symlink
/// at the name is refused, not followed), then type, mode and owner checked on the open
/// descriptor (`fstat`), so what was checked is what is read: no window in which the name
/// could be swapped between a `stat` and an `open`. `ELOOP` from `O_NOFOLLOW` is the
/// symlink case. Parent directories are trusted (they belong to root on a node).
pub fn read_secret(path: &Path, cap: u64) -> Result<String, SecretError> {
    let f = open_nofollow(path).map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => SecretError::Missing,
        _ if e.raw_os_error() == Some(ELOOP) => SecretError::Symlink,
        _ => SecretError::Io(e),
    })?;
    let meta = f.metadata().map_err(SecretError::Io)?;
    if !meta.is_file() {
        return Err(SecretError::NotAFile);
    }
    check_secret_meta(&meta)?;
    let mut buf = Vec::new();
    f.take(cap + 1)
        .read_to_end(&mut buf)
        .map_err(SecretError::Io)?;
    if buf.len() as u64 > cap {
        return Err(SecretError::TooLarge(cap));
    }
    String::from_utf8(buf).map_err(|_| SecretError::NotText)
}

/// `ELOOP`: what `open(2)` with `O_NOFOLLOW` answers for a symlink (Linux; BSDs too).
#[cfg(target_os = "linux")]
const ELOOP: i32 = 40;
#[cfg(not(target_os = "linux"))]
const ELOOP: i32 = 62;

/// `O_NONBLOCK | O_NOCTTY`: opening a FIFO or a terminal planted at a secret's name must
/// neither wait for a writer nor take the terminal; `fstat` then refuses it as not a file.
#[cfg(all(unix, target_os = "linux"))]
const O_NONBLOCK_NOCTTY: i32 = 0o4000 | 0o400;
#[cfg(all(unix, not(target_os = "linux")))]
const O_NONBLOCK_NOCTTY: i32 = 0x0004 | 0x20000;

#[cfg(unix)]
fn open_nofollow(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .read(true)
        .custom_flags(O_NOFOLLOW | O_NONBLOCK_NOCTTY)
        .open(path)
}

#[cfg(not(unix))]
fn open_nofollow(path: &Path) -> io::Result<File> {
    // Windows: a reparse point is not followed by this check; ACLs are the provisioner's job.
    if fs::symlink_metadata(path)?.file_type().is_symlink() {
        return Err(io::Error::from_raw_os_error(ELOOP));
    }
    File::open(path)
}

#[cfg(unix)]
fn check_secret_meta(meta: &fs::Metadata) -> Result<(), SecretError> {
    use std::os::unix::fs::MetadataExt;
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretError::TooOpen(mode));
    }
    let owner = meta.uid();
    // /proc/self belongs to the process's effective user: its uid without libc.
    let me = fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0);
    if owner != 0 && owner != me {
        return Err(SecretError::ForeignOwner(owner));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_secret_meta(_meta: &fs::Metadata) -> Result<(), SecretError> {
    Ok(())
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
    read_open(path, f, cap).map(Some)
}

/// [`read_capped`] for a file a provisioner placed: a symlink at the name is refused, and a
/// FIFO or device neither blocks nor is read (opened non-blocking, type checked on the
/// open descriptor).
pub fn read_regular(path: &Path, cap: u64) -> Result<Option<String>, String> {
    let f = match open_nofollow(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() != Some(ELOOP) => {
            return Err(format!("{}: cannot open: {e}", path.display()))
        }
        // ELOOP: a symlink at the name (O_NOFOLLOW).
        r => r.ok(),
    };
    let Some(f) = f.filter(|f| f.metadata().is_ok_and(|m| m.is_file())) else {
        return Err(format!(
            "{}: expected a regular file, found a symlink or another type",
            path.display()
        ));
    };
    read_open(path, f, cap).map(Some)
}

fn read_open(path: &Path, f: File, cap: u64) -> Result<String, String> {
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
    String::from_utf8(buf).map_err(|e| {
        format!(
            "{}: expected UTF-8 text, found an invalid byte at offset {}",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn write_atomic_names_the_directory_that_is_a_file() {
        let d = tempdir("notdir");
        fs::write(d.join("run"), b"").unwrap();
        let e = write_atomic(&d.join("run/kubelet.env"), b"x", 0o644).unwrap_err();
        let want = format!("{} exists and is not a directory", d.join("run").display());
        assert_eq!(e.to_string(), want);
        fs::remove_dir_all(&d).unwrap();
    }

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

    #[cfg(unix)]
    #[test]
    fn a_planted_symlink_never_redirects_a_write() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let d = tempdir("plant");
        let victim = d.join("victim");
        fs::write(&victim, "precious").unwrap();
        // At a temp name: the exclusive create refuses it, dangling or not.
        let planted = d.join(".status.json.0123456789abcdef.tmp");
        symlink(&victim, &planted).unwrap();
        let e = create_new(&planted, 0o600).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        let dangling = d.join("dangling");
        symlink(d.join("nowhere"), &dangling).unwrap();
        assert!(create_new(&dangling, 0o600).is_err());
        assert!(!d.join("nowhere").exists());
        // At the target name: the rename replaces the link itself, not what it points to.
        let target = d.join("status.json");
        symlink(&victim, &target).unwrap();
        write_atomic(&target, b"new", 0o644).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!fs::symlink_metadata(&target)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(&target).unwrap(), "new");
        // The temp file had its final mode from the start, whatever the umask.
        let (f, tmp) = create_temp(&d, "secret", 0o600).unwrap();
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
        let name = tmp.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            name.starts_with(".secret.") && name.ends_with(".tmp"),
            "{name}"
        );
        let (_, other) = create_temp(&d, "secret", 0o600).unwrap();
        assert_ne!(tmp, other, "two temp names in a row must differ");
        fs::remove_dir_all(d).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn secrets_are_checked_through_the_open_file() {
        use std::os::unix::fs::{symlink, PermissionsExt};
        let d = tempdir("secret");
        let real = d.join("token");
        fs::write(&real, "abcdef.0123456789abcdef\n").unwrap();
        fs::set_permissions(&real, fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            read_secret(&real, 4096).unwrap(),
            "abcdef.0123456789abcdef\n"
        );
        // A symlink to a perfectly good secret is refused, not followed.
        let link = d.join("link");
        symlink(&real, &link).unwrap();
        assert!(matches!(
            read_secret(&link, 4096),
            Err(SecretError::Symlink)
        ));
        fs::set_permissions(&real, fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            read_secret(&real, 4096),
            Err(SecretError::TooOpen(0o640))
        ));
        fs::set_permissions(&real, fs::Permissions::from_mode(0o600)).unwrap();
        assert!(matches!(
            read_secret(&real, 4),
            Err(SecretError::TooLarge(4))
        ));
        assert!(matches!(read_secret(&d, 4096), Err(SecretError::NotAFile)));
        // A FIFO at the name: refused at once, not waited on for a writer.
        let fifo = d.join("fifo");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        assert!(made.unwrap().success(), "mkfifo {}", fifo.display());
        assert!(matches!(
            read_secret(&fifo, 4096),
            Err(SecretError::NotAFile)
        ));
        assert!(matches!(
            read_secret(&d.join("absent"), 4096),
            Err(SecretError::Missing)
        ));
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
