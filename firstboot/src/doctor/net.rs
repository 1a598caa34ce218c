//! What crosses the network: the clock against the metadata service, proxies, and the API
//! server's TLS certificate against the cluster CA.

use std::time::Duration;

use super::model::{Check, Node};
use super::tls;
use super::x509::{self, format_time, Cert};
use crate::contract::node_env::{
    API_SERVER, HTTPS_PROXY, HTTP_PROXY, METADATA_URL, NO_PROXY, PROVIDER,
};
use crate::contract::Provider;
use crate::http::{unix_now_ms, Client};
use crate::provider;

/// The clock offset beyond which certificates break: kube-controller-manager's CSR signer
/// backdates a new certificate's notBefore by 5 minutes
/// (pkg/controller/certificates/signer/signer.go, `Backdate: 5 * time.Minute`), so a node
/// more than that behind sees its fresh kubelet certificate as not yet valid.
const CLOCK_FAIL_SECS: i64 = 300;
/// Beyond this, the clock is not synchronised (NTP keeps nodes within milliseconds).
const CLOCK_WARN_SECS: i64 = 5;

/// Parses an HTTP `Date` (IMF-fixdate, RFC 9110 §5.6.7: `Sun, 06 Nov 1994 08:49:37 GMT`).
pub fn http_date(v: &str) -> Option<i64> {
    let mut p = v.split_whitespace();
    let (_, d, mon, y, hms, gmt) = (
        p.next()?,
        p.next()?,
        p.next()?,
        p.next()?,
        p.next()?,
        p.next()?,
    );
    if gmt != "GMT" || p.next().is_some() {
        return None;
    }
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let mo = MONTHS.iter().position(|m| *m == mon)? as i64 + 1;
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (h, mi, s) = (t.next()??, t.next()??, t.next()??);
    x509::epoch_seconds(y.parse().ok()?, mo, d.parse().ok()?, h, mi, s)
}

/// Epoch seconds as an IMF-fixdate, the form [`http_date`] reads.
pub fn imf_fixdate(t: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    // format_time gives `YYYY-MM-DD HH:MM:SSZ`.
    let f = format_time(t);
    let (y, m, d) = (&f[0..4], f[5..7].parse::<usize>().unwrap_or(1), &f[8..10]);
    format!(
        "{}, {d} {} {y} {} GMT",
        DAYS[t.div_euclid(86_400).rem_euclid(7) as usize],
        MONTHS[m - 1],
        &f[11..19]
    )
}

/// The node's clock against the metadata service's `Date` header: the one the run saw when
/// it read its metadata (`Options::date_seen`, no request made), else a `GET` of the
/// metadata URL.
pub(crate) fn clock(node: &Node) -> Check {
    if let Some(seen) = &node.opts.date_seen {
        return judge_clock(
            &seen.url,
            Some(&seen.date),
            (seen.before_ms, seen.after_ms),
            " (seen by the run)",
        );
    }
    if !node.opts.clock {
        return Check::skip(
            CLOCK,
            "the run did not reach the metadata service, so doctor does not either",
        );
    }
    let url = node
        .opts
        .metadata_url
        .as_deref()
        .or(node.node(METADATA_URL))
        .map(|u| provider::named_endpoint(u).unwrap_or(u).to_string())
        .or_else(|| {
            // A named cloud provider has its service; `auto` and the local providers (and
            // the volumes) are not guessed at.
            let p = node.node(PROVIDER).and_then(Provider::from_name)?;
            provider::service_url(p).map(str::to_string)
        })
        .filter(|u| !u.starts_with('/'));
    let Some(url) = url else {
        return Check::skip(
            CLOCK,
            "no metadata service to compare with (METADATA_URL, PROVIDER)",
        );
    };
    let before = unix_now_ms();
    let resp = Client::once(node.opts.timeout).send(
        "GET",
        &url,
        &[("Metadata", "true"), ("Metadata-Flavor", "Google")],
    );
    let after = unix_now_ms();
    match resp {
        Ok(r) => judge_clock(&url, r.header("date"), (before, after), ""),
        Err(e) => Check::skip(
            CLOCK,
            format!("{url}: no answer to compare the clock with ({e})"),
        ),
    }
}

const CLOCK: &str = "clock";

