//! How to reach registries ([`RegistryOptions`]) and the HTTP client built from them.

use super::auth::CredentialStore;
use crate::supply::fetch::FetchOptions;

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Credentials by host.
    pub credentials: CredentialStore,
    /// Extra trusted CA certificates (PEM), on top of the built-in roots.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// Hosts (`host:port`) spoken to over plain HTTP (loopback test registries).
    pub plain_http: Vec<String>,
}

impl RegistryOptions {
    /// `http` for the hosts named plain-HTTP, else `https`.
    pub fn scheme(&self, host: &str) -> &'static str {
        if self.plain_http.iter().any(|h| h == host) {
            "http"
        } else {
            "https"
        }
    }
}

/// Builds the registry HTTP client: rustls, the extra CA if given, no transparent
/// decompression (it would change the bytes being hashed).
pub fn client(ropts: &RegistryOptions, opts: &FetchOptions) -> Result<reqwest::Client, String> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(opts.connect_timeout)
        .user_agent(concat!("kiln/", env!("CARGO_PKG_VERSION")))
        .no_gzip();
    if let Some(pem) = &ropts.extra_ca_pem {
        for cert in reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| format!("the registry CA file is not PEM certificates: {e}"))?
        {
            b = b.add_root_certificate(cert);
        }
    }
    b.build().map_err(|e| e.to_string())
}
