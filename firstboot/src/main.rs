//! Thin entry point: parse the command line, dispatch to the library, map to an exit code.
// Output goes through `kiln_firstboot::redact`'s sinks only (see lib.rs).
#![warn(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use kiln_firstboot::cli::{self, Command};
use kiln_firstboot::redact::{self, Redactor};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    #[cfg(windows)]
    if let Some(code) = kiln_firstboot::windows_main::main(&args) {
        return ExitCode::from(code);
    }
    let code = match cli::parse(&args) {
        Ok(Command::Run(opts)) => kiln_firstboot::run::run(&opts),
        Ok(Command::Help) => {
            redact::print(&Redactor::shapes_only().redact(cli::USAGE));
            0
        }
        Ok(Command::Version) => {
            let v = concat!("kiln-firstboot ", env!("CARGO_PKG_VERSION"), "\n");
            redact::print(&Redactor::shapes_only().redact(v));
            0
        }
        Ok(Command::Doctor {
            root,
            metadata_url,
            json,
        }) => {
            let mut opts = kiln_firstboot::doctor::Options::new(root);
            opts.metadata_url = metadata_url;
            kiln_firstboot::doctor::cmd_doctor(&opts, json)
        }
        Ok(Command::Status { root, json }) => kiln_firstboot::report::cmd_status(&root, json),
        Ok(Command::Report {
            root,
            journalctl,
            systemctl,
            console,
            healthz_url,
            quiet,
        }) => {
            let mut opts = kiln_firstboot::diagnose::ReportOptions::new(&root);
            if !cfg!(windows) {
                opts.journalctl = Some(journalctl.into());
                opts.systemctl = Some(systemctl.into());
            }
            opts.console = console;
            opts.healthz_url = healthz_url;
            // Set by systemd for ExecStopPost= commands (systemd.exec(5)).
            opts.service_result = std::env::var("SERVICE_RESULT").ok();
            opts.exit_code = std::env::var("EXIT_CODE").ok();
            opts.exit_status = std::env::var("EXIT_STATUS").ok();
            opts.quiet = quiet;
            kiln_firstboot::report::cmd_report(&opts)
        }
        Err(e) => {
            redact::eprint(&Redactor::shapes_only().redact(&format!(
                "kiln-firstboot: {e}\nkiln-firstboot: run `kiln-firstboot --help`"
            )));
            kiln_firstboot::Reason::Usage.exit_code()
        }
    };
    ExitCode::from(code)
}

/// musl's `pthread_setname_np`, minus the printf engine.
///
/// musl writes the name of a thread other than the caller through
/// `/proc/self/task/%d/comm`, formatted with `snprintf`, and that one call links musl's whole
/// `printf` (`printf_core`, `fmt_fp`: about 16 KB of the static binary, 4% of its 400 KiB
/// budget). std calls `pthread_setname_np` only from inside a thread it spawned, naming
/// itself (`std::thread` sets a spawned thread's name from that thread), and kiln-firstboot
/// names none. So this definition, which the static link takes instead of musl's archive
/// member, keeps musl's behaviour for the calling thread (`prctl(PR_SET_NAME)`, `ERANGE` over
/// 15 bytes, as musl's `src/thread/pthread_setname_np.c`) and returns `ENOSYS` for another
/// thread instead of writing to /proc.
#[cfg(all(target_os = "linux", target_env = "musl"))]
mod musl_setname {
    use std::ffi::{c_char, c_int, c_ulong, CStr};

    extern "C" {
        fn prctl(option: c_int, arg2: c_ulong, ...) -> c_int;
        fn pthread_self() -> c_ulong;
    }

    const PR_SET_NAME: c_int = 15;
    const ERANGE: c_int = 34;
    const ENOSYS: c_int = 38;

    #[no_mangle]
    extern "C" fn pthread_setname_np(thread: c_ulong, name: *const c_char) -> c_int {
        // SAFETY: callers pass a NUL-terminated string, as the C API requires.
        let len = unsafe { CStr::from_ptr(name) }.to_bytes().len();
        if len > 15 {
            return ERANGE;
        }
        // SAFETY: pthread_self has no preconditions; prctl(PR_SET_NAME) reads at most 16
        // bytes from a NUL-terminated string.
        unsafe {
            if thread != pthread_self() {
                return ENOSYS;
            }
            if prctl(PR_SET_NAME, name as c_ulong) != 0 {
                return std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(ENOSYS);
            }
        }
        0
    }
}
