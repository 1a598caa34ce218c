//! Hand-rolled argument parsing: `run` (the default), `status`, `report`, `--help`,
//! `--version`. Flags take `--flag VALUE` or `--flag=VALUE`.

use std::path::PathBuf;

use crate::contract::Provider;

/// `--root` as every command uses it: links in the prefix the operator named are resolved
/// once, here, so that below it `fsutil::real_dir` can refuse every link (one planted at
/// `ROOT/run/kiln` must not send writes out of the root). Left as given when it cannot be
/// resolved (the first read names a missing directory) and on Windows, whose resolved
/// paths take the `\\?\` form.
fn resolved_root(root: PathBuf) -> PathBuf {
    if cfg!(windows) {
        return root;
    }
    std::fs::canonicalize(&root).unwrap_or(root)
}

/// What the command line asks for.
#[derive(Debug, Clone)]
pub enum Command {
    Run(Options),
    Status {
        root: PathBuf,
        json: bool,
    },
    Report {
        root: PathBuf,
        journalctl: String,
        systemctl: String,
        console: Option<PathBuf>,
        healthz_url: String,
        /// Print nothing when there is nothing to report (kiln-report.timer's checks).
        quiet: bool,
    },
    /// `doctor`: the offline checks that break joins.
    Doctor {
        root: PathBuf,
        metadata_url: Option<String>,
        json: bool,
    },
    Help,
    Version,
}

/// Everything `kiln-firstboot run` takes from its command line.
#[derive(Debug, Clone)]
pub struct Options {
    pub root: PathBuf,
    /// `--provider`, beating `PROVIDER` in node.env: `Some(None)` is `auto`.
    pub provider: Option<Option<Provider>>,
    pub metadata_url: Option<String>,
    pub systemctl: String,
    pub kubeadm: String,
    pub rpctool: String,
    pub console: Option<PathBuf>,
    pub no_start: bool,
    pub deadline: Option<u64>,
    /// kubelet's health endpoint, waited for after the start.
    pub healthz_url: String,
    /// The journal reader used by diagnosis.
    pub journalctl: String,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            root: PathBuf::from(if cfg!(windows) { "C:\\" } else { "/" }),
            provider: None,
            metadata_url: None,
            systemctl: DEFAULT_SYSTEMCTL.to_string(),
            kubeadm: "/usr/bin/kubeadm".to_string(),
            rpctool: "/usr/bin/vmware-rpctool".to_string(),
            console: None,
            no_start: false,
            deadline: None,
            healthz_url: crate::wait::DEFAULT_HEALTHZ_URL.to_string(),
            journalctl: "/usr/bin/journalctl".to_string(),
        }
    }
}

/// The service manager's command line tool, unless `--systemctl` names another.
pub const DEFAULT_SYSTEMCTL: &str = "/usr/bin/systemctl";

/// The text of `--help`.
pub const USAGE: &str = "\
kiln-firstboot: turns kiln's node contract and instance metadata into a running kubelet

USAGE:
  kiln-firstboot [run] [--root DIR] [--provider NAME] [--metadata-url URL]
                 [--systemctl PATH] [--kubeadm PATH] [--vmware-rpctool PATH]
                 [--console PATH] [--no-start] [--deadline SECS]
                 [--healthz-url URL] [--journalctl PATH]
  kiln-firstboot status [--root DIR] [--json]
  kiln-firstboot report [--root DIR] [--journalctl PATH] [--systemctl PATH]
                        [--console PATH] [--healthz-url URL] [--quiet]
  kiln-firstboot doctor [--root DIR] [--metadata-url URL] [--json]
  kiln-firstboot --help | --version

