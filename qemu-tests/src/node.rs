//! One kiln node booted end to end: bake (or take) the layer, build the root from a base,
//! place the provisioner's files, boot under QEMU with a metadata source, and read the
//! outcome and a timeline off the console.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::arch::Arch;
use crate::assets::Assets;
use crate::console::Line;
use crate::guest::{console_unit_on, log_path, Root};
use crate::metadata::{aws_imdsv2, AwsInstance, MetadataServer, Request};
use crate::scenario::{self, NodeConfig, Outcome, Tools};
use crate::vm::{Vm, VmConfig};
use crate::{io_err, Result};

/// The AWS instance every AWS scenario pretends to be.
pub fn test_instance() -> AwsInstance {
    AwsInstance {
        instance_id: "i-0kiln0boot0test01".into(),
        instance_type: "m5.large".into(),
        local_ipv4: "10.0.3.7".into(),
        zone: "eu-west-1a".into(),
        region: "eu-west-1".into(),
        hostname: "ip-10-0-3-7.eu-west-1.compute.internal".into(),
        mac: "52:54:00:12:34:56".into(),
        warmed_for: None,
    }
}

/// SMBIOS strings that make the guest's DMI say "Amazon EC2", as on a Nitro instance, so
/// kiln-firstboot's `auto` detection picks the AWS source.
pub fn aws_smbios() -> Vec<String> {
    vec![
        "type=0,vendor=Amazon EC2".into(),
        "type=1,manufacturer=Amazon EC2,product=m5.large".into(),
    ]
}

/// What the metadata side of a boot is.
#[derive(Debug, Clone)]
pub enum Metadata {
    /// The IMDSv2 stand-in, reached through the guest forward.
    Aws,
    /// The IMDSv2 stand-in answering as another instance (the arm64 node's Graviton type).
    AwsAs(AwsInstance),
    /// A forward to a loopback port where nothing listens.
    Nowhere,
    /// No network; a NoCloud volume (FAT, `CIDATA`) as a second drive ([`crate::seed`]).
    NoCloud,
    /// No network; an OpenStack config drive (ISO 9660, `config-2`) as a second drive.
    ConfigDrive,
}

/// How one node boots.
#[derive(Debug, Clone)]
pub struct NodeBoot {
    /// Test name (console log file name).
    pub name: String,
    /// The stand-in kubelet's `STANDIN_MODE`.
    pub kubelet_mode: String,
    /// The node config's provider and deadline.
    pub node: NodeConfig,
    /// Metadata source.
    pub metadata: Metadata,
    /// How long to wait for the report before failing.
    pub timeout: Duration,
    /// Whether the stand-in kubelet runs the real pod after its bootstrap (the test images
    /// imported, a sandbox and a container run through containerd, runc and CNI). Only the
    /// scenarios that assert it: it costs about 55 s of emulated CPU per boot (docs/boot-tests.md,
    /// "A real pod").
    pub pod: bool,
}

/// Host-side timings of one boot, in milliseconds.
#[derive(Debug, Clone, Default)]
pub struct Timings {
    /// Bake + root + disk before QEMU started.
    pub prepare_ms: u64,
    /// Host ms (since QEMU start) of the first kernel line, the initramfs hand-over,
    /// systemd's banner and the KILN-STATUS line.
    pub kernel_ms: Option<u64>,
    /// initramfs switching to the root.
    pub initramfs_ms: Option<u64>,
    /// systemd's "Welcome to" banner.
    pub systemd_ms: Option<u64>,
    /// The KILN-STATUS line.
    pub status_ms: u64,
}

/// Everything a scenario asserts on.
#[derive(Debug)]
pub struct Booted {
    /// The parsed outcome.
    pub outcome: Outcome,
    /// Requests the metadata server saw.
    pub requests: Vec<Request>,
    /// Timings.
    pub timings: Timings,
    /// The whole console.
    pub lines: Vec<Line>,
    /// The image id of the baked layer.
    pub log: PathBuf,
}

