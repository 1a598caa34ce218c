//! node.toml's `[containerd.config]` (or `containerd.config_file`): a containerd config
//! fragment that the image's containerd merges over its own through `imports`
//! (`/etc/kiln/containerd/conf.d/provisioned.toml`; docs/contract.md, "containerd
//! configuration").
//!
//! How containerd merges an import, measured with Debian's containerd 2.1.9 and 1.6.20
//! (`containerd --config main.toml config dump`; containerd's
//! `cmd/containerd/server/config/config.go`, `LoadConfig` and `mergeConfig`): a top-level
//! value replaces the image's and lists such as `disabled_plugins` are appended to, in both.
//! A plugin's table is where they differ: containerd 2.x merges it key by key (a fragment
//! that sets `max_concurrent_downloads` keeps the image's sandbox image and registry
//! directories), containerd 1.x *replaces the whole table* with the fragment's (the same
//! fragment on 1.6.20 put the CRI plugin back to its defaults: `SystemdCgroup = false`,
//! `sandbox_image = "registry.k8s.io/pause:3.6"`, `config_path = ""`). So a version-2
//! fragment may not touch the CRI plugin the image configures. containerd 2.x migrates a
//! version-2 fragment; containerd 1.x reads a version-3 one without a word but ignores
//! whatever it sets for plugins 1.x does not have (the version-3 CRI names
//! `io.containerd.cri.v1.*`), so kiln-firstboot checks the version against the image's at
//! boot (image.env `CONTAINERD_CONFIG_VERSION`).
//! containerd only warns about a key it does not know (`Ignoring unknown key in TOML for
//! plugin`), so this module does not try to know containerd's schema: it refuses what would
//! take from the node what the image and the rest of node.toml set, each with where it is set.

use toml::{Table, Value};

/// The largest fragment kiln writes (and kiln-firstboot reads).
pub const MAX_BYTES: usize = 64 * 1024;

/// Why a fragment is refused: the node.toml key (with the path inside the fragment), what was
/// expected and what was found.
#[derive(Debug, PartialEq, Eq)]
pub struct Refusal {
    /// `containerd.config.plugins."…".…`.
    pub key: String,
    /// What was expected.
    pub expected: String,
    /// What was found.
    pub found: String,
}

/// containerd 1.x's CRI plugin (config version 2).
const CRI_V2: &str = "io.containerd.grpc.v1.cri";
/// containerd 2.x's CRI image and runtime plugins (config version 3).
const IMAGES_V3: &str = "io.containerd.cri.v1.images";
const RUNTIME_V3: &str = "io.containerd.cri.v1.runtime";

