//! The metadata services read through [`Table`]: where each document is, which header or
//! session token it needs, and where each value is in it. The sources of every rule
//! (cloud-init's and afterburn's readers, each platform's cloud controller manager for the
//! provider ID) are in docs/firstboot.md, "Platforms"; the fixtures each table is tested
//! against are in `tests/fixtures/<provider>/` and `tests/fixtures/captured/`.

use super::common::LINK_LOCAL;
use super::table::{Doc::*, How::*, Pick, Table, Token};
use crate::contract::Provider;

/// Hetzner Cloud: `GET /hetzner/v1/metadata` (YAML) and its `private-networks` list.
/// Provider ID `hcloud://<id>` (hcloud-cloud-controller-manager `providerid.FromCloudServerID`);
/// the CCM's region is the location (`hel1`), its zone the `availability-zone`.
pub static HETZNER: Table = Table {
    provider: Provider::Hetzner,
    base: LINK_LOCAL,
    headers: &[],
    token: None,
    docs: &[
        ("/hetzner/v1/metadata", Required),
        ("/hetzner/v1/metadata/private-networks", Optional),
    ],
    fields: [
        &[Pick(0, "instance-id", Text)],
        &[Pick(0, "hostname", Lower)],
        &[],
        &[Pick(0, "availability-zone", Text)],
        &[Pick(0, "availability-zone", Location)],
        &[],
    ],
    addresses: &[
        Pick(1, "*/ip", Text),
        Pick(0, "public-ipv4", Text),
        Pick(0, "network-config/config/*/subnets/*/address", Address),
    ],
    provider_id: "hcloud://{id}",
    serial_is_id: true,
};

/// DigitalOcean: `GET /metadata/v1.json`. Provider ID `digitalocean://<droplet id>`
/// (digitalocean-cloud-controller-manager `do/droplets.go`); the CCM needs the private IPv4,
/// so it comes first. `anchor_ipv4` (the reserved-IP anchor) is never a node address.
pub static DIGITALOCEAN: Table = Table {
    provider: Provider::Digitalocean,
    base: LINK_LOCAL,
    headers: &[],
    token: None,
    docs: &[("/metadata/v1.json", Required)],
    fields: [
        &[Pick(0, "droplet_id", Text)],
        &[Pick(0, "hostname", Lower)],
        &[],
        &[],
        &[Pick(0, "region", Text)],
        &[],
    ],
    addresses: &[
        Pick(0, "interfaces/private/*/ipv4/ip_address", Text),
        Pick(0, "interfaces/public/*/ipv4/ip_address", Text),
        Pick(0, "interfaces/public/*/ipv6/ip_address", Text),
    ],
    provider_id: "digitalocean://{id}",
    serial_is_id: false,
};

/// Oracle Cloud: `/opc/v2/instance/` and `/opc/v2/vnics/` with `Authorization: Bearer
/// Oracle`. Provider ID `oci://<ocid>` (oci-cloud-controller-manager: the provider name and
/// the instance OCID); the zone is the availability domain after its tenancy prefix.
pub static ORACLECLOUD: Table = Table {
    provider: Provider::Oraclecloud,
    base: LINK_LOCAL,
    headers: &[("Authorization", "Bearer Oracle")],
    token: None,
    docs: &[
        ("/opc/v2/instance/", Required),
        ("/opc/v2/vnics/", Optional),
    ],
    fields: [
        &[Pick(0, "id", Text)],
        &[Pick(0, "hostname", Lower)],
        &[Pick(0, "shape", Text)],
        &[Pick(0, "availabilityDomain", AfterColon)],
        &[Pick(0, "region", Text)],
        &[],
    ],
    addresses: &[
        Pick(1, "*/privateIp", Text),
        Pick(1, "*/ipv6Addresses/*", Text),
    ],
    provider_id: "oci://{id}",
    serial_is_id: false,
};

/// Akamai (Linode): a token from `PUT /v1/token`, then `/v1/instance` and `/v1/network` as
/// JSON. Provider ID `linode://<id>` (linode-cloud-controller-manager `ProviderIDPrefix`);
/// Linode has no zones. A VPC address first, then the private, public and SLAAC ones.
pub static AKAMAI: Table = Table {
    provider: Provider::Akamai,
    base: LINK_LOCAL,
    headers: &[("Accept", "application/json")],
    token: Some(&Token {
        path: "/v1/token",
        headers: &[("Metadata-Token-Expiry-Seconds", "300")],
        body: "",
        field: "",
        header: "Metadata-Token",
        prefix: "",
    }),
    docs: &[("/v1/instance", Required), ("/v1/network", Required)],
    fields: [
        &[Pick(0, "id", Text)],
        &[Pick(0, "label", Lower)],
        &[Pick(0, "type", Text)],
        &[],
        &[Pick(0, "region", Text)],
        &[],
    ],
    addresses: &[
        Pick(1, "interfaces/*/ipam_address", Address),
        Pick(1, "ipv4/private/*", Address),
        Pick(1, "ipv4/public/*", Address),
        Pick(1, "ipv6/slaac", Address),
    ],
    provider_id: "linode://{id}",
    serial_is_id: false,
};

