//! `SHA256SUMS`: `hex  name` lines, one per published image, sorted by name. `kiln bake`
//! writes it ([`render`]) and keeps the lines of other images already there ([`parse`]);
//! `kiln install` verifies a layer against it with the same parser.

use std::collections::BTreeMap;

/// The file's name beside the images.
pub const SUMS_NAME: &str = "SHA256SUMS";

/// The most a `SHA256SUMS` may hold: it lists a handful of images.
pub const MAX_SUMS_BYTES: u64 = 1 << 20;

/// A line the parser refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    /// The 1-based line number.
    pub line: usize,
    /// The line (its first 200 characters).
    pub found: String,
}

/// Parses `SHA256SUMS` text: `hex  name` (or `hex *name`, coreutils' binary mark) lines,
/// blank lines ignored. Returns name -> lowercase hex.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, BadLine> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = || BadLine {
            line: i + 1,
            found: line.chars().take(200).collect(),
        };
        let (hash, rest) = line.split_at_checked(64).ok_or_else(bad)?;
        let name = rest
            .strip_prefix("  ")
            .or_else(|| rest.strip_prefix(" *"))
            .ok_or_else(bad)?;
        if !hash.bytes().all(|b| b.is_ascii_hexdigit()) || name.is_empty() {
            return Err(bad());
        }
        out.insert(name.to_string(), hash.to_ascii_lowercase());
    }
    Ok(out)
}

/// The file's text for name -> hex: `hex  name` lines in name order (what `sha256sum -c`
/// reads).
pub fn render(sums: &BTreeMap<String, String>) -> String {
    sums.iter().map(|(f, h)| format!("{h}  {f}\n")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse_render_back_or_name_the_line() {
        let (a, b) = ("a".repeat(64), "B".repeat(64));
        let t = format!("{a}  one.raw\n\n{b} *two.raw\n");
        let m = parse(&t).unwrap();
        assert_eq!(m["one.raw"], a);
        assert_eq!(m["two.raw"], "b".repeat(64));
        assert_eq!(parse(&render(&m)).unwrap(), m);
        assert_eq!(
            render(&m),
            format!("{a}  one.raw\n{}  two.raw\n", "b".repeat(64))
        );
        for (bad, line) in [
            (format!("{a}  x\nnot a line"), 2),
            (format!("{a} x"), 1),
            (format!("{}  x", "g".repeat(64)), 1),
            (format!("{a}  "), 1),
        ] {
            assert_eq!(parse(&bad).unwrap_err().line, line, "{bad:?}");
        }
    }
}
