//! Diagnosis on Windows: what the Service Control Manager says of kubelet and containerd,
//! as the [`UnitState`] that `systemctl show` gives on Linux, so the same rules (died?
//! crash-looping? up long enough?) and reason codes apply. No Linux tool is called.
//!
//! The SCM knows a service's state and how its process last ended (`SERVICE_STATUS`:
//! `dwWin32ExitCode`, and `dwServiceSpecificExitCode` when that is
//! `ERROR_SERVICE_SPECIFIC_ERROR`), not how often it was restarted: `restarts` stays unknown.

use crate::diagnose::UnitState;

use super::ServiceState;

/// `ERROR_SERVICE_SPECIFIC_ERROR`: the service's own exit code is in
/// `dwServiceSpecificExitCode`.
pub const ERROR_SERVICE_SPECIFIC_ERROR: u32 = 1066;

/// A service's `SERVICE_STATUS`, the parts diagnosis reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceReport {
    pub state: ServiceState,
    pub win32_exit_code: u32,
    pub service_exit_code: u32,
}

/// The unit state of service `name` (`kubelet.service` keeps its Linux name in the status, as
/// the image names it):
/// - running → `active`; start pending → `activating`; stop pending or paused →
///   `deactivating`;
/// - stopped with exit code 0 → `inactive`, result `success` (stopped on purpose, or never
///   started);
/// - stopped with `ERROR_SERVICE_SPECIFIC_ERROR` → `failed`, result `exit-code`, status the
///   service's own code; any other Windows error → `failed`, status that error (1067
///   `ERROR_PROCESS_ABORTED`: the process ended without telling the SCM).
pub fn unit_state(name: &str, r: &ServiceReport) -> UnitState {
    let (active, result, status) = match r.state {
        ServiceState::Running => ("active", "success", None),
        ServiceState::StartPending => ("activating", "success", None),
        ServiceState::Other(_) => ("deactivating", "success", None),
        ServiceState::Stopped => match r.win32_exit_code {
            0 => ("inactive", "success", None),
            ERROR_SERVICE_SPECIFIC_ERROR => {
                ("failed", "exit-code", Some(r.service_exit_code as i32))
            }
            code => ("failed", "exit-code", Some(code as i32)),
        },
    };
    UnitState {
        name: name.to_string(),
        active_state: active.to_string(),
        result: result.to_string(),
        exec_main_status: status,
        restarts: None,
        main_start_us: None,
    }
}

/// The unit states of `units` from the machine's SCM; a service the SCM cannot answer for is
/// left out with a warning (as a `systemctl show` that fails is on Linux).
#[cfg(windows)]
pub fn unit_states(units: &[&str], warn: &dyn Fn(&str)) -> Vec<UnitState> {
    use super::ServiceManager;
    let mut scm = match super::scm::Scm::open() {
        Ok(s) => s,
        Err(e) => {
            warn(&e.to_string());
            return Vec::new();
        }
    };
    units
        .iter()
        .filter(|u| !u.is_empty())
        .filter_map(|u| match scm.query(super::service_name(u)) {
            Ok(r) => Some(unit_state(u, &r)),
            Err(e) => {
                warn(&e.to_string());
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(state: ServiceState, win32: u32, own: u32) -> ServiceReport {
        ServiceReport {
            state,
            win32_exit_code: win32,
            service_exit_code: own,
        }
    }

    #[test]
    fn scm_states_read_as_unit_states() {
        let u = unit_state("kubelet.service", &report(ServiceState::Running, 0, 0));
        assert!(u.is_healthy() && !u.has_died(3), "{u:?}");
        let u = unit_state("kubelet.service", &report(ServiceState::StartPending, 0, 0));
        assert_eq!(u.active_state, "activating");
        // kiln-firstboot's own service reports its run's exit code as service-specific.
        let u = unit_state(
            "kubelet.service",
            &report(ServiceState::Stopped, ERROR_SERVICE_SPECIFIC_ERROR, 3),
        );
        assert!(u.has_died(3));
        assert_eq!(
            u.describe(),
            "kubelet.service is failed (result=exit-code, status=3)"
        );
        // A process that ended without telling the SCM.
        let u = unit_state("kubelet.service", &report(ServiceState::Stopped, 1067, 0));
        assert_eq!(u.exec_main_status, Some(1067));
        assert_eq!(u.active_state, "failed");
        // Stopped cleanly: inactive, which the wait loop gives a grace period.
        let u = unit_state("containerd.service", &report(ServiceState::Stopped, 0, 0));
        assert_eq!(u.active_state, "inactive");
        assert_eq!(u.restarts, None);
    }
}
