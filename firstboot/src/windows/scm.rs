//! The Windows Service Control Manager through advapi32, std only: [`Scm`] implements
//! [`ServiceManager`], and [`run_as_service`] lets kiln-firstboot itself run as a service.
//!
//! Direct calls rather than `sc.exe`: each failure comes back as the Windows error code
//! (1056 "already running" is success for firstboot, 1060 means "run install"), no
//! localized text is parsed, the command line is passed as one exact string instead of
//! going through sc.exe's own `binPath= …` quoting, and nothing is spawned at boot.

use std::ffi::c_void;
use std::ptr::{null, null_mut};

use super::firmware::{
    RegCloseKey, RegDeleteValueW, RegOpenKeyExW, RegSetValueExW, ERROR_FILE_NOT_FOUND,
    HKEY_LOCAL_MACHINE, KEY_SET_VALUE,
};
use super::{ServiceError, ServiceManager, ServiceReport, ServiceSpec, ServiceState, StartType};

pub(super) type Handle = *mut c_void;

const SC_MANAGER_ALL_ACCESS: u32 = 0xF003F;
const SERVICE_ALL_ACCESS: u32 = 0xF01FF;
pub(super) const SERVICE_WIN32_OWN_PROCESS: u32 = 0x10;
const SERVICE_AUTO_START: u32 = 2;
const SERVICE_DEMAND_START: u32 = 3;
const SERVICE_ERROR_NORMAL: u32 = 1;
const SERVICE_NO_CHANGE: u32 = 0xFFFF_FFFF;
const SERVICE_CONFIG_DESCRIPTION: u32 = 1;
const SERVICE_CONFIG_FAILURE_ACTIONS: u32 = 2;
/// `SERVICE_CONFIG_FAILURE_ACTIONS_FLAG` (winsvc.h): whether the failure actions also run when
/// the service stops itself with an error, not only when its process dies.
const SERVICE_CONFIG_FAILURE_ACTIONS_FLAG: u32 = 4;
/// `ERROR_INVALID_LEVEL`: the service manager does not know that information level.
const ERROR_INVALID_LEVEL: u32 = 124;
const REG_DWORD: u32 = 4;
const SC_ACTION_NONE: u32 = 0;
const SC_ACTION_RESTART: u32 = 1;
pub(super) const SERVICE_CONTROL_STOP: u32 = 1;
pub(super) const SERVICE_STOPPED: u32 = 1;
const SERVICE_START_PENDING: u32 = 2;
pub(super) const SERVICE_RUNNING: u32 = 4;
const ERROR_SERVICE_DOES_NOT_EXIST: u32 = 1060;
/// One day: the failure count (which picks the restart delay) resets after a quiet day.
const RESET_PERIOD_SECS: u32 = 86_400;

/// `SERVICE_STATUS`.
#[repr(C)]
#[derive(Default)]
pub(super) struct ServiceStatus {
    pub(super) service_type: u32,
    pub(super) current_state: u32,
    pub(super) controls_accepted: u32,
    pub(super) win32_exit_code: u32,
    pub(super) service_specific_exit_code: u32,
    pub(super) check_point: u32,
    pub(super) wait_hint: u32,
}

#[repr(C)]
struct ScAction {
    kind: u32,
    delay_ms: u32,
}

#[repr(C)]
struct FailureActions {
    reset_period: u32,
    reboot_msg: *mut u16,
    command: *mut u16,
    count: u32,
    actions: *mut ScAction,
}

#[repr(C)]
struct Description {
    text: *mut u16,
}

#[link(name = "advapi32")]
extern "system" {
    fn OpenSCManagerW(machine: *const u16, database: *const u16, access: u32) -> Handle;
    fn OpenServiceW(scm: Handle, name: *const u16, access: u32) -> Handle;
    fn CreateServiceW(
        scm: Handle,
        name: *const u16,
        display: *const u16,
        access: u32,
        service_type: u32,
        start_type: u32,
        error_control: u32,
        binary_path: *const u16,
        load_order_group: *const u16,
        tag_id: *mut u32,
        dependencies: *const u16,
        start_name: *const u16,
        password: *const u16,
    ) -> Handle;
    fn ChangeServiceConfigW(
        service: Handle,
        service_type: u32,
        start_type: u32,
        error_control: u32,
        binary_path: *const u16,
        load_order_group: *const u16,
        tag_id: *mut u32,
        dependencies: *const u16,
        start_name: *const u16,
        password: *const u16,
        display: *const u16,
    ) -> i32;
    fn ChangeServiceConfig2W(service: Handle, level: u32, info: *mut c_void) -> i32;
    fn StartServiceW(service: Handle, argc: u32, argv: *const *const u16) -> i32;
    fn ControlService(service: Handle, control: u32, status: *mut ServiceStatus) -> i32;
    fn QueryServiceStatus(service: Handle, status: *mut ServiceStatus) -> i32;
    fn DeleteService(service: Handle) -> i32;
    fn CloseServiceHandle(handle: Handle) -> i32;
}

