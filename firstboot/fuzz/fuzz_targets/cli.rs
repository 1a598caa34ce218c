//! Fuzzes the command line parser: NUL-separated arguments; it must never panic, and a run
//! it accepts has a positive deadline and URLs that parse.
#![no_main]

use kiln_firstboot::cli::{self, Command};
use kiln_firstboot::http::Url;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let args: Vec<String> = text.split('\0').map(str::to_string).collect();
    if let Ok(Command::Run(o)) = cli::parse(&args) {
        assert!(o.deadline.is_none_or(|d| d > 0));
        assert!(o
            .metadata_url
            .as_deref()
            .is_none_or(|u| Url::parse(u).is_ok()));
        assert!(Url::parse(&o.healthz_url).is_ok());
    }
});