/// The verdict on the node's clock from a `Date` header and the node's clock before and
/// after the exchange that carried it (ms since the epoch).
fn judge_clock(url: &str, date: Option<&str>, (before, after): (i64, i64), how: &str) -> Check {
    let Some(date) = date.and_then(http_date) else {
        return Check::skip(
            CLOCK,
            format!("{url}: the answer has no usable Date header"),
        );
    };
    // The header has whole seconds: compare with the middle of the exchange, and call a
    // difference within a second (plus the round trip) zero.
    let mid = (before + after) / 2;
    let offset_ms = date * 1000 + 500 - mid;
    let slack = 1000 + (after - before);
    let offset = if offset_ms.abs() <= slack {
        0
    } else {
        (offset_ms as f64 / 1000.0).round() as i64
    };
    let text = format!(
        "node clock {} against {url}'s Date ({}){how}",
        match offset {
            0 => "agrees within a second".to_string(),
            o if o > 0 => format!("is {o} s behind"),
            o => format!("is {} s ahead", -o),
        },
        format_time(date)
    );
    match offset.abs() {
        o if o > CLOCK_FAIL_SECS => Check::fail(
            CLOCK,
            text,
            "synchronise the clock (chrony/systemd-timesyncd against the provider's time service): certificates will look not yet valid or expired",
        ),
        o if o > CLOCK_WARN_SECS => Check::warn(CLOCK, text, "check the time service (chronyc tracking, timedatectl)"),
        _ => Check::ok(CLOCK, text),
    }
}

/// `scheme://host:port` of an https URL, with the default port.
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        let (host, tail) = v6.split_once(']')?;
        let port = match tail.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if tail.is_empty() => 443,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), 443)),
    }
}

/// Whether `NO_PROXY` keeps `host` off the proxy, by Go's rules (golang.org/x/net/http/
/// httpproxy: `*` matches all; an IP or CIDR matches addresses; `foo.com` matches it and
/// its subdomains, `.foo.com` only subdomains; an entry's `:port` must match;
/// `localhost` and loopback addresses are never proxied).
pub fn no_proxy_covers(no_proxy: &str, host: &str, port: u16) -> bool {
    let host = host.trim_matches(['[', ']']).to_ascii_lowercase();
    let ip = host.parse::<std::net::IpAddr>().ok();
    if host == "localhost" || ip.is_some_and(|i| i.is_loopback()) {
        return true;
    }
    no_proxy
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| {
            if entry == "*" {
                return true;
            }
            let entry = entry.to_ascii_lowercase();
            if let Some((net, bits)) = entry.split_once('/') {
                return match (ip, net.parse::<std::net::IpAddr>(), bits.parse::<u32>()) {
                    (Some(i), Ok(n), Ok(b)) => in_cidr(i, n, b),
                    _ => false,
                };
            }
            let (name, eport) = match entry.rsplit_once(':') {
                Some((n, p)) if !n.contains(':') || n.ends_with(']') => {
                    (n.trim_matches(['[', ']']), p.parse::<u16>().ok())
                }
                _ => (entry.trim_matches(['[', ']']), None),
            };
            if eport.is_some_and(|p| p != port) {
                return false;
            }
            if let (Some(i), Ok(n)) = (ip, name.parse::<std::net::IpAddr>()) {
                return i == n;
            }
            match name.strip_prefix('.') {
                Some(suffix) => host.ends_with(&format!(".{suffix}")),
                None => host == name || host.ends_with(&format!(".{name}")),
            }
        })
}

fn in_cidr(ip: std::net::IpAddr, net: std::net::IpAddr, bits: u32) -> bool {
    use std::net::IpAddr::{V4, V6};
    match (ip, net) {
        (V4(a), V4(b)) if bits <= 32 => {
            let m = if bits == 0 {
                0
            } else {
                u32::MAX << (32 - bits)
            };
            u32::from(a) & m == u32::from(b) & m
        }
        (V6(a), V6(b)) if bits <= 128 => {
            let m = if bits == 0 {
                0
            } else {
                u128::MAX << (128 - bits)
            };
            u128::from(a) & m == u128::from(b) & m
        }
        _ => false,
    }
}

