//! `cri-smoke`: runs one pod on a node's container runtime over CRI and writes what it found.
//! Exit 0 when the pod ran and was cleaned up; 1 with the failing call or check on stderr.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use cri_smoke::pod::{self, Config};
use cri_smoke::CgroupDriver;

const USAGE: &str = "usage: cri-smoke --image REF --expect LINE [--endpoint unix:///run/containerd/containerd.sock] \
[--cni-conf-dir /etc/cni/net.d] [--cgroup-driver systemd|cgroupfs] [--report FILE] \
[--call-timeout-secs 60] [--settle-secs 60] [--pod-log-root /var/log/pods] [--pull] [-- COMMAND…]
(without a COMMAND the container runs its image's own; --pull pulls the image through the runtime first)
       cri-smoke pull --image REF [--endpoint …] [--call-timeout-secs 60]
(one PullImage, as kubelet asks for a pod's image; prints the runtime's image reference)";

struct Args {
    config: Config,
    report: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut cfg = Config {
        endpoint: "unix:///run/containerd/containerd.sock".into(),
        cni_conf_dir: "/etc/cni/net.d".into(),
        cgroup_driver: CgroupDriver::Cgroupfs,
        image: String::new(),
        pull: false,
        command: Vec::new(),
        expect_output: String::new(),
        call_timeout: Duration::from_secs(60),
        settle: Duration::from_secs(60),
        pod_log_root: "/var/log/pods".into(),
    };
    let mut report = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--" {
            cfg.command = it.by_ref().cloned().collect();
            break;
        }
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value\n{USAGE}"))
        };
        let secs = |v: String| -> Result<Duration, String> {
            v.parse()
                .map(Duration::from_secs)
                .map_err(|_| format!("{a}: {v:?} is not a number of seconds"))
        };
        match a.as_str() {
            "--endpoint" => cfg.endpoint = value()?,
            "--cni-conf-dir" => cfg.cni_conf_dir = value()?.into(),
            "--cgroup-driver" => {
                let v = value()?;
                cfg.cgroup_driver = CgroupDriver::parse(&v).ok_or_else(|| {
                    format!("--cgroup-driver: {v:?} is neither systemd nor cgroupfs")
                })?;
            }
            "--image" => cfg.image = value()?,
            "--expect" => cfg.expect_output = value()?,
            "--report" => report = Some(PathBuf::from(value()?)),
            "--call-timeout-secs" => cfg.call_timeout = secs(value()?)?,
            "--settle-secs" => cfg.settle = secs(value()?)?,
            "--pod-log-root" => cfg.pod_log_root = value()?.into(),
            "--pull" => cfg.pull = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    if cfg.image.is_empty() || cfg.expect_output.is_empty() {
        return Err(format!("--image and --expect are required\n{USAGE}"));
    }
    Ok(Args {
        config: cfg,
        report,
    })
}

/// The single-threaded runtime both commands run on; `None` (said on stderr) if it cannot start.
fn runtime() -> Option<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| eprintln!("cri-smoke: cannot start the async runtime: {e}"))
        .ok()
}

/// `cri-smoke pull`: the same flags as a pod run, of which it reads `--image`, `--endpoint`
/// and `--call-timeout-secs`.
fn pull_main(args: &[String]) -> ExitCode {
    let mut with_expect = args.to_vec();
    with_expect.extend(["--expect".to_string(), "-".to_string()]);
    let cfg = match parse(&with_expect) {
        Ok(a) => a.config,
        Err(e) => {
            eprintln!("cri-smoke pull: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(pod::pull_only(&cfg.endpoint, cfg.call_timeout, &cfg.image)) {
        Ok(image_ref) => {
            println!("{image_ref}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cri-smoke pull: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("pull") {
        return pull_main(&args[1..]);
    }
    let args = match parse(&args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cri-smoke: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(runtime) = runtime() else {
        return ExitCode::FAILURE;
    };
    let result = runtime.block_on(pod::run(&args.config));
    let (text, code) = match &result {
        Ok(r) => (
            format!("result=success\n{}", r.to_text()),
            ExitCode::SUCCESS,
        ),
        Err(e) => {
            eprintln!("cri-smoke: {e}");
            (
                format!(
                    "result=failure\nerror={}\n",
                    e.to_string().replace('\n', " ")
                ),
                ExitCode::FAILURE,
            )
        }
    };
    if let Some(path) = &args.report {
        let tmp = path.with_extension("tmp");
        let written = path
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::write(&tmp, &text))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            eprintln!("cri-smoke: write {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    }
    code
}
