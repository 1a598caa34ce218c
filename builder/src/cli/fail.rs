//! How a failed command ends: its error and every cause printed, and the exit code of the
//! first cause that knows its class (each library error's `exit_class()`).

use std::error::Error as StdError;
use std::process::ExitCode;

use crate::bake::BakeError;
use crate::exit::ExitClass;
use crate::render::RenderError;
use crate::supply::advisory::AdvisoryError;
use crate::supply::fetch::FetchError;
use crate::supply::inspect::InspectError;
use crate::supply::lock::LockError;
use crate::supply::lock_edit::LockEditError;
use crate::supply::mirror::MirrorError;
use crate::supply::outdated::index::IndexError;
use crate::supply::registry::RegistryError;
use crate::supply::sign::SignError;
use crate::supply::store::StoreError;

/// Prints an error chain and picks the exit code for it.
pub fn fail(err: &anyhow::Error) -> ExitCode {
    ended(err, classify(err))
}

/// Ends a command on `err` with `exit`: the chain on stderr, and with `--json` the final
/// `error` event (`cli::json::error`).
pub fn ended(err: &anyhow::Error, exit: u8) -> ExitCode {
    // Whatever read stdout is gone (`kiln render … | head -1`, where the payload is written
    // with `write_all`): end quietly as the panic path in `cli::main` does for `println!`.
    if stdout_gone()
        && err.chain().any(|c| {
            c.downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
        })
    {
        crate::cli::json::ended_quietly();
        return ExitCode::from(BROKEN_PIPE);
    }
    print_chain(err);
    crate::cli::json::error(err, exit);
    ExitCode::from(exit)
}

/// The exit status when whatever read stdout closed it first: 128 + SIGPIPE, what a shell
/// shows for a tool SIGPIPE ended (docs/cli.md, exit codes).
pub const BROKEN_PIPE: u8 = 141;

/// Whether stdout is a pipe whose reader has gone: Linux reports `POLLERR` on a pipe's write
/// end once no reader is left. A broken pipe elsewhere (gpg, debugfs) is an error as any other.
fn stdout_gone() -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let out = std::io::stdout();
    let mut fds = [PollFd::new(&out, PollFlags::empty())];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&now)).is_ok() && fds[0].revents().contains(PollFlags::ERR)
}

/// Prints `kiln: error: …` and one `caused by:` line per cause that adds something: a
/// cause whose text the line above already holds (an error that formats its source into its
/// own message) is not repeated.
pub fn print_chain(err: &anyhow::Error) {
    eprint!("{}", chain_text(err));
}

/// The text [`print_chain`] prints.
pub fn chain_text(err: &anyhow::Error) -> String {
    let mut above = err.to_string();
    let mut out = format!("kiln: error: {above}\n");
    for cause in err.chain().skip(1) {
        let text = cause.to_string();
        if above.contains(&text) {
            continue;
        }
        out.push_str(&format!("  caused by: {text}\n"));
        above = text;
    }
    out
}

/// The exit code of an error: the class of the outermost cause that is a kiln error
/// (verification failures exit 3, sources that could not deliver 4), else 1.
pub fn classify(err: &anyhow::Error) -> u8 {
    err.chain()
        .find_map(class_of)
        .unwrap_or(ExitClass::Failure)
        .code()
}

fn class_of(cause: &(dyn StdError + 'static)) -> Option<ExitClass> {
    macro_rules! first_of {
        ($($t:ty),* $(,)?) => {
            $(
                if let Some(e) = cause.downcast_ref::<$t>() {
                    return Some(e.exit_class());
                }
            )*
        };
    }
    first_of!(
        BakeError,
        crate::bake::compare::Mismatch,
        SignError,
        LockError,
        LockEditError,
        StoreError,
        FetchError,
        RegistryError,
        MirrorError,
        IndexError,
        InspectError,
        AdvisoryError,
        RenderError,
        crate::supply::layer_trust::Untrusted,
    );
    None
}
