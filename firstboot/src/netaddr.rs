//! Node addresses: which metadata answers may become a node IP, and which address of which
//! family kubelet gets (`--node-ip`: one address, or kubelet's dual-stack `v4,v6` pair).
//! Pure: the route to the API server and DNS are the caller's, passed in as values.

use std::fmt;
use std::net::IpAddr;

pub use crate::contract::node_env::{parse_node_ip, IpFamily};

/// Why `ip` cannot be a node's address, or `None` when it can. A node address must reach
/// and be reached from other nodes: unspecified, loopback, link-local, multicast and
/// broadcast addresses cannot, and an IPv4-mapped IPv6 address is an IPv4 address in
/// disguise.
pub fn unusable(ip: IpAddr) -> Option<&'static str> {
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    if ip.is_multicast() {
        return Some("multicast");
    }
    match ip {
        IpAddr::V4(v4) if v4.is_link_local() => Some("link-local"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("broadcast"),
        // fe80::/10.
        IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80 => Some("link-local"),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Some("IPv4-mapped"),
        _ => None,
    }
}

/// One address a metadata source offers, named by the field it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The field, as the source names it (`meta-data/local-ipv4`, `…/ipv6/ipAddress/0/…`).
    pub field: String,
    /// The value as answered (trimmed).
    pub value: String,
}

impl Candidate {
    /// A candidate from `field` with `value`.
    pub fn new(field: impl Into<String>, value: impl Into<String>) -> Candidate {
        Candidate {
            field: field.into(),
            value: value.into(),
        }
    }
}

/// A candidate that was not taken, and why: a warning, never a failure by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The field it came from.
    pub field: String,
    /// The value as answered.
    pub value: String,
    /// `loopback`, `link-local`, …, or `not an IP address`.
    pub why: &'static str,
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.why == NOT_AN_ADDRESS {
            write!(
                f,
                "{}: {:?} is not an IP address; trying the next source",
                self.field, self.value
            )
        } else {
            write!(
                f,
                "{}: refused {} ({} address, not a node address); trying the next source",
                self.field, self.value, self.why
            )
        }
    }
}

const NOT_AN_ADDRESS: &str = "not an IP address";

/// The first usable address of each family among `candidates` (in their order), and every
/// candidate refused on the way. Empty values are "not set" and neither taken nor refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offered {
    /// The first usable IPv4 address.
    pub v4: Option<IpAddr>,
    /// The first usable IPv6 address.
    pub v6: Option<IpAddr>,
    /// What was refused, in candidate order.
    pub refused: Vec<Refused>,
}

impl Offered {
    /// Sorts `candidates` into the first usable address per family and the refusals.
    pub fn from_candidates(candidates: &[Candidate]) -> Offered {
        let mut out = Offered::default();
        for c in candidates {
            let value = c.value.trim();
            if value.is_empty() {
                continue;
            }
            let why = match value.parse::<IpAddr>() {
                Err(_) => NOT_AN_ADDRESS,
                Ok(ip) => match unusable(ip) {
                    Some(why) => why,
                    None => {
                        let slot = if ip.is_ipv4() {
                            &mut out.v4
                        } else {
                            &mut out.v6
                        };
                        slot.get_or_insert(ip);
                        continue;
                    }
                },
            };
            out.refused.push(Refused {
                field: c.field.clone(),
                value: value.to_string(),
                why,
            });
        }
        out
    }

    fn get(&self, family: IpFamily) -> Option<IpAddr> {
        match family {
            IpFamily::Ipv4 => self.v4,
            IpFamily::Ipv6 => self.v6,
            IpFamily::Dual => None,
        }
    }
}

/// The family to use when node.env sets no `IP_FAMILY`: the API server's family when the
/// metadata offers an address of it, else the one family the metadata offers, else the API
/// server's (the route to it gives the address). `api` is the API server's family when it
/// is known; `None` counts as IPv4. Never `Dual`: announcing a second family is a cluster
/// decision, not one a node can guess.
pub fn default_family(offered: &Offered, api: Option<IpFamily>) -> IpFamily {
    let api = match api {
        Some(IpFamily::Ipv6) => IpFamily::Ipv6,
        _ => IpFamily::Ipv4,
    };
    let other = if api == IpFamily::Ipv4 {
        IpFamily::Ipv6
    } else {
        IpFamily::Ipv4
    };
    if offered.get(api).is_none() && offered.get(other).is_some() {
        other
    } else {
        api
    }
}

