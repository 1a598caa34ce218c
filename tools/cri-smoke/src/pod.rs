//! The pod run: kubelet's first CRI calls for one pod, in kubelet's order (runtime status,
//! sandbox, image check, container create and start), then the checks a boot test makes on
//! what the runtime did, then stop and remove everything.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use k8s_cri::v1::{
    ContainerConfig, ContainerMetadata, ContainerState, ContainerStatusRequest,
    CreateContainerRequest, ImageSpec, ImageStatusRequest, LinuxPodSandboxConfig,
    ListPodSandboxRequest, PodSandboxConfig, PodSandboxFilter, PodSandboxMetadata,
    PodSandboxStatusRequest, PullImageRequest, RemoveContainerRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StatusRequest, StopPodSandboxRequest,
    VersionRequest,
};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::{
    cri_log_text, first_cni_file, info_image, not_ready, parse_cni, sandbox_image, sandbox_pid,
    with_repo_digest, CgroupDriver, Condition, Error,
};

/// What to run and where.
#[derive(Debug, Clone)]
pub struct Config {
    /// `unix:///run/containerd/containerd.sock` (kubelet's `--container-runtime-endpoint`).
    pub endpoint: String,
    /// Where the runtime reads the CNI configuration (`/etc/cni/net.d`).
    pub cni_conf_dir: PathBuf,
    /// kubelet's cgroup driver, which decides the pod's cgroup parent.
    pub cgroup_driver: CgroupDriver,
    /// The container's image; it must already be in the node's image store, unless `pull`.
    pub image: String,
    /// Pull the container's image through the runtime first (kubelet's `PullImage`, which
    /// resolves the registry through containerd's `hosts.toml` files), as a node pulls a
    /// pod's image that is not there.
    pub pull: bool,
    /// The container's command (empty: the image's own).
    pub command: Vec<String>,
    /// A line the container must print.
    pub expect_output: String,
    /// How long one CRI call may take.
    pub call_timeout: Duration,
    /// How long the runtime may take to report itself ready, and the container to exit.
    pub settle: Duration,
    /// Pod log directories live here (`/var/log/pods`, as kubelet puts them).
    pub pod_log_root: PathBuf,
}

/// What the run found, `key=value`, in the order found.
#[derive(Debug, Default, Clone)]
pub struct Report {
    /// The recorded facts.
    pub facts: Vec<(String, String)>,
}

impl Report {
    fn note(&mut self, key: &str, value: impl Into<String>) {
        let value = value.into();
        println!("cri-smoke: {key}={value}");
        self.facts.push((key.to_string(), value));
    }

    /// The report as `key=value` lines.
    pub fn to_text(&self) -> String {
        self.facts
            .iter()
            .map(|(k, v)| format!("{k}={}\n", v.replace('\n', " ")))
            .collect()
    }
}

fn rpc(call: &'static str) -> impl Fn(tonic::Status) -> Error {
    move |s| Error::Rpc {
        call,
        code: format!("{:?}", s.code()),
        desc: s.message().to_string(),
    }
}

/// One CRI call with the per-call deadline.
async fn call<T>(
    call: &'static str,
    limit: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, Error> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner).map_err(rpc(call)),
        Err(_) => Err(Error::Timeout {
            call,
            secs: limit.as_secs(),
        }),
    }
}

async fn connect(endpoint: &str) -> Result<Channel, Error> {
    let fail = |detail: String| Error::Connect {
        endpoint: endpoint.to_string(),
        detail,
    };
    let path = endpoint
        .strip_prefix("unix://")
        .ok_or_else(|| fail("only unix:// endpoints are supported".into()))?
        .to_string();
    // The URI is a placeholder: the connector dials the socket whatever it says.
    Endpoint::from_static("http://cri.invalid")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .map_err(|e| {
            let mut detail = e.to_string();
            let mut src = std::error::Error::source(&e);
            while let Some(s) = src {
                let s_text = s.to_string();
                if !detail.contains(&s_text) {
                    detail.push_str(&format!(": {s_text}"));
                }
                src = s.source();
            }
            fail(detail)
        })
}

