//! The pure HTTP/1.x response parser ([`parse_response`]): status line, headers, chunked and
//! content-length bodies, with caps. Tests and the fuzzer drive it directly.

use std::fmt;

/// Largest header block accepted.
pub const MAX_HEADER: usize = 16 * 1024;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::MAX_BODY;

    // From wait.rs, whose own HTTP code this client replaced (Go's net/http chunks small
    // handler bodies, so kubelet's healthz answer can come that way).
    #[test]
    fn dechunk_joins_chunks() {
        let raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n3\r\n!!!\r\n0\r\n\r\n";
        let resp = parse_response(raw, false, MAX_BODY).unwrap().unwrap();
        assert_eq!(resp.body, b"ok!!!");
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
