//! Fuzzes the MIME multipart user data reader.
#![no_main]

use kiln::render::cloudinit::parse_multipart;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = parse_multipart(text, "/fuzz/user-data") {
        assert!(e.to_string().contains("/fuzz/user-data"), "{e}");
    }
});
