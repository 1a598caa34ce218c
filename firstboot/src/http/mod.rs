//! A std-only HTTP/1.1 client for metadata services: one request per connection, timeouts on
//! connect/read/write, caps on header and body size, chunked and content-length bodies,
//! same-host redirects only, and retries of transient failures under one global deadline.
//!
//! The response parser ([`parse_response`], in `response.rs`) is pure, so tests and the
//! fuzzer drive it directly.

mod response;

use std::fmt;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Largest body accepted by default; metadata answers are a few KiB.
pub const MAX_BODY: usize = 1024 * 1024;
/// Longest a single attempt may take before it counts as a timeout and is retried.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Backoff between retries: doubles from the first value up to the cap.
const BACKOFF_START: Duration = Duration::from_millis(50);
const BACKOFF_CAP: Duration = Duration::from_secs(1);
/// The least time before the deadline worth one more attempt (a loopback or link-local
/// service answers in a few milliseconds).
const LAST_ATTEMPT: Duration = Duration::from_millis(100);
const MAX_REDIRECTS: usize = 3;

pub use response::{parse_response, Response, ResponseError, MAX_HEADER};

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
        // A host and a path go into the request line and the Host header as they are: no
        // byte may end a line or a field there, and the host must be one host, written the
        // one way `Display` writes it back (a bare name or IPv4 address, or an IPv6 address
        // in brackets).
        let bracketed = authority.starts_with('[');
        let host_ok = if bracketed {
            host.parse::<std::net::Ipv6Addr>().is_ok()
        } else {
            host.bytes()
                .all(|b| b.is_ascii_graphic() && !b":[]/?#@".contains(&b))
        };
        if !host_ok {
            return Err(format!(
                "URL {s:?}: expected a host name, an IPv4 address or a bracketed IPv6 address, found {host:?}"
            ));
        }
        if !path.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(format!(
                "URL {s:?}: expected a path of printable ASCII (percent-encode the rest), found {path:?}"
            ));
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

/// A server's `Date` header and the node's wall clock around the exchange that carried it:
/// the metadata service's time as the run saw it, which the doctor's clock check compares
/// with instead of asking again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DateSeen {
    /// The request's URL.
    pub url: String,
    /// The header's value, as sent.
    pub date: String,
    /// The node's clock (ms since the epoch) when the request left and when the answer was in.
    pub before_ms: i64,
    pub after_ms: i64,
}

/// The node's wall clock in milliseconds since the epoch (0 before 1970).
pub fn unix_now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Sends requests until a shared deadline. Proxies are never used: metadata must be direct.
/// The one HTTP client of firstboot: metadata, kubelet's healthz, the GCP guest attribute.
#[derive(Debug)]
pub struct Client {
    deadline: Instant,
    max_body: usize,
    /// Retry transient failures until the deadline; off: one attempt, any status returned.
    retry: bool,
    /// The newest answer's `Date` ([`Client::date_seen`]).
    seen: Mutex<Option<DateSeen>>,
}

impl Client {
    /// A client whose every request, retries included, ends by `deadline`.
    pub fn new(deadline: Instant) -> Client {
        Client {
            deadline,
            max_body: MAX_BODY,
            retry: true,
            seen: Mutex::new(None),
        }
    }

    /// The `Date` of the newest answer this client got that carried one.
    pub fn date_seen(&self) -> Option<DateSeen> {
        self.seen.lock().map_or(None, |s| s.clone())
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
            let before_ms = unix_now_ms();
            let result = self.attempt(method, &target, headers, body);
            if let Some(date) = result.as_ref().ok().and_then(|r| r.header("date")) {
                let seen = DateSeen {
                    url: target.to_string(),
                    date: date.to_string(),
                    before_ms,
                    after_ms: unix_now_ms(),
                };
                if let Ok(mut s) = self.seen.lock() {
                    *s = Some(seen);
                }
            }
            let failure = match result {
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
            // The last wait is cut short so one more attempt still fits before the deadline:
            // a service that answers late in the window is used, and the run gives up at the
            // deadline, not a whole backoff before it. A sleep that overran the deadline (a
            // loaded machine) leaves no time for an attempt: the failure named is then this
            // one, not a timeout that tried nothing.
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left > LAST_ATTEMPT {
                std::thread::sleep(backoff.min(left - LAST_ATTEMPT));
                backoff = (backoff * 2).min(BACKOFF_CAP);
                if Instant::now() < self.deadline {
                    continue;
                }
            }
            return Err(HttpError::Unreachable(format!(
                "{method} {target}: {failure} ({attempts} attempt{} over {} ms, deadline reached)",
                if attempts == 1 { "" } else { "s" },
                started.elapsed().as_millis() as u64
            )));
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
        // One Accept only: a source that asks for a format (Akamai's JSON) says so itself.
        if !headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("accept"))
        {
            req.push_str("\r\nAccept: */*");
        }
        req.push_str("\r\nConnection: close\r\n");
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
            // Found by the url fuzz target: a host with ':' and control bytes that came back
            // bracketed, and so different, through Display.
            "http://\0]\0\u{4}p::8081/\u{4}",
            "http://a:b:80/",
            "http://[not-v6]/",
            "http://h/a b",
            "http://h/a\r\nX-Injected: 1",
            "http://h\r\nX: 1/",
        ] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }
}