/// Checks `table` (from node.toml key `key`) and returns its config version and the file
/// kiln writes: a header, `version = N` first (the line kiln-firstboot checks), then the rest
/// as TOML.
pub fn render(key: &str, table: &Table) -> Result<(u32, String), Refusal> {
    let refuse = |at: &str, expected: &str, found: String| Refusal {
        key: format!("{key}{at}"),
        expected: expected.to_string(),
        found,
    };
    // containerd's TOML decoders match keys without regard to case (go-toml; 1.x also tries the
    // all-capitals form), so `IMPORTS` is `imports` to it: two keys of one table that differ
    // only in case are refused, and every rule below compares keys that way.
    if let Some(path) = case_twins(table, "") {
        return Err(refuse(
            &path,
            "each key once: containerd matches keys without regard to case",
            "two keys that differ only in case".into(),
        ));
    }
    let version = match table.get("version") {
        Some(Value::Integer(v @ (2 | 3))) => *v as u32,
        Some(v) => {
            return Err(refuse(
                ".version",
                "2 (containerd 1.x) or 3 (containerd 2.x), the config version of the image's containerd",
                v.to_string(),
            ))
        }
        None => {
            return Err(refuse(
                ".version",
                "`version = 3` for containerd 2.x or `version = 2` for 1.x: containerd reads a \
                 fragment without one as version 1",
                "no version".into(),
            ))
        }
    };
    let lookup = |path: &[&str]| {
        lookup(table, path).map_err(|at| {
            refuse(
                &format!(".{at}"),
                "a table (containerd refuses to start on an array of tables there)",
                "an array or a value".into(),
            )
        })
    };
    if version == 2 && lookup(&["plugins", CRI_V2])?.is_some() {
        return Err(refuse(
            &format!(".plugins.{CRI_V2:?}"),
            "no table of the CRI plugin in a version-2 fragment: containerd 1.x replaces a \
             plugin's whole table with an import's, which would drop the image's cgroup driver, \
             sandbox image and registry directories; set it in the image definition",
            "set".into(),
        ));
    }
    let images = ["plugins", IMAGES_V3];
    let runtime = ["plugins", RUNTIME_V3];
    let runc_options = ["containerd", "runtimes", "runc", "options", "SystemdCgroup"];
    let mut owned: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["imports"],
            "no imports: containerd would read files kiln never checked; put the settings here",
        ),
        (
            vec!["grpc", "address"],
            "the image's socket: kubelet's containerRuntimeEndpoint (image.env CONTAINER_RUNTIME_ENDPOINT) names it",
        ),
    ];
    for (field, why) in [
        (
            "config_path",
            "the image's registry directories: set registries with [[containerd.registry]]",
        ),
        (
            "mirrors",
            "no registry.mirrors: use [[containerd.registry]] (containerd refuses mirrors beside config_path)",
        ),
        (
            "configs",
            "no registry.configs: TLS through [[containerd.registry]] `ca`; credentials do not belong in a 0644 file",
        ),
        (
            "auths",
            "no registry.auths: credentials do not belong in a 0644 file on every node",
        ),
        (
            "headers",
            "no registry.headers: containerd sends them to every registry, and an Authorization \
             header is a credential in a 0644 file",
        ),
    ] {
        owned.push((
            images.iter().copied().chain(["registry", field]).collect(),
            why,
        ));
    }
    owned.push((
        images.iter().chain(&["pinned_images", "sandbox"]).copied().collect(),
        "the image's sandbox image (baked and pinned by digest: a different one would be pulled at boot)",
    ));
    owned.push((
        images
            .iter()
            .copied()
            .chain(["use_local_image_pull"])
            .collect(),
        "true, as the image sets it: containerd's transfer-service pull reads only one directory of config_path",
    ));
    owned.push((
        runtime.iter().chain(&runc_options).copied().collect(),
        "the image's value: it must agree with kubelet's cgroupDriver, baked with it",
    ));
    for (path, why) in &owned {
        if lookup(path)?.is_some() {
            return Err(refuse(&format!(".{}", dotted(path)), why, "set".into()));
        }
    }
    if let Some(list) = lookup(&["disabled_plugins"])? {
        let Value::Array(items) = list else {
            return Err(refuse(
                ".disabled_plugins",
                "a list of plugin ids",
                list.type_str().into(),
            ));
        };
        for item in items {
            if needed_by_cri(item.as_str().unwrap_or_default()) {
                return Err(refuse(
                    ".disabled_plugins",
                    "no plugin the CRI path needs (the CRI plugins and their gRPC services, \
                     metadata, content, leases, events, gc, runtime, sandbox, transfer, and the \
                     overlayfs snapshotter); snapshotters and tracing may be disabled",
                    format!("{item}"),
                ));
            }
        }
    }
    let mut rest = table.clone();
    rest.remove("version");
    let body =
        toml::to_string(&rest).map_err(|e| refuse("", "a table TOML can write", e.to_string()))?;
    let text = format!(
        "# Written by kiln render from node.toml's {key}; containerd merges it over the \
         image's config\n# (docs/contract.md, \"containerd configuration\").\nversion = \
         {version}\n\n{body}"
    );
    if text.len() > MAX_BYTES {
        return Err(refuse(
            "",
            &format!("at most {MAX_BYTES} bytes as written"),
            format!("{} bytes", text.len()),
        ));
    }
    Ok((version, text))
}

/// Plugin ids (and id prefixes) the image's CRI path cannot run without.
const NEEDED_PLUGINS: &[&str] = &[
    "io.containerd.cri.",
    "io.containerd.grpc.v1.",
    "io.containerd.service.v1.",
    "io.containerd.metadata.",
    "io.containerd.content.",
    "io.containerd.lease.",
    "io.containerd.event.",
    "io.containerd.gc.",
    "io.containerd.runtime.",
    "io.containerd.podsandbox.",
    "io.containerd.sandbox.",
    "io.containerd.transfer.",
    "io.containerd.snapshotter.v1.overlayfs",
];

