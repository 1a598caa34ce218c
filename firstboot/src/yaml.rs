//! The part of YAML 1.2 that metadata documents use, read into a [`json::Value`]: NoCloud's
//! `meta-data` and `network-config`, Hetzner's metadata. Block mappings and sequences by
//! indentation (a sequence may sit at its key's indentation, as YAML allows), plain, single-
//! and double-quoted scalars (quoted ones may continue on following lines), literal and
//! folded block scalars, one-line flow collections (`[a, b]`, `{k: v}`), `#` comments, `---`.
//! A document that starts with `{` or `[` is JSON, which YAML 1.2 contains.
//!
//! Refused, with the line: anchors, aliases and tags (a metadata document has no use for
//! them, and aliases are how YAML bombs grow), tabs in indentation, a key twice in one
//! mapping, nesting deeper than `MAX_DEPTH`. Scalars stay text (`42` and `true` read as
//! written); `null`, `~` and an empty value are [`Value::Null`], which readers treat as absent.
//! Messages name the line, never a value: a caller may hand this user data.

use crate::json::{self, Value};

/// How deep mappings, sequences and flow collections may nest.
const MAX_DEPTH: usize = 32;
/// How many keys one mapping may have: the duplicate check compares each new key with the
/// ones before it, and a metadata document has tens.
const MAX_KEYS: usize = 1024;

/// One line: its indentation and the text after it.
#[derive(Clone, Copy)]
struct Line<'a> {
    ind: usize,
    text: &'a str,
}

struct Parser<'a> {
    lines: Vec<Line<'a>>,
    at: usize,
    depth: usize,
}

/// Parses one document.
pub fn parse(text: &str) -> Result<Value, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if text.trim_start().starts_with(['{', '[']) {
        return json::parse(text).map_err(|e| e.to_string());
    }
    let mut lines = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let body = raw.trim_start_matches(' ');
        if body.starts_with('\t') && !body.trim().is_empty() {
            return Err(format!("line {}: a tab in the indentation", n + 1));
        }
        lines.push(Line {
            ind: raw.len() - body.len(),
            text: body.trim_end(),
        });
    }
    let mut p = Parser {
        lines,
        at: 0,
        depth: 0,
    };
    p.skip();
    let Some(first) = p.lines.get(p.at).copied() else {
        return Ok(Value::Null);
    };
    let v = p.block(first.ind)?;
    p.skip();
    match p.at < p.lines.len() {
        true => Err(p.err("indented less than the lines before it")),
        false => Ok(v),
    }
}

/// A line that carries nothing: blank, a comment, a document marker.
fn idle(text: &str) -> bool {
    text.is_empty() || text.starts_with('#') || text == "---" || text == "..."
}

/// `text` without a trailing ` # comment` (outside quotes, which a plain scalar has none of).
fn uncomment(text: &str) -> &str {
    match text.find(" #") {
        Some(i) if !text.starts_with(['"', '\'']) => text[..i].trim_end(),
        _ => text,
    }
}

/// A sequence entry: `-` alone or followed by a space.
fn entry(text: &str) -> Option<&str> {
    match text.strip_prefix('-')? {
        "" => Some(""),
        r if r.starts_with(' ') => Some(r.trim_start()),
        _ => None,
    }
}

/// `key: rest` or `key:` at the end: the key (unquoted) and the rest.
fn key_of(text: &str) -> Option<(String, &str)> {
    let (key, rest) = if let Some(q @ ('"' | '\'')) = text.chars().next() {
        let end = text[1..].find(q)? + 1;
        (text[1..end].to_string(), text[end + 1..].trim_start())
    } else {
        let at = text
            .match_indices(':')
            .map(|(i, _)| i)
            .find(|&i| matches!(text.as_bytes().get(i + 1), None | Some(b' ')))?;
        (text[..at].trim_end().to_string(), &text[at..])
    };
    let rest = rest.strip_prefix(':')?;
    (rest.is_empty() || rest.starts_with(' ')).then(|| (key, rest.trim_start()))
}

impl<'a> Parser<'a> {
    /// An error at the current line, not yet consumed.
    fn err(&self, what: &str) -> String {
        format!("invalid YAML at line {}: {what}", self.at + 1)
    }

    /// An error in a scalar, at the last line consumed.
    fn bad(&self, what: &str) -> String {
        format!("invalid YAML at line {}: {what}", self.at)
    }

    fn skip(&mut self) {
        while self.lines.get(self.at).is_some_and(|l| idle(l.text)) {
            self.at += 1;
        }
    }

