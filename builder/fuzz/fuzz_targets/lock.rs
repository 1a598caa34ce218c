//! Fuzzes the artifact lock parser.
#![no_main]

use std::path::Path;

use kiln::supply::lock::Lock;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Lock::parse(text, Path::new("/fuzz/kiln.lock")) {
        Ok(lock) => {
            let back = Lock::parse(&lock.to_toml(), &lock.path).expect("to_toml output parses");
            assert_eq!(back, lock);
        }
        Err(e) => assert!(e.to_string().contains("/fuzz/kiln.lock"), "{e}"),
    }
});
