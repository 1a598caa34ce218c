//! The boot tests' metadata service: the shared loopback stand-in
//! ([`kiln_firstboot::standin`], which records every request so tests can assert on what the
//! node asked), reached by the guest through QEMU's guestfwd and the relay, and the AWS
//! instance its IMDSv2 answers describe.

use kiln_firstboot::standin;
pub use kiln_firstboot::standin::{MetadataServer, Reply as Response, Request};

/// The instance facts an AWS IMDSv2 stand-in answers with.
#[derive(Debug, Clone)]
pub struct AwsInstance {
    /// `instance-id`
    pub instance_id: String,
    /// `instance-type`
    pub instance_type: String,
    /// `local-ipv4`
    pub local_ipv4: String,
    /// `placement/availability-zone`
    pub zone: String,
    /// `placement/region`
    pub region: String,
    /// `local-hostname` (and `hostname`)
    pub hostname: String,
    /// `mac`
    pub mac: String,
    /// An instance of an Auto Scaling warm pool: `autoscaling/target-lifecycle-state` is
    /// `Warmed:Running` for this long after it is first asked, then `InService`. `None`: not
    /// in a group (404), as on a plain instance.
    pub warmed_for: Option<std::time::Duration>,
}

/// The token the IMDSv2 stand-in hands out.
pub const IMDS_TOKEN: &str = "kiln-test-token-AQAEAH";

/// An IMDSv2 stand-in answering with `instance`: the shared stand-in's token protocol
/// ([`standin::aws_imdsv2`]: `PUT /latest/api/token` with a TTL header gives
/// [`IMDS_TOKEN`], every other request must carry it, else 401) around the
/// `GET /latest/meta-data/…` paths the real service has.
pub fn aws_imdsv2(instance: AwsInstance) -> impl Fn(&Request) -> Response + Send + Sync {
    let first_asked = std::sync::OnceLock::new();
    standin::aws_imdsv2(IMDS_TOKEN.to_string(), move |req| {
        if req.method != "GET" {
            return Response::status(405);
        }
        let i = &instance;
        if req.path == "/latest/meta-data/autoscaling/target-lifecycle-state" {
            let Some(warm) = i.warmed_for else {
                return Response::status(404);
            };
            let t0: &std::time::Instant = first_asked.get_or_init(std::time::Instant::now);
            let state = if t0.elapsed() < warm {
                "Warmed:Running"
            } else {
                "InService"
            };
            return Response::text(state.to_string());
        }
        let mac_path = format!(
            "/latest/meta-data/network/interfaces/macs/{}/local-ipv4s",
            i.mac
        );
        let body = match req.path.as_str() {
            "/latest/meta-data/instance-id" => i.instance_id.clone(),
            "/latest/meta-data/instance-type" => i.instance_type.clone(),
            "/latest/meta-data/local-ipv4" => i.local_ipv4.clone(),
            "/latest/meta-data/placement/availability-zone" => i.zone.clone(),
            "/latest/meta-data/placement/region" => i.region.clone(),
            "/latest/meta-data/local-hostname" | "/latest/meta-data/hostname" => i.hostname.clone(),
            "/latest/meta-data/mac" => i.mac.clone(),
            p if p == mac_path => i.local_ipv4.clone(),
            _ => return Response::status(404),
        };
        Response::text(body)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;

    fn raw(port: u16, req: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn instance() -> AwsInstance {
        AwsInstance {
            instance_id: "i-0abc".into(),
            instance_type: "m5.large".into(),
            local_ipv4: "10.0.3.7".into(),
            zone: "eu-west-1a".into(),
            region: "eu-west-1".into(),
            hostname: "ip-10-0-3-7.eu-west-1.compute.internal".into(),
            mac: "52:54:00:12:34:56".into(),
            warmed_for: None,
        }
    }

    #[test]
    fn imdsv2_requires_the_token_from_the_put() {
        let srv = MetadataServer::start(aws_imdsv2(instance())).unwrap();
        let no_token = raw(
            srv.port(),
            "GET /latest/meta-data/instance-id HTTP/1.1\r\nConnection: close\r\n\r\n",
        );
        assert!(no_token.starts_with("HTTP/1.1 401 "), "{no_token}");
        let token = raw(
            srv.port(),
            "PUT /latest/api/token HTTP/1.1\r\nX-aws-ec2-metadata-token-ttl-seconds: 60\r\nConnection: close\r\n\r\n",
        );
        assert!(token.ends_with(IMDS_TOKEN), "{token}");
        let id = raw(
            srv.port(),
            &format!("GET /latest/meta-data/instance-id HTTP/1.1\r\nX-aws-ec2-metadata-token: {IMDS_TOKEN}\r\nConnection: close\r\n\r\n"),
        );
        assert!(
            id.starts_with("HTTP/1.1 200 ") && id.ends_with("\r\n\r\ni-0abc"),
            "{id}"
        );
        let reqs = srv.requests();
        assert_eq!(reqs.len(), 3);
        assert_eq!(reqs[1].method, "PUT");
    }
}
