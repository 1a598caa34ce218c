//! kiln-firstboot as a Windows service: the dispatcher connection (`kiln-firstboot service`),
//! the status reports to the SCM, and the stop control.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use super::scm::{
    last_error, wide, Handle, ServiceStatus, SERVICE_CONTROL_STOP, SERVICE_RUNNING,
    SERVICE_STOPPED, SERVICE_WIN32_OWN_PROCESS,
};
use super::{ServiceError, ERROR_SERVICE_SPECIFIC_ERROR};

const SERVICE_CONTROL_INTERROGATE: u32 = 4;
const SERVICE_ACCEPT_STOP: u32 = 1;

#[repr(C)]
struct TableEntry {
    name: *mut u16,
    proc_: Option<unsafe extern "system" fn(u32, *mut *mut u16)>,
}

#[link(name = "advapi32")]
extern "system" {
    fn StartServiceCtrlDispatcherW(table: *const TableEntry) -> i32;
    fn RegisterServiceCtrlHandlerExW(
        name: *const u16,
        handler: unsafe extern "system" fn(u32, u32, *mut c_void, *mut c_void) -> u32,
        context: *mut c_void,
    ) -> Handle;
    fn SetServiceStatus(handle: Handle, status: *mut ServiceStatus) -> i32;
}

// The service entry point is a bare `extern "system"` function, so the body and its results
// travel through statics: set once before the dispatcher starts, read on its thread.
static BODY: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static STATUS_HANDLE: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
static EXIT: AtomicU32 = AtomicU32::new(0);

fn report(state: u32, exit: u8) {
    let h = STATUS_HANDLE.load(Ordering::SeqCst);
    if h.is_null() {
        return;
    }
    let mut st = ServiceStatus {
        service_type: SERVICE_WIN32_OWN_PROCESS,
        current_state: state,
        controls_accepted: if state == SERVICE_RUNNING {
            SERVICE_ACCEPT_STOP
        } else {
            0
        },
        win32_exit_code: if exit == 0 {
            0
        } else {
            ERROR_SERVICE_SPECIFIC_ERROR
        },
        service_specific_exit_code: exit as u32,
        check_point: 0,
        wait_hint: 0,
    };
    // SAFETY: h came from RegisterServiceCtrlHandlerExW; st is valid for the call.
    unsafe { SetServiceStatus(h, &mut st) };
}

unsafe extern "system" fn control(code: u32, _: u32, _: *mut c_void, _: *mut c_void) -> u32 {
    if code == SERVICE_CONTROL_STOP {
        // firstboot is a short run with its own deadline: a stop request ends the process
        // with the "internal" exit code rather than leaving a half-done boot running.
        report(SERVICE_STOPPED, 1);
        std::process::exit(1);
    }
    if code == SERVICE_CONTROL_INTERROGATE {
        return 0;
    }
    120 // ERROR_CALL_NOT_IMPLEMENTED
}

unsafe extern "system" fn service_main(_argc: u32, _argv: *mut *mut u16) {
    let name = wide(SERVICE_NAME);
    // SAFETY: name is NUL-terminated; control is a valid handler for the process lifetime.
    let h = unsafe { RegisterServiceCtrlHandlerExW(name.as_ptr(), control, null_mut()) };
    STATUS_HANDLE.store(h, Ordering::SeqCst);
    report(SERVICE_RUNNING, 0);
    let body = BODY.load(Ordering::SeqCst);
    let code = if body.is_null() {
        1
    } else {
        // SAFETY: BODY holds a `&mut dyn FnMut() -> u8` set by run_as_service, which is
        // blocked in the dispatcher while this runs.
        let f = unsafe { &mut *(body as *mut &mut dyn FnMut() -> u8) };
        f()
    };
    EXIT.store(code as u32, Ordering::SeqCst);
    report(SERVICE_STOPPED, code);
}

/// The name kiln-firstboot's own service is registered under.
pub const SERVICE_NAME: &str = "kiln-firstboot";

/// Runs `body` as the `kiln-firstboot` service: connects to the SCM, reports "running",
/// runs the boot, reports "stopped" with its exit code. Returns that exit code, or an error
/// when the process was not started by the SCM.
pub fn run_as_service(mut body: impl FnMut() -> u8) -> Result<u8, ServiceError> {
    let mut dyn_body: &mut dyn FnMut() -> u8 = &mut body;
    BODY.store(
        (&mut dyn_body as *mut &mut dyn FnMut() -> u8).cast(),
        Ordering::SeqCst,
    );
    let mut name = wide(SERVICE_NAME);
    let table = [
        TableEntry {
            name: name.as_mut_ptr(),
            proc_: Some(service_main),
        },
        TableEntry {
            name: null_mut(),
            proc_: None,
        },
    ];
    // SAFETY: the table is NUL-terminated and lives until the dispatcher returns, which is
    // after service_main (and so every use of BODY) has finished.
    let ok = unsafe { StartServiceCtrlDispatcherW(table.as_ptr()) };
    BODY.store(null_mut(), Ordering::SeqCst);
    if ok == 0 {
        return Err(last_error("StartServiceCtrlDispatcherW", SERVICE_NAME));
    }
    Ok(EXIT.load(Ordering::SeqCst) as u8)
}
