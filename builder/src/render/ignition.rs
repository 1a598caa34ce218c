//! Ignition: a spec 3.4.0 config whose `storage.files` carry the contract files as `data:` URLs
//! (nothing is fetched over the network); and the reader `--check` uses.

use base64::Engine as _;
use serde_json::{json, Value};

use crate::render::model::{
    clean_path, data_url, kiln_dir_touched, url_for_message, NodeFile, RenderError, LINUX_DIR,
};
use crate::render::sysext::Sysext;

/// The Ignition config spec versions kiln writes. What kiln uses (files as data: URLs with
/// mode, owner and gzip compression, one directory) means the same in both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Spec {
    /// Spec 3.4.0, read by Ignition 2.15 and later (the default).
    #[default]
    V3_4,
    /// Spec 3.3.0, for Ignition 2.11 to 2.14 (e.g. Debian 12's `ignition` package).
    V3_3,
}

impl Spec {
    /// The `ignition.version` string.
    pub fn version(self) -> &'static str {
        match self {
            Spec::V3_4 => "3.4.0",
            Spec::V3_3 => "3.3.0",
        }
    }
}

/// Renders the Ignition config. With `gzip`, each file's contents are compressed when that
/// makes them smaller (`contents.compression: "gzip"`). With `sysext`, the config also places
/// that baked extension (fetched and sha512-verified) and its updates ([`Sysext`]).
pub fn render(files: &[NodeFile], gzip: bool, spec: Spec, sysext: Option<&Sysext>) -> Vec<u8> {
    let root = json!({"id": 0});
    let entries: Vec<Value> = files
        .iter()
        .map(|f| {
            let packed = gzip.then(|| crate::render::model::gzip(&f.contents));
            let mut contents = serde_json::Map::new();
            match packed {
                Some(z) if z.len() < f.contents.len() => {
                    contents.insert("compression".into(), json!("gzip"));
                    contents.insert("source".into(), json!(data_url(&z)));
                }
                _ => {
                    contents.insert("source".into(), json!(data_url(&f.contents)));
                }
            }
            json!({
                "path": f.linux_path(),
                "mode": f.mode,
                "overwrite": true,
                "user": root,
                "group": root,
                "contents": contents,
            })
        })
        .collect();
    let mut entries = entries;
    let mut directories =
        vec![json!({"path": LINUX_DIR, "mode": 0o755, "user": root, "group": root})];
    // Registry host directories (`containerd/certs.d/<host>/`) and their parents, each once.
    let mut nested: Vec<String> = Vec::new();
    for f in files {
        let mut at = 0;
        while let Some(i) = f.name[at..].find('/') {
            let d = format!("{LINUX_DIR}/{}", &f.name[..at + i]);
            if !nested.contains(&d) {
                nested.push(d);
            }
            at += i + 1;
        }
    }
    directories.extend(
        nested
            .iter()
            .map(|d| json!({"path": d, "mode": 0o755, "user": root, "group": root})),
    );
    let mut config = json!({"ignition": {"version": spec.version()}});
    if let Some(x) = sysext {
        entries.extend(x.files(&root));
        directories.push(json!({
            "path": format!("/opt/extensions/{}", x.name),
            "mode": 0o755,
            "user": root,
            "group": root,
        }));
        config["storage"]["links"] = json!([x.link()]);
        config["systemd"] = json!({"units": x.units()});
    }
    config["storage"]["directories"] = Value::Array(directories);
    config["storage"]["files"] = Value::Array(entries);
    // serde_json's maps are sorted, so the output is the same for the same files.
    let mut out = serde_json::to_vec(&config).expect("JSON values always serialise");
    out.push(b'\n');
    out
}

/// Decodes an RFC 2397 `data:` URL (base64 or percent-encoded).
pub fn decode_data_url(url: &str) -> Result<Vec<u8>, String> {
    let rest = url.strip_prefix("data:").ok_or_else(|| {
        format!(
            "source {:?} is not a data: URL (kiln configs fetch nothing)",
            truncate(url)
        )
    })?;
    let (meta, data) = rest
        .split_once(',')
        .ok_or_else(|| "data: URL has no `,`".to_string())?;
    if meta.ends_with(";base64") {
        base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| format!("data: URL is not valid base64: {e}"))
    } else {
        percent_decode(data)
    }
}

