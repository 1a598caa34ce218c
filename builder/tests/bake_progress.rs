//! `kiln bake` reports its phases (extract, compress, checksum): JSON lines with `--json`,
//! bars on a terminal (run under `script`, a real pty), one line per phase on stderr
//! otherwise, nothing with `--quiet`. Real bakes from the fixture mirror; the byte counts are
//! checked against the mirror's blobs, the layer's manifest and the written image.

use crate::bake_support;

use std::path::Path;
use std::process::{Command, Output};

use bake_support::fixture_mirror::*;
use bake_support::*;
use serde_json::Value;

struct Fx {
    _dir: tempfile::TempDir,
    root: std::path::PathBuf,
    defs: std::path::PathBuf,
}

fn fixture() -> Fx {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("fx");
    build_fixture(&root);
    let defs = dir.path().join("defs");
    std::fs::create_dir_all(&defs).unwrap();
    Fx {
        root,
        defs,
        _dir: dir,
    }
}

/// The kiln-firstboot the bakes ship: any amd64 ELF the gate accepts.
fn firstboot() -> std::path::PathBuf {
    let fb = repo().join("target/firstboot/kiln-firstboot");
    if fb.is_file() {
        fb
    } else {
        "/bin/true".into()
    }
}

/// `kiln [global…] bake IMAGE --format F --out OUT` against the fixture mirror.
fn bake_cmd(fx: &Fx, global: &[&str], image: &str, format: &str, out: &Path) -> Command {
    let mut c = kiln();
    c.args(global)
        .arg("bake")
        .arg(adapt(image, &fx.defs))
        .args(["--format", format, "--arch", "amd64", "--no-cache", "--out"])
        .arg(out)
        .arg("--lock")
        .arg(fx.root.join("artifacts.lock"))
        .arg("--trusted-key")
        .arg(fx.root.join("keys/fixture.pub"))
        .arg("--store")
        .arg(fx.root.join("mirror"))
        .arg("--firstboot")
        .arg(firstboot())
        .env("SOURCE_DATE_EPOCH", "1704067200");
    c
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// What the phases should count, from the outputs: extract = every download the layer came
/// from (its blob in the mirror) plus kiln-firstboot; compress = the layer's file data
/// (manifest sizes); checksum = the image file.
fn expected(fx: &Fx, result: &Value) -> Vec<(&'static str, u64)> {
    let files: Vec<&str> = result["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let manifest_path = files
        .iter()
        .find(|f| f.ends_with(".manifest.json"))
        .unwrap();
    let m: Value = serde_json::from_slice(&std::fs::read(manifest_path).unwrap()).unwrap();
    let mut extract = std::fs::metadata(firstboot()).unwrap().len();
    for a in m["artifacts"].as_array().unwrap() {
        if a["name"] == "kiln-firstboot" {
            continue;
        }
        let blob = fx
            .root
            .join("mirror/blobs/sha256")
            .join(a["sha256"].as_str().unwrap());
        extract += std::fs::metadata(&blob)
            .unwrap_or_else(|e| panic!("{}: {e}", blob.display()))
            .len();
    }
    let compress: u64 = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["size"].as_u64())
        .sum();
    let image = std::fs::metadata(files[0]).unwrap().len();
    vec![
        ("extract", extract),
        ("compress", compress),
        ("checksum", image),
    ]
}

/// Checks the phase events of one `--json` bake and returns the final result object.
fn check_json(fx: &Fx, stdout: &str, what: &str) -> Value {
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{what}: stdout line {l:?} is not JSON: {e}"))
        })
        .collect();
    let (end, lines) = lines
        .split_last()
        .unwrap_or_else(|| panic!("{what}: no output"));
    assert!(
        end["event"] == "result" && end["exit"] == 0,
        "{what}: expected the result event last (docs/cli.md, JSON output), found {end}"
    );
    let (result, events) = lines
        .split_last()
        .unwrap_or_else(|| panic!("{what}: no baked event"));
    assert!(
        result["event"] == "baked" && result["image_id"].as_str().is_some(),
        "{what}: expected the baked event {{image_id, format, arch, files}} before it, found {result}"
    );
    let want = expected(fx, result);
    // (phase, start total, last progress, done bytes), in the order the phases started.
    let mut seen: Vec<(String, u64, u64, Option<u64>)> = Vec::new();
    for e in events {
        let phase = e["phase"].as_str().unwrap_or_default().to_string();
        let kind = e["event"].as_str().unwrap_or_default();
        if kind == "phase_start" {
            assert!(
                seen.iter().all(|s| s.3.is_some()),
                "{what}: {phase} started before the previous phase was done: {seen:?}"
            );
            seen.push((phase, e["total_bytes"].as_u64().unwrap(), 0, None));
            continue;
        }
        let open = seen.last().is_some_and(|s| s.0 == phase && s.3.is_none());
        assert!(open, "{what}: {e} outside its phase (after {seen:?})");
        let cur = seen.last_mut().unwrap();
        match kind {
            "phase_progress" => {
                let b = e["bytes"].as_u64().unwrap();
                assert!(
                    b > cur.2 && b <= cur.1 && e["total_bytes"].as_u64() == Some(cur.1),
                    "{what}: {phase} progress expected to grow up to {} from {}, found {e}",
                    cur.1,
                    cur.2
                );
                assert!(e["elapsed_ms"].as_u64().is_some(), "{what}: {e}");
                cur.2 = b;
            }
            "phase_done" => {
                assert!(e["elapsed_ms"].as_u64().is_some(), "{what}: {e}");
                cur.3 = e["bytes"].as_u64();
            }
            _ => panic!("{what}: unexpected event {e}"),
        }
    }
    let got: Vec<(&str, u64, u64, u64)> = seen
        .iter()
        .map(|(p, total, last, done)| (p.as_str(), *total, *last, done.unwrap_or(u64::MAX)))
        .collect();
    let want: Vec<(&str, u64, u64, u64)> = want.iter().map(|(p, n)| (*p, *n, *n, *n)).collect();
    assert_eq!(
        got, want,
        "{what}: expected (phase, total, last progress, done bytes) as the mirror, manifest and image say"
    );
    result.clone()
}

