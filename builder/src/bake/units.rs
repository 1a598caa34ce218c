//! The systemd units every kiln layer ships (docs/contract.md, "systemd units"), and the
//! `[Install]` parsing that turns `WantedBy=` into the symlinks `systemctl enable` creates.

pub use crate::layer_contract::BUILTIN_UNITS;

/// `kiln-firstboot.service`: runs once per boot, once the network is up. Not ordered after
/// containerd: its config, metadata and write phases need no container runtime, so they run
/// while containerd starts; kubelet's own `After=containerd.service` holds kubelet's start
/// until the CRI socket is there (kubelet refuses to start without it). Deliberately not
/// ordered against kubelet.service either: firstboot queues kubelet's start and waits for it
/// in the same run (docs/contract.md, "systemd units").
pub const KILN_FIRSTBOOT: &str = "\
[Unit]
Description=kiln first boot: write kubelet's environment and start kubelet
Documentation=https://github.com/kiln-project/kiln/blob/main/docs/contract.md
Wants=network-online.target containerd.service
After=network-online.target

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/usr/bin/kiln-firstboot run
StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
";

/// `kubelet.service`: not enabled; kiln-firstboot starts it once `/run/kiln/kubelet.env`
/// exists. Not `After=kiln-firstboot.service`: that would hold kubelet's start job until
/// firstboot exits, while firstboot waits for kubelet.
///
/// `Restart=always` keeps a crashing kubelet restarting, so it never reaches `failed` and
/// `OnFailure=` alone would never report it (systemd.unit(5): a restarting unit fails only at
/// its start limit). Every exit therefore runs `kiln-firstboot report` as `ExecStopPost=`,
/// which reads `$SERVICE_RESULT`/`$EXIT_CODE`/`$EXIT_STATUS` (systemd.exec(5)) and ignores a
/// clean stop; `kiln-report.timer` sees hangs and recovery (docs/contract.md, "Post-boot
/// reporting").
///
/// In `JOIN_MODE=kubeadm`, `kubeadm join` writes `/var/lib/kubelet/kubeadm-flags.env`
/// (`KUBELET_KUBEADM_ARGS`) and restarts this unit: the command line is then kubeadm's
/// drop-in (10-kubeadm.conf) with kiln's `$KUBELET_ARGS` in the place of its
/// `$KUBELET_EXTRA_ARGS`, last so they win. In kubelet mode the file does not exist and the
/// variable expands to no words (systemd.service(5), "Command lines").
pub const KUBELET: &str = "\
[Unit]
Description=Kubernetes kubelet (started by kiln-firstboot)
Documentation=https://kubernetes.io/docs/reference/command-line-tools-reference/kubelet/
Wants=network-online.target containerd.service
After=network-online.target containerd.service
OnFailure=kiln-report.service

[Service]
Environment=SSL_CERT_DIR=/etc/ssl/certs:/etc/pki/tls/certs:/etc/kiln/trust.d
EnvironmentFile=/run/kiln/kubelet.env
EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env
ExecStart=/usr/bin/kubelet $KUBELET_KUBEADM_ARGS $KUBELET_ARGS
ExecStopPost=-/usr/bin/kiln-firstboot report
Restart=always
RestartSec=5
";

/// `kiln-report.service`: diagnoses a kubelet that failed after boot, or records that it
/// recovered. Started by kubelet's `OnFailure=` and by `kiln-report.timer`.
pub const KILN_REPORT: &str = "\
[Unit]
Description=kiln: check kubelet after boot and report a failure or a recovery on the console
Documentation=https://github.com/kiln-project/kiln/blob/main/docs/contract.md

[Service]
Type=oneshot
ExecStart=/usr/bin/kiln-firstboot report --quiet
";

/// `kiln-report.timer`: runs `kiln-report.service` every 30 s (accurate to 1 s), so a kubelet
/// that hangs without exiting is reported, and one that recovers is recorded as a success,
/// within about 30 s. While firstboot's own run is in progress `report` leaves it alone.
pub const KILN_REPORT_TIMER: &str = "\
[Unit]
Description=kiln: check kubelet every 30 s after boot
Documentation=https://github.com/kiln-project/kiln/blob/main/docs/contract.md

