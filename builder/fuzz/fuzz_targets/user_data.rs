//! Fuzzes the whole `kiln render --check` reader: gzip, cloud-config, Ignition, MIME multipart, PowerShell.
#![no_main]

use kiln::render::check_payload;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = check_payload(data, "/fuzz/user-data") {
        assert!(e.to_string().contains("/fuzz/user-data"), "{e}");
    }
});
