//! kubelet's command line, parsed the way kubelet parses it: a pflag `FlagSet` with
//! `ContinueOnError` and `cliflag.WordSepNormalizeFunc` (`cmd/kubelet/app/server.go`,
//! `NewKubeletCommand`). Any flag not in [`FLAGS`] is refused with pflag's own words
//! (`unknown flag: --foo`), so a flag kubelet removed is a startup error here as there.
//!
//! Sources (kubernetes/kubernetes): the flag set is `KubeletFlags.AddFlags` and
//! `AddKubeletConfigFlags` in `cmd/kubelet/app/options/options.go`, the container runtime
//! options of `pkg/kubelet/config/flags.go`, the logging flags of
//! `k8s.io/component-base/logs/api/v1` (`logsapi.AddFlags`), `--version`
//! (`pkg/version/verflag`) and `-h/--help`. The error texts are pflag's (`flag.go`).

use std::collections::BTreeMap;

/// How a flag's value is parsed (pflag's `Value` types as options.go declares them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `BoolVar`: `--x` alone means true; `--x=false` (Go's `strconv.ParseBool`).
    Bool,
    /// `StringVar`, and the map/slice/taint values kubelet parses later.
    Str,
    /// `Int32Var` (`strconv.ParseInt(s, 0, 32)`).
    Int32,
    /// `Int64Var`.
    Int64,
    /// `DurationVar` (`time.ParseDuration`).
    Duration,
    /// `utilflag.IPVar`.
    Ip,
    /// `cliflag.NewMapStringString`: `k=v,k2=v2`.
    MapEq,
    /// `cliflag.NewLangleSeparatedMapStringString`: `k<v,k2<v2` (eviction thresholds).
    MapLt,
}

use Kind::*;

/// A flag whose config-file field is the place for it: pflag prints this warning when it
/// is used (options.go, `AddKubeletConfigFlags`: every flag there is deprecated but
/// `v`, `vmodule`, `log-flush-frequency` and `provider-id`).
pub const CONFIG_FLAG_DEPRECATION: &str = "This parameter should be set via the config file specified by the Kubelet's --config flag. See https://kubernetes.io/docs/tasks/administer-cluster/kubelet-config-file/ for more information.";

/// `(name, kind, deprecated)`: `deprecated` is `Some(message)` for flags pflag warns about.
pub type Flag = (&'static str, Kind, Option<&'static str>);

const CFG: Option<&str> = Some(CONFIG_FLAG_DEPRECATION);
const EVICT: Option<&str> =
    Some("Use --eviction-hard or --eviction-soft instead. Will be removed in a future version.");
const FUTURE: Option<&str> = Some("will be removed in a future version");
const V125: Option<&str> = Some("will be removed in 1.25 or later.");

