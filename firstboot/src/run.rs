//! The run flow of one boot: config → metadata → write → start-kubelet → wait-healthy →
//! wait-joined, each phase reported to the [`Reporter`] as it begins and ends; a wait that
//! fails ends with a diagnosis of kubelet's and containerd's state and logs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cli::Options;
use crate::config::{self, Config, Credential};
use crate::contract::paths::{self, NodePaths};
use crate::contract::{JoinMode, Provider};
use crate::error::Error;
use crate::fsutil;
use crate::http::Client;
use crate::kubelet_env::{self, Node};
use crate::netaddr::{self, IpFamily, Offered};
use crate::provider::detect::{self, Detected, Dmi};
use crate::provider::{self, Context, ReportTarget};
use crate::redact::{self, Collected, Secrets};
use crate::reporter::{Phase, Reporter};
use crate::service::{self, ToolError};
use crate::sizing::{self, Sizing};
use crate::Reason;

/// Runs one boot and returns the process exit code.
pub fn run(opts: &Options) -> u8 {
    let started = Instant::now();
    let paths = NodePaths::under(&opts.root);
    let mut rep = Reporter::new(&paths, opts.console.clone());
    // What the metadata phase saw of the service's clock, handed to the doctor below.
    let mut date_seen = None;
    let result = boot(opts, &paths, &mut rep, started, &mut date_seen);
    if let Err(e) = &result {
        if e.reason() != Reason::Usage {
            // What broke is often visible before kubelet says so: the doctor's findings go
            // into status.json and onto the console (bounded: 2 s per network check).
            // It gets what this run resolved instead of working it out again from node.env:
            // the metadata service's `Date` the run saw, so its clock check sends nothing.
            let mut d = crate::doctor::Options::new(&opts.root);
            d.metadata_url = opts.metadata_url.clone();
            d.date_seen = date_seen;
            d.timeout = Duration::from_secs(2);
            // The clock is read from the metadata service only when this run already talked
            // to it: a run that stopped before (an unknown platform, a broken config) must
            // not reach out to an address it never chose.
            d.clock = rep.phases().iter().any(|p| {
                p.phase == Phase::Metadata && p.result == crate::reporter::PhaseResult::Success
            });
            rep.doctor(&crate::doctor::run(&d));
        }
    }
    rep.finish();
    match result {
        Ok(()) => 0,
        Err(e) => {
            let mut text = format!("kiln-firstboot: {e}");
            let hint = e.reason().hint();
            if !hint.is_empty() {
                text.push_str("\nkiln-firstboot: hint: ");
                text.push_str(hint);
            }
            redact::eprint(&rep.redactor().redact(&text));
            e.reason().exit_code()
        }
    }
}

/// Records a phase's failure and hands the error on.
fn fail(rep: &mut Reporter, phase: Phase, e: Error) -> Error {
    rep.failure(phase, e.reason(), e.message());
    e
}

