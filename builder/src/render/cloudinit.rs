//! cloud-init: `#cloud-config` user data whose only module is `write_files`, so it places the
//! contract files and runs nothing; and the reader `--check` uses to list what it writes.

use base64::Engine as _;
use serde::Deserialize;

use super::{NodeFile, RenderError, LINUX_DIR};

/// Whether `contents` can be written as a YAML literal block and read back byte for byte.
fn literal_safe(contents: &[u8]) -> bool {
    // Printable ASCII lines, exactly one final newline (`|` keeps exactly one), and no leading
    // space on the first line (it would set the block's indentation).
    contents.ends_with(b"\n")
        && !contents.ends_with(b"\n\n")
        && !contents.starts_with(b" ")
        && contents.iter().all(|b| matches!(b, b'\n' | 0x20..=0x7e))
}

/// Renders `#cloud-config` user data with one `write_files` entry per file.
pub fn render(files: &[NodeFile]) -> Vec<u8> {
    let mut y = String::new();
    y.push_str("#cloud-config\n");
    y.push_str("# kiln node contract v1: places /etc/kiln/ and runs nothing; the image's\n");
    y.push_str("# kiln-firstboot.service does the bootstrap. Written by `kiln render`.\n");
    y.push_str("write_files:\n");
    for f in files {
        y.push_str(&format!("  - path: {}\n", f.linux_path()));
        y.push_str("    owner: root:root\n");
        y.push_str(&format!("    permissions: '{:04o}'\n", f.mode));
        if literal_safe(&f.contents) {
            y.push_str("    content: |\n");
            for line in String::from_utf8_lossy(&f.contents).lines() {
                if line.is_empty() {
                    y.push('\n');
                } else {
                    y.push_str("      ");
                    y.push_str(line);
                    y.push('\n');
                }
            }
        } else {
            y.push_str("    encoding: b64\n");
            y.push_str(&format!(
                "    content: {}\n",
                base64::engine::general_purpose::STANDARD.encode(&f.contents)
            ));
        }
    }
    y.into_bytes()
}

#[derive(Debug, Deserialize)]
struct WriteFile {
    path: String,
    #[serde(default)]
    content: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    encoding: Option<String>,
    #[serde(default)]
    permissions: Option<serde_yaml_ng::Value>,
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    append: Option<bool>,
    #[serde(default)]
    defer: Option<bool>,
}

/// Reads `#cloud-config` user data back into the `/etc/kiln/` files it writes, plus notes on
/// anything else it would do.
pub fn parse(text: &str, source: &str) -> Result<(Vec<NodeFile>, Vec<String>), RenderError> {
    let err = |m: String| RenderError::check(source, m);
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)
        .map_err(|e| err(format!("#cloud-config is not valid YAML: {e}")))?;
    let map = doc
        .as_mapping()
        .ok_or_else(|| err("#cloud-config must be a YAML mapping".into()))?;
    let mut notes = Vec::new();
    for key in map.keys() {
        let name = key.as_str().unwrap_or("?");
        if name != "write_files" {
            notes.push(format!("also sets cloud-init module `{name}`"));
        }
    }
    let entries: Vec<WriteFile> = match map.get("write_files") {
        None => Vec::new(),
        Some(v) => serde_yaml_ng::from_value(v.clone()).map_err(|e| {
            err(format!(
                "write_files: expected a list of {{path, content, …}}: {e}"
            ))
        })?,
    };
    let mut files = Vec::new();
    for (i, w) in entries.into_iter().enumerate() {
        let at = format!("write_files[{i}] ({})", w.path);
        let contents = decode(&w, &at).map_err(err)?;
        let mode = match &w.permissions {
            None => 0o644,
            Some(serde_yaml_ng::Value::String(s)) => {
                let digits = s.strip_prefix("0o").unwrap_or(s);
                u32::from_str_radix(digits, 8)
                    .map_err(|_| err(format!("{at}: permissions {s:?} is not an octal mode")))?
            }
            // cloud-init takes an integer as the mode itself (YAML 1.1 reads 0600 as 384).
            Some(serde_yaml_ng::Value::Number(n)) => n
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n <= 0o7777)
                .ok_or_else(|| err(format!("{at}: permissions {n} is not a file mode")))?,
            Some(other) => {
                return Err(err(format!(
                    "{at}: permissions must be an octal string such as '0600', found {other:?}"
                )))
            }
        };
        let Some(name) = w.path.strip_prefix(&format!("{LINUX_DIR}/")) else {
            notes.push(format!("also writes {} (outside {LINUX_DIR}/)", w.path));
            continue;
        };
        let owner = w.owner.as_deref().unwrap_or("root:root");
        if owner != "root:root" && owner != "root" {
            notes.push(format!(
                "{}: owner {owner}, the contract wants root",
                w.path
            ));
        }
        if w.append == Some(true) {
            notes.push(format!("{}: append: true adds to an existing file", w.path));
        }
        if w.defer == Some(true) {
            notes.push(format!(
                "{}: defer: true writes it after kiln-firstboot may have started",
                w.path
            ));
        }
        files.push(NodeFile {
            name: name.to_string(),
            mode,
            contents,
        });
    }
    Ok((files, notes))
}

