//! An in-process HTTP/1.1 metadata server on a loopback port: the guest reaches it through
//! QEMU's guestfwd and the relay. It records every request so tests can assert on what the
//! node asked, and ships an AWS IMDSv2 stand-in (token PUT, then GETs with the token).

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// One request as the server read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `PUT`, …
    pub method: String,
    /// The path with its query string.
    pub path: String,
    /// Header names lower-cased.
    pub headers: BTreeMap<String, String>,
    /// The body (bounded by Content-Length).
    pub body: Vec<u8>,
}

impl Request {
    /// A header's value by its lower-case name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// A response to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    /// HTTP status code.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// `200 OK` with a text body.
    pub fn text(body: impl Into<String>) -> Self {
        Response {
            status: 200,
            headers: vec![("Content-Type".into(), "text/plain".into())],
            body: body.into().into_bytes(),
        }
    }

    /// An empty response with a status code.
    pub fn status(status: u16) -> Self {
        Response {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }
}

/// Decides the response to one request.
pub type Handler = dyn Fn(&Request) -> Response + Send + Sync;

/// A running server; stops when dropped.
pub struct MetadataServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Request>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetadataServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl MetadataServer {
    /// Binds 127.0.0.1 on a free port and serves `handler` on a thread.
    pub fn start(
        handler: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let handler: Arc<Handler> = Arc::new(handler);
        let thread = {
            let (requests, stop) = (requests.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    let (requests, handler) = (requests.clone(), handler.clone());
                    std::thread::spawn(move || {
                        let _ = serve_connection(conn, &*handler, &requests);
                    });
                }
            })
        };
        Ok(MetadataServer {
            addr,
            requests,
            stop,
            thread: Some(thread),
        })
    }

    /// The loopback port the relay should connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every request served so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
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

/// Serves requests on one connection (keep-alive) until the peer closes it.
fn serve_connection(
    conn: TcpStream,
    handler: &Handler,
    log: &Mutex<Vec<Request>>,
) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut writer = conn;
    while let Some(req) = read_request(&mut reader)? {
        let close = req
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        let resp = handler(&req);
        log.lock().unwrap_or_else(|e| e.into_inner()).push(req);
        write_response(&mut writer, &resp)?;
        if close {
            break;
        }
    }
    Ok(())
}

/// Reads one request; `None` at a clean end of the connection.
pub fn read_request(reader: &mut impl BufRead) -> io::Result<Option<Request>> {
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
    let mut headers = BTreeMap::new();
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
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    let len: usize = headers
        .get("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len.min(1 << 20)];
    reader.read_exact(&mut body)?;
    Ok(Some(Request {
        method,
        path,
        headers,
        body,
    }))
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

fn write_response(w: &mut impl Write, resp: &Response) -> io::Result<()> {
    let mut head = format!(
        "HTTP/1.1 {} {}\r\n",
        resp.status,
        reason_phrase(resp.status)
    );
    for (k, v) in &resp.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", resp.body.len()));
    w.write_all(head.as_bytes())?;
    w.write_all(&resp.body)?;
    w.flush()
}

/// The instance facts an AWS IMDSv2 stand-in answers with.
#[derive(Debug, Clone)]
pub struct AwsInstance {
    /// `instance-id`
    pub instance_id: String,
    /// `instance-type`
    pub instance_type: String,
    /// `local-ipv4`
    pub local_ipv4: String,
    /// `placement/availability-zone`
    pub zone: String,
    /// `placement/region`
    pub region: String,
    /// `local-hostname` (and `hostname`)
    pub hostname: String,
    /// `mac`
    pub mac: String,
}

/// The token the IMDSv2 stand-in hands out.
pub const IMDS_TOKEN: &str = "kiln-test-token-AQAEAH";

/// An IMDSv2 stand-in with the paths and headers of the real service: `PUT
/// /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` gives a token, and every
/// `GET /latest/meta-data/…` must carry it in `X-aws-ec2-metadata-token` (else 401, as
/// IMDSv2-only instances answer).
pub fn aws_imdsv2(instance: AwsInstance) -> impl Fn(&Request) -> Response + Send + Sync {
    move |req| {
        if req.path == "/latest/api/token" {
            if req.method != "PUT" {
                return Response::status(405);
            }
            if req.header("x-aws-ec2-metadata-token-ttl-seconds").is_none() {
                return Response::status(400);
            }
            return Response::text(IMDS_TOKEN);
        }
        if req.method != "GET" {
            return Response::status(405);
        }
        if req.header("x-aws-ec2-metadata-token") != Some(IMDS_TOKEN) {
            return Response::status(401);
        }
        let i = &instance;
        let mac_path = format!(
            "/latest/meta-data/network/interfaces/macs/{}/local-ipv4s",
            i.mac
        );
        let body = match req.path.as_str() {
            "/latest/meta-data/instance-id" => i.instance_id.clone(),
            "/latest/meta-data/instance-type" => i.instance_type.clone(),
            "/latest/meta-data/local-ipv4" => i.local_ipv4.clone(),
            "/latest/meta-data/placement/availability-zone" => i.zone.clone(),
            "/latest/meta-data/placement/region" => i.region.clone(),
            "/latest/meta-data/local-hostname" | "/latest/meta-data/hostname" => i.hostname.clone(),
            "/latest/meta-data/mac" => i.mac.clone(),
            p if p == mac_path => i.local_ipv4.clone(),
            _ => return Response::status(404),
        };
        Response::text(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn raw(port: u16, req: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn instance() -> AwsInstance {
        AwsInstance {
            instance_id: "i-0abc".into(),
            instance_type: "m5.large".into(),
            local_ipv4: "10.0.3.7".into(),
            zone: "eu-west-1a".into(),
            region: "eu-west-1".into(),
            hostname: "ip-10-0-3-7.eu-west-1.compute.internal".into(),
            mac: "52:54:00:12:34:56".into(),
        }
    }

    #[test]
    fn imdsv2_requires_the_token_from_the_put() {
        let srv = MetadataServer::start(aws_imdsv2(instance())).unwrap();
        let no_token = raw(
            srv.port(),
            "GET /latest/meta-data/instance-id HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert!(no_token.starts_with("HTTP/1.1 401 "), "{no_token}");
        let token = raw(
            srv.port(),
            "PUT /latest/api/token HTTP/1.1\r\nX-aws-ec2-metadata-token-ttl-seconds: 60\r\nConnection: close\r\n\r\n",
        );
        assert!(token.ends_with(IMDS_TOKEN), "{token}");
        let id = raw(
            srv.port(),
            &format!("GET /latest/meta-data/instance-id HTTP/1.1\r\nX-aws-ec2-metadata-token: {IMDS_TOKEN}\r\nConnection: close\r\n\r\n"),
        );
        assert!(
            id.starts_with("HTTP/1.1 200 ") && id.ends_with("\r\n\r\ni-0abc"),
            "{id}"
        );
        let reqs = srv.requests();
        assert_eq!(reqs.len(), 3);
        assert_eq!(reqs[1].method, "PUT");
    }

    #[test]
    fn keep_alive_serves_several_requests_on_one_connection() {
        let srv = MetadataServer::start(|r| Response::text(r.path.clone())).unwrap();
        let out = raw(
            srv.port(),
            "GET /a HTTP/1.1\r\n\r\nGET /b HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert_eq!(out.matches("HTTP/1.1 200 OK").count(), 2, "{out}");
        assert!(out.ends_with("/b"));
    }
}
