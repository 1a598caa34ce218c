//! No credential leaves the process: every credential firstboot reads (the bootstrap token
//! file, a kubeconfig's token / client key / password, a JoinConfiguration's tokens and
//! certificate key, a private key pasted into the CA file, the IMDSv2 session token) is fed
//! through each failure path that quotes foreign text (kubeadm's stderr, kubelet's journal,
//! an API-server error in the log, a metadata answer echoing a request header, `report`
//! after the boot), and none of it may appear in any file under the root that firstboot or
//! its stand-ins wrote (status.json, the failure files, the console, the VMware and Azure
//! channels), nor on stdout or stderr. Each test prints the paths it searched.

// Stand-ins are /bin/sh scripts and secrets need Unix modes.
#![cfg(unix)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{fixture_reply, fixtures, ok, status, Outcome, Reply, Root, Server, TOKEN};

/// A kubeconfig bearer token that has no bootstrap-token shape: only its literal value can
/// catch it.
const KC_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.S0lMTi1MRUFLLWJlYXJlcg.c2lnLWtpbG4tbGVhaw";
const KC_KEY: &str = "LS0tLS1CRUdJTiBFQyBQUklWQVRFIEtFWS0tLS0tS0lMTkxFQUs=";
const KC_PASSWORD: &str = "kiln-leak-password";
const JOIN_TOKEN: &str = "ghijkl.9876543210ghijkl";
const TLS_TOKEN: &str = "mnopqr.abcdefghijklmnop";
const CERT_KEY: &str = "f00dfacef00dfacef00dfacef00dface";
const CA_KEY_LINE: &str = "MHcCAQEEIKILNLEAKCAPRIVATEKEYLINE";
const IMDS_TOKEN: &str = "AQAEAKILN-imds-session-token-LEAK==";

/// Every form of a secret that must not appear: the value, and a bootstrap token's secret
/// half on its own.
fn forms(secrets: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    for s in secrets {
        out.push(s.to_string());
        if kiln_firstboot::config::valid_token(s) {
            out.push(s[7..].to_string());
        }
    }
    out
}

