//! `SWAP_FILE_SIZE`: a swap file made and turned on before kubelet starts
//! (docs/contract.md, "Swap"). Made once: a later boot finds it, checks it and turns it on.

#[cfg(target_os = "linux")]
use std::io::Write;
use std::path::Path;

/// Where the file lives on the node.
pub const FILE: &str = "/var/lib/kiln/swapfile";

/// The first page of a swap area as mkswap writes it (util-linux `include/swapheader.h`; the
/// kernel's `union swap_header` in `include/linux/swap.h`): after 1024 boot bytes, version 1,
/// the last page's index, no bad pages, no UUID or label; the magic `SWAPSPACE2` ends the page.
pub fn header(page: usize, bytes: u64) -> Vec<u8> {
    let mut h = vec![0u8; page];
    let last = (bytes / page as u64).saturating_sub(1) as u32;
    h[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    h[1028..1032].copy_from_slice(&last.to_ne_bytes());
    h[page - 10..].copy_from_slice(b"SWAPSPACE2");
    h
}

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::{c_char, c_int};
    extern "C" {
        pub fn fallocate(fd: c_int, mode: c_int, offset: i64, len: i64) -> c_int;
        pub fn swapon(path: *const c_char, flags: c_int) -> c_int;
        pub fn getpagesize() -> c_int;
    }
}

/// Makes the file of `bytes` under `root` (again at every boot: `fallocate` makes even a
/// large one in milliseconds, and no stale file is ever trusted) and, on the real root,
/// turns it on. `Ok` says what was done; nothing is left half-made on an error.
#[cfg(target_os = "linux")]
pub fn ensure(root: &Path, bytes: u64) -> Result<&'static str, String> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::io::AsRawFd;
    let live = root == Path::new("/");
    let path = crate::contract::paths::under(root, FILE);
    // SAFETY: no arguments; the kernel's page size.
    let page = unsafe { sys::getpagesize() }.max(4096) as usize;
    let made = (|| {
        // A link or a file from before goes; a directory there is an error. EPERM: the
        // kernel refuses to unlink a swap file in use (`may_delete`'s IS_SWAPFILE,
        // fs/namei.c), so this one is on already (a second run in one boot).
        match std::fs::remove_file(&path) {
            Err(e) if e.raw_os_error() == Some(1) => return Ok(false),
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        // Allocated, not sparse: the kernel refuses a swap file with holes.
        // SAFETY: an open descriptor, offsets in range.
        if unsafe { sys::fallocate(f.as_raw_fd(), 0, 0, bytes as i64) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        f.write_all(&header(page, bytes))?;
        f.sync_all().map(|()| true)
    })();
    match made {
        Ok(true) => {}
        Ok(false) => return Ok("in use"),
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            return Err(format!("{FILE}: {e}"));
        }
    }
    if !live {
        return Ok("made");
    }
    // SAFETY: a NUL-terminated path; flags 0.
    if unsafe { sys::swapon(c"/var/lib/kiln/swapfile".as_ptr(), 0) } != 0 {
        return Err(format!(
            "{FILE}: swapon: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok("on")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_mkswaps() {
        let h = header(4096, 64 << 20);
        assert_eq!(&h[4086..], b"SWAPSPACE2");
        assert_eq!(u32::from_ne_bytes(h[1024..1028].try_into().unwrap()), 1);
        assert_eq!(
            u32::from_ne_bytes(h[1028..1032].try_into().unwrap()),
            (64 << 20) / 4096 - 1
        );
        assert!(h[..1024].iter().all(|b| *b == 0));
    }
}