/// kubelet's flags on Linux. Windows-only flags (`--windows-service`,
/// `--windows-priorityclass`) are registered only in Windows builds (`osflags_windows.go`).
pub const FLAGS: &[Flag] = &[
    // KubeletFlags.AddFlags
    ("config", Str, None),
    ("config-dir", Str, None),
    ("kubeconfig", Str, None),
    ("bootstrap-kubeconfig", Str, None),
    ("hostname-override", Str, None),
    ("node-ip", Str, None),
    ("cert-dir", Str, None),
    ("cloud-provider", Str, None),
    ("root-dir", Str, None),
    ("seccomp-default", Bool, None),
    ("node-labels", Str, None),
    ("lock-file", Str, None),
    ("exit-on-lock-contention", Bool, None),
    ("minimum-container-ttl-duration", Duration, EVICT),
    ("maximum-dead-containers-per-container", Int32, EVICT),
    ("maximum-dead-containers", Int32, EVICT),
    ("register-schedulable", Bool, FUTURE),
    ("keep-terminated-pod-volumes", Bool, FUTURE),
    ("experimental-mounter-path", Str, V125),
    ("cloud-config", Str, V125),
    ("experimental-allocatable-ignore-eviction", Bool, V125),
    // pkg/kubelet/config/flags.go (ContainerRuntimeOptions)
    ("pod-infra-container-image", Str, None),
    ("image-credential-provider-config", Str, None),
    ("image-credential-provider-bin-dir", Str, None),
    // AddKubeletConfigFlags: all deprecated in favour of the config file
    ("enable-server", Bool, CFG),
    ("fail-swap-on", Bool, CFG),
    ("pod-manifest-path", Str, CFG),
    ("sync-frequency", Duration, CFG),
    ("file-check-frequency", Duration, CFG),
    ("http-check-frequency", Duration, CFG),
    ("manifest-url", Str, CFG),
    ("manifest-url-header", Str, CFG),
    ("address", Ip, CFG),
    ("port", Int32, CFG),
    ("read-only-port", Int32, CFG),
    ("container-runtime-endpoint", Str, CFG),
    ("image-service-endpoint", Str, CFG),
    ("anonymous-auth", Bool, CFG),
    ("authentication-token-webhook", Bool, CFG),
    ("authentication-token-webhook-cache-ttl", Duration, CFG),
    ("client-ca-file", Str, CFG),
    ("authorization-mode", Str, CFG),
    ("authorization-webhook-cache-authorized-ttl", Duration, CFG),
    (
        "authorization-webhook-cache-unauthorized-ttl",
        Duration,
        CFG,
    ),
    ("tls-cert-file", Str, CFG),
    ("tls-private-key-file", Str, CFG),
    ("rotate-server-certificates", Bool, CFG),
    ("tls-cipher-suites", Str, CFG),
    ("tls-min-version", Str, CFG),
    ("rotate-certificates", Bool, CFG),
    ("registry-qps", Int32, CFG),
    ("registry-burst", Int32, CFG),
    ("event-qps", Int32, CFG),
    ("event-burst", Int32, CFG),
    ("enable-debugging-handlers", Bool, CFG),
    ("contention-profiling", Bool, CFG),
    ("healthz-port", Int32, CFG),
    ("healthz-bind-address", Ip, CFG),
    ("oom-score-adj", Int32, CFG),
    ("cluster-domain", Str, CFG),
    ("volume-plugin-dir", Str, CFG),
    ("cluster-dns", Str, CFG),
    ("streaming-connection-idle-timeout", Duration, CFG),
    ("node-status-update-frequency", Duration, CFG),
    ("minimum-image-ttl-duration", Duration, CFG),
    ("image-gc-high-threshold", Int32, CFG),
    ("image-gc-low-threshold", Int32, CFG),
    ("volume-stats-agg-period", Duration, CFG),
    ("feature-gates", Str, CFG),
    ("kubelet-cgroups", Str, CFG),
    ("system-cgroups", Str, CFG),
    ("provider-id", Str, None),
    ("cgroups-per-qos", Bool, CFG),
    ("cgroup-driver", Str, CFG),
    ("cgroup-root", Str, CFG),
    ("cpu-manager-policy", Str, CFG),
    ("cpu-manager-policy-options", Str, CFG),
    ("cpu-manager-reconcile-period", Duration, CFG),
    ("qos-reserved", MapEq, CFG),
    ("topology-manager-policy", Str, CFG),
    ("runtime-request-timeout", Duration, CFG),
    ("hairpin-mode", Str, CFG),
    ("max-pods", Int32, CFG),
    ("pod-cidr", Str, CFG),
    ("pod-max-pids", Int64, CFG),
    ("resolv-conf", Str, CFG),
    ("runonce", Bool, CFG),
    ("cpu-cfs-quota", Bool, CFG),
    ("cpu-cfs-quota-period", Duration, CFG),
    ("enable-controller-attach-detach", Bool, CFG),
    ("make-iptables-util-chains", Bool, CFG),
    ("iptables-masquerade-bit", Int32, CFG),
    ("iptables-drop-bit", Int32, CFG),
    ("container-log-max-size", Str, CFG),
    ("container-log-max-files", Int32, CFG),
    ("allowed-unsafe-sysctls", Str, CFG),
    ("node-status-max-images", Int32, CFG),
    ("kernel-memcg-notification", Bool, CFG),
    ("local-storage-capacity-isolation", Bool, CFG),
    ("max-open-files", Int64, CFG),
    ("kube-api-content-type", Str, CFG),
    ("kube-api-qps", Int32, CFG),
    ("kube-api-burst", Int32, CFG),
    ("serialize-image-pulls", Bool, CFG),
    ("eviction-hard", MapLt, CFG),
    ("eviction-soft", MapLt, CFG),
    ("eviction-soft-grace-period", MapEq, CFG),
    ("eviction-pressure-transition-period", Duration, CFG),
    ("eviction-max-pod-grace-period", Int32, CFG),
    ("eviction-minimum-reclaim", MapEq, CFG),
    ("pods-per-core", Int32, CFG),
    ("protect-kernel-defaults", Bool, CFG),
    ("reserved-cpus", Str, CFG),
    ("topology-manager-scope", Str, CFG),
    ("topology-manager-policy-options", Str, CFG),
    ("system-reserved", MapEq, CFG),
    ("kube-reserved", MapEq, CFG),
    ("enforce-node-allocatable", Str, CFG),
    ("system-reserved-cgroup", Str, CFG),
    ("kube-reserved-cgroup", Str, CFG),
    ("memory-manager-policy", Str, CFG),
    ("reserved-memory", Str, CFG),
    ("register-node", Bool, CFG),
    ("register-with-taints", Str, CFG),
    // logsapi.AddFlags (inside AddKubeletConfigFlags; v, vmodule and
    // log-flush-frequency are the ones left undeprecated)
    ("v", Int32, None),
    ("vmodule", Str, None),
    ("log-flush-frequency", Duration, None),
    ("logging-format", Str, CFG),
    ("log-json-info-buffer-size", Str, CFG),
    ("log-json-split-stream", Bool, CFG),
    ("log-text-info-buffer-size", Str, CFG),
    ("log-text-split-stream", Bool, CFG),
    // cadvisor's, kept for the e2e node tests (globalflags_linux.go)
    ("housekeeping-interval", Duration, None),
    // verflag and cobra's help
    ("version", Str, None),
    ("help", Bool, None),
];

