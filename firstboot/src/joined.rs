//! "Did it join?": the run's wait-healthy and wait-joined phases. Joined means kubelet's Node
//! exists: kubelet's client certificate, then kubelet's own `"Successfully registered node"`
//! line in its journal ([`REGISTERED`](crate::signatures::REGISTERED)). The journal reads that look for it also catch a
//! kubelet that stays up while it retries a failure forever (a wrong CA, a refused Node):
//! that is diagnosed once kubelet has logged it for [`RETRIED_FOR`], not at the deadline.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cli::Options;
use crate::config::Config;
use crate::contract::paths::NodePaths;
use crate::contract::status_json::MESSAGE_CAP;
use crate::diagnose::{self, ReportOptions};
use crate::error::Error;
use crate::reporter::{Phase, Reporter};
use crate::signatures::{match_line, registered_node, retried};
use crate::text::push_capped;
use crate::wait::{self, WaitError, WaitOptions};
use crate::Reason;

/// kubelet counts as dead when it failed, keeps restarting, or stays inactive this long
/// after its start job was queued (`--no-block` returns before the job runs).
const INACTIVE_GRACE: Duration = Duration::from_secs(10);
/// Restarts after which a kubelet is crash-looping, not starting.
const MAX_RESTARTS: u32 = 3;
/// How long a running kubelet may retry one failure before the run reports it: under 30 s
/// of kubelet's first such line, with the journal read once a second.
pub const RETRIED_FOR: Duration = Duration::from_secs(25);
/// Polls (of `WaitOptions::poll`, 200 ms) between two reads of kubelet's journal.
const LOG_EVERY: u32 = 5;
/// The journal lines each read takes: more than kubelet logs in a second at `--v=2`.
const LOG_LINES: &str = "1000";

/// Whether kubelet's unit state `u`, `waited` after the wait began, means kubelet is gone.
/// A kubelet that is inactive and has never run (`ExecMainStartTimestampMonotonic=0`) is not:
/// its start job is still queued behind containerd (kubelet.service is `After=` it), whose
/// start can outlast [`INACTIVE_GRACE`] on a slow boot; the run's deadline still bounds it.
fn kubelet_gone(u: &diagnose::UnitState, waited: Duration) -> bool {
    let never_ran = u.active_state == "inactive" && u.main_start_us == Some(0);
    u.has_died(MAX_RESTARTS)
        && !never_ran
        && (u.active_state != "inactive" || waited >= INACTIVE_GRACE)
}

/// How long each of the diagnosis's reads (`systemctl show`, `journalctl`) may take once a
/// wait failed at the deadline: at most four of them, so a wedged service manager adds
/// 8 s to the run, not the default 5 s each.
const DIAGNOSIS_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// `opts` with each command also bounded by what is left of the run's `deadline`; `None`
/// when nothing is left.
fn within(opts: &ReportOptions, deadline: Instant) -> Option<ReportOptions> {
    let left = deadline.saturating_duration_since(Instant::now());
    (!left.is_zero()).then(|| {
        let mut o = opts.clone();
        o.command_timeout = o.command_timeout.min(left);
        o
    })
}

/// Why a node with its certificate is not joined yet.
const NOT_REGISTERED: &str = "kubelet has not logged \"Successfully registered node\"";

/// What kubelet's journal said during the wait, read a window at a time.
#[derive(Debug, Default)]
pub struct LogWatch {
    /// The newest line of the last read: the next read's new lines are those after it.
    upto: Option<String>,
    /// kubelet logged its registered line, for this node name.
    pub registered: Option<String>,
    /// A failure kubelet retries: its reason, when first read, how many lines, the newest.
    retrying: Option<(Reason, Instant, u32, String)>,
}

impl LogWatch {
    /// Takes in one read of kubelet's newest lines (oldest first), read at `now`.
    pub fn observe(&mut self, lines: &[String], now: Instant) {
        let new = self
            .upto
            .as_ref()
            .and_then(|u| lines.iter().rposition(|l| l == u))
            .map_or(0, |i| i + 1);
        for l in &lines[new..] {
            if let Some(node) = registered_node(l) {
                self.registered = Some(node.to_string());
            } else if let Some(r) = match_line(l).filter(|r| retried(*r)) {
                let (since, n) = self
                    .retrying
                    .as_ref()
                    .map_or((now, 0), |(_, since, n, _)| (*since, *n));
                self.retrying = Some((r, since, n + 1, l.clone()));
            }
        }
        if let Some(last) = lines.last() {
            self.upto = Some(last.clone());
        }
    }

