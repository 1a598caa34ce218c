//! Queues a unit's start with systemd directly, over its private D-Bus socket, as
//! `systemctl start --no-block UNIT` does, without starting a `systemctl` process: one
//! `org.freedesktop.systemd1.Manager.StartUnit(name, "replace")` call, whose reply is the
//! queued job (systemd does not wait for the job before answering).
//!
//! The wire format is the D-Bus specification's ("Message Protocol": little-endian marshalling,
//! header fields PATH, INTERFACE, MEMBER, SIGNATURE; "Authentication Protocol": a NUL byte,
//! `AUTH EXTERNAL <hex of the uid>`, `BEGIN`). `/run/systemd/private` is systemd's own
//! peer-to-peer socket for root (what `systemctl` itself uses when run as root, systemd's
//! `src/shared/bus-util.c`, `bus_connect_system_systemd`), so no bus daemon and no `Hello`
//! are involved. Only for the node itself (`--root /` and the default `--systemctl`): a
//! test's root never reaches the host's systemd.

use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// systemd's private socket for root.
pub const PRIVATE_SOCKET: &str = "/run/systemd/private";
/// The longest a reply may take: systemd answers StartUnit once the job is queued.
const REPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// A reply larger than this is not systemd's answer to StartUnit.
const MAX_MESSAGE: usize = 1 << 16;

/// How a call failed.
#[derive(Debug, PartialEq, Eq)]
pub enum BusError {
    /// No conversation with systemd: no socket, refused authentication, a garbled or missing
    /// answer. The caller may fall back to `systemctl`.
    Unavailable(String),
    /// systemd answered with a D-Bus error: `(error name, message)`. It refused the start.
    Refused(String, String),
}

/// Queues `unit`'s start (job mode `replace`) through `socket`, by `deadline` at the latest.
pub fn start_unit(socket: &Path, unit: &str, deadline: Instant) -> Result<(), BusError> {
    let gone = |what: &str, e: io::Error| {
        BusError::Unavailable(format!("{what} {}: {e}", socket.display()))
    };
    let uid = std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .map_err(|e| BusError::Unavailable(format!("own uid from /proc/self: {e}")))?;
    let mut s = UnixStream::connect(socket).map_err(|e| gone("connecting to", e))?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .min(REPLY_TIMEOUT)
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))
        .and_then(|_| s.set_write_timeout(Some(left)))
        .map_err(|e| gone("setting timeouts on", e))?;
    // `BEGIN` goes with `AUTH`, as sd-bus's own client sends it: the call must arrive on its
    // own, after the server's `OK`. Written in one piece with `BEGIN`, systemd's server
    // reads it into its authentication buffer, switches to running and leaves it there
    // unprocessed until more bytes arrive (seen: a boot waited out the reply timeout).
    s.write_all(&auth_request(uid))
        .map_err(|e| gone("authenticating to", e))?;
    let answer = read_line(&mut s).map_err(|e| gone("reading the AUTH answer from", e))?;
    if !answer.starts_with("OK ") {
        return Err(BusError::Unavailable(format!(
            "{}: authentication refused: {answer:?}",
            socket.display()
        )));
    }
    s.write_all(&start_unit_call(1, unit))
        .map_err(|e| gone("calling StartUnit on", e))?;
    // The timeouts bound each read; this bounds the whole wait, however many other messages
    // a peer sends.
    let give_up = Instant::now() + left;
    loop {
        if Instant::now() >= give_up {
            return Err(BusError::Unavailable(format!(
                "{}: no reply to StartUnit within {} ms",
                socket.display(),
                left.as_millis() as u64
            )));
        }
        let (header, body) = read_message(&mut s).map_err(|e| gone("reading the reply from", e))?;
        let reply = parse_reply(&header, &body)
            .map_err(|m| BusError::Unavailable(format!("{}: {m}", socket.display())))?;
        match reply {
            // Not ours (systemd sends nothing else unasked, but a stray message is skipped).
            Reply::Other => continue,
            Reply::Return => return Ok(()),
            Reply::Error(name, message) => return Err(BusError::Refused(name, message)),
        }
    }
}

/// The client's side of the authentication: the NUL byte, `AUTH EXTERNAL` with the uid as
/// decimal digits, hex-encoded, and `BEGIN`.
fn auth_request(uid: u32) -> Vec<u8> {
    let hex: String = uid
        .to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\0AUTH EXTERNAL {hex}\r\nBEGIN\r\n").into_bytes()
}

