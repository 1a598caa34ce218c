//! Reads a TLS server's certificate chain without a TLS library: in TLS 1.2 the server's
//! `Certificate` message travels in the clear after `ServerHello` (RFC 5246 §7.3, §7.4.2),
//! so a `ClientHello` that offers only TLS 1.2 and reading until that message is enough.
//! Nothing is encrypted, no key is agreed, and the connection is closed before the
//! handshake ends. kube-apiserver accepts TLS 1.2 unless `--tls-min-version=VersionTLS13`
//! (k8s.io/component-base/cli/flag/ciphersuites_flag.go; Go's crypto/tls default minimum for
//! servers is TLS 1.2), and a server that only speaks TLS 1.3 is reported as such.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::x509::{self, Cert};

/// The most handshake bytes read before giving up: a chain of a few certificates is far less.
const MAX_HANDSHAKE: usize = 256 * 1024;

/// Why no chain could be read.
#[derive(Debug)]
pub enum TlsError {
    /// No TCP connection (DNS, refused, timeout).
    Connect(String),
    /// Connected, but the TLS exchange failed (alert, TLS 1.3 only, not TLS at all).
    Handshake(String),
}

/// Connects to `host:port` within `timeout` and returns the certificates the server sent,
/// leaf first.
pub fn server_chain(host: &str, port: u16, timeout: Duration) -> Result<Vec<Cert>, TlsError> {
    let bare = host.trim_matches(['[', ']']);
    let addrs = resolve(bare, port, timeout)?;
    let mut last = format!("{bare} resolves to no address");
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("cannot connect to {addr}: {e}"),
        }
    }
    let mut stream = stream.ok_or(TlsError::Connect(last))?;
    let hs = |e: std::io::Error| TlsError::Handshake(format!("{e}"));
    stream.set_read_timeout(Some(timeout)).map_err(hs)?;
    stream.set_write_timeout(Some(timeout)).map_err(hs)?;
    let sni = if bare.parse::<std::net::IpAddr>().is_ok() {
        None
    } else {
        Some(bare)
    };
    stream.write_all(&client_hello(sni)).map_err(hs)?;
    // A server that trickles bytes must not hold doctor longer than twice its timeout.
    read_chain(&mut Deadline {
        inner: stream,
        until: std::time::Instant::now() + timeout * 2,
    })
}

/// Resolves `host` within `timeout`: the system resolver has no timeout of its own to set.
fn resolve(
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<Vec<std::net::SocketAddr>, TlsError> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![(ip, port).into()]);
    }
    // Polled, not received over a channel: an mpsc channel of this result type costs the
    // static binary about 3 KiB of code, and a few milliseconds do not matter here.
    type Answer = std::io::Result<Vec<std::net::SocketAddr>>;
    let answer: Arc<Mutex<Option<Answer>>> = Arc::default();
    let lookup = {
        let (name, answer) = (host.to_string(), Arc::clone(&answer));
        crate::service::detach(Box::new(move || {
            let found = (name.as_str(), port)
                .to_socket_addrs()
                .map(Iterator::collect);
            if let Ok(mut a) = answer.lock() {
                *a = Some(found);
            }
        }))
    };
    let until = std::time::Instant::now() + timeout;
    while !lookup.is_finished() && std::time::Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    // A lookup still running is left behind (its thread ends with the process).
    match answer.lock().ok().and_then(|mut a| a.take()) {
        Some(Ok(a)) => Ok(a),
        Some(Err(e)) => Err(TlsError::Connect(format!("cannot resolve {host}: {e}"))),
        None => Err(TlsError::Connect(format!(
            "cannot resolve {host}: no answer within {} s",
            timeout.as_secs()
        ))),
    }
}

/// A reader that fails once `until` has passed.
struct Deadline<R> {
    inner: R,
    until: std::time::Instant,
}

impl<R: Read> Read for Deadline<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if std::time::Instant::now() > self.until {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the handshake took too long",
            ));
        }
        self.inner.read(buf)
    }
}

