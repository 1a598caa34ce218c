//! Thin entry point: parse the command line, dispatch to the library, map to an exit code.

use std::process::ExitCode;

use kiln_firstboot::cli::{self, Command};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match cli::parse(&args) {
        Ok(Command::Run(opts)) => kiln_firstboot::run::run(&opts),
        Ok(Command::Help) => {
            print!("{}", cli::USAGE);
            0
        }
        Ok(Command::Version) => {
            println!("kiln-firstboot {}", env!("CARGO_PKG_VERSION"));
            0
        }
        Ok(Command::Status { .. }) | Ok(Command::Report { .. }) => {
            // Filled in by the reporting work (issue #4): status::cmd_status, diagnose::cmd_report.
            eprintln!("kiln-firstboot: this subcommand is not available in this build yet");
            1
        }
        Err(e) => {
            eprintln!("kiln-firstboot: {e}\nkiln-firstboot: run `kiln-firstboot --help`");
            kiln_firstboot::Reason::Usage.exit_code()
        }
    };
    ExitCode::from(code)
}