fn boot(
    opts: &Options,
    paths: &NodePaths,
    rep: &mut Reporter,
    started: Instant,
    date_seen: &mut Option<crate::http::DateSeen>,
) -> Result<(), Error> {
    rep.begin(Phase::Config);
    // The redactor learns each secret as soon as it is read, even when the phase then fails.
    let mut secrets = Secrets::default();
    let loaded = config::load_with_secrets(paths, opts.deadline, &mut secrets);
    rep.add_secrets(&secrets);
    let cfg = loaded.map_err(|e| fail(rep, Phase::Config, e))?;
    // The deadline counts from process start, so time spent reading config is included.
    // An absurd deadline (u64::MAX seconds) must not overflow the clock; a year is forever here.
    let deadline = started
        .checked_add(Duration::from_secs(cfg.deadline_secs))
        .unwrap_or(started + Duration::from_secs(365 * 24 * 3600));
    rep.success(Phase::Config, "");

    rep.begin(Phase::Metadata);
    // `--metadata-url` beats node.env's METADATA_URL; a name stands for its URL.
    let base_url = opts
        .metadata_url
        .as_deref()
        .or(cfg.node.metadata_url.as_deref())
        .map(|u| provider::named_endpoint(u).unwrap_or(u).to_string());
    let found = Collected::default();
    let node = metadata(
        opts,
        &cfg,
        deadline,
        base_url.as_deref(),
        rep,
        &found,
        date_seen,
    );
    rep.add_secrets(&found.take());
    let (node, lifecycle) = node.map_err(|e| fail(rep, Phase::Metadata, e))?;
    rep.identity(node.provider.name(), &node.node_name, cfg.image_id());
    let metadata_url = base_url.clone();
    rep.set_report_back(
        node.provider,
        ReportTarget {
            root: opts.root.clone(),
            base_url,
            rpctool: PathBuf::from(&opts.rpctool),
        },
    );
    rep.success(Phase::Metadata, &format!("provider={}", node.provider));

    rep.begin(Phase::Write);
    let sized = size(paths, &cfg, &node);
    rep.sizing(&sized);
    let proxy_changed =
        write(paths, &cfg, &node, &sized).map_err(|e| fail(rep, Phase::Write, e))?;
    if let Some(w) = kubelet_env::kubeadm_patch_unused(paths, &cfg) {
        rep.warn(&w);
    }
    apply_sysctls(paths, &cfg, rep);
    let mut detail = format!("max_pods={}", sized.max_pods.value);
    if !cfg.sysctl.is_empty() {
        detail.push_str(" sysctl=");
        detail.push_str(&cfg.sysctl.len().to_string());
    }
    // The swap file: its outcome in the phase's detail; a failure is a warning, not a stop
    // (kubelet runs without swap).
    #[cfg(target_os = "linux")]
    if let Some(bytes) = cfg.node.swap_file_size {
        detail.push_str(" swap=");
        match crate::swap::ensure(&paths.root, bytes) {
            Ok(how) => detail.push_str(how),
            Err(e) => {
                detail.push_str("failed");
                rep.warn(&format!("swap file not on: {e}"));
            }
        }
    }
    rep.success(Phase::Write, &detail);

    if opts.no_start {
        for phase in [Phase::StartKubelet, Phase::WaitHealthy, Phase::WaitJoined] {
            rep.skipped(phase, "no-start");
        }
        return Ok(());
    }
    rep.begin(Phase::StartKubelet);
    if proxy_changed {
        restart_containerd(opts, &cfg, deadline).map_err(|e| fail(rep, Phase::StartKubelet, e))?;
    }
    let deadline = match lifecycle {
        Some(state) => warm_pool(opts, &cfg, metadata_url.as_deref(), rep, deadline, state),
        None => deadline,
    };
    let via = start(opts, paths, &cfg, deadline).map_err(|e| fail(rep, Phase::StartKubelet, e))?;
    rep.success(Phase::StartKubelet, via);

    crate::joined::wait(opts, paths, &cfg, rep, deadline)
}

/// How often a node in an AWS warm pool asks whether it is in service.
const WARM_POLL: Duration = Duration::from_secs(5);