    /// The collection whose first line is the current one, at indentation `ind`.
    fn block(&mut self, ind: usize) -> Result<Value, String> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.err("nested too deep"));
        }
        let seq = entry(self.lines[self.at].text).is_some();
        let v = if seq { self.seq(ind) } else { self.map(ind) };
        self.depth -= 1;
        v
    }

    /// The value of a key or entry whose line ended after `:` or `-`: a block more indented
    /// than `ind`, a sequence at `ind` (for a key), or nothing.
    fn nested(&mut self, ind: usize, key: bool) -> Result<Value, String> {
        self.skip();
        match self.lines.get(self.at).copied() {
            Some(l) if l.ind > ind => self.block(l.ind),
            Some(l) if key && l.ind == ind && entry(l.text).is_some() => self.block(ind),
            _ => Ok(Value::Null),
        }
    }

    fn seq(&mut self, ind: usize) -> Result<Value, String> {
        let mut items = Vec::new();
        loop {
            self.skip();
            let Some(l) = self.lines.get(self.at).copied() else {
                break;
            };
            let rest = match entry(l.text) {
                Some(r) if l.ind == ind => r,
                _ if l.ind > ind => return Err(self.err("indented more than its sequence")),
                _ => break,
            };
            if rest.is_empty() || idle(rest) {
                self.at += 1;
                items.push(self.nested(ind, false)?);
            } else if entry(rest).is_some() || key_of(rest).is_some() {
                // `- key: value` or `- - x`: a collection that starts on this line, at the
                // column its first character stands in.
                let col = ind + (l.text.len() - rest.len());
                self.lines[self.at] = Line {
                    ind: col,
                    text: rest,
                };
                items.push(self.block(col)?);
            } else {
                self.at += 1;
                items.push(self.scalar(rest, ind)?);
            }
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, ind: usize) -> Result<Value, String> {
        let mut members: Vec<(String, Value)> = Vec::new();
        loop {
            self.skip();
            let Some(l) = self.lines.get(self.at).copied() else {
                break;
            };
            if l.ind < ind {
                break;
            }
            if l.ind > ind {
                return Err(self.err("indented more than its mapping"));
            }
            let Some((key, rest)) = key_of(l.text) else {
                if entry(l.text).is_some() {
                    break;
                }
                return Err(self.err("expected `key: value`"));
            };
            if members.iter().any(|(k, _)| *k == key) {
                return Err(self.err("a key given twice"));
            }
            if members.len() == MAX_KEYS {
                return Err(self.err("more than 1024 keys in one mapping"));
            }
            self.at += 1;
            let rest = uncomment(rest);
            let v = if rest.is_empty() || rest.starts_with('#') {
                self.nested(ind, true)?
            } else {
                self.scalar(rest, ind)?
            };
            members.push((key, v));
        }
        Ok(Value::Object(members))
    }

    /// A value that starts on the line before `self.at` with `text`, in a collection at `ind`.
    fn scalar(&mut self, text: &str, ind: usize) -> Result<Value, String> {
        match text.as_bytes()[0] {
            b'&' | b'*' | b'!' => Err(self.bad("anchors, aliases and tags are not read")),
            b'|' | b'>' => Ok(Value::String(self.block_scalar(text, ind))),
            b'"' | b'\'' => self.quoted(text, ind).map(Value::String),
            b'[' | b'{' => {
                let mut f = Flow {
                    s: text.as_bytes(),
                    at: 0,
                    depth: self.depth,
                };
                let v = f.value().filter(|_| f.rest_blank());
                v.ok_or_else(|| self.bad("a flow collection that does not close on its line"))
            }
            _ => Ok(plain(uncomment(text))),
        }
    }

    /// `|` (lines kept) or `>` (lines joined by spaces): every following line indented more
    /// than `ind`, or blank, without the block's own indentation.
    fn block_scalar(&mut self, head: &str, ind: usize) -> String {
        let mut body: Vec<&str> = Vec::new();
        while let Some(l) = self.lines.get(self.at) {
            if !l.text.is_empty() && l.ind <= ind {
                break;
            }
            body.push(l.text);
            self.at += 1;
        }
        let sep = if head.starts_with('>') { " " } else { "\n" };
        let mut out = body.join(sep).trim_end().to_string();
        if sep == "\n" && !head.contains('-') {
            out.push('\n');
        }
        out
    }

    /// A quoted scalar, continued on following lines (folded by a space) until it closes.
    fn quoted(&mut self, text: &str, ind: usize) -> Result<String, String> {
        let q = text.as_bytes()[0];
        let mut out = String::new();
        let mut cur = &text[1..];
        loop {
            let mut chars = cur.char_indices();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\'' if q == b'\'' => {
                        if cur[i + 1..].starts_with('\'') {
                            out.push('\'');
                            chars.next();
                        } else {
                            return self.closed(&cur[i + 1..]).map(|_| out);
                        }
                    }
                    '"' if q == b'"' => return self.closed(&cur[i + 1..]).map(|_| out),
                    '\\' if q == b'"' => {
                        let e = chars.next().map(|(_, e)| e);
                        out.push(match e {
                            Some('n') => '\n',
                            Some('t') => '\t',
                            Some(e @ ('"' | '\\' | '/' | ' ')) => e,
                            _ => return Err(self.bad("an escape other than \\n \\t \\\" \\\\ \\/")),
                        });
                    }
                    c => out.push(c),
                }
            }
            match self.lines.get(self.at) {
                Some(l) if l.ind > ind || l.text.is_empty() => {
                    out.push(' ');
                    cur = l.text;
                    self.at += 1;
                }
                _ => return Err(self.bad("a quoted scalar that does not close")),
            }
        }
    }

    /// What may follow a closing quote: nothing, or a comment.
    fn closed(&self, after: &str) -> Result<(), String> {
        let a = after.trim_start();
        match a.is_empty() || a.starts_with('#') {
            true => Ok(()),
            false => Err(self.bad("text after a closing quote")),
        }
    }
}

