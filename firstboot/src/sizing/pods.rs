//! Max pods: the published formula of each CNI mode.

use crate::contract::paths;
use crate::contract::sizing::CniMode;
use crate::sizing::table::*;
use std::fmt::Write as _;

// ---------------------------------------------------------------------------------------------
// Max pods.

/// Pods the VPC CNI can address with secondary IPs: the first IP of each ENI is the ENI's own,
/// plus 2 host-network pods (aws-node, kube-proxy). nodeadm `calculateStandardMaxPods`.
pub fn aws_secondary_ips(l: EniLimits) -> u32 {
    l.enis
        .saturating_mul(l.ipv4_per_eni.saturating_sub(1))
        .saturating_add(2)
}

/// IPv4 addresses in one delegated /28 prefix.
pub const IPS_PER_PREFIX: u32 = 16;

/// Pods the VPC CNI can address with prefix delegation (each secondary slot holds a /28);
/// only on Nitro, else the secondary-IP number. max-pods-calculator.sh.
pub fn aws_prefix_delegation(l: EniLimits) -> u32 {
    if !l.nitro {
        return aws_secondary_ips(l);
    }
    l.enis
        .saturating_mul(
            l.ipv4_per_eni
                .saturating_sub(1)
                .saturating_mul(IPS_PER_PREFIX),
        )
        .saturating_add(2)
}

/// The EKS ceiling: 110 pods up to 30 vCPUs, 250 above (max-pods-calculator.sh
/// `MAX_POD_CEILING_FOR_LOW_CPU` / `_HIGH_CPU`).
pub fn eks_ceiling(cpus: u32) -> u32 {
    if cpus > 30 {
        250
    } else {
        110
    }
}

/// AKS's default max pods with Azure CNI (node subnet).
pub const AKS_AZURE_CNI_PODS: u32 = 30;

/// AKS's default max pods with Azure CNI Overlay.
pub const AKS_AZURE_CNI_OVERLAY_PODS: u32 = 250;

/// GKE Standard's default max pods per node.
pub const GKE_PODS: u32 = 110;

/// Max pods as decided, where it came from, and a warning when a default had to stand in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaxPods {
    /// The value kubelet gets.
    pub value: u32,
    /// How it was decided, for status.json (`aws-vpc-cni: 3 ENIs x (10-1) + 2 = 29`).
    pub source: String,
    /// Set when the mode could not be applied and `DEFAULT_MAX_PODS` stood in.
    pub warning: Option<String>,
}

/// Max pods by `mode` for `instance_type`. `table` is the AWS table's text (`None` when the
/// image has none), `cpus` the online CPU count (for the EKS ceiling), `default` is
/// `DEFAULT_MAX_PODS`.
pub fn max_pods(
    mode: CniMode,
    instance_type: &str,
    cpus: Option<u32>,
    table: Option<&str>,
    default: u32,
) -> MaxPods {
    let fixed = |value: u32, source: &str| MaxPods {
        value,
        source: source.to_string(),
        warning: None,
    };
    let name = mode.name().unwrap_or("fixed");
    match mode {
        CniMode::Fixed(n) => return fixed(n, "MAX_PODS_MODE"),
        CniMode::Overlay => return fixed(default, "overlay: DEFAULT_MAX_PODS"),
        CniMode::AzureCni => return fixed(AKS_AZURE_CNI_PODS, "azure-cni: AKS default"),
        CniMode::AzureCniOverlay => {
            return fixed(AKS_AZURE_CNI_OVERLAY_PODS, "azure-cni-overlay: AKS default")
        }
        CniMode::Gke => return fixed(GKE_PODS, "gke: GKE Standard default"),
        CniMode::AwsVpcCni | CniMode::AwsVpcCniPrefixDelegation => {}
    }
    let fallback = |why: String| {
        MaxPods {
        value: default,
        source: format!("{name}: DEFAULT_MAX_PODS"),
        warning: Some(format!(
            "{why}: max pods is DEFAULT_MAX_PODS={default}, which may exceed the IP addresses the VPC CNI can give this node; set MAX_PODS in {} or refresh the table (scripts/aws-eni-table.sh)",
            paths::NODE_ENV
        )),
    }
    };
    let Some(table) = table else {
        return fallback(format!(
            "MAX_PODS_MODE={name} but {} is missing",
            paths::AWS_ENI_TABLE
        ));
    };
    if instance_type.is_empty() {
        return fallback(format!(
            "MAX_PODS_MODE={name} but the metadata gave no instance type"
        ));
    }
    let Some(l) = lookup(table, instance_type) else {
        return fallback(format!(
            "instance type {instance_type:?} is not in {}",
            paths::AWS_ENI_TABLE
        ));
    };
    let mut source = String::with_capacity(96);
    let uncapped = if mode == CniMode::AwsVpcCniPrefixDelegation && l.nitro {
        let _ = write!(
            source,
            "{name}: {} ENIs x ({}-1) x {IPS_PER_PREFIX} + 2",
            l.enis, l.ipv4_per_eni
        );
        aws_prefix_delegation(l)
    } else {
        let _ = write!(
            source,
            "{name}: {} ENIs x ({}-1) + 2",
            l.enis, l.ipv4_per_eni
        );
        if mode == CniMode::AwsVpcCniPrefixDelegation {
            source.push_str(" (not Nitro: no prefix delegation)");
        }
        aws_secondary_ips(l)
    };
    let _ = write!(source, " = {uncapped}");
    let mut warning = None;
    let ceiling = match cpus {
        Some(c) => eks_ceiling(c),
        None => {
            warning = Some(
                "the CPU count is unknown: max pods is capped at 110, the EKS ceiling for up to 30 vCPUs"
                    .to_string(),
            );
            eks_ceiling(0)
        }
    };
    if uncapped > ceiling {
        let _ = write!(source, ", capped at {ceiling}");
    }
    MaxPods {
        value: uncapped.min(ceiling),
        source,
        warning,
    }
}
