//! `/etc/kiln/node.env`, the node's settings (`docs/contract.md#nodeenv`): its keys, the
//! shape each value must have, and [`NodeEnv`], the typed value firstboot reads it into.

use std::fmt;
use std::net::IpAddr;

use super::envfile::EnvFile;
use crate::contract::version::KILN_CONTRACT;

/// The API server URL, `https://host[:port]`.
pub const API_SERVER: &str = "API_SERVER";
/// The cluster name.
pub const CLUSTER_NAME: &str = "CLUSTER_NAME";
/// `kubelet` or `kubeadm` ([`JoinMode`]).
pub const JOIN_MODE: &str = "JOIN_MODE";
/// `auto` or a [`Provider`] name.
pub const PROVIDER: &str = "PROVIDER";
/// Overrides the node name from metadata.
pub const NODE_NAME: &str = "NODE_NAME";
/// Overrides the node address from metadata.
pub const NODE_IP: &str = "NODE_IP";
/// `ipv4`, `ipv6` or `dual` ([`IpFamily`]): which families the node announces.
pub const IP_FAMILY: &str = "IP_FAMILY";
/// The metadata service's base URL, or a name for one (`aws-ipv6`).
pub const METADATA_URL: &str = "METADATA_URL";
/// Comma-separated `key=value` labels.
pub const NODE_LABELS: &str = "NODE_LABELS";
/// Comma-separated `key[=value]:Effect` taints.
pub const NODE_TAINTS: &str = "NODE_TAINTS";
/// Overrides `max-pods.map`.
pub const MAX_PODS: &str = "MAX_PODS";
/// Comma-separated cluster DNS addresses.
pub const CLUSTER_DNS: &str = "CLUSTER_DNS";
/// Extra kubelet flags, space-separated.
pub const KUBELET_EXTRA_ARGS: &str = "KUBELET_EXTRA_ARGS";
/// `true`: kubelet asks the cluster for its serving certificate (serverTLSBootstrap) in
/// either join mode; unset or `false`: the kubelet configuration decides (kubelet's default
/// signs its own).
pub const KUBELET_SERVER_TLS_BOOTSTRAP: &str = "KUBELET_SERVER_TLS_BOOTSTRAP";
/// Overrides the image's boot deadline, in seconds.
pub const KILN_DEADLINE: &str = "KILN_DEADLINE";
/// A swap file of this many bytes, made and turned on before kubelet starts.
pub const SWAP_FILE_SIZE: &str = "SWAP_FILE_SIZE";
/// Proxy for kubelet and containerd.
pub const HTTP_PROXY: &str = "HTTP_PROXY";
/// Proxy for kubelet and containerd.
pub const HTTPS_PROXY: &str = "HTTPS_PROXY";
/// Proxy exceptions for kubelet and containerd.
pub const NO_PROXY: &str = "NO_PROXY";

/// The proxy keys, in the contract's order.
pub const PROXIES: [&str; 3] = [HTTP_PROXY, HTTPS_PROXY, NO_PROXY];

/// The keys node.env must set, each non-empty.
pub const REQUIRED: [&str; 3] = [KILN_CONTRACT, API_SERVER, CLUSTER_NAME];

/// How the node joins the cluster (`JOIN_MODE`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum JoinMode {
    /// kubelet's own TLS bootstrap with a bootstrap kubeconfig (the default).
    #[default]
    Kubelet,
    /// `kubeadm join --config /etc/kiln/kubeadm-join.yaml`.
    Kubeadm,
}

impl JoinMode {
    /// The value written in node.env.
    pub fn as_str(self) -> &'static str {
        match self {
            JoinMode::Kubelet => "kubelet",
            JoinMode::Kubeadm => "kubeadm",
        }
    }

    /// The mode a node.env value names; the empty value is the default.
    pub fn parse(value: &str) -> Option<JoinMode> {
        match value {
            "" | "kubelet" => Some(JoinMode::Kubelet),
            "kubeadm" => Some(JoinMode::Kubeadm),
            _ => None,
        }
    }
}

/// A metadata source (`docs/contract.md#metadata-sources`). `PROVIDER=auto`, the default,
/// is no provider at all: firstboot detects one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Provider {
    /// AWS IMDSv2.
    Aws,
    /// Azure IMDS.
    Azure,
    /// The GCP metadata server.
    Gcp,
    /// OpenStack's metadata service.
    Openstack,
    /// VMware guestinfo.
    Vmware,
    /// QEMU fw_cfg.
    Qemu,
    /// No metadata: node.env says everything.
    None,
    /// An OpenStack config drive (a volume labelled `config-2`).
    Configdrive,
    /// A NoCloud seed (a volume labelled `cidata`, or `ds=nocloud` on the command line).
    Nocloud,
    /// Hetzner Cloud's metadata service.
    Hetzner,
    /// DigitalOcean's metadata service.
    Digitalocean,
    /// Oracle Cloud's instance metadata service (`/opc/v2`).
    Oraclecloud,
    /// Akamai (Linode)'s metadata service.
    Akamai,
    /// IBM Cloud VPC's metadata service.
    Ibmcloud,
    /// Scaleway's metadata service.
    Scaleway,
}