/// Reads records until the `Certificate` handshake message and parses it.
pub fn read_chain(stream: &mut impl Read) -> Result<Vec<Cert>, TlsError> {
    let fail = |m: String| TlsError::Handshake(m);
    let mut hs: Vec<u8> = Vec::new();
    let mut saw_hello = false;
    loop {
        let mut head = [0u8; 5];
        stream.read_exact(&mut head).map_err(|e| {
            fail(if hs.is_empty() && !saw_hello {
                format!("the server closed or sent nothing TLS-shaped: {e}")
            } else {
                format!("truncated handshake: {e}")
            })
        })?;
        let len = usize::from(u16::from_be_bytes([head[3], head[4]]));
        if head[1] != 3 || len > 18_432 {
            return Err(fail(format!(
                "not a TLS record (first bytes {:02x} {:02x} {:02x}): is this port TLS?",
                head[0], head[1], head[2]
            )));
        }
        let mut body = vec![0u8; len];
        stream
            .read_exact(&mut body)
            .map_err(|e| fail(format!("truncated TLS record: {e}")))?;
        match head[0] {
            21 => {
                let desc = body.get(1).copied().unwrap_or(0);
                return Err(fail(match desc {
                    70 => "the server refused TLS 1.2 (alert protocol_version): it speaks only TLS 1.3, whose certificates doctor cannot read".into(),
                    40 => "the server refused the handshake (alert handshake_failure): no cipher suite in common".into(),
                    112 => "the server does not know the name sent (alert unrecognized_name)".into(),
                    d => format!("the server sent TLS alert {d}"),
                }));
            }
            22 => hs.extend_from_slice(&body),
            t => {
                return Err(fail(format!(
                    "unexpected TLS record type {t} before the certificate"
                )))
            }
        }
        if hs.len() > MAX_HANDSHAKE {
            return Err(fail(format!(
                "no certificate in the first {MAX_HANDSHAKE} handshake bytes"
            )));
        }
        // Walk whole handshake messages.
        let mut at = 0;
        while hs.len() >= at + 4 {
            let mlen = (usize::from(hs[at + 1]) << 16)
                | (usize::from(hs[at + 2]) << 8)
                | usize::from(hs[at + 3]);
            if hs.len() < at + 4 + mlen {
                break;
            }
            let msg = &hs[at + 4..at + 4 + mlen];
            match hs[at] {
                2 => {
                    saw_hello = true;
                    if msg.len() >= 2 && msg[..2] != [3, 3] {
                        return Err(fail(format!(
                            "the server chose TLS version {}.{}, not 1.2",
                            msg[0], msg[1]
                        )));
                    }
                }
                11 => return certificate_message(msg).map_err(fail),
                14 => return Err(fail("the server sent no certificate".into())),
                _ => {}
            }
            at += 4 + mlen;
        }
    }
}

/// The chain of a `Certificate` message (RFC 5246 §7.4.2).
fn certificate_message(msg: &[u8]) -> Result<Vec<Cert>, String> {
    let u24 = |b: &[u8]| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]);
    if msg.len() < 3 || u24(msg) != msg.len() - 3 {
        return Err("malformed Certificate message".into());
    }
    let mut rest = &msg[3..];
    let mut chain = Vec::new();
    while !rest.is_empty() {
        if rest.len() < 3 || rest.len() - 3 < u24(rest) {
            return Err("malformed certificate entry".into());
        }
        let n = u24(rest);
        let cert = x509::parse(&rest[3..3 + n])
            .map_err(|e| format!("certificate {} of the chain: {e}", chain.len() + 1))?;
        chain.push(cert);
        rest = &rest[3 + n..];
    }
    if chain.is_empty() {
        return Err("the server sent an empty certificate chain".into());
    }
    Ok(chain)
}

