//! A stand-in for crictl in kiln's fixture mirror: Debian 12 has no cri-tools package and
//! upstream releases cannot be downloaded on the test machines. It is **not** crictl: it speaks
//! no CRI. It answers `--version`, and for every other command checks what crictl checks first,
//! that the runtime endpoint's socket accepts a connection, then says plainly what it is.
//! See README.md.

use std::process::ExitCode;

/// crictl's default endpoint when neither a flag, the environment nor `/etc/crictl.yaml`
/// names one (containerd's socket).
const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";

/// The version printed by `--version`, overridable at build time (`STANDIN_CRICTL_VERSION`).
const VERSION: &str = match option_env!("STANDIN_CRICTL_VERSION") {
    Some(v) => v,
    None => "v1.34.0-standin",
};

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Cmd {
    Version,
    Help,
    /// A runtime command (`ps`, `info`, `version`, …) and the endpoint flag, if any.
    Runtime {
        command: String,
        endpoint: Option<String>,
        config: Option<String>,
    },
}

/// Parses crictl's global flags that matter here; the rest is the command and its arguments.
fn parse(args: &[String]) -> Cmd {
    let mut endpoint = None;
    let mut config = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) => (f, Some(v.to_string())),
            None => (a.as_str(), None),
        };
        match flag {
            "--version" | "-v" => return Cmd::Version,
            "--help" | "-h" | "help" => return Cmd::Help,
            "--runtime-endpoint" | "-r" => endpoint = inline.or_else(|| it.next().cloned()),
            "--config" | "-c" => config = inline.or_else(|| it.next().cloned()),
            "--image-endpoint" | "-i" | "--timeout" | "-t" => {
                if inline.is_none() {
                    it.next();
                }
            }
            f if f.starts_with('-') => {}
            command => {
                return Cmd::Runtime {
                    command: command.to_string(),
                    endpoint,
                    config,
                }
            }
        }
    }
    Cmd::Help
}

/// The `runtime-endpoint:` value of a crictl config file (a flat YAML map).
fn config_endpoint(text: &str) -> Option<String> {
    text.lines().find_map(|l| {
        let v = l.trim().strip_prefix("runtime-endpoint:")?.trim();
        let v = v.trim_matches(|c| c == '"' || c == '\'');
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// The endpoint in crictl's order: flag, `CONTAINER_RUNTIME_ENDPOINT`, config file, default.
fn endpoint(flag: Option<String>, config: Option<String>) -> String {
    if let Some(e) = flag {
        return e;
    }
    if let Some(e) = std::env::var("CONTAINER_RUNTIME_ENDPOINT")
        .ok()
        .filter(|v| !v.is_empty())
    {
        return e;
    }
    let path = config
        .or_else(|| std::env::var("CRI_CONFIG_FILE").ok())
        .unwrap_or_else(|| "/etc/crictl.yaml".into());
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| config_endpoint(&t))
        .unwrap_or_else(|| DEFAULT_ENDPOINT.into())
}

/// Connects to the endpoint's socket, returning crictl's own error wording on failure.
fn reach(endpoint: &str) -> Result<(), String> {
    let Some(path) = endpoint.strip_prefix("unix://") else {
        return Err(format!(
            "validate service connection: unsupported runtime endpoint {endpoint:?} (this stand-in only dials unix sockets)"
        ));
    };
    #[cfg(unix)]
    let res = std::os::unix::net::UnixStream::connect(path).map(drop);
    #[cfg(not(unix))]
    let res: std::io::Result<()> = Err(std::io::Error::other("unix sockets unsupported"));
    res.map_err(|e| {
        let what = if e.kind() == std::io::ErrorKind::NotFound {
            "no such file or directory".to_string()
        } else {
            e.to_string()
        };
        format!(
            "validate service connection: validate CRI v1 runtime API for endpoint \"{endpoint}\": rpc error: code = Unavailable desc = connection error: desc = \"transport: Error while dialing: dial unix {path}: connect: {what}\""
        )
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match parse(&args) {
        Cmd::Version => {
            println!("crictl version {VERSION}");
            ExitCode::SUCCESS
        }
        Cmd::Help => {
            println!(
                "crictl {VERSION}: kiln's stand-in for crictl (tools/standin-kubelet), not upstream cri-tools.\n\
                 It answers --version and checks that the runtime endpoint accepts a connection;\n\
                 it speaks no CRI."
            );
            ExitCode::SUCCESS
        }
        Cmd::Runtime {
            command,
            endpoint: flag,
            config,
        } => {
            let ep = endpoint(flag, config);
            match reach(&ep) {
                Ok(()) => {
                    println!(
                        "crictl stand-in: {ep} accepts connections; `{command}` needs the real crictl (this stand-in speaks no CRI)"
                    );
                    ExitCode::SUCCESS
                }
                Err(msg) => {
                    // crictl logs fatal errors through logrus in this shape.
                    eprintln!("time=\"-\" level=fatal msg={msg:?}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_flags_then_command() {
        assert_eq!(parse(&s(&["--version"])), Cmd::Version);
        assert_eq!(parse(&s(&[])), Cmd::Help);
        assert_eq!(
            parse(&s(&["-r", "unix:///x.sock", "ps", "-a"])),
            Cmd::Runtime {
                command: "ps".into(),
                endpoint: Some("unix:///x.sock".into()),
                config: None
            }
        );
        assert_eq!(
            parse(&s(&[
                "--runtime-endpoint=unix:///y",
                "--timeout",
                "2s",
                "info"
            ])),
            Cmd::Runtime {
                command: "info".into(),
                endpoint: Some("unix:///y".into()),
                config: None
            }
        );
    }

    #[test]
    fn reads_the_endpoint_from_a_config_file() {
        for (text, want) in [
            (
                "runtime-endpoint: unix:///run/k3s.sock\ntimeout: 2\n",
                Some("unix:///run/k3s.sock"),
            ),
            (
                "  runtime-endpoint: \"unix:///q.sock\"\n",
                Some("unix:///q.sock"),
            ),
            ("image-endpoint: unix:///i\n", None),
        ] {
            assert_eq!(config_endpoint(text).as_deref(), want, "{text}");
        }
    }

    #[cfg(unix)]
    #[test]
    fn reaches_a_listening_socket_and_names_a_missing_one() {
        let d = std::env::temp_dir().join(format!("crictl-standin-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let sock = d.join("cri.sock");
        let _ = std::fs::remove_file(&sock);
        let ep = format!("unix://{}", sock.display());
        let err = reach(&ep).unwrap_err();
        assert!(err.contains("no such file or directory"), "{err}");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(reach(&ep), Ok(()));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
