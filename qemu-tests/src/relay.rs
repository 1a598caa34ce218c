//! The guestfwd relay: copies QEMU's stdin/stdout (one guest TCP connection) to and from a
//! TCP connection to a loopback server, so a guest's requests to 169.254.169.254 reach the
//! test's in-process metadata server and nothing else.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpStream};
use std::time::Duration;

/// Why the relay could not join the guest's connection to the server.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The command line was not `HOST PORT`.
    #[error("usage: kiln-qemu-relay HOST PORT (got {0:?})")]
    Usage(Vec<String>),
    /// Only loopback targets are allowed: the relay must never reach a real network.
    #[error("refusing to relay to {0}: only 127.0.0.0/8 and ::1 are allowed")]
    NotLoopback(IpAddr),
    /// The loopback server did not accept the connection.
    #[error("connecting to {addr}: {source}")]
    Connect {
        /// The server address.
        addr: SocketAddr,
        /// The socket error.
        source: io::Error,
    },
    /// Copying bytes failed midway.
    #[error("relaying to {addr}: {source}")]
    Copy {
        /// The server address.
        addr: SocketAddr,
        /// The I/O error.
        source: io::Error,
    },
}

/// Parses `HOST PORT`, refusing anything that is not a loopback address.
pub fn parse_target(args: &[String]) -> Result<SocketAddr, RelayError> {
    let [host, port] = args else {
        return Err(RelayError::Usage(args.to_vec()));
    };
    let ip: IpAddr = host.parse().map_err(|_| RelayError::Usage(args.to_vec()))?;
    let port: u16 = port.parse().map_err(|_| RelayError::Usage(args.to_vec()))?;
    if !ip.is_loopback() {
        return Err(RelayError::NotLoopback(ip));
    }
    Ok(SocketAddr::new(ip, port))
}

/// Runs the relay on this process's stdin and stdout until both directions are done.
pub fn run(args: &[String]) -> Result<(), RelayError> {
    let addr = parse_target(args)?;
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|source| RelayError::Connect { addr, source })?;
    let mut upstream = stream
        .try_clone()
        .map_err(|source| RelayError::Copy { addr, source })?;
    // Guest → server on a thread; when the guest closes its side, half-close ours so the
    // server sees the end of the request.
    let to_server = std::thread::spawn(move || {
        let copied = io::copy(&mut io::stdin().lock(), &mut upstream);
        let _ = upstream.shutdown(Shutdown::Write);
        copied
    });
    let mut downstream = stream;
    copy_flushing(&mut downstream, &mut io::stdout().lock())
        .map_err(|source| RelayError::Copy { addr, source })?;
    // The server is done: the guest's unsent bytes no longer matter.
    drop(to_server);
    Ok(())
}

/// Copies like `io::copy` but flushes after every read, so the guest sees each reply chunk
/// as soon as it arrives instead of when a buffer fills.
fn copy_flushing(from: &mut impl Read, to: &mut impl Write) -> io::Result<u64> {
    let mut buf = [0u8; 16 * 1024];
    let mut total = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        to.write_all(&buf[..n])?;
        to.flush()?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_loopback_targets_are_accepted() {
        assert_eq!(
            parse_target(&args(&["127.0.0.1", "8080"])).unwrap(),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert!(parse_target(&args(&["::1", "80"])).is_ok());
        for bad in [
            &["169.254.169.254", "80"][..],
            &["10.0.2.2", "80"],
            &["0.0.0.0", "80"],
        ] {
            assert!(
                matches!(parse_target(&args(bad)), Err(RelayError::NotLoopback(_))),
                "{bad:?} must be refused"
            );
        }
        for bad in [
            &["127.0.0.1"][..],
            &["localhost", "80"],
            &["127.0.0.1", "x"],
        ] {
            assert!(matches!(
                parse_target(&args(bad)),
                Err(RelayError::Usage(_))
            ));
        }
    }
}