fn percent_decode(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape at byte {i} of the data: URL"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

fn truncate(s: &str) -> String {
    s.chars().take(60).collect()
}

/// Reads an Ignition v3 config back into the `/etc/kiln/` files it writes.
pub fn parse(text: &str, source: &str) -> Result<(Vec<NodeFile>, Vec<String>), RenderError> {
    let err = |m: String| RenderError::check(source, m);
    let doc: Value = serde_json::from_str(text)
        .map_err(|e| err(format!("Ignition config is not valid JSON: {e}")))?;
    let version = doc
        .pointer("/ignition/version")
        .and_then(Value::as_str)
        .ok_or_else(|| err("Ignition config has no ignition.version".into()))?;
    if !version.starts_with("3.") {
        return Err(err(format!(
            "ignition.version is {version:?}; kiln reads spec 3.x configs"
        )));
    }
    let mut notes = Vec::new();
    if let Some(obj) = doc.as_object() {
        for key in obj
            .keys()
            .filter(|k| !matches!(k.as_str(), "ignition" | "storage"))
        {
            notes.push(format!("also configures `{key}`"));
        }
    }
    if doc.pointer("/ignition/config").is_some() {
        notes.push("merges or replaces another config (ignition.config)".into());
    }
    contract_dirs_and_links(&doc, source)?;
    let entries = doc
        .pointer("/storage/files")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut files = Vec::new();
    for (i, f) in entries.iter().enumerate() {
        let raw_path = f
            .get("path")
            .and_then(Value::as_str)
            .ok_or_else(|| err(format!("storage.files[{i}] has no path")))?;
        // Ignition joins the path onto its root and cleans it (Go's filepath.Join), so
        // `/etc//kiln/x` and `/etc/x/../kiln/x` write under /etc/kiln/ too: judge the
        // cleaned path.
        let cleaned = clean_path(raw_path);
        let path = cleaned.as_str();
        let at = format!("storage.files[{i}] ({raw_path})");
        let mode = match f.get("mode") {
            None | Some(Value::Null) => 0o644,
            Some(m) => m
                .as_u64()
                .and_then(|m| u32::try_from(m).ok())
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| err(format!("{at}: mode {m} is not a decimal file mode")))?,
        };
        let contents_obj = f.get("contents");
        let source_url = contents_obj
            .and_then(|c| c.get("source"))
            .and_then(Value::as_str);
        let mut contents = match source_url {
            None => Vec::new(),
            Some(url) if !url.starts_with("data:") => {
                // A remote source is accepted only as kiln emits one (`--sysext`): http(s),
                // checked against a sha512 (or sha256) Ignition verifies before writing, and
                // outside /etc/kiln/, whose contract files are always inline.
                let hash = contents_obj
                    .and_then(|c| c.pointer("/verification/hash"))
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let verified = (url.starts_with("https://") || url.starts_with("http://"))
                    && (hash.strip_prefix("sha512-").is_some_and(|h| is_hex(h, 128))
                        || hash.strip_prefix("sha256-").is_some_and(|h| is_hex(h, 64)));
                if !verified {
                    return Err(err(format!(
                        "{at}: fetches {:?} without an https/http URL and a sha512 or sha256 \
                         verification.hash (found {:?}): kiln refuses unverified remote sources",
                        url_for_message(url),
                        truncate(hash)
                    )));
                }
                if path.starts_with(&format!("{LINUX_DIR}/")) {
                    return Err(err(format!(
                        "{at}: the node contract files are inline (data: URLs), found a fetch of {:?}",
                        url_for_message(url)
                    )));
                }
                notes.push(format!(
                    "fetches {path} from {} (verified: {})",
                    url_for_message(url),
                    hash.split('-').next().unwrap_or("")
                ));
                continue;
            }
            Some(url) => decode_data_url(url).map_err(|m| err(format!("{at}: {m}")))?,
        };
        match contents_obj
            .and_then(|c| c.get("compression"))
            .and_then(Value::as_str)
        {
            None | Some("") => {}
            Some("gzip") => {
                contents =
                    crate::render::model::gunzip(&contents, &at).map_err(|e| err(e.to_string()))?
            }
            Some(other) => return Err(err(format!("{at}: unknown compression {other:?}"))),
        }
        let appends = f
            .get("append")
            .and_then(Value::as_array)
            .is_some_and(|a| !a.is_empty());
        let Some(name) = path.strip_prefix(&format!("{LINUX_DIR}/")) else {
            if appends {
                notes.push(format!("{path}: appends to the file"));
            }
            notes.push(format!("also writes {path} (outside {LINUX_DIR}/)"));
            continue;
        };
        if appends {
            return Err(RenderError::breaks(
                source,
                format!("{at}: expected the whole file (contents), found `append`: a contract file is written once, not added to"),
            ));
        }
        owned_by_root(f, &at, source)?;
        files.push(NodeFile {
            name: name.to_string(),
            mode,
            contents,
        });
    }
    Ok((files, notes))
}

/// Whether an Ignition `user` or `group` node means root: absent, `{}`, `{"id": 0}` or
/// `{"name": "root"}` (Ignition's default is root).
fn is_root(v: Option<&Value>) -> bool {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return true;
    };
    let Some(o) = v.as_object() else {
        return false;
    };
    let id_ok = o
        .get("id")
        .is_none_or(|i| i.is_null() || i.as_u64() == Some(0));
    let name_ok = o
        .get("name")
        .is_none_or(|n| n.is_null() || n.as_str() == Some("root"));
    id_ok && name_ok
}

