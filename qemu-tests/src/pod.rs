//! The real pod every node runs (docs/boot-tests.md, "A real pod"): the scenario puts a CNI
//! configuration standing in for the cluster's, an OCI archive with a pause stand-in and a
//! test image, a unit that imports them into containerd before kubelet, and the `cri-smoke`
//! CRI client into the guest; the stand-in kubelet runs `cri-smoke` after its bootstrap and
//! only then counts as joined. The test reads `cri-smoke`'s report off the console.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::arch::Arch;
use crate::guest::Root;
use crate::scenario::{workspace, Outcome};
use crate::{io_err, run, Error, Result};

/// The test container's image: busybox-static, imported into the guest (`.invalid`: no
/// registry could ever serve it).
pub const TEST_IMAGE: &str = "boot-test.kiln.invalid/busybox:1";
/// The same image under a registry only a mirror serves (`.invalid` never resolves): the
/// registry-mirror scenario's pod pulls it through the `hosts.toml` kiln render wrote
/// ([`crate::registry`]).
pub const PULL_IMAGE: &str = "pull-test.kiln.invalid/busybox:1";
/// The line the test container prints (cri-images.sh bakes it into the image's command).
pub const CONTAINER_LINE: &str = "kiln-cri-smoke:container-ran";
/// The pod network the scenario's CNI configuration hands out.
pub const POD_SUBNET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 85, 0, 0), 24);
/// The CNI network's name.
pub const CNI_NETWORK: &str = "kiln-test-pods";
/// Where `cri-smoke` writes its report in the guest (printed by the report unit).
pub const REPORT: &str = "/var/lib/kubelet/standin/pod-check";
/// Where the scenario puts `cri-smoke` in the guest: test equipment, not part of the image.
const GUEST_BIN: &str = "/opt/kiln-test/bin/cri-smoke";
const GUEST_IMAGES: &str = "/opt/kiln-test/images.tar";

/// The `cri-smoke` binary for a guest of `arch`: amd64's is the host's build
/// (`KILN_CRI_SMOKE_BIN`, default `target/debug/cri-smoke`); arm64's the cross build of
/// `scripts/build-cri-smoke-arm64.sh` (`KILN_CRI_SMOKE_ARM64_BIN`, default
/// `target/cri-smoke/arm64/cri-smoke`).
pub fn cri_smoke_bin(arch: Arch) -> Result<PathBuf> {
    let (var, default, hint) = match arch {
        Arch::Amd64 => (
            "KILN_CRI_SMOKE_BIN",
            "target/debug/cri-smoke",
            "build it with `cargo build -p cri-smoke` (make qemu-test does)",
        ),
        Arch::Arm64 => (
            "KILN_CRI_SMOKE_ARM64_BIN",
            "target/cri-smoke/arm64/cri-smoke",
            "build it with `scripts/build-cri-smoke-arm64.sh` (make qemu-test does)",
        ),
    };
    let p = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(default));
    if p.is_file() {
        Ok(p)
    } else {
        Err(Error::Missing {
            what: format!("{} ({var})", p.display()),
            hint: hint.into(),
        })
    }
}

/// The sandbox image `images/<image>.toml` gives containerd (`[containerd] sandbox_image`),
/// which kiln bakes into containerd's config.
pub fn sandbox_image(image: &str) -> Result<String> {
    definition_string(image, "sandbox_image")
}

/// kubelet's cgroup driver in `images/<image>.toml` (`[kubernetes] cgroup_driver`), which
/// kiln bakes into kubelet's config and containerd's `SystemdCgroup`.
pub fn cgroup_driver(image: &str) -> Result<String> {
    definition_string(image, "cgroup_driver")
}

/// A `key = "value"` line of an image definition (each key used here appears once).
fn definition_string(image: &str, key: &str) -> Result<String> {
    let path = workspace().join(format!("images/{image}.toml"));
    let text = std::fs::read_to_string(&path).map_err(io_err(&path))?;
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(key)?
                .trim()
                .strip_prefix('=')?
                .trim()
                .strip_prefix('"')?
                .strip_suffix('"')
                .map(str::to_string)
        })
        .ok_or_else(|| Error::Missing {
            what: format!("{key} in {}", path.display()),
            hint: format!("the image definition sets no {key}"),
        })
}

