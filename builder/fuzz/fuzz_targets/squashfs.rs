//! Fuzzes the squashfs writer on trees decoded from the input: it never panics, and refuses a bad tree with an error naming the path.
#![no_main]

use std::collections::BTreeMap;

use kiln::bake::squashfs::{self, Codec, Options};
use kiln::bake::{Data, Node};
use libfuzzer_sys::fuzz_target;

/// Input: records of `kind byte, name length byte, name, payload length byte, payload`.
fn tree(mut data: &[u8]) -> Vec<(String, Node)> {
    let mut out = Vec::new();
    let take = |data: &mut &[u8], n: usize| -> Option<Vec<u8>> {
        let n = n.min(data.len());
        let (a, b) = data.split_at(n);
        *data = b;
        Some(a.to_vec())
    };
    while data.len() >= 2 {
        let kind = data[0];
        let n = data[1] as usize;
        data = &data[2..];
        let Some(name) = take(&mut data, n) else {
            break;
        };
        let name = String::from_utf8_lossy(&name).into_owned();
        let len = data.first().copied().unwrap_or(0) as usize * 512;
        data = data.get(1..).unwrap_or(&[]);
        let node = match kind % 3 {
            0 => Node::Dir,
            1 => Node::Symlink(format!("target-{len}")),
            _ => {
                let bytes: Vec<u8> = (0..len).map(|i| (i as u8) ^ kind).collect();
                Node::File {
                    size: bytes.len() as u64,
                    sha256: format!("{:x}", kind as u64 * 1_000_003 + len as u64),
                    sha1: String::new(),
                    mode: u32::from(kind) << 4 | 0o400,
                    data: Data::Inline(bytes),
                }
            }
        };
        out.push((name, node));
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let entries = tree(data);
    let dir = tempfile::tempdir().expect("temp dir");
    let img = dir.path().join("fuzz.raw");
    let opts = Options {
        codec: Codec::zstd(1),
        threads: 1,
        cache: None,
    };
    let order: BTreeMap<usize, (&str, &Node)> = entries
        .iter()
        .enumerate()
        .map(|(i, (p, n))| (i, (p.as_str(), n)))
        .collect();
    if let Err(e) = squashfs::write_file(order.into_values(), 0, &img, &opts) {
        assert!(e.to_string().starts_with("squashfs: /"), "{e}");
    }
});