/// AWS Auto Scaling warm pools (docs/contract.md, "Warm pools"): `state` is what the metadata
/// phase read (with its token, in its batch). While IMDS's target lifecycle state is `Warmed:*`, the node is prepared (everything written, sysctls and swap applied,
/// containerd restarted for the node's settings, the baked images imported) and kubelet is
/// held back: a warmed instance must not join. Then it asks every [`WARM_POLL`] until the state
/// leaves `Warmed:*` (a `Warmed:Stopped` or `Hibernated` instance is stopped meanwhile, and its
/// next boot finds `InService`). Returns the deadline to go on with: a fresh one after a wait,
/// since the time in the pool is not the join's. A state that cannot be read is a warning, and
/// the node joins: guessing "warmed" could keep a node out for good.
fn warm_pool(
    opts: &Options,
    cfg: &Config,
    base_url: Option<&str>,
    rep: &mut Reporter,
    deadline: Instant,
    state: Result<String, String>,
) -> Instant {
    let mut token = None;
    let mut ask = |rep: &mut Reporter, until: Instant| {
        let client = Client::new(until);
        let found = Collected::default();
        let cx = Context {
            root: &opts.root,
            base_url,
            client: &client,
            rpctool: &opts.rpctool,
            api_server: &cfg.node.api_server,
            cluster: &cfg.node.cluster_name,
            ip_family: cfg.node.ip_family,
            secrets: &found,
        };
        let state = provider::aws::target_lifecycle_state(&cx, &mut token);
        rep.add_secrets(&found.take());
        state
    };
    let mut state = match state {
        Ok(s) => s,
        Err(e) => {
            rep.warn(&format!(
                "warm pool: target lifecycle state not read ({e}); joining"
            ));
            return deadline;
        }
    };
    if !state.starts_with("Warmed:") {
        return deadline;
    }
    let images = Path::new(paths::SYSTEMD_UNIT_DIR).join(paths::IMAGES_UNIT);
    if paths::under(&opts.root, &images.to_string_lossy()).exists() {
        // Imported now, so a warmed node starts with its images; a failure is the unit's.
        let _ = service::run(&opts.systemctl, &["start", paths::IMAGES_UNIT], deadline);
    }
    rep.warn_now(&format!(
        "warm pool: target lifecycle state {state}: node prepared, kubelet held until the instance is in service"
    ));
    let started = Instant::now();
    let mut unread = false;
    while state.starts_with("Warmed:") {
        std::thread::sleep(WARM_POLL);
        match ask(rep, Instant::now() + Duration::from_secs(10)) {
            Ok(s) => state = s,
            Err(e) if !unread => {
                unread = true;
                rep.warn(&format!(
                    "warm pool: target lifecycle state not read ({}); asking again",
                    e.message()
                ));
            }
            Err(_) => {}
        }
    }
    rep.warn(&format!(
        "warm pool: target lifecycle state {state} after {} s: joining",
        started.elapsed().as_secs()
    ));
    Instant::now() + Duration::from_secs(cfg.deadline_secs)
}

/// The provider `PROVIDER=auto` stands for, from DMI. Finding none is a warning, never
/// silent; a known cloud's marker without its full rule, or a cloud kiln has no source for,
/// stops the boot: guessing `none` there would join a node without its cloud identity.
fn detected(root: &Path, rep: &mut Reporter) -> Result<Provider, Error> {
    let dmi = Dmi::read(root);
    let stop = |m: String| Error::metadata(Reason::ProviderUnknown, m);
    match detect::detect(&dmi) {
        Detected::Provider(p) => Ok(p),
        Detected::Nothing => {
            rep.warn(&format!(
                "PROVIDER=auto found no known platform in DMI ({}): running as provider none, with no instance identity; set PROVIDER in {} to say which",
                dmi.describe(),
                paths::NODE_ENV
            ));
            Ok(Provider::None)
        }
        Detected::Unsupported { cloud, rule } => Err(stop(format!(
            "PROVIDER=auto: DMI names {cloud} ({rule}; {}), which kiln has no metadata source for; set PROVIDER=none in {} to boot from node.env alone",
            dmi.describe(),
            paths::NODE_ENV
        ))),
        Detected::Partial { cloud, markers } => Err(stop(format!(
            "PROVIDER=auto: DMI carries {cloud}'s markers ({}) without matching its rule in full ({}); set PROVIDER in {} to this cloud's provider, or to none if it is not {cloud}",
            markers.join(", "),
            dmi.describe(),
            paths::NODE_ENV
        ))),
    }
}

