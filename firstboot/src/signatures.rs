//! The ONE table of known failure signatures diagnosis matches kubelet's and containerd's
//! log lines against ([`crate::diagnose`] reads the logs and concludes).

use crate::Reason;

/// One known failure: every needle must appear in one log line (case-sensitive, as printed).
#[derive(Debug, Clone, Copy)]
pub struct Signature {
    pub reason: Reason,
    pub needles: &'static [&'static str],
}

/// The signature table, most specific first: the first signature with a matching line wins.
/// Root causes (disk, swap, cgroups, runtime) come before the API-server symptoms they cause;
/// DNS comes before the generic dial errors because a failed lookup also says `dial tcp`.
/// Sources for the wording: `firstboot/tests/fixtures/logs/README.md`.
pub const SIGNATURES: &[Signature] = &[
    sig(Reason::DiskFull, &["no space left on device"]),
    sig(
        Reason::SwapEnabled,
        &["running with swap on is not supported"],
    ),
    sig(
        Reason::CgroupDriverMismatch,
        &["misconfiguration: kubelet cgroup driver"],
    ),
    // kubelet refusing its own flags or config file (cmd/kubelet/app/server.go).
    sig(
        Reason::KubeletConfigInvalid,
        &["failed to validate kubelet configuration"],
    ),
    sig(
        Reason::KubeletConfigInvalid,
        &["failed to load kubelet config file"],
    ),
    sig(
        Reason::KubeletConfigInvalid,
        &["failed to parse kubelet flag"],
    ),
    sig(
        Reason::CgroupDriverMismatch,
        &["expected cgroupsPath to be of format"],
    ),
    sig(
        Reason::RuntimeUnavailable,
        &[
            "validate CRI v1 runtime API for endpoint",
            "Error while dialing",
        ],
    ),
    sig(
        Reason::RuntimeUnavailable,
        &["dial unix", ".sock: connect: no such file or directory"],
    ),
    sig(Reason::RuntimeUnavailable, &["container runtime is down"]),
    sig(Reason::MetadataHopLimit, &["ec2imds", "StatusCode: 401"]),
    sig(Reason::MetadataHopLimit, &["ec2imds", "StatusCode: 403"]),
    sig(
        Reason::MetadataHopLimit,
        &["EC2MetadataError", "status code: 401"],
    ),
    sig(Reason::ApiDns, &["dial tcp: lookup ", "no such host"]),
    sig(Reason::ApiDns, &["dial tcp: lookup ", "server misbehaving"]),
    sig(Reason::ApiDns, &["dial tcp: lookup ", "i/o timeout"]),
    sig(
        Reason::ApiX509,
        &["x509: certificate signed by unknown authority"],
    ),
    sig(Reason::ApiX509, &["x509: certificate is valid for"]),
    sig(Reason::ApiX509, &["x509: certificate has expired"]),
    sig(
        Reason::ApiUnauthorized,
        &["certificate signing request: Unauthorized"],
    ),
    sig(Reason::ApiUnauthorized, &["err=\"Unauthorized\""]),
    sig(Reason::ApiUnauthorized, &["error: Unauthorized"]),
    sig(
        Reason::ApiUnreachable,
        &["dial tcp ", "connect: connection refused"],
    ),
    sig(Reason::ApiUnreachable, &["dial tcp ", "i/o timeout"]),
    sig(
        Reason::ApiUnreachable,
        &["dial tcp ", "connect: no route to host"],
    ),
    sig(Reason::ApiUnreachable, &["net/http: TLS handshake timeout"]),
];

const fn sig(reason: Reason, needles: &'static [&'static str]) -> Signature {
    Signature { reason, needles }
}

/// The first signature in table order that `line` matches.
pub fn match_line(line: &str) -> Option<Reason> {
    SIGNATURES
        .iter()
        .find(|s| s.needles.iter().all(|n| line.contains(n)))
        .map(|s| s.reason)
}

/// Classifies log lines: the first signature in table order with any matching line, and the
/// newest line that matched it.
pub fn classify<S: AsRef<str>>(lines: &[S]) -> Option<(Reason, usize)> {
    SIGNATURES.iter().find_map(|s| {
        lines
            .iter()
            .rposition(|l| s.needles.iter().all(|n| l.as_ref().contains(n)))
            .map(|i| (s.reason, i))
    })
}
