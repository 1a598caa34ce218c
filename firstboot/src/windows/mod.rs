//! Windows nodes: where the contract's files live on Windows, which services a node has, and
//! how they are registered, updated and started. The plans here are plain data run against
//! a small [`ServiceManager`] trait, so the same sequence is tested against Wine's real
//! Service Control Manager (`scm::Scm`, Windows only) and against a recorder anywhere.

#[cfg(windows)]
pub mod dispatch;
pub mod eventlog;
#[cfg(windows)]
pub mod firmware;
pub mod health;
#[cfg(windows)]
pub mod kvp;
#[cfg(windows)]
pub mod scm;
pub mod task;
#[cfg(windows)]
pub mod volumes;

use std::fmt;
use std::path::{Path, PathBuf};

/// How the Service Control Manager starts a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartType {
    /// At boot (SERVICE_AUTO_START).
    Auto,
    /// Only when asked (SERVICE_DEMAND_START): kubelet, which firstboot starts.
    Demand,
}

/// One Windows service as kiln registers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceSpec {
    /// The service name (`sc.exe query <name>`).
    pub name: String,
    /// What the Services console shows.
    pub display_name: String,
    /// What it does, in one line.
    pub description: String,
    /// The full command line: quoted program path, then arguments.
    pub command: String,
    /// Services that must be running first.
    pub dependencies: Vec<String>,
    /// When it starts.
    pub start: StartType,
    /// Restart delays after the first, second and later failures; empty: never restarted.
    pub restart_after_ms: Vec<u32>,
    /// `KEY=VALUE` entries of the service's own environment (the SCM's `Environment`
    /// value); empty: none, and an earlier one is removed.
    pub environment: Vec<String>,
}

/// A service's state as the SCM reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceState {
    Stopped,
    StartPending,
    Running,
    /// Stopping, pausing, paused: none of them is "up".
    Other(u32),
}

/// A service's `SERVICE_STATUS`, the parts diagnosis reads: its state and how its process
/// last ended (`dwWin32ExitCode`, and `dwServiceSpecificExitCode` when that is
/// [`ERROR_SERVICE_SPECIFIC_ERROR`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceReport {
    pub state: ServiceState,
    pub win32_exit_code: u32,
    pub service_exit_code: u32,
}

/// Windows error: the service's own exit code is in `dwServiceSpecificExitCode`.
pub const ERROR_SERVICE_SPECIFIC_ERROR: u32 = 1066;

/// A failed service-manager call: which call, on which service, and the Windows error code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceError {
    pub call: &'static str,
    pub service: String,
    pub code: u32,
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hint = match self.code {
            5 => " (access denied: run as Administrator or LocalSystem)",
            1056 => " (already running)",
            1058 => " (the service is disabled)",
            1060 => " (no such service: run `kiln-firstboot install` at image build time)",
            1072 => " (marked for deletion: close the Services console and retry)",
            1073 => " (already exists)",
            _ => "",
        };
        write!(
            f,
            "{} for service '{}' failed with Windows error {}{hint}",
            self.call, self.service, self.code
        )
    }
}

impl std::error::Error for ServiceError {}

/// The Service Control Manager calls kiln needs, one method each, so a plan can run against
/// the real SCM or a recorder.
pub trait ServiceManager {
    /// Whether a service of that name is registered.
    fn exists(&mut self, name: &str) -> Result<bool, ServiceError>;
    /// Registers a new service.
    fn create(&mut self, spec: &ServiceSpec) -> Result<(), ServiceError>;
    /// Rewrites an existing service's configuration to match `spec`.
    fn update(&mut self, spec: &ServiceSpec) -> Result<(), ServiceError>;
    /// Replaces only the command line (kubelet's flags at each boot).
    fn set_command(&mut self, name: &str, command: &str) -> Result<(), ServiceError>;
    /// Asks the SCM to start it; returns once the request is accepted.
    fn start(&mut self, name: &str) -> Result<(), ServiceError>;
    /// Asks a running service to stop; does not wait.
    fn stop(&mut self, name: &str) -> Result<(), ServiceError>;
    /// The current state.
    fn state(&mut self, name: &str) -> Result<ServiceState, ServiceError>;
    /// The state and how the service's process last ended, for diagnosis.
    fn query(&mut self, name: &str) -> Result<ServiceReport, ServiceError>;
    /// Unregisters it (Windows removes it once the last handle closes).
    fn delete(&mut self, name: &str) -> Result<(), ServiceError>;
}