    /// kubelet moved on (its client certificate appeared): what it retried before is over.
    pub fn progressed(&mut self) {
        self.retrying = None;
    }

    /// A failure kubelet has logged more than once and for at least [`RETRIED_FOR`] since
    /// its first line was read: its reason and newest line.
    pub fn stuck(&self, now: Instant) -> Option<(Reason, &str)> {
        match &self.retrying {
            Some((r, since, n, line)) if *n >= 2 && now.duration_since(*since) >= RETRIED_FOR => {
                Some((*r, line))
            }
            _ => None,
        }
    }
}

/// How the wait for the Node ended without it.
enum Stop {
    Wait(WaitError),
    /// kubelet runs but keeps retrying this failure (reason, its newest line).
    Stuck(Reason, String),
}

/// Waits for kubelet's client certificate and then, where its journal can be read, for its
/// registered line. Returns the polls and the node kubelet named.
fn wait_registered(
    wopts: &WaitOptions,
    ropts: &ReportOptions,
    deadline: Instant,
    alive: &mut dyn FnMut() -> bool,
) -> Result<(u32, String), Stop> {
    let cert = wopts.pki_dir.join(wait::CLIENT_CERT);
    let journal = ropts.journalctl.is_some();
    let mut watch = LogWatch::default();
    let mut have_cert = false;
    let mut polls = 0u32;
    loop {
        polls += 1;
        let checked = wait::check_client_cert(&cert);
        let fresh = checked.is_ok() && !have_cert;
        if fresh {
            have_cert = true;
            watch.progressed();
        }
        let now = Instant::now();
        if journal && (polls % LOG_EVERY == 1 || fresh) {
            // Bounded by the deadline too: a wedged journalctl must not carry the wait past it.
            let read = within(ropts, deadline).map(|o| diagnose::kubelet_log(&o, LOG_LINES));
            if let Some(Ok(lines)) = read {
                watch.observe(&lines, now);
            }
        }
        if have_cert && (!journal || watch.registered.is_some()) {
            return Ok((polls, watch.registered.unwrap_or_default()));
        }
        if let Some((reason, line)) = watch.stuck(now) {
            return Err(Stop::Stuck(reason, line.to_string()));
        }
        let what = || "kubelet's client certificate and its registered line".to_string();
        let last = match checked {
            Err(e) => e,
            Ok(()) => NOT_REGISTERED.to_string(),
        };
        if now >= deadline {
            return Err(Stop::Wait(WaitError::Timeout { what: what(), last }));
        }
        if !alive() {
            return Err(Stop::Wait(WaitError::Died { what: what(), last }));
        }
        std::thread::sleep(wopts.poll.min(deadline - now));
    }
}

/// The wait-healthy and wait-joined phases, with a diagnosis when either fails.
pub fn wait(
    opts: &Options,
    paths: &NodePaths,
    cfg: &Config,
    rep: &mut Reporter,
    deadline: Instant,
) -> Result<(), Error> {
    let wopts = WaitOptions {
        healthz_url: opts.healthz_url.clone(),
        pki_dir: paths.kubelet_pki_dir.clone(),
        poll: Duration::from_millis(200),
    };
    let mut ropts = ReportOptions::new(&opts.root);
    if !cfg!(windows) {
        ropts.systemctl = Some(PathBuf::from(&opts.systemctl));
        ropts.journalctl = Some(PathBuf::from(&opts.journalctl));
    }
    ropts.kubelet_unit = cfg.image.kubelet_unit.clone();
    ropts.containerd_unit = cfg.image.containerd_unit.clone();
    ropts.redactor = rep.redactor().clone();
    let begun = Instant::now();
    let mut polls = 0u32;
    // Asking systemd every poll would cost a fork each time; once a second is enough. The
    // question is bounded by the run's deadline too: a wedged systemctl must not carry the
    // wait past it.
    let mut alive = || {
        polls += 1;
        let Some(o) = polls
            .is_multiple_of(5)
            .then(|| within(&ropts, deadline))
            .flatten()
        else {
            return true;
        };
        match diagnose::kubelet_state(&o) {
            Some(u) if !u.active_state.is_empty() => !kubelet_gone(&u, begun.elapsed()),
            _ => true,
        }
    };
    for phase in [Phase::WaitHealthy, Phase::WaitJoined] {
        rep.begin(phase);
        let waited = if phase == Phase::WaitHealthy {
            wait::wait_healthy(&wopts, deadline, &mut alive)
                .map(|n| (n, String::new()))
                .map_err(Stop::Wait)
        } else {
            wait_registered(&wopts, &ropts, deadline, &mut alive)
        };
        let stop = match waited {
            Ok((n, node)) => {
                let mut detail = format!("polls={n}");
                if !node.is_empty() {
                    detail.push_str(" node=");
                    detail.push_str(&node);
                }
                rep.success(phase, &detail);
                continue;
            }
            Err(stop) => stop,
        };
        // Past the deadline (or done waiting): the diagnosis's reads get a short bound each.
        let mut dopts = ropts.clone();
        dopts.command_timeout = DIAGNOSIS_COMMAND_TIMEOUT;
        let mut d = diagnose::diagnose(&dopts);
        match stop {
            Stop::Wait(e) => {
                if matches!(d.reason, Reason::JoinTimeout | Reason::KubeletExited) {
                    d.message = format!("{e}; {}", d.message);
                }
            }
            Stop::Stuck(reason, line) => {
                // kubelet is still running: the line it keeps logging is the cause.
                d.reason = reason;
                d.message = "kubelet is running and has retried this for 25 s: ".to_string();
                push_capped(&mut d.message, &line, MESSAGE_CAP);
            }
        }
        rep.failure_diagnosed(phase, &d);
        return Err(Error::join(d.reason, d.message));
    }
    // The node has joined: only now, off the path to it, read what kubelet said about its
    // own config without stopping, for the status (while the deadline leaves time).
    let warning =
        within(&ropts, deadline).and_then(|o| kubelet_config_warning(&o, &cfg.kubelet_config));
    if let Some(w) = warning {
        rep.warn(&w);
    }
    if cfg.node.server_tls_bootstrap {
        if let Some(w) = serving_certificate_pending(&paths.kubelet_pki_dir, deadline) {
            rep.warn(&w);
        }
    }
    Ok(())
}

