//! Reading the files `node.toml` names (and `node.toml` itself): regular files only, opened
//! without waiting on a FIFO and checked on the open descriptor, and never more than a cap.
//!
//! A path in node.toml may name anything: a FIFO would block `kiln render` forever, `/dev/zero`
//! would be read until memory runs out. The checks happen before any byte is read.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// The most a CA bundle may hold: 1 MiB. A PEM certificate is 1-3 KiB; the largest public
/// trust bundles (Mozilla's, ~150 roots) are about 220 KiB. A cluster CA file is one to a few
/// certificates.
pub const MAX_CA: u64 = 1 << 20;

/// The most a `token_file` may hold: 4 KiB. A bootstrap token is 23 bytes; the cap leaves room
/// for comments or whitespace around it, and nothing a token file legitimately holds is larger.
pub const MAX_TOKEN: u64 = 4 << 10;

/// The most any other file node.toml names (node.toml itself, a kubeconfig, a kubelet config)
/// may hold: 1 MiB, far above any real one, and far below what the render payloads carry
/// (EC2 user data is 16 KiB).
pub const MAX_OTHER: u64 = 1 << 20;

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

fn type_name(m: &std::fs::Metadata) -> &'static str {
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
