//! Boot tests for kiln: build a Debian guest from cached assets, put what kiln baked into it,
//! boot it under QEMU with a loopback metadata service, and read the outcome off the serial
//! console. See `docs/boot-tests.md` for what each scenario proves and how to run one.

pub mod accel;
pub mod after_join;
pub mod arch;
pub mod arm64;
pub mod assets;
pub mod bakecache;
pub mod bootdisk;
pub mod console;
pub mod disk;
pub mod guest;
pub mod ignition;
pub mod image_node;
pub mod kubeadm;
pub mod metadata;
pub mod node;
pub mod outcome;
pub mod pod;
pub mod registry;
pub mod relay;
pub mod scenario;
pub mod seed;
#[path = "../../testkit/serve.rs"]
pub mod serve;
pub mod signed_sysext;
pub mod sysupdate;
pub mod vm;

/// Everything the harness can fail with; each message names the file, command or deadline.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A command the harness runs (QEMU, mkfs.ext4, the asset script, kiln) failed.
    #[error("{command}: {detail}")]
    Command {
        /// The command line, shortened to its program and first arguments.
        command: String,
        /// What went wrong: the exit status and the tail of its output, or the spawn error.
        detail: String,
    },
    /// A file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Something the harness needs is not there (QEMU, an asset, a built binary).
    #[error("missing {what}: {hint}")]
    Missing {
        /// What is missing.
        what: String,
        /// How to get it.
        hint: String,
    },
    /// The guest did not print what the test waited for before the deadline.
    #[error("{what} not seen within {secs} s; last console lines:\n{tail}")]
    Timeout {
        /// What the test was waiting for.
        what: String,
        /// The deadline in seconds.
        secs: u64,
        /// The last 50 console lines.
        tail: String,
    },
    /// QEMU exited before the guest printed what the test waited for.
    #[error("QEMU exited ({status}) before {what}; last console lines:\n{tail}")]
    Exited {
        /// What the test was waiting for.
        what: String,
        /// QEMU's exit status.
        status: String,
        /// The last 50 console lines.
        tail: String,
    },
}

/// The harness's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Fails the calling test with the error's message (console tail included) rather than its
/// `Debug` form, which would print the tail as one escaped string.
pub fn expect_ok<T>(r: Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e}"))
}

impl From<std::io::Error> for Error {
    fn from(source: std::io::Error) -> Self {
        Error::Io {
            path: "(unnamed)".into(),
            source,
        }
    }
}

/// Wraps an I/O error with its path.
pub(crate) fn io_err(path: impl Into<std::path::PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |source| Error::Io { path, source }
}

/// Runs a command to completion; a non-zero exit becomes [`Error::Command`] with the tail
/// of its stderr.
pub(crate) fn run(cmd: &mut std::process::Command) -> Result<std::process::Output> {
    let name = format!("{cmd:?}");
    let name: String = name.chars().take(200).collect();
    let out = cmd.output().map_err(|e| Error::Command {
        command: name.clone(),
        detail: format!("could not start: {e}"),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(Error::Command {
            command: name,
            detail: format!("{}; stderr:\n{}", out.status, tail.join("\n")),
        });
    }
    Ok(out)
}
