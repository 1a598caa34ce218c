//! Fuzzes the max-pods map parser: it must never panic, every entry it returns has a
//! positive count and a one-word type, and no type comes twice.
#![no_main]

use kiln_firstboot::config::parse_max_pods;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(map) = parse_max_pods(text) {
        for (i, (ty, n)) in map.iter().enumerate() {
            assert!(*n > 0);
            assert!(!ty.is_empty() && !ty.contains(char::is_whitespace));
            assert!(!map[..i].iter().any(|(t, _)| t == ty));
        }
    }
});