/// How long after the join kiln waits for the cluster to sign kubelet's serving certificate
/// before it says the CSR is pending: an approver answers within seconds, a cluster without
/// one never does.
const SERVING_CERT_WAIT: Duration = Duration::from_secs(10);

/// The warning for a serving certificate still pending after [`SERVING_CERT_WAIT`].
const SERVING_CERT_PENDING: &str = "kubelet's serving certificate is not issued yet: KUBELET_SERVER_TLS_BOOTSTRAP=true, and no kubernetes.io/kubelet-serving CSR of this node was approved within 10 s of the join (no /var/lib/kubelet/pki/kubelet-server-current.pem); kubectl logs and exec fail for it until one is (kubectl certificate approve)";

/// With `KUBELET_SERVER_TLS_BOOTSTRAP=true`, kubelet asks the cluster for its serving
/// certificate and serves nothing on port 10250 until a `kubernetes.io/kubelet-serving` CSR is
/// approved; its certificate manager then writes `kubelet-server-current.pem`
/// (pkg/kubelet/certificate/kubelet.go: the `kubelet-server` file store in kubelet's
/// certificate directory). The node has joined either way, so a pending one is a warning for
/// status.json, with the doctor's `kubelet-serving-cert` check saying the same later.
fn serving_certificate_pending(pki_dir: &Path, deadline: Instant) -> Option<String> {
    let current = pki_dir.join("kubelet-server-current.pem");
    let until = deadline.min(Instant::now() + SERVING_CERT_WAIT);
    loop {
        if current.exists() {
            return None;
        }
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Some(SERVING_CERT_PENDING.to_string())
}

/// What kubelet logged about its config file without refusing it: a config with fields it
/// does not know is decoded leniently and those fields are ignored (k8s.io/kubelet's codec,
/// pkg/kubelet/kubeletconfig/util/codec: "Using lenient decoding as strict decoding
/// failed"). kubelet logs it as it starts, so the head of its journal for this boot holds it
/// however much kubelet logged since (`service::output` keeps the head). One journal read;
/// a journal that cannot be read adds nothing.
fn kubelet_config_warning(opts: &ReportOptions, config: &str) -> Option<String> {
    const LENIENT: &str = "Using lenient decoding as strict decoding failed";
    let lines = diagnose::kubelet_log(opts, "all").ok()?;
    let line = lines.iter().find(|l| l.contains(LENIENT))?;
    // The error is klog's `err="…"`; the whole line when it has none.
    let err = line
        .split_once("err=\"")
        .map_or(line.as_str(), |(_, e)| e.strip_suffix('"').unwrap_or(e));
    // The lowercase form is written out: `str::to_lowercase` would link Unicode's case tables.
    Some(format!(
        "kubelet ignored what it did not understand in its config file (using lenient decoding as strict decoding failed): {}; check the spelling of those fields in {}",
        err.replace("\\\"", "\""),
        config
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(show: &str) -> diagnose::UnitState {
        diagnose::UnitState::parse_show("kubelet.service", show)
    }

    #[test]
    fn a_kubelet_queued_behind_a_slow_containerd_is_not_gone() {
        // As systemd shows a unit whose start job waits for an After= dependency.
        let queued = unit("ActiveState=inactive\nResult=success\nNRestarts=0\nExecMainStartTimestampMonotonic=0\n");
        assert!(!kubelet_gone(&queued, Duration::from_secs(60)));
        // Ran, then stopped: gone once the grace has passed, not before.
        let stopped = unit("ActiveState=inactive\nResult=success\nNRestarts=0\nExecMainStartTimestampMonotonic=41000000\n");
        assert!(!kubelet_gone(&stopped, Duration::from_secs(1)));
        assert!(kubelet_gone(&stopped, INACTIVE_GRACE));
        // No timestamp reported (another service manager): the grace decides, as before.
        let unknown = unit("ActiveState=inactive\nResult=success\n");
        assert!(!kubelet_gone(&unknown, Duration::from_secs(1)));
        assert!(kubelet_gone(&unknown, INACTIVE_GRACE));
        // Failed, or crash-looping, is gone at once.
        let failed =
            unit("ActiveState=failed\nResult=exit-code\nExecMainStartTimestampMonotonic=0\n");
        assert!(kubelet_gone(&failed, Duration::ZERO));
        let looping =
            unit("ActiveState=activating\nNRestarts=3\nExecMainStartTimestampMonotonic=5\n");
        assert!(kubelet_gone(&looping, Duration::ZERO));
        let running = unit("ActiveState=active\nNRestarts=0\nExecMainStartTimestampMonotonic=5\n");
        assert!(!kubelet_gone(&running, Duration::from_secs(600)));
    }

    #[test]
    fn the_watch_sees_registration_and_a_failure_kubelet_keeps_retrying() {
        let x509 = "kubelet: E0115 10:12:03.312008 1234 certificate_manager.go:562] kubernetes.io/kube-apiserver-client-kubelet: Failed while requesting a signed certificate from the control plane: cannot create certificate signing request: Post \"https://10.0.0.10:6443/apis/certificates.k8s.io/v1/certificatesigningrequests\": tls: failed to verify certificate: x509: certificate signed by unknown authority";
        let t0 = Instant::now();
        let mut w = LogWatch::default();
        let mut lines = vec![
            "kubelet: I0115 server.go:530] \"Kubelet version\"".to_string(),
            x509.to_string(),
        ];
        w.observe(&lines, t0);
        // Once is not retrying, however long ago.
        assert!(w.stuck(t0 + RETRIED_FOR * 2).is_none());
        // The same window read again adds nothing.
        w.observe(&lines, t0 + Duration::from_secs(1));
        assert!(w.stuck(t0 + RETRIED_FOR * 2).is_none());
        lines.push(format!("{x509} "));
        w.observe(&lines, t0 + Duration::from_secs(2));
        assert!(w
            .stuck(t0 + RETRIED_FOR - Duration::from_millis(1))
            .is_none());
        assert_eq!(
            w.stuck(t0 + RETRIED_FOR).map(|s| s.0),
            Some(Reason::ApiX509)
        );
        // The certificate appeared: the old failure no longer counts.
        w.progressed();
        assert!(w.stuck(t0 + RETRIED_FOR * 3).is_none());
        assert_eq!(w.registered, None);
        lines.push("kubelet: I0115 10:12:09.000001 1234 kubelet_node_status.go:78] \"Successfully registered node\" node=\"ip-10-0-3-7\"".to_string());
        w.observe(&lines, t0 + Duration::from_secs(3));
        assert_eq!(w.registered.as_deref(), Some("ip-10-0-3-7"));
        // A window that no longer holds the last line read is all new.
        let refused = "kubelet: E0115 10:12:10.0 1234 kubelet_node_status.go:108] \"Unable to register node with API server\" err=\"nodes \\\"ip-10-0-3-7\\\" is forbidden: ValidatingAdmissionPolicy 'deny' with binding 'deny' denied request: no\" node=\"ip-10-0-3-7\"";
        let mut w = LogWatch::default();
        w.observe(&[refused.to_string(), format!("{refused} ")], t0);
        assert_eq!(
            w.stuck(t0 + RETRIED_FOR).map(|s| s.0),
            Some(Reason::NodeRegistrationRefused)
        );
    }
}