/// IBM Cloud VPC: an instance identity token, then `/metadata/v1/instance`, both at API
/// version 2022-03-01 (the first that takes instance identity tokens; from 2025-08-26 the
/// token path moves). Provider ID
/// `ibm://<account>///<cluster>/<instance id>` (cloud-provider-ibm `providerIDV2`, as
/// cluster-api-provider-ibmcloud sets it), the account from the instance's CRN.
pub static IBMCLOUD: Table = Table {
    provider: Provider::Ibmcloud,
    base: LINK_LOCAL,
    headers: &[],
    token: Some(&Token {
        path: "/instance_identity/v1/token?version=2022-03-01",
        headers: &[
            ("Metadata-Flavor", "ibm"),
            ("Content-Type", "application/json"),
        ],
        body: "{\"expires_in\": 300}",
        field: "access_token",
        header: "Authorization",
        prefix: "Bearer ",
    }),
    docs: &[("/metadata/v1/instance?version=2022-03-01", Required)],
    fields: [
        &[Pick(0, "id", Text)],
        &[Pick(0, "name", Lower)],
        &[Pick(0, "profile/name", Text)],
        &[Pick(0, "zone/name", Text)],
        &[Pick(0, "zone/name", ZoneRegion)],
        &[Pick(0, "crn", CrnAccount)],
    ],
    addresses: &[
        Pick(0, "primary_network_interface/primary_ip/address", Text),
        Pick(0, "primary_network_interface/primary_ipv4_address", Text),
    ],
    provider_id: "ibm://{aux}///{cluster}/{id}",
    serial_is_id: false,
};

/// Scaleway: `GET http://169.254.42.42/conf?format=json`. Provider ID
/// `scaleway://instance/<zone>/<id>` (scaleway-cloud-controller-manager `BuildProviderID`).
pub static SCALEWAY: Table = Table {
    provider: Provider::Scaleway,
    base: "http://169.254.42.42",
    headers: &[],
    token: None,
    docs: &[("/conf?format=json", Required)],
    fields: [
        &[Pick(0, "id", Text)],
        &[Pick(0, "hostname", Lower)],
        &[Pick(0, "commercial_type", Text)],
        &[Pick(0, "zone", Text)],
        &[Pick(0, "zone", ZoneRegion)],
        &[],
    ],
    addresses: &[
        Pick(0, "private_ip", Text),
        Pick(0, "public_ip/address", Text),
        Pick(0, "public_ips/*/address", Text),
        Pick(0, "ipv6/address", Text),
    ],
    provider_id: "scaleway://instance/{zone}/{id}",
    serial_is_id: false,
};

/// OpenStack Nova's metadata service: `openstack/latest/meta_data.json` for identity, the
/// EC2-compatible leaves for what it lacks (the private IPv4, the flavor name), and every
/// fixed address of `network_data.json` (2015-10-15; older clouds answer 404). Provider ID
/// `openstack:///<uuid>` (cloud-provider-openstack), node name the server name lower-cased
/// (the controller finds a node's server by its name).
pub static OPENSTACK: Table = Table {
    provider: Provider::Openstack,
    base: LINK_LOCAL,
    headers: &[],
    token: None,
    docs: &[
        ("/openstack/latest/meta_data.json", Required),
        ("/openstack/latest/network_data.json", Optional),
        ("/latest/meta-data/local-ipv4", Leaf),
        ("/latest/meta-data/instance-type", Leaf),
    ],
    fields: [
        &[Pick(0, "uuid", Text)],
        &[Pick(0, "name", Lower)],
        &[Pick(3, "", Text)],
        &[Pick(0, "availability_zone", Text)],
        &[],
        &[],
    ],
    addresses: &[Pick(2, "", Text), Pick(1, "networks/*/ip_address", Text)],
    provider_id: "openstack:///{id}",
    serial_is_id: false,
};

/// An OpenStack config drive's documents (files of the volume labelled `config-2`): Nova's
/// `meta_data.json`, `network_data.json`, and the EC2-style `meta-data.json`. The provider
/// ID is left to the cloud controller (OpenStack's finds a node by name; Metal3, Nutanix and
/// KubeVirt set their own).
pub static CONFIGDRIVE: Table = Table {
    provider: Provider::Configdrive,
    base: "",
    headers: &[],
    token: None,
    docs: &[
        ("openstack/latest/meta_data.json", Required),
        ("openstack/latest/network_data.json", Optional),
        ("ec2/latest/meta-data.json", Optional),
    ],
    fields: [
        &[Pick(0, "uuid", Text)],
        &[Pick(0, "name", Lower), Pick(0, "hostname", Lower)],
        &[
            Pick(2, "instance-type", Text),
            Pick(0, "instance_type", Text),
        ],
        &[Pick(0, "availability_zone", Text)],
        &[],
        &[],
    ],
    addresses: &[
        Pick(2, "local-ipv4", Text),
        Pick(1, "networks/*/ip_address", Text),
    ],
    provider_id: "",
    serial_is_id: false,
};

/// A NoCloud seed's documents (files of the volume labelled `cidata`, or under a `seedfrom`
/// URL): `meta-data` and `network-config` (netplan v2 or network config v1).
pub static NOCLOUD: Table = Table {
    provider: Provider::Nocloud,
    base: "",
    headers: &[],
    token: None,
    docs: &[("meta-data", Required), ("network-config", Optional)],
    fields: [
        &[Pick(0, "instance-id", Text)],
        &[Pick(0, "local-hostname", Lower)],
        &[],
        &[],
        &[],
        &[],
    ],
    addresses: &[
        Pick(1, "ethernets/*/addresses/*", Address),
        Pick(1, "network/ethernets/*/addresses/*", Address),
        Pick(1, "config/*/subnets/*/address", Address),
    ],
    provider_id: "",
    serial_is_id: false,
};
