//! What Windows knows of the machine's firmware, through the Win32 API declared by hand (no
//! crates): a string value from the registry (`RegGetValueW`, advapi32) and the raw SMBIOS
//! table (`GetSystemFirmwareTable('RSMB')`, kernel32). `provider/smbios.rs` makes DMI
//! values of them.

use std::ffi::c_void;
use std::ptr::null_mut;

pub(crate) type Handle = *mut c_void;

/// HKEY_LOCAL_MACHINE, a predefined handle: `(HKEY)(ULONG_PTR)(LONG)0x80000002`.
pub(crate) const HKEY_LOCAL_MACHINE: Handle = 0x8000_0002_u32 as i32 as isize as Handle;
/// `RRF_RT_REG_SZ`: only string values; anything else is "unsupported type".
const RRF_RT_REG_SZ: u32 = 0x0000_0002;
pub(crate) const ERROR_SUCCESS: i32 = 0;
const ERROR_MORE_DATA: i32 = 234;
/// 'RSMB', the raw SMBIOS firmware table provider, as GetSystemFirmwareTable spells it.
const RSMB: u32 = u32::from_be_bytes(*b"RSMB");
/// SMBIOS 3 tables are at most a few tens of KiB; anything larger is refused.
const MAX_TABLE: u32 = 1 << 20;

/// `KEY_QUERY_VALUE` / `KEY_SET_VALUE` access rights.
pub(crate) const KEY_QUERY_VALUE: u32 = 0x0001;
pub(crate) const KEY_SET_VALUE: u32 = 0x0002;
/// `ERROR_FILE_NOT_FOUND`: the key or value does not exist.
pub(crate) const ERROR_FILE_NOT_FOUND: i32 = 2;

// The registry calls kiln-firstboot makes, declared once for every Windows module.
#[link(name = "advapi32")]
extern "system" {
    pub(crate) fn RegOpenKeyExW(
        key: Handle,
        subkey: *const u16,
        options: u32,
        sam: u32,
        out: *mut Handle,
    ) -> i32;
    pub(crate) fn RegCreateKeyExW(
        key: Handle,
        subkey: *const u16,
        reserved: u32,
        class: *mut u16,
        options: u32,
        sam: u32,
        security: *mut c_void,
        result: *mut Handle,
        disposition: *mut u32,
    ) -> i32;
    pub(crate) fn RegSetValueExW(
        key: Handle,
        name: *const u16,
        reserved: u32,
        kind: u32,
        data: *const u8,
        len: u32,
    ) -> i32;
    pub(crate) fn RegDeleteValueW(key: Handle, name: *const u16) -> i32;
    pub(crate) fn RegCloseKey(key: Handle) -> i32;
    fn RegGetValueW(
        key: Handle,
        subkey: *const u16,
        value: *const u16,
        flags: u32,
        kind: *mut u32,
        data: *mut c_void,
        len: *mut u32,
    ) -> i32;
}

#[link(name = "kernel32")]
extern "system" {
    fn GetSystemFirmwareTable(provider: u32, id: u32, buf: *mut c_void, size: u32) -> u32;
}

pub(crate) fn wide(s: &str) -> Vec<u16> {
    s.encode_utf16().chain(std::iter::once(0)).collect()
}

/// The string value `name` of `HKLM\<key>`; `None` when the key or value is missing, is not
/// a string, or is longer than 4 KiB.
pub fn registry_string(key: &str, name: &str) -> Option<String> {
    let (key, name) = (wide(key), wide(name));
    let mut buf = vec![0u16; 256];
    loop {
        let mut len = (buf.len() * 2) as u32;
        // SAFETY: the strings are NUL-terminated; `buf` holds `len` bytes; RegGetValueW
        // writes at most `len` bytes and sets `len` to what it wrote (or needs).
        let rc = unsafe {
            RegGetValueW(
                HKEY_LOCAL_MACHINE,
                key.as_ptr(),
                name.as_ptr(),
                RRF_RT_REG_SZ,
                null_mut(),
                buf.as_mut_ptr().cast(),
                &mut len,
            )
        };
        match rc {
            ERROR_SUCCESS => {
                // `len` counts bytes including the terminating NUL.
                let chars = (len as usize / 2).min(buf.len());
                let text = &buf[..chars];
                let text = text.split(|&c| c == 0).next().unwrap_or(&[]);
                return Some(String::from_utf16_lossy(text));
            }
            ERROR_MORE_DATA if len <= 4096 && (len as usize) > buf.len() * 2 => {
                buf = vec![0u16; (len as usize).div_ceil(2)];
            }
            _ => return None,
        }
    }
}

/// The raw SMBIOS table (`RawSMBIOSData`: an 8-byte header, then the structures); `None`
/// when the firmware has none or the call fails.
pub fn smbios_table() -> Option<Vec<u8>> {
    // SAFETY: a null buffer of size 0 only asks for the size.
    let need = unsafe { GetSystemFirmwareTable(RSMB, 0, null_mut(), 0) };
    if need == 0 || need > MAX_TABLE {
        return None;
    }
    let mut buf = vec![0u8; need as usize];
    // SAFETY: `buf` holds `need` bytes, the size passed.
    let got = unsafe { GetSystemFirmwareTable(RSMB, 0, buf.as_mut_ptr().cast(), need) };
    if got == 0 || got > need {
        return None;
    }
    buf.truncate(got as usize);
    Some(buf)
}