/// A plain scalar: text, or null for `null`, `~` and nothing.
fn plain(s: &str) -> Value {
    match s {
        "" | "~" | "null" | "Null" | "NULL" => Value::Null,
        s => Value::String(s.to_string()),
    }
}

/// A one-line flow collection.
struct Flow<'a> {
    s: &'a [u8],
    at: usize,
    depth: usize,
}

impl Flow<'_> {
    fn ws(&mut self) {
        while self.s.get(self.at) == Some(&b' ') {
            self.at += 1;
        }
    }

    fn rest_blank(&mut self) -> bool {
        self.ws();
        matches!(self.s.get(self.at), None | Some(b'#'))
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        let hit = self.s.get(self.at) == Some(&b);
        self.at += usize::from(hit);
        hit
    }

    fn value(&mut self) -> Option<Value> {
        self.ws();
        let open = *self.s.get(self.at)?;
        if open != b'[' && open != b'{' {
            return self.scalar().map(|s| plain(&s));
        }
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return None;
        }
        self.at += 1;
        let close = if open == b'[' { b']' } else { b'}' };
        let mut items = Vec::new();
        let mut members = Vec::new();
        while !self.eat(close) {
            if open == b'[' {
                items.push(self.value()?);
            } else {
                let k = self.scalar()?;
                if !self.eat(b':') {
                    return None;
                }
                members.push((k, self.value()?));
            }
            if !self.eat(b',') && self.s.get(self.at) != Some(&close) {
                return None;
            }
        }
        self.depth -= 1;
        Some(match open {
            b'[' => Value::Array(items),
            _ => Value::Object(members),
        })
    }

    /// A quoted or plain scalar inside a flow collection.
    fn scalar(&mut self) -> Option<String> {
        self.ws();
        let s = self.s;
        let start = self.at;
        if let Some(&q @ (b'"' | b'\'')) = s.get(start) {
            let end = start + 1 + s[start + 1..].iter().position(|&b| b == q)?;
            self.at = end + 1;
            return String::from_utf8(s[start + 1..end].to_vec()).ok();
        }
        while let Some(&b) = s.get(self.at) {
            let colon = b == b':' && matches!(s.get(self.at + 1), None | Some(b' '));
            if matches!(b, b',' | b']' | b'}' | b'[' | b'{') || colon {
                break;
            }
            self.at += 1;
        }
        let text = std::str::from_utf8(&s[start..self.at]).ok()?.trim();
        (!text.starts_with(['&', '*', '!'])).then(|| text.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn y(s: &str) -> Value {
        parse(s).unwrap_or_else(|e| panic!("{e}\n{s}"))
    }

    fn text<'a>(v: &'a Value, path: &str) -> Option<&'a str> {
        v.pointer(path).and_then(Value::as_text)
    }

    #[test]
    fn hetzner_metadata_document() {
        // afterburn tests/fixtures/hetzner/metadata.yaml (trimmed), as Hetzner answers.
        let v = y("availability-zone: hel1-dc2\nhostname: my-server\ninstance-id: 42\nlocal-ipv4: ''\nnetwork-config:\n    config:\n        - type: physical\n          subnets:\n            - type: dhcp\n            - type: static\n              address: 0a00:0a0:a000:a000::1/64\n              ipv6: true\n    version: 1\npublic-ipv4: 1.2.3.4\nregion: eu-central\n");
        assert_eq!(text(&v, "instance-id"), Some("42"));
        assert_eq!(text(&v, "local-ipv4"), Some(""));
        assert_eq!(
            text(&v, "network-config/config/0/subnets/1/address"),
            Some("0a00:0a0:a000:a000::1/64")
        );
        assert_eq!(text(&v, "network-config/version"), Some("1"));
        assert_eq!(text(&v, "region"), Some("eu-central"));
    }

    #[test]
    fn sequences_at_the_keys_indentation_and_inline_maps() {
        let v = y("- ip: 10.0.0.2\n  network_name: foo\n  alias_ips: []\n- ip: 10.0.1.2\n");
        assert_eq!(text(&v, "0/ip"), Some("10.0.0.2"));
        assert_eq!(text(&v, "1/ip"), Some("10.0.1.2"));
        assert_eq!(v.pointer("0/alias_ips"), Some(&Value::Array(vec![])));
        let v = y("keys:\n- a\n- b # two\nafter: x\n");
        assert_eq!(text(&v, "keys/1"), Some("b"));
        assert_eq!(text(&v, "after"), Some("x"));
    }

    #[test]
    fn netplan_v2_with_flow_sequences() {
        // afterburn tests/fixtures/kubevirt/nocloud_v2/network-config.
        let v = y("version: 2\nethernets:\n  eth0:\n    match: {macaddress: '52:54:00:12:34:00'}\n    addresses: [192.168.1.10/24, \"2001:db8::10/64\"]\n    gateway4: 192.168.1.1\n");
        assert_eq!(
            text(&v, "ethernets/eth0/addresses/1"),
            Some("2001:db8::10/64")
        );
        assert_eq!(
            text(&v, "ethernets/eth0/match/macaddress"),
            Some("52:54:00:12:34:00")
        );
    }

    #[test]
    fn quoting_comments_and_block_scalars() {
        let v = y("# meta-data\n---\ninstance-id: 'it''s'\nlocal-hostname: \"node\\t1\" # c\nnet: |\n  auto eth0\n  iface eth0 inet dhcp\nfold: >-\n  a\n  b\nmulti: \"DEVICE='eth0'\n  ONBOOT=yes\"\nempty:\nnil: ~\n");
        assert_eq!(text(&v, "instance-id"), Some("it's"));
        assert_eq!(text(&v, "local-hostname"), Some("node\t1"));
        assert_eq!(text(&v, "net"), Some("auto eth0\niface eth0 inet dhcp\n"));
        assert_eq!(text(&v, "fold"), Some("a b"));
        assert_eq!(text(&v, "multi"), Some("DEVICE='eth0' ONBOOT=yes"));
        assert_eq!(v.get("empty"), Some(&Value::Null));
        assert_eq!(v.get("nil"), Some(&Value::Null));
        assert_eq!(
            y("{\"instance-id\": \"x\"}").get("instance-id"),
            Some(&Value::String("x".into()))
        );
        assert_eq!(y(""), Value::Null);
    }

    #[test]
    fn refusals_name_the_line_and_not_the_value() {
        for (doc, line, what) in [
            ("a: 1\nb: &anchor secret\n", 2, "anchors"),
            ("a: 1\nb: *alias\n", 2, "anchors"),
            ("a: !!binary c2VjcmV0\n", 1, "tags"),
            ("a: 1\na: 2\n", 2, "twice"),
            ("a:\n\tb: secret\n", 2, "tab"),
            ("a: 1\n  b: 2\n", 2, "indented more"),
            ("a: [secret, b\n", 1, "flow"),
            ("a: \"secret\n", 1, "does not close"),
            ("a: \"se\\qcret\"\n", 1, "escape"),
            ("just text\n", 1, "key: value"),
        ] {
            let e = parse(doc).unwrap_err();
            assert!(
                e.contains(&format!("line {line}")) && e.contains(what),
                "{doc:?}: {e}"
            );
            assert!(!e.contains("secret") && !e.contains("c2Vj"), "{e}");
        }
        let deep = "a:\n".to_string()
            + &(1..200)
                .map(|i| format!("{}k:\n", " ".repeat(i)))
                .collect::<String>();
        assert!(parse(&deep).unwrap_err().contains("nested too deep"));
        let flow = format!("a: {}{}\n", "[".repeat(100), "]".repeat(100));
        assert!(parse(&flow).is_err());
        let wide: String = (0..2000).map(|i| format!("k{i}: v\n")).collect();
        assert!(parse(&wide)
            .unwrap_err()
            .contains("line 1025: more than 1024 keys"));
    }
}
