//! Thin entry point: parse the command line, run, print the error chain, map it to an exit code.

use std::process::ExitCode;

fn main() -> ExitCode {
    kiln::cli::main()
}