/// One `\r\n`-ended line of the authentication conversation, read a byte at a time (what
/// follows it is binary).
fn read_line(s: &mut impl Read) -> io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        if line.len() > 512 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
        }
        s.read_exact(&mut b)?;
        line.push(b[0]);
    }
    line.truncate(line.len() - 2);
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// Little-endian marshalling into a message, aligned from its start.
struct Marshal(Vec<u8>);

impl Marshal {
    fn pad(&mut self, align: usize) {
        while !self.0.len().is_multiple_of(align) {
            self.0.push(0);
        }
    }
    fn u32(&mut self, v: u32) {
        self.pad(4);
        self.0.extend(v.to_le_bytes());
    }
    /// STRING and OBJECT_PATH: length, bytes, NUL.
    fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend(s.as_bytes());
        self.0.push(0);
    }
    /// SIGNATURE: one length byte, bytes, NUL.
    fn signature(&mut self, s: &str) {
        self.0.push(s.len() as u8);
        self.0.extend(s.as_bytes());
        self.0.push(0);
    }
    /// One header field: a struct (8-aligned) of the field code and a variant.
    fn field(&mut self, code: u8, sig: &str, value: &str) {
        self.pad(8);
        self.0.push(code);
        self.signature(sig);
        if sig == "g" {
            self.signature(value);
        } else {
            self.string(value);
        }
    }
}

/// The METHOD_CALL message `StartUnit(unit, "replace")` with serial `serial`.
fn start_unit_call(serial: u32, unit: &str) -> Vec<u8> {
    let mut body = Marshal(Vec::new());
    body.string(unit);
    body.string("replace");
    let mut m = Marshal(vec![b'l', 1, 0, 1]);
    m.u32(body.0.len() as u32);
    m.u32(serial);
    let mut fields = Marshal(Vec::new());
    // Fields are marshalled at their final offsets: the array starts at 16 (after its
    // length at 12), which is 8-aligned, so aligning within `fields` is the same.
    fields.field(1, "o", "/org/freedesktop/systemd1");
    fields.field(2, "s", "org.freedesktop.systemd1.Manager");
    fields.field(3, "s", "StartUnit");
    fields.field(6, "s", "org.freedesktop.systemd1");
    fields.field(8, "g", "ss");
    m.u32(fields.0.len() as u32);
    m.0.extend(fields.0);
    m.pad(8);
    m.0.extend(body.0);
    m.0
}

