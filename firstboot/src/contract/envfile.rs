//! The env-file codec (`KEY=VALUE` lines, `docs/contract.md#conventions`): one pure parser
//! and one quoting writer, used by kiln-firstboot to read `image.env` and `node.env` and write
//! `kubelet.env`, and by the builder to write `image.env` and `node.env`. A line written here
//! means the same thing to systemd's `EnvironmentFile=`, a POSIX shell and [`parse`].

use std::borrow::Cow;
use std::fmt;

/// The largest env file the contract allows.
pub const MAX_LEN: usize = 64 * 1024;

/// An env file: keys in file order, each once, and (when it is being written) the `#`
/// comment lines that head it. [`parse`] makes one from text; [`EnvFile::set`] builds one and
/// its [`Display`](fmt::Display) writes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnvFile {
    header: Vec<String>,
    entries: Vec<(String, String)>,
}

impl EnvFile {
    /// Adds a `# comment` line at the top (written, never parsed back).
    pub fn comment(&mut self, text: &str) -> &mut Self {
        self.header.push(text.to_string());
        self
    }

    /// Sets `key` to `value`: appended in order, or replaced in place when already set, so a
    /// key is never written twice.
    pub fn set(&mut self, key: &str, value: impl Into<String>) -> &mut Self {
        let value = value.into();
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.entries.push((key.to_string(), value)),
        }
        self
    }

    /// Sets `key` when there is a value.
    pub fn set_opt(&mut self, key: &str, value: Option<impl Into<String>>) -> &mut Self {
        if let Some(v) = value {
            self.set(key, v);
        }
        self
    }

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

impl fmt::Display for EnvFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        for line in &self.header {
            out.push_str("# ");
            out.push_str(line);
            out.push('\n');
        }
        for (k, v) in &self.entries {
            write_line(&mut out, k, v);
        }
        f.write_str(&out)
    }
}

/// Bytes an unquoted value may not hold: they would mean something else to a shell or systemd.
fn unsafe_unquoted(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | '$' | '`')
}

/// True when a value must be double-quoted to be written: it holds a byte that is unsafe
/// unquoted, a `#` (which a reader could take for a comment), or a shell operator (`<`, `>`,
/// `|`, `&`, `;`, `(`, `)`: `EVICTION_HARD=memory.available<100Mi` would be a redirection to
/// a shell that sources the file), or it is empty (so that a lone value still shows that it is
/// one).
fn needs_quotes(value: &str) -> bool {
    value.is_empty()
        || value.chars().any(|c| {
            unsafe_unquoted(c) || matches!(c, '#' | '<' | '>' | '|' | '&' | ';' | '(' | ')')
        })
}

/// Whether a value can be written so that every reader sees the same thing: no line break
/// (systemd would read the `\n` escape as a newline, a shell as two characters) and no
/// backtick (a shell would run what is between two of them, even inside double quotes).
/// The builder checks what an operator gave it with this before it writes.
pub fn is_writable(value: &str) -> bool {
    !value.contains(['\n', '\r', '`'])
}

/// Appends `value` double-quoted, with `\"`, `\\`, `\$`, `\n` and `` \` `` escaped.
fn push_quoted(out: &mut String, value: &str) {
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
}