/// Whether disabling plugin `id` would take from containerd what the image's CRI path needs:
/// the rule for node.toml's `disabled_plugins`, and the one the image's own list is held to
/// (`render_containerd_config`'s test).
pub fn needed_by_cri(id: &str) -> bool {
    let id = id.to_ascii_lowercase();
    NEEDED_PLUGINS.iter().any(|p| id.starts_with(p))
}

/// The value at `path`, each step's key compared without regard to case (as containerd's
/// decoders do); `Ok(None)` when a step is missing, `Err` (the path so far) when a step that
/// must be a table is something else.
fn lookup<'a>(table: &'a Table, path: &[&str]) -> Result<Option<&'a Value>, String> {
    let get = |t: &'a Table, k: &str| {
        t.iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(k))
            .map(|(_, v)| v)
    };
    let Some((last, parents)) = path.split_last() else {
        return Ok(None);
    };
    let mut t = table;
    for (i, p) in parents.iter().enumerate() {
        match get(t, p) {
            None => return Ok(None),
            Some(Value::Table(next)) => t = next,
            Some(_) => return Err(dotted(&path[..=i])),
        }
    }
    Ok(get(t, last))
}

/// The first table (dotted path under `at`) holding two keys that differ only in case.
fn case_twins(table: &Table, at: &str) -> Option<String> {
    let keys: Vec<&String> = table.keys().collect();
    for (i, k) in keys.iter().enumerate() {
        if keys[i + 1..].iter().any(|o| o.eq_ignore_ascii_case(k)) {
            return Some(format!("{at}.{k}"));
        }
    }
    table.iter().find_map(|(k, v)| {
        let here = if k.contains('.') {
            format!("{at}.{k:?}")
        } else {
            format!("{at}.{k}")
        };
        match v {
            Value::Table(t) => case_twins(t, &here),
            Value::Array(a) => a
                .iter()
                .find_map(|v| v.as_table().and_then(|t| case_twins(t, &here))),
            _ => None,
        }
    })
}

