//! Fuzzes the `node.toml` parser (files it names resolve against docs/examples/render).
#![no_main]

use std::path::Path;

use kiln::render::{ConfigError, NodeConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let base = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/render");
    match NodeConfig::parse(text, Path::new("/fuzz/node.toml"), &base) {
        Ok(c) => {
            let env = c.node_env();
            kiln_firstboot::contract::envfile::parse(&env).expect("firstboot reads node.env");
            let _ = c.files();
        }
        Err(e @ ConfigError::Read { .. }) => drop(e),
        Err(e) => assert!(e.to_string().contains("/fuzz/node.toml"), "{e}"),
    }
});
