//! Metadata volumes on Windows: a config drive or NoCloud seed has no mount step there, it is
//! a drive letter. The drives are listed with `GetLogicalDriveStringsW` and each one's label
//! read with `GetVolumeInformationW` (kernel32), as cloudbase-init finds its config drive.

use std::path::PathBuf;

use super::firmware::wide;

#[link(name = "kernel32")]
extern "system" {
    fn GetLogicalDriveStringsW(len: u32, buf: *mut u16) -> u32;
    fn GetVolumeInformationW(
        root: *const u16,
        name: *mut u16,
        name_len: u32,
        serial: *mut u32,
        max_component: *mut u32,
        flags: *mut u32,
        fs_name: *mut u16,
        fs_name_len: u32,
    ) -> i32;
}

/// Every drive's root (`D:\`) and volume label (empty when it has none or is not ready, as
/// an empty optical drive is).
pub fn drives() -> Vec<(PathBuf, String)> {
    let mut buf = vec![0u16; 512];
    // SAFETY: the buffer holds `len` u16s; the call writes at most that many.
    let n = unsafe { GetLogicalDriveStringsW(buf.len() as u32, buf.as_mut_ptr()) } as usize;
    buf.truncate(n.min(buf.len()));
    buf.split(|&c| c == 0)
        .filter(|r| !r.is_empty())
        .map(|r| {
            let root = String::from_utf16_lossy(r);
            let mut name = [0u16; 261];
            let w = wide(&root);
            // SAFETY: `w` is NUL-terminated; `name` holds MAX_PATH + 1 u16s; the other
            // out-parameters may be null.
            let ok = unsafe {
                GetVolumeInformationW(
                    w.as_ptr(),
                    name.as_mut_ptr(),
                    name.len() as u32,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    0,
                )
            };
            let end = name.iter().position(|&c| c == 0).unwrap_or(name.len());
            let label = match ok {
                0 => String::new(),
                _ => String::from_utf16_lossy(&name[..end]),
            };
            (PathBuf::from(root), label)
        })
        .collect()
}

/// The root of the first drive labelled one of `labels` (case-insensitive: FAT stores labels
/// upper-case, ISO 9660 as written).
pub fn labelled(labels: &[&str]) -> Option<PathBuf> {
    drives()
        .into_iter()
        .find(|(_, l)| labels.iter().any(|want| l.eq_ignore_ascii_case(want)))
        .map(|(root, _)| root)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under Wine and on Windows: the system drive is listed, a label no drive has is not
    /// found, and a drive that has a label is found by it in either case.
    #[test]
    fn drives_and_their_labels() {
        let all = drives();
        assert!(
            all.iter().any(|(r, _)| r.to_string_lossy().len() == 3),
            "{all:?}"
        );
        assert_eq!(labelled(&["kiln-no-such-label"]), None);
        if let Some((root, label)) = all.iter().find(|(_, l)| !l.is_empty()) {
            assert_eq!(
                labelled(&[&label.to_ascii_lowercase()]).as_ref(),
                Some(root)
            );
        }
    }
}
