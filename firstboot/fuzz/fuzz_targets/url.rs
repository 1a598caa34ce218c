//! Fuzzes the URL parser: it must never panic, and a URL it accepts comes back the same
//! through its display form.
#![no_main]

use kiln_firstboot::http::Url;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(u) = Url::parse(text) {
        assert!(u.path.starts_with('/'));
        assert!(!u.host.is_empty());
        assert_eq!(Url::parse(&u.to_string()), Ok(u));
    }
});
