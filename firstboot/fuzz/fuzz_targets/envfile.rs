//! Fuzzes the env-file parser: it must never panic, and whatever it accepts must survive
//! a write → parse round trip unchanged.
#![no_main]

use kiln_firstboot::contract::envfile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(env) = envfile::parse(text) else {
        return;
    };
    let mut out = String::new();
    for (k, v) in env.entries() {
        envfile::write_line(&mut out, k, v);
    }
    if out.len() <= envfile::MAX_LEN {
        let again = envfile::parse(&out).expect("written env file parses");
        assert_eq!(again, env);
    }
});
