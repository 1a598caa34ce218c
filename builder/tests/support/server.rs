//! A loopback HTTP/1.1 file server (127.0.0.1, port 0) standing in for upstream download sites
//! and mirrors, with faults on demand: connection resets mid-body, truncation, wrong bytes,
//! error statuses, slow and stalled bodies, and a server that ignores Range. It counts the body
//! bytes it sends, so resume tests can measure what crossed the wire.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A misbehaviour for one request (queued) or every request (`always`).
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this status and a short body.
    Status(u16),
    /// Send headers and this many body bytes, then reset the connection (RST).
    ResetAfter(usize),
    /// Send headers and this many body bytes, then close cleanly (FIN): a truncated body.
    TruncateAfter(usize),
    /// Send the right length with every byte inverted.
    WrongBytes,
    /// Answer 200 with the whole file even when a Range was asked for.
    IgnoreRange,
    /// Send the body in `chunk`-byte pieces with `delay_ms` between them.
    Slow { chunk: usize, delay_ms: u64 },
    /// Send headers and this many bytes, then nothing for `ms` milliseconds, then close.
    Stall { after: usize, ms: u64 },
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub path: String,
    pub range_start: Option<u64>,
    pub status: u16,
}

#[derive(Default)]
struct State {
    files: Mutex<HashMap<String, Arc<Vec<u8>>>>,
    queued: Mutex<HashMap<String, VecDeque<Fault>>>,
    always: Mutex<HashMap<String, Fault>>,
    sent: AtomicU64,
    log: Mutex<Vec<Seen>>,
    stop: AtomicBool,
}

/// The running server; stops when dropped.
pub struct Server {
    pub addr: SocketAddr,
    state: Arc<State>,
}

impl Server {
    pub fn start() -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State::default());
        let st = state.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let st = st.clone();
                std::thread::spawn(move || {
                    let _ = serve(conn, &st);
                });
            }
        });
        Server { addr, state }
    }

    /// `http://127.0.0.1:PORT`
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves `bytes` at `path` (which starts with `/`).
    pub fn add(&self, path: &str, bytes: Vec<u8>) {
        self.state
            .files
            .lock()
            .unwrap()
            .insert(path.into(), Arc::new(bytes));
    }

    /// Queues a fault for the next request to `path`.
    pub fn fault(&self, path: &str, f: Fault) {
        self.state
            .queued
            .lock()
            .unwrap()
            .entry(path.into())
            .or_default()
            .push_back(f);
    }

    /// Applies a fault to every request to `path` that has no queued fault.
    pub fn always(&self, path: &str, f: Fault) {
        self.state.always.lock().unwrap().insert(path.into(), f);
    }

    /// Removes the `always` fault of `path`.
    pub fn heal(&self, path: &str) {
        self.state.always.lock().unwrap().remove(path);
    }

    /// Body bytes sent so far, over all requests.
    pub fn bytes_sent(&self) -> u64 {
        self.state.sent.load(Ordering::SeqCst)
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Seen> {
        self.state.log.lock().unwrap().clone()
    }

    /// Requests so far to `path`.
    pub fn hits(&self, path: &str) -> usize {
        self.log().iter().filter(|s| s.path == path).count()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
    }
}

/// Resets a connection (RST) instead of closing it cleanly.
pub fn reset_conn(conn: &TcpStream) {
    reset(conn)
}

fn reset(conn: &TcpStream) {
    use std::os::unix::io::AsRawFd;
    let l = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt reads `l` for the duration of the call on an open socket.
    unsafe {
        libc::setsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

fn serve(conn: TcpStream, st: &State) -> std::io::Result<()> {
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let path = line.split_whitespace().nth(1).unwrap_or("/").to_string();
    let mut range_start = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h == "\r\n" || h == "\n" {
            break;
        }
        let lower = h.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("range:") {
            range_start = v
                .trim()
                .strip_prefix("bytes=")
                .and_then(|r| r.split('-').next())
                .and_then(|s| s.parse::<u64>().ok());
        }
    }
    let fault = {
        let mut q = st.queued.lock().unwrap();
        q.get_mut(&path)
            .and_then(|d| d.pop_front())
            .or_else(|| st.always.lock().unwrap().get(&path).cloned())
    };
    let file = st.files.lock().unwrap().get(&path).cloned();
    let mut w = conn;
    let log = |status: u16| {
        st.log.lock().unwrap().push(Seen {
            path: path.clone(),
            range_start,
            status,
        })
    };
    if let Some(Fault::Status(code)) = fault {
        log(code);
        let body = format!("fault {code}\n");
        write!(
            w,
            "HTTP/1.1 {code} Fault\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        return Ok(());
    }
    let Some(file) = file else {
        log(404);
        write!(
            w,
            "HTTP/1.1 404 Not Found\r\nContent-Length: 10\r\nConnection: close\r\n\r\nnot found\n"
        )?;
        return Ok(());
    };
    let total = file.len() as u64;
    let honour_range = !matches!(fault, Some(Fault::IgnoreRange));
    let (status, start) = match range_start {
        Some(s) if honour_range && s < total => (206, s),
        Some(s) if honour_range && s >= total => {
            log(416);
            write!(w, "HTTP/1.1 416 Range Not Satisfiable\r\nContent-Range: bytes */{total}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")?;
            return Ok(());
        }
        _ => (200, 0),
    };
    log(status);
    let body: Vec<u8> = if matches!(fault, Some(Fault::WrongBytes)) {
        file[start as usize..].iter().map(|b| !b).collect()
    } else {
        file[start as usize..].to_vec()
    };
    let mut head = format!(
        "HTTP/1.1 {status} {}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nAccept-Ranges: bytes\r\nConnection: close\r\n",
        if status == 206 { "Partial Content" } else { "OK" },
        body.len()
    );
    if status == 206 {
        head.push_str(&format!(
            "Content-Range: bytes {start}-{}/{total}\r\n",
            total - 1
        ));
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())?;
    let send = |w: &mut TcpStream, b: &[u8]| -> std::io::Result<()> {
        w.write_all(b)?;
        st.sent.fetch_add(b.len() as u64, Ordering::SeqCst);
        Ok(())
    };
    match fault {
        Some(Fault::ResetAfter(n)) => {
            send(&mut w, &body[..n.min(body.len())])?;
            w.flush()?;
            std::thread::sleep(Duration::from_millis(20));
            reset(&w);
            drop(w);
        }
        Some(Fault::TruncateAfter(n)) => {
            send(&mut w, &body[..n.min(body.len())])?;
            w.flush()?;
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        Some(Fault::Slow { chunk, delay_ms }) => {
            for c in body.chunks(chunk.max(1)) {
                send(&mut w, c)?;
                std::thread::sleep(Duration::from_millis(delay_ms));
            }
        }
        Some(Fault::Stall { after, ms }) => {
            send(&mut w, &body[..after.min(body.len())])?;
            w.flush()?;
            std::thread::sleep(Duration::from_millis(ms));
        }
        _ => {
            for c in body.chunks(64 * 1024) {
                send(&mut w, c)?;
            }
        }
    }
    Ok(())
}
