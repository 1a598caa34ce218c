//! `/run/kiln/kubelet.env`, kubelet's environment (`docs/contract.md#kubeletenv`): its keys
//! in the order the contract fixes. kiln-firstboot writes it (`crate::kubelet_env`);
//! kubelet.service reads it with `EnvironmentFile=`.

pub use super::node_env::{
    HTTPS_PROXY, HTTP_PROXY, KUBELET_EXTRA_ARGS, MAX_PODS, NODE_IP, NODE_LABELS, NODE_NAME,
    NODE_TAINTS, NO_PROXY, PROVIDER,
};
pub use super::sizing::{EVICTION_HARD, KUBE_RESERVED, SYSTEM_RESERVED};
pub use crate::contract::version::KILN_CONTRACT;

/// The cloud instance id.
pub const INSTANCE_ID: &str = "INSTANCE_ID";
/// Instance type, VM size or machine type.
pub const INSTANCE_TYPE: &str = "INSTANCE_TYPE";
/// Availability zone.
pub const ZONE: &str = "ZONE";
/// Region.
pub const REGION: &str = "REGION";
/// kubelet's `--provider-id`.
pub const PROVIDER_ID: &str = "PROVIDER_ID";
/// The complete kubelet flags, always double-quoted.
pub const KUBELET_ARGS: &str = "KUBELET_ARGS";

/// Every key in the order it is written; the reservation and proxy keys appear only when set.
pub const ORDER: [&str; 20] = [
    KILN_CONTRACT,
    PROVIDER,
    NODE_NAME,
    NODE_IP,
    INSTANCE_ID,
    INSTANCE_TYPE,
    ZONE,
    REGION,
    PROVIDER_ID,
    MAX_PODS,
    KUBE_RESERVED,
    SYSTEM_RESERVED,
    EVICTION_HARD,
    NODE_LABELS,
    NODE_TAINTS,
    KUBELET_EXTRA_ARGS,
    HTTP_PROXY,
    HTTPS_PROXY,
    NO_PROXY,
    KUBELET_ARGS,
];
