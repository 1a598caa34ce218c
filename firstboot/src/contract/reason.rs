//! Reason codes: the stable names of every outcome, with their exit codes and hints.
//! The table is `docs/contract.md#reason-codes`; keep both in step.

/// Why a run ended the way it did. The string form is stable across releases.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Ok,
    Usage,
    ContractVersion,
    ConfigMissing,
    ConfigInvalid,
    SecretMode,
    MetadataUnreachable,
    MetadataHopLimit,
    MetadataInvalid,
    ProviderUnknown,
    WriteFailed,
    StartFailed,
    KubeadmFailed,
    KubeletExited,
    KubeletConfigInvalid,
    ApiDns,
    ApiX509,
    ApiUnauthorized,
    ApiUnreachable,
    NodeRegistrationRefused,
    DiskFull,
    RuntimeUnavailable,
    CgroupDriverMismatch,
    SwapEnabled,
    JoinTimeout,
    Internal,
}

impl Reason {
    /// Every reason, in the order of the contract's table.
    pub const ALL: [Reason; 26] = [
        Reason::Ok,
        Reason::Usage,
        Reason::ContractVersion,
        Reason::ConfigMissing,
        Reason::ConfigInvalid,
        Reason::SecretMode,
        Reason::MetadataUnreachable,
        Reason::MetadataHopLimit,
        Reason::MetadataInvalid,
        Reason::ProviderUnknown,
        Reason::WriteFailed,
        Reason::StartFailed,
        Reason::KubeadmFailed,
        Reason::KubeletExited,
        Reason::KubeletConfigInvalid,
        Reason::ApiDns,
        Reason::ApiX509,
        Reason::ApiUnauthorized,
        Reason::ApiUnreachable,
        Reason::NodeRegistrationRefused,
        Reason::DiskFull,
        Reason::RuntimeUnavailable,
        Reason::CgroupDriverMismatch,
        Reason::SwapEnabled,
        Reason::JoinTimeout,
        Reason::Internal,
    ];

