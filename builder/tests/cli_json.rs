//! `--json` is one schema across every command (docs/cli.md, "JSON output"): each command runs
//! here with `--json` once to success and once to a forced failure, and its stream must be
//! JSON lines only, each an object with a string `event` and a `level` of `info`, `warning`
//! or `error`, ending in exactly one `result` or `error` whose `exit` is the process's exit
//! status. A command kiln adds fails `every_command_is_in_the_table` until it has both runs.

use crate::bake_support;
use crate::support;

use std::path::PathBuf;
use std::process::{Command, Output};

use bake_support::fixture_mirror::{build_fixture, standin};
use bake_support::repo;
use clap::CommandFactory;
use serde_json::Value;
use support::registry::{tools_or_skip, Registry};
use support::server::Server;

/// Where a command's events go: stdout, or stderr when stdout is its product.
#[derive(Clone, Copy, PartialEq)]
enum Stream {
    Stdout,
    Stderr,
}

/// Checks one run's JSON stream; returns the final event.
fn check_stream(what: &str, o: &Output, stream: Stream) -> Value {
    let (text, others) = match stream {
        Stream::Stdout => (&o.stdout, &o.stderr),
        Stream::Stderr => (&o.stderr, &o.stdout),
    };
    let text = String::from_utf8_lossy(text);
    let lines: Vec<&str> = match stream {
        Stream::Stdout => text.lines().collect(),
        // stderr also carries human text (which key is trusted, warnings): the JSON lines are
        // those that start an object.
        Stream::Stderr => text.lines().filter(|l| l.starts_with('{')).collect(),
    };
    let ctx = || {
        format!(
            "{what}: exit {:?}\n--- stream\n{text}--- other\n{}",
            o.status.code(),
            String::from_utf8_lossy(others)
        )
    };
    assert!(!lines.is_empty(), "no JSON lines: {}", ctx());
    let mut finals = 0;
    let mut last = Value::Null;
    for l in &lines {
        let v: Value = serde_json::from_str(l)
            .unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}\n{}", ctx()));
        assert!(v.is_object(), "not an object: {l}\n{}", ctx());
        assert!(v["event"].is_string(), "no event: {l}\n{}", ctx());
        assert!(
            matches!(v["level"].as_str(), Some("info" | "warning" | "error")),
            "bad level: {l}\n{}",
            ctx()
        );
        if matches!(v["event"].as_str(), Some("result" | "error")) {
            finals += 1;
        }
        last = v;
    }
    assert_eq!(finals, 1, "one result or error: {}", ctx());
    assert!(
        matches!(last["event"].as_str(), Some("result" | "error")),
        "the last line is the result or the error: {}",
        ctx()
    );
    assert_eq!(
        last["exit"].as_i64(),
        o.status.code().map(i64::from),
        "the final event's exit is the process's: {}",
        ctx()
    );
    assert!(last["reason"].is_string(), "{}", ctx());
    if last["event"] == "error" {
        assert!(
            last["message"].is_string() && last["causes"].is_array(),
            "{}",
            ctx()
        );
    } else {
        assert_eq!(last["ok"], o.status.success(), "{}", ctx());
    }
    last
}

/// The leaf commands, `lock verify` style.
fn leaf_commands() -> Vec<String> {
    fn walk(c: &clap::Command, name: &str, out: &mut Vec<String>) {
        let subs: Vec<_> = c
            .get_subcommands()
            .filter(|s| s.get_name() != "help" && !s.is_hide_set())
            .collect();
        if subs.is_empty() {
            out.push(name.trim().to_string());
        }
        for s in subs {
            walk(s, &format!("{name} {}", s.get_name()), out);
        }
    }
    let mut out = Vec::new();
    walk(&kiln::cli::Cli::command(), "", &mut out);
    out
}

/// A scratch directory with what the runs use.
struct Scene {
    _d: tempfile::TempDir,
    w: PathBuf,
    fx: PathBuf,
    server: Server,
}

impl Scene {
    fn new() -> Scene {
        let d = tempfile::tempdir().unwrap();
        let w = d.path().to_path_buf();
        let fx = w.join("fx");
        build_fixture(&fx);
        for (from, to) in [
            ("images", "images"),
            ("docs/examples/render/node.toml", "node.toml"),
            ("docs/examples/render/ca.crt", "ca.crt"),
        ] {
            let o = Command::new("cp")
                .arg("-a")
                .arg(repo().join(from))
                .arg(w.join(to))
                .output()
                .unwrap();
            assert!(o.status.success(), "{o:?}");
        }
        let server = Server::start();
        let bytes = b"#!/bin/sh\necho tool\n".to_vec();
        let sha = support::sha256_hex(&bytes);
        server.add("/dl/tool", bytes);
        server.add("/dl/tool.sha256", format!("{sha}  tool\n").into_bytes());
        server.add(
            "/dl/bad.sha256",
            format!("{}\n", "0".repeat(64)).into_bytes(),
        );
        Scene {
            _d: d,
            w,
            fx,
            server,
        }
    }