/// A TLS 1.2 `ClientHello` (RFC 5246 §7.4.1.2) offering the ECDHE/RSA AES-GCM and
/// ChaCha20 suites Go's crypto/tls servers prefer, with SNI (RFC 6066 §3) when a name is given.
fn client_hello(sni: Option<&str>) -> Vec<u8> {
    const SUITES: [u16; 10] = [
        0xc02b, 0xc02f, 0xc02c, 0xc030, 0xcca9, 0xcca8, 0x009c, 0x009d, 0x002f, 0x0035,
    ];
    let mut ext: Vec<u8> = Vec::new();
    let mut push_ext = |ty: u16, data: &[u8]| {
        ext.extend_from_slice(&ty.to_be_bytes());
        ext.extend_from_slice(&(data.len() as u16).to_be_bytes());
        ext.extend_from_slice(data);
    };
    if let Some(name) = sni {
        let n = name.as_bytes();
        let mut d = Vec::new();
        d.extend_from_slice(&((n.len() + 3) as u16).to_be_bytes());
        d.push(0); // host_name
        d.extend_from_slice(&(n.len() as u16).to_be_bytes());
        d.extend_from_slice(n);
        push_ext(0, &d);
    }
    // supported_groups: x25519, secp256r1, secp384r1.
    push_ext(10, &[0, 6, 0, 0x1d, 0, 0x17, 0, 0x18]);
    // ec_point_formats: uncompressed.
    push_ext(11, &[1, 0]);
    // signature_algorithms: rsa_pss_rsae_sha256/384/512, rsa_pkcs1_sha256/384/512,
    // ecdsa_secp256r1_sha256, secp384r1_sha384, ed25519.
    let algs: [u16; 9] = [
        0x0804, 0x0805, 0x0806, 0x0401, 0x0501, 0x0601, 0x0403, 0x0503, 0x0807,
    ];
    let mut d = ((algs.len() * 2) as u16).to_be_bytes().to_vec();
    for a in algs {
        d.extend_from_slice(&a.to_be_bytes());
    }
    push_ext(13, &d);
    push_ext(23, &[]); // extended_master_secret
    push_ext(0xff01, &[0]); // renegotiation_info, empty

    let mut hello = vec![3, 3];
    let seed = crate::fsutil::random_u64();
    for i in 0..4u64 {
        hello.extend_from_slice(&(seed.rotate_left(i as u32 * 16) ^ i).to_be_bytes());
    }
    hello.push(0); // no session id
    hello.extend_from_slice(&((SUITES.len() * 2) as u16).to_be_bytes());
    for s in SUITES {
        hello.extend_from_slice(&s.to_be_bytes());
    }
    hello.extend_from_slice(&[1, 0]); // compression: null
    hello.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    hello.extend_from_slice(&ext);

    let mut msg = vec![1];
    msg.extend_from_slice(&(hello.len() as u32).to_be_bytes()[1..]);
    msg.extend_from_slice(&hello);
    let mut rec = vec![22, 3, 1];
    rec.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    rec.extend_from_slice(&msg);
    rec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_resolves_on_its_thread_and_an_address_needs_none() {
        // localhost comes from the hosts file: nothing leaves the machine.
        let a = resolve("localhost", 6443, Duration::from_secs(10)).expect("localhost");
        assert!(!a.is_empty() && a.iter().all(|s| s.ip().is_loopback() && s.port() == 6443));
        let a = resolve("127.0.0.1", 443, Duration::ZERO).expect("an address");
        assert_eq!(a, [std::net::SocketAddr::from(([127, 0, 0, 1], 443))]);
    }

    #[test]
    fn hostile_records_are_refused_without_panicking() {
        let cases: [&[u8]; 5] = [
            b"HTTP/1.1 400 Bad Request\r\n\r\n",
            &[22, 3, 3, 0, 4, 11, 0, 0, 9],
            &[21, 3, 3, 0, 2, 2, 70],
            &[22, 3, 3, 0, 10, 11, 0, 0, 6, 0, 0, 3, 0, 0, 3],
            &[],
        ];
        for c in cases {
            let mut r = c;
            assert!(read_chain(&mut r).is_err(), "{c:?}");
        }
    }

    #[test]
    fn the_hello_is_one_well_formed_record() {
        let h = client_hello(Some("api.example.com"));
        assert_eq!(&h[..3], &[22, 3, 1]);
        assert_eq!(usize::from(u16::from_be_bytes([h[3], h[4]])), h.len() - 5);
        assert_eq!(h[5], 1);
        let body = (usize::from(h[6]) << 16) | (usize::from(h[7]) << 8) | usize::from(h[8]);
        assert_eq!(body, h.len() - 9);
        assert!(h.windows(15).any(|w| w == b"api.example.com"));
    }
}
