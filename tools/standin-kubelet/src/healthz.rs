//! kubelet's `/healthz` endpoint: `200 ok` on `healthzBindAddress:healthzPort`.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

pub fn serve_healthz(listener: TcpListener) {
    for stream in listener.incoming().flatten() {
        std::thread::spawn(move || answer(stream));
    }
}

pub fn answer(mut stream: TcpStream) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 2048];
    let mut used = 0;
    while used < buf.len() {
        match stream.read(&mut buf[used..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => used += n,
        }
        if buf[..used].windows(4).any(|w| w == b"\r\n\r\n") {
            break;
        }
    }
    let head = String::from_utf8_lossy(&buf[..used]);
    let path = head.split_whitespace().nth(1).unwrap_or("");
    let (status, body) = if path == "/healthz" || path.starts_with("/healthz?") {
        ("200 OK", "ok")
    } else {
        ("404 Not Found", "404 page not found\n")
    };
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(resp.as_bytes());
}