[Timer]
OnActiveSec=30s
OnUnitActiveSec=30s
AccuracySec=1s
Unit=kiln-report.service

[Install]
WantedBy=timers.target
";

/// `C:\k\kiln\kiln-report.xml`: the Windows side of `kiln-report.timer` and kubelet's
/// `OnFailure=`, a Task Scheduler task `kiln-firstboot install` registers as `kiln-report`
/// (`schtasks /Create /XML`). It runs `kiln-firstboot report --quiet` as SYSTEM 30 s after boot
/// and every minute after (Task Scheduler's shortest repetition), and whenever the Service
/// Control Manager logs that the kubelet service (display name `Kubernetes kubelet`, as
/// `kiln-firstboot install` registers it) stopped with an error or crashed (System log events
/// 7023, 7024, 7031, 7034). Operators see it in Task Scheduler; its last run result is
/// `report`'s exit code. ASCII only, declared UTF-8: `schtasks` reads a file without a
/// byte-order mark in the ANSI code page.
pub const KILN_REPORT_TASK: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<Task version="1.2" xmlns="http://schemas.microsoft.com/windows/2004/02/mit/task">
  <RegistrationInfo>
    <Author>kiln</Author>
    <Description>kiln: check kubelet after boot and report a failure or a recovery (C:\ProgramData\kiln\run\status.json, COM1, Application log)</Description>
    <URI>\kiln-report</URI>
  </RegistrationInfo>
  <Triggers>
    <BootTrigger>
      <Enabled>true</Enabled>
      <Delay>PT30S</Delay>
      <Repetition>
        <Interval>PT1M</Interval>
        <StopAtDurationEnd>false</StopAtDurationEnd>
      </Repetition>
    </BootTrigger>
    <EventTrigger>
      <Enabled>true</Enabled>
      <Subscription>&lt;QueryList&gt;&lt;Query Id="0" Path="System"&gt;&lt;Select Path="System"&gt;*[System[Provider[@Name='Service Control Manager'] and (EventID=7023 or EventID=7024 or EventID=7031 or EventID=7034)]] and *[EventData[Data[@Name='param1']='Kubernetes kubelet']]&lt;/Select&gt;&lt;/Query&gt;&lt;/QueryList&gt;</Subscription>
    </EventTrigger>
  </Triggers>
  <Principals>
    <Principal id="Author">
      <UserId>S-1-5-18</UserId>
      <RunLevel>HighestAvailable</RunLevel>
    </Principal>
  </Principals>
  <Settings>
    <MultipleInstancesPolicy>IgnoreNew</MultipleInstancesPolicy>
    <DisallowStartIfOnBatteries>false</DisallowStartIfOnBatteries>
    <StopIfGoingOnBatteries>false</StopIfGoingOnBatteries>
    <ExecutionTimeLimit>PT5M</ExecutionTimeLimit>
    <AllowStartOnDemand>true</AllowStartOnDemand>
    <Enabled>true</Enabled>
  </Settings>
  <Actions Context="Author">
    <Exec>
      <Command>C:\k\kiln-firstboot.exe</Command>
      <Arguments>report --quiet</Arguments>
    </Exec>
  </Actions>
</Task>
"#;