/// Reads one message: its header (fixed part and fields, without the padding) and body.
fn read_message(s: &mut impl Read) -> io::Result<(Vec<u8>, Vec<u8>)> {
    let bad = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let mut fixed = [0u8; 16];
    s.read_exact(&mut fixed)?;
    if fixed[0] != b'l' && fixed[0] != b'B' {
        return Err(bad("not a D-Bus message (endianness byte)"));
    }
    let u = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if fixed[0] == b'l' {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let body_len = u(&fixed[4..8]) as usize;
    let fields_len = u(&fixed[12..16]) as usize;
    if body_len > MAX_MESSAGE || fields_len > MAX_MESSAGE {
        return Err(bad("message larger than a StartUnit reply can be"));
    }
    let padded = (16 + fields_len).div_ceil(8) * 8;
    let mut rest = vec![0u8; padded - 16 + body_len];
    s.read_exact(&mut rest)?;
    let mut header = fixed.to_vec();
    header.extend(&rest[..fields_len]);
    let body = rest[padded - 16..].to_vec();
    Ok((header, body))
}

#[derive(Debug, PartialEq, Eq)]
enum Reply {
    /// The METHOD_RETURN to our call: the job is queued.
    Return,
    /// The ERROR reply to our call: name and first string argument.
    Error(String, String),
    /// Anything else.
    Other,
}

/// Reads a message's type, REPLY_SERIAL and ERROR_NAME, and an error's message.
fn parse_reply(header: &[u8], body: &[u8]) -> Result<Reply, String> {
    let little = header[0] == b'l';
    let u = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if little {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let kind = header[1];
    let (mut reply_serial, mut error_name) = (None, None);
    let mut at = 16;
    let short = || "a header field runs past the header".to_string();
    while at < header.len() {
        at = at.div_ceil(8) * 8;
        if at >= header.len() {
            break;
        }
        let code = header[at];
        let sig_len = *header.get(at + 1).ok_or_else(short)? as usize;
        let sig = header.get(at + 2..at + 2 + sig_len).ok_or_else(short)?;
        at += 3 + sig_len;
        match sig {
            b"u" => {
                at = at.div_ceil(4) * 4;
                let v = u(header.get(at..at + 4).ok_or_else(short)?);
                if code == 5 {
                    reply_serial = Some(v);
                }
                at += 4;
            }
            b"s" | b"o" => {
                at = at.div_ceil(4) * 4;
                let n = u(header.get(at..at + 4).ok_or_else(short)?) as usize;
                let s = header.get(at + 4..at + 4 + n).ok_or_else(short)?;
                if code == 4 {
                    error_name = Some(String::from_utf8_lossy(s).into_owned());
                }
                at += 4 + n + 1;
            }
            b"g" => {
                let n = *header.get(at).ok_or_else(short)? as usize;
                at += 1 + n + 1;
            }
            other => {
                return Err(format!(
                    "header field {code} has an unexpected type {:?}",
                    String::from_utf8_lossy(other)
                ))
            }
        }
    }
    if reply_serial != Some(1) {
        return Ok(Reply::Other);
    }
    match kind {
        2 => Ok(Reply::Return),
        3 => {
            let message = (body.len() >= 4)
                .then(|| u(&body[..4]) as usize)
                .and_then(|n| body.get(4..4 + n))
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .unwrap_or_default();
            Ok(Reply::Error(
                error_name.unwrap_or_else(|| "(no error name)".into()),
                message,
            ))
        }
        _ => Ok(Reply::Other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The call, byte for byte as the D-Bus specification lays it out.
    #[test]
    fn the_call_is_marshalled_as_the_specification_says() {
        let m = start_unit_call(1, "kubelet.service");
        // Fixed header: little-endian, METHOD_CALL, no flags, version 1.
        assert_eq!(&m[..4], b"l\x01\x00\x01");
        let body_len = u32::from_le_bytes(m[4..8].try_into().unwrap()) as usize;
        assert_eq!(u32::from_le_bytes(m[8..12].try_into().unwrap()), 1);
        let fields_len = u32::from_le_bytes(m[12..16].try_into().unwrap()) as usize;
        // The body starts 8-aligned after the fields; the message ends with it.
        let body_at = (16 + fields_len).div_ceil(8) * 8;
        assert_eq!(m.len(), body_at + body_len);
        // Body: "kubelet.service" (15 bytes, NUL, padded to 4), then "replace".
        let mut want = 15u32.to_le_bytes().to_vec();
        want.extend(b"kubelet.service\0");
        want.extend(7u32.to_le_bytes());
        want.extend(b"replace\0");
        assert_eq!(&m[body_at..], &want[..]);
        // The first field: PATH, signature "o", the path (length at offset 20).
        assert_eq!(&m[16..20], b"\x01\x01o\x00");
        assert_eq!(u32::from_le_bytes(m[20..24].try_into().unwrap()), 25);
        assert_eq!(&m[24..50], b"/org/freedesktop/systemd1\0");
        // Our own parser reads our own header back: five fields, no reply serial.
        assert_eq!(
            parse_reply(&m[..16 + fields_len], &m[body_at..]),
            Ok(Reply::Other)
        );
        assert_eq!(auth_request(0), b"\0AUTH EXTERNAL 30\r\nBEGIN\r\n");
        assert_eq!(auth_request(1000), b"\0AUTH EXTERNAL 31303030\r\nBEGIN\r\n");
    }

    /// A reply as systemd sends it: METHOD_RETURN or ERROR with REPLY_SERIAL 1.
    fn reply(kind: u8, error: Option<(&str, &str)>) -> Vec<u8> {
        reply_to(1, kind, error)
    }

    /// [`reply`] to the call with serial `serial`.
    fn reply_to(serial: u32, kind: u8, error: Option<(&str, &str)>) -> Vec<u8> {
        let mut body = Marshal(Vec::new());
        if let Some((_, msg)) = error {
            body.string(msg);
        } else {
            body.string("/org/freedesktop/systemd1/job/42");
        }
        let mut m = Marshal(vec![b'l', kind, 1, 1]);
        m.u32(body.0.len() as u32);
        m.u32(7);
        let mut fields = Marshal(Vec::new());
        fields.pad(8);
        fields.0.push(5);
        fields.signature("u");
        fields.u32(serial);
        if let Some((name, _)) = error {
            fields.field(4, "s", name);
        }
        fields.field(8, "g", if error.is_some() { "s" } else { "o" });
        m.u32(fields.0.len() as u32);
        m.0.extend(fields.0);
        m.pad(8);
        m.0.extend(body.0);
        m.0
    }

    #[test]
    fn replies_are_read_and_told_apart() {
        let ok = reply(2, None);
        let (h, b) = read_message(&mut &ok[..]).unwrap();
        assert_eq!(parse_reply(&h, &b), Ok(Reply::Return));
        let err = reply(
            3,
            Some((
                "org.freedesktop.systemd1.NoSuchUnit",
                "Unit kubelet.service not found.",
            )),
        );
        let (h, b) = read_message(&mut &err[..]).unwrap();
        assert_eq!(
            parse_reply(&h, &b),
            Ok(Reply::Error(
                "org.freedesktop.systemd1.NoSuchUnit".into(),
                "Unit kubelet.service not found.".into()
            ))
        );
        // Truncated, oversized and foreign input is an error, never a success.
        assert!(read_message(&mut &ok[..ok.len() - 1]).is_err());
        let mut big = ok.clone();
        big[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
        assert!(read_message(&mut &big[..]).is_err());
        assert!(read_message(&mut &b"HTTP/1.1 200 OK\r\n\r\n"[..]).is_err());
    }

    /// The whole conversation against a peer on a socket pair: what it reads is the
    /// specification's sequence; what it answers decides the result.
    #[test]
    fn a_conversation_over_a_socket() {
        let dir = std::env::temp_dir().join(format!("kiln-bus-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        for (answer, want) in [
            (reply(2, None), Ok(())),
            (
                reply(
                    3,
                    Some(("org.freedesktop.DBus.Error.AccessDenied", "denied")),
                ),
                Err(BusError::Refused(
                    "org.freedesktop.DBus.Error.AccessDenied".into(),
                    "denied".into(),
                )),
            ),
        ] {
            let path = dir.join("private");
            let _ = std::fs::remove_file(&path);
            let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
            let peer = std::thread::spawn(move || {
                let (mut c, _) = listener.accept().unwrap();
                let mut nul = [0u8; 1];
                c.read_exact(&mut nul).unwrap();
                assert_eq!(nul, [0]);
                let auth = read_line(&mut c).unwrap();
                assert!(auth.starts_with("AUTH EXTERNAL "), "{auth}");
                assert_eq!(read_line(&mut c).unwrap(), "BEGIN");
                c.write_all(b"OK 0123456789abcdef0123456789abcdef\r\n")
                    .unwrap();
                let (h, b) = read_message(&mut c).unwrap();
                assert_eq!(h[1], 1, "a METHOD_CALL");
                assert!(b.windows(16).any(|w| w == b"kubelet.service\0"));
                c.write_all(&answer).unwrap();
            });
            let got = start_unit(
                &path,
                "kubelet.service",
                Instant::now() + Duration::from_secs(5),
            );
            peer.join().unwrap();
            assert_eq!(got, want);
        }
        // A peer that answers everything but our call is given up on, not waited for forever.
        let path = dir.join("chatty");
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let peer = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            let _ = read_line(&mut c);
            c.write_all(b"OK 0123456789abcdef0123456789abcdef\r\n")
                .unwrap();
            for _ in 0..3 {
                let _ = c.write_all(&reply_to(9, 2, None));
            }
            std::thread::sleep(Duration::from_millis(1500));
        });
        let t = Instant::now();
        unavailable_naming(&path, "chatty");
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the deadline is the bound"
        );
        peer.join().unwrap();
        // No socket: unavailable, naming it.
        unavailable_naming(&dir.join("missing"), "missing");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A start through `socket` with a 1 s deadline is `Unavailable`, naming `name`.
    fn unavailable_naming(socket: &Path, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(1);
        match start_unit(socket, "kubelet.service", deadline) {
            Err(BusError::Unavailable(m)) => assert!(m.contains(name), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
