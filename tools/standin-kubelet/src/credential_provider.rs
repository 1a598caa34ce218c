//! A stand-in kubelet image credential provider for kiln's fixture mirror, baked as
//! `ecr-credential-provider` and `auth-provider-gcp` (upstream's cannot be downloaded here).
//! It speaks the exec plugin protocol kubelet uses (`credentialprovider.kubelet.k8s.io`,
//! `staging/src/k8s.io/kubelet/pkg/apis/credentialprovider/v1/types.go`): one
//! `CredentialProviderRequest` on stdin, one `CredentialProviderResponse` on stdout, with the
//! request's apiVersion (kubelet refuses a response of another version). The credentials are
//! the stand-in's own (`STANDIN_CREDENTIAL_USERNAME`, `STANDIN_CREDENTIAL_PASSWORD`, default
//! `standin`), for the image's registry. `--version` says what it is.

use std::io::Read;
use std::process::ExitCode;

use serde_json::{json, Value};

const VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];

/// The registry of an image reference, as the first path element names it (docker's rule: a
/// dot, a colon or `localhost` makes it a host; otherwise Docker Hub).
fn registry(image: &str) -> &str {
    match image.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

fn main() -> ExitCode {
    let name = std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    if std::env::args().nth(1).as_deref() == Some("--version") {
        println!("{name} (kiln's stand-in credential provider, not upstream)");
        return ExitCode::SUCCESS;
    }
    let mut input = String::new();
    if std::io::stdin()
        .take(1024 * 1024)
        .read_to_string(&mut input)
        .is_err()
    {
        eprintln!("{name}: error reading the request from stdin");
        return ExitCode::FAILURE;
    }
    let req: Value = match serde_json::from_str(&input) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{name}: error decoding the request: {e}");
            return ExitCode::FAILURE;
        }
    };
    let api = req["apiVersion"].as_str().unwrap_or("");
    if !VERSIONS.contains(&api) || req["kind"] != "CredentialProviderRequest" {
        eprintln!(
            "{name}: expected a CredentialProviderRequest of {}, found kind {} apiVersion {api:?}",
            VERSIONS.join(" or "),
            req["kind"]
        );
        return ExitCode::FAILURE;
    }
    let image = req["image"].as_str().unwrap_or("");
    if image.is_empty() {
        eprintln!("{name}: the request names no image");
        return ExitCode::FAILURE;
    }
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| "standin".into());
    let resp = json!({
        "kind": "CredentialProviderResponse",
        "apiVersion": api,
        "cacheKeyType": "Registry",
        "cacheDuration": "0s",
        "auth": {
            registry(image): {
                "username": var("STANDIN_CREDENTIAL_USERNAME"),
                "password": var("STANDIN_CREDENTIAL_PASSWORD"),
            }
        }
    });
    println!("{resp}");
    ExitCode::SUCCESS
}