/// Windows error: the service is already running.
pub const ERROR_SERVICE_ALREADY_RUNNING: u32 = 1056;
/// Windows error: no such service.
pub const ERROR_SERVICE_DOES_NOT_EXIST: u32 = 1060;
/// Windows error: the service has not been started (stop of a stopped service).
pub const ERROR_SERVICE_NOT_ACTIVE: u32 = 1062;

/// Quotes a path for a service command line, so `C:\Program Files\…` works. A trailing
/// backslash is doubled: Windows' argument rules read `\"` as a literal quote. Forward
/// slashes (from joins made on a Unix build host) become backslashes.
pub fn quote(path: &Path) -> String {
    let p = path.display().to_string().replace('/', "\\");
    if p.ends_with('\\') {
        format!("\"{p}\\\"")
    } else {
        format!("\"{p}\"")
    }
}

/// The three services of a kiln Windows node, in start order. `bin_dir` holds the binaries
/// (`C:\k`); `root` is the system drive kiln-firstboot's `--root` points at.
pub fn node_services(bin_dir: &Path, root: &Path) -> Vec<ServiceSpec> {
    let restart = vec![10_000, 10_000, 30_000];
    vec![
        ServiceSpec {
            name: "containerd".into(),
            display_name: "containerd container runtime".into(),
            description: "Container runtime for kubelet (kiln node image)".into(),
            // --run-service: containerd talks to the SCM itself (containerd's Windows service).
            // --config: the config `kiln bake` renders into the layer, instead of containerd's
            // default under C:\Program Files.
            command: format!(
                "{} --config {} --run-service",
                quote(&bin_dir.join("containerd.exe")),
                quote(&bin_dir.join("containerd").join("config.toml"))
            ),
            dependencies: vec![],
            start: StartType::Auto,
            restart_after_ms: restart.clone(),
            environment: vec![],
        },
        ServiceSpec {
            name: "kubelet".into(),
            display_name: "Kubernetes kubelet".into(),
            description: "Kubernetes node agent; started by kiln-firstboot with this node's flags"
                .into(),
            // kiln-firstboot rewrites the flags at every boot before it starts kubelet.
            command: format!("{} --windows-service", quote(&bin_dir.join("kubelet.exe"))),
            dependencies: vec!["containerd".into()],
            start: StartType::Demand,
            restart_after_ms: restart,
            environment: vec![],
        },
        ServiceSpec {
            name: "kiln-firstboot".into(),
            display_name: "kiln first boot".into(),
            description: "Turns the node contract and instance metadata into a running kubelet"
                .into(),
            command: format!(
                "{} service --root {}",
                quote(&bin_dir.join("kiln-firstboot.exe")),
                quote(root)
            ),
            dependencies: vec![],
            start: StartType::Auto,
            // Runs once per boot; a failure is reported, not retried in a loop.
            restart_after_ms: vec![],
            environment: vec![],
        },
    ]
}

/// Where `kiln bake` puts containerd's proxy environment, under the binaries' directory
/// (`C:\k\containerd\containerd.env`).
pub const CONTAINERD_ENV: [&str; 2] = ["containerd", "containerd.env"];

/// The `KEY=VALUE` environment for the containerd service from the layer's
/// `containerd\containerd.env` (the image definition's `[containerd.proxy]`); none when the
/// file is absent. A file that does not parse is an error naming it.
pub fn containerd_environment(bin_dir: &Path) -> Result<Vec<String>, String> {
    let path = bin_dir.join(CONTAINERD_ENV[0]).join(CONTAINERD_ENV[1]);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let env =
        crate::contract::envfile::parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(env
        .entries()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect())
}

