//! node_env's tests.
use super::*;

#[test]
fn the_choice_lists_are_the_enums() {
    let names: Vec<&str> = std::iter::once("auto")
        .chain(Provider::ALL.iter().map(|p| p.name()))
        .collect();
    assert_eq!(names, PROVIDER_CHOICES);
    assert_eq!(
        PROVIDER_EXPECTED,
        "auto, aws, azure, gcp, openstack, vmware, qemu, none, configdrive, nocloud, hetzner, digitalocean, oraclecloud, akamai, ibmcloud or scaleway"
    );
    for m in JOIN_MODES {
        assert_eq!(JoinMode::parse(m).map(JoinMode::as_str), Some(m));
    }
}
use crate::contract::envfile::parse;

#[test]
fn providers_parse_and_print_their_names() {
    for p in Provider::ALL {
        assert_eq!(Provider::parse_choice(p.name()), Ok(Some(p)));
        assert_eq!(p.to_string(), p.name());
        assert!(PROVIDER_EXPECTED.contains(p.name()), "{p}");
    }
    assert_eq!(Provider::parse_choice("auto"), Ok(None));
    assert_eq!(Provider::parse_choice(""), Ok(None));
    for bad in ["AWS", "DigitalOcean", " aws", "linode"] {
        let e = Provider::parse_choice(bad).unwrap_err().to_string();
        assert!(e.contains(PROVIDER_EXPECTED) && e.contains(bad), "{e}");
    }
}

#[test]
fn join_modes() {
    for m in [JoinMode::Kubelet, JoinMode::Kubeadm] {
        assert_eq!(JoinMode::parse(m.as_str()), Some(m));
    }
    assert_eq!(JoinMode::parse(""), Some(JoinMode::Kubelet));
    assert_eq!(JoinMode::parse("ssh"), None);
}

#[test]
fn a_full_node_env_types_every_key() {
    let env = parse(
        "KILN_CONTRACT=1\nAPI_SERVER=https://127.0.0.1:6443\nCLUSTER_NAME=prod\n\
         JOIN_MODE=kubeadm\nPROVIDER=gcp\nNODE_NAME=w1\nNODE_IP=10.0.0.7\n\
         NODE_LABELS=a=b\nNODE_TAINTS=gpu:NoSchedule\nMAX_PODS=58\nCLUSTER_DNS=10.96.0.10\n\
         KUBELET_EXTRA_ARGS=\" --v=2 \"\nKUBELET_SERVER_TLS_BOOTSTRAP=true\nKILN_DEADLINE=600\nSWAP_FILE_SIZE=4096000\nNO_PROXY=.local\nHTTP_PROXY=http://p:3128\n",
    )
    .unwrap();
    let n = NodeEnv::from_env(&env).unwrap();
    assert_eq!(
        n,
        NodeEnv {
            api_server: "https://127.0.0.1:6443".into(),
            cluster_name: "prod".into(),
            join_mode: JoinMode::Kubeadm,
            provider: Some(Provider::Gcp),
            node_name: Some("w1".into()),
            node_ip: Some("10.0.0.7".into()),
            ip_family: None,
            metadata_url: None,
            node_labels: "a=b".into(),
            node_taints: "gpu:NoSchedule".into(),
            max_pods: Some(58),
            cluster_dns: "10.96.0.10".into(),
            kubelet_extra_args: " --v=2 ".into(),
            server_tls_bootstrap: true,
            deadline_secs: Some(600),
            swap_file_size: Some(4_096_000),
            http_proxy: "http://p:3128".into(),
            https_proxy: String::new(),
            no_proxy: ".local".into(),
        }
    );
    assert_eq!(
        n.proxies().collect::<Vec<_>>(),
        [(HTTP_PROXY, "http://p:3128"), (NO_PROXY, ".local")]
    );
}

#[test]
fn node_ip_values() {
    use IpFamily::*;
    for (v, want) in [
        ("10.0.3.7", Ok(Ipv4)),
        ("2600::1", Ok(Ipv6)),
        ("10.0.3.7,2600::1", Ok(Dual)),
        ("2600::1,10.0.3.7", Ok(Dual)),
    ] {
        assert_eq!(parse_node_ip(v), want, "{v}");
    }
    for bad in [
        "",
        "10.0.0",
        "10.0.0.1,10.0.0.2",
        "::1,::2",
        "10.0.0.1,",
        "10.0.0.1,2600::1,10.0.0.2",
        " 10.0.0.1",
    ] {
        assert!(parse_node_ip(bad).is_err(), "{bad}");
    }
}

#[test]
fn ip_family_and_node_ip_agree() {
    for (text, ok) in [
        ("IP_FAMILY=dual\n", true),
        ("IP_FAMILY=ipv6\nNODE_IP=2600::1\n", true),
        ("IP_FAMILY=dual\nNODE_IP=10.0.0.1,2600::1\n", true),
        ("IP_FAMILY=ipv4\nNODE_IP=2600::1\n", false),
        ("IP_FAMILY=dual\nNODE_IP=10.0.0.1\n", false),
        ("IP_FAMILY=both\n", false),
    ] {
        let env = parse(text).unwrap();
        assert_eq!(NodeEnv::from_env(&env).is_ok(), ok, "{text}");
    }
    let env = parse("IP_FAMILY=dual\nMETADATA_URL=aws-ipv6\n").unwrap();
    let n = NodeEnv::from_env(&env).unwrap();
    assert_eq!(n.ip_family, Some(IpFamily::Dual));
    assert_eq!(n.metadata_url.as_deref(), Some("aws-ipv6"));
    for bad in [
        "METADATA_URL=https://x\n",
        "METADATA_URL=aws\n",
        "METADATA_URL=http://\n",
        "METADATA_URL=\"http://a b\"\n",
    ] {
        let env = parse(bad).unwrap();
        assert!(NodeEnv::from_env(&env).is_err(), "{bad}");
    }
}

#[test]
fn the_first_bad_entry_in_file_order_is_reported() {
    let env = parse("NODE_IP=x\nMAX_PODS=0\n").unwrap();
    let e = NodeEnv::from_env(&env).unwrap_err();
    assert_eq!(
        e.to_string(),
        "NODE_IP: expected an IP address, or an IPv4 and an IPv6 address separated by a comma, found \"x\""
    );
}
