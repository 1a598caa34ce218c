//! Runs the real stand-in binary in a temp dir: success path (records, checks the runtime
//! socket, serves /healthz, writes the client cert) and a named failure (kubelet's wording).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("standin-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn setup(dir: &Path, mode: &str) -> (PathBuf, UnixListener) {
    std::fs::write(
        dir.join("config.yaml"),
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("bootstrap-kubeconfig"),
        "clusters:\n- cluster:\n    server: https://api.test.invalid:6443\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("standin.env"),
        format!("STANDIN_MODE={mode}\nSTANDIN_JOIN_DELAY_MS=50\n"),
    )
    .unwrap();
    let sock = dir.join("containerd.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    (sock, listener)
}

fn kubelet(dir: &Path, sock: &Path, port: u16) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kubelet"));
    c.arg(format!("--config={}", dir.join("config.yaml").display()))
        .arg("--root-dir")
        .arg(dir.join("var-lib-kubelet"))
        .arg(format!("--kubeconfig={}", dir.join("kubeconfig").display()))
        .arg(format!(
            "--cert-dir={}",
            dir.join("var-lib-kubelet/pki").display()
        ))
        .arg(format!(
            "--bootstrap-kubeconfig={}",
            dir.join("bootstrap-kubeconfig").display()
        ))
        .arg(format!(
            "--container-runtime-endpoint=unix://{}",
            sock.display()
        ))
        .arg(format!("--healthz-port={port}"))
        .arg("--node-ip=10.0.0.7")
        .env("STANDIN_KUBELET_CONFIG", dir.join("standin.env"))
        .env("KILN_TEST_MARKER", "yes");
    c
}

#[test]
fn success_serves_healthz_and_writes_the_client_cert() {
    let dir = tempdir("ok");
    let (sock, _listener) = setup(&dir, "success");
    let port = free_port();
    let mut child = kubelet(&dir, &sock, port)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let cert = dir.join("var-lib-kubelet/pki/kubelet-client-current.pem");
    let until = Instant::now() + Duration::from_secs(20);
    // The certificate comes first, the kubeconfig pointing at it right after: wait for both
    // (a loaded machine once read the kubeconfig in between).
    while !(cert.exists() && dir.join("kubeconfig").exists()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(cert.exists(), "client certificate never appeared");
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    assert!(resp.starts_with("HTTP/1.1 200 OK"), "{resp}");
    assert!(resp.ends_with("\r\n\r\nok"), "{resp}");
    let args = std::fs::read_to_string(dir.join("var-lib-kubelet/standin/args")).unwrap();
    assert!(args.lines().any(|l| l == "--node-ip=10.0.0.7"), "{args}");
    let env = std::fs::read_to_string(dir.join("var-lib-kubelet/standin/env")).unwrap();
    assert!(env.lines().any(|l| l == "KILN_TEST_MARKER=yes"), "{env}");
}

/// Runs the stand-in with stderr in a file until `done(stderr)` or 20 s, then reads
/// `/healthz` and stops it: (still running, healthz answer, stderr).
fn run_until(dir: &Path, mode: &str, done: impl Fn(&str) -> bool) -> (bool, String, String) {
    let (sock, _listener) = setup(dir, mode);
    let port = free_port();
    let log = dir.join("stderr.log");
    let mut child = kubelet(dir, &sock, port)
        .arg("--hostname-override=Node-1")
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let read = || std::fs::read_to_string(&log).unwrap_or_default();
    while !done(&read()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    let running = child.try_wait().unwrap().is_none();
    let mut resp = String::new();
    if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        s.read_to_string(&mut resp).unwrap();
    }
    let _ = child.kill();
    let _ = child.wait();
    (running, resp, read())
}

#[test]
fn a_wrong_ca_is_retried_by_a_running_healthy_kubelet() {
    // As kubelet 1.36 with a wrong CA: up, /healthz ok, the CSR retried and logged each time.
    let dir = tempdir("x509");
    let line = "kubernetes.io/kube-apiserver-client-kubelet: Failed while requesting a signed certificate from the control plane: cannot create certificate signing request: Post \"https://api.test.invalid:6443/apis/certificates.k8s.io/v1/certificatesigningrequests\": tls: failed to verify certificate: x509: certificate signed by unknown authority";
    let (running, resp, err) = run_until(&dir, "x509", |e| e.matches(line).count() >= 2);
    assert!(running, "it exited: {err}");
    assert!(resp.ends_with("\r\n\r\nok"), "{resp}");
    assert!(err.matches(line).count() >= 2, "{err}");
    assert!(
        err.contains("certificate_manager.go:562] kubernetes.io/"),
        "{err}"
    );
    assert!(!err.contains("command failed"), "{err}");
    assert!(!dir
        .join("var-lib-kubelet/pki/kubelet-client-current.pem")
        .exists());
}

#[test]
fn a_joined_kubelet_logs_its_registered_node_after_the_certificate() {
    let dir = tempdir("registered");
    let registered = "kubelet_node_status.go:78] \"Successfully registered node\" node=\"node-1\"";
    let (running, _, err) = run_until(&dir, "success", |e| e.contains(registered));
    assert!(running && err.contains(registered), "{err}");
    assert!(dir
        .join("var-lib-kubelet/pki/kubelet-client-current.pem")
        .exists());
    let attempt = err
        .find("\"Attempting to register node\" node=\"node-1\"")
        .unwrap();
    assert!(attempt < err.find(registered).unwrap(), "{err}");
}

#[test]
fn a_refused_node_is_retried_and_never_registered() {
    let dir = tempdir("forbidden");
    let refused = "kubelet_node_status.go:108] \"Unable to register node with API server\" err=\"nodes \\\"node-1\\\" is forbidden: ValidatingAdmissionPolicy";
    let (running, resp, err) = run_until(&dir, "register-forbidden", |e| {
        e.matches(refused).count() >= 3
    });
    assert!(running && resp.ends_with("ok"), "{err}");
    assert!(err.matches(refused).count() >= 3, "{err}");
    assert!(!err.contains("Successfully registered node"), "{err}");
    assert!(dir
        .join("var-lib-kubelet/pki/kubelet-client-current.pem")
        .exists());
}

#[test]
fn missing_runtime_socket_is_reported_like_kubelet() {
    let dir = tempdir("nosock");
    let (sock, listener) = setup(&dir, "success");
    drop(listener);
    std::fs::remove_file(&sock).unwrap();
    let out = kubelet(&dir, &sock, free_port())
        .env("STANDIN_RUNTIME_WAIT_MS", "100")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("validate CRI v1 runtime API for endpoint"),
        "{err}"
    );
    assert!(err.contains("connect: no such file or directory"), "{err}");
}