/// Runs the pod and cleans up; on failure after the sandbox exists it still tries to remove
/// what it made, and the error is the first failure.
pub async fn run(cfg: &Config) -> Result<Report, Error> {
    let mut report = Report::default();
    let channel = connect(&cfg.endpoint).await?;
    let mut rt = RuntimeServiceClient::new(channel.clone());
    let mut img = ImageServiceClient::new(channel);
    let t = cfg.call_timeout;

    let v = call("Version", t, rt.version(VersionRequest::default())).await?;
    report.note(
        "runtime",
        format!(
            "{} {} (CRI {})",
            v.runtime_name, v.runtime_version, v.runtime_api_version
        ),
    );

    // kubelet waits for RuntimeReady and NetworkReady before it starts pods; the network
    // turns ready once the runtime has loaded a CNI configuration.
    let until = Instant::now() + cfg.settle;
    let status = loop {
        let s = call("Status", t, rt.status(StatusRequest { verbose: true })).await?;
        let conditions: Vec<Condition> = s
            .status
            .iter()
            .flat_map(|st| st.conditions.iter())
            .map(|c| Condition {
                kind: c.r#type.clone(),
                status: c.status,
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
            .collect();
        match not_ready(&conditions) {
            None => break s,
            Some(why) if Instant::now() >= until => {
                return Err(Error::Check {
                    check: "runtime status",
                    detail: format!("not ready after {} s: {why}", cfg.settle.as_secs()),
                })
            }
            Some(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    };
    report.note("runtime_ready", "true");
    report.note("network_ready", "true");

    let cni_file = first_cni_file(&cfg.cni_conf_dir)?;
    let cni_text = std::fs::read_to_string(&cni_file).map_err(|e| Error::Cni {
        path: cni_file.clone(),
        detail: e.to_string(),
    })?;
    let net = parse_cni(&cni_file, &cni_text)?;
    report.note("cni_config", net.file.display().to_string());
    report.note("cni_network", net.name.clone());

    if cfg.pull {
        let image_ref = pull(&mut img, t, &cfg.image).await?;
        report.note("pulled", format!("{} {image_ref}", cfg.image));
    }
    // The test image comes with the sandbox stand-in in one import: wait for it (kubelet
    // retries a pod whose image is not there yet), then the runtime's own sandbox image
    // (containerd's `sandbox_image`) must be there too. Nothing is pulled: the guest has no
    // registry, and a pull of a missing sandbox image would fail as a DNS or dial error
    // that says nothing about the image.
    image_present(
        &mut img,
        t,
        cfg.settle,
        &cfg.image,
        "the test container's image",
    )
    .await?;
    let sandbox = status.info.get("config").and_then(|c| sandbox_image(c));
    if let Some(sandbox) = &sandbox {
        report.note("sandbox_image", sandbox.clone());
        image_present(
            &mut img,
            t,
            Duration::ZERO,
            sandbox,
            "the runtime's sandbox image (containerd's sandbox_image)",
        )
        .await?;
    }
    report.note("cgroup_driver", cfg.cgroup_driver.to_string());

    let uid = pseudo_uid();
    let name = "kiln-cri-smoke";
    let namespace = "kube-system";
    let log_dir = cfg.pod_log_root.join(format!("{namespace}_{name}_{uid}"));
    let sandbox_config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: uid.clone(),
            namespace: namespace.into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: log_dir.display().to_string(),
        labels: BTreeMap::from([
            ("io.kubernetes.pod.name".to_string(), name.to_string()),
            (
                "io.kubernetes.pod.namespace".to_string(),
                namespace.to_string(),
            ),
            ("io.kubernetes.pod.uid".to_string(), uid.clone()),
        ])
        .into_iter()
        .collect(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: cfg.cgroup_driver.pod_cgroup_parent(&uid),
            ..Default::default()
        }),
        ..Default::default()
    };
    report.note("cgroup_parent", cfg.cgroup_driver.pod_cgroup_parent(&uid));

    let started = Instant::now();
    let sandbox_id = call(
        "RunPodSandbox",
        t,
        rt.run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        }),
    )
    .await?
    .pod_sandbox_id;
    report.note("sandbox_id", sandbox_id.clone());
    report.note("sandbox_ms", started.elapsed().as_millis().to_string());
    if sandbox.is_none() {
        // containerd 2.x keeps the sandbox image in its image service's config, which the
        // verbose Status no longer carries: the image the running sandbox was made from is
        // the runtime's own answer (its verbose PodSandboxStatus `image`), with the digest
        // the image store holds for it.
        let used = sandbox_image_in_use(&mut rt, &mut img, t, &sandbox_id).await;
        report.note(
            "sandbox_image",
            used.unwrap_or_else(|| "(not in the runtime's verbose status)".into()),
        );
    }

    let outcome = in_sandbox(
        cfg,
        &mut rt,
        &sandbox_id,
        &sandbox_config,
        &net,
        &mut report,
    )
    .await;
    let cleanup = remove(&mut rt, t, &sandbox_id).await;
    outcome?;
    cleanup?;
    report.note("cleaned_up", "true");
    Ok(report)
}

