//! Fuzzes the image definition parser.
#![no_main]

use std::path::Path;

use kiln::image_def::ImageDef;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match ImageDef::parse(text, Path::new("/fuzz/image.toml")) {
        Ok(def) => {
            let out = toml::to_string(&def).expect("serialises");
            let back = ImageDef::parse(&out, &def.path).expect("own output parses");
            assert_eq!(toml::to_string(&back).expect("serialises"), out);
        }
        Err(e) => assert!(e.to_string().contains("/fuzz/image.toml"), "{e}"),
    }
});