    /// `kiln --json ARGS` in the scene, with the fixture's key trusted through the
    /// environment (where a command takes it) and nothing reaching the network.
    fn kiln(&self, args: &[String]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_kiln"))
            .arg("--json")
            .args(args)
            .current_dir(&self.w)
            .env("HOME", self.w.join("home"))
            .env("KILN_CACHE", self.w.join("cache"))
            .env("KILN_TRUSTED_KEY", self.fx.join("keys/fixture.pub"))
            .env("DOCKER_CONFIG", self.w.join("no-docker-config"))
            .env_remove("KILN_STORE")
            .env_remove("KILN_REGISTRY_AUTH")
            .env("HTTPS_PROXY", "http://127.0.0.1:9")
            .env("HTTP_PROXY", "http://127.0.0.1:9")
            .env("NO_PROXY", "127.0.0.1")
            .output()
            .unwrap()
    }
}

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one table: every command's success and failure, in the order docs/cli.md lists them"
)]
fn every_command_speaks_one_json_schema_on_success_and_failure() {
    let s = Scene::new();
    let fx = s.fx.display().to_string();
    let lock = format!("{fx}/artifacts.lock");
    let v = standin();
    let base = s.server.base();
    let add = |checksum: &str, lock: &str| {
        args(&format!(
            "lock add {lock} --name tool --version 1.0 --os linux --arch amd64 --format binary \
             --url {base}/dl/tool --member tool=bin/tool --checksum-url {base}/dl/{checksum}"
        ))
    };
    std::fs::write(s.w.join("a.lock"), "version = 1\n").unwrap();
    std::fs::copy(&lock, s.w.join("copy.lock")).unwrap();
    std::fs::write(s.w.join("garbage.tar.zst"), b"not a pack").unwrap();
    std::fs::create_dir_all(s.w.join("root")).unwrap();
    let registry_dir = s.w.join("registry");
    let registry =
        tools_or_skip("cli_json mirror push").then(|| Registry::start(&registry_dir, false));
    let plan = |extra: &str| {
        args(&format!(
            "plan images/ubuntu.toml --arch amd64 --lock {lock} --store {fx}/mirror {extra}"
        ))
    };
    let bake = |extra: &str| {
        args(&format!(
            "bake images/ubuntu.toml --arch amd64 --lock {lock} --store {fx}/mirror --out out --no-cache {extra}"
        ))
    };
    let layer = format!("out/ubuntu-{v}-amd64.tar.zst");
    let manifest = format!("out/ubuntu-{v}-amd64.manifest.json");

    // (command, success args, failure args, where the events go). Runs in order: later ones
    // use what earlier ones made (the mirror m/, the pack, the layer).
    let table: Vec<(&str, Vec<String>, Vec<String>, Stream)> = vec![
        ("contract", args("contract"), args("contract --bogus"), Stream::Stdout),
        (
            "lock verify",
            args(&format!("lock verify {lock}")),
            args("lock verify images/artifacts.lock"),
            Stream::Stdout,
        ),
        (
            "lock sign",
            args(&format!("lock sign copy.lock --secret-key {fx}/keys/fixture.key")),
            args(&format!("lock sign missing.lock --secret-key {fx}/keys/fixture.key")),
            Stream::Stdout,
        ),
        ("lock add", add("tool.sha256", "a.lock"), add("bad.sha256", "b.lock"), Stream::Stdout),
        (
            "lock update",
            args("lock update a.lock"),
            args("lock update missing.lock"),
            Stream::Stdout,
        ),
        (
            "lock outdated",
            args(&format!("lock outdated {lock} --against {lock}")),
            args("lock outdated missing.lock"),
            Stream::Stdout,
        ),
        (
            "lock audit",
            args(&format!("lock audit {lock} --advisories images/advisories.toml")),
            args("lock audit missing.lock"),
            Stream::Stdout,
        ),
        (
            "inspect",
            args("inspect /bin/true"),
            args("inspect /bin/true --os windows --arch amd64"),
            Stream::Stdout,
        ),
        (
            "render",
            args("render --provisioner cloud-init node.toml --output user-data"),
            args("render --check /dev/null"),
            Stream::Stdout,
        ),
        (
            "fetch",
            args(&format!("fetch {lock} --mirror {fx}/mirror --name runc")),
            args(&format!("fetch {}/images/artifacts.lock --mirror {fx}/mirror", repo().display())),
            Stream::Stdout,
        ),
        (
            "mirror sync",
            args(&format!("mirror sync --from {fx}/mirror --to m --lock {lock}")),
            args(&format!(
                "mirror sync --from http://127.0.0.1:9 --to m2 --lock {lock} --attempts 1"
            )),
            Stream::Stdout,
        ),
        ("mirror verify", args("mirror verify m"), args("mirror verify no-such-mirror"), Stream::Stdout),
        (
            "mirror pack",
            args("mirror pack m --out m.tar.zst"),
            args("mirror pack no-such-mirror --out n.tar.zst"),
            Stream::Stdout,
        ),
        (
            "mirror unpack",
            args("mirror unpack m.tar.zst --to m3"),
            args("mirror unpack garbage.tar.zst --to m4"),
            Stream::Stdout,
        ),
        (
            "mirror push",
            match &registry {
                Some(r) => args(&format!(
                    "mirror push m --to oci://{}/kiln --registry-plain-http {} --backoff-ms 10",
                    r.host, r.host
                )),
                None => Vec::new(),
            },
            args("mirror push m --to oci://127.0.0.1:9/kiln --registry-plain-http 127.0.0.1:9 --attempts 1 --backoff-ms 10"),
            Stream::Stdout,
        ),
        ("plan", plan(&format!("--kubernetes-version {v}")), plan(""), Stream::Stdout),
        ("bake", bake(&format!("--kubernetes-version {v}")), bake(""), Stream::Stdout),
        (
            "verify",
            args(&format!("verify --rebuild {layer} --lock {lock} --store {fx}/mirror")),
            args("verify --rebuild missing.tar.zst"),
            Stream::Stdout,
        ),
        (
            "diff",
            args(&format!("diff {manifest} {manifest}")),
            args(&format!("diff {manifest} missing.manifest.json")),
            Stream::Stdout,
        ),
        (
            "install",
            args(&format!("install --dry-run {layer} --root root")),
            args(&format!("install {layer} --root no-such-root")),
            Stream::Stdout,
        ),
        (
            "image",
            Vec::new(), // below, with a base disk made for it
            args(&format!("image --base /dev/null --layer {layer} --out n.raw --format raw")),
            Stream::Stdout,
        ),
        (
            "key generate",
            args("key generate attest"),
            args("key generate attest"),
            Stream::Stdout,
        ),
        ("completions", args("completions bash"), args("completions nosuchshell"), Stream::Stderr),
        ("man", args("man --out man"), args("man --out /proc/kiln-man"), Stream::Stdout),
    ];

    let mut listed: Vec<&str> = table.iter().map(|t| t.0).collect();
    listed.sort_unstable();
    let mut leaves = leaf_commands();
    leaves.sort();
    assert_eq!(
        listed, leaves,
        "every command has a success and a failure run here"
    );

    for (cmd, ok, fail, stream) in &table {
        if !ok.is_empty() {
            let o = s.kiln(ok);
            let last = check_stream(&format!("{cmd} (success) {ok:?}"), &o, *stream);
            assert!(o.status.success(), "{cmd}: {last}");
            assert_eq!(last["command"], *cmd, "{last}");
        }
        // A command line clap refuses never reached the command, whose product stdout would
        // have been: its error event is on stdout.
        let refused_line = o_is_usage(fail);
        let o = s.kiln(fail);
        let last = check_stream(
            &format!("{cmd} (failure) {fail:?}"),
            &o,
            if refused_line {
                Stream::Stdout
            } else {
                *stream
            },
        );
        assert!(
            !o.status.success(),
            "{cmd}: the failure run succeeded: {last}"
        );
    }

    // render without --output: stdout is the user data, the events go to stderr.
    let o = s.kiln(&args("render --provisioner cloud-init node.toml"));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("#cloud-config"));
    check_stream("render to stdout", &o, Stream::Stderr);

    // kiln image: a base disk with an x86-64 root, the layer baked above.
    if crate::image_support::require(&["sgdisk", "mkfs.ext4"], true) {
        let dir = s.w.join("disk");
        std::fs::create_dir_all(&dir).unwrap();
        // gpt_base's 48 MiB root is for tiny layers; this one carries real binaries.
        use crate::image_support::{base_tree, ext4, gpt_disk, Part, ROOT_X86_64};
        let tree = base_tree(&dir);
        let fs = ext4(&dir, &tree, 256, "root");
        let base_disk = dir.join("base.raw");
        gpt_disk(
            &base_disk,
            264,
            &[Part {
                start: 1,
                mib: 256,
                kind: ROOT_X86_64,
                name: "root",
                fs: Some(&fs),
            }],
        );
        let o = s.kiln(&args(&format!(
            "image --base {} --layer {layer} --out node.raw --format raw",
            base_disk.display()
        )));
        let last = check_stream("image (success)", &o, Stream::Stdout);
        assert!(o.status.success(), "{last}");
    }
}

/// Whether these arguments are refused by clap (the table's `completions nosuchshell`).
fn o_is_usage(a: &[String]) -> bool {
    kiln::cli::Cli::command()
        .try_get_matches_from(std::iter::once("kiln".to_string()).chain(a.iter().cloned()))
        .is_err()
}

/// A usage error (clap's exit 2) is an `error` event too when `--json` is on the line, and the
/// same text on stderr as always.
#[test]
fn a_refused_command_line_is_a_json_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(["--json", "plan", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let last = check_stream("usage", &o, Stream::Stdout);
    assert_eq!(last["reason"], "usage");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--no-such-flag"));
}

/// Without `--json` nothing changes: no JSON line is printed.
#[test]
fn without_json_there_is_no_event() {
    let o = Command::new(env!("CARGO_BIN_EXE_kiln"))
        .arg("contract")
        .output()
        .unwrap();
    assert!(o.status.success());
    assert!(!String::from_utf8_lossy(&o.stdout).contains("\"event\""));
}
