//! The Windows-only subcommands (`install`, `uninstall`, `service`), dispatched by `main.rs`
//! before the common argument parser sees the command line. The entry sits at the top beside
//! `run`, which `service` calls; `windows/` below it holds the helpers.

use crate::redact::{self, Redactor};
use crate::windows::{containerd_environment, install, node_services};
use crate::windows::{parse_install_args, task, uninstall};
use crate::windows_kubelet::open_scm;
use crate::Reason;

/// The Windows-only subcommands, before the common parser sees the arguments:
/// `install`, `uninstall` and `service` (how the SCM starts kiln-firstboot). `None`: not one
/// of them.
pub fn main(args: &[String]) -> Option<u8> {
    let (sub, rest) = args.split_first()?;
    // These commands read no credential: the token shape is all there is to redact.
    let r = Redactor::shapes_only();
    let fail = |msg: String, code: u8| {
        redact::eprint(&r.redact(&format!("kiln-firstboot {sub}: {msg}")));
        code
    };
    match sub.as_str() {
        "install" | "uninstall" => {
            let o = match parse_install_args(rest) {
                Ok(o) => o,
                Err(e) => return Some(fail(e, Reason::Usage.exit_code())),
            };
            let mut scm = match open_scm() {
                Ok(s) => s,
                Err(e) => return Some(fail(e.to_string(), 1)),
            };
            let mut specs = node_services(&o.bin_dir, &o.root);
            if sub == "install" {
                match containerd_environment(&o.bin_dir) {
                    Ok(env) => {
                        if let Some(c) = specs.iter_mut().find(|s| s.name == "containerd") {
                            c.environment = env;
                        }
                    }
                    Err(e) => return Some(fail(e, 1)),
                }
                // The Application log source kiln-firstboot reports its status under.
                #[cfg(windows)]
                if let Err(e) = crate::windows::eventlog::register_source() {
                    return Some(fail(e, 1));
                }
                let done = match install(scm.as_mut(), &specs) {
                    Ok(done) => done,
                    Err(e) => return Some(fail(e.to_string(), 1)),
                };
                for (name, how) in done {
                    redact::print(&r.redact(&format!("kiln-firstboot install: {name} {how:?}\n")));
                }
                // The post-boot check (`report`), from the definition the layer carries.
                match task::register(task::TASK_NAME, &task::definition(&o.bin_dir)) {
                    Ok(()) => {
                        redact::print(&r.redact("kiln-firstboot install: kiln-report task\n"));
                        Some(0)
                    }
                    Err(e) => Some(fail(e, 1)),
                }
            } else {
                let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
                #[cfg(windows)]
                if let Err(e) = crate::windows::eventlog::unregister_source() {
                    return Some(fail(e, 1));
                }
                if let Err(e) = task::unregister(task::TASK_NAME) {
                    // Already gone (an earlier uninstall) is not worth stopping for.
                    redact::eprint(&r.redact(&format!("kiln-firstboot uninstall: warning: {e}")));
                }
                match uninstall(scm.as_mut(), &names) {
                    Ok(removed) => {
                        redact::print(&r.redact(&format!(
                            "kiln-firstboot uninstall: removed {}\n",
                            removed.join(", ")
                        )));
                        Some(0)
                    }
                    Err(e) => Some(fail(e.to_string(), 1)),
                }
            }
        }
        #[cfg(windows)]
        "service" => {
            let opts = match crate::cli::parse(rest) {
                Ok(crate::cli::Command::Run(o)) => o,
                Ok(_) => return Some(fail("takes the options of `run` only".into(), 2)),
                Err(e) => return Some(fail(e.to_string(), Reason::Usage.exit_code())),
            };
            match crate::windows::dispatch::run_as_service(|| crate::run::run(&opts)) {
                Ok(code) => Some(code),
                Err(e) => Some(fail(
                    format!("{e}; `service` is how the Service Control Manager starts kiln-firstboot, use `run` from a console"),
                    1,
                )),
            }
        }
        _ => None,
    }
}