    /// The stable code written to status files and the console.
    pub fn code(self) -> &'static str {
        match self {
            Reason::Ok => "OK",
            Reason::Usage => "USAGE",
            Reason::ContractVersion => "CONTRACT_VERSION",
            Reason::ConfigMissing => "CONFIG_MISSING",
            Reason::ConfigInvalid => "CONFIG_INVALID",
            Reason::SecretMode => "SECRET_MODE",
            Reason::MetadataUnreachable => "METADATA_UNREACHABLE",
            Reason::MetadataHopLimit => "METADATA_HOP_LIMIT",
            Reason::MetadataInvalid => "METADATA_INVALID",
            Reason::ProviderUnknown => "PROVIDER_UNKNOWN",
            Reason::WriteFailed => "WRITE_FAILED",
            Reason::StartFailed => "START_FAILED",
            Reason::KubeadmFailed => "KUBEADM_FAILED",
            Reason::KubeletExited => "KUBELET_EXITED",
            Reason::KubeletConfigInvalid => "KUBELET_CONFIG_INVALID",
            Reason::ApiDns => "API_DNS",
            Reason::ApiX509 => "API_X509",
            Reason::ApiUnauthorized => "API_UNAUTHORIZED",
            Reason::ApiUnreachable => "API_UNREACHABLE",
            Reason::NodeRegistrationRefused => "NODE_REGISTRATION_REFUSED",
            Reason::DiskFull => "DISK_FULL",
            Reason::RuntimeUnavailable => "RUNTIME_UNAVAILABLE",
            Reason::CgroupDriverMismatch => "CGROUP_DRIVER_MISMATCH",
            Reason::SwapEnabled => "SWAP_ENABLED",
            Reason::JoinTimeout => "JOIN_TIMEOUT",
            Reason::Internal => "INTERNAL",
        }
    }

    /// The process exit code for a run that ends with this reason.
    pub fn exit_code(self) -> u8 {
        match self {
            Reason::Ok => 0,
            Reason::Internal => 1,
            Reason::Usage => 2,
            Reason::ContractVersion
            | Reason::ConfigMissing
            | Reason::ConfigInvalid
            | Reason::SecretMode => 3,
            Reason::MetadataUnreachable
            | Reason::MetadataHopLimit
            | Reason::MetadataInvalid
            | Reason::ProviderUnknown => 4,
            Reason::WriteFailed => 5,
            Reason::StartFailed | Reason::KubeadmFailed => 6,
            Reason::KubeletExited
            | Reason::KubeletConfigInvalid
            | Reason::ApiDns
            | Reason::ApiX509
            | Reason::ApiUnauthorized
            | Reason::ApiUnreachable
            | Reason::NodeRegistrationRefused
            | Reason::DiskFull
            | Reason::RuntimeUnavailable
            | Reason::CgroupDriverMismatch
            | Reason::SwapEnabled
            | Reason::JoinTimeout => 7,
        }
    }

    /// What an operator should do next.
    pub fn hint(self) -> &'static str {
        match self {
            Reason::Ok => "",
            Reason::Usage => "run `kiln-firstboot --help`",
            Reason::ContractVersion => {
                "render the node config with a kiln release that matches the image (KILN_CONTRACT=1)"
            }
            Reason::ConfigMissing => "check that the provisioner placed the file named in the message",
            Reason::ConfigInvalid => "fix the file, line and key named in the message",
            Reason::SecretMode => "chmod 0600 the file in the provisioner config",
            Reason::MetadataUnreachable => {
                "check that the instance has a metadata service and a route to it"
            }
            Reason::MetadataHopLimit => {
                "raise the IMDS hop limit (HttpPutResponseHopLimit >= 2 for containers) or allow IMDSv2 tokens"
            }
            Reason::MetadataInvalid => "the metadata answer lacked or garbled the field named in the message",
            Reason::ProviderUnknown => {
                "set PROVIDER in /etc/kiln/node.env: the platform's provider, or none to boot from node.env alone"
            }
            Reason::WriteFailed => "check that /run is a writable tmpfs with free space",
            Reason::StartFailed => "run `systemctl status kubelet` on the node",
            Reason::KubeadmFailed => {
                "kubeadm's whole output is in /run/kiln/kubeadm-join.log"
            }
            Reason::KubeletExited => "read the kubelet log lines in /run/kiln/status.json",
            Reason::KubeletConfigInvalid => {
                "kubelet refused its flags or config: the log line names the flag, field or file; fix KUBELET_EXTRA_ARGS or that file"
            }
            Reason::ApiDns => "the API server name does not resolve: check the node's DNS and API_SERVER",
            Reason::ApiX509 => "the CA in /etc/kiln/ca.crt does not match the API server's certificate",
            Reason::ApiUnauthorized => "the bootstrap token is wrong or expired: issue a new one",
            Reason::ApiUnreachable => {
                "connection to API_SERVER refused or timed out: check security groups, firewall and the endpoint"
            }
            Reason::NodeRegistrationRefused => {
                "the API server refused kubelet's Node: the log line says which policy"
            }
            Reason::DiskFull => "free or grow the disk that holds /var/lib",
            Reason::RuntimeUnavailable => {
                "the container runtime socket is missing: `systemctl status containerd`"
            }
            Reason::CgroupDriverMismatch => {
                "use the systemd cgroup driver on both sides (SystemdCgroup = true, cgroupDriver: systemd)"
            }
            Reason::SwapEnabled => "disable swap or set failSwapOn: false in the kubelet config",
            Reason::JoinTimeout => "no known failure signature: read the log lines in /run/kiln/status.json",
            Reason::Internal => "a bug in kiln-firstboot: please report it with /run/kiln/status.json",
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_upper_snake() {
        let mut seen = Vec::new();
        for r in Reason::ALL {
            let c = r.code();
            assert!(
                c.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{c}"
            );
            assert!(!seen.contains(&c), "duplicate {c}");
            seen.push(c);
        }
    }

    #[test]
    fn the_contract_version_hint_names_this_version() {
        let want = format!("KILN_CONTRACT={}", crate::contract::VERSION_TEXT);
        assert!(Reason::ContractVersion.hint().contains(&want));
    }

    #[test]
    fn every_failure_has_a_hint_and_nonzero_exit() {
        for r in Reason::ALL {
            if r != Reason::Ok {
                assert!(!r.hint().is_empty(), "{r} lacks a hint");
                assert_ne!(r.exit_code(), 0, "{r} exits 0");
            }
        }
    }
}