/// What `install` did to one service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Installed {
    Created,
    Updated,
}

/// Registers every service, or brings an existing registration up to date (so re-running
/// `install` on an image is harmless).
pub fn install(
    mgr: &mut dyn ServiceManager,
    specs: &[ServiceSpec],
) -> Result<Vec<(String, Installed)>, ServiceError> {
    let mut done = Vec::with_capacity(specs.len());
    for spec in specs {
        if mgr.exists(&spec.name)? {
            mgr.update(spec)?;
            done.push((spec.name.clone(), Installed::Updated));
        } else {
            mgr.create(spec)?;
            done.push((spec.name.clone(), Installed::Created));
        }
    }
    Ok(done)
}

/// Stops and unregisters the services, dependents first; absent ones are skipped. Returns
/// the names that were removed.
pub fn uninstall(
    mgr: &mut dyn ServiceManager,
    names: &[&str],
) -> Result<Vec<String>, ServiceError> {
    let mut removed = Vec::new();
    for name in names.iter().rev() {
        if !mgr.exists(name)? {
            continue;
        }
        match mgr.stop(name) {
            Ok(()) => {}
            Err(e) if e.code == ERROR_SERVICE_NOT_ACTIVE => {}
            // A service that cannot take a stop request right now is still deleted: Windows
            // removes it once it stops.
            Err(e) if e.code == 1061 => {}
            Err(e) => return Err(e),
        }
        mgr.delete(name)?;
        removed.push(name.to_string());
    }
    Ok(removed)
}

/// kubelet's service command line for this boot: its program, `--windows-service`, then the
/// flags firstboot rendered into `KUBELET_ARGS`.
pub fn kubelet_command(bin_dir: &Path, kubelet_args: &str) -> String {
    let mut cmd = format!("{} --windows-service", quote(&bin_dir.join("kubelet.exe")));
    if !kubelet_args.trim().is_empty() {
        cmd.push(' ');
        cmd.push_str(kubelet_args.trim());
    }
    cmd
}

/// Gives kubelet this boot's flags and asks the SCM to start it; a kubelet that is already
/// running counts as started (a re-run of firstboot).
pub fn start_kubelet(
    mgr: &mut dyn ServiceManager,
    name: &str,
    command: &str,
) -> Result<(), ServiceError> {
    mgr.set_command(name, command)?;
    match mgr.start(name) {
        Err(e) if e.code == ERROR_SERVICE_ALREADY_RUNNING => Ok(()),
        other => other,
    }
}

/// The Windows service name for a contract unit name: `kubelet.service` is `kubelet`.
pub fn service_name(unit: &str) -> &str {
    unit.strip_suffix(".service").unwrap_or(unit)
}

/// Where the binaries are for a `--root`: `<root>\k`.
pub fn bin_dir(root: &Path) -> PathBuf {
    root.join("k")
}

/// The options of `kiln-firstboot install` / `uninstall`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstallOptions {
    /// The system drive the node's files are under (`C:\`).
    pub root: PathBuf,
    /// Where kubelet.exe, containerd.exe and kiln-firstboot.exe are (`C:\k`).
    pub bin_dir: PathBuf,
}

/// Parses `install`/`uninstall` arguments: `[--root DIR] [--bin-dir DIR]`.
pub fn parse_install_args(args: &[String]) -> Result<InstallOptions, String> {
    let mut root: Option<PathBuf> = None;
    let mut bin: Option<PathBuf> = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (a.as_str(), None),
        };
        let slot = match flag {
            "--root" => &mut root,
            "--bin-dir" => &mut bin,
            _ => {
                return Err(format!(
                    "unknown argument '{a}' (expected --root DIR or --bin-dir DIR)"
                ))
            }
        };
        let v = match inline {
            Some(v) => v,
            None => it
                .next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a directory"))?,
        };
        if v.is_empty() {
            return Err(format!("{flag} needs a directory"));
        }
        *slot = Some(PathBuf::from(v));
    }
    let root = root.unwrap_or_else(|| PathBuf::from("C:\\"));
    let bin_dir = bin.unwrap_or_else(|| bin_dir(&root));
    Ok(InstallOptions { root, bin_dir })
}

