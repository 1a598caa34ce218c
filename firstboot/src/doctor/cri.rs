//! One CRI call without a gRPC library: `runtime.v1.RuntimeService/Status` over HTTP/2 on
//! containerd's socket, the call `crictl info` and kubelet's runtime health check make
//! (k8s.io/cri-api/pkg/apis/runtime/v1/api.proto; kubelet: pkg/kubelet/kubelet.go
//! updateRuntimeUp). The request is one HEADERS frame of HPACK literals (RFC 7541 §6.2.2:
//! no dynamic table is touched, so the response's headers need not be decoded) and one DATA
//! frame carrying an empty `StatusRequest`; the answer is read from the DATA frames of
//! stream 1 (RFC 9113 §4.1, §6) and decoded as protobuf (`StatusResponse`).
//!
//! The protocol code builds and is unit-tested everywhere; only Unix has a socket to use it
//! on (Windows' CRI is a named pipe, not checked yet), hence no dead-code warnings there.
#![cfg_attr(not(unix), allow(dead_code))]

use std::io::{Read, Write};
use std::time::Duration;

/// One `RuntimeCondition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub kind: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

const PATH: &str = "/runtime.v1.RuntimeService/Status";
/// The most response bytes read; a `StatusResponse` without `verbose` is a few hundred.
const MAX_RESPONSE: usize = 1 << 20;

/// Asks the runtime at `socket` for its conditions.
#[cfg(unix)]
pub fn status(socket: &std::path::Path, timeout: Duration) -> Result<Vec<Condition>, String> {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    exchange(&mut s)
}

/// Asks the runtime at `socket` for its conditions (not available on this platform).
#[cfg(not(unix))]
pub fn status(socket: &std::path::Path, _timeout: Duration) -> Result<Vec<Condition>, String> {
    Err(format!(
        "{}: CRI over a named pipe is not checked on this platform",
        socket.display()
    ))
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// An HPACK string literal, not Huffman-coded, with its 7-bit-prefix length (RFC 7541 §5.1).
fn hpack_str(out: &mut Vec<u8>, s: &str) {
    let mut n = s.len();
    if n < 127 {
        out.push(n as u8);
    } else {
        out.push(127);
        n -= 127;
        while n >= 128 {
            out.push((n % 128) as u8 | 0x80);
            n /= 128;
        }
        out.push(n as u8);
    }
    out.extend_from_slice(s.as_bytes());
}

/// The whole request: preface, SETTINGS, HEADERS, DATA.
fn request() -> Vec<u8> {
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    frame(&mut out, 4, 0, 0, &[]);
    let mut block = Vec::new();
    for (k, v) in [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ] {
        block.push(0x00); // literal header field without indexing, new name
        hpack_str(&mut block, k);
        hpack_str(&mut block, v);
    }
    frame(&mut out, 1, 0x4, 1, &block); // END_HEADERS
                                        // gRPC message: uncompressed, length 0 (an empty StatusRequest).
    frame(&mut out, 0, 0x1, 1, &[0, 0, 0, 0, 0]); // END_STREAM
    out
}

/// Sends the call on `conn` and decodes the answer.
pub fn exchange(conn: &mut (impl Read + Write)) -> Result<Vec<Condition>, String> {
    conn.write_all(&request())
        .map_err(|e| format!("cannot send the CRI Status call: {e}"))?;
    let mut data = Vec::new();
    let mut total = 0usize;
    loop {
        let mut head = [0u8; 9];
        conn.read_exact(&mut head).map_err(|e| {
            if total == 0 {
                format!("the socket does not answer HTTP/2 (is it a CRI runtime?): {e}")
            } else {
                format!("the runtime stopped answering: {e}")
            }
        })?;
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let (kind, flags) = (head[3], head[4]);
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        total += 9 + len;
        if total > MAX_RESPONSE {
            return Err(format!("more than {MAX_RESPONSE} bytes without an answer"));
        }
        let mut payload = vec![0u8; len];
        conn.read_exact(&mut payload)
            .map_err(|e| format!("truncated HTTP/2 frame: {e}"))?;
        match kind {
            4 if flags & 1 == 0 => {
                let mut ack = Vec::new();
                frame(&mut ack, 4, 1, 0, &[]);
                let _ = conn.write_all(&ack);
            }
            0 if stream == 1 => {
                let body = if flags & 0x8 != 0 {
                    let pad = usize::from(*payload.first().unwrap_or(&0));
                    payload
                        .get(1..payload.len().saturating_sub(pad))
                        .unwrap_or(&[])
                } else {
                    &payload[..]
                };
                data.extend_from_slice(body);
            }
            3 if stream == 1 => return Err("the runtime reset the call (RST_STREAM)".into()),
            7 => {
                let code = payload
                    .get(4..8)
                    .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
                return Err(format!(
                    "the runtime closed the connection (GOAWAY, error {code})"
                ));
            }
            _ => {}
        }
        if stream == 1 && flags & 1 != 0 && matches!(kind, 0 | 1) {
            break;
        }
    }
    if data.len() < 5 {
        return Err(format!(
            "the runtime answered {PATH} without a message: the CRI service is not serving \
             (containerd: is \"cri\" in disabled_plugins?)"
        ));
    }
    let n = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    if data[0] != 0 || data.len() < 5 + n {
        return Err("a compressed or truncated gRPC message".into());
    }
    status_response(&data[5..5 + n])
}

/// One protobuf field and what follows it.
struct Field<'a> {
    num: u64,
    wire: u8,
    /// The bytes of a length-delimited field.
    bytes: &'a [u8],
    /// The value of a varint field.
    value: u64,
    rest: &'a [u8],
}

