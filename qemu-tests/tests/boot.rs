//! Boots the cached Debian base under QEMU and proves the harness: a oneshot unit reads the
//! loopback metadata server through the guest forward and reports on the serial console,
//! while the restricted network refuses everything else.

use std::time::{Duration, Instant};

use kiln_qemu_tests::guest::{console_unit, log_path, Root};
use kiln_qemu_tests::metadata::{MetadataServer, Response};
use kiln_qemu_tests::vm::{Vm, VmConfig};
use kiln_qemu_tests::{assets, expect_ok, Result};

#[test]
fn base_boots_and_reaches_only_the_metadata_forward() {
    expect_ok(base_boot());
}

fn base_boot() -> Result<()> {
    let t0 = Instant::now();
    let assets = assets::ensure()?;
    let server = MetadataServer::start(|req| match req.path.as_str() {
        "/kiln-probe" => Response::text("probe-ok"),
        _ => Response::status(404),
    })?;
    let work = tempfile::tempdir()?;
    let root = Root::from_base(&assets.base, work.path())?;
    // Trimmed as the scenarios' guests are, but with the base's DHCP (this test's lease).
    root.trim_idle()?;
    // The host side of the user network (169.254.169.2) maps to the host's loopback; with
    // restrict=on the guest must not get through to the server's port that way.
    let script = format!(
        "exec 3<>/dev/tcp/169.254.169.254/80 || {{ echo KILN-TEST-MARKER fetch-failed; exit 1; }}
printf 'GET /kiln-probe HTTP/1.1\\r\\nHost: 169.254.169.254\\r\\nConnection: close\\r\\n\\r\\n' >&3
body=$(tail -n1 <&3)
if timeout 3 bash -c 'exec 3<>/dev/tcp/169.254.169.2/{port}' 2>/dev/null; then direct=reachable; else direct=blocked; fi
echo KILN-TEST-MARKER body=$body direct=$direct uptime=$(cut -d' ' -f1 /proc/uptime)",
        port = server.port()
    );
    root.add_unit(
        "kiln-test-marker.service",
        &console_unit("boot test marker", "network-online.target", &script),
        "multi-user.target",
    )?;
    let disk = root.into_disk(&work.path().join("root.ext4"), 64)?;
    let prepared = t0.elapsed();

    let mut cfg = VmConfig::new(
        assets,
        log_path("base_boots_and_reaches_only_the_metadata_forward")?,
    );
    cfg.root = Some(disk);
    cfg.metadata_port = Some(server.port());
    let mut vm = Vm::start(&cfg, assets)?;
    let line = vm.wait_for("KILN-TEST-MARKER", Duration::from_secs(180), |l| {
        l.starts_with("KILN-TEST-MARKER")
    })?;
    eprintln!(
        "accel={} prepared in {} ms, marker after {} ms: {}",
        vm.accel().name(),
        prepared.as_millis(),
        line.host_ms,
        line.text
    );
    let uptime_ms = line
        .text
        .rsplit("uptime=")
        .next()
        .and_then(|u| u.parse::<f64>().ok())
        .map(|s| (s * 1000.0) as u64)
        .unwrap_or(0);
    eprintln!("KILN-BOOT-BENCH scenario=base-systemd marker_ms={uptime_ms}");
    assert!(line.text.contains("body=probe-ok"), "{}", line.text);
    assert!(line.text.contains("direct=blocked"), "{}", line.text);
    vm.wait_poweroff(Duration::from_secs(60))?;
    eprintln!(
        "powered off after {} ms",
        t0.elapsed().as_millis() - prepared.as_millis()
    );
    let paths: Vec<String> = server.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/kiln-probe"]);
    Ok(())
}