/// The OCI archive (pause stand-in named `sandbox`, and [`TEST_IMAGE`]) for `arch`, built
/// once and cached by `assets/cri-images.sh`.
pub fn images_archive(sandbox: &str, arch: Arch) -> Result<PathBuf> {
    let script = workspace().join("qemu-tests/assets/cri-images.sh");
    let out = run(Command::new(script)
        .arg(sandbox)
        .arg(TEST_IMAGE)
        .arg(arch.name()))?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::Missing {
            what: format!("the image archive {}", path.display()),
            hint: "qemu-tests/assets/cri-images.sh printed no file".into(),
        })
    }
}

/// The bridge + host-local configuration standing in for the cluster's CNI (which a real
/// cluster installs as a DaemonSet after join; kiln bakes only the plugins).
pub fn conflist() -> String {
    let (net, len) = POD_SUBNET;
    format!(
        r#"{{
  "cniVersion": "1.0.0",
  "name": "{CNI_NETWORK}",
  "plugins": [
    {{
      "type": "bridge",
      "bridge": "kilntest0",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {{
        "type": "host-local",
        "ranges": [[{{ "subnet": "{net}/{len}" }}]],
        "routes": [{{ "dst": "0.0.0.0/0" }}]
      }}
    }}
  ]
}}
"#
    )
}

/// The unit that imports the archive into containerd's `k8s.io` namespace (CRI's) once
/// kubelet has started ([`IMPORT_PATH_UNIT`] starts it). A real node has no such import (it
/// pulls its pods' images after joining), so it stays off kubelet's start path: not only
/// unordered before kubelet, but not competing for the guest's CPU before kubelet runs;
/// `cri-smoke` waits for the images as kubelet retries a pod whose image is not there yet.
/// After the layer's own import (`kiln-images.service`), so that `cri-smoke` finding the test
/// image means the baked sandbox image is in place too.
pub fn import_unit() -> String {
    format!(
        "[Unit]\nDescription=boot test: import the test's images into containerd (no registry in the guest)\n\
         Requires=containerd.service\nAfter=containerd.service kiln-images.service\n\n\
         [Service]\nType=oneshot\nRemainAfterExit=yes\nStandardOutput=journal+console\n\
         ExecStart=ctr --namespace k8s.io images import {GUEST_IMAGES}\n"
    )
}

/// Starts [`import_unit`] when the stand-in kubelet has started: the first thing it does
/// is record its command line in this file.
pub const IMPORT_PATH_UNIT: &str =
    "[Unit]\nDescription=boot test: import the test's images once kubelet runs\n\n\
     [Path]\nPathExists=/var/lib/kubelet/standin/args\nUnit=kiln-test-images.service\n";

/// What the stand-in kubelet runs after its bootstrap (`STANDIN_POD_CHECK`, words split on
/// whitespace; kubelet's endpoint and cgroup driver are appended by the stand-in).
pub fn pod_check_command() -> String {
    pod_check_command_for(TEST_IMAGE, false)
}

/// [`pod_check_command`] for `image`, pulled first through the runtime when `pull`.
pub fn pod_check_command_for(image: &str, pull: bool) -> String {
    format!(
        "{GUEST_BIN} --image {image} --expect {CONTAINER_LINE} --report {REPORT} \
         --settle-secs 120 --call-timeout-secs 120{}",
        if pull { " --pull" } else { "" }
    )
}

/// Puts the pod pieces into a root whose `etc/kubernetes/standin-kubelet.env` already exists
/// ([`crate::node::finish_root`]): the stand-in kubelet of that root runs the pod.
/// `image` names the definition whose sandbox image the pause stand-in is named after.
pub fn install(root: &Root, image: &str) -> Result<()> {
    install_for(root, image, Arch::Amd64)
}

/// [`install`] for a guest of `arch`: its `cri-smoke` build and images of its architecture.
pub fn install_for(root: &Root, image: &str, arch: Arch) -> Result<()> {
    install_with(root, image, arch, &pod_check_command())
}

/// [`install`] with a pod whose image ([`PULL_IMAGE`]) is not imported but pulled through
/// the runtime, as a node pulls a pod's image.
pub fn install_pulling(root: &Root, image: &str) -> Result<()> {
    install_with(
        root,
        image,
        Arch::Amd64,
        &pod_check_command_for(PULL_IMAGE, true),
    )
}