/// A file or directory of the contract must be root's (user and group).
fn owned_by_root(entry: &Value, at: &str, source: &str) -> Result<(), RenderError> {
    for key in ["user", "group"] {
        if !is_root(entry.get(key)) {
            return Err(RenderError::breaks(
                source,
                format!(
                    "{at}: expected {key} root (id 0), found {key} {}",
                    entry.get(key).map(Value::to_string).unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

/// `storage.directories` for kiln's directories must be 0755 and root's; `storage.links` must
/// not put a link in place of, or into, any of kiln's directories (a link `/etc/kiln -> /tmp`
/// hands the node's credentials to whoever writes /tmp).
fn contract_dirs_and_links(doc: &Value, source: &str) -> Result<(), RenderError> {
    let list = |p: &str| {
        doc.pointer(p)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    for (i, d) in list("/storage/directories").iter().enumerate() {
        let raw = d.get("path").and_then(Value::as_str).unwrap_or("");
        let path = clean_path(raw);
        let Some(dir) = kiln_dir_touched(&path).filter(|k| path.starts_with(k)) else {
            continue;
        };
        let at = format!("storage.directories[{i}] ({raw})");
        match d.get("mode") {
            None | Some(Value::Null) => {}
            Some(m) if m.as_u64() == Some(0o755) => {}
            Some(m) => {
                let found = m
                    .as_u64()
                    .map(|m| format!("{m:04o}"))
                    .unwrap_or(m.to_string());
                return Err(RenderError::breaks(
                    source,
                    format!("{at}: expected mode 0755 for {dir} and the directories in it, found mode {found}"),
                ));
            }
        }
        owned_by_root(d, &at, source)?;
    }
    for (i, l) in list("/storage/links").iter().enumerate() {
        let raw = l.get("path").and_then(Value::as_str).unwrap_or("");
        let path = clean_path(raw);
        if let Some(dir) = kiln_dir_touched(&path) {
            let target = l.get("target").and_then(Value::as_str).unwrap_or("");
            return Err(RenderError::breaks(
                source,
                format!(
                    "storage.links[{i}] ({raw}): expected no link in place of or inside {dir}                      (kiln's own directory), found a link to {:?}",
                    truncate(target)
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls_table() {
        assert_eq!(
            decode_data_url("data:,hello%20kiln%0A").unwrap(),
            b"hello kiln\n"
        );
        assert_eq!(decode_data_url("data:;base64,aGk=").unwrap(), b"hi");
        assert_eq!(
            decode_data_url("data:text/plain;base64,aGk=").unwrap(),
            b"hi"
        );
        assert!(decode_data_url("https://example.invalid/x")
            .unwrap_err()
            .contains("not a data: URL"));
        assert!(decode_data_url("data:,%zz")
            .unwrap_err()
            .contains("percent escape"));
    }

    #[test]
    fn messages_show_no_url_credentials() {
        assert_eq!(
            url_for_message("https://user:s3cret@mirror.example/k.raw?X-Amz-Signature=abc"),
            "https://***@mirror.example/k.raw"
        );
        assert_eq!(
            url_for_message("tftp://10.0.0.1/k.raw"),
            "tftp://10.0.0.1/k.raw"
        );
        let text = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/opt/k.raw","contents":{"source":"https://u:s3cret@m.example/k.raw?sig=s3cret"}}]}}"#;
        let e = parse(text, "t.ign").unwrap_err().to_string();
        assert!(
            !e.contains("s3cret") && e.contains("m.example/k.raw"),
            "{e}"
        );
    }

    #[test]
    fn paths_are_judged_as_ignition_writes_them() {
        assert_eq!(clean_path("/etc//kiln/./node.env"), "/etc/kiln/node.env");
        assert_eq!(clean_path("/etc/x/../kiln/node.env"), "/etc/kiln/node.env");
        assert_eq!(clean_path("/../../etc/kiln"), "/etc/kiln");
        // A contract file written through a crafted path is still read as one.
        let text = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc//kiln/x/../node.env","contents":{"source":"data:,A%3D1%0A"}}]}}"#;
        let (files, notes) = parse(text, "t.ign").unwrap();
        assert_eq!(files.len(), 1, "{notes:?}");
        assert_eq!(files[0].name, "node.env");
        // And a remote fetch into it is refused, however the path is spelled.
        let text = r#"{"ignition":{"version":"3.4.0"},"storage":{"files":[{"path":"/etc/./kiln/node.env","contents":{"source":"https://x.example/a","verification":{"hash":"sha256-0000000000000000000000000000000000000000000000000000000000000000"}}}]}}"#;
        let e = parse(text, "t.ign").unwrap_err().to_string();
        assert!(e.contains("inline"), "{e}");
    }

    #[test]
    fn gzip_only_when_smaller() {
        let small = NodeFile {
            name: "bootstrap-token".into(),
            mode: 0o600,
            contents: b"abcdef.0123456789abcdef\n".to_vec(),
        };
        let big = NodeFile {
            name: "node.env".into(),
            mode: 0o644,
            contents: "KEY=value\n".repeat(50).into_bytes(),
        };
        let out = String::from_utf8(render(
            &[small.clone(), big.clone()],
            true,
            Spec::V3_4,
            None,
        ))
        .unwrap();
        assert_eq!(out.matches("\"compression\":\"gzip\"").count(), 1, "{out}");
        let (files, notes) = parse(&out, "x").unwrap();
        assert_eq!(files, vec![small, big]);
        assert!(notes.is_empty());
    }
}
