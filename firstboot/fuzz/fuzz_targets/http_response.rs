//! Fuzzes the HTTP/1.1 response parser on raw bytes, both as a complete stream and as one
//! still arriving: never a panic, never a body over the cap, and a response complete
//! before EOF stays the same once EOF is seen.
#![no_main]

use kiln_firstboot::http::parse_response;
use libfuzzer_sys::fuzz_target;

const CAP: usize = 4096;

fuzz_target!(|data: &[u8]| {
    let early = parse_response(data, false, CAP);
    let at_eof = parse_response(data, true, CAP);
    if let Ok(Some(r)) = &at_eof {
        assert!(r.body.len() <= CAP);
    }
    if let Ok(Some(r)) = early {
        assert!(r.body.len() <= CAP);
        assert_eq!(at_eof, Ok(Some(r)));
    }
});
