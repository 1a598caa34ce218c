//! Hyper-V data exchange (KVP) from a Windows guest: the guest's own pool is the registry key
//! `HKLM\SOFTWARE\Microsoft\Virtual Machine\Guest`, whose string values the Data Exchange
//! integration service (`vmickvpexchange`) hands to the host, where they read as the VM's
//! `GuestExchangeItems` (WMI `Msvm_KvpExchangeComponent`). It is the Windows side of what
//! `/var/lib/hyperv/.kvp_pool_1` is on Linux; VM build pipelines signal readiness the same way
//! (`reg add "HKLM\Software\Microsoft\Virtual Machine\Guest" /v <name> /t REG_SZ`).
//!
//! kiln writes the same records as on Linux: `KILN_STATUS|0`, `KILN_STATUS|1`, … hold the
//! status JSON in pieces of at most 1022 bytes (what the Azure host reads back of a value),
//! and `KILN_STATUS` holds the piece count, written last so a reader that sees a count finds
//! its pieces.

use std::ptr::null_mut;

use super::firmware::{
    registry_string, wide, Handle, RegCloseKey, RegCreateKeyExW, RegDeleteValueW, RegSetValueExW,
    ERROR_FILE_NOT_FOUND, ERROR_SUCCESS, HKEY_LOCAL_MACHINE, KEY_QUERY_VALUE, KEY_SET_VALUE,
};

/// The guest pool: values the guest publishes to the host.
pub const GUEST_KEY: &str = r"SOFTWARE\Microsoft\Virtual Machine\Guest";

const REG_SZ: u32 = 1;

/// An open registry key, closed on drop.
struct Key(Handle);

impl Drop for Key {
    fn drop(&mut self) {
        // SAFETY: the handle came from RegCreateKeyExW and is closed once.
        unsafe { RegCloseKey(self.0) };
    }
}

impl Key {
    fn create(path: &str) -> Result<Key, String> {
        let path_w = wide(path);
        let mut h: Handle = null_mut();
        // SAFETY: the path is NUL-terminated; `h` receives the opened key.
        let rc = unsafe {
            RegCreateKeyExW(
                HKEY_LOCAL_MACHINE,
                path_w.as_ptr(),
                0,
                null_mut(),
                0,
                KEY_QUERY_VALUE | KEY_SET_VALUE,
                null_mut(),
                &mut h,
                null_mut(),
            )
        };
        if rc != ERROR_SUCCESS {
            return Err(format!("opening HKLM\\{path}: Windows error {rc}"));
        }
        Ok(Key(h))
    }

    fn set(&self, name: &str, value: &str) -> Result<(), String> {
        let name_w = wide(name);
        let data: Vec<u8> = wide(value).iter().flat_map(|c| c.to_le_bytes()).collect();
        // SAFETY: the name is NUL-terminated; `data` is a NUL-terminated UTF-16 string of
        // `data.len()` bytes, as REG_SZ wants.
        let rc = unsafe {
            RegSetValueExW(
                self.0,
                name_w.as_ptr(),
                0,
                REG_SZ,
                data.as_ptr(),
                data.len() as u32,
            )
        };
        if rc != ERROR_SUCCESS {
            return Err(format!("setting {name}: Windows error {rc}"));
        }
        Ok(())
    }

    /// Deletes a value; a missing one is not an error.
    fn delete(&self, name: &str) -> Result<(), String> {
        let name_w = wide(name);
        // SAFETY: the name is NUL-terminated.
        let rc = unsafe { RegDeleteValueW(self.0, name_w.as_ptr()) };
        if rc != ERROR_SUCCESS && rc != ERROR_FILE_NOT_FOUND {
            return Err(format!("deleting {name}: Windows error {rc}"));
        }
        Ok(())
    }
}

/// Replaces kiln's records under `key` in the guest pool with `chunks`: the pieces first, then
/// the count, then any piece of a longer earlier value is removed.
pub fn publish(key: &str, chunks: &[&str]) -> Result<(), String> {
    let k = Key::create(GUEST_KEY)?;
    let before: usize = registry_string(GUEST_KEY, key)
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    for (i, c) in chunks.iter().enumerate() {
        k.set(&format!("{key}|{i}"), c)?;
    }
    k.set(key, &chunks.len().to_string())?;
    for i in chunks.len()..before.min(1024) {
        k.delete(&format!("{key}|{i}"))?;
    }
    Ok(())
}

/// Reads kiln's status back from the guest pool (`status`, tests): the pieces joined, or
/// `None` when the count or a piece is missing.
pub fn read(key: &str) -> Option<String> {
    let n: usize = registry_string(GUEST_KEY, key)?.trim().parse().ok()?;
    let mut s = String::new();
    for i in 0..n {
        s.push_str(&registry_string(GUEST_KEY, &format!("{key}|{i}"))?);
    }
    Some(s)
}