/// Whether [`default_family`] needs the API server's family: only when the metadata offers
/// both families or neither. Lets the caller skip a DNS lookup of the API server's name.
pub fn needs_api_family(offered: &Offered) -> bool {
    offered.v4.is_some() == offered.v6.is_some()
}

/// The `--node-ip` value for `family`: metadata's addresses, with the route to the API
/// server (`route`, asked at most once and only when needed) filling the one missing
/// address of its own family. In a dual pair the API server's family (`api`, IPv4 when
/// unknown) comes first: kubelet takes the first address as the node's primary one.
pub fn node_ip(
    family: IpFamily,
    offered: &Offered,
    api: Option<IpFamily>,
    route: impl FnOnce() -> Result<IpAddr, String>,
) -> Result<String, String> {
    let mut route = Some(route);
    let mut pick = |want: IpFamily| -> Result<IpAddr, String> {
        if let Some(ip) = offered.get(want) {
            return Ok(ip);
        }
        let Some(r) = route.take() else {
            return Err(format!("expected an {} address, found none", want.name()));
        };
        let ip = r()?;
        if IpFamily::of(ip) != want {
            return Err(format!(
                "expected an {} address from the metadata or the route to API_SERVER, found none in the metadata and {ip} on the route",
                want.name()
            ));
        }
        Ok(ip)
    };
    match family {
        IpFamily::Ipv4 | IpFamily::Ipv6 => pick(family).map(|ip| ip.to_string()),
        IpFamily::Dual => {
            let first = match api {
                Some(IpFamily::Ipv6) => IpFamily::Ipv6,
                _ => IpFamily::Ipv4,
            };
            let second = if first == IpFamily::Ipv4 {
                IpFamily::Ipv6
            } else {
                IpFamily::Ipv4
            };
            let a = pick(first)?;
            let b = pick(second).map_err(|e| format!("IP_FAMILY=dual: {e}"))?;
            Ok(format!("{a},{b}"))
        }
    }
}