/// Every value `PROVIDER` accepts, `auto` first (for parsers that list them, e.g. serde's
/// "expected one of"); a unit test holds it to [`Provider::ALL`].
pub const PROVIDER_CHOICES: [&str; 16] = [
    "auto",
    "aws",
    "azure",
    "gcp",
    "openstack",
    "vmware",
    "qemu",
    "none",
    "configdrive",
    "nocloud",
    "hetzner",
    "digitalocean",
    "oraclecloud",
    "akamai",
    "ibmcloud",
    "scaleway",
];

/// Every value `JOIN_MODE` accepts.
pub const JOIN_MODES: [&str; 2] = ["kubelet", "kubeadm"];

/// What `PROVIDER` and `--provider` accept, as a message says it.
pub const PROVIDER_EXPECTED: &str = "auto, aws, azure, gcp, openstack, vmware, qemu, none, configdrive, nocloud, hetzner, digitalocean, oraclecloud, akamai, ibmcloud or scaleway";

impl Provider {
    /// Every provider, in the contract's order.
    pub const ALL: [Provider; 15] = [
        Provider::Aws,
        Provider::Azure,
        Provider::Gcp,
        Provider::Openstack,
        Provider::Vmware,
        Provider::Qemu,
        Provider::None,
        Provider::Configdrive,
        Provider::Nocloud,
        Provider::Hetzner,
        Provider::Digitalocean,
        Provider::Oraclecloud,
        Provider::Akamai,
        Provider::Ibmcloud,
        Provider::Scaleway,
    ];

    /// The name in node.env, kubelet.env and status.json.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Aws => "aws",
            Provider::Azure => "azure",
            Provider::Gcp => "gcp",
            Provider::Openstack => "openstack",
            Provider::Vmware => "vmware",
            Provider::Qemu => "qemu",
            Provider::None => "none",
            Provider::Configdrive => "configdrive",
            Provider::Nocloud => "nocloud",
            Provider::Hetzner => "hetzner",
            Provider::Digitalocean => "digitalocean",
            Provider::Oraclecloud => "oraclecloud",
            Provider::Akamai => "akamai",
            Provider::Ibmcloud => "ibmcloud",
            Provider::Scaleway => "scaleway",
        }
    }

    /// The provider called `name` (exactly, lower case).
    pub fn from_name(name: &str) -> Option<Provider> {
        Provider::ALL.into_iter().find(|p| p.name() == name)
    }

    /// A `PROVIDER` or `--provider` value: `Ok(None)` for `auto` (and the empty value),
    /// `Ok(Some(p))` for a provider's name.
    pub fn parse_choice(value: &str) -> Result<Option<Provider>, UnknownProvider<'_>> {
        match value {
            "" | "auto" => Ok(None),
            name => Provider::from_name(name)
                .map(Some)
                .ok_or(UnknownProvider(name)),
        }
    }
}

/// A provider name that is not one; its message says which names there are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownProvider<'a>(pub &'a str);

impl fmt::Display for UnknownProvider<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "expected {PROVIDER_EXPECTED}, found {:?}", self.0)
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which address families the node announces (`IP_FAMILY` in node.env).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    /// One IPv4 address.
    Ipv4,
    /// One IPv6 address.
    Ipv6,
    /// One of each: `--node-ip=<primary>,<secondary>`.
    Dual,
}

/// What `IP_FAMILY` accepts, as a message says it.
pub const IP_FAMILY_EXPECTED: &str = "ipv4, ipv6 or dual";

impl IpFamily {
    /// The value in node.env.
    pub fn name(self) -> &'static str {
        match self {
            IpFamily::Ipv4 => "ipv4",
            IpFamily::Ipv6 => "ipv6",
            IpFamily::Dual => "dual",
        }
    }

    /// The family a node.env value names.
    pub fn parse(value: &str) -> Option<IpFamily> {
        match value {
            "ipv4" => Some(IpFamily::Ipv4),
            "ipv6" => Some(IpFamily::Ipv6),
            "dual" => Some(IpFamily::Dual),
            _ => None,
        }
    }

    /// The single family of one address.
    pub fn of(ip: IpAddr) -> IpFamily {
        if ip.is_ipv4() {
            IpFamily::Ipv4
        } else {
            IpFamily::Ipv6
        }
    }
}

