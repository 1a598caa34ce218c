//! The pipeline examples in `docs/examples/ci/` run here, step by step, as their CI system
//! would run them (bash with `-e -o pipefail`, the example's own variables, one working copy),
//! against the fixture mirror instead of a site's: the layer, its checksums, the plan and the
//! bake's JSON must come out. What differs from a real run is named here and nowhere else:
//! the step that installs kiln (a download; the kiln under test is on `PATH` instead), the
//! mirror and lock (the fixture's, through the example's own `KILN_MIRROR` and `KILN_LOCK`),
//! the fixture's signing key (`KILN_TRUSTED_KEY`), its stand-in kubelet's version
//! (`KILN_KUBERNETES_VERSION`), and the architecture (amd64 only, the kiln-firstboot a
//! `make test` build has for certain).

use crate::bake_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use bake_support::fixture_mirror::{read_only_fixture, standin};
use bake_support::repo;
use serde_yaml_ng::Value;

/// One shell script of an example and the variables it runs with.
struct Step {
    what: String,
    script: String,
}

fn load(name: &str) -> Value {
    let p = repo().join("docs/examples/ci").join(name);
    let text = std::fs::read_to_string(&p).unwrap();
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn vars(map: &Value) -> Vec<(String, String)> {
    map.as_mapping()
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::String(s) => s.clone(),
                        other => serde_yaml_ng::to_string(other).unwrap().trim().to_string(),
                    };
                    (k.as_str().unwrap().to_string(), v)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The scratch working copy: what a checkout of a site's repository holds for these
/// examples (kiln's `images/`), and the fixture mirror beside it.
fn workspace(d: &Path) -> (PathBuf, PathBuf) {
    let work = d.join("work");
    std::fs::create_dir_all(&work).unwrap();
    let o = Command::new("cp")
        .arg("-a")
        .arg(repo().join("images"))
        .arg(&work)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let fx = read_only_fixture(d);
    (work, fx)
}

/// Runs the steps in `work` with `env` (the example's variables, then the fixture's
/// overrides), failing the test on the first that fails.
fn run(steps: &[Step], work: &Path, home: &Path, env: &[(String, String)]) {
    let bin = Path::new(env!("CARGO_BIN_EXE_kiln")).parent().unwrap();
    for s in steps {
        let mut c = Command::new("bash");
        c.args(["--noprofile", "--norc", "-e", "-o", "pipefail", "-c"])
            .arg(&s.script)
            .current_dir(work)
            .env(
                "PATH",
                format!(
                    "{}:{}",
                    bin.display(),
                    std::env::var("PATH").unwrap_or_default()
                ),
            )
            .env("HOME", home)
            .env_remove("KILN_CACHE")
            .env_remove("KILN_STORE")
            .env_remove("XDG_CACHE_HOME")
            .env("HTTPS_PROXY", "http://127.0.0.1:9")
            .env("HTTP_PROXY", "http://127.0.0.1:9");
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert!(
            o.status.success(),
            "{}: exited {:?}\n{}\n--- stdout\n{}--- stderr\n{}",
            s.what,
            o.status.code(),
            s.script,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// The fixture's differences from a site's run, each a variable the example declares (or,
/// for the last two, one kiln reads).
fn overrides(declared: &[(String, String)], fx: &Path) -> Vec<(String, String)> {
    for name in ["KILN_LOCK", "KILN_MIRROR"] {
        assert!(
            declared.iter().any(|(k, _)| k == name),
            "the example no longer declares {name}: the test's override would change nothing"
        );
    }
    vec![
        (
            "KILN_LOCK".into(),
            fx.join("artifacts.lock").display().to_string(),
        ),
        (
            "KILN_MIRROR".into(),
            fx.join("mirror").display().to_string(),
        ),
        (
            "KILN_TRUSTED_KEY".into(),
            fx.join("keys/fixture.pub").display().to_string(),
        ),
        ("KILN_KUBERNETES_VERSION".into(), standin()),
    ]
}

/// What both examples leave behind: the layer with its checksums, SBOM and manifest, a plan
/// that says every target is covered, and the bake's JSON ending in its result.
fn assert_outputs(work: &Path, example: &str) {
    let v = standin();
    let out = work.join("out");
    for f in [
        format!("ubuntu-{v}-amd64.tar.zst"),
        "SHA256SUMS".into(),
        format!("ubuntu-{v}-amd64.spdx.json"),
        format!("ubuntu-{v}-amd64.manifest.json"),
    ] {
        assert!(out.join(&f).is_file(), "{example}: no out/{f}");
    }
    let plan: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(work.join("plan.json"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(plan["covered"], true, "{example}: {plan}");
    let bake = std::fs::read_to_string(work.join("bake.jsonl")).unwrap();
    let events: Vec<serde_json::Value> = bake
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        events.last().unwrap()["event"],
        "result",
        "{example}: {bake}"
    );
    let last = events.iter().find(|e| e["event"] == "baked").unwrap();
    assert_eq!(last["arch"], "amd64", "{example}: {last}");
    assert!(
        last["image_id"]
            .as_str()
            .is_some_and(|i| i.starts_with("sha256:")),
        "{example}: {last}"
    );
}

#[test]
fn the_github_actions_example_bakes_from_a_mirror() {
    let y = load("github-actions.yml");
    let declared = vars(&y["env"]);
    let job = &y["jobs"]["bake"];
    assert_eq!(
        job["strategy"]["matrix"]["arch"],
        serde_yaml_ng::from_str::<Value>("[amd64, arm64]").unwrap()
    );
    let mut skipped = Vec::new();
    let mut steps = Vec::new();
    for s in job["steps"].as_sequence().unwrap() {
        let name = s["name"]
            .as_str()
            .or(s["uses"].as_str())
            .unwrap()
            .to_string();
        let Some(script) = s["run"].as_str() else {
            // `uses:` steps: the checkout and the artifact upload are GitHub's own.
            assert!(s["uses"].is_string(), "{name}: neither run nor uses");
            continue;
        };
        if name == "Install kiln" {
            skipped.push(name);
            continue;
        }
        steps.push(Step {
            what: format!("github-actions.yml step {name:?}"),
            script: script.replace("${{ matrix.arch }}", "amd64"),
        });
    }
    assert_eq!(
        skipped,
        ["Install kiln"],
        "the install step is the one not run"
    );
    assert!(steps.len() >= 5, "{} steps", steps.len());
    for s in &steps {
        assert!(
            !s.script.contains("${{"),
            "{}: unreplaced expression",
            s.what
        );
    }
    let d = tempfile::tempdir().unwrap();
    let (work, fx) = workspace(d.path());
    let mut env = declared.clone();
    env.extend(overrides(&declared, &fx));
    run(&steps, &work, &d.path().join("home"), &env);
    assert_outputs(&work, "github-actions.yml");
}

#[test]
fn the_gitlab_ci_example_bakes_from_a_mirror() {
    let y = load("gitlab-ci.yml");
    let declared = vars(&y["variables"]);
    let job = &y["bake"];
    let script: Vec<Step> = job["script"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .map(|l| Step {
            what: format!("gitlab-ci.yml script line {l:?}"),
            script: l.to_string(),
        })
        .collect();
    assert!(script.len() >= 5);
    assert!(
        job["before_script"].as_sequence().is_some(),
        "before_script installs kiln: the part not run here"
    );
    let d = tempfile::tempdir().unwrap();
    let (work, fx) = workspace(d.path());
    let mut env = declared.clone();
    env.extend(overrides(&declared, &fx));
    env.push(("ARCH".into(), "amd64".into()));
    // GitLab runs a job's script lines in one shell, in order.
    let one = Step {
        what: "gitlab-ci.yml script".into(),
        script: script
            .iter()
            .map(|s| s.script.as_str())
            .collect::<Vec<_>>()
            .join("\n"),
    };
    run(&[one], &work, &d.path().join("home"), &env);
    assert_outputs(&work, "gitlab-ci.yml");
}