/// Asks the chosen metadata source and applies node.env's overrides.
/// Secrets the source is handed (a session token) are noted in `secrets`; the newest `Date`
/// its answers carried goes to `date_seen`, whether or not the phase succeeds.
fn metadata(
    opts: &Options,
    cfg: &Config,
    deadline: Instant,
    base_url: Option<&str>,
    rep: &mut Reporter,
    secrets: &Collected,
    date_seen: &mut Option<crate::http::DateSeen>,
) -> Result<(Node, Option<Result<String, String>>), Error> {
    // `auto` (no provider) is detected from DMI; `--provider` beats node.env.
    let name = match opts.provider.unwrap_or(cfg.node.provider) {
        Some(p) => p,
        None => detected(&opts.root, rep)?,
    };
    let source = provider::source(name);
    let client = Client::new(deadline);
    let api_server = cfg.node.api_server.as_str();
    let cx = Context {
        root: &opts.root,
        base_url,
        client: &client,
        rpctool: &opts.rpctool,
        api_server,
        cluster: &cfg.node.cluster_name,
        ip_family: cfg.node.ip_family,
        secrets,
    };
    let md = source.fetch(&cx);
    *date_seen = client.date_seen();
    let md = md?;
    let offered = Offered::from_candidates(&md.addresses);
    for r in &offered.refused {
        rep.warn(&format!("provider {name}: {r}"));
    }
    let node_ip = match &cfg.node.node_ip {
        Some(ip) => ip.clone(),
        None => {
            // Resolving the API server's name is only worth it when the metadata does not
            // settle the family by itself.
            let dual = cfg.node.ip_family == Some(IpFamily::Dual);
            let api =
                if dual || (cfg.node.ip_family.is_none() && netaddr::needs_api_family(&offered)) {
                    provider::api_family(api_server)
                } else {
                    netaddr::literal_family(api_server)
                };
            let family = cfg
                .node
                .ip_family
                .unwrap_or_else(|| netaddr::default_family(&offered, api));
            netaddr::node_ip(family, &offered, api, || {
                provider::route_ip(api_server).map_err(|e| e.message().to_string())
            })
            .map_err(|m| {
                Error::metadata(
                    Reason::MetadataInvalid,
                    format!(
                        "provider {name}: node address: {m}; set NODE_IP in {}",
                        paths::NODE_ENV
                    ),
                )
            })?
        }
    };
    let node_name = match &cfg.node.node_name {
        Some(n) => n.clone(),
        None => kubelet_env::metadata_node_name(&md.hostname, &md.instance_id).map_err(|why| {
            Error::metadata(
                Reason::MetadataInvalid,
                format!(
                    "provider {name}: {why}; set NODE_NAME in {}",
                    paths::NODE_ENV
                ),
            )
        })?,
    };
    let node = Node {
        provider: name,
        node_name,
        node_ip,
        instance_id: md.instance_id,
        instance_type: md.instance_type,
        zone: md.zone,
        region: md.region,
        provider_id: md.provider_id,
    };
    Ok((node, md.lifecycle_state))
}

/// Decides max pods and the reservations from the image's settings, the instance type and the
/// machine under `--root`.
fn size(paths: &NodePaths, cfg: &Config, node: &Node) -> Sizing {
    let machine = sizing::read_machine(&paths.root);
    let table = sizing::read_table(&paths.aws_eni_table, cfg.sizing.mode);
    let machine = machine.as_ref().map(|m| *m).map_err(String::as_str);
    sizing::decide(
        &cfg.sizing,
        cfg.sizing_inputs(&node.instance_type, machine, table.as_deref()),
    )
}