const REG_MULTI_SZ: u32 = 7;

#[link(name = "kernel32")]
extern "system" {
    fn GetLastError() -> u32;
}

pub(super) fn wide(s: &str) -> Vec<u16> {
    s.encode_utf16().chain(Some(0)).collect()
}

/// A double-NUL-terminated list, as `lpDependencies` wants it.
fn wide_list(items: &[String]) -> Vec<u16> {
    let mut v: Vec<u16> = Vec::new();
    for i in items {
        v.extend(i.encode_utf16());
        v.push(0);
    }
    v.push(0);
    v
}

pub(super) fn last_error(call: &'static str, service: &str) -> ServiceError {
    // SAFETY: GetLastError has no preconditions.
    let code = unsafe { GetLastError() };
    ServiceError {
        call,
        service: service.to_string(),
        code,
    }
}

/// An open service handle, closed on drop.
struct Service(Handle);

impl Drop for Service {
    fn drop(&mut self) {
        // SAFETY: the handle came from OpenServiceW/CreateServiceW and is closed once.
        unsafe { CloseServiceHandle(self.0) };
    }
}

/// The local Service Control Manager, opened with full access (needs Administrator).
#[derive(Debug)]
pub struct Scm(Handle);

impl Drop for Scm {
    fn drop(&mut self) {
        // SAFETY: opened by OpenSCManagerW, closed once.
        unsafe { CloseServiceHandle(self.0) };
    }
}

impl Scm {
    /// Connects to the local SCM.
    pub fn open() -> Result<Scm, ServiceError> {
        // SAFETY: null machine and database mean "local, active database".
        let h = unsafe { OpenSCManagerW(null(), null(), SC_MANAGER_ALL_ACCESS) };
        if h.is_null() {
            return Err(last_error("OpenSCManagerW", "(service manager)"));
        }
        Ok(Scm(h))
    }

    fn service(&self, name: &str, call: &'static str) -> Result<Service, ServiceError> {
        let n = wide(name);
        // SAFETY: self.0 is an open SCM handle and n is NUL-terminated.
        let h = unsafe { OpenServiceW(self.0, n.as_ptr(), SERVICE_ALL_ACCESS) };
        if h.is_null() {
            return Err(last_error(call, name));
        }
        Ok(Service(h))
    }

    /// The service's own environment: the SCM passes the `Environment` value (REG_MULTI_SZ)
    /// of the service's registry key to the process. No API sets it, so the key is written.
    fn set_environment(&self, spec: &ServiceSpec) -> Result<(), ServiceError> {
        let data: Option<Vec<u8>> = (!spec.environment.is_empty()).then(|| {
            wide_list(&spec.environment)
                .iter()
                .flat_map(|c| c.to_le_bytes())
                .collect()
        });
        self.set_service_value(&spec.name, "Environment", REG_MULTI_SZ, data.as_deref())
    }

