//! A loopback stand-in for EC2's IMDSv2, for benchmarks and trying firstboot by hand:
//! serves `firstboot/tests/fixtures/aws/` (token by PUT, then GETs that must carry it),
//! answering at once. It also answers `GET /healthz` with `ok`, as a healthy kubelet does,
//! so a full run gets through its wait phases. Prints its base URL and runs until killed.
//! The server and the token protocol are the shared stand-in's (`kiln_firstboot::standin`).
//!
//!     cargo run -p kiln-firstboot --example imds_standin -- [FIXTURE_DIR] [PORT]

use std::io::Write;
use std::path::{Path, PathBuf};

use kiln_firstboot::standin::{aws_imdsv2, fixture_reply, MetadataServer, Reply};

fn main() -> std::io::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args
        .next()
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/aws"));
    let port = args.next().unwrap_or_else(|| "0".to_string());
    let token = std::fs::read_to_string(dir.join("latest/api/token"))?;
    let headers = vec![
        ("Content-Type".to_string(), "text/plain".to_string()),
        ("Server".to_string(), "EC2ws".to_string()),
    ];
    let imds = aws_imdsv2(token, move |r| fixture_reply(&dir, &headers, r));
    let server = MetadataServer::bind(&format!("127.0.0.1:{port}"), move |r| {
        if r.route() == "/healthz" {
            Reply::Http(200, vec![], b"ok".to_vec())
        } else {
            imds(r)
        }
    })?;
    println!("{}", server.url);
    std::io::stdout().flush()?;
    loop {
        std::thread::park();
    }
}