/// Writes the bootstrap kubeconfig (token mode), containerd's proxy environment and
/// kubelet.env, each atomically. Returns whether containerd's environment changed: it was
/// started before this run (kiln-firstboot.service is `After=containerd.service`), so it only
/// sees a new proxy once restarted.
fn write(paths: &NodePaths, cfg: &Config, node: &Node, sized: &Sizing) -> Result<bool, Error> {
    let put = |full: &Path, data: &str, mode: u32| {
        fsutil::write_atomic(full, data.as_bytes(), mode)
            .map_err(|e| Error::write(format!("writing {}: {e}", full.display())))
    };
    if let Credential::Token(token) = &cfg.credential {
        put(
            &paths.run_bootstrap_kubeconfig,
            &kubelet_env::bootstrap_kubeconfig(cfg, token),
            0o600,
        )?;
    }
    // Windows: containerd's environment is the service's own (docs/windows.md), not this file.
    let wanted = if cfg!(windows) {
        None
    } else {
        kubelet_env::containerd_env(cfg)
    };
    let remove = |p: &Path| {
        fsutil::remove_file(p).map_err(|e| Error::write(format!("removing {}: {e}", p.display())))
    };
    let had = std::fs::read_to_string(&paths.containerd_env).ok();
    let changed = wanted != had;
    if changed {
        match &wanted {
            Some(text) => put(&paths.containerd_env, text, 0o644)?,
            None => remove(&paths.containerd_env)?,
        }
    }
    if cfg.node.join_mode == JoinMode::Kubeadm {
        // Read by `kubeadm join` through the JoinConfiguration's `patches.directory`.
        put(
            &paths.kubeadm_kubelet_patch,
            &kubelet_env::kubeadm_kubelet_patch(cfg, node, sized),
            0o644,
        )?;
    }
    // kubelet's --config-dir (kubelet refuses a missing one): the node's own drop-in in
    // kubelet mode (kubeadm's patch carries those fields), then the provisioned one.
    let (node_dropin, provisioned) = (
        &paths.kubelet_node_dropin,
        &paths.kubelet_provisioned_dropin,
    );
    if let Some(dir) = node_dropin.parent() {
        fsutil::real_dir(dir, true)
            .map_err(|e| Error::write(format!("creating {}: {e}", dir.display())))?;
    }
    if cfg.node.join_mode == JoinMode::Kubelet {
        put(
            node_dropin,
            &kubelet_env::node_dropin(cfg, node, sized),
            0o644,
        )?;
    } else {
        remove(node_dropin)?;
    }
    match &cfg.kubelet_dropin {
        Some(text) => put(provisioned, text, 0o644)?,
        None => remove(provisioned)?,
    }
    put(
        &paths.kubelet_env,
        &kubelet_env::render(cfg, node, sized),
        0o644,
    )?;
    Ok(changed)
}

/// Writes `/etc/kiln/sysctl.conf`'s settings to `/proc/sys` (under `--root`), before kubelet
/// starts. A value the kernel refuses (a module not loaded, a read-only setting) is a
/// warning, not a stop, as systemd-sysctl treats it; each outcome goes to status.json.
fn apply_sysctls(paths: &NodePaths, cfg: &Config, rep: &mut Reporter) {
    if cfg.sysctl.is_empty() {
        return;
    }
    let proc_sys = paths::under(&paths.root, "/proc/sys");
    let mut applied = Vec::with_capacity(cfg.sysctl.len());
    for (k, v) in &cfg.sysctl {
        let file = proc_sys.join(crate::contract::sysctl::proc_path(k));
        // Never created: a name the kernel lacks stays missing. procfs ignores O_TRUNC.
        let wrote = std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&file)
            .and_then(|mut f| std::io::Write::write_all(&mut f, &[v.as_bytes(), b"\n"].concat()));
        let err = wrote.err().map(|e| format!("{}: {e}", file.display()));
        applied.push((k.as_str(), v.as_str(), err));
    }
    rep.sysctl(&applied);
}

