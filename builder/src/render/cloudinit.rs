//! cloud-init: `#cloud-config` user data whose only module is `write_files`, so it places the
//! contract files and runs nothing; and the reader `--check` uses to list what it writes.

use base64::Engine as _;
use serde::Deserialize;

use crate::render::model::{clean_path, NodeFile, RenderError, LINUX_DIR};

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
    y.push_str(MERGE_HOW);
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

/// How kiln's own part merges with other cloud-config parts of a multipart user data:
/// append to `write_files` and never replace another part's keys. Without it, cloud-init's
/// default merge (`dict(replace)+list()+str()`) would let a later part's `write_files`
/// replace kiln's, or kiln's replace theirs.
const MERGE_HOW: &str = "merge_how:\n  - name: list\n    settings: [append]\n  - name: dict\n    settings: [no_replace, recurse_list]\n";

/// One cloud-config document: its `write_files` entries, its other keys and its mergers.
struct Part {
    write_files: Option<Vec<WriteFile>>,
    other_keys: Vec<String>,
    mergers: Vec<(String, Vec<String>)>,
}

fn load_part(
    text: &str,
    header_mergers: &str,
    err: &dyn Fn(String) -> RenderError,
) -> Result<Part, RenderError> {
    let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(text)
        .map_err(|e| err(format!("#cloud-config is not valid YAML: {e}")))?;
    let map = doc
        .as_mapping()
        .ok_or_else(|| err("#cloud-config must be a YAML mapping".into()))?;
    let other_keys = map
        .keys()
        .map(|k| k.as_str().unwrap_or("?").to_string())
        .filter(|k| !matches!(k.as_str(), "write_files" | "merge_how" | "merge_type"))
        .collect();
    let write_files = match map.get("write_files") {
        None => None,
        Some(v) => Some(serde_yaml_ng::from_value(v.clone()).map_err(|e| {
            err(format!(
                "write_files: expected a list of {{path, content, …}}: {e}"
            ))
        })?),
    };
    let mut mergers = match map.get("merge_how").or_else(|| map.get("merge_type")) {
        None => Vec::new(),
        Some(serde_yaml_ng::Value::String(s)) => mergers_from_str(s),
        Some(serde_yaml_ng::Value::Sequence(items)) => items
            .iter()
            .map(|m| {
                let name = m
                    .get("name")
                    .and_then(|n| n.as_str())
                    .unwrap_or("")
                    .to_string();
                let settings = m
                    .get("settings")
                    .and_then(|s| s.as_sequence())
                    .map(|s| {
                        s.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                (name, settings)
            })
            .collect(),
        Some(other) => {
            return Err(err(format!(
                "merge_how: expected a string or a list, found {other:?}"
            )))
        }
    };
    mergers.extend(mergers_from_str(header_mergers));
    Ok(Part {
        write_files,
        other_keys,
        mergers,
    })
}

/// `list(append)+dict(no_replace,recurse_list)+str()` → `[(list, [append]), …]`.
fn mergers_from_str(s: &str) -> Vec<(String, Vec<String>)> {
    s.split('+')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| match m.split_once('(') {
            Some((name, rest)) => (
                name.trim().to_string(),
                rest.trim_end_matches(')')
                    .split(',')
                    .map(|x| x.trim().to_string())
                    .filter(|x| !x.is_empty())
                    .collect(),
            ),
            None => (m.to_string(), Vec::new()),
        })
        .collect()
}

/// What cloud-init's mergers do with two `write_files` lists (cloudinit/mergers/m_dict.py and
/// m_list.py): `None` when the outcome is an index-by-index merge kiln does not predict.
fn merge_write_files(
    old: Option<Vec<WriteFile>>,
    new: Option<Vec<WriteFile>>,
    mergers: &[(String, Vec<String>)],
) -> Option<Option<Vec<WriteFile>>> {
    let (old, new) = match (old, new) {
        (old, None) => return Some(old),
        (None, new) => {
            // A new key is added by any dict merger (and by the default).
            let has_dict = mergers.is_empty() || mergers.iter().any(|(n, _)| n == "dict");
            return Some(if has_dict { new } else { None });
        }
        (Some(old), Some(new)) => (old, new),
    };
    if mergers.is_empty() {
        // DEF_MERGERS: dict(replace)+list()+str().
        return Some(Some(new));
    }
    let Some((_, dict)) = mergers.iter().find(|(n, _)| n == "dict") else {
        // No dict merger: cloud-init leaves the accumulated config as it was.
        return Some(Some(old));
    };
    let has = |opts: &[String], o: &str| opts.iter().any(|x| x == o);
    if has(dict, "replace") {
        return Some(Some(new));
    }
    if !(has(dict, "recurse_list") || has(dict, "recurse_array")) {
        return Some(Some(old));
    }
    let list = mergers
        .iter()
        .find(|(n, _)| n == "list")
        .map(|(_, o)| o.as_slice())
        .unwrap_or(&[]);
    if has(list, "append") {
        Some(Some(old.into_iter().chain(new).collect()))
    } else if has(list, "prepend") {
        Some(Some(new.into_iter().chain(old).collect()))
    } else {
        None
    }
}

/// Reads `#cloud-config` user data back into the `/etc/kiln/` files it writes, plus notes on
/// anything else it would do.
pub fn parse(text: &str, source: &str) -> Result<(Vec<NodeFile>, Vec<String>), RenderError> {
    let err = |m: String| RenderError::check(source, m);
    let part = load_part(text, "", &err)?;
    let mut notes: Vec<String> = part
        .other_keys
        .iter()
        .map(|k| format!("also sets cloud-init module `{k}`"))
        .collect();
    let files = kiln_files(part.write_files.unwrap_or_default(), &mut notes, source)?;
    Ok((files, notes))
}

/// Reads MIME multipart user data (`cloud-init devel make-mime`, Terraform's
/// `cloudinit_config`): merges its cloud-config parts the way cloud-init does, then lists the
/// `/etc/kiln/` files the merged `write_files` writes.
pub fn parse_multipart(
    text: &str,
    source: &str,
) -> Result<(Vec<NodeFile>, Vec<String>), RenderError> {
    let err = |m: String| RenderError::check(source, m);
    let mut notes = Vec::new();
    let mut merged: Option<Vec<WriteFile>> = None;
    for (i, part) in mime_parts(text).map_err(&err)?.into_iter().enumerate() {
        let label = part
            .filename
            .clone()
            .unwrap_or_else(|| format!("part {}", i + 1));
        if part.content_type != "text/cloud-config" {
            notes.push(format!("also has a {} part ({label})", part.content_type));
            continue;
        }
        let perr = |m: String| RenderError::check(source, format!("{label}: {m}"));
        let doc = load_part(&part.body, &part.merge_type, &perr)?;
        notes.extend(
            doc.other_keys
                .iter()
                .map(|k| format!("{label}: also sets cloud-init module `{k}`")),
        );
        merged = merge_write_files(merged, doc.write_files, &doc.mergers).ok_or_else(|| {
            perr(
                "merges write_files index by index (list merger without append or prepend); \
                  kiln cannot tell which files cloud-init would write"
                    .into(),
            )
        })?;
    }
    let files = kiln_files(merged.unwrap_or_default(), &mut notes, source)?;
    Ok((files, notes))
}

/// One part of a MIME multipart message.
struct MimePart {
    content_type: String,
    filename: Option<String>,
    merge_type: String,
    body: String,
}

/// Splits a `multipart/mixed` message into its parts, decoding base64 bodies.
fn mime_parts(text: &str) -> Result<Vec<MimePart>, String> {
    let text = text.replace("\r\n", "\n");
    let (head, body) = text
        .split_once("\n\n")
        .ok_or("MIME user data has no blank line after its headers")?;
    let headers = mime_headers(head);
    let ctype = headers.get("content-type").cloned().unwrap_or_default();
    if !ctype.to_ascii_lowercase().starts_with("multipart/") {
        return Err(format!(
            "expected a multipart Content-Type, found {ctype:?}"
        ));
    }
    let boundary = mime_param(&ctype, "boundary")
        .filter(|b| !b.is_empty())
        .ok_or("multipart Content-Type has no boundary")?;
    let mut parts = Vec::new();
    for chunk in mime_chunks(body, &boundary) {
        let chunk = chunk.as_str();
        let (head, body) = chunk.split_once("\n\n").unwrap_or((chunk, ""));
        let h = mime_headers(head);
        let content_type = h
            .get("content-type")
            .map(|c| {
                c.split(';')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .to_ascii_lowercase()
            })
            .unwrap_or_else(|| "text/plain".into());
        let filename = h
            .get("content-disposition")
            .and_then(|d| mime_param(d, "filename"));
        let body = body.strip_suffix('\n').unwrap_or(body);
        let bytes = match h
            .get("content-transfer-encoding")
            .map(|e| e.to_ascii_lowercase())
        {
            Some(e) if e == "base64" => {
                let clean: String = body.chars().filter(|c| !c.is_whitespace()).collect();
                base64::engine::general_purpose::STANDARD
                    .decode(clean)
                    .map_err(|e| format!("a base64 part is not valid base64: {e}"))?
            }
            _ => body.as_bytes().to_vec(),
        };
        let merge_type = h
            .get("merge-type")
            .or_else(|| h.get("x-merge-type"))
            .cloned()
            .unwrap_or_default();
        parts.push(MimePart {
            content_type,
            filename,
            merge_type,
            body: String::from_utf8(bytes).map_err(|_| "a part is not UTF-8 text".to_string())?,
        });
    }
    Ok(parts)
}

/// The bodies between the delimiter lines of a multipart body. A delimiter is a whole line,
/// `--BOUNDARY` with optional trailing blanks, and `--BOUNDARY--` closes (RFC 2046 §5.1.1;
/// Python's email parser, which cloud-init uses, matches them the same way), so text that
/// merely contains `--BOUNDARY` (a PEM `-----END` line with boundary `E`) stays content. The
/// line break before a delimiter belongs to the delimiter.
fn mime_chunks(body: &str, boundary: &str) -> Vec<String> {
    let delimiter = format!("--{boundary}");
    let mut out: Vec<String> = Vec::new();
    let mut current: Option<String> = None;
    for raw in body.split_inclusive('\n') {
        let line = raw.strip_suffix('\n').unwrap_or(raw);
        if let Some(rest) = line.strip_prefix(&delimiter) {
            let closing = rest.starts_with("--");
            let tail = if closing { &rest[2..] } else { rest };
            if tail.chars().all(|c| c == ' ' || c == '\t') {
                out.extend(current.take());
                if closing {
                    return out;
                }
                current = Some(String::new());
                continue;
            }
        }
        // Lines before the first delimiter are the preamble.
        if let Some(c) = current.as_mut() {
            c.push_str(raw);
        }
    }
    out.extend(current);
    out
}

/// The value of parameter `name` of a header value (`type; name=value`). Parameter names
/// are case-insensitive (RFC 2045 section 5.1), as in Python's email parser, which
/// cloud-init uses: `Boundary=` and `BOUNDARY=` name the boundary too.
fn mime_param(value: &str, name: &str) -> Option<String> {
    value.split(';').skip(1).find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().trim_matches('"').to_string())
    })
}

