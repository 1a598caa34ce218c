//! Fuzzes the PowerShell user data reader; what it reads, the writer writes back the same.
#![no_main]

use kiln::render::windows;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match windows::parse(text, "/fuzz/user-data.ps1") {
        Ok((files, _)) => {
            let again = String::from_utf8(windows::render(&files)).expect("UTF-8");
            assert_eq!(
                windows::parse(&again, "again")
                    .expect("own output parses")
                    .0,
                files
            );
        }
        Err(e) => assert!(e.to_string().contains("/fuzz/user-data.ps1"), "{e}"),
    }
});