/// Flags older kubelets took and kubelet 1.36 does not register: each is an
/// `unknown flag` startup error. Not consulted by the parser (any flag outside [`FLAGS`]
/// is unknown); kept for the tests and the README's table.
#[cfg_attr(not(test), allow(dead_code))]
pub const REMOVED: &[&str] = &[
    // dockershim's, gone with it in 1.24
    "network-plugin",
    "cni-bin-dir",
    "cni-conf-dir",
    "cni-cache-dir",
    "network-plugin-mtu",
    "docker-endpoint",
    "image-pull-progress-deadline",
    "experimental-dockershim-root-directory",
    "non-masquerade-cidr",
    // --container-runtime (only `remote` was left after 1.24), removed in 1.27
    "container-runtime",
    // dynamic kubelet configuration, removed
    "dynamic-config-dir",
    // klog's own flags, removed from Kubernetes components (KEP-2845)
    "log-dir",
    "log-file",
    "logtostderr",
    "alsologtostderr",
    // older still
    "master-service-namespace",
    "azure-container-registry-config",
    "experimental-bootstrap-kubeconfig",
    "require-kubeconfig",
    "api-servers",
    "allow-privileged",
    "cadvisor-port",
];

/// A parsed command line: the last value of each flag given, and pflag's warnings.
#[derive(Debug, Default)]
pub struct Parsed {
    pub values: BTreeMap<String, String>,
    pub warnings: Vec<String>,
}

impl Parsed {
    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }
    pub fn is_set(&self, name: &str) -> bool {
        self.values.contains_key(name)
    }
    pub fn flag_true(&self, name: &str) -> bool {
        self.get(name).is_some_and(|v| parse_bool(v) == Some(true))
    }
}

fn lookup(name: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.0 == name)
}

/// Parses `args` as kubelet does. `Err` carries the whole error kubelet returns
/// (`failed to parse kubelet flag: …` or `unknown command …`).
pub fn parse(args: &[String]) -> Result<Parsed, String> {
    parse_flags(args).map_err(|e| match e {
        ParseError::Flag(e) => format!("failed to parse kubelet flag: {e}"),
        // server.go: `cmds := cleanFlagSet.Args(); if len(cmds) > 0 { … "unknown command %+s" }`
        ParseError::Command(c) => format!("unknown command {c}"),
    })
}

enum ParseError {
    Flag(String),
    Command(String),
}

