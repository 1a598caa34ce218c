//! Fuzzes the secret scanner and the redactor: the first bytes up to a NUL are a credential
//! file, the rest is output text. Never a panic, and no secret the scanner found (long
//! enough to be matched) survives redaction of a text that holds it. Secrets with `<` or
//! `>`, or inside the word "redacted", are left out of the check: the mark itself can
//! complete them next to text that never held them.
#![no_main]

use kiln_firstboot::redact::{secrets_in, Redactor, MIN_SECRET};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (file, output) = text.split_once('\0').unwrap_or((text, ""));
    let secrets = secrets_in(file);
    let mut r = Redactor::shapes_only();
    r.add_all(&secrets);
    for s in secrets
        .iter()
        .map(|s| s.trim())
        .filter(|s| s.len() >= MIN_SECRET)
    {
        if s.contains(['<', '>']) || "redacted".contains(s) {
            continue;
        }
        let out = r.redact(&format!("{output}{s}{output}"));
        assert!(!out.as_str().contains(s), "{s:?} survived in {out:?}");
    }
});