/// A proxy in node.env must not catch the API server (kubelet would reach it through the
/// proxy) nor the metadata address (agents that read it would get the proxy's answer).
pub(crate) fn proxy(node: &Node) -> Check {
    const NAME: &str = "proxy";
    let https = node.node(HTTPS_PROXY).or(node.node(HTTP_PROXY));
    let Some(_) = https else {
        return Check::ok(NAME, "no HTTP(S)_PROXY in node.env");
    };
    let no_proxy = node.node(NO_PROXY).unwrap_or("");
    let mut caught = Vec::new();
    if let Some((host, port)) = node.node(API_SERVER).and_then(host_port) {
        if !no_proxy_covers(no_proxy, &host, port) {
            caught.push(format!("the API server {host}"));
        }
    }
    if !no_proxy_covers(no_proxy, "169.254.169.254", 80) {
        caught.push("the metadata address 169.254.169.254".to_string());
    }
    if caught.is_empty() {
        Check::ok(
            NAME,
            format!("proxy set; NO_PROXY={no_proxy} covers the API server and metadata"),
        )
    } else {
        Check::fail(
            NAME,
            format!(
                "NO_PROXY={no_proxy:?} does not cover {}",
                caught.join(" or ")
            ),
            "add them to NO_PROXY in /etc/kiln/node.env (with the cluster's service and pod CIDRs)",
        )
    }
}

/// The API server: a TCP connection, then its certificate: names, dates, issuer.
pub(crate) fn api_server(node: &Node) -> Vec<Check> {
    let Some(url) = node.node(API_SERVER) else {
        return vec![Check::skip("api-server", "node.env has no API_SERVER")];
    };
    let Some((host, port)) = host_port(url) else {
        return vec![Check::fail(
            "api-server",
            format!("API_SERVER={url:?} is not an https URL"),
            "set API_SERVER=https://HOST[:PORT] in /etc/kiln/node.env",
        )];
    };
    let chain = match tls::server_chain(&host, port, node.opts.timeout) {
        Err(tls::TlsError::Connect(e)) => {
            return vec![Check::fail(
                "api-server",
                format!("{url}: {e}"),
                "check the route, security groups/firewall and that the API server (or its load balancer) listens",
            )]
        }
        Err(tls::TlsError::Handshake(e)) => {
            return vec![Check::fail("api-server", format!("{url}: TCP connects, but TLS: {e}"), "API_SERVER must point at the API server's TLS port")]
        }
        Ok(c) => c,
    };
    let mut out = vec![Check::ok(
        "api-server",
        format!("{url}: TCP and TLS 1.2 answer"),
    )];
    out.push(server_cert(node, url, &host, &chain));
    out
}

fn server_cert(node: &Node, url: &str, host: &str, chain: &[Cert]) -> Check {
    const NAME: &str = "api-server-cert";
    let leaf = &chain[0];
    if let Some(bad) = dates(leaf, node.now) {
        return Check::fail(
            NAME,
            format!("{url}: the serving certificate {bad}"),
            "renew the API server's certificate, or fix this node's clock (see the clock check)",
        );
    }
    if !leaf.names_host(host) {
        return Check::fail(
            NAME,
            format!("{url}: the certificate names {}, not {host}", leaf.names()),
            "point API_SERVER at a name the certificate carries, or add it to the API server's certSANs",
        );
    }
    let ca_path = crate::contract::paths::CA_CRT;
    let Some(ca_text) = node.read(ca_path) else {
        return Check::warn(
            NAME,
            format!(
                "{url}: names and dates fit; {ca_path} is missing, so the issuer is not checked"
            ),
            "place the cluster CA at /etc/kiln/ca.crt",
        );
    };
    let cas = match x509::pem_certs(&ca_text) {
        Ok(c) => c,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("{ca_path}: {e}"),
                "write the cluster CA as PEM to /etc/kiln/ca.crt",
            )
        }
    };
    // The leaf, or an intermediate the server sent, must be issued by a CA in ca.crt.
    let anchored = chain.iter().any(|c| {
        cas.iter()
            .any(|ca| c.issued_by(ca) || c.subject == ca.subject)
    });
    if !anchored {
        return Check::fail(
            NAME,
            format!(
                "{url}: the certificate for {} was issued by a CA not in {ca_path} (CN={}); a TLS-intercepting proxy or the wrong cluster's CA",
                leaf.names(),
                cas.first().map_or("", |c| c.subject_cn.as_str())
            ),
            "put the cluster's CA in /etc/kiln/ca.crt (the kubeadm/cluster CA, not a proxy's)",
        );
    }
    if let Some(bad) = cas
        .iter()
        .find_map(|ca| dates(ca, node.now).map(|b| format!("CA {} {b}", ca.subject_cn)))
    {
        return Check::fail(NAME, format!("{ca_path}: {bad}"), "rotate the cluster CA");
    }
    Check::ok(
        NAME,
        format!(
            "names {host}, valid until {}, issued by {ca_path} (names and key ids; kubelet verifies the signature)",
            format_time(leaf.not_after)
        ),
    )
}