/// `kiln-images.service`: imports the layer's baked image archives into containerd's `k8s.io`
/// namespace (the CRI plugin's) as soon as containerd is up, with no registry:
/// `ctr images import` reads the archive only. One `ExecStart=` per archive, in order; the
/// first that fails fails the unit, on the console. `--platform` imports and unpacks exactly
/// the layer's platform (the archive holds no other); unpacking into the default snapshotter
/// (overlayfs, as kiln's containerd config) is what the CRI plugin needs to run a container.
/// Importing again is harmless: blobs already in the content store are not written again and
/// the image records are replaced by identical ones (docs/contract.md, "Baked images").
/// The same command line serves containerd 1.6 (Debian 12's `ctr` imports in the client and
/// knows no `--local`, so kiln never passes it) and 2.x (`ctr` imports through the transfer
/// service by default; `--platform` there selects what is stored and unpacked:
/// containerd's `cmd/ctr/commands/images/import.go`, cited in docs/mirror.md, "On the node").
/// `Wants=`, not `Requires=`, on containerd: kiln-firstboot restarts containerd for a node
/// proxy, and `Requires=` would restart this unit with it (systemd.unit(5)); a containerd that
/// is not running fails the import, loudly, all the same.
/// Nothing waits for it. kubelet starts without it: kubelet needs the CRI socket to start,
/// not an image; the first image it needs is the sandbox image of its first pod, which comes
/// after kubelet's TLS bootstrap, its node registration and a scheduling decision, long after
/// an import of a few MiB (and a sandbox asked for earlier is retried by kubelet, as any
/// failed sandbox). kiln-firstboot's phases need no images either; before it restarts
/// containerd for a proxy it starts this unit and waits for it, so the restart never cuts an
/// import short (docs/contract.md, "Baked images").
pub fn kiln_images(archives: &[String], platform: &str) -> String {
    let mut exec = String::new();
    for a in archives {
        exec.push_str(&format!(
            "ExecStart=/usr/bin/ctr --namespace k8s.io images import --platform {platform} {a}\n"
        ));
    }
    format!(
        "\
[Unit]
Description=kiln: import the container images baked into this layer into containerd (k8s.io)
Documentation=https://github.com/kiln-project/kiln/blob/main/docs/contract.md
Wants=containerd.service
After=containerd.service

[Service]
Type=oneshot
RemainAfterExit=yes
{exec}StandardOutput=journal+console
StandardError=journal+console

[Install]
WantedBy=multi-user.target
"
    )
}

/// Go's certificate directories (`crypto/x509`, `root_unix.go`: `SSL_CERT_DIR`, `:`-separated,
/// replacing its defaults `/etc/ssl/certs` and `/etc/pki/tls/certs`, which stay first) and the
/// node's `[trust]` directory: every file in each is read as PEM when the process first needs
/// the system roots. containerd and kubelet (and the credential providers it runs) get it
/// (docs/contract.md, "Trust bundle").
pub const SSL_CERT_DIR: &str = "/etc/ssl/certs:/etc/pki/tls/certs:/etc/kiln/trust.d";

/// `containerd.service`, after upstream's unit, pointed at kiln's config. `proxy` lines are
/// the image's `KEY=value` pairs added as `Environment=`; the node's proxy from node.env
/// comes later through `/run/kiln/containerd.env`, which kiln-firstboot writes (restarting
/// containerd when it changed) and which beats `Environment=` (systemd.exec(5)).
/// `overlay_loaded`: the layer's `modules-load.d` already loads `overlay`
/// (systemd-modules-load, early in boot and in-process), so upstream's
/// `ExecStartPre=-/sbin/modprobe overlay` would only spend a process start on every
/// containerd start; without it in the modules list, the unit keeps upstream's line.
pub fn containerd(proxy: &[(String, String)], overlay_loaded: bool) -> String {
    let mut env = String::new();
    for (k, v) in proxy {
        env.push_str(&format!("Environment={k}={v}\n"));
    }
    let modprobe = if overlay_loaded {
        ""
    } else {
        "ExecStartPre=-/sbin/modprobe overlay\n"
    };
    format!(
        "\
[Unit]
Description=containerd container runtime
Documentation=https://containerd.io
After=local-fs.target

[Service]
Environment=SSL_CERT_DIR={SSL_CERT_DIR}
{env}EnvironmentFile=-/run/kiln/containerd.env
{modprobe}ExecStart=/usr/bin/containerd --config /usr/lib/kiln/containerd/config.toml
Type=notify
Delegate=yes
KillMode=process
Restart=always
RestartSec=5
LimitNPROC=infinity
LimitCORE=infinity
TasksMax=infinity
OOMScoreAdjust=-999

[Install]
WantedBy=multi-user.target
"
    )
}