/// A [`ServiceManager`] that keeps services in memory and records every call, for testing
/// plans where there is no SCM and for checking the order of calls where there is one.
#[derive(Debug, Default)]
pub struct Recorder {
    /// Registered services by name.
    pub services: Vec<(ServiceSpec, ServiceState)>,
    /// Every call, as `"<call> <name>"`.
    pub calls: Vec<String>,
}

impl Recorder {
    fn find(&mut self, call: &'static str, name: &str) -> Result<usize, ServiceError> {
        self.calls.push(format!("{call} {name}"));
        self.services
            .iter()
            .position(|(s, _)| s.name == name)
            .ok_or(ServiceError {
                call,
                service: name.to_string(),
                code: ERROR_SERVICE_DOES_NOT_EXIST,
            })
    }
}

impl ServiceManager for Recorder {
    fn exists(&mut self, name: &str) -> Result<bool, ServiceError> {
        self.calls.push(format!("exists {name}"));
        Ok(self.services.iter().any(|(s, _)| s.name == name))
    }
    fn create(&mut self, spec: &ServiceSpec) -> Result<(), ServiceError> {
        self.calls.push(format!("create {}", spec.name));
        if self.services.iter().any(|(s, _)| s.name == spec.name) {
            return Err(ServiceError {
                call: "CreateServiceW",
                service: spec.name.clone(),
                code: 1073,
            });
        }
        self.services.push((spec.clone(), ServiceState::Stopped));
        Ok(())
    }
    fn update(&mut self, spec: &ServiceSpec) -> Result<(), ServiceError> {
        let i = self.find("update", &spec.name)?;
        self.services[i].0 = spec.clone();
        Ok(())
    }
    fn set_command(&mut self, name: &str, command: &str) -> Result<(), ServiceError> {
        let i = self.find("set_command", name)?;
        self.services[i].0.command = command.to_string();
        Ok(())
    }
    fn start(&mut self, name: &str) -> Result<(), ServiceError> {
        let i = self.find("start", name)?;
        if self.services[i].1 == ServiceState::Running {
            return Err(ServiceError {
                call: "StartServiceW",
                service: name.to_string(),
                code: ERROR_SERVICE_ALREADY_RUNNING,
            });
        }
        self.services[i].1 = ServiceState::Running;
        Ok(())
    }
    fn stop(&mut self, name: &str) -> Result<(), ServiceError> {
        let i = self.find("stop", name)?;
        if self.services[i].1 != ServiceState::Running {
            return Err(ServiceError {
                call: "ControlService",
                service: name.to_string(),
                code: ERROR_SERVICE_NOT_ACTIVE,
            });
        }
        self.services[i].1 = ServiceState::Stopped;
        Ok(())
    }
    fn state(&mut self, name: &str) -> Result<ServiceState, ServiceError> {
        let i = self.find("state", name)?;
        Ok(self.services[i].1)
    }
    fn query(&mut self, name: &str) -> Result<ServiceReport, ServiceError> {
        let i = self.find("query", name)?;
        Ok(ServiceReport {
            state: self.services[i].1,
            win32_exit_code: 0,
            service_exit_code: 0,
        })
    }
    fn delete(&mut self, name: &str) -> Result<(), ServiceError> {
        let i = self.find("delete", name)?;
        self.services.remove(i);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_creates_then_updates_and_uninstall_reverses() {
        let specs = node_services(Path::new("C:\\k"), Path::new("C:\\"));
        let mut rec = Recorder::default();
        let first = install(&mut rec, &specs).unwrap();
        assert!(first.iter().all(|(_, how)| *how == Installed::Created));
        let again = install(&mut rec, &specs).unwrap();
        assert!(again.iter().all(|(_, how)| *how == Installed::Updated));
        assert_eq!(rec.services.len(), 3);

        rec.calls.clear();
        start_kubelet(
            &mut rec,
            "kubelet",
            "\"C:\\k\\kubelet.exe\" --windows-service --v=2",
        )
        .unwrap();
        // A second start (firstboot re-run) is not an error.
        start_kubelet(
            &mut rec,
            "kubelet",
            "\"C:\\k\\kubelet.exe\" --windows-service --v=2",
        )
        .unwrap();
        assert_eq!(
            rec.calls,
            [
                "set_command kubelet",
                "start kubelet",
                "set_command kubelet",
                "start kubelet"
            ]
        );

        rec.calls.clear();
        let removed = uninstall(&mut rec, &["containerd", "kubelet", "kiln-firstboot"]).unwrap();
        assert_eq!(removed, ["kiln-firstboot", "kubelet", "containerd"]);
        assert!(rec.services.is_empty());
        // kubelet was running: it is stopped before it is deleted.
        assert!(rec.calls.contains(&"stop kubelet".to_string()));
        assert!(uninstall(&mut rec, &["kubelet"]).unwrap().is_empty());
    }

    #[test]
    fn node_services_depend_and_restart_as_documented() {
        let specs = node_services(Path::new("C:\\k"), Path::new("C:\\"));
        let kubelet = specs.iter().find(|s| s.name == "kubelet").unwrap();
        assert_eq!(kubelet.dependencies, ["containerd"]);
        assert_eq!(kubelet.start, StartType::Demand);
        assert!(!kubelet.restart_after_ms.is_empty());
        let fb = specs.iter().find(|s| s.name == "kiln-firstboot").unwrap();
        assert_eq!(fb.start, StartType::Auto);
        assert!(fb.restart_after_ms.is_empty());
        let containerd = specs.iter().find(|s| s.name == "containerd").unwrap();
        // The config kiln bake renders at k/containerd/config.toml.
        assert_eq!(
            containerd.command,
            r#""C:\k\containerd.exe" --config "C:\k\containerd\config.toml" --run-service"#
        );
        assert_eq!(
            fb.command,
            r#""C:\k\kiln-firstboot.exe" service --root "C:\\""#
        );
    }

    #[test]
    fn containerd_environment_comes_from_the_baked_env_file() {
        let dir = std::env::temp_dir().join(format!("kiln-ctd-env-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(containerd_environment(&dir).unwrap(), Vec::<String>::new());
        std::fs::create_dir_all(dir.join("containerd")).unwrap();
        let file = dir.join("containerd").join("containerd.env");
        std::fs::write(
            &file,
            "# Written by kiln bake\nHTTP_PROXY=http://proxy:3128\nNO_PROXY=10.0.0.0/8,.local\n",
        )
        .unwrap();
        assert_eq!(
            containerd_environment(&dir).unwrap(),
            ["HTTP_PROXY=http://proxy:3128", "NO_PROXY=10.0.0.0/8,.local"]
        );
        std::fs::write(&file, "HTTP_PROXY http://proxy\n").unwrap();
        let err = containerd_environment(&dir).unwrap_err();
        assert!(err.contains("containerd.env"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn install_args() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse_install_args(&args(&[])).unwrap();
        assert_eq!(o.root, PathBuf::from("C:\\"));
        let o = parse_install_args(&args(&["--root", "D:\\node", "--bin-dir=E:\\bin"])).unwrap();
        assert_eq!(
            (o.root, o.bin_dir),
            (PathBuf::from("D:\\node"), PathBuf::from("E:\\bin"))
        );
        assert!(parse_install_args(&args(&["--root"])).is_err());
        assert!(parse_install_args(&args(&["--bogus"])).is_err());
        assert_eq!(service_name("kubelet.service"), "kubelet");
        assert_eq!(
            kubelet_command(Path::new("C:\\k"), " --v=2 "),
            "\"C:\\k\\kubelet.exe\" --windows-service --v=2"
        );
    }
}