/// The ubuntu rootfs layer baked for the assets' architecture, with that architecture's
/// kiln-firstboot.
pub fn ubuntu_layer(tools: &Tools, assets: &Assets) -> Result<PathBuf> {
    let firstboot = scenario::firstboot_for(tools, assets.arch)?;
    let baked = scenario::bake_for(tools, "ubuntu", "rootfs", assets.arch, &firstboot)?;
    scenario::pick(&baked, ".tar.zst")
}

/// Prepares the root of a rootfs-layer node: base + `kiln install` + rendered files. The
/// layer is baked for the assets' architecture with that architecture's kiln-firstboot.
pub fn rootfs_root(tools: &Tools, assets: &Assets, work: &Path, node: &NodeConfig) -> Result<Root> {
    let layer = ubuntu_layer(tools, assets)?;
    let root = Root::from_base(&assets.base, work)?;
    scenario::install(tools, &layer, &root.dir)?;
    let node_toml = scenario::node_toml(&work.join("node"), node)?;
    root.write(
        scenario::SIGNED_CLIENT,
        scenario::signed_client(&work.join("node"))?,
        0o600,
    )?;
    scenario::render_files(tools, &node_toml, &root.dir)?;
    Ok(root)
}

/// Adds the stand-in kubelet's mode and the report unit (on `arch`'s serial console) to a
/// root, trimmed as every scenario's guest is ([`Root::trim_for_tests`]).
pub fn finish_root(root: &Root, kubelet_mode: &str, arch: Arch) -> Result<()> {
    root.trim_for_tests()?;
    root.write(
        "etc/kubernetes/standin-kubelet.env",
        format!("STANDIN_MODE={kubelet_mode}\n"),
        0o644,
    )?;
    let mut unit = console_unit_on(
        arch.console(),
        "boot test: report the node's files on the console",
        "kiln-firstboot.service",
        &scenario::report_script(),
    );
    // Report whether firstboot succeeded or failed, but never pull it in.
    unit = unit.replace("Wants=kiln-firstboot.service\n", "");
    root.add_unit("kiln-test-report.service", &unit, "multi-user.target")
}

/// Boots a prepared root disk and collects the outcome.
pub fn boot(
    assets: &Assets,
    spec: &NodeBoot,
    disk: PathBuf,
    extra_disks: Vec<PathBuf>,
    prepare_ms: u64,
) -> Result<Booted> {
    boot_with(assets, spec, prepare_ms, |cfg| {
        cfg.root = Some(disk);
        cfg.extra_disks = extra_disks;
    })
}