/// Checks a `NODE_IP` value: one IP address, or two of different families separated by a
/// comma (kubelet's dual-stack form). Returns the family it stands for.
pub fn parse_node_ip(value: &str) -> Result<IpFamily, &'static str> {
    const EXPECTED: &str = "an IP address, or an IPv4 and an IPv6 address separated by a comma";
    let parse = |s: &str| s.parse::<IpAddr>().map_err(|_| EXPECTED);
    match value.split_once(',') {
        None => parse(value).map(IpFamily::of),
        Some((a, b)) => {
            let (a, b) = (parse(a)?, parse(b)?);
            if a.is_ipv4() == b.is_ipv4() {
                return Err(EXPECTED);
            }
            Ok(IpFamily::Dual)
        }
    }
}

/// True for a name of `[A-Za-z0-9._/-]`, the shape of cluster names, node names and the
/// parts of labels and taints.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'/'))
}

/// Checks one node.env value against the shape its key requires; the error says what was
/// expected. Unknown keys, and the empty value of an optional key, are accepted.
pub fn check(key: &str, value: &str) -> Result<(), &'static str> {
    let set = !value.is_empty();
    match key {
        API_SERVER => {
            let host = value
                .strip_prefix("https://")
                .ok_or("https://host[:port]")?
                .trim_end_matches('/');
            if host.is_empty()
                || host.contains(['/', '?', '#', '@'])
                || !host.bytes().all(|b| b.is_ascii_graphic())
            {
                return Err("https://host[:port]");
            }
        }
        CLUSTER_NAME if !is_name(value) => return Err("a name of [A-Za-z0-9._-]"),
        JOIN_MODE if JoinMode::parse(value).is_none() => return Err("kubelet or kubeadm"),
        PROVIDER if Provider::parse_choice(value).is_err() => return Err(PROVIDER_EXPECTED),
        NODE_NAME if set && !is_name(value) => return Err("a node name of [a-z0-9.-]"),
        NODE_IP if set => {
            parse_node_ip(value)?;
        }
        IP_FAMILY if set && IpFamily::parse(value).is_none() => return Err(IP_FAMILY_EXPECTED),
        METADATA_URL
            if set
                && !METADATA_URL_NAMES.contains(&value)
                && (!(value.starts_with("http://") || value.starts_with('/'))
                    || value.len() == "http://".len()
                    || !value.bytes().all(|b| b.is_ascii_graphic())) =>
        {
            return Err("http://host[:port], aws-ipv6, or a volume's directory (/path)")
        }
        MAX_PODS if set && value.parse::<u32>().map_or(true, |n| n == 0) => {
            return Err("a positive integer")
        }
        KUBELET_SERVER_TLS_BOOTSTRAP if set && value != "true" && value != "false" => {
            return Err("true or false")
        }
        KILN_DEADLINE if set && value.parse::<u64>().map_or(true, |n| n == 0) => {
            return Err("a positive number of seconds")
        }
        SWAP_FILE_SIZE
            if set
                && value
                    .parse::<u64>()
                    .map_or(true, |n| n < 40960 || n % 4096 != 0) =>
        {
            return Err("bytes: a multiple of 4096, at least 40960")
        }
        CLUSTER_DNS if set && value.split(',').any(|ip| ip.parse::<IpAddr>().is_err()) => {
            return Err("comma-separated IP addresses")
        }
        NODE_LABELS if set => {
            for item in value.split(',') {
                match item.split_once('=') {
                    Some((k, v)) if is_name(k) && (v.is_empty() || is_name(v)) => {}
                    _ => return Err("comma-separated key=value labels"),
                }
            }
        }
        NODE_TAINTS if set => {
            for item in value.split(',') {
                let ok = item.rsplit_once(':').is_some_and(|(kv, effect)| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    matches!(effect, "NoSchedule" | "PreferNoSchedule" | "NoExecute")
                        && is_name(k)
                        && (v.is_empty() || is_name(v))
                });
                if !ok {
                    return Err("comma-separated key[=value]:Effect taints");
                }
            }
        }
        _ => {}
    }
    Ok(())
}

/// The names `METADATA_URL` and `--metadata-url` accept besides a URL.
pub const METADATA_URL_NAMES: [&str; 1] = ["aws-ipv6"];

/// A value that does not have the shape its key requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invalid<'a> {
    /// The key.
    pub key: &'a str,
    /// What the key requires.
    pub expected: &'static str,
    /// The value found.
    pub found: &'a str,
}

impl fmt::Display for Invalid<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: expected {}, found {:?}",
            self.key, self.expected, self.found
        )
    }
}