/// Restarts the container runtime so it reads `/run/kiln/containerd.env` before kubelet (or
/// kubeadm) can make it pull anything. Blocking: kubeadm's preflight needs the socket back,
/// and neither job is ordered after this unit, so waiting cannot deadlock. The layer's image
/// import (`kiln-images.service`, which firstboot is not ordered after) is started and waited
/// for first: a restart in the middle of `ctr images import` would fail the import.
fn restart_containerd(opts: &Options, cfg: &Config, deadline: Instant) -> Result<(), Error> {
    if cfg!(windows) {
        // Windows: C:\k\containerd\containerd.env, set by `kiln-firstboot.exe install`.
        return Ok(());
    }
    let images_unit = Path::new(paths::SYSTEMD_UNIT_DIR).join(paths::IMAGES_UNIT);
    if paths::under(&opts.root, &images_unit.to_string_lossy()).exists() {
        // Its failure is its own to report (on the console, as kubelet's ordering has it);
        // an import that failed has nothing left for the restart to cut short.
        let _ = service::run(&opts.systemctl, &["start", paths::IMAGES_UNIT], deadline);
    }
    systemctl(
        opts,
        &["restart", &cfg.image.containerd_unit],
        deadline,
        &format!(
            "restarting {} for the node's proxy or containerd configuration in /etc/kiln",
            cfg.image.containerd_unit
        ),
    )
}

/// Runs `systemctl ARGS` to its end; a failure is `START_FAILED`, its message led by `what`.
fn systemctl(opts: &Options, args: &[&str], deadline: Instant, what: &str) -> Result<(), Error> {
    service::run(&opts.systemctl, args, deadline)
        .map(drop)
        .map_err(|e| Error::start(Reason::StartFailed, format!("{what}: {}", e.message())))
}

/// Starts kubelet through the service manager, or joins with kubeadm first; says how
/// (the start-kubelet phase's detail: `via=kubeadm`, `via=bus`, `via=systemctl`).
fn start(
    opts: &Options,
    paths: &NodePaths,
    cfg: &Config,
    deadline: Instant,
) -> Result<&'static str, Error> {
    let joined = paths.kubeadm_kubelet_conf.exists();
    if cfg.node.join_mode == JoinMode::Kubeadm && !joined {
        let join = paths.kubeadm_join.to_string_lossy();
        // kubeadm's preflight refuses a container runtime that is not running (its CRI
        // check), and firstboot is not ordered after containerd: a blocking start waits for
        // it (containerd is not ordered after firstboot, so this cannot deadlock).
        if !cfg!(windows) {
            systemctl(
                opts,
                &["start", &cfg.image.containerd_unit],
                deadline,
                &format!("starting {} before kubeadm join", cfg.image.containerd_unit),
            )?;
        }
        // kubeadm join starts kubelet itself through systemd.
        return crate::kubeadm::join(&opts.kubeadm, &join, paths, deadline).map(|_| "via=kubeadm");
    }
    if cfg!(windows) {
        return crate::windows_kubelet::start_kubelet_service(opts, paths, cfg)
            .map(|_| "via=service-control-manager");
    }
    // On the node itself, queue the start job over systemd's private socket: the same call
    // `systemctl start --no-block` makes, without starting a systemctl process (most of this
    // phase's time on a slow CPU). Anything short of systemd's own answer falls back to
    // systemctl; systemd refusing the start is the answer.
    #[cfg(unix)]
    if opts.root == Path::new("/") && opts.systemctl == crate::cli::DEFAULT_SYSTEMCTL {
        use crate::systemd_bus::{start_unit, BusError, PRIVATE_SOCKET};
        match start_unit(Path::new(PRIVATE_SOCKET), &cfg.image.kubelet_unit, deadline) {
            Ok(()) => return Ok("via=bus"),
            Err(BusError::Refused(name, message)) => {
                return Err(Error::start(
                    Reason::StartFailed,
                    format!(
                        "systemd refused to start {}: {name}: {message}",
                        cfg.image.kubelet_unit
                    ),
                ))
            }
            Err(BusError::Unavailable(_)) => {}
        }
    }
    // --no-block: firstboot runs as a systemd unit; waiting for the start job from inside
    // another unit's start job can deadlock on ordering, and the waits come after this.
    service::run(
        &opts.systemctl,
        &["start", "--no-block", &cfg.image.kubelet_unit],
        deadline,
    )
    .map(|_| "via=systemctl")
    .map_err(|e| {
        let message = match e {
            ToolError::Spawn(m) | ToolError::Failed(m) | ToolError::Timeout(m) => m,
        };
        Error::start(Reason::StartFailed, message)
    })
}