/// [`boot`] with the disks (and how they boot) set by `disks`.
pub fn boot_with(
    assets: &Assets,
    spec: &NodeBoot,
    prepare_ms: u64,
    disks: impl FnOnce(&mut VmConfig),
) -> Result<Booted> {
    let work = tempfile::tempdir()?;
    let server = match &spec.metadata {
        Metadata::Aws => Some(MetadataServer::start(aws_imdsv2(test_instance()))?),
        Metadata::AwsAs(i) => Some(MetadataServer::start(aws_imdsv2(i.clone()))?),
        _ => None,
    };
    let log = log_path(&spec.name)?;
    let mut cfg = VmConfig::new(assets, &log);
    disks(&mut cfg);
    match &spec.metadata {
        Metadata::Aws => {
            cfg.metadata_port = server.as_ref().map(MetadataServer::port);
            cfg.smbios = aws_smbios();
        }
        Metadata::AwsAs(_) => {
            cfg.metadata_port = server.as_ref().map(MetadataServer::port);
            // On arm64's virt board booted without firmware the kernel has no SMBIOS tables
            // (they reach an arm64 kernel only through UEFI), so the node names its provider.
            if cfg.arch == Arch::Amd64 {
                cfg.smbios = aws_smbios();
            }
        }
        Metadata::Nowhere => {
            // A port that was free a moment ago: the relay's connect is refused.
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            cfg.metadata_port = Some(l.local_addr()?.port());
            drop(l);
            cfg.smbios = aws_smbios();
        }
        Metadata::NoCloud => {
            cfg.smbios = vec!["type=1,manufacturer=QEMU".into()];
            cfg.extra_disks
                .push(crate::seed::nocloud_volume(work.path())?);
        }
        Metadata::ConfigDrive => {
            cfg.smbios = vec!["type=1,manufacturer=QEMU".into()];
            cfg.extra_disks
                .push(crate::seed::config_drive(work.path())?);
        }
    }
    let mut vm = Vm::start(&cfg, assets)?;
    vm.wait_for(
        "KILN-TEST-DONE (the report after kiln-firstboot)",
        spec.timeout,
        |l| l == "KILN-TEST-DONE",
    )?;
    // The guest powers itself off; don't wait on it for the outcome.
    vm.kill();
    let lines = vm.console().lines();
    let outcome = Outcome::parse(&lines)?;
    let find =
        |pred: &dyn Fn(&str) -> bool| lines.iter().find(|l| pred(&l.text)).map(|l| l.host_ms);
    let timings = Timings {
        prepare_ms,
        kernel_ms: find(&|t| t.starts_with("[    0.000000]")),
        initramfs_ms: find(&|t| t.starts_with("kiln-initramfs: switching")),
        systemd_ms: find(&|t| t.starts_with("Welcome to")),
        status_ms: outcome.status_line.host_ms,
    };
    Ok(Booted {
        outcome,
        requests: server.map(|s| s.requests()).unwrap_or_default(),
        timings,
        lines,
        log,
    })
}

/// A rootfs node end to end: bake, install, render, boot.
pub fn boot_rootfs_node(spec: &NodeBoot) -> Result<Booted> {
    boot_rootfs_node_edited(spec, |_| Ok(()))
}

/// [`boot_rootfs_node`] with `edit` applied to the finished root before the disk is made:
/// what an operator or a broken image build might change on the node.
pub fn boot_rootfs_node_edited(
    spec: &NodeBoot,
    edit: impl FnOnce(&Root) -> Result<()>,
) -> Result<Booted> {
    let t0 = Instant::now();
    let assets = crate::assets::ensure()?;
    let tools = scenario::tools()?;
    let work = tempfile::tempdir()?;
    let root = rootfs_root(tools, assets, work.path(), &spec.node)?;
    finish_root(&root, &spec.kubelet_mode, Arch::Amd64)?;
    if spec.pod {
        crate::pod::install(&root, "ubuntu")?;
    }
    edit(&root)?;
    let disk = root.into_disk(&work.path().join("root.ext4"), 512)?;
    boot(
        assets,
        spec,
        disk,
        Vec::new(),
        t0.elapsed().as_millis() as u64,
    )
}