    /// Sets (or, with `None`, deletes) value `value` of the service's registry key
    /// `HKLM\SYSTEM\CurrentControlSet\Services\<name>`; a missing value is not an error to
    /// delete.
    fn set_service_value(
        &self,
        name: &str,
        value: &'static str,
        kind: u32,
        data: Option<&[u8]>,
    ) -> Result<(), ServiceError> {
        let path = wide(&format!("SYSTEM\\CurrentControlSet\\Services\\{name}"));
        let value_w = wide(value);
        let mut key: Handle = null_mut();
        let fail = |call: &'static str, code: i32| ServiceError {
            call,
            service: name.to_string(),
            code: code as u32,
        };
        // SAFETY: path is NUL-terminated; key receives an open handle on success.
        let rc = unsafe {
            RegOpenKeyExW(
                HKEY_LOCAL_MACHINE,
                path.as_ptr(),
                0,
                KEY_SET_VALUE,
                &mut key,
            )
        };
        if rc != 0 {
            return Err(fail("RegOpenKeyExW(service key)", rc));
        }
        let rc = match data {
            // SAFETY: key is open; the name is NUL-terminated.
            None => match unsafe { RegDeleteValueW(key, value_w.as_ptr()) } {
                ERROR_FILE_NOT_FOUND => 0,
                rc => rc,
            },
            // SAFETY: key is open; `data` is the value's bytes in the layout `kind` wants
            // (REG_MULTI_SZ double-NUL-terminated UTF-16, REG_DWORD four bytes), its length
            // passed.
            Some(data) => unsafe {
                RegSetValueExW(
                    key,
                    value_w.as_ptr(),
                    0,
                    kind,
                    data.as_ptr(),
                    data.len() as u32,
                )
            },
        };
        // SAFETY: key was opened above and is closed once.
        unsafe { RegCloseKey(key) };
        if rc != 0 {
            return Err(fail("RegSetValueExW(service key)", rc));
        }
        Ok(())
    }

    /// Description and recovery settings, which only ChangeServiceConfig2W sets.
    fn configure_extras(&self, svc: &Service, spec: &ServiceSpec) -> Result<(), ServiceError> {
        let mut text = wide(&spec.description);
        let mut desc = Description {
            text: text.as_mut_ptr(),
        };
        // SAFETY: svc is open; desc points at a live NUL-terminated string.
        if unsafe {
            ChangeServiceConfig2W(
                svc.0,
                SERVICE_CONFIG_DESCRIPTION,
                (&mut desc as *mut Description).cast(),
            )
        } == 0
        {
            return Err(last_error("ChangeServiceConfig2W(description)", &spec.name));
        }
        let mut actions: Vec<ScAction> = spec
            .restart_after_ms
            .iter()
            .map(|&delay_ms| ScAction {
                kind: SC_ACTION_RESTART,
                delay_ms,
            })
            .collect();
        if actions.is_empty() {
            actions.push(ScAction {
                kind: SC_ACTION_NONE,
                delay_ms: 0,
            });
        }
        let mut fa = FailureActions {
            reset_period: RESET_PERIOD_SECS,
            reboot_msg: null_mut(),
            command: null_mut(),
            count: actions.len() as u32,
            actions: actions.as_mut_ptr(),
        };
        // SAFETY: svc is open; fa and its action array live across the call.
        if unsafe {
            ChangeServiceConfig2W(
                svc.0,
                SERVICE_CONFIG_FAILURE_ACTIONS,
                (&mut fa as *mut FailureActions).cast(),
            )
        } == 0
        {
            return Err(last_error(
                "ChangeServiceConfig2W(failure actions)",
                &spec.name,
            ));
        }
        // By default Windows runs the failure actions only when the process ends without
        // reporting SERVICE_STOPPED; a kubelet or containerd that stops itself with an error
        // (dwWin32ExitCode != 0) would stay down. fFailureActionsOnNonCrashFailures
        // (SERVICE_FAILURE_ACTIONS_FLAG, what `sc.exe failureflag <name> 1` sets) restarts
        // those too, as systemd's Restart=on-failure does on Linux.
        let mut on_error: i32 = i32::from(!spec.restart_after_ms.is_empty());
        // SAFETY: svc is open; on_error is the BOOL the structure holds, live across the call.
        if unsafe {
            ChangeServiceConfig2W(
                svc.0,
                SERVICE_CONFIG_FAILURE_ACTIONS_FLAG,
                (&mut on_error as *mut i32).cast(),
            )
        } == 0
        {
            let err = last_error("ChangeServiceConfig2W(failure actions flag)", &spec.name);
            if err.code != ERROR_INVALID_LEVEL {
                return Err(err);
            }
            // A service manager without this level (Wine 8 answers ERROR_INVALID_LEVEL;
            // Windows has it since Vista): the value Windows keeps it in, read by the SCM
            // when it loads its database at the node's boot.
            self.set_service_value(
                &spec.name,
                "FailureActionsOnNonCrashFailures",
                REG_DWORD,
                Some(&(on_error as u32).to_le_bytes()),
            )?;
        }
        self.set_environment(spec)
    }
}

fn start_type(s: StartType) -> u32 {
    match s {
        StartType::Auto => SERVICE_AUTO_START,
        StartType::Demand => SERVICE_DEMAND_START,
    }
}

