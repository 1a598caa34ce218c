//! Env files (`KEY=VALUE` lines) as the contract's "Conventions" define them: a pure parser
//! for reading and a quoting writer for `kubelet.env`, so both ends agree on one grammar.

use std::fmt;

/// The largest env file the contract allows.
pub const MAX_LEN: usize = 64 * 1024;

/// A parsed env file: keys in file order, each once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvFile {
    entries: Vec<(String, String)>,
}

impl EnvFile {
    /// The value of `key`, if the file sets it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of `key`, or `None` when it is absent or empty.
    pub fn non_empty(&self, key: &str) -> Option<&str> {
        self.get(key).filter(|v| !v.is_empty())
    }

    /// Every `(key, value)` pair in file order.
    pub fn entries(&self) -> &[(String, String)] {
        &self.entries
    }
}

/// Why a line did not parse; `line` is 1-based (0 for whole-file problems).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            f.write_str(&self.message)
        } else {
            write!(f, "line {}: {}", self.line, self.message)
        }
    }
}

fn err(line: usize, message: String) -> ParseError {
    ParseError { line, message }
}

/// True for keys of the form `[A-Z][A-Z0-9_]*`.
pub fn valid_key(key: &str) -> bool {
    let b = key.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_uppercase()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == b'_')
}

/// Bytes an unquoted value may not hold: they would mean something else to a shell or systemd.
fn unsafe_unquoted(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | '$' | '`')
}

/// Parses an env file's text.
pub fn parse(text: &str) -> Result<EnvFile, ParseError> {
    if text.len() > MAX_LEN {
        return Err(err(
            0,
            format!("is {} bytes, over the {MAX_LEN}-byte limit", text.len()),
        ));
    }
    let mut out = EnvFile::default();
    for (i, raw) in text.split('\n').enumerate() {
        let n = i + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let Some(eq) = line.find('=') else {
            return Err(err(n, "expected KEY=VALUE, found no '='".to_string()));
        };
        let key = &line[..eq];
        if key.ends_with(|c: char| c.is_whitespace()) || line[eq + 1..].starts_with([' ', '\t']) {
            return Err(err(n, "whitespace around '=' is not allowed".to_string()));
        }
        if key.starts_with("export ") {
            return Err(err(n, "the 'export' prefix is not allowed".to_string()));
        }
        if !valid_key(key) {
            return Err(err(
                n,
                format!("key {key:?} does not match [A-Z][A-Z0-9_]*"),
            ));
        }
        let value = parse_value(&line[eq + 1..]).map_err(|m| err(n, format!("{key}: {m}")))?;
        if out.get(key).is_some() {
            return Err(err(n, format!("{key} is set twice")));
        }
        out.entries.push((key.to_string(), value));
    }
    Ok(out)
}

/// Parses the part after `=`: unquoted, `"double"` with escapes, or `'single'` literal.
/// A `#` comment may follow a quoted value after whitespace.
fn parse_value(v: &str) -> Result<String, String> {
    let mut chars = v.char_indices();
    let rest = match chars.next() {
        None => return Ok(String::new()),
        Some((_, '"')) => {
            let mut out = String::new();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    '\\' => match chars.next() {
                        Some((_, '"')) => out.push('"'),
                        Some((_, '\\')) => out.push('\\'),
                        Some((_, 'n')) => out.push('\n'),
                        Some((_, '$')) => out.push('$'),
                        Some((_, '`')) => out.push('`'),
                        Some((_, e)) => return Err(format!("unknown escape '\\{e}'")),
                        None => return Err("ends inside an escape".to_string()),
                    },
                    '$' | '`' => return Err(format!("'{c}' must be escaped inside double quotes")),
                    c => out.push(c),
                }
            }
            let Some(end) = end else {
                return Err("missing closing '\"'".to_string());
            };
            (out, &v[end..])
        }
        Some((_, '\'')) => {
            let Some(close) = v[1..].find('\'') else {
                return Err("missing closing \"'\"".to_string());
            };
            (v[1..1 + close].to_string(), &v[close + 2..])
        }
        Some(_) => {
            if let Some(c) = v.chars().find(|c| unsafe_unquoted(*c)) {
                return Err(format!(
                    "unquoted value holds {c:?}; quote it (contract: Conventions)"
                ));
            }
            return Ok(v.to_string());
        }
    };
    let (value, tail) = rest;
    let t = tail.trim_start();
    let comment = t.starts_with('#') && t.len() < tail.len();
    if !t.is_empty() && !comment {
        return Err(format!("unexpected text after the closing quote: {t:?}"));
    }
    Ok(value)
}