/// A short human timeline of a boot: host time since QEMU started for the kernel, the
/// initramfs, systemd and the status line, and the node's own clock (ms since boot) for
/// firstboot's phases.
pub fn timeline(b: &Booted) -> String {
    let mut out = String::new();
    let t = &b.timings;
    let s = |ms: Option<u64>| {
        ms.map(|m| format!("{:>7.2} s", m as f64 / 1000.0))
            .unwrap_or_else(|| "      ?  ".into())
    };
    out.push_str(&format!(
        "  host: prepared root disk in {:.2} s\n",
        t.prepare_ms as f64 / 1000.0
    ));
    out.push_str(&format!("  {}  kernel starts\n", s(t.kernel_ms)));
    out.push_str(&format!(
        "  {}  initramfs hands over to the root\n",
        s(t.initramfs_ms)
    ));
    out.push_str(&format!("  {}  systemd starts\n", s(t.systemd_ms)));
    let o = &b.outcome;
    // Host times and node times differ by QEMU's start-up (the kernel's first line); the
    // phases are on the node's clock, as kiln-firstboot recorded them.
    if let Some(arr) = o.status["phases"].as_array() {
        for p in arr {
            let name = p["name"].as_str().unwrap_or("?");
            let result = p["result"].as_str().unwrap_or("?");
            let (start, end) = (
                p["start_ms"].as_u64().unwrap_or(0),
                p["end_ms"].as_u64().unwrap_or(0),
            );
            out.push_str(&format!(
                "  {:>7.2} s  firstboot {name:<14} {result:<8} ({} ms, node clock)\n",
                end as f64 / 1000.0,
                end.saturating_sub(start),
            ));
            if name == "start-kubelet" && result == "success" {
                out.push_str(&format!(
                    "  {:>7.2} s  kubelet start queued\n",
                    end as f64 / 1000.0
                ));
            }
            if name == "wait-joined" && result == "success" {
                out.push_str(&format!(
                    "  {:>7.2} s  joined: kubelet healthy, client certificate written\n",
                    end as f64 / 1000.0
                ));
            }
        }
    }
    for unit in crate::outcome::TIMED_UNITS.split_whitespace() {
        if let Some((exit, enter)) = o.unit_times(unit) {
            out.push_str(&format!(
                "  {:>7.2} s  {unit} starting, active at {:.2} s (node clock)\n",
                exit as f64 / 1000.0,
                enter as f64 / 1000.0
            ));
        }
    }
    out.push_str(&format!(
        "  {}  KILN-STATUS on the console\n",
        s(Some(t.status_ms))
    ));
    out.push_str(&format!(
        "  result={} reason={} firstboot's own phases: {} ms\n",
        o.result(),
        if o.reason().is_empty() {
            "-"
        } else {
            o.reason()
        },
        o.firstboot_own_ms()
    ));
    out
}

/// Turns a Debian root into the Flatcar stand-in: `os-release` says `ID=flatcar` with the
/// sysext level kiln's Flatcar image targets, systemd-sysext merges `/var/lib/extensions/`
/// at boot, and `ensure-sysext.service` (as Flatcar ships it) reloads systemd afterwards so
/// the extension's units and their vendor `wants` links take effect.
pub fn make_flatcar_like(root: &Root) -> Result<()> {
    let os_release = "NAME=\"Flatcar Container Linux by Kinvolk (kiln boot-test stand-in: Debian 13 userland)\"\n\
        ID=flatcar\nID_LIKE=coreos\nVERSION_ID=4230.2.0\nSYSEXT_LEVEL=1.0\n\
        PRETTY_NAME=\"Flatcar stand-in (Debian trixie)\"\n";
    root.write("usr/lib/os-release", os_release, 0o644)?;
    root.write("etc/os-release", os_release, 0o644)?;
    let wants = root.dir.join("etc/systemd/system/sysinit.target.wants");
    std::fs::create_dir_all(&wants).map_err(io_err(&wants))?;
    let link = wants.join("systemd-sysext.service");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/lib/systemd/system/systemd-sysext.service", &link)
        .map_err(io_err(&link))?;
    root.add_unit(
        "ensure-sysext.service",
        "[Unit]\nDescription=Reload systemd after systemd-sysext merged extensions (as Flatcar does)\n\
         BindsTo=systemd-sysext.service\nAfter=systemd-sysext.service\nDefaultDependencies=no\n\
         Before=sysinit.target shutdown.target\nConflicts=shutdown.target\n\n\
         [Service]\nType=oneshot\nRemainAfterExit=yes\n\
         ExecStart=/bin/systemctl daemon-reload\n\
         ExecStart=/bin/systemctl restart --no-block sockets.target timers.target multi-user.target\n",
        "sysinit.target",
    )
}