/// One value as it is written after `=`: bare when that is safe, else double-quoted with
/// escapes. The empty value is `""` here; [`write_line`] writes it as `KEY=`.
pub fn quote(value: &str) -> Cow<'_, str> {
    if !needs_quotes(value) {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() + 2);
    push_quoted(&mut out, value);
    Cow::Owned(out)
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
    // The line of each entry, for the message about a key given twice.
    let mut lines: Vec<usize> = Vec::new();
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
        if let Some(first) = out.entries.iter().position(|(k, _)| k == key) {
            return Err(err(
                n,
                format!(
                    "{key} is set twice, on lines {} and {n}: a key given twice is an error",
                    lines[first]
                ),
            ));
        }
        lines.push(n);
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
                return Err("unterminated double quote: missing closing '\"'".to_string());
            };
            (out, &v[end..])
        }
        Some((_, '\'')) => {
            let Some(close) = v[1..].find('\'') else {
                return Err("unterminated single quote: missing closing \"'\"".to_string());
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

/// Appends `KEY=value` and a newline, the value as [`quote`] writes it, except that an empty
/// value is written `KEY=` (the contract's form for `kubelet.env`).
pub fn write_line(out: &mut String, key: &str, value: &str) {
    out.push_str(key);
    out.push('=');
    if !value.is_empty() {
        out.push_str(&quote(value));
    }
    out.push('\n');
}

/// Appends `KEY="value"` and a newline, double-quoted even when it need not be (the contract
/// shows `KUBELET_ARGS` that way).
pub fn write_quoted_line(out: &mut String, key: &str, value: &str) {
    out.push_str(key);
    out.push('=');
    push_quoted(out, value);
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

    // The builder's writer tests, from `builder/src/render/env.rs`, now against this codec.
    #[test]
    fn quoting_table() {
        let cases = [
            ("plain", "plain"),
            ("a=b,c=d", "a=b,c=d"),
            ("https://10.0.0.1:6443", "https://10.0.0.1:6443"),
            ("", "\"\""),
            ("--v=2 --foo=bar", "\"--v=2 --foo=bar\""),
            ("a\"b", "\"a\\\"b\""),
            ("x$y", "\"x\\$y\""),
            ("back\\slash", "\"back\\\\slash\""),
            ("a#b", "\"a#b\""),
            ("memory.available<100Mi", "\"memory.available<100Mi\""),
            ("a;b", "\"a;b\""),
        ];
        for (input, want) in cases {
            assert_eq!(quote(input), want, "quote({input:?})");
            let line = format!("K={want}\n");
            assert_eq!(
                parse(&line).unwrap().entries(),
                [("K".to_string(), input.to_string())],
                "{line}"
            );
        }
    }

    #[test]
    fn parse_rejects_what_the_builder_rejects() {
        let cases = [
            ("K = v\n", "whitespace around"),
            ("k=v\n", "does not match"),
            ("K=a b\n", "unquoted value"),
            ("K=\"open\n", "unterminated"),
            ("K=1\nK=2\n", "given twice"),
            ("JUSTTEXT\n", "expected KEY=VALUE"),
            ("K=x # comment\n", "unquoted value"),
            ("K=\"x\" y\n", "after the closing quote"),
        ];
        for (input, want) in cases {
            let err = parse(input).unwrap_err().to_string();
            assert!(err.contains(want), "{input:?}: {err}");
        }
        assert_eq!(
            parse("# c\n\nA='lit $x'\nB=x\n").unwrap().entries(),
            [
                ("A".to_string(), "lit $x".to_string()),
                ("B".to_string(), "x".to_string())
            ]
        );
    }

    #[test]
    fn writable_values() {
        assert!(is_writable("--v=2 --x=y"));
        assert!(!is_writable("a\nb"));
        assert!(!is_writable("a\rb"));
        assert!(!is_writable("`id`"));
    }

    #[test]
    fn a_built_file_writes_its_header_and_keys_once_and_parses_back() {
        let mut f = EnvFile::default();
        f.comment("written by a test")
            .set("A", "1")
            .set("B", "two words")
            .set_opt("C", None::<String>)
            .set_opt("D", Some(""))
            .set("A", "3");
        let text = f.to_string();
        assert_eq!(text, "# written by a test\nA=3\nB=\"two words\"\nD=\n");
        let back = parse(&text).unwrap();
        assert_eq!(back.entries(), f.entries());
    }

    #[test]
    fn a_line_can_be_quoted_on_purpose() {
        let mut s = String::new();
        write_quoted_line(&mut s, "K", "--a=1 --b=\"$x\" `c`\nd");
        assert_eq!(s, "K=\"--a=1 --b=\\\"\\$x\\\" \\`c\\`\\nd\"\n");
        assert_eq!(one(&s).as_deref(), Ok("--a=1 --b=\"$x\" `c`\nd"));
    }

    #[test]
    fn the_second_of_two_keys_names_both_lines() {
        let e = parse("A=1\n# c\nK=1\nK=2\n").unwrap_err();
        assert_eq!(e.line, 4);
        assert!(e.message.contains("lines 3 and 4"), "{e}");
    }
}
