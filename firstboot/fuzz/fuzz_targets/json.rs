//! Fuzzes the JSON reader: it must never panic or overflow the stack, and any string it
//! reads must come back the same through the writer.
#![no_main]

use kiln_firstboot::json::{self, Value};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(Value::String(s)) = json::parse(text) {
        let mut out = String::new();
        json::write_str(&mut out, &s);
        assert_eq!(json::parse(&out), Ok(Value::String(s)));
    }
});