RUN FLAGS:
  --root DIR            prefix for every contract and /sys path (default /)
  --provider NAME       auto, aws, azure, gcp, openstack, vmware, qemu, none, configdrive,
                        nocloud, hetzner, digitalocean, oraclecloud, akamai, ibmcloud,
                        scaleway (default: PROVIDER in node.env, else auto: DMI and volumes)
  --metadata-url URL    metadata base URL, aws-ipv6 (http://[fd00:ec2::254]), or a metadata
                        volume's directory (default METADATA_URL, else the platform's own:
                        on a workstation always pass a loopback URL)
  --systemctl PATH      service manager (default /usr/bin/systemctl; with it and --root /,
                        kubelet's start is queued over /run/systemd/private directly)
  --kubeadm PATH        kubeadm for JOIN_MODE=kubeadm (default /usr/bin/kubeadm)
  --vmware-rpctool PATH guestinfo reader (default /usr/bin/vmware-rpctool)
  --console PATH        console for status lines (default /dev/ttyS0, else /dev/console)
  --no-start            write kubelet's environment, do not start it
  --deadline SECS       global deadline (default KILN_DEADLINE from node.env/image.env, 300)
  --healthz-url URL     kubelet's health endpoint (default http://127.0.0.1:10248/healthz)
  --journalctl PATH     journal reader for diagnosis (default /usr/bin/journalctl)

REPORT FLAGS (and --root, --journalctl, --systemctl, --console, --healthz-url):
  --quiet               print nothing when there is nothing to report or record

DOCTOR (and --root, --metadata-url):
  checks what breaks joins (clock, swap, cgroups, netfilter, proxy, API server TLS and CA,
  credentials, containerd's CRI status, disk) and prints a table, a remedy under each
  problem; it changes nothing
  --json                one JSON object instead of the table

Exit codes: 0 ok, 9 doctor found a failure, 1 internal, 2 usage, 3 config, 4 metadata, 5 write, 6 start, 7 join.
See docs/contract.md and docs/firstboot.md.
";

/// Parses the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, String> {
    let mut it = args.iter().map(String::as_str).peekable();
    let sub = match it.peek() {
        Some(&("run" | "status" | "report" | "doctor")) => it.next().unwrap_or("run"),
        _ => "run",
    };
    let mut opts = Options::default();
    let mut json = false;
    let mut quiet = false;
    let mut journalctl = "/usr/bin/journalctl".to_string();
    while let Some(arg) = it.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(Command::Help);
        }
        if arg == "--version" || arg == "-V" {
            return Ok(Command::Version);
        }
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f, Some(v)),
            _ => (arg, None),
        };
        let is_switch = matches!(flag, "--no-start" | "--json" | "--quiet");
        if is_switch && inline.is_some() {
            return Err(format!("{flag} takes no value"));
        }
        let mut value = || -> Result<String, String> {
            match inline {
                Some(v) => Ok(v.to_string()),
                None => it
                    .next()
                    .map(str::to_string)
                    .ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        let allowed: &[&str] = match sub {
            "status" => &["--root", "--json"],
            "doctor" => &["--root", "--json", "--metadata-url"],
            "report" => &[
                "--root",
                "--journalctl",
                "--systemctl",
                "--console",
                "--healthz-url",
                "--quiet",
            ],
            _ => &[
                "--root",
                "--provider",
                "--metadata-url",
                "--systemctl",
                "--kubeadm",
                "--vmware-rpctool",
                "--console",
                "--no-start",
                "--deadline",
                "--healthz-url",
                "--journalctl",
            ],
        };
        if !allowed.contains(&flag) {
            return Err(format!("{sub}: unknown argument {arg:?}"));
        }
        match flag {
            "--root" => opts.root = resolved_root(PathBuf::from(value()?)),
            "--provider" => {
                let v = value()?;
                let choice = Provider::parse_choice(&v).map_err(|e| format!("--provider: {e}"))?;
                opts.provider = Some(choice);
            }
            "--metadata-url" => {
                let v = value()?;
                if crate::provider::named_endpoint(&v).is_none() && !v.starts_with('/') {
                    crate::http::Url::parse(&v).map_err(|e| {
                        format!("--metadata-url: {e}, a name: aws-ipv6 (AWS IMDS over IPv6), or a metadata volume's directory (/path)")
                    })?;
                }
                opts.metadata_url = Some(v);
            }
            "--systemctl" => opts.systemctl = value()?,
            "--kubeadm" => opts.kubeadm = value()?,
            "--vmware-rpctool" => opts.rpctool = value()?,
            "--journalctl" => journalctl = value()?,
            "--healthz-url" => {
                let v = value()?;
                crate::http::Url::parse(&v).map_err(|e| format!("--healthz-url: {e}"))?;
                opts.healthz_url = v;
            }
            "--console" => opts.console = Some(PathBuf::from(value()?)),
            "--no-start" => opts.no_start = true,
            "--json" => json = true,
            "--quiet" => quiet = true,
            "--deadline" => {
                let v = value()?;
                let n = v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                    format!("--deadline: expected a positive number of seconds, found {v:?}")
                })?;
                opts.deadline = Some(n);
            }
            _ => return Err(format!("{sub}: unknown argument {arg:?}")),
        }
    }
    Ok(match sub {
        "status" => Command::Status {
            root: opts.root,
            json,
        },
        "doctor" => Command::Doctor {
            root: opts.root,
            metadata_url: opts.metadata_url,
            json,
        },
        "report" => Command::Report {
            root: opts.root,
            journalctl,
            systemctl: opts.systemctl,
            console: opts.console,
            healthz_url: opts.healthz_url,
            quiet,
        },
        _ => Command::Run(Options { journalctl, ..opts }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_help_names_every_provider() {
        // The flag's paragraph: its line and the continuation lines under it.
        let line: String = USAGE
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("--provider NAME"))
            .take_while(|l| !l.trim_start().starts_with("--metadata-url"))
            .collect::<Vec<_>>()
            .join(" ");
        for p in Provider::ALL {
            assert!(
                line.contains(&format!(" {},", p.name()))
                    || line.contains(&format!(" {} ", p.name())),
                "{p}: {line}"
            );
        }
    }

    fn p(args: &[&str]) -> Result<Command, String> {
        parse(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn run_is_the_default() {
        let Ok(Command::Run(o)) = p(&["--root", "/tmp/r", "--no-start", "--deadline=5"]) else {
            panic!()
        };
        assert_eq!(
            (o.root, o.no_start, o.deadline),
            (PathBuf::from("/tmp/r"), true, Some(5))
        );
        let Ok(Command::Run(o)) = p(&[
            "run",
            "--provider=aws",
            "--metadata-url",
            "http://127.0.0.1:1",
        ]) else {
            panic!()
        };
        assert_eq!(o.provider, Some(Some(Provider::Aws)));
        assert_eq!(o.metadata_url.as_deref(), Some("http://127.0.0.1:1"));
    }

    #[test]
    fn subcommands() {
        assert!(matches!(
            p(&["status", "--json"]),
            Ok(Command::Status { json: true, .. })
        ));
        assert!(
            matches!(p(&["report", "--journalctl", "/bin/j"]), Ok(Command::Report { journalctl, quiet: false, .. }) if journalctl == "/bin/j")
        );
        assert!(matches!(
            p(&["report", "--quiet"]),
            Ok(Command::Report { quiet: true, .. })
        ));
        assert!(matches!(p(&["--help"]), Ok(Command::Help)));
        assert!(matches!(p(&["run", "-V"]), Ok(Command::Version)));
    }

    #[test]
    fn metadata_urls_may_be_ipv6_literals_or_a_name() {
        for v in ["http://[::1]:8080", "http://[fd00:ec2::254]", "aws-ipv6"] {
            let Ok(Command::Run(o)) = p(&["--metadata-url", v]) else {
                panic!("{v}")
            };
            assert_eq!(o.metadata_url.as_deref(), Some(v));
        }
        for bad in ["http://[::1", "aws", "aws-ipv4", "[::1]:80"] {
            let e = p(&["--metadata-url", bad]).expect_err(bad);
            assert!(e.contains("aws-ipv6"), "{bad}: {e}");
        }
    }

    #[test]
    fn errors_name_the_argument() {
        for (args, needle) in [
            (&["--bogus"][..], "--bogus"),
            (&["--root"], "needs a value"),
            (&["--deadline", "0"], "positive"),
            (&["--deadline", "x"], "positive"),
            (&["--provider", "ec2"], "ec2"),
            (&["--metadata-url", "https://x"], "http://"),
            (&["--no-start=1"], "takes no value"),
            (&["status", "--no-start"], "unknown argument"),
            (&["run", "--quiet"], "unknown argument"),
            (&["report", "--quiet=yes"], "takes no value"),
            (&["extra"], "unknown argument"),
        ] {
            let e = p(args).expect_err(&format!("{args:?}"));
            assert!(e.contains(needle), "{args:?}: {e}");
        }
    }
}