fn parse_flags(args: &[String]) -> Result<Parsed, ParseError> {
    let mut out = Parsed::default();
    let mut positional = Vec::new();
    let mut i = 0;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        if arg == "--" {
            positional.extend(args[i..].iter().cloned());
            break;
        }
        if let Some(long) = arg.strip_prefix("--") {
            let (raw, inline) = match long.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (long, None),
            };
            if raw.is_empty() || raw.starts_with('-') || raw.starts_with('=') {
                return Err(ParseError::Flag(format!("bad flag syntax: {arg}")));
            }
            // cliflag.WordSepNormalizeFunc: `_` and `-` are the same separator.
            let name = raw.replace('_', "-");
            let Some(flag) = lookup(&name) else {
                return Err(ParseError::Flag(format!("unknown flag: --{raw}")));
            };
            let value = match (inline, flag.1) {
                (Some(v), _) => v,
                (None, Bool) => "true".to_string(),
                (None, _) => match args.get(i) {
                    Some(v) => {
                        i += 1;
                        v.clone()
                    }
                    None => return Err(ParseError::Flag(format!("flag needs an argument: {arg}"))),
                },
            };
            set(&mut out, flag, &format!("--{}", flag.0), value)?;
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut chars = short.chars();
            let c = chars.next().unwrap_or('-');
            let rest: String = chars.collect();
            let flag = match c {
                'v' => lookup("v"),
                'h' => lookup("help"),
                _ => None,
            };
            let Some(flag) = flag else {
                return Err(ParseError::Flag(format!(
                    "unknown shorthand flag: '{c}' in {arg}"
                )));
            };
            let value = if let Some(v) = rest.strip_prefix('=') {
                v.to_string()
            } else if !rest.is_empty() {
                if flag.1 == Bool {
                    return Err(ParseError::Flag(format!(
                        "unknown shorthand flag: '{}' in {arg}",
                        rest.chars().next().unwrap_or('-')
                    )));
                }
                rest
            } else if flag.1 == Bool {
                "true".to_string()
            } else if let Some(v) = args.get(i) {
                i += 1;
                v.clone()
            } else {
                return Err(ParseError::Flag(format!(
                    "flag needs an argument: '{c}' in {arg}"
                )));
            };
            set(&mut out, flag, &format!("-{c}, --{}", flag.0), value)?;
        } else {
            positional.push(arg.clone());
        }
    }
    match positional.first() {
        Some(c) => Err(ParseError::Command(c.clone())),
        None => Ok(out),
    }
}

fn set(out: &mut Parsed, flag: &Flag, shown: &str, value: String) -> Result<(), ParseError> {
    if let Err(e) = check_value(flag.1, &value) {
        return Err(ParseError::Flag(format!(
            "invalid argument {value:?} for {shown:?} flag: {e}"
        )));
    }
    if let Some(msg) = flag.2 {
        // pflag: `Flag --%s has been deprecated, %s`, once per use, on stderr.
        out.warnings
            .push(format!("Flag --{} has been deprecated, {msg}", flag.0));
    }
    out.values.insert(flag.0.to_string(), value);
    Ok(())
}

/// Go's `strconv.ParseBool`.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Go's `strconv.ParseInt(s, 0, bits)` for the common spellings (sign, decimal, `0x`,
/// `0o`, `0b`, a leading-`0` octal).
pub fn parse_int(s: &str, bits: u32) -> Result<i64, String> {
    let syntax = || format!("strconv.ParseInt: parsing {s:?}: invalid syntax");
    let (neg, body) = match s.as_bytes().first() {
        Some(b'-') => (true, &s[1..]),
        Some(b'+') => (false, &s[1..]),
        _ => (false, s),
    };
    let lower = body.to_ascii_lowercase();
    let (radix, digits) = if let Some(d) = lower.strip_prefix("0x") {
        (16, d)
    } else if let Some(d) = lower.strip_prefix("0o") {
        (8, d)
    } else if let Some(d) = lower.strip_prefix("0b") {
        (2, d)
    } else if lower.len() > 1 && lower.starts_with('0') {
        (8, &lower[1..])
    } else {
        (10, lower.as_str())
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(syntax());
    }
    let range = || format!("strconv.ParseInt: parsing {s:?}: value out of range");
    let mag = i128::from_str_radix(digits, radix).map_err(|_| range())?;
    let v = if neg { -mag } else { mag };
    let max = (1i128 << (bits - 1)) - 1;
    if v > max || v < -max - 1 {
        return Err(range());
    }
    Ok(v as i64)
}

fn check_value(kind: Kind, v: &str) -> Result<(), String> {
    match kind {
        Str => Ok(()),
        Bool => parse_bool(v)
            .map(drop)
            .ok_or_else(|| format!("strconv.ParseBool: parsing {v:?}: invalid syntax")),
        Int32 => parse_int(v, 32).map(drop),
        Int64 => parse_int(v, 64).map(drop),
        Duration => crate::config::units::parse_duration(v).map(drop),
        Ip => v
            .parse::<std::net::IpAddr>()
            .map(drop)
            .map_err(|_| format!("{v:?} is not a valid IP address")),
        MapEq => split_map(v, '=').map(drop),
        MapLt => split_map(v, '<').map(drop),
    }
}

