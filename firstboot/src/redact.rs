//! The one redaction pass: every string that leaves the process (status.json, the failure
//! files, the console, the cloud channels, stdout and stderr) is a [`Redacted`], and a
//! `Redacted` can only be made by a [`Redactor`]. A redactor knows the shape of a kubeadm
//! bootstrap token and the literal values of the credentials this run read.
//!
//! The sinks take `&Redacted`; the crate denies `print!`/`eprint!` (`lib.rs`), so the
//! [`print()`] and [`eprint()`] here are the only way to the process's own streams.

use std::fmt;

/// What a secret is replaced with.
pub const MARK: &str = "<redacted>";

/// Credential values shorter than this are not matched by value: a two-letter password
/// would turn every occurrence of those letters in a status line into [`MARK`]. The
/// credentials firstboot handles are much longer (a bootstrap token's secret is 16
/// characters, a service account token hundreds).
pub const MIN_SECRET: usize = 6;

/// Removes secrets from text. Built once per run: shapes only at first, then with the
/// literal values of the credentials the run read ([`Redactor::add`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    /// Longest first, so a secret that contains another is replaced whole.
    literals: Vec<String>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the values themselves.
        write!(f, "Redactor({} literals)", self.literals.len())
    }
}

/// Text that went through a [`Redactor`]: the only thing the output sinks accept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redacted(String);

impl Redacted {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Redactor {
    /// A redactor that knows only the bootstrap token shape: for output made before any
    /// credential was read, and by commands that read none.
    pub fn shapes_only() -> Redactor {
        Redactor::default()
    }

    /// Adds a credential's literal value (and its JSON-escaped form, which is what a
    /// status document holds). Values shorter than [`MIN_SECRET`] bytes are ignored.
    /// A bootstrap token's secret half is added on its own too: a tool may print it alone.
    pub fn add(&mut self, secret: &str) {
        let secret = secret.trim();
        if secret.len() < MIN_SECRET {
            return;
        }
        let mut forms = vec![secret.to_string()];
        let mut escaped = String::with_capacity(secret.len() + 8);
        crate::json::write_str(&mut escaped, secret);
        let escaped = &escaped[1..escaped.len() - 1];
        if escaped != secret {
            forms.push(escaped.to_string());
        }
        if valid_token(secret) {
            forms.push(secret[7..].to_string());
        }
        // Longest first, so a secret is replaced whole before a shorter one inside it; in
        // the order they came among those of one length.
        for f in forms {
            if !self.literals.contains(&f) {
                let at = self.literals.partition_point(|l| l.len() >= f.len());
                self.literals.insert(at, f);
            }
        }
    }

    /// Adds every secret in `secrets`.
    pub fn add_all<S: AsRef<str>>(&mut self, secrets: &[S]) {
        for s in secrets {
            self.add(s.as_ref());
        }
    }

    /// How many literal forms this redactor matches.
    pub fn literal_count(&self) -> usize {
        self.literals.len()
    }

    /// `text` with every known literal and every bootstrap-token-shaped word replaced by
    /// [`MARK`].
    pub fn redact(&self, text: &str) -> Redacted {
        let mut out = None::<String>;
        for lit in &self.literals {
            let cur = out.as_deref().unwrap_or(text);
            if cur.contains(lit.as_str()) {
                out = Some(cur.replace(lit.as_str(), MARK));
            }
        }
        let cur = out.as_deref().unwrap_or(text);
        Redacted(match redact_token_shapes(cur) {
            Some(s) => s,
            None => out.unwrap_or_else(|| text.to_string()),
        })
    }
}

/// True when `b[i..]` starts a bootstrap token, `[a-z0-9]{6}\.[a-z0-9]{16}`, that is not
/// part of a longer word of the same letters.
fn token_at(b: &[u8], i: usize) -> bool {
    let tok = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    i + 23 <= b.len()
        && b[i..i + 6].iter().all(|&c| tok(c))
        && b[i + 6] == b'.'
        && b[i + 7..i + 23].iter().all(|&c| tok(c))
        && (i == 0 || !tok(b[i - 1]))
        && b.get(i + 23).is_none_or(|&c| !tok(c))
}

/// Replaces bootstrap tokens by shape; `None` when there is none.
fn redact_token_shapes(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let first = (0..b.len()).find(|&i| token_at(b, i))?;
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..first]);
    let mut i = first;
    while i < b.len() {
        if token_at(b, i) {
            out.push_str(MARK);
            i += 23;
        } else {
            // Tokens are ASCII, so a match never starts inside a multi-byte character.
            let ch = text[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    Some(out)
}

/// Credential values as read, kept apart so no `Debug` or `Display` can print them.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secrets(Vec<String>);

impl Secrets {
    /// Adds one value.
    pub fn push(&mut self, value: impl Into<String>) {
        self.0.push(value.into());
    }

    /// Adds every value.
    pub fn extend(&mut self, values: impl IntoIterator<Item = String>) {
        self.0.extend(values);
    }

    /// The values, for a [`Redactor`].
    pub fn values(&self) -> &[String] {
        &self.0
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} values)", self.0.len())
    }
}

