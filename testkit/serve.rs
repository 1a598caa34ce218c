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