impl ServiceManager for Scm {
    fn exists(&mut self, name: &str) -> Result<bool, ServiceError> {
        match self.service(name, "OpenServiceW") {
            Ok(_) => Ok(true),
            Err(e) if e.code == ERROR_SERVICE_DOES_NOT_EXIST => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn create(&mut self, spec: &ServiceSpec) -> Result<(), ServiceError> {
        let (name, display, cmd) = (
            wide(&spec.name),
            wide(&spec.display_name),
            wide(&spec.command),
        );
        let deps = wide_list(&spec.dependencies);
        // SAFETY: every string is NUL-terminated and outlives the call; null start name and
        // password mean LocalSystem.
        let h = unsafe {
            CreateServiceW(
                self.0,
                name.as_ptr(),
                display.as_ptr(),
                SERVICE_ALL_ACCESS,
                SERVICE_WIN32_OWN_PROCESS,
                start_type(spec.start),
                SERVICE_ERROR_NORMAL,
                cmd.as_ptr(),
                null(),
                null_mut(),
                deps.as_ptr(),
                null(),
                null(),
            )
        };
        if h.is_null() {
            return Err(last_error("CreateServiceW", &spec.name));
        }
        let svc = Service(h);
        self.configure_extras(&svc, spec)
    }

    fn update(&mut self, spec: &ServiceSpec) -> Result<(), ServiceError> {
        let svc = self.service(&spec.name, "OpenServiceW")?;
        let (display, cmd) = (wide(&spec.display_name), wide(&spec.command));
        let deps = wide_list(&spec.dependencies);
        // SAFETY: svc is open; strings are NUL-terminated and live across the call.
        let ok = unsafe {
            ChangeServiceConfigW(
                svc.0,
                SERVICE_WIN32_OWN_PROCESS,
                start_type(spec.start),
                SERVICE_ERROR_NORMAL,
                cmd.as_ptr(),
                null(),
                null_mut(),
                deps.as_ptr(),
                null(),
                null(),
                display.as_ptr(),
            )
        };
        if ok == 0 {
            return Err(last_error("ChangeServiceConfigW", &spec.name));
        }
        self.configure_extras(&svc, spec)
    }

    fn set_command(&mut self, name: &str, command: &str) -> Result<(), ServiceError> {
        let svc = self.service(name, "OpenServiceW")?;
        let cmd = wide(command);
        // SAFETY: svc is open; SERVICE_NO_CHANGE and nulls leave everything else as it is.
        let ok = unsafe {
            ChangeServiceConfigW(
                svc.0,
                SERVICE_NO_CHANGE,
                SERVICE_NO_CHANGE,
                SERVICE_NO_CHANGE,
                cmd.as_ptr(),
                null(),
                null_mut(),
                null(),
                null(),
                null(),
                null(),
            )
        };
        if ok == 0 {
            return Err(last_error("ChangeServiceConfigW(binary path)", name));
        }
        Ok(())
    }

    fn start(&mut self, name: &str) -> Result<(), ServiceError> {
        let svc = self.service(name, "OpenServiceW")?;
        // SAFETY: svc is open; no arguments.
        if unsafe { StartServiceW(svc.0, 0, null()) } == 0 {
            return Err(last_error("StartServiceW", name));
        }
        Ok(())
    }

    fn stop(&mut self, name: &str) -> Result<(), ServiceError> {
        let svc = self.service(name, "OpenServiceW")?;
        let mut st = ServiceStatus::default();
        // SAFETY: svc is open; st is a valid out-parameter.
        if unsafe { ControlService(svc.0, SERVICE_CONTROL_STOP, &mut st) } == 0 {
            return Err(last_error("ControlService(stop)", name));
        }
        Ok(())
    }

    fn state(&mut self, name: &str) -> Result<ServiceState, ServiceError> {
        Ok(self.query(name)?.state)
    }

    fn query(&mut self, name: &str) -> Result<ServiceReport, ServiceError> {
        let svc = self.service(name, "OpenServiceW")?;
        let mut st = ServiceStatus::default();
        // SAFETY: svc is open; st is a valid out-parameter.
        if unsafe { QueryServiceStatus(svc.0, &mut st) } == 0 {
            return Err(last_error("QueryServiceStatus", name));
        }
        Ok(ServiceReport {
            state: match st.current_state {
                SERVICE_STOPPED => ServiceState::Stopped,
                SERVICE_START_PENDING => ServiceState::StartPending,
                SERVICE_RUNNING => ServiceState::Running,
                other => ServiceState::Other(other),
            },
            win32_exit_code: st.win32_exit_code,
            service_exit_code: st.service_specific_exit_code,
        })
    }

    fn delete(&mut self, name: &str) -> Result<(), ServiceError> {
        let svc = self.service(name, "OpenServiceW")?;
        // SAFETY: svc is open.
        if unsafe { DeleteService(svc.0) } == 0 {
            return Err(last_error("DeleteService", name));
        }
        Ok(())
    }
}