fn install_with(root: &Root, image: &str, arch: Arch, check: &str) -> Result<()> {
    let sandbox = sandbox_image(image)?;
    let archive = images_archive(&sandbox, arch)?;
    let bin = cri_smoke_bin(arch)?;
    let copy = |from: &PathBuf, to: &str, mode: u32| -> Result<()> {
        let bytes = std::fs::read(from).map_err(io_err(from))?;
        root.write(to, bytes, mode).map(drop)
    };
    copy(&bin, GUEST_BIN, 0o755)?;
    copy(&archive, GUEST_IMAGES, 0o644)?;
    root.write(
        "etc/cni/net.d/10-kiln-test-pods.conflist",
        conflist(),
        0o644,
    )?;
    root.write(
        "etc/systemd/system/kiln-test-images.service",
        import_unit(),
        0o644,
    )?;
    root.add_unit(
        "kiln-test-images.path",
        IMPORT_PATH_UNIT,
        "multi-user.target",
    )?;
    let env = root.dir.join("etc/kubernetes/standin-kubelet.env");
    let mut text = std::fs::read_to_string(&env).map_err(io_err(&env))?;
    text.push_str(&format!("STANDIN_POD_CHECK={check}\n"));
    root.write("etc/kubernetes/standin-kubelet.env", text, 0o644)?;
    Ok(())
}

/// `cri-smoke`'s report as the report unit printed it.
pub fn report(o: &Outcome) -> BTreeMap<String, String> {
    o.files
        .get(REPORT)
        .into_iter()
        .flatten()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Whether `ip` lies in [`POD_SUBNET`].
pub fn in_pod_subnet(ip: Ipv4Addr) -> bool {
    let (net, len) = POD_SUBNET;
    let mask = u32::MAX << (32 - u32::from(len));
    u32::from(ip) & mask == u32::from(net) & mask
}

/// Pins the pause stand-in of `arch` as the lock `[[image]]` a bake carries (issue 16: the
/// sandbox image baked into the layer and imported by kiln-images.service, with no registry
/// in the guest). Its blobs from the `cri-images.sh` archive go into `store`; the return is
/// the lock entry, whose digest is the stand-in's manifest (a single-platform image).
pub fn pin_sandbox(image: &str, arch: Arch, store: &Path, work: &Path) -> Result<String> {
    let sandbox = sandbox_image(image)?;
    let archive = images_archive(&sandbox, arch)?;
    let x = work.join("cri-images");
    std::fs::create_dir_all(&x).map_err(io_err(&x))?;
    run(Command::new("tar")
        .arg("-xf")
        .arg(&archive)
        .arg("-C")
        .arg(&x))?;
    let index_path = x.join("index.json");
    let index: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&index_path).map_err(io_err(&index_path))?,
    )
    .map_err(|e| Error::Command {
        command: format!("parse {}", index_path.display()),
        detail: e.to_string(),
    })?;
    let digest = index["manifests"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["annotations"]["io.containerd.image.name"] == sandbox.as_str())
        .and_then(|m| m["digest"].as_str())
        .ok_or_else(|| Error::Missing {
            what: format!("{sandbox} in {}", archive.display()),
            hint: "cri-images.sh names the pause stand-in after the sandbox image".into(),
        })?
        .to_string();
    let blobs = store.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).map_err(io_err(&blobs))?;
    let from = x.join("blobs/sha256");
    for e in std::fs::read_dir(&from).map_err(io_err(&from))? {
        let e = e.map_err(io_err(&from))?;
        let to = blobs.join(e.file_name());
        if !to.exists() {
            std::fs::copy(e.path(), &to).map_err(io_err(&to))?;
        }
    }
    Ok(format!(
        "\n[[image]]\nname = \"pause\"\nreference = \"{sandbox}\"\ndigest = \"{digest}\"\n\
         verified = \"boot-test stand-in for pause, built by qemu-tests/assets/cri-images.sh\"\n\
         platforms = [{{ os = \"linux\", arch = \"{}\" }}]\n",
        arch.name()
    ))
}

