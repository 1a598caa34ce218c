//! Thin entry point: all logic lives in the library so tests and benchmarks can call it.

fn main() -> std::process::ExitCode {
    println!("kiln-firstboot {}", env!("CARGO_PKG_VERSION"));
    std::process::ExitCode::SUCCESS
}