/// The targets named by `WantedBy=` in the unit's `[Install]` section, in order.
pub fn wanted_by(unit: &str) -> Vec<String> {
    let mut section = "";
    let mut out = Vec::new();
    for line in unit.lines() {
        let line = line.trim();
        if line.starts_with('[') && line.ends_with(']') {
            section = line;
            continue;
        }
        if section != "[Install]" {
            continue;
        }
        if let Some(v) = line.strip_prefix("WantedBy=") {
            for t in v.split_whitespace() {
                if !out.iter().any(|o| o == t) {
                    out.push(t.to_string());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Windows task is the file kiln-firstboot's tests register under Wine; a change here
    /// is a change there: `cp` the constant's text over the fixture.
    #[test]
    fn report_task_is_firstboots_fixture() {
        let fixture = include_str!("../../../firstboot/tests/fixtures/windows/kiln-report.xml");
        assert_eq!(KILN_REPORT_TASK, fixture);
        assert!(KILN_REPORT_TASK.is_ascii());
    }

    #[test]
    fn wanted_by_reads_only_the_install_section() {
        let cases: &[(&str, &[&str])] = &[
            (KILN_FIRSTBOOT, &["multi-user.target"]),
            (KUBELET, &[]),
            (KILN_REPORT_TIMER, &["timers.target"]),
            (
                "[Unit]\nWantedBy=x.target\n[Install]\nWantedBy=a.target b.target\nWantedBy=a.target\n",
                &["a.target", "b.target"],
            ),
        ];
        for (unit, want) in cases {
            assert_eq!(wanted_by(unit), *want, "{unit}");
        }
    }

    #[test]
    fn images_unit_imports_each_archive_once_containerd_is_up() {
        let u = kiln_images(
            &[
                "/usr/share/kiln/images/a.oci.tar".into(),
                "/usr/share/kiln/images/b.oci.tar".into(),
            ],
            "linux/arm64",
        );
        let execs: Vec<&str> = u.lines().filter(|l| l.starts_with("ExecStart=")).collect();
        assert_eq!(
            execs,
            [
                "ExecStart=/usr/bin/ctr --namespace k8s.io images import --platform linux/arm64 /usr/share/kiln/images/a.oci.tar",
                "ExecStart=/usr/bin/ctr --namespace k8s.io images import --platform linux/arm64 /usr/share/kiln/images/b.oci.tar",
            ]
        );
        for needle in [
            "Wants=containerd.service",
            "After=containerd.service",
            "Type=oneshot",
        ] {
            assert!(u.lines().any(|l| l == needle), "{needle}\n{u}");
        }
        // Nothing waits for the import: not kubelet, not kiln-firstboot.
        assert!(!u.contains("Before="), "{u}");
        assert!(!KUBELET.contains("kiln-images") && !KILN_FIRSTBOOT.contains("kiln-images"));
        assert_eq!(wanted_by(&u), ["multi-user.target"]);
    }

    #[test]
    fn kubelet_unit_honours_the_contract() {
        for needle in [
            "EnvironmentFile=/run/kiln/kubelet.env",
            "EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env",
            "ExecStart=/usr/bin/kubelet $KUBELET_KUBEADM_ARGS $KUBELET_ARGS",
            "OnFailure=kiln-report.service",
            "ExecStopPost=-/usr/bin/kiln-firstboot report",
            "Restart=always",
        ] {
            assert!(KUBELET.contains(needle), "{needle}");
        }
        // The two must not be ordered against each other (contract, "systemd units").
        assert!(!KUBELET.contains("kiln-firstboot.service"));
        assert!(!KILN_FIRSTBOOT.contains("kubelet.service"));
        assert!(containerd(&[], true).contains(
            "ExecStart=/usr/bin/containerd --config /usr/lib/kiln/containerd/config.toml"
        ));
        // upstream's modprobe only where modules-load.d does not load overlay already.
        let modprobe = "ExecStartPre=-/sbin/modprobe overlay";
        assert!(!containerd(&[], true).contains(modprobe));
        assert!(containerd(&[], false).contains(modprobe));
        // The node's proxy: optional (`-`), and after the image's Environment= lines.
        let c = containerd(&[("HTTP_PROXY".into(), "http://image:3128".into())], true);
        let env = c.find("Environment=HTTP_PROXY=http://image:3128").unwrap();
        let file = c.find("EnvironmentFile=-/run/kiln/containerd.env").unwrap();
        assert!(env < file, "{c}");
    }
}