#[test]
fn bake_reports_its_phases_as_json_bars_lines_or_not_at_all() {
    let fx = fixture();
    let d = tempfile::tempdir().unwrap();

    // --json: phase events in order with the right byte counts, then the result object; the
    // bytes are the same as a bake that reports nothing.
    let mut images = Vec::new();
    for (image, format) in [("ubuntu.toml", "rootfs"), ("flatcar.toml", "sysext")] {
        let out = d.path().join(format!("json-{format}"));
        let o = bake_cmd(&fx, &["--json"], image, format, &out)
            .output()
            .unwrap();
        ok(&o, &format!("kiln --json bake {image}"));
        let r = check_json(&fx, &text(&o).0, &format!("kiln --json bake {image}"));
        images.push(r["files"][0].as_str().unwrap().to_string());
    }

    // Not a terminal, no --json: stdout as before, one line per phase on stderr.
    let out = d.path().join("lines");
    let o = bake_cmd(&fx, &[], "ubuntu.toml", "rootfs", &out)
        .output()
        .unwrap();
    ok(&o, "kiln bake (not a terminal)");
    let (stdout, stderr) = text(&o);
    assert!(
        stdout.starts_with("baked ubuntu rootfs amd64: sha256:") && !stdout.contains("phase"),
        "stdout: {stdout}"
    );
    let phases: Vec<&str> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("kiln bake: "))
        .map(|l| l.split(':').next().unwrap())
        .collect();
    assert_eq!(
        phases,
        ["extract", "compress", "checksum"],
        "stderr: {stderr}"
    );
    assert!(
        !stderr.contains('\u{1b}') && !stderr.contains('\r'),
        "no terminal control sequences off a terminal: {stderr:?}"
    );
    let plain = out.join(Path::new(&images[0]).file_name().unwrap());
    assert_eq!(
        sha256_file(&plain),
        sha256_file(Path::new(&images[0])),
        "reporting changed the bytes of {}",
        plain.display()
    );

    // --quiet: no result and no phases (the trusted-key notice is printed whatever --quiet
    // says, docs/cli.md).
    let o = bake_cmd(
        &fx,
        &["--quiet"],
        "ubuntu.toml",
        "rootfs",
        &d.path().join("q"),
    )
    .output()
    .unwrap();
    ok(&o, "kiln --quiet bake");
    let (stdout, stderr) = text(&o);
    assert_eq!(stdout, "", "kiln --quiet bake printed on stdout");
    assert!(!stderr.contains("kiln bake:"), "stderr: {stderr}");

    // A terminal: `script` runs kiln on a pty; a bar per phase ends as "done in …".
    let cmd = bake_cmd(&fx, &[], "ubuntu.toml", "rootfs", &d.path().join("tty"));
    let line: Vec<String> = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| format!("'{}'", a.to_string_lossy()))
        .collect();
    let o = Command::new("script")
        .args(["-qec", &line.join(" "), "/dev/null"])
        .env("SOURCE_DATE_EPOCH", "1704067200")
        .env("TERM", "xterm")
        .env("COLUMNS", "120")
        .output()
        .expect("script (util-linux) runs kiln on a terminal");
    ok(&o, "kiln bake under script");
    let tty = String::from_utf8_lossy(&o.stdout);
    for phase in ["extract", "compress", "checksum"] {
        assert!(
            tty.lines()
                .any(|l| l.contains(phase) && l.contains("done in")),
            "expected a finished {phase} bar on the terminal, found:\n{tty}"
        );
    }
    assert!(
        tty.contains("baked ubuntu rootfs amd64") && !tty.contains("kiln bake: extract"),
        "expected bars, not lines, on a terminal:\n{tty}"
    );
}
