//! "Did it actually join?": bounded waits for kubelet's health endpoint and for the client
//! certificate that a completed TLS bootstrap leaves under `/var/lib/kubelet/pki/`.
//!
//! Both waits poll until the run's one global deadline and can end early when the caller's
//! `alive` check says kubelet has died, so a crash-looping kubelet is diagnosed at once.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::http::Client;

/// kubelet's default health endpoint (`healthzBindAddress:healthzPort`).
pub const DEFAULT_HEALTHZ_URL: &str = "http://127.0.0.1:10248/healthz";
/// Where kubelet keeps its certificates, under `--root`.
pub const DEFAULT_PKI_DIR: &str = "var/lib/kubelet/pki";
/// The client certificate kubelet writes (as a symlink to the dated file) once the API server
/// signed its CSR.
pub const CLIENT_CERT: &str = "kubelet-client-current.pem";

/// What the waits need; every location is an argument so tests point them at stand-ins.
#[derive(Debug, Clone)]
pub struct WaitOptions {
    pub healthz_url: String,
    /// The directory that receives [`CLIENT_CERT`].
    pub pki_dir: PathBuf,
    /// The pause between polls.
    pub poll: Duration,
}

impl WaitOptions {
    /// The defaults for a node whose files live under `root`.
    pub fn new(root: &Path) -> WaitOptions {
        WaitOptions {
            healthz_url: DEFAULT_HEALTHZ_URL.to_string(),
            pki_dir: root.join(DEFAULT_PKI_DIR),
            poll: Duration::from_millis(250),
        }
    }
}

/// Why a wait ended without success.
#[derive(Debug)]
pub enum WaitError {
    /// The deadline passed; `last` is the last thing seen (an HTTP status, an I/O error).
    Timeout { what: String, last: String },
    /// The caller's liveness check said kubelet is gone.
    Died { what: String, last: String },
}

impl std::fmt::Display for WaitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WaitError::Timeout { what, last } => {
                write!(
                    f,
                    "{what} did not happen before the deadline (last: {last})"
                )
            }
            WaitError::Died { what, last } => {
                write!(f, "kubelet stopped while waiting for {what} (last: {last})")
            }
        }
    }
}

impl std::error::Error for WaitError {}

/// Polls `check` until it succeeds, the deadline passes, or `alive` says kubelet is gone.
fn poll_until(
    what: String,
    deadline: Instant,
    poll: Duration,
    alive: &mut dyn FnMut() -> bool,
    mut check: impl FnMut() -> Result<(), String>,
) -> Result<u32, WaitError> {
    let mut attempts = 0;
    loop {
        attempts += 1;
        let last = match check() {
            Ok(()) => return Ok(attempts),
            Err(e) => e,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(WaitError::Timeout { what, last });
        }
        if !alive() {
            return Err(WaitError::Died { what, last });
        }
        std::thread::sleep(poll.min(deadline - now));
    }
}

/// Waits for kubelet's `/healthz` to answer `200 ok`. Returns the number of probes.
pub fn wait_healthy(
    opts: &WaitOptions,
    deadline: Instant,
    alive: &mut dyn FnMut() -> bool,
) -> Result<u32, WaitError> {
    let what = format!("kubelet health at {}", opts.healthz_url);
    poll_until(what, deadline, opts.poll, alive, || {
        probe_healthz(&opts.healthz_url, Duration::from_secs(1))
    })
}

/// Waits for the TLS bootstrap to complete: kubelet's client certificate appears.
pub fn wait_joined(
    opts: &WaitOptions,
    deadline: Instant,
    alive: &mut dyn FnMut() -> bool,
) -> Result<u32, WaitError> {
    let path = opts.pki_dir.join(CLIENT_CERT);
    let what = format!("kubelet's client certificate {}", path.display());
    poll_until(what, deadline, opts.poll, alive, || {
        check_client_cert(&path)
    })
}

/// The certificate file exists (through its symlink) and holds a PEM certificate.
pub fn check_client_cert(path: &Path) -> Result<(), String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let marker = b"-----BEGIN CERTIFICATE-----";
    if text.windows(marker.len()).any(|w| w == marker) {
        Ok(())
    } else {
        Err(format!(
            "{} exists but holds no PEM certificate ({} bytes)",
            path.display(),
            text.len()
        ))
    }
}

/// One GET of a health endpoint: `Ok` on `200` with body `ok`, else what was seen.
pub fn probe_healthz(url: &str, timeout: Duration) -> Result<(), String> {
    let resp = Client::once(timeout)
        .send("GET", url, &[])
        .map_err(|e| e.to_string())?;
    let code = resp.status;
    let body = String::from_utf8_lossy(&resp.body);
    if code == 200 && body.trim() == "ok" {
        Ok(())
    } else {
        let mut shown = String::new();
        crate::text::push_capped(&mut shown, body.trim(), 120);
        Err(format!(
            "{url} answered {code} {shown:?}, expected 200 \"ok\""
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cert_check_wants_a_pem_certificate() {
        let dir = std::env::temp_dir().join(format!("kiln-wait-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(CLIENT_CERT);
        assert!(check_client_cert(&p).unwrap_err().contains(CLIENT_CERT));
        std::fs::write(&p, "").unwrap();
        assert!(check_client_cert(&p).is_err());
        std::fs::write(
            &p,
            "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        assert!(check_client_cert(&p).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