/// `plugins."io.containerd.cri.v1.images".registry`: dotted, quoting keys with a dot.
fn dotted(path: &[&str]) -> String {
    path.iter()
        .map(|p| {
            if p.contains('.') {
                format!("{p:?}")
            } else {
                (*p).to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(text: &str) -> Table {
        text.parse().unwrap()
    }

    #[test]
    fn a_fragment_is_written_with_its_version_first() {
        let t = table(
            "disabled_plugins = ['io.containerd.snapshotter.v1.zfs']\nversion = 3\n\
             [plugins.'io.containerd.cri.v1.images']\nmax_concurrent_downloads = 5\n",
        );
        let (v, text) = render("containerd.config", &t).unwrap();
        assert_eq!(v, 3);
        let first = text.lines().find(|l| !l.starts_with('#')).unwrap();
        assert_eq!(first, "version = 3");
        let back: Table = text.parse().unwrap();
        assert_eq!(back, t, "{text}");
    }

    #[test]
    fn each_owned_setting_is_refused_naming_where_it_is_set() {
        for (fragment, key, needle) in [
            ("", ".version", "no version"),
            ("version = 1", ".version", "1"),
            ("version = '3'", ".version", "\"3\""),
            ("version = 3\nimports = ['/x/*.toml']", ".imports", "no imports"),
            ("version = 3\n[grpc]\naddress = '/tmp/s'", ".grpc.address", "socket"),
            (
                "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry]\nconfig_path = '/x'",
                ".plugins.\"io.containerd.cri.v1.images\".registry.config_path",
                "[[containerd.registry]]",
            ),
            (
                "version = 3\n[plugins.'io.containerd.cri.v1.images'.registry.configs.'r.example'.auth]\nusername = 'u'",
                ".plugins.\"io.containerd.cri.v1.images\".registry.configs",
                "0644",
            ),
            (
                "version = 3\n[plugins.'io.containerd.cri.v1.images'.pinned_images]\nsandbox = 'x'",
                ".plugins.\"io.containerd.cri.v1.images\".pinned_images.sandbox",
                "sandbox image",
            ),
            (
                "version = 2\n[plugins.'io.containerd.grpc.v1.cri']\nmax_concurrent_downloads = 2",
                ".plugins.\"io.containerd.grpc.v1.cri\"",
                "whole table",
            ),
            (
                "version = 3\n[plugins.'io.containerd.cri.v1.images']\nuse_local_image_pull = false",
                "use_local_image_pull",
                "transfer-service",
            ),
            (
                "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\nSystemdCgroup = false",
                "runc.options.SystemdCgroup",
                "cgroupDriver",
            ),
            (
                "version = 3\ndisabled_plugins = ['io.containerd.cri.v1.images']",
                ".disabled_plugins",
                "CRI",
            ),
            ("version = 3\ndisabled_plugins = 'x'", ".disabled_plugins", "list"),
        ] {
            let r = render("containerd.config", &table(fragment)).unwrap_err();
            assert!(r.key.starts_with("containerd.config"), "{r:?}");
            assert!(r.key.ends_with(key) || r.key.contains(key), "{fragment}: {r:?}");
            assert!(
                r.expected.contains(needle) || r.found.contains(needle),
                "{fragment}: {r:?}"
            );
        }
    }

    #[test]
    fn settings_kiln_does_not_own_pass_in_either_version() {
        for fragment in [
            "version = 3\nroot = '/data/containerd'\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.gvisor]\nruntime_type = 'io.containerd.runsc.v1'",
            "version = 2\noom_score = -500\n[plugins.'io.containerd.internal.v1.opt']\npath = '/opt/containerd'",
            "version = 3\ndisabled_plugins = ['io.containerd.snapshotter.v1.zfs']",
        ] {
            render("containerd.config", &table(fragment)).unwrap();
        }
    }

    /// What a hostile review got past the first version of these rules: keys in another
    /// case (containerd's decoders match them anyway), `registry.headers`, arrays of tables
    /// where containerd needs a table, and plugins the CRI path needs besides the CRI ones.
    #[test]
    fn case_headers_arrays_and_needed_plugins_are_refused() {
        for (fragment, needle) in [
            ("version = 3\nIMPORTS = ['/x/*.toml']", "no imports"),
            ("version = 3\n[GRPC]\nADDRESS = '/x.sock'", "socket"),
            ("version = 2\n[PLUGINS.'io.containerd.grpc.v1.cri']\nmax_concurrent_downloads = 2", "whole table"),
            ("version = 3\n[plugins.'io.containerd.cri.v1.images'.registry.Configs.'r'.auth]\npassword = 'p'", "0644"),
            ("version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\nsystemdCgroup = false", "cgroupDriver"),
            ("version = 3\nDISABLED_PLUGINS = ['io.containerd.cri.v1.images']", "CRI path needs"),
            ("version = 3\ndisabled_plugins = ['io.containerd.metadata.v1.bolt']", "CRI path needs"),
            ("version = 3\n[plugins.'io.containerd.cri.v1.images'.registry.headers]\nAuthorization = ['Basic eA==']", "Authorization"),
            ("version = 3\n[[plugins]]\nx = 1", "array of tables"),
            ("version = 3\n[[plugins.'io.containerd.cri.v1.images'.registry]]\nx = 1", "array of tables"),
            ("version = 3\n[plugins.x]\na = 1\nA = 2", "differ only in case"),
        ] {
            let r = render("containerd.config", &table(fragment)).unwrap_err();
            assert!(
                r.expected.contains(needle) || r.found.contains(needle),
                "{fragment}: {r:?}"
            );
        }
        render(
            "containerd.config",
            &table("version = 3\ndisabled_plugins = ['io.containerd.snapshotter.v1.zfs', 'io.containerd.tracing.processor.v1.otlp']"),
        )
        .unwrap();
    }

    #[test]
    fn an_oversized_fragment_is_refused() {
        let big = format!(
            "version = 3\n[plugins.x]\nv = '{}'\n",
            "a".repeat(MAX_BYTES)
        );
        let r = render("containerd.config", &table(&big)).unwrap_err();
        assert!(r.expected.contains("65536 bytes"), "{r:?}");
    }
}
