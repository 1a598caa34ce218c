//! The one bounded reader of files a user names (a lock, its signature, a key, the advisories,
//! node.toml and what it names): regular files only, opened without waiting on a FIFO and
//! checked on the open descriptor, and never more than a cap.
//!
//! A path on a command line may name anything: a FIFO would block kiln forever, `/dev/zero`
//! would be read until memory runs out. The checks happen before any byte is read.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The most a lock or an advisory file may hold: 16 MiB. The committed lock is about 40 KiB
/// with every platform and its citations; a lock a thousand times larger is still no lock.
pub const MAX_LOCK: u64 = 16 << 20;

/// The most a minisign key or signature file may hold: 64 KiB (each is a few hundred bytes:
/// two comment lines and a base64 line).
pub const MAX_KEY: u64 = 64 << 10;

/// Reads the regular file at `path`, refusing anything else (FIFO, device, directory,
/// socket) and anything larger than `cap` bytes, both before reading. Errors say what was
/// found: the file's type or size, never its contents.
pub fn read_regular(path: &Path, cap: u64) -> io::Result<Vec<u8>> {
    let file = open_nonblocking(path)?;
    let meta = file.metadata()?;
    if !meta.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (found a {})", type_name(&meta)),
        ));
    }
    if meta.len() > cap {
        return Err(too_large(cap));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    // The size can change between the fstat and the read: the cap holds either way.
    file.take(cap + 1).read_to_end(&mut out)?;
    if out.len() as u64 > cap {
        return Err(too_large(cap));
    }
    Ok(out)
}

/// [`read_regular`], and the bytes must be UTF-8 text.
pub fn read_text(path: &Path, cap: u64) -> io::Result<String> {
    String::from_utf8(read_regular(path, cap)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8 text"))
}

fn too_large(cap: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("holds more than {cap} bytes, the most kiln reads for it"),
    )
}

/// Opens for reading with `O_NONBLOCK` (a FIFO without a writer opens at once instead of
/// waiting) and `O_NOCTTY`. Symlinks are followed: node.toml names files by path on purpose.
fn open_nonblocking(path: &Path) -> io::Result<File> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        o.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
    o.open(path)
}

/// What kind of special file `m` describes, in words for an error message.
pub fn type_name(m: &std::fs::Metadata) -> &'static str {
    let t = m.file_type();
    if t.is_dir() {
        return "directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "FIFO";
        }
        if t.is_char_device() {
            return "character device";
        }
        if t.is_block_device() {
            return "block device";
        }
        if t.is_socket() {
            return "socket";
        }
    }
    "special file"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_and_types() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        std::fs::write(&p, b"12345").unwrap();
        assert_eq!(read_regular(&p, 5).unwrap(), b"12345");
        let e = read_regular(&p, 4).unwrap_err().to_string();
        assert!(e.contains("more than 4 bytes"), "{e}");
        let e = read_regular(d.path(), 4).unwrap_err().to_string();
        assert!(e.contains("found a directory"), "{e}");
        let e = read_regular(Path::new("/dev/null"), 4)
            .unwrap_err()
            .to_string();
        assert!(e.contains("character device"), "{e}");
    }
}
