//! `/etc/kiln/sysctl.conf`, the node's kernel parameters set at provisioning time
//! (`docs/contract.md#sysctlconf`): the syntax of a name and a value, the values kubelet
//! needs, and the file's format. `kiln render` refuses what breaks these rules before a node
//! sees it; kiln-firstboot checks them again on the file it reads and writes each value to
//! `/proc/sys`. Pure: no I/O.

/// The longest value kiln writes (a page, as the kernel's `proc_dostring` takes at most).
pub const MAX_VALUE: usize = 4096;
/// The most parameters one file may set (spelt out in `parse`'s message).
pub const MAX_ENTRIES: usize = 256;

/// Whether `name` is a sysctl name kiln can map to one file under `/proc/sys`: components of
/// letters, digits, `_` and `-` separated by `.` (`net.core.somaxconn`), or separated by `/`
/// when a component holds a `.` (`net/ipv4/conf/eth0.100/rp_filter`, as sysctl.d(5) allows).
/// Globs, empty components, `.` and `..` are refused, so the path stays under `/proc/sys`.
pub fn check_name(name: &str) -> Result<(), String> {
    let (sep, dot_ok) = if name.contains('/') {
        ('/', true)
    } else {
        ('.', false)
    };
    let ok = !name.is_empty()
        && name.len() <= 255
        && name.split(sep).all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes().all(|b| {
                    b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || (dot_ok && b == b'.')
                })
        });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "expected a sysctl name ([A-Za-z0-9_-] parts joined by . or /), found {name:?}"
        ))
    }
}

/// Whether `value` can be written as it is: one line, not blank, at most [`MAX_VALUE`] bytes
/// (tabs and spaces inside are kept: `net.ipv4.tcp_rmem = 4096 87380 6291456`).
pub fn check_value(value: &str) -> Result<(), String> {
    if value.trim().is_empty() {
        return Err("expected a value, found an empty one".into());
    }
    if value.len() > MAX_VALUE {
        return Err(format!(
            "expected at most {MAX_VALUE} bytes, found {}",
            value.len()
        ));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err("expected one line, found a control character".into());
    }
    Ok(())
}

/// The path of `name` under `/proc/sys`, relative (`net/core/somaxconn`).
pub fn proc_path(name: &str) -> String {
    if name.contains('/') {
        name.to_string()
    } else {
        name.replace('.', "/")
    }
}

/// Values a node may not take, each with the value it needs and why, by source:
/// kubeadm's preflight (`cmd/kubeadm/app/preflight/checks.go`: `ipv4Forward`,
/// `ipv6DualStack`'s forwarding, `bridgenf`) and what kubelet writes at every start, or
/// refuses to start without under `protectKernelDefaults` (`pkg/kubelet/cm/container_manager_linux.go`
/// `setupKernelTunables`, the values of `pkg/util/sysctl`).
pub const KUBELET_NEEDS: &[(&str, &str, &str)] = &[
    (
        "net.ipv4.ip_forward",
        "1",
        "pods' traffic is forwarded and kubeadm's preflight refuses 0",
    ),
    (
        "net.ipv6.conf.all.forwarding",
        "1",
        "IPv6 pods' traffic is forwarded and kubeadm's preflight refuses 0",
    ),
    (
        "net.bridge.bridge-nf-call-iptables",
        "1",
        "bridged pod traffic must pass iptables and kubeadm's preflight refuses 0",
    ),
    (
        "net.bridge.bridge-nf-call-ip6tables",
        "1",
        "bridged pod traffic must pass ip6tables and kubeadm's preflight refuses 0",
    ),
    ("vm.overcommit_memory", "1", KUBELET_SETS),
    ("vm.panic_on_oom", "0", KUBELET_SETS),
    ("kernel.panic", "10", KUBELET_SETS),
    ("kernel.panic_on_oops", "1", KUBELET_SETS),
    ("kernel.keys.root_maxkeys", "1000000", KUBELET_SETS),
    ("kernel.keys.root_maxbytes", "25000000", KUBELET_SETS),
];

const KUBELET_SETS: &str =
    "kubelet sets it at every start, or refuses to start under protectKernelDefaults";

/// The value kubelet needs for `name` and why, when `value` is another.
pub fn kubelet_conflict(name: &str, value: &str) -> Option<(&'static str, &'static str)> {
    let dotted = name.replace('/', ".");
    KUBELET_NEEDS
        .iter()
        .find(|(n, _, _)| *n == dotted)
        .filter(|(_, need, _)| value.trim() != *need)
        .map(|(_, need, why)| (*need, *why))
}