/// Secrets met while a phase runs on several threads (a metadata session token), handed to
/// the run's [`Redactor`] when the phase ends, whether it succeeded or not.
#[derive(Default)]
pub struct Collected(std::sync::Mutex<Secrets>);

impl Collected {
    /// Records a secret value.
    pub fn note(&self, value: &str) {
        if let Ok(mut s) = self.0.lock() {
            s.push(value);
        }
    }

    /// Everything recorded so far.
    pub fn take(&self) -> Secrets {
        self.0
            .lock()
            .map(|mut s| std::mem::take(&mut *s))
            .unwrap_or_default()
    }
}

impl fmt::Debug for Collected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Collected(..)")
    }
}

/// The keys whose values are secrets in a kubeconfig or a kubeadm `JoinConfiguration`
/// (YAML or JSON): bearer and bootstrap tokens, client keys, passwords, auth-provider
/// secrets, kubeadm's certificate key.
pub const SECRET_KEYS: &[&str] = &[
    "token",
    "tlsBootstrapToken",
    "client-key-data",
    "password",
    "id-token",
    "refresh-token",
    "access-token",
    "client-secret",
    "certificateKey",
];

/// The secret values in a kubeconfig or `JoinConfiguration`: the values of
/// [`SECRET_KEYS`] (a `key: value` line, YAML block scalars and JSON's `"key": "value",`
/// included), and every line of a PEM private key block. A line scanner, not a YAML
/// parser: it errs towards reporting too much, which only costs redacting more.
pub fn secrets_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = text.lines().peekable();
    let mut in_key_block = false;
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.starts_with("-----BEGIN") && t.contains("PRIVATE KEY") {
            in_key_block = true;
            continue;
        }
        if in_key_block {
            if t.starts_with("-----END") {
                in_key_block = false;
            } else if !t.is_empty() {
                out.push(t.to_string());
            }
            continue;
        }
        for value in key_values(line) {
            if value.starts_with('|') || value.starts_with('>') {
                // A block scalar: the following lines indented deeper than the key.
                let indent = line.len() - line.trim_start().len();
                while let Some(next) = lines.peek() {
                    let n = next.len() - next.trim_start().len();
                    if !next.trim().is_empty() && n <= indent {
                        break;
                    }
                    if !next.trim().is_empty() {
                        out.push(next.trim().to_string());
                    }
                    lines.next();
                }
            } else if !value.is_empty() {
                out.push(value.to_string());
            }
        }
    }
    out
}

/// The values of [`SECRET_KEYS`] on one line, in order: `key: v`, `"key": "v",` and flow
/// maps (`{key: v, other: w}`); quoted values end at their quote, plain ones at `,`, `}` or
/// the end of the line.
fn key_values(line: &str) -> Vec<&str> {
    let b = line.as_bytes();
    let mut found = Vec::new();
    // Where each key may match next: one key's matches do not overlap.
    let mut next = [0; SECRET_KEYS.len()];
    for pos in 0..b.len() {
        for (key, next) in SECRET_KEYS.iter().zip(&mut next) {
            if pos < *next || !b[pos..].starts_with(key.as_bytes()) {
                continue;
            }
            *next = pos + key.len();
            let before_ok =
                pos == 0 || matches!(b[pos - 1], b' ' | b'\t' | b'{' | b',' | b'"' | b'\'' | b'-');
            let mut j = pos + key.len();
            if matches!(b.get(j), Some(b'"' | b'\'')) {
                j += 1;
            }
            if !before_ok || b.get(j) != Some(&b':') {
                continue;
            }
            let rest = line[j + 1..].trim_start();
            let value = match rest.as_bytes().first() {
                Some(&q @ (b'"' | b'\'')) => {
                    let body = &rest[1..];
                    body.find(q as char).map_or(body, |e| &body[..e])
                }
                _ => rest.find([',', '}']).map_or(rest, |e| &rest[..e]).trim(),
            };
            found.push(value);
        }
    }
    found
}