/// The image a running sandbox was made from, `NAME@sha256:…`: the `image` of its verbose
/// `PodSandboxStatus` info, with the repo digest the image store records for that name when
/// the name carries none. `None` when the runtime says neither.
async fn sandbox_image_in_use(
    rt: &mut RuntimeServiceClient<Channel>,
    img: &mut ImageServiceClient<Channel>,
    t: Duration,
    sandbox_id: &str,
) -> Option<String> {
    let st = call(
        "PodSandboxStatus",
        t,
        rt.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.into(),
            verbose: true,
        }),
    )
    .await
    .ok()?;
    let name = st.info.get("info").and_then(|i| info_image(i))?;
    if name.contains('@') {
        return Some(name);
    }
    let s = call(
        "ImageStatus",
        t,
        img.image_status(ImageStatusRequest {
            image: Some(ImageSpec {
                image: name.clone(),
                ..Default::default()
            }),
            verbose: false,
        }),
    )
    .await
    .ok()?;
    let digests = s.image.map(|i| i.repo_digests).unwrap_or_default();
    with_repo_digest(&name, &digests)
}

/// Address check, container run and its removal, inside a running sandbox.
async fn in_sandbox(
    cfg: &Config,
    rt: &mut RuntimeServiceClient<Channel>,
    sandbox_id: &str,
    sandbox_config: &PodSandboxConfig,
    net: &crate::CniNetwork,
    report: &mut Report,
) -> Result<(), Error> {
    let t = cfg.call_timeout;
    let st = call(
        "PodSandboxStatus",
        t,
        rt.pod_sandbox_status(PodSandboxStatusRequest {
            pod_sandbox_id: sandbox_id.into(),
            verbose: true,
        }),
    )
    .await?;
    // Where the runtime put the sandbox, seen from the node: the pause process's cgroup
    // (containerd's verbose `info` carries its pid).
    if let Some(pid) = st.info.get("info").and_then(|i| sandbox_pid(i)) {
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        report.note("sandbox_cgroup", cg.trim().replace('\n', " "));
    }
    let ip_text = st
        .status
        .and_then(|s| s.network)
        .map(|n| n.ip)
        .unwrap_or_default();
    let ip: Ipv4Addr = ip_text.parse().map_err(|_| Error::Check {
        check: "pod address",
        detail: format!(
            "the sandbox has no IPv4 address (got {ip_text:?}); CNI network {:?} from {} did not give one",
            net.name,
            net.file.display()
        ),
    })?;
    let subnet = net
        .subnets
        .iter()
        .find(|s| s.contains(ip))
        .ok_or_else(|| Error::Check {
            check: "pod address",
            detail: format!(
                "{ip} is outside every subnet of CNI network {:?} ({}): the address came from elsewhere",
                net.name,
                net.subnets.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
        })?;
    report.note("pod_ip", ip.to_string());
    report.note("pod_subnet", subnet.to_string());

    let log_path = "smoke/0.log";
    let container_id = call(
        "CreateContainer",
        t,
        rt.create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "smoke".into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: cfg.image.clone(),
                    ..Default::default()
                }),
                command: cfg.command.clone(),
                log_path: log_path.into(),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config.clone()),
        }),
    )
    .await?
    .container_id;
    report.note("container_id", container_id.clone());
    call(
        "StartContainer",
        t,
        rt.start_container(StartContainerRequest {
            container_id: container_id.clone(),
        }),
    )
    .await?;

    let until = Instant::now() + cfg.settle;
    let status = loop {
        let s = call(
            "ContainerStatus",
            t,
            rt.container_status(ContainerStatusRequest {
                container_id: container_id.clone(),
                verbose: false,
            }),
        )
        .await?
        .status
        .ok_or_else(|| Error::Check {
            check: "container status",
            detail: "the runtime returned no status".into(),
        })?;
        if s.state == ContainerState::ContainerExited as i32 {
            break s;
        }
        if Instant::now() >= until {
            return Err(Error::Check {
                check: "container run",
                detail: format!(
                    "still {:?} after {} s",
                    ContainerState::try_from(s.state).unwrap_or(ContainerState::ContainerUnknown),
                    cfg.settle.as_secs()
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let log_file = PathBuf::from(&sandbox_config.log_directory).join(log_path);
    let log = std::fs::read_to_string(&log_file).unwrap_or_default();
    let lines = cri_log_text(&log);
    report.note("container_exit_code", status.exit_code.to_string());
    if status.exit_code != 0 || !lines.iter().any(|l| l == &cfg.expect_output) {
        return Err(Error::Check {
            check: "container run",
            detail: format!(
                "exit code {} (reason {:?} {:?}); wanted exit 0 and the line {:?} in {}, which holds: {:?}",
                status.exit_code,
                status.reason,
                status.message,
                cfg.expect_output,
                log_file.display(),
                lines
            ),
        });
    }
    report.note("container_output", cfg.expect_output.clone());
    call(
        "RemoveContainer",
        t,
        rt.remove_container(RemoveContainerRequest { container_id }),
    )
    .await?;
    Ok(())
}

/// Stops and removes the sandbox (which tears its network down through CNI) and checks the
/// runtime no longer lists it.
async fn remove(
    rt: &mut RuntimeServiceClient<Channel>,
    t: Duration,
    sandbox_id: &str,
) -> Result<(), Error> {
    call(
        "StopPodSandbox",
        t,
        rt.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: sandbox_id.into(),
        }),
    )
    .await?;
    call(
        "RemovePodSandbox",
        t,
        rt.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id.into(),
        }),
    )
    .await?;
    let left = call(
        "ListPodSandbox",
        t,
        rt.list_pod_sandbox(ListPodSandboxRequest {
            filter: Some(PodSandboxFilter {
                id: sandbox_id.into(),
                ..Default::default()
            }),
        }),
    )
    .await?;
    if !left.items.is_empty() {
        return Err(Error::Check {
            check: "cleanup",
            detail: format!("sandbox {sandbox_id} is still listed after RemovePodSandbox"),
        });
    }
    Ok(())
}