/// A Flatcar-style node: the base with no Kubernetes bits; real Ignition places kiln's sysext
/// (`kiln render --sysext`); metadata from `spec.metadata` (a volume); after the join, the node's
/// systemd-sysupdate updates the extension from the returned mirror ([`crate::sysupdate`]).
pub fn boot_sysext_node(spec: &NodeBoot) -> Result<(Booted, crate::sysupdate::Mirror)> {
    let t0 = Instant::now();
    let assets = crate::assets::ensure()?;
    let tools = scenario::tools()?;
    let work = tempfile::tempdir()?;
    let baked = scenario::bake(tools, "flatcar", "sysext")?;
    let raw = scenario::pick(&baked, ".raw")?;
    let root = Root::from_base(&assets.base, work.path())?;
    make_flatcar_like(&root)?;
    // Metadata comes from a volume; the NIC reaches only the update mirror, which nothing at
    // boot waits for: systemd-networkd-wait-online would hold network-online.target (and
    // kubelet, ordered after it) for as long as DHCP takes.
    root.mask("systemd-networkd-wait-online.service")?;
    let node_toml = scenario::node_toml(&work.path().join("node"), &spec.node)?;
    root.write(
        scenario::SIGNED_CLIENT,
        scenario::signed_client(&work.path().join("node"))?,
        0o600,
    )?;
    // As a Flatcar user adds it to a stock image: Ignition fetches the sysext (verified by
    // its sha512) into /opt/extensions/ and links it from /etc/extensions/, and writes the
    // node files; nothing else puts the extension on this disk.
    crate::ignition::place(
        tools,
        &node_toml,
        &raw,
        &root,
        &work.path().join("ignition"),
    )?;
    finish_root(&root, &spec.kubelet_mode, Arch::Amd64)?;
    if spec.pod {
        crate::pod::install(&root, "flatcar")?;
    }
    // The extension is a signed disk image (kiln bake --sysext-ddi); after the join the
    // guest's systemd-sysext is also given tampered copies of it (crate::signed_sysext).
    crate::signed_sysext::place_copies(&raw, &root, &work.path().join("ddi"))?;
    // After the join, a patch update from the mirror the transfer file names.
    crate::after_join::install(
        &root,
        &format!(
            "{}{}",
            crate::sysupdate::after_join_script(),
            crate::signed_sysext::script()
        ),
    )?;
    let mirror = crate::sysupdate::start_mirror(&raw)?;
    let disk = root.into_disk(&work.path().join("root.ext4"), 512)?;
    let b = boot_with(assets, spec, t0.elapsed().as_millis() as u64, |cfg| {
        cfg.root = Some(disk);
        cfg.mirror_port = Some(mirror.port);
    })?;
    Ok((b, mirror))
}

/// A NoCloud seed disk (`cidata` label, vfat) holding the user data, made without mounting
/// (mkfs.vfat + mtools' mcopy).
pub fn nocloud_seed(dir: &Path, user_data: &str, instance_id: &str) -> Result<PathBuf> {
    crate::seed::vfat(
        dir,
        "CIDATA",
        &[
            ("user-data", user_data),
            (
                "meta-data",
                &format!("instance-id: {instance_id}\nlocal-hostname: kiln-cloudinit-node\n"),
            ),
        ],
    )
}

/// A cloud-init node: the rootfs layer installed into the cloud-init base, and the
/// `/etc/kiln/` files arriving only through a NoCloud seed rendered by
/// `kiln render --provisioner cloud-init`.
pub fn boot_cloudinit_node(spec: &NodeBoot) -> Result<(Booted, String)> {
    boot_cloudinit(spec, false)
}

/// [`boot_cloudinit_node`] whose pod's image is pulled, not imported: node.toml gets a
/// `[[containerd.registry]]` for [`crate::pod::PULL_IMAGE`]'s registry whose only mirror is a
/// TLS registry on loopback ([`crate::registry`]) with its own CA, reached through the
/// guest's forward; the pod check pulls through the `hosts.toml` cloud-init wrote. Needs
/// `spec.pod`.
pub fn boot_cloudinit_node_pulling(spec: &NodeBoot) -> Result<(Booted, String)> {
    boot_cloudinit(spec, true)
}