fn run_quick(dir: &Path, sock: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = kubelet(dir, sock, free_port())
        .args(extra)
        .env("STANDIN_RUNTIME_WAIT_MS", "100")
        .output()
        .unwrap();
    (out.status.code(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn unknown_and_removed_flags_stop_it_as_pflag_does() {
    let dir = tempdir("flags");
    let (sock, _listener) = setup(&dir, "success");
    for flag in [
        "--foo",
        "--container-runtime=remote",
        "--network-plugin=cni",
    ] {
        let (code, err) = run_quick(&dir, &sock, &[flag]);
        assert_eq!(code, Some(1), "{flag}");
        let name = flag.split('=').next().unwrap();
        assert!(
            err.contains(&format!(
                "\"command failed\" err=\"failed to parse kubelet flag: unknown flag: {name}\""
            )),
            "{err}"
        );
    }
}

#[test]
fn an_invalid_config_value_is_fatal_and_an_unknown_field_is_not() {
    let dir = tempdir("cfg");
    let (sock, _listener) = setup(&dir, "success");
    let cfg = dir.join("config.yaml");
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    std::fs::write(&cfg, format!("{head}maxPods: -3\n")).unwrap();
    let (code, err) = run_quick(&dir, &sock, &[]);
    assert_eq!(code, Some(1));
    assert!(err.contains("failed to validate kubelet configuration, error: invalid configuration: maxPods (--max-pods) -3 must not be a negative number"), "{err}");
    std::fs::write(&cfg, format!("{head}maxPods: many\n")).unwrap();
    let (code, err) = run_quick(&dir, &sock, &[]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("failed to load kubelet config file, path: "),
        "{err}"
    );
    assert!(
        err.contains("failed to decode: json: invalid type: string"),
        "{err}"
    );
    // An unknown field: logged, then kubelet goes on and joins.
    std::fs::write(&cfg, format!("{head}cgroupDriver: systemd\nmaxPodz: 3\n")).unwrap();
    let mut child = kubelet(&dir, &sock, free_port())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cert = dir.join("var-lib-kubelet/pki/kubelet-client-current.pem");
    let until = Instant::now() + Duration::from_secs(20);
    // The certificate comes first, the kubeconfig pointing at it right after: wait for both
    // (a loaded machine once read the kubeconfig in between).
    while !(cert.exists() && dir.join("kubeconfig").exists()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(cert.exists(), "{err}");
    assert!(err.contains("\"Using lenient decoding as strict decoding failed\" err=\"strict decoding error: unknown field \\\"maxPodz\\\"\""), "{err}");
    // The kubeconfig kubelet wrote points at the current client certificate.
    let kc = std::fs::read_to_string(dir.join("kubeconfig")).unwrap();
    assert!(
        kc.contains("client-certificate: ") && kc.contains("kubelet-client-current.pem"),
        "{kc}"
    );
    assert!(std::fs::symlink_metadata(&cert)
        .unwrap()
        .file_type()
        .is_symlink());
}

#[test]
fn without_a_kubeconfig_it_is_standalone_and_never_joins() {
    let dir = tempdir("standalone");
    let (sock, _listener) = setup(&dir, "x509");
    let mut c = Command::new(env!("CARGO_BIN_EXE_kubelet"));
    c.arg(format!("--config={}", dir.join("config.yaml").display()))
        .arg(format!(
            "--root-dir={}",
            dir.join("var-lib-kubelet").display()
        ))
        .arg(format!(
            "--cert-dir={}",
            dir.join("var-lib-kubelet/pki").display()
        ))
        .arg(format!(
            "--container-runtime-endpoint=unix://{}",
            sock.display()
        ))
        .arg(format!("--healthz-port={}", free_port()))
        .env("STANDIN_KUBELET_CONFIG", dir.join("standin.env"))
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    // Its log, read as it comes: a loaded machine takes longer than any fixed wait.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let seen = seen.clone();
        let mut stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = stderr.read(&mut buf) {
                if n == 0 {
                    break;
                }
                seen.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let until = Instant::now() + Duration::from_secs(30);
    while !seen
        .lock()
        .unwrap()
        .contains("\"Standalone mode, no API client\"")
        && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    // Still running (the x509 failure needs an API client), and no certificate.
    assert!(child.try_wait().unwrap().is_none());
    child.kill().unwrap();
    child.wait().unwrap();
    reader.join().unwrap();
    let err = seen.lock().unwrap().clone();
    assert!(err.contains("\"Standalone mode, no API client\""), "{err}");
    assert!(!dir
        .join("var-lib-kubelet/pki/kubelet-client-current.pem")
        .exists());
}

/// `--config-dir` as kubelet reads it (tools/kubelet-config/src/dropin.rs): `.conf` files in
/// lexical order merged over `--config`, maps key by key, the command line last.
#[test]
fn drop_ins_merge_over_the_config_in_order_and_flags_still_win() {
    let dir = tempdir("dropin");
    let (sock, _listener) = setup(&dir, "success");
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let d = dir.join("conf.d");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(
        d.join("10-kiln-node.conf"),
        "{\"apiVersion\":\"kubelet.config.k8s.io/v1beta1\",\"kind\":\"KubeletConfiguration\",\
         \"maxPods\":29,\"evictionHard\":{\"memory.available\":\"200Mi\"},\"clusterDNS\":[\"10.0.0.10\"]}",
    )
    .unwrap();
    std::fs::write(
        d.join("50-operator.conf"),
        format!("{head}maxPods: 58\nclusterDNS: [fd00::a]\nfeatureGates:\n  NodeSwap: true\n"),
    )
    .unwrap();
    // Not a .conf file: kubelet skips it.
    std::fs::write(d.join("60-notes.yaml"), "maxPods: 1\n").unwrap();
    // A value validation refuses, so the run stops right after the merge.
    std::fs::write(
        d.join("70-last.conf"),
        format!("{head}imageGCHighThresholdPercent: 101\n"),
    )
    .unwrap();
    let dir_flag = format!("--config-dir={}", d.display());
    let (code, err) = run_quick(&dir, &sock, &[&dir_flag]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains(
            "imageGCHighThresholdPercent (--image-gc-high-threshold) 101 must be between 0 and 100"
        ),
        "{err}"
    );
    let merged = std::fs::read_to_string(dir.join("var-lib-kubelet/standin/config.json")).unwrap();
    let v: serde_json::Value = serde_json::from_str(&merged).unwrap();
    assert_eq!(v["maxPods"], 58, "{merged}");
    assert_eq!(v["cgroupDriver"], "systemd", "the base survives: {merged}");
    assert_eq!(
        v["clusterDNS"],
        serde_json::json!(["fd00::a"]),
        "lists replace"
    );
    // kubelet's default thresholds stay beside the drop-in's.
    assert_eq!(v["evictionHard"]["memory.available"], "200Mi");
    assert_eq!(v["evictionHard"]["imagefs.available"], "15%");
    assert_eq!(v["featureGates"]["NodeSwap"], true);

    // The command line wins over every drop-in.
    std::fs::write(d.join("70-last.conf"), format!("{head}maxPods: -3\n")).unwrap();
    let (code, err) = run_quick(&dir, &sock, &[&dir_flag, "--max-pods=-4"]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("maxPods (--max-pods) -4 must not be a negative number"),
        "{err}"
    );

    // A wrong type stops the merge; an empty drop-in and a missing directory are errors too.
    std::fs::write(d.join("70-last.conf"), format!("{head}maxPods: many\n")).unwrap();
    let (code, err) = run_quick(&dir, &sock, &[&dir_flag]);
    assert_eq!(code, Some(1));
    assert!(
        err.contains("failed to merge kubelet configs: failed to unmarshal merged JSON into kubelet configuration"),
        "{err}"
    );
    std::fs::write(d.join("70-last.conf"), "").unwrap();
    let (_, err) = run_quick(&dir, &sock, &[&dir_flag]);
    assert!(
        err.contains(
            "failed to merge kubelet configs: failed to walk through kubelet dropin directory"
        ),
        "{err}"
    );
    assert!(err.contains("70-last.conf\\\" was empty"), "{err}");
    let (code, err) = run_quick(
        &dir,
        &sock,
        &[&format!("--config-dir={}", dir.join("none").display())],
    );
    assert_eq!(code, Some(1));
    assert!(err.contains("no such file or directory"), "{err}");
}

/// featureGates, from the merged configuration, as kubelet's SetFromMap takes them: an
/// unknown gate and a locked gate set to the other value stop it before validation; a GA
/// gate is logged as a warning and the run goes on.
#[test]
fn feature_gates_are_set_as_kubelet_sets_them() {
    let dir = tempdir("gates");
    let (sock, _listener) = setup(&dir, "success");
    let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
    let d = dir.join("conf.d");
    std::fs::create_dir_all(&d).unwrap();
    let dir_flag = format!("--config-dir={}", d.display());
    // In a drop-in (or the file) the gates are set while defaults are applied, which panics.
    for (gates, want) in [
        ("Bogus: true", "panic: failed to merge global and in-flight KubeletConfiguration while setting defaults, error: unrecognized feature gate: Bogus"),
        ("NodeSwap: false", "panic: failed to merge global and in-flight KubeletConfiguration while setting defaults, error: cannot set feature gate NodeSwap to false, feature is locked to true"),
    ] {
        std::fs::write(d.join("50-gates.conf"), format!("{head}featureGates:\n  {gates}\n")).unwrap();
        let (code, err) = run_quick(&dir, &sock, &[&dir_flag]);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(want), "{err}");
    }
    // On the command line they are the run's error.
    std::fs::remove_file(d.join("50-gates.conf")).unwrap();
    let (code, err) = run_quick(&dir, &sock, &[&dir_flag, "--feature-gates=NodeSwap=false"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("\"command failed\" err=\"failed to set feature gates from initial flags-based config: cannot set feature gate NodeSwap to false, feature is locked to true\""), "{err}");
    // Accepted: the warning, then validation (which a bad value stops, ending the run here).
    std::fs::write(
        d.join("50-gates.conf"),
        format!("{head}featureGates:\n  NodeSwap: true\nimageGCHighThresholdPercent: 101\n"),
    )
    .unwrap();
    let (code, err) = run_quick(&dir, &sock, &[&dir_flag]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("\"Warning: setting GA feature gate. It will be removed in a future release.\" featureGate=\"NodeSwap\" value=true"), "{err}");
    assert!(
        err.contains("imageGCHighThresholdPercent (--image-gc-high-threshold) 101"),
        "{err}"
    );
}

/// `--image-credential-provider-config` / `--image-credential-provider-bin-dir`: either one
/// registers the plugins, and any error is logged and ends kubelet with exit 1
/// (kuberuntime_manager.go); a good config with its binaries runs on.
#[test]
fn credential_providers_are_registered_as_kubelet_registers_them() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempdir("credprov");
    let (sock, _listener) = setup(&dir, "success");
    let bin = dir.join("providers");
    std::fs::create_dir_all(&bin).unwrap();
    let cfg = dir.join("credential-providers.json");
    std::fs::write(
        &cfg,
        r#"{"apiVersion":"kubelet.config.k8s.io/v1","kind":"CredentialProviderConfig","providers":[{"name":"ecr-credential-provider","matchImages":["*.dkr.ecr.*.amazonaws.com"],"defaultCacheDuration":"12h","apiVersion":"credentialprovider.kubelet.k8s.io/v1"}]}"#,
    )
    .unwrap();
    let cfg_flag = format!("--image-credential-provider-config={}", cfg.display());
    let bin_flag = format!("--image-credential-provider-bin-dir={}", bin.display());
    let failed = |extra: &[&str], want: &str| {
        let (code, err) = run_quick(&dir, &sock, extra);
        assert_eq!(code, Some(1), "{extra:?}: {err}");
        assert!(
            err.contains(&format!(
                "\"Failed to register CRI auth plugins\" err=\"{want}"
            )),
            "{extra:?}: {err}"
        );
    };
    // One flag alone.
    failed(&[&cfg_flag], "plugin binary directory  did not exist");
    failed(&[&bin_flag], "credential provider config path is empty");
    // The binary is missing: kubelet's message names no path.
    failed(
        &[&cfg_flag, &bin_flag],
        "plugin binary executable  did not exist\"",
    );
    // A rule of validateCredentialProviderConfig.
    let exe = bin.join("ecr-credential-provider");
    std::fs::write(&exe, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, good.replace("\"12h\"", "\"-5m\"")).unwrap();
    failed(
        &[&cfg_flag, &bin_flag],
        "failed to validate credential provider config: providers.defaultCacheDuration: Invalid value: \\\"-5m0s\\\"",
    );
    // All good: it runs on and records what it registered.
    std::fs::write(&cfg, good).unwrap();
    let mut child = kubelet(&dir, &sock, free_port())
        .args([&cfg_flag, &bin_flag])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let record = dir.join("var-lib-kubelet/standin/credential-providers");
    let until = Instant::now() + Duration::from_secs(20);
    while !record.exists() && Instant::now() < until && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        std::fs::read_to_string(&record).unwrap(),
        "ecr-credential-provider\n"
    );
}

/// The stand-in credential provider answers kubelet's exec protocol: the request's
/// apiVersion back, credentials for the image's registry; anything else is an error.
#[test]
fn the_credential_provider_stand_in_speaks_the_exec_protocol() {
    let run = |input: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_credential-provider"))
            .arg("get-credentials")
            .env("STANDIN_CREDENTIAL_PASSWORD", "pw")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let o = run(
        r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"123.dkr.ecr.eu-west-1.amazonaws.com/team/app:1"}"#,
    );
    assert!(o.status.success(), "{o:?}");
    let resp: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(resp["kind"], "CredentialProviderResponse");
    assert_eq!(resp["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(
        resp["auth"]["123.dkr.ecr.eu-west-1.amazonaws.com"]["password"],
        "pw"
    );
    let o = run(
        r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1beta1","kind":"CredentialProviderRequest","image":"busybox"}"#,
    );
    let resp: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        resp["apiVersion"],
        "credentialprovider.kubelet.k8s.io/v1beta1"
    );
    assert_eq!(resp["auth"]["docker.io"]["username"], "standin");
    for bad in [
        r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v2","kind":"CredentialProviderRequest","image":"a"}"#,
        r#"{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest"}"#,
        "not json",
    ] {
        assert!(!run(bad).status.success(), "{bad}");
    }
}