/// The `cliflag` map values: comma-separated `key<sep>value` pairs; spaces around them are
/// trimmed, an empty value is an empty map, a pair without `sep` is malformed.
pub fn split_map(v: &str, sep: char) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in v.split(',') {
        let pair = pair.trim();
        if pair.is_empty() {
            continue;
        }
        let Some((k, val)) = pair.split_once(sep) else {
            return Err(format!("malformed pair, expect string{sep}string"));
        };
        out.push((k.trim().to_string(), val.trim().to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(args: &[&str]) -> Result<Parsed, String> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn both_forms_and_normalized_names() {
        let f = p(&[
            "--config=/c.yaml",
            "--root-dir",
            "/r",
            "--healthz-port=0",
            "-v=2",
            "--max_pods",
            "29",
            "--fail-swap-on",
        ])
        .unwrap();
        assert_eq!(f.get("config"), Some("/c.yaml"));
        assert_eq!(f.get("root-dir"), Some("/r"));
        assert_eq!(f.get("max-pods"), Some("29"));
        assert_eq!(f.get("v"), Some("2"));
        assert!(f.flag_true("fail-swap-on"));
        assert!(f
            .warnings
            .iter()
            .any(|w| w.starts_with("Flag --max-pods has been deprecated, This parameter")));
    }

    #[test]
    fn unknown_and_removed_flags_are_refused_as_pflag_does() {
        assert_eq!(
            p(&["--foo"]).unwrap_err(),
            "failed to parse kubelet flag: unknown flag: --foo"
        );
        for removed in REMOVED {
            assert!(lookup(removed).is_none(), "{removed} is registered");
            let e = p(&[&format!("--{removed}=x")]).unwrap_err();
            assert_eq!(
                e,
                format!("failed to parse kubelet flag: unknown flag: --{removed}")
            );
        }
        assert_eq!(
            p(&["-x"]).unwrap_err(),
            "failed to parse kubelet flag: unknown shorthand flag: 'x' in -x"
        );
        assert_eq!(p(&["run"]).unwrap_err(), "unknown command run");
    }

    #[test]
    fn bad_values_are_refused() {
        assert_eq!(
            p(&["--max-pods=abc"]).unwrap_err(),
            "failed to parse kubelet flag: invalid argument \"abc\" for \"--max-pods\" flag: strconv.ParseInt: parsing \"abc\": invalid syntax"
        );
        assert!(p(&["--max-pods=99999999999"])
            .unwrap_err()
            .ends_with("value out of range"));
        assert!(p(&["--fail-swap-on=maybe"])
            .unwrap_err()
            .contains("strconv.ParseBool"));
        assert!(p(&["--sync-frequency=5x"])
            .unwrap_err()
            .contains("time: unknown unit"));
        assert!(p(&["--address=1.2.3"])
            .unwrap_err()
            .contains("is not a valid IP address"));
        assert!(p(&["--eviction-hard=memory.available=1Gi"])
            .unwrap_err()
            .ends_with("malformed pair, expect string<string"));
        assert!(p(&["--kube-reserved=cpu"])
            .unwrap_err()
            .ends_with("malformed pair, expect string=string"));
        assert_eq!(
            p(&["--kubeconfig"]).unwrap_err(),
            "failed to parse kubelet flag: flag needs an argument: --kubeconfig"
        );
    }

    /// kiln-firstboot's KUBELET_ARGS as `firstboot/tests/run_providers.rs` pins it (AWS),
    /// with the optional reservation, label, taint and DNS flags kiln adds.
    #[test]
    fn kilns_kubelet_args_parse() {
        let line = "--config=/usr/lib/kiln/kubelet-config.yaml --kubeconfig=/var/lib/kubelet/kubeconfig \
--bootstrap-kubeconfig=/run/kiln/bootstrap-kubeconfig --container-runtime-endpoint=unix:///run/containerd/containerd.sock \
--hostname-override=ip-10-0-3-7.eu-west-1.compute.internal --node-ip=10.0.3.7 \
--provider-id=aws:///eu-west-1a/i-0abc123def4567890 --max-pods=29 \
--kube-reserved=cpu=70m,memory=442Mi,ephemeral-storage=1Gi --system-reserved=cpu=100m,memory=100Mi \
--eviction-hard=memory.available<100Mi,nodefs.available<10% --node-labels=a=b,c=d \
--register-with-taints=dedicated=gpu:NoSchedule --cluster-dns=10.96.0.10";
        let args: Vec<&str> = line.split_whitespace().collect();
        let f = p(&args).unwrap();
        assert_eq!(f.get("max-pods"), Some("29"));
        assert_eq!(
            f.get("eviction-hard"),
            Some("memory.available<100Mi,nodefs.available<10%")
        );
    }

    #[test]
    fn ints_as_go_reads_them() {
        assert_eq!(parse_int("0x10", 32), Ok(16));
        assert_eq!(parse_int("-010", 32), Ok(-8));
        assert_eq!(parse_int("2147483647", 32), Ok(i64::from(i32::MAX)));
        assert!(parse_int("2147483648", 32).is_err());
        assert!(parse_int("", 32).is_err());
    }
}