fn field(buf: &[u8]) -> Result<Field<'_>, String> {
    let (key, rest) = varint(buf)?;
    let wire = (key & 7) as u8;
    let f = |bytes, value, rest| Field {
        num: key >> 3,
        wire,
        bytes,
        value,
        rest,
    };
    match wire {
        0 => {
            let (v, rest) = varint(rest)?;
            Ok(f(&[], v, rest))
        }
        2 => {
            let (n, rest) = varint(rest)?;
            let n = usize::try_from(n).map_err(|_| "length overflow")?;
            if rest.len() < n {
                return Err("truncated protobuf field".into());
            }
            Ok(f(&rest[..n], 0, &rest[n..]))
        }
        1 if rest.len() >= 8 => Ok(f(&[], 0, &rest[8..])),
        5 if rest.len() >= 4 => Ok(f(&[], 0, &rest[4..])),
        w => Err(format!("unsupported protobuf wire type {w}")),
    }
}

fn varint(buf: &[u8]) -> Result<(u64, &[u8]), String> {
    let mut v = 0u64;
    for (i, b) in buf.iter().enumerate().take(10) {
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((v, &buf[i + 1..]));
        }
    }
    Err("bad protobuf varint".into())
}

/// `StatusResponse { RuntimeStatus status = 1; }`, `RuntimeStatus { repeated
/// RuntimeCondition conditions = 1; }`, `RuntimeCondition { string type = 1; bool status = 2;
/// string reason = 3; string message = 4; }`.
fn status_response(mut buf: &[u8]) -> Result<Vec<Condition>, String> {
    let mut out = Vec::new();
    while !buf.is_empty() {
        let top = field(buf)?;
        if top.num == 1 && top.wire == 2 {
            let mut rs = top.bytes;
            while !rs.is_empty() {
                let c = field(rs)?;
                if c.num == 1 && c.wire == 2 {
                    out.push(condition(c.bytes)?);
                }
                rs = c.rest;
            }
        }
        buf = top.rest;
    }
    Ok(out)
}

fn condition(mut buf: &[u8]) -> Result<Condition, String> {
    let mut c = Condition {
        kind: String::new(),
        status: false,
        reason: String::new(),
        message: String::new(),
    };
    while !buf.is_empty() {
        let f = field(buf)?;
        let text = || String::from_utf8_lossy(f.bytes).into_owned();
        match f.num {
            1 => c.kind = text(),
            2 => c.status = f.value != 0,
            3 => c.reason = text(),
            4 => c.message = text(),
            _ => {}
        }
        buf = f.rest;
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_response_decodes() {
        // conditions: {RuntimeReady, true}, {NetworkReady, false, "NetworkPluginNotReady", "cni"}
        let mut c1 = vec![0x0a, 12];
        c1.extend_from_slice(b"RuntimeReady");
        c1.extend_from_slice(&[0x10, 1]);
        let mut c2 = vec![0x0a, 12];
        c2.extend_from_slice(b"NetworkReady");
        c2.extend_from_slice(&[0x10, 0, 0x1a, 21]);
        c2.extend_from_slice(b"NetworkPluginNotReady");
        c2.extend_from_slice(&[0x22, 3]);
        c2.extend_from_slice(b"cni");
        let mut rs = vec![0x0a, c1.len() as u8];
        rs.extend_from_slice(&c1);
        rs.push(0x0a);
        rs.push(c2.len() as u8);
        rs.extend_from_slice(&c2);
        let mut resp = vec![0x0a, rs.len() as u8];
        resp.extend_from_slice(&rs);
        let got = status_response(&resp).unwrap();
        assert_eq!(got.len(), 2);
        assert!(got[0].status && got[0].kind == "RuntimeReady");
        assert!(
            !got[1].status && got[1].reason == "NetworkPluginNotReady" && got[1].message == "cni"
        );
        assert!(status_response(&[0x0a, 50, 1]).is_err());
        assert!(status_response(&[0x0f]).is_err());
    }
}
