//! Fuzzes the `Content-Range` parser of resumed downloads.
#![no_main]

use kiln::supply::fetch::content_range_start;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(start) = content_range_start(text) {
        // Whatever is accepted names its start in decimal right after the unit.
        let rest = text.trim().split_once(' ').expect("a unit").1.trim_start();
        assert!(
            rest.starts_with(&start.to_string()) || rest.starts_with('0'),
            "{text:?}"
        );
    }
});
