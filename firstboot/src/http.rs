//! A std-only HTTP/1.1 client for metadata services: one request per connection, timeouts on
//! connect/read/write, caps on header and body size, chunked and content-length bodies,
//! same-host redirects only, and retries of transient failures under one global deadline.
//!
//! The response parser ([`parse_response`]) is pure, so tests and the fuzzer drive it directly.

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Largest header block accepted.
pub const MAX_HEADER: usize = 16 * 1024;
/// Largest body accepted by default; metadata answers are a few KiB.
pub const MAX_BODY: usize = 1024 * 1024;
/// Longest a single attempt may take before it counts as a timeout and is retried.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Backoff between retries: doubles from the first value up to the cap.
const BACKOFF_START: Duration = Duration::from_millis(50);
const BACKOFF_CAP: Duration = Duration::from_secs(1);
const MAX_REDIRECTS: usize = 3;

/// An `http://host[:port]/path?query` URL. Metadata services are plain HTTP on a
/// link-local address; anything else is refused rather than half-supported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    /// Path and query, always starting with `/`.
    pub path: String,
}

impl Url {
    /// Parses an absolute `http://` URL.
    pub fn parse(s: &str) -> Result<Url, String> {
        let rest = s
            .strip_prefix("http://")
            .ok_or_else(|| format!("URL {s:?}: expected http://host[:port]/path"))?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_string()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_string()),
        };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let end = v6
                .find(']')
                .ok_or_else(|| format!("URL {s:?}: missing ']' in IPv6 host"))?;
            let port = match &v6[end + 1..] {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| format!("URL {s:?}: expected ':' after ']'"))?,
                ),
            };
            (&v6[..end], port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || authority.contains('@') {
            return Err(format!("URL {s:?}: expected a host, found {authority:?}"));
        }
        let port = match port {
            None => 80,
            Some(p) => p
                .parse::<u16>()
                .map_err(|_| format!("URL {s:?}: expected a port number, found {p:?}"))?,
        };
        Ok(Url {
            host: host.to_string(),
            port,
            path,
        })
    }

    /// Resolves a reference from a `Location` header against this URL.
    fn join(&self, location: &str) -> Result<Url, String> {
        if location.starts_with("http://") || location.starts_with("https://") {
            Url::parse(location)
        } else if location.starts_with('/') {
            Ok(Url {
                path: location.to_string(),
                ..self.clone()
            })
        } else {
            Err(format!("unsupported redirect target {location:?}"))
        }
    }

    fn host_header(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == 80 {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.host_header(), self.path)
    }
}

/// A complete response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    /// The first header named `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Why bytes are not (yet) a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResponseError {
    /// The connection ended before the response was complete.
    Truncated(String),
    /// The bytes are not a valid or acceptable HTTP/1.x response.
    Invalid(String),
}

impl fmt::Display for ResponseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResponseError::Truncated(m) | ResponseError::Invalid(m) => f.write_str(m),
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// Parses the bytes received so far. `Ok(None)`: more bytes are needed. With `eof`, the
/// peer has closed, so an incomplete response is an error instead.
pub fn parse_response(
    buf: &[u8],
    eof: bool,
    max_body: usize,
) -> Result<Option<Response>, ResponseError> {
    let Some(head_end) = find(&buf[..buf.len().min(MAX_HEADER + 4)], b"\r\n\r\n") else {
        if buf.len() > MAX_HEADER {
            return Err(ResponseError::Invalid(format!(
                "response headers exceed {MAX_HEADER} bytes"
            )));
        }
        if eof {
            return Err(ResponseError::Truncated(format!(
                "connection closed after {} bytes, before the end of the headers",
                buf.len()
            )));
        }
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..head_end])
        .map_err(|_| ResponseError::Invalid("response headers are not UTF-8".to_string()))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or("");
    let status = parse_status_line(status_line)?;
    let mut headers = Vec::new();
    for line in lines {
        let (k, v) = line
            .split_once(':')
            .ok_or_else(|| ResponseError::Invalid(format!("malformed header line {line:?}")))?;
        if k.is_empty() || k.bytes().any(|b| b <= b' ' || b >= 0x7f) {
            return Err(ResponseError::Invalid(format!(
                "malformed header name {k:?}"
            )));
        }
        headers.push((k.to_ascii_lowercase(), v.trim().to_string()));
    }
    let body_bytes = &buf[head_end + 4..];
    let mut resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    let chunked = resp
        .header("transfer-encoding")
        .is_some_and(|te| te.eq_ignore_ascii_case("chunked"));
    if chunked {
        return match decode_chunked(body_bytes, max_body)? {
            Some(body) => {
                resp.body = body;
                Ok(Some(resp))
            }
            None if eof => Err(ResponseError::Truncated(
                "connection closed inside a chunked body".to_string(),
            )),
            None => Ok(None),
        };
    }
    if status == 204 || status == 304 || (100..200).contains(&status) {
        return Ok(Some(resp));
    }
    if let Some(cl) = resp.header("content-length") {
        let n: usize = cl.parse().map_err(|_| {
            ResponseError::Invalid(format!("Content-Length {cl:?} is not a number"))
        })?;
        if n > max_body {
            return Err(ResponseError::Invalid(format!(
                "body of {n} bytes exceeds the {max_body}-byte limit"
            )));
        }
        if body_bytes.len() >= n {
            resp.body = body_bytes[..n].to_vec();
            return Ok(Some(resp));
        }
        if eof {
            return Err(ResponseError::Truncated(format!(
                "connection closed after {} of {n} body bytes",
                body_bytes.len()
            )));
        }
        return Ok(None);
    }
    if body_bytes.len() > max_body {
        return Err(ResponseError::Invalid(format!(
            "body exceeds the {max_body}-byte limit"
        )));
    }
    if eof {
        resp.body = body_bytes.to_vec();
        return Ok(Some(resp));
    }
    Ok(None)
}