/// The family of the host in an `https://host[:port]` URL when the host is an address
/// literal; `None` for a name (resolving it is the caller's business).
pub fn literal_family(api_server: &str) -> Option<IpFamily> {
    let hostport = api_server.strip_prefix("https://").unwrap_or(api_server);
    let hostport = hostport.split('/').next().unwrap_or("");
    if let Some(v6) = hostport.strip_prefix('[') {
        let host = v6.split(']').next().unwrap_or("");
        return host.parse::<IpAddr>().ok().map(IpFamily::of);
    }
    let host = hostport.split(':').next().unwrap_or("");
    host.parse::<IpAddr>().ok().map(IpFamily::of)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unusable_addresses_are_named() {
        let table: &[(&str, Option<&str>)] = &[
            ("10.0.3.7", None),
            ("172.31.44.13", None),
            ("2600:1f16:aeb:b20b:9d87:a4af:5cc9:73dc", None),
            ("fd85:534e:4cd6:ab02::5", None),
            ("0.0.0.0", Some("unspecified")),
            ("::", Some("unspecified")),
            ("127.0.0.1", Some("loopback")),
            ("127.8.9.10", Some("loopback")),
            ("::1", Some("loopback")),
            ("169.254.169.254", Some("link-local")),
            ("fe80::1", Some("link-local")),
            ("febf::1", Some("link-local")),
            ("fec0::1", None),
            ("224.0.0.1", Some("multicast")),
            ("ff02::1", Some("multicast")),
            ("255.255.255.255", Some("broadcast")),
            ("::ffff:10.0.0.1", Some("IPv4-mapped")),
        ];
        for (ip, want) in table {
            assert_eq!(unusable(ip.parse().unwrap()), *want, "{ip}");
        }
    }

    fn c(field: &str, value: &str) -> Candidate {
        Candidate::new(field, value)
    }

    #[test]
    fn the_first_usable_address_per_family_is_taken_and_refusals_are_named() {
        let o = Offered::from_candidates(&[
            c("local-ipv4", "0.0.0.0"),
            c("ipv6", ""),
            c("macs/a/local-ipv4s", "10.0.0.9"),
            c("macs/a/ipv6s", "fe80::1"),
            c("macs/b/local-ipv4s", "10.0.0.10"),
            c("macs/b/ipv6s", "garbage"),
            c("macs/c/ipv6s", " 2600::5 "),
        ]);
        assert_eq!(o.v4, Some("10.0.0.9".parse().unwrap()));
        assert_eq!(o.v6, Some("2600::5".parse().unwrap()));
        let msgs: Vec<String> = o.refused.iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            [
                "local-ipv4: refused 0.0.0.0 (unspecified address, not a node address); trying the next source",
                "macs/a/ipv6s: refused fe80::1 (link-local address, not a node address); trying the next source",
                "macs/b/ipv6s: \"garbage\" is not an IP address; trying the next source",
            ]
        );
    }

    #[test]
    fn the_default_family_follows_the_metadata_then_the_api_server() {
        let v4 = Some("10.0.0.1".parse().unwrap());
        let v6 = Some("2600::1".parse().unwrap());
        let offer = |v4, v6| Offered {
            v4,
            v6,
            refused: vec![],
        };
        use IpFamily::*;
        // (v4 offered, v6 offered, API server family, expected, DNS needed)
        let table = [
            (v4, None, None, Ipv4, false),
            (v4, None, Some(Ipv6), Ipv4, false),
            (None, v6, None, Ipv6, false),
            (None, v6, Some(Ipv4), Ipv6, false),
            (v4, v6, Some(Ipv4), Ipv4, true),
            (v4, v6, Some(Ipv6), Ipv6, true),
            (v4, v6, None, Ipv4, true),
            (None, None, Some(Ipv6), Ipv6, true),
            (None, None, None, Ipv4, true),
        ];
        for (a, b, api, want, dns) in table {
            let o = offer(a, b);
            assert_eq!(default_family(&o, api), want, "{a:?} {b:?} {api:?}");
            assert_eq!(needs_api_family(&o), dns, "{a:?} {b:?}");
        }
    }

    #[test]
    fn node_ip_per_family_with_the_route_as_the_last_source() {
        let both = Offered {
            v4: Some("10.0.0.1".parse().unwrap()),
            v6: Some("2600::1".parse().unwrap()),
            refused: vec![],
        };
        let v4_only = Offered {
            v6: None,
            ..both.clone()
        };
        let none = Offered::default();
        let no_route = || -> Result<IpAddr, String> { panic!("route asked") };
        let route4 = || Ok("10.9.9.9".parse().unwrap());
        let route6 = || Ok("2600::9".parse().unwrap());
        use IpFamily::*;
        assert_eq!(node_ip(Ipv4, &both, None, no_route).unwrap(), "10.0.0.1");
        assert_eq!(node_ip(Ipv6, &both, None, no_route).unwrap(), "2600::1");
        assert_eq!(
            node_ip(Dual, &both, None, no_route).unwrap(),
            "10.0.0.1,2600::1"
        );
        assert_eq!(
            node_ip(Dual, &both, Some(Ipv6), no_route).unwrap(),
            "2600::1,10.0.0.1"
        );
        assert_eq!(node_ip(Ipv4, &none, None, route4).unwrap(), "10.9.9.9");
        assert_eq!(
            node_ip(Dual, &v4_only, Some(Ipv6), route6).unwrap(),
            "2600::9,10.0.0.1"
        );
        let e = node_ip(Ipv6, &v4_only, None, route4).unwrap_err();
        assert!(
            e.contains("expected an ipv6 address") && e.contains("10.9.9.9"),
            "{e}"
        );
        let e = node_ip(Dual, &none, None, route4).unwrap_err();
        assert!(
            e.contains("IP_FAMILY=dual: expected an ipv6 address"),
            "{e}"
        );
        let e = node_ip(Ipv4, &none, None, || Err("no route".to_string())).unwrap_err();
        assert_eq!(e, "no route");
    }

    #[test]
    fn api_server_literals() {
        use IpFamily::*;
        for (url, want) in [
            ("https://10.0.0.10:6443", Some(Ipv4)),
            ("https://10.0.0.10", Some(Ipv4)),
            ("https://[fd00::10]:6443", Some(Ipv6)),
            ("https://[2600::1]", Some(Ipv6)),
            ("https://api.example.com:6443", None),
            ("https://api.example.com", None),
        ] {
            assert_eq!(literal_family(url), want, "{url}");
        }
    }
}