/// Every regular file under `dir`, sorted.
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                todo.push(e.path());
            } else if t.is_file() {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Searches every file under the root except the inputs the test placed (the credentials
/// and the stand-in scripts, which hold the secrets on purpose), plus stdout and stderr.
/// Prints what it searched and returns the relative paths.
fn assert_no_leak(
    root: &Root,
    inputs: &[&str],
    outs: &[&Outcome],
    secrets: &[&str],
) -> Vec<String> {
    let forms = forms(secrets);
    let mut searched = Vec::new();
    for p in files_under(&root.dir) {
        let rel = p.strip_prefix(&root.dir).unwrap().display().to_string();
        let is_input = inputs.contains(&rel.as_str())
            || (rel.starts_with("stubs/") && !rel.ends_with(".calls"));
        if is_input {
            continue;
        }
        let text = String::from_utf8_lossy(&fs::read(&p).unwrap()).into_owned();
        for f in &forms {
            assert!(
                !text.contains(f.as_str()),
                "{f:?} leaked into {rel}:\n{text}"
            );
        }
        searched.push(rel);
    }
    for (i, o) in outs.iter().enumerate() {
        for f in &forms {
            assert!(
                !o.stdout.contains(f.as_str()),
                "{f:?} leaked to stdout #{i}:\n{}",
                o.stdout
            );
            assert!(
                !o.stderr.contains(f.as_str()),
                "{f:?} leaked to stderr #{i}:\n{}",
                o.stderr
            );
        }
        searched.push(format!("<stdout #{i}>"));
        searched.push(format!("<stderr #{i}>"));
    }
    println!(
        "searched {} outputs for {} secret forms:",
        searched.len(),
        forms.len()
    );
    for s in &searched {
        println!("  {s}");
    }
    searched
}

/// The outputs every failed run must have written, all of which were searched.
fn assert_searched(searched: &[String], must: &[&str]) {
    for m in must {
        assert!(
            searched.iter().any(|s| s == m),
            "{m} was not searched: {searched:?}"
        );
    }
}

/// `kiln-firstboot <sub> --root ROOT [--console ROOT/console.log] args…`.
fn firstboot_sub(root: &Root, sub: &str, args: &[&str]) -> Outcome {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kiln-firstboot"));
    cmd.arg(sub).arg("--root").arg(&root.dir);
    if sub != "status" {
        cmd.arg("--console").arg(root.path("console.log"));
    }
    Outcome::of(cmd.args(args))
}

fn firstboot(root: &Root, args: &[&str]) -> Outcome {
    firstboot_sub(root, "run", args)
}

const FAILED_FILES: [&str; 4] = [
    "run/kiln/status.json",
    "run/kiln/failure",
    "run/cluster-api/bootstrap-failure.reason",
    "console.log",
];

/// Plays vmware-rpctool from the fixtures, and records `info-set` (the channel) in its calls.
fn rpctool(root: &Root) -> String {
    let uuid = fs::read_to_string(fixtures().join("vmware/dmi/product_uuid")).unwrap();
    root.write("sys/class/dmi/id/product_uuid", &uuid);
    let dir = fixtures().join("vmware/guestinfo");
    root.stub(
        "vmware-rpctool",
        &format!(
            "case \"$1\" in info-set*) exit 0;; esac\nkey=${{1#info-get guestinfo.}}\nif [ -f '{0}'/\"$key\" ]; then cat '{0}'/\"$key\"; else echo 'No value found'; exit 1; fi",
            dir.display()
        ),
    )
}

#[test]
fn kubeadm_join_printing_its_tokens() {
    let root = Root::node("VMware, Inc.");
    root.node_env("JOIN_MODE=kubeadm\n");
    fs::remove_file(root.path("etc/kiln/bootstrap-token")).unwrap();
    root.write_mode(
        "etc/kiln/kubeadm-join.yaml",
        &format!(
            "apiVersion: kubeadm.k8s.io/v1beta4\nkind: JoinConfiguration\ndiscovery:\n  bootstrapToken:\n    apiServerEndpoint: 127.0.0.1:6443\n    token: {JOIN_TOKEN}\n    unsafeSkipCAVerification: true\n  tlsBootstrapToken: {TLS_TOKEN}\ncontrolPlane:\n  certificateKey: \"{CERT_KEY}\"\n"
        ),
        0o600,
    );
    // kubeadm's own wording, with each secret in it; the secret half alone on the last line,
    // and a line long enough that the runner's tail cuts into the first one.
    let kubeadm = root.stub(
        "kubeadm",
        &format!(
            "echo 'error execution phase preflight: token {JOIN_TOKEN} is invalid' >&2\n\
             echo 'tls bootstrap token \"{TLS_TOKEN}\" rejected; certificate key {CERT_KEY}' >&2\n\
             echo 'Unauthorized: bearer {0}' >&2\n\
             echo 'secret part {0}' >&2\nexit 1",
            &JOIN_TOKEN[7..]
        ),
    );
    let rpc = rpctool(&root);
    let systemctl = root.stub("systemctl", "exit 0");
    let out = firstboot(
        &root,
        &[
            "--kubeadm",
            &kubeadm,
            "--systemctl",
            &systemctl,
            "--vmware-rpctool",
            &rpc,
            "--deadline",
            "10",
        ],
    );
    assert_eq!(out.code, 6, "{out:#?}");
    // The failure is still told: the reason and kubeadm's words around the secrets.
    assert!(out.stderr.contains("KUBEADM_FAILED"), "{}", out.stderr);
    let failure = root.read("run/kiln/failure");
    assert!(failure.contains("token <redacted> is invalid"), "{failure}");
    // The channel got the status.
    assert!(
        root.calls("vmware-rpctool")
            .iter()
            .any(|c| c.starts_with("info-set guestinfo.kiln.status {")),
        "{:?}",
        root.calls("vmware-rpctool")
    );
    let searched = assert_no_leak(
        &root,
        &["etc/kiln/kubeadm-join.yaml"],
        &[&out],
        &[JOIN_TOKEN, TLS_TOKEN, CERT_KEY],
    );
    assert_searched(&searched, &FAILED_FILES);
    assert_searched(&searched, &["stubs/vmware-rpctool.calls", "<stderr #0>"]);
}

/// A systemd whose kubelet died for good and a journal that says why, in `lines`.
fn dead_kubelet(root: &Root, lines: &[String]) -> (String, String) {
    let systemctl = root.stub(
        "systemctl",
        "case \"$*\" in show*kubelet*) printf 'ActiveState=failed\\nResult=exit-code\\nExecMainStatus=1\\nNRestarts=5\\n';;\nshow*containerd*) printf 'ActiveState=active\\nResult=success\\nExecMainStatus=0\\nNRestarts=0\\n';; esac; exit 0",
    );
    root.write("journal/kubelet.log", &(lines.join("\n") + "\n"));
    let journalctl = root.stub(
        "journalctl",
        &format!(
            "case \"$*\" in *kubelet.service*) cat '{}';; esac",
            root.path("journal/kubelet.log").display()
        ),
    );
    (systemctl, journalctl)
}

#[test]
fn kubelet_log_and_api_server_errors_quoting_kubeconfig_secrets() {
    let root = Root::node("Microsoft Corporation");
    root.write(
        "sys/class/dmi/id/chassis_asset_tag",
        "7783-7084-3265-9085-8269-3286-77\n",
    );
    fs::remove_file(root.path("etc/kiln/bootstrap-token")).unwrap();
    root.write_mode(
        "etc/kiln/bootstrap-kubeconfig",
        &format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\nusers:\n- name: kubelet-bootstrap\n  user:\n    token: {KC_TOKEN}\n    client-key-data: {KC_KEY}\n    password: '{KC_PASSWORD}'\n"
        ),
        0o600,
    );
    // A CA file with a private key pasted in by mistake.
    root.write(
        "etc/kiln/ca.crt",
        &format!("-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n-----BEGIN EC PRIVATE KEY-----\n{CA_KEY_LINE}\n-----END EC PRIVATE KEY-----\n"),
    );
    let lines = [
        format!("E0101 00:00:00.000000 1 bootstrap.go:1] \"Unhandled Error\" err=\"Unauthorized\" token=\"{KC_TOKEN}\""),
        format!("E0101 00:00:01.000000 1 kubelet_node_status.go:1] \"Unable to register node with API server\" err=\"Unauthorized: the server has asked for the client to provide credentials (bearer {KC_TOKEN}, password {KC_PASSWORD})\""),
        format!("E0101 00:00:02.000000 1 certificate.go:1] failed to load client key {KC_KEY}: error"),
        format!("E0101 00:00:03.000000 1 x.go:1] error: found {CA_KEY_LINE} and {TOKEN}"),
    ];
    let (systemctl, journalctl) = dead_kubelet(&root, &lines);
    let srv = Server::fixtures(
        "azure",
        &[("Content-Type", "application/json; charset=utf-8")],
    );
    let healthz = Server::start(|_| status(503));
    let out = firstboot(
        &root,
        &[
            "--metadata-url",
            &srv.url,
            "--systemctl",
            &systemctl,
            "--journalctl",
            &journalctl,
            "--healthz-url",
            &format!("{}/healthz", healthz.url),
            "--deadline",
            "60",
        ],
    );
    assert_eq!(out.code, 7, "{out:#?}");
    let json = root.read("run/kiln/status.json");
    assert!(json.contains("\"reason\":\"API_UNAUTHORIZED\""), "{json}");
    assert!(
        json.contains("bearer <redacted>, password <redacted>"),
        "{json}"
    );
    // The Azure KVP channel was written.
    assert!(root.exists("var/lib/hyperv/.kvp_pool_1"));

    // Later, `report` (kubelet's OnFailure=) reads the same journal and reports again.
    let report = firstboot_sub(
        &root,
        "report",
        &[
            "--systemctl",
            &systemctl,
            "--journalctl",
            &journalctl,
            "--healthz-url",
            &format!("{}/healthz", healthz.url),
        ],
    );
    assert_ne!(report.code, 0, "{report:#?}");
    assert!(report.stdout.contains("<redacted>"), "{}", report.stdout);
    let status = firstboot_sub(&root, "status", &["--json"]);
    let searched = assert_no_leak(
        &root,
        &[
            "etc/kiln/bootstrap-kubeconfig",
            "etc/kiln/ca.crt",
            "etc/kiln/bootstrap-token",
            "journal/kubelet.log",
        ],
        &[&out, &report, &status],
        &[KC_TOKEN, KC_KEY, KC_PASSWORD, CA_KEY_LINE, TOKEN],
    );
    assert_searched(&searched, &FAILED_FILES);
    assert_searched(
        &searched,
        &["var/lib/hyperv/.kvp_pool_1", "<stdout #1>", "<stdout #2>"],
    );
}

#[test]
fn a_metadata_answer_echoing_the_session_token_header() {
    let root = Root::node("Amazon EC2");
    // A metadata service that echoes the IMDSv2 session token it was sent into a value that
    // fails the value check, whose message quotes the value.
    let base = fixtures().join("aws");
    let srv = Server::start(move |r| {
        if r.route() == "/latest/api/token" {
            return ok(IMDS_TOKEN);
        }
        if r.route() == "/latest/meta-data/instance-id" {
            let echoed = r
                .header("x-aws-ec2-metadata-token")
                .unwrap_or("")
                .to_string();
            return Reply::Http(
                200,
                vec![],
                format!("i-0abc token={echoed} {TOKEN}").into_bytes(),
            );
        }
        fixture_reply(&base, &[], r)
    });
    let out = firstboot(&root, &["--metadata-url", &srv.url, "--deadline", "10"]);
    assert_eq!(out.code, 4, "{out:#?}");
    assert!(out.stderr.contains("token=<redacted>"), "{}", out.stderr);
    let searched = assert_no_leak(
        &root,
        &["etc/kiln/bootstrap-token"],
        &[&out],
        &[IMDS_TOKEN, TOKEN],
    );
    assert_searched(&searched, &FAILED_FILES);
}

#[test]
fn a_malformed_token_file_is_not_echoed() {
    let root = Root::node("Amazon EC2");
    let bad = "not-a-token-but-still-a-secret-value";
    root.write_mode("etc/kiln/bootstrap-token", bad, 0o600);
    let out = firstboot(&root, &["--deadline", "5"]);
    assert_eq!(out.code, 3, "{out:#?}");
    let searched = assert_no_leak(&root, &["etc/kiln/bootstrap-token"], &[&out], &[bad]);
    assert_searched(&searched, &FAILED_FILES);
}

#[test]
fn a_symlinked_secret_is_refused_and_not_read() {
    let root = Root::node("Amazon EC2");
    // The real token lives elsewhere; the contract's name is a symlink to it.
    root.write_mode("elsewhere/token", &format!("{TOKEN}\n"), 0o600);
    fs::remove_file(root.path("etc/kiln/bootstrap-token")).unwrap();
    std::os::unix::fs::symlink(
        root.path("elsewhere/token"),
        root.path("etc/kiln/bootstrap-token"),
    )
    .unwrap();
    let out = firstboot(&root, &["--deadline", "5"]);
    assert_eq!(out.code, 3, "{out:#?}");
    assert!(out.stderr.contains("SECRET_MODE"), "{}", out.stderr);
    assert!(out.stderr.contains("symbolic link"), "{}", out.stderr);
    assert!(!root.exists("run/kiln/bootstrap-kubeconfig"));
}

/// A credential provider's `env` value (credentials-providers.json is a secret file): kubelet
/// echoes the whole config when it cannot decode it, and that log line reaches the diagnosis.
#[test]
fn a_credential_provider_env_value_echoed_by_kubelet() {
    const CP_SECRET: &str = "kiln-leak-credential-provider-env";
    let root = Root::node("");
    root.node_env("NODE_NAME=n1\nNODE_IP=127.0.0.5\n");
    let config = format!(
        r#"{{"apiVersion":"kubelet.config.k8s.io/v1","kind":"CredentialProviderConfig","providers":[{{"name":"p","matchImages":["gcr.io"],"defaultCacheDuration":"1m","apiVersion":"credentialprovider.kubelet.k8s.io/v1","env":[{{"name":"TOKEN","value":"{CP_SECRET}"}}]}}]}}"#
    );
    root.write_mode("etc/kiln/credential-providers.json", &config, 0o600);
    root.write_mode(
        "usr/libexec/kiln/credential-providers/p",
        "#!/bin/sh\n",
        0o755,
    );
    let lines = [format!(
        "E0101 00:00:00.000000 1 kuberuntime_manager.go:315] \"Failed to register CRI auth plugins\" err=\"error decoding config: Object 'Kind' is missing in '{}'\"",
        config.replace('"', "\\\"")
    )];
    let (systemctl, journalctl) = dead_kubelet(&root, &lines);
    let healthz = Server::start(|_| status(503));
    let out = firstboot(
        &root,
        &[
            "--provider",
            "none",
            "--systemctl",
            &systemctl,
            "--journalctl",
            &journalctl,
            "--healthz-url",
            &format!("{}/healthz", healthz.url),
            "--deadline",
            "30",
        ],
    );
    assert_ne!(out.code, 0, "{out:#?}");
    let json = root.read("run/kiln/status.json");
    assert!(json.contains("<redacted>"), "{json}");
    let searched = assert_no_leak(
        &root,
        &["etc/kiln/credential-providers.json", "journal/kubelet.log"],
        &[&out],
        &[CP_SECRET],
    );
    assert_searched(&searched, &FAILED_FILES);
}
