//! The one loopback metadata stand-in: an HTTP/1.1 server on 127.0.0.1 that records every
//! request and answers through a handler, with the AWS IMDSv2 token protocol and a
//! fixture-file handler on top. The providers' unit tests, the integration tests
//! (`tests/common`), the `imds_standin` example and the QEMU boot tests
//! (`kiln-qemu-tests`) all serve metadata with it. Not used by the kiln-firstboot program.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// One request as the server read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `PUT`, …
    pub method: String,
    /// The path with its query string.
    pub path: String,
    /// Header names lower-cased, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body (as long as `Content-Length` says, at most 1 MiB).
    pub body: Vec<u8>,
}

impl Request {
    /// A header's value by its lower-case name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The path without its query.
    pub fn route(&self) -> &str {
        self.path.split('?').next().unwrap_or("/")
    }
}

/// How the server answers one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A complete response: status, extra headers, body (sent with `Content-Length`).
    Http(u16, Vec<(String, String)>, Vec<u8>),
    /// Bytes written as they are, then the connection is closed.
    Raw(Vec<u8>),
    /// `200` headers, then the body one byte per `gap`.
    Slow(Vec<u8>, Duration),
    /// Reads the request and never answers.
    Hang,
}

impl Reply {
    /// `200 OK` with a text body.
    pub fn text(body: impl Into<String>) -> Reply {
        Reply::Http(
            200,
            vec![("Content-Type".into(), "text/plain".into())],
            body.into().into_bytes(),
        )
    }

    /// `code` with a short body that names it.
    pub fn status(code: u16) -> Reply {
        Reply::Http(code, vec![], format!("status {code}\n").into_bytes())
    }
}

/// Decides the answer to one request.
pub type Handler = dyn Fn(&Request) -> Reply + Send + Sync;

/// A running stand-in; it stops when dropped.
pub struct MetadataServer {
    /// `http://127.0.0.1:<port>`.
    pub url: String,
    addr: SocketAddr,
    log: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetadataServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataServer")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl MetadataServer {
    /// Serves `handler` on a free loopback port.
    pub fn start(handler: impl Fn(&Request) -> Reply + Send + Sync + 'static) -> io::Result<Self> {
        MetadataServer::bind("127.0.0.1:0", handler)
    }

    /// Serves `handler` on `addr` (`127.0.0.1:<port>`).
    pub fn bind(
        addr: &str,
        handler: impl Fn(&Request) -> Reply + Send + Sync + 'static,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        let log = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let thread = {
            let (log, stop) = (log.clone(), stop.clone());
            thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (log, handler) = (log.clone(), handler.clone());
                    thread::spawn(move || {
                        let _ = serve(conn, &*handler, &log);
                    });
                }
            })
        };
        Ok(MetadataServer {
            url: format!("http://{addr}"),
            addr,
            log,
            stop,
            thread: Some(thread),
        })
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every request served so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl Drop for MetadataServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept so the thread sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The file under `base` at the request's route, with `headers`; `404` when there is none.
pub fn fixture_reply(base: &Path, headers: &[(String, String)], r: &Request) -> Reply {
    let p = base.join(r.route().trim_start_matches('/'));
    match std::fs::read(&p) {
        Ok(body) if p.is_file() => Reply::Http(200, headers.to_vec(), body),
        _ => Reply::Http(404, headers.to_vec(), b"Not Found".to_vec()),
    }
}

/// IMDSv2's token protocol around `answer`: `PUT /latest/api/token` with
/// `X-aws-ec2-metadata-token-ttl-seconds` gives `token` (no TTL: `400`, another method:
/// `405`), and every other request must carry it in `X-aws-ec2-metadata-token` (else `401`,
/// as IMDSv2-only instances answer) before `answer` sees it.
pub fn aws_imdsv2(
    token: String,
    answer: impl Fn(&Request) -> Reply + Send + Sync,
) -> impl Fn(&Request) -> Reply + Send + Sync {
    move |r| {
        if r.route() == "/latest/api/token" {
            return match (
                r.method.as_str(),
                r.header("x-aws-ec2-metadata-token-ttl-seconds"),
            ) {
                ("PUT", Some(_)) => Reply::Http(
                    200,
                    vec![
                        ("Content-Type".into(), "text/plain".into()),
                        ("Server".into(), "EC2ws".into()),
                    ],
                    token.clone().into_bytes(),
                ),
                ("PUT", None) => Reply::status(400),
                _ => Reply::status(405),
            };
        }
        if r.header("x-aws-ec2-metadata-token") != Some(token.as_str()) {
            return Reply::status(401);
        }
        answer(r)
    }
}

