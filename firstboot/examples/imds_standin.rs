//! A loopback stand-in for EC2's IMDSv2, for benchmarks and trying firstboot by hand:
//! serves `firstboot/tests/fixtures/aws/` (token by PUT, then GETs that must carry it),
//! answering at once. It also answers `GET /healthz` with `ok`, as a healthy kubelet does,
//! so a full run gets through its wait phases. Prints its base URL and runs until killed.
//!
//!     cargo run -p kiln-firstboot --example imds_standin -- [FIXTURE_DIR] [PORT]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::thread;

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/aws"));
    let port = args.next().unwrap_or_else(|| "0".to_string());
    let listener = TcpListener::bind(format!("127.0.0.1:{port}"))?;
    println!("http://{}", listener.local_addr()?);
    std::io::stdout().flush()?;
    let token = std::fs::read_to_string(dir.join("latest/api/token"))?;
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let (dir, token) = (dir.clone(), token.clone());
        thread::spawn(move || {
            let _ = serve(conn, &dir, &token);
        });
    }
    Ok(())
}

fn serve(mut conn: TcpStream, dir: &Path, token: &str) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut b = [0u8; 2048];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = conn.read(&mut b)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&b[..n]);
    }
    let req = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let mut first = req.split_whitespace();
    let (method, path) = (first.next().unwrap_or(""), first.next().unwrap_or("/"));
    let path = path.split('?').next().unwrap_or("/");
    let (status, body) = if path == "/healthz" {
        ("200 OK", b"ok".to_vec())
    } else if path == "/latest/api/token" {
        if method == "put" && req.contains("x-aws-ec2-metadata-token-ttl-seconds:") {
            ("200 OK", token.as_bytes().to_vec())
        } else {
            ("400 Bad Request", Vec::new())
        }
    } else if !req.contains(&format!(
        "x-aws-ec2-metadata-token: {}",
        token.to_ascii_lowercase()
    )) {
        ("401 Unauthorized", Vec::new())
    } else {
        match std::fs::read(dir.join(path.trim_start_matches('/'))) {
            Ok(body) => ("200 OK", body),
            Err(_) => ("404 Not Found", b"Not Found".to_vec()),
        }
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nServer: EC2ws\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes())?;
    conn.write_all(&body)
}
