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
    // A --config-dir drop-in kubelet cannot read or merge (mergeKubeletConfigurations).
    sig(
        Reason::KubeletConfigInvalid,
        &["failed to merge kubelet configs"],
    ),
    // An unknown gate, or a locked one set to the other value (featuregate SetFromMap): the
    // flags' error `failed to set feature gates …`, the config's panic `cannot set feature gate …`.
    sig(Reason::KubeletConfigInvalid, &["set feature gate"]),
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
    // kubelet's Node object refused after its TLS bootstrap: pkg/kubelet/kubelet_node_status.go,
    // `tryRegisterWithAPIServer` logs `klog.ErrorS(err, "Unable to register node with API
    // server", "node", …)` for a refused create, and the same words followed by `, error
    // getting existing node` when the Node exists but cannot be read; `registerWithAPIServer`
    // retries it forever (backoff 100 ms doubling to 7 s). The err is the API server's: an
    // admission or NodeRestriction refusal (`nodes "x" is forbidden: …`), a credential it does
    // not accept (`Unauthorized`), an object it finds invalid (`Node "x" is invalid: …`).
    // Before the API symptoms: the same line with `Unauthorized` is this, not a bad token.
    sig(
        Reason::NodeRegistrationRefused,
        &[REGISTER_FAILED, " is forbidden: "],
    ),
    sig(
        Reason::NodeRegistrationRefused,
        &[REGISTER_FAILED, "err=\"Unauthorized\""],
    ),
    sig(
        Reason::NodeRegistrationRefused,
        &[REGISTER_FAILED, " is invalid: "],
    ),
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

/// kubelet's words for a Node create or read the API server answered with an error
/// (`tryRegisterWithAPIServer`, above).
pub const REGISTER_FAILED: &str = "Unable to register node with API server";

/// kubelet's evidence that its Node exists: `registerWithAPIServer` (pkg/kubelet/
/// kubelet_node_status.go) logs `klog.InfoS("Successfully registered node", "node",
/// klog.KObj(node))` once the create succeeded, or once an existing Node of its name was read
/// and reconciled (a reboot), and never otherwise: `I… kubelet_node_status.go:78]
/// "Successfully registered node" node="NAME"`.
pub const REGISTERED: &str = "Successfully registered node";

/// The node name in kubelet's registered line (`node="NAME"`), if the line is one.
pub fn registered_node(line: &str) -> Option<&str> {
    let rest = &line[line.find(REGISTERED)? + REGISTERED.len()..];
    Some(
        rest.split_once("node=\"")
            .and_then(|(_, n)| n.split('"').next())
            .unwrap_or(""),
    )
}

/// The failures a running kubelet retries forever instead of exiting (client-go's certificate
/// manager retries the bootstrap CSR, `registerWithAPIServer` the Node): while kubelet keeps
/// logging one of them it stays up and answers `/healthz`, so only its log says it is stuck.
pub fn retried(reason: Reason) -> bool {
    matches!(
        reason,
        Reason::ApiDns
            | Reason::ApiX509
            | Reason::ApiUnauthorized
            | Reason::ApiUnreachable
            | Reason::NodeRegistrationRefused
    )
}

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