fn mime_headers(head: &str) -> std::collections::HashMap<String, String> {
    let mut out = std::collections::HashMap::new();
    let mut last: Option<String> = None;
    for line in head.lines() {
        if line.starts_with([' ', '\t']) {
            // A folded header continues the previous one.
            if let Some(v) = last.as_ref().and_then(|k| out.get_mut(k)) {
                let v: &mut String = v;
                v.push(' ');
                v.push_str(line.trim());
            }
            continue;
        }
        if let Some((k, v)) = line.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            out.insert(k.clone(), v.trim().to_string());
            last = Some(k);
        }
    }
    out
}

/// Turns `write_files` entries into the kiln files among them; notes the rest.
fn kiln_files(
    entries: Vec<WriteFile>,
    notes: &mut Vec<String>,
    source: &str,
) -> Result<Vec<NodeFile>, RenderError> {
    let err = |m: String| RenderError::check(source, m);
    let breaks = |m: String| RenderError::breaks(source, m);
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
        // The kernel resolves `/etc//kiln/x` and `/etc/./kiln/x` into /etc/kiln too.
        let path = clean_path(&w.path);
        let Some(name) = path.strip_prefix(&format!("{LINUX_DIR}/")) else {
            if w.append == Some(true) {
                notes.push(format!("{}: append: true adds to an existing file", w.path));
            }
            notes.push(format!("also writes {} (outside {LINUX_DIR}/)", w.path));
            continue;
        };
        let owner = w.owner.as_deref().unwrap_or("root:root");
        if !is_root_owner(owner) {
            return Err(breaks(format!(
                "{at}: expected owner root:root, found owner {owner:?}"
            )));
        }
        if w.append == Some(true) {
            return Err(breaks(format!(
                "{at}: expected the whole file, found append: true (a contract file is \
                 written once; appending adds a second value to it)"
            )));
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
    Ok(files)
}

/// cloud-init's `owner` (`user[:group]`, names or ids) is root's for both parts.
fn is_root_owner(owner: &str) -> bool {
    let (user, group) = owner.split_once(':').unwrap_or((owner, "root"));
    [user, group]
        .iter()
        .all(|p| matches!(p.trim(), "root" | "0"))
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
    let gunzip = |data: Vec<u8>| crate::render::model::gunzip(&data, at).map_err(|e| e.to_string());
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

    #[test]
    fn mergers_and_mime_edges() {
        assert_eq!(
            mergers_from_str("list(append)+dict(no_replace, recurse_list)+str()"),
            vec![
                ("list".to_string(), vec!["append".to_string()]),
                (
                    "dict".to_string(),
                    vec!["no_replace".to_string(), "recurse_list".to_string()]
                ),
                ("str".to_string(), vec![]),
            ]
        );
        // CRLF line ends, a folded Content-Type header, a plain (not base64) part.
        let mime =
            "Content-Type: multipart/mixed;\r\n boundary=\"XX\"\r\nMIME-Version: 1.0\r\n\r\n\
                    --XX\r\nContent-Type: text/cloud-config\r\n\r\n#cloud-config\r\n\
                    write_files:\r\n- path: /etc/kiln/ca.crt\r\n  content: pem\r\n--XX--\r\n";
        let (files, _) = parse_multipart(mime, "m").unwrap();
        assert_eq!(files[0].name, "ca.crt");
        assert_eq!(files[0].contents, b"pem");
        let e = parse_multipart("Content-Type: multipart/mixed\n\n--a\n", "m").unwrap_err();
        assert!(e.to_string().contains("no boundary"), "{e}");
        // A list merger without append/prepend merges index by index: refused, not guessed.
        let idx =
            "Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/cloud-config\n\n\
                   write_files: [{path: /etc/a}]\n--b\nContent-Type: text/cloud-config\n\n\
                   merge_how: 'dict(recurse_list)+list()'\nwrite_files: [{path: /etc/b}]\n--b--\n";
        let e = parse_multipart(idx, "m").unwrap_err().to_string();
        assert!(
            e.contains("part 2: merges write_files index by index"),
            "{e}"
        );
    }
}
