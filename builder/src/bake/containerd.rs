//! containerd's files in a layer: its `config.toml` (Linux and Windows), the image's
//! per-registry `hosts.toml`, and the Windows service environment. Pure functions of the
//! image definition and containerd's version (docs/bake.md, docs/contract.md "Registries" and
//! "containerd configuration").

use std::fmt::Write as _;

use kiln_firstboot::contract::paths;

use crate::image_def::{CgroupDriver, ImageDef, Os, Registry};

/// Where containerd reads the image's per-registry `hosts.toml` files on the node.
pub const CERTS_DIR: &str = "/usr/lib/kiln/containerd/certs.d";
/// The node's own, from node.toml's `[[containerd.registry]]`: first in `config_path`, so it
/// wins for the registries it has (docs/contract.md, "Registries").
pub const PROVISIONED_CERTS_DIR: &str = "/etc/kiln/containerd/certs.d";
/// The same on Windows (`C:\ProgramData\kiln`, "Windows paths").
pub const WINDOWS_PROVISIONED_CERTS_DIR: &str = r"C:\ProgramData\kiln\containerd\certs.d";

/// The directory of the node's containerd settings that the image's config imports.
pub const NODE_CONF_D: &str = paths::CONTAINERD_CONF_D;

/// containerd's `config.toml`. containerd 2.x reads config version 3 (new CRI plugin
/// names); 1.x reads version 2; the layer's containerd version decides. `sandbox` is the
/// sandbox image as [`crate::bake::images::sandbox_image`] resolved it (pinned by digest
/// when the layer bakes it).
pub fn containerd_config(
    def: &ImageDef,
    containerd_version: Option<&str>,
    sandbox: &str,
) -> String {
    let systemd = def.kubernetes.cgroup_driver == CgroupDriver::Systemd;
    let major = containerd_major(containerd_version);
    if major >= 2 {
        format!(
            "\
# Written by kiln bake for containerd {ver} (config version 3).
version = 3
# The node's own settings from node.toml's [containerd.config], merged over these
# (docs/contract.md, 'containerd configuration'); a glob, so no file is no error.
imports = ['{NODE_CONF_D}/*.toml']
# Snapshotters this node never uses (the CRI plugin's is overlayfs): skipping them spares
# containerd's start their probes.
disabled_plugins = ['io.containerd.snapshotter.v1.btrfs', 'io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.zfs']

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  # The CRI pull that reads every directory of config_path (docs/contract.md, 'Registries').
  use_local_image_pull = true

  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{sandbox}'

  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = '{PROVISIONED_CERTS_DIR}:{CERTS_DIR}'

[plugins.'io.containerd.cri.v1.runtime'.cni]
  {bin}
  conf_dir = '/etc/cni/net.d'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'

  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = '/usr/bin/runc'
    SystemdCgroup = {systemd}
",
            ver = containerd_version.unwrap_or("2.x"),
            bin = cni_bin_line(containerd_version, "/usr/libexec/cni"),
        )
    } else {
        format!(
            "\
# Written by kiln bake for containerd {ver} (config version 2).
version = 2
# The node's own settings from node.toml's [containerd.config], merged over these
# (docs/contract.md, 'containerd configuration'); a glob: containerd 1.x refuses a missing
# file named outright, but not a pattern that matches nothing.
imports = ['{NODE_CONF_D}/*.toml']
# Snapshotters this node never uses (the CRI plugin's is overlayfs): skipping them spares
# containerd's start their probes (aufs's is a `modprobe aufs` process on every start).
disabled_plugins = ['io.containerd.snapshotter.v1.aufs', 'io.containerd.snapshotter.v1.btrfs', 'io.containerd.snapshotter.v1.devmapper', 'io.containerd.snapshotter.v1.zfs']

[plugins.'io.containerd.grpc.v1.cri']
  sandbox_image = '{sandbox}'

  [plugins.'io.containerd.grpc.v1.cri'.cni]
    bin_dir = '/usr/libexec/cni'
    conf_dir = '/etc/cni/net.d'

  [plugins.'io.containerd.grpc.v1.cri'.containerd]
    snapshotter = 'overlayfs'

    [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'

      [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.runc.options]
        BinaryName = '/usr/bin/runc'
        SystemdCgroup = {systemd}

  [plugins.'io.containerd.grpc.v1.cri'.registry]
    config_path = '{PROVISIONED_CERTS_DIR}:{CERTS_DIR}'
",
            ver = containerd_version.unwrap_or("1.x"),
        )
    }
}

/// Where containerd's files are in the Windows layer: `C:\k\containerd`. containerd.exe
/// reads `config.toml` there because kiln-firstboot registers its service with `--config`.
pub const WINDOWS_CONTAINERD_DIR: &str = r"C:\k\containerd";
/// containerd's own data and state on Windows (its defaults, and what image-builder uses).
const WINDOWS_CONTAINERD_ROOT: &str = r"C:\ProgramData\containerd\root";
const WINDOWS_CONTAINERD_STATE: &str = r"C:\ProgramData\containerd\state";
/// CNI plugins and their config on Windows (kubelet's old Windows defaults, which
/// sig-windows-tools and CNI installers such as Calico's and flannel's use).
pub const WINDOWS_CNI_BIN_DIR: &str = r"C:\k\cni\bin";
/// See [`WINDOWS_CNI_BIN_DIR`].
pub const WINDOWS_CNI_CONF_DIR: &str = r"C:\k\cni\config";
/// The runtime handler every Windows pod gets: process-isolated Windows containers.
const WINDOWS_RUNTIME: &str = "runhcs-wcow-process";

/// The CNI binaries line of a config version 3: containerd 2.1 replaced `bin_dir` (a string)
/// with `bin_dirs` (a list); 2.0 knows only `bin_dir` and would ignore `bin_dirs`.
fn cni_bin_line(containerd_version: Option<&str>, dir: &str) -> String {
    let minor = containerd_version
        .and_then(|v| v.trim_start_matches('v').split('.').nth(1))
        .and_then(|m| m.parse::<u32>().ok());
    match (containerd_major(containerd_version), minor) {
        (2, Some(0)) => format!("bin_dir = '{dir}'"),
        _ => format!("bin_dirs = ['{dir}']"),
    }
}

pub(crate) fn containerd_major(containerd_version: Option<&str>) -> u32 {
    containerd_version
        .and_then(|v| v.trim_start_matches('v').split('.').next())
        .and_then(|m| m.parse::<u32>().ok())
        .unwrap_or(2)
}

/// containerd's `config.toml` for Windows (`C:\k\containerd\config.toml`): the `windows`
/// snapshotter, the `io.containerd.runhcs.v1` runtime, no cgroup driver (Windows has no
/// cgroups), the named-pipe endpoint kubelet's config names, CNI under `C:\k\cni`, and
/// registries under `C:\k\containerd\certs.d`. Config version 3 for containerd 2.x, 2 for
/// 1.x. Paths are TOML literal strings, so backslashes stay as they are.
pub fn containerd_config_windows(def: &ImageDef, containerd_version: Option<&str>) -> String {
    let sandbox = &def.containerd.sandbox_image;
    let head = |v: u32, default_ver: &str| {
        format!(
            "\
# Written by kiln bake for containerd {ver} on Windows (config version {v}).
# containerd.exe reads it through --config (see kiln-firstboot install, docs/windows.md).
version = {v}
root = '{WINDOWS_CONTAINERD_ROOT}'
state = '{WINDOWS_CONTAINERD_STATE}'

[grpc]
  address = '\\\\.\\pipe\\containerd-containerd'
",
            ver = containerd_version.unwrap_or(default_ver),
        )
    };
    if containerd_major(containerd_version) >= 2 {
        format!(
            "\
{head}
[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'windows'
  # The CRI pull that reads every directory of config_path (docs/contract.md, 'Registries').
  use_local_image_pull = true

  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = '{sandbox}'

  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = '{WINDOWS_PROVISIONED_CERTS_DIR};{WINDOWS_CONTAINERD_DIR}\\certs.d'

[plugins.'io.containerd.cri.v1.runtime'.cni]
  {bin}
  conf_dir = '{WINDOWS_CNI_CONF_DIR}'

[plugins.'io.containerd.cri.v1.runtime'.containerd]
  default_runtime_name = '{WINDOWS_RUNTIME}'

  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.{WINDOWS_RUNTIME}]
    runtime_type = 'io.containerd.runhcs.v1'
",
            head = head(3, "2.x"),
            bin = cni_bin_line(containerd_version, WINDOWS_CNI_BIN_DIR),
        )
    } else {
        format!(
            "\
{head}
[plugins.'io.containerd.grpc.v1.cri']
  sandbox_image = '{sandbox}'

  [plugins.'io.containerd.grpc.v1.cri'.cni]
    bin_dir = '{WINDOWS_CNI_BIN_DIR}'
    conf_dir = '{WINDOWS_CNI_CONF_DIR}'

  [plugins.'io.containerd.grpc.v1.cri'.containerd]
    snapshotter = 'windows'
    default_runtime_name = '{WINDOWS_RUNTIME}'

    [plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.{WINDOWS_RUNTIME}]
      runtime_type = 'io.containerd.runhcs.v1'

  [plugins.'io.containerd.grpc.v1.cri'.registry]
    config_path = '{WINDOWS_PROVISIONED_CERTS_DIR};{WINDOWS_CONTAINERD_DIR}\\certs.d'
",
            head = head(2, "1.x"),
        )
    }
}

/// The directory name of a registry under `certs.d`. containerd looks for `host_port_`
/// before `host:port` on every OS; Windows file names cannot hold `:`, so the Windows layer
/// uses the first spelling.
pub fn certs_dir_name(host: &str, os: Os) -> String {
    match (os, host.rsplit_once(':')) {
        (Os::Windows, Some((h, port))) if !h.is_empty() => format!("{h}_{port}_"),
        _ => host.to_string(),
    }
}

/// The proxy settings as `KEY=VALUE` lines for containerd's Windows service environment
/// (`C:\k\containerd\containerd.env`; kiln-firstboot install reads it), or `None`
/// without `[containerd.proxy]`.
pub fn containerd_env_windows(def: &ImageDef) -> Option<String> {
    let p = def.containerd.proxy.as_ref()?;
    let mut s = String::from(
        "# Written by kiln bake from [containerd.proxy]: containerd's service environment.\n",
    );
    for (k, v) in [
        ("HTTP_PROXY", &p.http),
        ("HTTPS_PROXY", &p.https),
        ("NO_PROXY", &p.no_proxy),
    ] {
        if let Some(v) = v {
            let _ = writeln!(s, "{k}={v}");
        }
    }
    Some(s)
}

/// A TOML basic string: quotes and backslashes escaped (Windows CA paths).
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// One registry's `hosts.toml`. `ca_files` are the node paths of its CA files.
pub fn hosts_toml(reg: &Registry, ca_files: &[String]) -> String {
    let server = reg
        .server
        .clone()
        .unwrap_or_else(|| match reg.host.as_str() {
            // Docker Hub's API lives on another name than its image references use.
            "docker.io" => "https://registry-1.docker.io".into(),
            h => format!("https://{h}"),
        });
    let mut s = format!(
        "# Written by kiln bake from [[containerd.registry]] host = \"{}\".\nserver = \"{server}\"\n",
        reg.host
    );
    let ca = if ca_files.is_empty() {
        String::new()
    } else {
        let list: Vec<String> = ca_files.iter().map(|c| toml_str(c)).collect();
        format!("  ca = [{}]\n", list.join(", "))
    };
    for m in &reg.mirrors {
        let _ = write!(
            s,
            "\n[host.\"{m}\"]\n  capabilities = [\"pull\", \"resolve\"]\n{ca}"
        );
    }
    if !ca.is_empty() {
        let _ = write!(
            s,
            "\n[host.\"{server}\"]\n  capabilities = [\"pull\", \"resolve\"]\n{ca}"
        );
    }
    s
}
