//! The contract's `KEY=VALUE` env files: a writer that quotes only when needed, and a reader
//! that follows the same rules as kiln-firstboot (`docs/contract.md`, "Conventions").

use std::fmt;

/// Why a value cannot be written into an env file, or a line could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// The key does not match `[A-Z][A-Z0-9_]*`.
    #[error("line {line}: key {key:?} does not match [A-Z][A-Z0-9_]*")]
    BadKey {
        /// 1-based line number.
        line: usize,
        /// The key found.
        key: String,
    },
    /// A line without `=`, with whitespace around it, or with a bad quote.
    #[error("line {line}: {message}")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// What was wrong.
        message: String,
    },
    /// The same key twice.
    #[error("line {line}: key {key} given twice")]
    Duplicate {
        /// 1-based line number of the second occurrence.
        line: usize,
        /// The key.
        key: String,
    },
}

/// Characters an unquoted value may not contain (contract: whitespace, quotes, `\`, `$`, backtick).
fn needs_quotes(value: &str) -> bool {
    value.is_empty()
        || value
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | '$' | '`' | '#'))
}

/// Whether `value` can be written at all: no line breaks (a value ends at the end of the line)
/// and no backtick (a POSIX shell would run it, even inside double quotes).
pub fn is_writable(value: &str) -> bool {
    !value.contains(['\n', '\r', '`'])
}

/// Formats one value the way the contract wants it: bare when it is safe, else double-quoted
/// with `\"`, `\\` and `\$` escaped. Callers validate with [`is_writable`] first.
pub fn quote(value: &str) -> String {
    if !needs_quotes(value) {
        return value.to_string();
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if matches!(c, '"' | '\\' | '$') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

/// An env file being built, key by key, in the order given.
#[derive(Debug, Default, Clone)]
pub struct EnvFile {
    header: Vec<String>,
    pairs: Vec<(String, String)>,
}

impl EnvFile {
    /// Adds a `# comment` line at the top.
    pub fn comment(&mut self, text: &str) -> &mut Self {
        self.header.push(text.to_string());
        self
    }

    /// Adds `KEY=value`.
    pub fn set(&mut self, key: &str, value: impl Into<String>) -> &mut Self {
        self.pairs.push((key.to_string(), value.into()));
        self
    }

    /// Adds `KEY=value` when there is a value.
    pub fn set_opt(&mut self, key: &str, value: Option<impl Into<String>>) -> &mut Self {
        if let Some(v) = value {
            self.set(key, v);
        }
        self
    }
}

impl fmt::Display for EnvFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for line in &self.header {
            writeln!(f, "# {line}")?;
        }
        for (k, v) in &self.pairs {
            writeln!(f, "{k}={}", quote(v))?;
        }
        Ok(())
    }
}

/// Reads an env file into its `(key, value)` pairs, in file order.
pub fn parse(text: &str) -> Result<Vec<(String, String)>, EnvError> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if raw.trim().is_empty() || raw.trim_start().starts_with('#') {
            continue;
        }
        let Some((key, rest)) = raw.split_once('=') else {
            return Err(EnvError::Syntax {
                line,
                message: format!("expected KEY=VALUE, found {raw:?}"),
            });
        };
        if key.ends_with(char::is_whitespace) || rest.starts_with(char::is_whitespace) {
            return Err(EnvError::Syntax {
                line,
                message: "whitespace around `=`".into(),
            });
        }
        let valid_key = key.starts_with(|c: char| c.is_ascii_uppercase())
            && key
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !valid_key {
            return Err(EnvError::BadKey {
                line,
                key: key.to_string(),
            });
        }
        let value = parse_value(rest).map_err(|message| EnvError::Syntax { line, message })?;
        if pairs.iter().any(|(k, _)| k == key) {
            return Err(EnvError::Duplicate {
                line,
                key: key.to_string(),
            });
        }
        pairs.push((key.to_string(), value));
    }
    Ok(pairs)
}

fn parse_value(rest: &str) -> Result<String, String> {
    if let Some(body) = rest.strip_prefix('\'') {
        let end = body.find('\'').ok_or("unterminated single quote")?;
        trailing_ok(&body[end + 1..])?;
        return Ok(body[..end].to_string());
    }
    if let Some(body) = rest.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, e @ ('"' | '\\' | '$'))) => out.push(e),
                    other => return Err(format!("unknown escape {:?}", other.map(|(_, c)| c))),
                },
                '"' => {
                    trailing_ok(&body[i + 1..])?;
                    return Ok(out);
                }
                c => out.push(c),
            }
        }
        return Err("unterminated double quote".into());
    }
    let value = rest;
    if value
        .chars()
        .any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | '$' | '`'))
    {
        return Err(format!(
            "unquoted value {value:?} contains whitespace, a quote, `\\`, `$` or a backtick"
        ));
    }
    Ok(value.to_string())
}

fn trailing_ok(after: &str) -> Result<(), String> {
    if after.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "unexpected text after the closing quote: {after:?}"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        ];
        for (input, want) in cases {
            assert_eq!(quote(input), want, "quote({input:?})");
            let line = format!("K={want}\n");
            assert_eq!(
                parse(&line).unwrap(),
                vec![("K".into(), input.into())],
                "{line}"
            );
        }
    }

    #[test]
    fn parse_rejects_what_the_contract_rejects() {
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
            parse("# c\n\nA='lit $x'\nB=x\n").unwrap(),
            vec![("A".into(), "lit $x".into()), ("B".into(), "x".into())]
        );
    }

    #[test]
    fn writable_values() {
        assert!(is_writable("--v=2 --x=y"));
        assert!(!is_writable("a\nb"));
        assert!(!is_writable("`id`"));
    }
}