fn parse_status_line(line: &str) -> Result<u16, ResponseError> {
    let bad =
        || ResponseError::Invalid(format!("expected an HTTP/1.x status line, found {line:?}"));
    let rest = line.strip_prefix("HTTP/1.").ok_or_else(bad)?;
    let mut parts = rest.splitn(3, ' ');
    let minor = parts.next().ok_or_else(bad)?;
    let code = parts.next().ok_or_else(bad)?;
    if minor.len() != 1 || !minor.as_bytes()[0].is_ascii_digit() || code.len() != 3 {
        return Err(bad());
    }
    let status: u16 = code.parse().map_err(|_| bad())?;
    if !(100..600).contains(&status) {
        return Err(bad());
    }
    Ok(status)
}

/// Decodes a chunked body. `Ok(None)`: incomplete.
fn decode_chunked(mut b: &[u8], max_body: usize) -> Result<Option<Vec<u8>>, ResponseError> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = find(b, b"\r\n") else {
            if b.len() > 1024 {
                return Err(ResponseError::Invalid(
                    "chunk size line too long".to_string(),
                ));
            }
            return Ok(None);
        };
        let line = std::str::from_utf8(&b[..eol])
            .map_err(|_| ResponseError::Invalid("chunk size line is not UTF-8".to_string()))?;
        let hex = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(hex, 16)
            .ok()
            .filter(|_| !hex.is_empty() && hex.len() <= 8)
            .ok_or_else(|| {
                ResponseError::Invalid(format!("expected a hex chunk size, found {line:?}"))
            })?;
        b = &b[eol + 2..];
        if size == 0 {
            // Trailers, if any, end with an empty line.
            return match find(b, b"\r\n") {
                Some(0) => Ok(Some(out)),
                Some(_) => match find(b, b"\r\n\r\n") {
                    Some(_) => Ok(Some(out)),
                    None => Ok(None),
                },
                None => Ok(None),
            };
        }
        if out.len() + size > max_body {
            return Err(ResponseError::Invalid(format!(
                "chunked body exceeds the {max_body}-byte limit"
            )));
        }
        if b.len() < size + 2 {
            return Ok(None);
        }
        if &b[size..size + 2] != b"\r\n" {
            return Err(ResponseError::Invalid(
                "chunk data is not followed by CRLF".to_string(),
            ));
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size + 2..];
    }
}

/// Why a request finally failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpError {
    /// The deadline passed while every attempt failed transiently; the last failure is named.
    Unreachable(String),
    /// The answer was unusable and retrying would not help.
    Invalid(String),
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpError::Unreachable(m) | HttpError::Invalid(m) => f.write_str(m),
        }
    }
}

/// One attempt's failure, before the retry policy decides.
enum Attempt {
    Transient(String),
    Fatal(String),
}

/// Sends requests until a shared deadline. Proxies are never used: metadata must be direct.
/// The one HTTP client of firstboot: metadata, kubelet's healthz, the GCP guest attribute.
#[derive(Debug, Clone)]
pub struct Client {
    deadline: Instant,
    max_body: usize,
    /// Retry transient failures until the deadline; off: one attempt, any status returned.
    retry: bool,
}

impl Client {
    /// A client whose every request, retries included, ends by `deadline`.
    pub fn new(deadline: Instant) -> Client {
        Client {
            deadline,
            max_body: MAX_BODY,
            retry: true,
        }
    }

    /// A client that makes one attempt per request, within `timeout`, and returns whatever
    /// status it gets: for probes (kubelet's healthz) and best-effort reports, whose callers
    /// poll or give up themselves.
    pub fn once(timeout: Duration) -> Client {
        Client {
            retry: false,
            ..Client::new(Instant::now() + timeout)
        }
    }