/// Why `c` is not valid at `now`, if it is not.
pub(crate) fn dates(c: &Cert, now: i64) -> Option<String> {
    if now < c.not_before {
        Some(format!("is not valid before {}", format_time(c.not_before)))
    } else if now > c.not_after {
        Some(format!("expired at {}", format_time(c.not_after)))
    } else {
        None
    }
}

/// How long until `c` expires, for warnings.
pub(crate) fn remaining(c: &Cert, now: i64) -> Duration {
    Duration::from_secs(c.not_after.saturating_sub(now).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_parse_as_rfc_9110_says() {
        assert_eq!(
            http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(http_date("Sunday, 06-Nov-94 08:49:37 GMT"), None);
        assert_eq!(http_date("Sun, 06 Nov 1994 08:49:37 UTC"), None);
        assert_eq!(http_date(""), None);
        assert_eq!(imf_fixdate(784_111_777), "Sun, 06 Nov 1994 08:49:37 GMT");
    }

    #[test]
    fn no_proxy_follows_gos_rules() {
        let np = "10.0.0.0/8,.svc,example.com,api.other:6443,fd00::/8";
        assert!(no_proxy_covers(np, "10.1.2.3", 6443));
        assert!(!no_proxy_covers(np, "11.1.2.3", 6443));
        assert!(no_proxy_covers(np, "a.svc", 443));
        assert!(!no_proxy_covers(np, "svc", 443));
        assert!(no_proxy_covers(np, "example.com", 443));
        assert!(no_proxy_covers(np, "api.example.com", 443));
        assert!(no_proxy_covers(np, "api.other", 6443));
        assert!(!no_proxy_covers(np, "api.other", 443));
        assert!(no_proxy_covers(np, "[fd00::1]", 443));
        assert!(no_proxy_covers("", "127.0.0.1", 6443));
        assert!(no_proxy_covers("", "localhost", 6443));
        assert!(no_proxy_covers("*", "anything", 1));
        assert!(!no_proxy_covers("", "169.254.169.254", 80));
    }

    #[test]
    fn a_proxy_that_catches_the_api_server_is_named_without_contacting_it() {
        let dir = std::env::temp_dir().join(format!("kiln-doctor-proxy-{}", std::process::id()));
        // node.env where NodePaths puts it (on Windows, its C:\k place under the root).
        let node_env = crate::contract::paths::NodePaths::under(&dir).node_env;
        std::fs::create_dir_all(node_env.parent().unwrap()).unwrap();
        let write = |np: &str| {
            std::fs::write(
                &node_env,
                format!("KILN_CONTRACT=1\nAPI_SERVER=https://api.corp.example:6443\nHTTPS_PROXY=http://p:3128\nNO_PROXY={np}\n"),
            )
            .unwrap();
            Node::load(&super::super::model::Options::new(&dir))
        };
        let c = proxy(&write(".svc"));
        assert_eq!(c.verdict, super::super::model::Verdict::Fail);
        assert!(
            c.detail.contains("API server api.corp.example"),
            "{}",
            c.detail
        );
        let c = proxy(&write("corp.example,169.254.169.254"));
        assert_eq!(c.verdict, super::super::model::Verdict::Ok, "{}", c.detail);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn api_server_urls_split_into_host_and_port() {
        assert_eq!(host_port("https://api:6443/x"), Some(("api".into(), 6443)));
        assert_eq!(
            host_port("https://10.0.0.1"),
            Some(("10.0.0.1".into(), 443))
        );
        assert_eq!(
            host_port("https://[fd00::1]:6443"),
            Some(("fd00::1".into(), 6443))
        );
        assert_eq!(host_port("http://api:6443"), None);
        assert_eq!(host_port("https://api:x"), None);
    }
}
