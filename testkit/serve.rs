//! A loopback HTTP server that answers every request with the same bytes, for as long as the
//! process lives: a mirror holding one file, for tests in which the client (Ignition,
//! systemd-sysupdate) checks the bytes itself. Included by path (`#[path = …] mod serve;`)
//! into the crates that use it.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpListener;

/// Starts serving `body` on 127.0.0.1; returns the port.
pub fn serve_bytes(body: Vec<u8>) -> std::io::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let mut req = [0u8; 4096];
            let _ = c.read(&mut req);
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = c
                .write_all(head.as_bytes())
                .and_then(|()| c.write_all(&body));
        }
    });
    Ok(port)
}

/// Starts serving `files` (request path → bytes, e.g. `/kiln/flatcar/SHA256SUMS`) on
/// 127.0.0.1, 404 for any other path; returns the port. A mirror directory, for clients that
/// list it first (systemd-sysupdate reads `SHA256SUMS`, then fetches one image).
pub fn serve_files(files: Vec<(String, Vec<u8>)>) -> std::io::Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let port = l.local_addr()?.port();
    let files = std::sync::Arc::new(files);
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let files = files.clone();
            std::thread::spawn(move || {
                // The request head (up to its blank line, 16 KiB at most).
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let text = String::from_utf8_lossy(&head);
                let mut first = text.lines().next().unwrap_or_default().split(' ');
                let method = first.next().unwrap_or_default();
                let path = first.next().unwrap_or_default();
                let found = files.iter().find(|(p, _)| p == path).map(|(_, b)| b);
                let (status, body): (&str, &[u8]) = match found {
                    Some(b) => ("200 OK", b),
                    None => ("404 Not Found", b"not found\n"),
                };
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = c.write_all(reply.as_bytes());
                if method != "HEAD" {
                    let _ = c.write_all(body);
                }
            });
        }
    });
    Ok(port)
}
