//! Thin entry point: parse the command line, dispatch to the library, map to an exit code.
// Output goes through `kiln_firstboot::redact`'s sinks only (see lib.rs).
#![warn(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

use kiln_firstboot::cli::{self, Command};
use kiln_firstboot::redact::{self, Redactor};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    #[cfg(windows)]
    if let Some(code) = kiln_firstboot::windows::entry::main(&args) {
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
            opts.journalctl = Some(journalctl.into());
            opts.systemctl = Some(systemctl.into());
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
