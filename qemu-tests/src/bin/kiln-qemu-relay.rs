//! Thin entry point of the guestfwd relay: `kiln-qemu-relay HOST PORT`.

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match kiln_qemu_tests::relay::run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("kiln-qemu-relay: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}