    /// When every request of this client ends at the latest.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Sends `method url` with `headers` and no body; see [`Client::send_body`].
    pub fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
    ) -> Result<Response, HttpError> {
        self.send_body(method, url, headers, b"")
    }

    /// Sends `method url` with `headers` and `body` and returns the first non-transient
    /// response: any status except 408, 429 and 5xx. Connect errors, timeouts, truncated
    /// answers, 408, 429 and 5xx are retried with capped backoff until the deadline (unless
    /// the client was made with [`Client::once`]).
    pub fn send_body(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, HttpError> {
        let mut target = Url::parse(url).map_err(HttpError::Invalid)?;
        let origin = (target.host.clone(), target.port);
        let mut redirects = 0;
        let mut backoff = BACKOFF_START;
        let mut attempts = 0u32;
        let started = Instant::now();
        loop {
            attempts += 1;
            let failure = match self.attempt(method, &target, headers, body) {
                Ok(resp) if matches!(resp.status, 301 | 302 | 307 | 308) => {
                    let loc = resp.header("location").unwrap_or("").to_string();
                    let next = target
                        .join(&loc)
                        .map_err(|e| HttpError::Invalid(format!("{method} {target}: {e}")))?;
                    if (next.host.as_str(), next.port) != (origin.0.as_str(), origin.1) {
                        return Err(HttpError::Invalid(format!(
                            "{method} {target}: refused redirect to another host ({loc})"
                        )));
                    }
                    redirects += 1;
                    if redirects > MAX_REDIRECTS {
                        return Err(HttpError::Invalid(format!(
                            "{method} {url}: more than {MAX_REDIRECTS} redirects"
                        )));
                    }
                    target = next;
                    continue;
                }
                Ok(resp)
                    if self.retry
                        && (resp.status == 408 || resp.status == 429 || resp.status >= 500) =>
                {
                    format!("answered HTTP {}", resp.status)
                }
                Ok(resp) => return Ok(resp),
                Err(Attempt::Fatal(m)) => {
                    return Err(HttpError::Invalid(format!("{method} {target}: {m}")))
                }
                Err(Attempt::Transient(m)) => m,
            };
            if !self.retry {
                return Err(HttpError::Unreachable(format!(
                    "{method} {target}: {failure}"
                )));
            }
            let now = Instant::now();
            if now + backoff >= self.deadline {
                return Err(HttpError::Unreachable(format!(
                    "{method} {target}: {failure} ({attempts} attempt{} over {} ms, deadline reached)",
                    if attempts == 1 { "" } else { "s" },
                    now.duration_since(started).as_millis()
                )));
            }
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(BACKOFF_CAP);
        }
    }

    fn attempt(
        &self,
        method: &str,
        url: &Url,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<Response, Attempt> {
        let end = self.deadline.min(Instant::now() + ATTEMPT_TIMEOUT);
        let left = |what: &str| {
            end.checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or_else(|| Attempt::Transient(format!("timed out while {what}")))
        };
        let addrs: Vec<SocketAddr> = (url.host.as_str(), url.port)
            .to_socket_addrs()
            .map_err(|e| Attempt::Transient(format!("cannot resolve {}: {e}", url.host)))?
            .collect();
        let mut stream = None;
        let mut last = String::from("no address");
        for a in &addrs {
            match TcpStream::connect_timeout(a, left("connecting")?) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) if e.kind() == ErrorKind::TimedOut => last = "connect timed out".to_string(),
                Err(e) => last = format!("cannot connect: {e}"),
            }
        }
        let mut s = stream.ok_or(Attempt::Transient(last))?;
        let _ = s.set_nodelay(true);

        let mut req = String::with_capacity(256);
        req.push_str(method);
        req.push(' ');
        req.push_str(&url.path);
        req.push_str(" HTTP/1.1\r\nHost: ");
        req.push_str(&url.host_header());
        req.push_str("\r\nUser-Agent: kiln-firstboot/");
        req.push_str(env!("CARGO_PKG_VERSION"));
        req.push_str("\r\nAccept: */*\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(k);
            req.push_str(": ");
            req.push_str(v);
            req.push_str("\r\n");
        }
        if method == "PUT" || method == "POST" || !body.is_empty() {
            req.push_str("Content-Length: ");
            req.push_str(&body.len().to_string());
            req.push_str("\r\n");
        }
        req.push_str("\r\n");
        let io = |e: std::io::Error, what: &str| {
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                Attempt::Transient(format!("timed out while {what}"))
            } else {
                Attempt::Transient(format!("{what} failed: {e}"))
            }
        };
        s.set_write_timeout(Some(left("sending")?))
            .map_err(|e| io(e, "sending"))?;
        s.write_all(req.as_bytes())
            .and_then(|()| s.write_all(body))
            .map_err(|e| io(e, "sending"))?;

        let mut buf = Vec::with_capacity(4096);
        let mut chunk = [0u8; 8192];
        loop {
            s.set_read_timeout(Some(left("reading the response")?))
                .map_err(|e| io(e, "reading the response"))?;
            let n = match s.read(&mut chunk) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(io(e, "reading the response")),
            };
            buf.extend_from_slice(&chunk[..n]);
            match parse_response(&buf, n == 0, self.max_body) {
                Ok(Some(resp)) => return Ok(resp),
                Ok(None) => {}
                Err(ResponseError::Truncated(m)) => return Err(Attempt::Transient(m)),
                Err(ResponseError::Invalid(m)) => return Err(Attempt::Fatal(m)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // From wait.rs, whose own HTTP code this client replaced (Go's net/http chunks small
    // handler bodies, so kubelet's healthz answer can come that way).
    #[test]
    fn dechunk_joins_chunks() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n3\r\n!!!\r\n0\r\n\r\n";
        let resp = parse_response(raw, false, MAX_BODY).unwrap().unwrap();
        assert_eq!(resp.body, b"ok!!!");
    }

    #[test]
    fn urls() {
        let u = Url::parse("http://169.254.169.254/latest/api/token").unwrap();
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            ("169.254.169.254", 80, "/latest/api/token")
        );
        let u = Url::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!((u.port, u.path.as_str()), (8080, "/"));
        let u = Url::parse("http://127.0.0.1:9?x=1").unwrap();
        assert_eq!(u.path, "/?x=1");
        let u = Url::parse("http://[::1]:9/a").unwrap();
        assert_eq!((u.host.as_str(), u.port), ("::1", 9));
        assert_eq!(u.to_string(), "http://[::1]:9/a");
        for bad in [
            "https://x/",
            "x/y",
            "http://",
            "http://h:99999/",
            "http://u@h/",
            "http://[::1/",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    fn full(b: &[u8]) -> Result<Option<Response>, ResponseError> {
        parse_response(b, true, 64)
    }

    #[test]
    fn parses_framings() {
        let r = parse_response(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nX-A: b \r\n\r\nabcEXTRA",
            false,
            64,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.status, r.body.as_slice(), r.header("x-a")),
            (200, &b"abc"[..], Some("b"))
        );
        let r = full(b"HTTP/1.0 404 Not Found\r\n\r\nnope")
            .unwrap()
            .unwrap();
        assert_eq!((r.status, r.body.as_slice()), (404, &b"nope"[..]));
        let r = full(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(r.body, b"abcde");
        let r = full(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\nT: v\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(r.body, b"z");
    }

    #[test]
    fn waits_for_more_bytes() {
        for partial in [
            &b"HTTP/1.1 200 OK\r\nContent-Le"[..],
            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
            b"HTTP/1.1 200 OK\r\n\r\nuntil-eof",
        ] {
            assert_eq!(
                parse_response(partial, false, 64),
                Ok(None),
                "{:?}",
                String::from_utf8_lossy(partial)
            );
            assert!(
                matches!(
                    parse_response(partial, true, 64),
                    Err(ResponseError::Truncated(_)) | Ok(Some(_))
                ),
                "{partial:?}"
            );
        }
        assert!(matches!(
            full(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nab"),
            Err(ResponseError::Truncated(m)) if m.contains("2 of 5")
        ));
    }

    #[test]
    fn rejects_bad_responses() {
        let cases: &[(&[u8], &str)] = &[
            (b"SSH-2.0-OpenSSH\r\n\r\n", "status line"),
            (b"HTTP/1.1 2000 OK\r\n\r\n", "status line"),
            (b"HTTP/1.1 099 X\r\n\r\n", "status line"),
            (b"HTTP/1.1 200 OK\r\nbad header\r\n\r\n", "malformed header"),
            (
                b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
                "not a number",
            ),
            (b"HTTP/1.1 200 OK\r\nContent-Length: 65\r\n\r\n", "exceeds"),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
                "hex chunk size",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n41\r\n",
                "exceeds",
            ),
            (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nabc",
                "CRLF",
            ),
            (b"HTTP/1.1 200 \xff\r\n\r\n", "not UTF-8"),
        ];
        for (bytes, needle) in cases {
            match full(bytes) {
                Err(ResponseError::Invalid(m)) => assert!(m.contains(needle), "{m}"),
                other => panic!("{:?}: {other:?}", String::from_utf8_lossy(bytes)),
            }
        }
        let huge = vec![b'a'; MAX_HEADER + 10];
        assert!(
            matches!(parse_response(&huge, false, 64), Err(ResponseError::Invalid(m)) if m.contains("headers exceed"))
        );
    }
}
