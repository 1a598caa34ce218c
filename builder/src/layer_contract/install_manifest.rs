//! `/usr/lib/kiln/install.manifest`: what an earlier `kiln install` wrote, so a later one
//! replaces or removes only files kiln owns. The manifest comes from the root, so it is input
//! like any other: every path in it must pass the same name rules as a layer entry.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::archive_rules;

/// A manifest line: `sha256  mode  /path` (mode is four octal digits, or `link`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owned {
    /// sha256 of the content (of the target, for links).
    pub sha256: String,
    /// `0755`, `0644` or `link`.
    pub mode: String,
}

/// A line the manifest parser refuses.
#[derive(Debug, thiserror::Error)]
#[error("{path}: line {line}: {why}, found {found:?}")]
pub struct ManifestError {
    /// The manifest.
    pub path: PathBuf,
    /// The 1-based line.
    pub line: usize,
    /// What is wrong.
    pub why: String,
    /// The line (first 200 characters).
    pub found: String,
}

/// Parses an install manifest; `path` names it in errors. Keys are the paths without the
/// leading `/`.
pub fn parse_manifest(text: &str, path: &Path) -> Result<BTreeMap<String, Owned>, ManifestError> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let bad = |why: String| ManifestError {
            path: path.to_path_buf(),
            line: i + 1,
            why,
            found: line.chars().take(200).collect(),
        };
        let parts: Vec<&str> = line.splitn(3, "  ").collect();
        let [sha, mode, p] = parts[..] else {
            return Err(bad("expected `sha256  mode  /path`".into()));
        };
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("expected 64 hex digits of sha256".into()));
        }
        let mode_ok =
            mode == "link" || (mode.len() == 4 && mode.bytes().all(|b| (b'0'..=b'7').contains(&b)));
        if !mode_ok {
            return Err(bad("expected a mode of four octal digits or `link`".into()));
        }
        let Some(rel) = p.strip_prefix('/') else {
            return Err(bad("expected an absolute path".into()));
        };
        let clean = match archive_rules::clean_name(rel) {
            Ok(c) if !c.is_empty() && c == rel => c,
            Ok(_) => return Err(bad("path is not in canonical form".into())),
            Err(r) => return Err(bad(format!("path refused: {r}"))),
        };
        if out
            .insert(
                clean,
                Owned {
                    sha256: sha.to_ascii_lowercase(),
                    mode: mode.to_string(),
                },
            )
            .is_some()
        {
            return Err(bad("path listed twice".into()));
        }
    }
    Ok(out)
}

/// The manifest's text for `entries`: what `kiln bake` writes into a rootfs layer, and the
/// parser's inverse.
pub fn render_manifest(entries: &BTreeMap<String, Owned>) -> String {
    let mut s = String::from("# kiln install manifest v1: sha256  mode  path\n");
    for (p, o) in entries {
        s.push_str(&format!("{}  {}  /{p}\n", o.sha256, o.mode));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_lines_parse_or_name_the_line() {
        let sha = "a".repeat(64);
        let ok = format!("# c\n{sha}  0755  /usr/bin/x\n{sha}  link  /etc/y\n");
        let m = parse_manifest(&ok, Path::new("m")).unwrap();
        assert_eq!(m["usr/bin/x"].mode, "0755");
        assert_eq!(m["etc/y"].mode, "link");
        assert_eq!(
            parse_manifest(&render_manifest(&m), Path::new("m")).unwrap(),
            m
        );
        for (bad, why) in [
            ("zz  0755  /x".to_string(), "64 hex digits"),
            (format!("{sha}  0755  x"), "absolute path"),
            (format!("{sha}  rwx  /x"), "four octal digits"),
            (format!("{sha}  0755  /../../etc/shadow"), "`..`"),
            (format!("{sha}  0755  /a//b"), "empty"),
            (format!("{sha}  0755  /a/"), "canonical"),
            (format!("{sha}  0755  /a\n{sha}  0644  /a"), "twice"),
            (format!("{sha} 0755 /x"), "expected `sha256  mode  /path`"),
        ] {
            let err = parse_manifest(&bad, Path::new("m"))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("m: line") && err.contains(why),
                "{bad:?}: {err}"
            );
        }
    }
}