/// Reads one request; `None` at a clean end of the connection.
fn read_request(reader: &mut impl BufRead) -> io::Result<Option<Request>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let (Some(method), Some(path)) = (parts.next(), parts.next()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad request line {line:?}"),
        ));
    };
    let (method, path) = (method.to_string(), path.to_string());
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let mut req = Request {
        method,
        path,
        headers,
        body: Vec::new(),
    };
    let len: usize = req
        .header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    req.body = vec![0; len.min(1 << 20)];
    reader.read_exact(&mut req.body)?;
    Ok(Some(req))
}

fn reason_phrase(code: u16) -> &'static str {
    match code {
        200 => "OK",
        301 => "Moved Permanently",
        302 => "Found",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Other",
    }
}

/// Serves requests on one connection (keep-alive) until the peer closes it, asks to close,
/// or the reply is not a plain HTTP answer.
fn serve(conn: TcpStream, handler: &Handler, log: &Mutex<Vec<Request>>) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut conn = conn;
    while let Some(req) = read_request(&mut reader)? {
        let close = req
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let reply = handler(&req);
        log.lock().unwrap_or_else(|e| e.into_inner()).push(req);
        match reply {
            Reply::Http(code, headers, body) => {
                let mut head = format!("HTTP/1.1 {code} {}\r\n", reason_phrase(code));
                for (k, v) in headers {
                    head.push_str(&format!("{k}: {v}\r\n"));
                }
                head.push_str(&format!("Content-Length: {}\r\n", body.len()));
                if close {
                    head.push_str("Connection: close\r\n");
                }
                head.push_str("\r\n");
                conn.write_all(head.as_bytes())?;
                conn.write_all(&body)?;
                conn.flush()?;
                if close {
                    return Ok(());
                }
            }
            Reply::Raw(bytes) => return conn.write_all(&bytes),
            Reply::Slow(body, gap) => {
                let head = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                conn.write_all(head.as_bytes())?;
                for b in body {
                    thread::sleep(gap);
                    conn.write_all(&[b])?;
                }
                return Ok(());
            }
            Reply::Hang => {
                thread::sleep(Duration::from_secs(120));
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Sends `raw` to the server at `port` and returns everything it answers until it closes.
#[cfg(test)]
fn exchange(port: u16, raw: &str) -> String {
    use std::io::Read;
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(raw.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "kiln-test-token-AQAEAH";

    #[test]
    fn imdsv2_requires_the_token_from_the_put() {
        let srv = MetadataServer::start(aws_imdsv2(TOKEN.into(), |r| {
            Reply::text(r.route().to_string())
        }))
        .unwrap();
        let no_token = exchange(
            srv.port(),
            "GET /latest/meta-data/instance-id HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert!(no_token.starts_with("HTTP/1.1 401 "), "{no_token}");
        let no_ttl = exchange(
            srv.port(),
            "PUT /latest/api/token HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert!(no_ttl.starts_with("HTTP/1.1 400 "), "{no_ttl}");
        let token = exchange(
            srv.port(),
            "PUT /latest/api/token HTTP/1.1\r\nX-aws-ec2-metadata-token-ttl-seconds: 60\r\nConnection: close\r\n\r\n",
        );
        assert!(token.ends_with(TOKEN), "{token}");
        let id = exchange(
            srv.port(),
            &format!("GET /latest/meta-data/instance-id HTTP/1.1\r\nX-aws-ec2-metadata-token: {TOKEN}\r\nConnection: close\r\n\r\n"),
        );
        assert!(
            id.starts_with("HTTP/1.1 200 ")
                && id.ends_with("\r\n\r\n/latest/meta-data/instance-id"),
            "{id}"
        );
        let reqs = srv.requests();
        assert_eq!(reqs.len(), 4);
        assert_eq!(reqs[2].method, "PUT");
    }

    #[test]
    fn keep_alive_serves_several_requests_on_one_connection() {
        let srv = MetadataServer::start(|r| Reply::text(r.path.clone())).unwrap();
        let out = exchange(
            srv.port(),
            "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
        assert!(out.ends_with("/b"));
    }

    #[test]
    fn bodies_are_read_and_recorded() {
        let srv = MetadataServer::start(|r| Reply::text(r.body.len().to_string())).unwrap();
        let out = exchange(
            srv.port(),
            "PUT /x HTTP/1.1\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
        );
        assert!(out.ends_with("\r\n\r\n5"), "{out}");
        assert_eq!(srv.requests()[0].body, b"hello");
    }
}