fn boot_cloudinit(spec: &NodeBoot, pull: bool) -> Result<(Booted, String)> {
    let t0 = Instant::now();
    let assets = crate::assets::ensure_cloudinit()?;
    let tools = scenario::tools()?;
    let work = tempfile::tempdir()?;
    let baked = scenario::bake(tools, "ubuntu", "rootfs")?;
    let layer = scenario::pick(&baked, ".tar.zst")?;
    let root = Root::from_base(&assets.base_cloudinit, work.path())?;
    scenario::install(tools, &layer, &root.dir)?;
    // Only NoCloud: no network datasource probing (which would try 169.254.169.254).
    root.write(
        "etc/cloud/cloud.cfg.d/90-kiln-test.cfg",
        "datasource_list: [ NoCloud, None ]\nnetwork: {config: disabled}\n",
        0o644,
    )?;
    finish_root(&root, &spec.kubelet_mode, Arch::Amd64)?;
    let mut node = spec.node.clone();
    let mirror = if pull {
        let sandbox = crate::pod::sandbox_image("ubuntu")?;
        let archive = crate::pod::images_archive(&sandbox, Arch::Amd64)?;
        let (repo, tag) = crate::pod::PULL_IMAGE
            .split_once('/')
            .and_then(|(_, rest)| rest.rsplit_once(':'))
            .expect("PULL_IMAGE is registry/repo:tag");
        let m = crate::registry::start(&archive, tag, repo)?;
        let registry = crate::pod::PULL_IMAGE.split('/').next().unwrap_or_default();
        node.extra.push_str(&format!(
            "\n[[containerd.registry]]\nhost = \"{registry}\"\n\
             mirrors = [\"https://{}\"]\nca = {{ pem = \"\"\"\n{}\"\"\" }}\n",
            crate::vm::MIRROR_ADDR,
            m.ca_pem
        ));
        crate::pod::install_pulling(&root, "ubuntu")?;
        Some(m)
    } else {
        if spec.pod {
            crate::pod::install(&root, "ubuntu")?;
        }
        None
    };
    let node_toml = scenario::node_toml(&work.path().join("node"), &node)?;
    root.write(
        scenario::SIGNED_CLIENT,
        scenario::signed_client(&work.path().join("node"))?,
        0o600,
    )?;
    let user_data = scenario::render_cloud_init(tools, &node_toml)?;
    let seed = nocloud_seed(work.path(), &user_data, "i-kiln-cloudinit")?;
    let disk = root.into_disk(&work.path().join("root.ext4"), 512)?;
    let b = boot_with(assets, spec, t0.elapsed().as_millis() as u64, |cfg| {
        cfg.root = Some(disk);
        cfg.extra_disks = vec![seed];
        cfg.mirror_port = mirror.as_ref().map(|m| m.port);
    })?;
    drop(mirror);
    Ok((b, user_data))
}

/// One machine-readable line per boot for `bench/boot.sh`: boot-to-kubelet-started on the
/// node's clock and kiln-firstboot's own share.
pub fn bench_line(scenario: &str, b: &Booted) -> String {
    let o = &b.outcome;
    let started = o.kubelet_started_ms();
    let joined = o
        .phase("wait-joined")
        .filter(|p| p.2 == "success")
        .map(|p| p.1);
    let ms = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    format!(
        "KILN-BOOT-BENCH scenario={scenario} result={} kubelet_started_ms={} joined_ms={} firstboot_own_ms={} status_host_ms={} prepare_ms={}",
        o.result(),
        ms(started),
        ms(joined),
        o.firstboot_own_ms(),
        b.timings.status_ms,
        b.timings.prepare_ms
    )
}
