//! Starting kubelet on Windows: its flags read back from the `kubelet.env` this run wrote,
//! put on the kubelet service's command line, and the service started through the SCM. Beside
//! `run`, not in `windows/`: it takes the run's options and config, and `windows/` holds only
//! the helpers the lower layers use (SCM, event log, firmware, KVP).

use crate::cli::Options;
use crate::config::Config;
use crate::contract::paths::NodePaths;
use crate::contract::{envfile, kubelet_env};
use crate::error::Error;
use crate::windows::{bin_dir, kubelet_command, service_name, start_kubelet};
use crate::windows::{ServiceError, ServiceManager};
use crate::Reason;

/// Reads `KUBELET_ARGS` back from the `kubelet.env` this run wrote (the one rendering of the
/// flags), puts them on kubelet's service command line and starts it through the SCM.
pub fn start_kubelet_service(opts: &Options, paths: &NodePaths, cfg: &Config) -> Result<(), Error> {
    let env_path = &paths.kubelet_env;
    let text = std::fs::read_to_string(env_path).map_err(|e| {
        Error::start(
            Reason::StartFailed,
            format!(
                "{}: cannot read kubelet's flags back: {e}",
                env_path.display()
            ),
        )
    })?;
    let env = envfile::parse(&text)
        .map_err(|e| Error::start(Reason::StartFailed, format!("{}: {e}", env_path.display())))?;
    let command = kubelet_command(
        &bin_dir(&opts.root),
        env.get(kubelet_env::KUBELET_ARGS).unwrap_or(""),
    );
    let name = service_name(&cfg.image.kubelet_unit);
    let started = open_scm().and_then(|mut scm| start_kubelet(scm.as_mut(), name, &command));
    started.map_err(|e| Error::start(Reason::StartFailed, e.to_string()))
}

/// The machine's service manager: the real SCM on Windows; elsewhere there is none.
pub fn open_scm() -> Result<Box<dyn ServiceManager>, ServiceError> {
    #[cfg(windows)]
    return Ok(Box::new(crate::windows::scm::Scm::open()?));
    #[cfg(not(windows))]
    Err(ServiceError {
        call: "OpenSCManagerW",
        service: "(service manager)".into(),
        code: 120, // ERROR_CALL_NOT_IMPLEMENTED
    })
}