fn decode(w: &WriteFile, at: &str) -> Result<Vec<u8>, String> {
    let content = match &w.content {
        None | Some(serde_yaml_ng::Value::Null) => String::new(),
        Some(serde_yaml_ng::Value::String(s)) => s.clone(),
        Some(other) => return Err(format!("{at}: content must be a string, found {other:?}")),
    };
    let b64 = |s: &str| {
        let clean: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(clean)
            .map_err(|e| format!("{at}: content is not valid base64: {e}"))
    };
    let gunzip = |data: Vec<u8>| super::gunzip(&data, at).map_err(|e| e.to_string());
    match w.encoding.as_deref().unwrap_or("text/plain") {
        "text/plain" => Ok(content.into_bytes()),
        "b64" | "base64" => b64(&content),
        "gz+b64" | "gz+base64" | "gzip+b64" | "gzip+base64" => gunzip(b64(&content)?),
        "gz" | "gzip" => Err(format!(
            "{at}: encoding {} holds raw gzip bytes, which YAML text cannot carry; use gz+b64",
            w.encoding.as_deref().unwrap_or("")
        )),
        other => Err(format!(
            "{at}: unknown encoding {other:?} (cloud-init knows b64, base64, gz+b64, text/plain)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_or_base64_table() {
        for (contents, literal) in [
            (&b"A=1\nB=2\n"[..], true),
            (b"A=1\n\nB=2\n", true),
            (b"no final newline", false),
            (b"two finals\n\n", false),
            (b" leading space\n", false),
            (b"tab\there\n", false),
            (b"crlf\r\n", false),
            ("caf\u{e9}\n".as_bytes(), false),
            (b"", false),
        ] {
            assert_eq!(literal_safe(contents), literal, "{contents:?}");
            let file = NodeFile {
                name: "x".into(),
                mode: 0o600,
                contents: contents.to_vec(),
            };
            let text = String::from_utf8(render(std::slice::from_ref(&file))).unwrap();
            let (back, notes) = parse(&text, "t").unwrap();
            assert_eq!(back, vec![file], "{text}");
            assert!(notes.is_empty(), "{notes:?}");
        }
    }

    #[test]
    fn parse_reads_other_writers_and_names_problems() {
        let ud = "#cloud-config\nruncmd: [ls]\nwrite_files:\n- path: /etc/kiln/bootstrap-token\n  \
                  permissions: '0600'\n  encoding: gz+b64\n  content: H4sIAAAAAAACA0tMTEpKAgCZL85eBQAAAA==\n\
                  - path: /etc/motd\n  content: hi\n";
        let (files, notes) = parse(ud, "u").unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].contents, b"aabbb");
        assert_eq!(files[0].mode, 0o600);
        assert!(notes.iter().any(|n| n.contains("`runcmd`")), "{notes:?}");
        assert!(notes.iter().any(|n| n.contains("/etc/motd")), "{notes:?}");

        for (perm, mode) in [("0600", 0o600), ("'0640'", 0o640), ("384", 0o600)] {
            let ud = format!(
                "#cloud-config\nwrite_files:\n- path: /etc/kiln/a\n  permissions: {perm}\n"
            );
            assert_eq!(parse(&ud, "u").unwrap().0[0].mode, mode, "{perm}");
        }
        let bad = "#cloud-config\nwrite_files:\n- path: /etc/kiln/a\n  permissions: [1]\n";
        let e = parse(bad, "u").unwrap_err().to_string();
        assert!(e.contains("octal string"), "{e}");
        let bad = "#cloud-config\nwrite_files:\n- path: /etc/kiln/a\n  encoding: rot13\n";
        let e = parse(bad, "u").unwrap_err().to_string();
        assert!(e.contains("unknown encoding \"rot13\""), "{e}");
    }
}