/// The one way to the process's stdout: writes `text` as it is (no newline added). Fails
/// as `print!` does, without its formatting machinery.
pub fn print(text: &Redacted) {
    use std::io::Write;
    std::io::stdout()
        .write_all(text.as_str().as_bytes())
        .unwrap_or_else(|e| panic!("failed printing to stdout: {e}"));
}

/// The one way to the process's stderr: writes `text` and a newline. Fails as `eprintln!`
/// does.
pub fn eprint(text: &Redacted) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    err.write_all(text.as_str().as_bytes())
        .and_then(|()| err.write_all(b"\n"))
        .unwrap_or_else(|e| panic!("failed printing to stderr: {e}"));
}

/// True for a kubeadm bootstrap token, `[a-z0-9]{6}.[a-z0-9]{16}`.
pub fn valid_token(t: &str) -> bool {
    let ok = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    t.split_once('.')
        .is_some_and(|(id, secret)| ok(id, 6) && ok(secret, 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_tokens_are_redacted_by_shape() {
        let r = Redactor::shapes_only();
        let l = "token abcdef.0123456789abcdef was rejected; é 07401b.f395accd246ae52d.";
        assert_eq!(
            r.redact(l).as_str(),
            "token <redacted> was rejected; é <redacted>."
        );
        // Not a token: too long on either side, or upper case.
        for keep in [
            "xabcdef.0123456789abcdef",
            "abcdef.0123456789abcdefx",
            "ABCDEF.0123456789ABCDEF",
            "sha256:3f0c1b.2a3f0c1b2a3f0c1b2a",
        ] {
            assert_eq!(r.redact(keep).as_str(), keep);
        }
    }

    #[test]
    fn literals_and_their_escaped_and_partial_forms() {
        let mut r = Redactor::shapes_only();
        r.add("eyJhbGciOiJSUzI1NiJ9.payload.sig");
        r.add("pa\"ss\\word");
        r.add("abcdef.0123456789abcdef");
        r.add("short");
        let text =
            "Bearer eyJhbGciOiJSUzI1NiJ9.payload.sig; pw pa\"ss\\word; json \"pa\\\"ss\\\\word\"; \
                    secret 0123456789abcdef; short";
        let out = r.redact(text);
        for leak in [
            "eyJhbGciOiJSUzI1NiJ9",
            "pa\"ss",
            "pa\\\"ss",
            "0123456789abcdef",
        ] {
            assert!(!out.as_str().contains(leak), "{leak} in {out}");
        }
        // Too short to tell apart from ordinary words: kept.
        assert!(out.as_str().ends_with("short"), "{out}");
        assert!(!format!("{r:?}").contains("payload"));
    }

    #[test]
    fn kubeconfig_and_join_configuration_secrets() {
        let kubeconfig = "apiVersion: v1\nusers:\n- name: kubelet-bootstrap\n  user:\n    token: \"s3cr3t-bearer-value\"\n    client-key-data: LS0tLS1CRUdJTiBFQw==\n    client-certificate-data: LS0tcert\n- name: other\n  user: {password: 'hunter22', username: admin}\n";
        assert_eq!(
            secrets_in(kubeconfig),
            ["s3cr3t-bearer-value", "LS0tLS1CRUdJTiBFQw==", "hunter22"]
        );
        let join = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: 10.0.0.10:6443\n    token: abcdef.0123456789abcdef\n    caCertHashes: [sha256:00]\n  tlsBootstrapToken: ghijkl.0123456789ghijkl\ncontrolPlane:\n  certificateKey: |\n    0011223344556677\n    8899aabbccddeeff\nnodeRegistration: {}\n";
        assert_eq!(
            secrets_in(join),
            [
                "abcdef.0123456789abcdef",
                "ghijkl.0123456789ghijkl",
                "0011223344556677",
                "8899aabbccddeeff"
            ]
        );
        let json = "{\"users\":[{\"user\":{\n  \"token\": \"json-token-value\",\n  \"client-key-data\": \"a2V5\"}}]}";
        assert_eq!(secrets_in(json), ["json-token-value", "a2V5"]);
        let pem = "-----BEGIN CERTIFICATE-----\nMIIcert\n-----END CERTIFICATE-----\n-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIkeyline1\nkeyline2\n-----END EC PRIVATE KEY-----\n";
        assert_eq!(secrets_in(pem), ["MHcCAQEEIkeyline1", "keyline2"]);
    }
}
