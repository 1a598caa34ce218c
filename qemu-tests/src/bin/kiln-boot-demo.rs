//! `make demo`'s boot step: bakes the ubuntu image from the offline fixture mirror, installs
//! it into the Debian base, boots it under QEMU with an IMDSv2 stand-in, and prints the
//! timeline and the final status the node reported on its serial console.

use std::process::ExitCode;
use std::time::Duration;

use kiln_qemu_tests::node::{boot_rootfs_node, timeline, Metadata, NodeBoot};
use kiln_qemu_tests::scenario::NodeConfig;

fn main() -> ExitCode {
    let spec = NodeBoot {
        name: "demo".into(),
        kubelet_mode: std::env::var("KILN_DEMO_KUBELET_MODE").unwrap_or_else(|_| "success".into()),
        node: NodeConfig {
            provider: "auto".into(),
            deadline: 240,
            join_mode: "kubelet".into(),
            extra: String::new(),
        },
        metadata: Metadata::Aws,
        timeout: Duration::from_secs(600),
        pod: true,
    };
    println!("demo: bake images/ubuntu.toml (rootfs) from the fixture mirror, kiln install --root into a Debian base,");
    println!("      kiln render the /etc/kiln files, boot under QEMU with an IMDSv2 stand-in (this takes a minute or two)");
    let b = match boot_rootfs_node(&spec) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("\ntimeline (host seconds since QEMU started; firstboot phases on the node's clock):");
    print!("{}", timeline(&b));
    let o = &b.outcome;
    for key in [
        "NODE_NAME",
        "NODE_IP",
        "PROVIDER_ID",
        "INSTANCE_TYPE",
        "MAX_PODS",
    ] {
        println!(
            "  kubelet.env {key}={}",
            o.kubelet_env(key).unwrap_or_default()
        );
    }
    for (unit, state) in &o.units {
        println!("  {unit}.service: {state}");
    }
    println!("\nfinal status (the node's KILN-STATUS console line):");
    println!(
        "{}",
        serde_json::to_string_pretty(&o.status).unwrap_or_default()
    );
    println!("\nfull console log: {}", b.log.display());
    // A kubelet mode other than success asks for a diagnosed failure: that is the expected end.
    let expected = if spec.kubelet_mode == "success" {
        "success"
    } else {
        "failure"
    };
    if o.result() == expected {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