/// Every rule for one entry: the name, the value, and what kubelet needs.
pub fn check(name: &str, value: &str) -> Result<(), String> {
    check_name(name)?;
    check_value(value).map_err(|e| format!("{name}: {e}"))?;
    if let Some((need, why)) = kubelet_conflict(name, value) {
        return Err(format!(
            "{name}: expected {need} or no setting, as {why}, found {:?}",
            value.trim()
        ));
    }
    Ok(())
}

/// Parses the file's text: `name = value` lines as sysctl.d(5) writes them (blank lines and
/// lines starting with `#` or `;` skipped; the value trimmed), each name and value checked
/// ([`check_name`], [`check_value`]: what keeps the write under `/proc/sys` and in one
/// line); `Err` names the line. A later line for the same name replaces the earlier value.
/// What kubelet needs ([`check`]) is `kiln render`'s to refuse: this runs on every node,
/// where each byte counts, and a hand-written file that breaks it fails at kubelet.
pub fn parse(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out: Vec<(String, String)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with(['#', ';']) {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", i + 1);
        let (name, value) = line
            .split_once('=')
            .ok_or_else(|| at("expected `name = value`, found no '='".into()))?;
        let (name, value) = (name.trim(), value.trim());
        check_name(name).map_err(at)?;
        check_value(value).map_err(|e| at(format!("{name}: {e}")))?;
        if let Some(slot) = out.iter_mut().find(|(n, _)| n == name) {
            slot.1 = value.to_string();
        } else if out.len() == MAX_ENTRIES {
            return Err(at("expected at most 256 settings, found more".into()));
        } else {
            out.push((name.to_string(), value.to_string()));
        }
    }
    Ok(out)
}

/// The file's text for `entries`, in their order: what `kiln render` writes.
pub fn render(entries: &[(String, String)]) -> String {
    let mut s = String::from(
        "# kiln node contract v1: written by `kiln render` from node.toml's [sysctl].\n",
    );
    for (k, v) in entries {
        s.push_str(k);
        s.push_str(" = ");
        s.push_str(v);
        s.push('\n');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_under_proc_sys() {
        for ok in [
            "net.core.somaxconn",
            "vm.max_map_count",
            "net/ipv4/conf/eth0.100/rp_filter",
            "fs.inotify.max_user_watches",
        ] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "net..core",
            ".net",
            "net.core.",
            "net/../etc",
            "net/./x",
            "kernel.*",
            "a b",
            "net.core.somaxconn\n",
            "/net/core",
            "x".repeat(256).as_str(),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(proc_path("net.core.somaxconn"), "net/core/somaxconn");
        assert_eq!(
            proc_path("net/ipv4/conf/eth0.100/rp_filter"),
            "net/ipv4/conf/eth0.100/rp_filter"
        );
    }

    #[test]
    fn values_are_one_line() {
        assert_eq!(check_value("4096\t87380 6291456"), Ok(()));
        for bad in ["", "  ", "1\n2", "1\r", "\u{1b}[0m"] {
            assert!(check_value(bad).is_err(), "{bad:?}");
        }
        assert!(check_value(&"1".repeat(MAX_VALUE + 1)).is_err());
    }

    #[test]
    fn what_kubelet_needs_is_refused_otherwise() {
        assert!(check("net.ipv4.ip_forward", "1").is_ok());
        let e = check("net.ipv4.ip_forward", "0").unwrap_err();
        assert!(
            e.contains("expected 1 or no setting") && e.contains("found \"0\""),
            "{e}"
        );
        assert!(check("net/ipv4/ip_forward", "0").is_err());
        assert!(check("vm.overcommit_memory", "2").is_err());
        assert!(check("kernel.panic", " 10 ").is_ok());
    }

    #[test]
    fn the_file_reads_as_sysctl_d_and_names_its_line() {
        let text = "# c\n; c\n\nnet.core.somaxconn = 4096\nvm.max_map_count=262144\nnet.core.somaxconn = 8192\n";
        assert_eq!(
            parse(text).unwrap(),
            [
                ("net.core.somaxconn".to_string(), "8192".to_string()),
                ("vm.max_map_count".into(), "262144".into())
            ]
        );
        assert!(parse("x\n").unwrap_err().starts_with("line 1: "));
        assert!(parse("a.b = 1\nx.y =\n")
            .unwrap_err()
            .starts_with("line 2: x.y: expected a value"));
        // What kubelet needs is render's check, not the file's.
        assert!(parse("net.ipv4.ip_forward = 0\n").is_ok());
        let entries = parse(text).unwrap();
        assert_eq!(parse(&render(&entries)).unwrap(), entries);
    }
}
