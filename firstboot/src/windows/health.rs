//! Diagnosis on Windows: what the Service Control Manager says of kubelet and containerd.
//! `diagnose` reads each [`ServiceReport`](super::ServiceReport) as the unit state `systemctl show` gives on Linux
//! (`UnitState::from_service`), so the same rules and reason codes apply. No Linux tool is
//! called.

#[cfg(windows)]
use super::ServiceReport;

/// The SCM's report on each of `units` (their `.service` suffix dropped for the SCM name),
/// paired with the unit name; a service the SCM cannot answer for is left out with a warning
/// (as a `systemctl show` that fails is on Linux).
#[cfg(windows)]
pub fn query(units: &[&str], warn: &dyn Fn(&str)) -> Vec<(String, ServiceReport)> {
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
            Ok(r) => Some((u.to_string(), r)),
            Err(e) => {
                warn(&e.to_string());
                None
            }
        })
        .collect()
}