/// kubelet's `PullImage` of `image` without credentials; the runtime's image reference.
async fn pull(
    img: &mut ImageServiceClient<Channel>,
    t: Duration,
    image: &str,
) -> Result<String, Error> {
    let r = call(
        "PullImage",
        t,
        img.pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: None,
        }),
    )
    .await?;
    Ok(r.image_ref)
}

/// `cri-smoke pull`: one `PullImage` on the runtime at `endpoint`; the image reference.
pub async fn pull_only(endpoint: &str, t: Duration, image: &str) -> Result<String, Error> {
    let channel = connect(endpoint).await?;
    let mut img = ImageServiceClient::new(channel);
    pull(&mut img, t, image).await
}

/// Waits until the image is in the runtime's store (ImageStatus answers "no image" rather
/// than an error for a missing one), as kubelet keeps retrying a pod whose image is not
/// there yet; fails after `settle`. Nothing is pulled: a boot test's guest has no registry.
async fn image_present(
    img: &mut ImageServiceClient<Channel>,
    t: Duration,
    settle: Duration,
    image: &str,
    what: &str,
) -> Result<(), Error> {
    let until = Instant::now() + settle;
    loop {
        let s = call(
            "ImageStatus",
            t,
            img.image_status(ImageStatusRequest {
                image: Some(ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                verbose: false,
            }),
        )
        .await?;
        if s.image.is_some() {
            return Ok(());
        }
        if Instant::now() >= until {
            return Err(Error::Check {
                check: "image store",
                detail: format!(
                    "{what} {image} is not in the runtime's image store (namespace k8s.io){}; \
                     RunPodSandbox would pull it from its registry, which this node cannot reach: \
                     pre-pull it into the node image under exactly this name",
                    if settle.is_zero() {
                        String::new()
                    } else {
                        format!(" after {} s", settle.as_secs())
                    }
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A version-4-shaped UID from the clock and the process id, spread over all 128 bits
/// (unique enough for one pod per boot; kubelet takes it from the API server).
fn pseudo_uid() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    let a = nanos.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let b = (nanos ^ u64::from(std::process::id())).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    let h = format!("{a:016x}{b:016x}");
    format!(
        "{}-{}-4{}-8{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}