/// Checks that a real sandbox and container ran on the node: the runtime and its network
/// were ready, the sandbox used `sandbox` (the definition's sandbox image), the pod got an
/// address of the scenario's CNI network, the container printed its line and exited 0 in a
/// cgroup of kubelet's `cgroup_driver`, and everything was removed. The error says what
/// differed and shows the whole report.
pub fn check_ran(
    o: &Outcome,
    sandbox: &str,
    cgroup_driver: &str,
) -> std::result::Result<(), String> {
    let r = report(o);
    let fail = |what: String| Err(format!("{what}; cri-smoke's report ({REPORT}): {r:?}"));
    let want = |key: &str, value: &str| r.get(key).map(String::as_str) == Some(value);
    if r.is_empty() {
        return fail("no pod ran: cri-smoke wrote no report".into());
    }
    // The definition's sandbox image, pinned by the digest of the image the layer carries
    // (`pin_sandbox`; containerd resolves a tag+digest reference by its digest alone).
    let pinned = r
        .get("sandbox_image")
        .and_then(|v| v.strip_prefix(sandbox)?.strip_prefix("@sha256:"));
    if !pinned.is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())) {
        return fail(format!(
            "sandbox_image is not {sandbox}@sha256:<the baked image's digest>"
        ));
    }
    for (key, value) in [
        ("result", "success"),
        ("runtime_ready", "true"),
        ("network_ready", "true"),
        ("cni_network", CNI_NETWORK),
        ("cgroup_driver", cgroup_driver),
        ("container_exit_code", "0"),
        ("container_output", CONTAINER_LINE),
        ("cleaned_up", "true"),
    ] {
        if !want(key, value) {
            return fail(format!("{key} is not {value:?}"));
        }
    }
    if r.get("sandbox_id").is_none_or(|v| v.is_empty()) {
        return fail("no sandbox id".into());
    }
    let ip = r.get("pod_ip").and_then(|v| v.parse::<Ipv4Addr>().ok());
    match ip {
        Some(ip) if in_pod_subnet(ip) => {}
        _ => {
            let (net, len) = POD_SUBNET;
            return fail(format!("pod_ip is not inside the conflist's {net}/{len}"));
        }
    }
    // The pause process's cgroup as the node sees it: under the systemd driver a kubepods
    // slice that systemd made from kubelet's cgroup parent.
    let cgroup = r.get("sandbox_cgroup").cloned().unwrap_or_default();
    let slice = cgroup_driver != "systemd" || cgroup.contains("kubepods-besteffort-pod");
    if !slice || !cgroup.contains("kubepods") {
        return fail(format!(
            "the sandbox's cgroup {cgroup:?} is not a {cgroup_driver} kubepods cgroup"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::console::Line;

    #[test]
    fn sandbox_image_is_the_definitions() {
        assert_eq!(
            sandbox_image("ubuntu").unwrap(),
            "registry.k8s.io/pause:3.10.2"
        );
        assert_eq!(cgroup_driver("flatcar").unwrap(), "systemd");
        assert!(sandbox_image("no-such-image").is_err());
    }

    #[test]
    fn conflist_is_json_with_the_subnet() {
        let v: serde_json::Value = serde_json::from_str(&conflist()).unwrap();
        assert_eq!(v["name"], CNI_NETWORK);
        assert_eq!(
            v["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
            "10.85.0.0/24"
        );
    }

    fn outcome(report: &[&str]) -> Outcome {
        let mut lines: Vec<Line> = report
            .iter()
            .map(|l| Line {
                host_ms: 0,
                text: format!("KILN-TEST-FILE {REPORT} {l}"),
            })
            .collect();
        lines.push(Line {
            host_ms: 1,
            text: r#"KILN-STATUS {"result":"success"}"#.into(),
        });
        Outcome::parse(&lines).unwrap()
    }

    #[test]
    fn a_pod_run_is_checked_field_by_field() {
        let good = [
            "result=success",
            "runtime_ready=true",
            "network_ready=true",
            "sandbox_image=registry.k8s.io/pause:3.10@sha256:8a2f9e3c1b0d4e5f6a7b8c9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b",
            "cni_network=kiln-test-pods",
            "cgroup_driver=systemd",
            "sandbox_id=abc",
            "pod_ip=10.85.0.2",
            "container_exit_code=0",
            "container_output=kiln-cri-smoke:container-ran",
            "sandbox_cgroup=0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podx.slice/cri-containerd-y.scope",
            "cleaned_up=true",
        ];
        let pause = "registry.k8s.io/pause:3.10";
        check_ran(&outcome(&good), pause, "systemd").unwrap();
        for (i, bad) in [
            (7, "pod_ip=10.86.0.2"),
            (7, "pod_ip=169.254.169.15"),
            (3, "sandbox_image=registry.k8s.io/pause:3.9"),
            // The tag alone: the sandbox did not come from the baked, digest-pinned image.
            (3, "sandbox_image=registry.k8s.io/pause:3.10"),
            (3, "sandbox_image=registry.k8s.io/pause:3.10@sha256:8a2f"),
            (8, "container_exit_code=1"),
            (11, "cleaned_up=false"),
            (10, "sandbox_cgroup=0::/system.slice/kubelet.service"),
            (0, "result=failure"),
        ] {
            let mut r = good.to_vec();
            r[i] = bad;
            let e = check_ran(&outcome(&r), pause, "systemd").unwrap_err();
            assert!(e.contains("cri-smoke's report"), "{e}");
        }
        let e = check_ran(&outcome(&[]), pause, "systemd").unwrap_err();
        assert!(e.contains("no pod ran"), "{e}");
    }
}