/// Appends `KEY=value` and a newline, quoting the value only when it needs quotes, so the
/// line means the same to systemd's `EnvironmentFile=`, a shell and [`parse`].
pub fn write_line(out: &mut String, key: &str, value: &str) {
    out.push_str(key);
    out.push('=');
    if value.chars().any(unsafe_unquoted) {
        out.push('"');
        for c in value.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '$' => out.push_str("\\$"),
                '\n' => out.push_str("\\n"),
                '`' => out.push_str("\\`"),
                c => out.push(c),
            }
        }
        out.push('"');
    } else {
        out.push_str(value);
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(text: &str) -> Result<String, ParseError> {
        parse(text).map(|e| e.get("K").unwrap_or("<absent>").to_string())
    }

    #[test]
    fn accepts_the_contract_forms() {
        let cases: &[(&str, &str)] = &[
            ("K=v\n", "v"),
            ("K=\n", ""),
            ("K=a=b,c=d\n", "a=b,c=d"),
            ("K=\"with spaces\"\n", "with spaces"),
            ("K=\"q\\\"b\\\\s\\nn\\$d\"\n", "q\"b\\s\nn$d"),
            ("K='lit $x \\n'\n", "lit $x \\n"),
            ("# c\n\n   # c2\nK=v", "v"),
            ("K=v\r\n", "v"),
            ("K=\"v\"  # trailing comment\n", "v"),
            ("K=https://10.0.0.10:6443\n", "https://10.0.0.10:6443"),
        ];
        for (text, want) in cases {
            assert_eq!(one(text).as_deref(), Ok(*want), "{text:?}");
        }
    }

    #[test]
    fn rejects_what_the_contract_forbids() {
        let cases: &[(&str, usize, &str)] = &[
            ("K = v\n", 1, "whitespace around"),
            ("K= v\n", 1, "whitespace around"),
            ("export K=v\n", 1, "export"),
            ("k=v\n", 1, "does not match"),
            ("1K=v\n", 1, "does not match"),
            ("\nK\n", 2, "no '='"),
            ("K=a b\n", 1, "unquoted value"),
            ("K=$HOME\n", 1, "unquoted value"),
            ("K=\"open\n", 1, "missing closing"),
            ("K='open\n", 1, "missing closing"),
            ("K=\"a\\tb\"\n", 1, "unknown escape"),
            ("K=\"$x\"\n", 1, "must be escaped"),
            ("K=\"a\"b\n", 1, "after the closing quote"),
            ("K=1\nK=2\n", 2, "set twice"),
        ];
        for (text, line, needle) in cases {
            let e = parse(text).expect_err(text);
            assert_eq!(e.line, *line, "{text:?}: {e}");
            assert!(e.message.contains(needle), "{text:?}: {e}");
        }
    }

    #[test]
    fn rejects_oversized_files() {
        let big = "A=b\n".repeat(MAX_LEN / 4 + 1);
        assert!(parse(&big).unwrap_err().message.contains("limit"));
    }

    #[test]
    fn keeps_order_and_unknown_keys() {
        let e = parse("B=2\nA=1\nFUTURE_KEY=x\n").unwrap();
        let keys: Vec<&str> = e.entries().iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["B", "A", "FUTURE_KEY"]);
    }

    #[test]
    fn written_lines_parse_back_to_the_same_value() {
        for v in [
            "",
            "plain",
            "a b",
            "\"q\"",
            "back\\slash",
            "$dollar",
            "multi\nline",
            "--v=2 --x=\"y\"",
            "back`tick",
        ] {
            let mut s = String::new();
            write_line(&mut s, "K", v);
            assert_eq!(one(&s).as_deref(), Ok(v), "{s:?}");
        }
    }
}