/// node.env, checked and typed. Optional text values are empty when unset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEnv {
    /// `API_SERVER`.
    pub api_server: String,
    /// `CLUSTER_NAME`.
    pub cluster_name: String,
    /// `JOIN_MODE`.
    pub join_mode: JoinMode,
    /// `PROVIDER`: `None` for `auto`.
    pub provider: Option<Provider>,
    /// `NODE_NAME`, when set.
    pub node_name: Option<String>,
    /// `NODE_IP`, when set.
    pub node_ip: Option<String>,
    /// `IP_FAMILY`, when set.
    pub ip_family: Option<IpFamily>,
    /// `METADATA_URL`, when set: a URL or a name in [`METADATA_URL_NAMES`].
    pub metadata_url: Option<String>,
    /// `NODE_LABELS`.
    pub node_labels: String,
    /// `NODE_TAINTS`.
    pub node_taints: String,
    /// `MAX_PODS`, when set.
    pub max_pods: Option<u32>,
    /// `CLUSTER_DNS`.
    pub cluster_dns: String,
    /// `KUBELET_EXTRA_ARGS`, as written.
    pub kubelet_extra_args: String,
    /// `KUBELET_SERVER_TLS_BOOTSTRAP=true`.
    pub server_tls_bootstrap: bool,
    /// `KILN_DEADLINE` in seconds, when set.
    pub deadline_secs: Option<u64>,
    /// `SWAP_FILE_SIZE` in bytes, when set.
    pub swap_file_size: Option<u64>,
    /// `HTTP_PROXY`.
    pub http_proxy: String,
    /// `HTTPS_PROXY`.
    pub https_proxy: String,
    /// `NO_PROXY`.
    pub no_proxy: String,
}

impl NodeEnv {
    /// Checks every entry in file order ([`check`]) and types the known keys. The required
    /// keys' presence and `KILN_CONTRACT` are the caller's to check first (they are
    /// `CONFIG_MISSING` and `CONTRACT_VERSION`, not `CONFIG_INVALID`).
    pub fn from_env(env: &EnvFile) -> Result<NodeEnv, Invalid<'_>> {
        for (key, value) in env.entries() {
            check(key, value).map_err(|expected| Invalid {
                key,
                expected,
                found: value,
            })?;
        }
        if let (Some(ip), Some(family)) = (env.non_empty(NODE_IP), env.non_empty(IP_FAMILY)) {
            if parse_node_ip(ip).ok().map(IpFamily::name) != Some(family) {
                return Err(Invalid {
                    key: IP_FAMILY,
                    expected: "the family of NODE_IP (ipv4, ipv6, or dual for a pair)",
                    found: family,
                });
            }
        }
        let text = |key: &str| env.get(key).unwrap_or("").to_string();
        let opt = |key: &str| env.non_empty(key).map(str::to_string);
        Ok(NodeEnv {
            api_server: text(API_SERVER),
            cluster_name: text(CLUSTER_NAME),
            join_mode: env
                .get(JOIN_MODE)
                .and_then(JoinMode::parse)
                .unwrap_or_default(),
            provider: env
                .get(PROVIDER)
                .and_then(|v| Provider::parse_choice(v).ok())
                .flatten(),
            node_name: opt(NODE_NAME),
            node_ip: opt(NODE_IP),
            ip_family: env.non_empty(IP_FAMILY).and_then(IpFamily::parse),
            metadata_url: opt(METADATA_URL),
            node_labels: text(NODE_LABELS),
            node_taints: text(NODE_TAINTS),
            max_pods: env.non_empty(MAX_PODS).and_then(|v| v.parse().ok()),
            cluster_dns: text(CLUSTER_DNS),
            kubelet_extra_args: text(KUBELET_EXTRA_ARGS),
            server_tls_bootstrap: env.get(KUBELET_SERVER_TLS_BOOTSTRAP) == Some("true"),
            deadline_secs: env.non_empty(KILN_DEADLINE).and_then(|v| v.parse().ok()),
            swap_file_size: env.non_empty(SWAP_FILE_SIZE).and_then(|v| v.parse().ok()),
            http_proxy: text(HTTP_PROXY),
            https_proxy: text(HTTPS_PROXY),
            no_proxy: text(NO_PROXY),
        })
    }

    /// The proxy keys that are set (non-empty), in [`PROXIES`] order, with their values.
    pub fn proxies(&self) -> impl Iterator<Item = (&'static str, &str)> {
        [
            (HTTP_PROXY, &self.http_proxy),
            (HTTPS_PROXY, &self.https_proxy),
            (NO_PROXY, &self.no_proxy),
        ]
        .into_iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k, v.as_str()))
    }
}

#[cfg(test)]
#[path = "node_env_tests.rs"]
mod tests;
