//! Acting on a node after it joined: a scenario's guest script that runs once kiln-firstboot
//! has recorded its result, before the report unit prints the node's files and powers off.
//! Each step prints one `KILN-TEST-STEP <name> <words…>` line on the console and may print
//! files as `KILN-TEST-STEP-FILE <step> <path> <line>`; the test reads them back with
//! [`steps`] and [`step_files`], and every `KILN-STATUS` line kiln printed with [`statuses`].
//! Every wait in a script is bounded, so a node that never does what the step waits for ends
//! the script with a `…-not-…` step, not a hang.

use std::collections::BTreeMap;

use crate::console::Line;
use crate::guest::{console_unit, Root};
use crate::Result;

/// Where the script is placed in the guest (test equipment, not part of the image).
pub const GUEST_SCRIPT: &str = "/opt/kiln-test/after-join.sh";
/// The unit that runs it.
pub const UNIT: &str = "kiln-test-after-join.service";

/// Installs `script` (bash) to run after kiln-firstboot, with its output on the console, and
/// orders the report unit ([`crate::node::finish_root`]) after it, so the report shows the
/// node as the script left it.
pub fn install(root: &Root, script: &str) -> Result<()> {
    root.write(GUEST_SCRIPT, script, 0o755)?;
    let unit = console_unit(
        "boot test: act on the node after it joined",
        "kiln-firstboot.service",
        &format!("exec {GUEST_SCRIPT}"),
    )
    // Never pull firstboot in, never power off: the report unit comes next and does.
    .replace("Wants=kiln-firstboot.service\n", "")
    .replace("ExecStopPost=/bin/systemctl poweroff --no-block\n", "")
    .replace("[Service]\n", "[Service]\nTimeoutStartSec=900\n");
    root.add_unit(UNIT, &unit, "multi-user.target")?;
    root.write(
        "etc/systemd/system/kiln-test-report.service.d/10-after-join.conf",
        format!("[Unit]\nAfter={UNIT}\n"),
        0o644,
    )?;
    Ok(())
}

/// The shell functions every after-join script starts with.
pub const PRELUDE: &str = r#"#!/bin/bash
set -u
status=/run/kiln/status.json
step() { echo "KILN-TEST-STEP $*"; }
# show STEP FILE...: each existing file, one KILN-TEST-STEP-FILE line per line
show() {
  local s=$1 f
  shift
  for f in "$@"; do
    [ -f "$f" ] && sed "s|^|KILN-TEST-STEP-FILE $s $f |" "$f" && echo
  done
  return 0
}
# wait_result RESULT SECONDS [REASON]: status.json's outcome is RESULT (an ERE), and its
# reason REASON if given, as `kiln-firstboot status` reads them (a grep of the file would also
# match the phases' own "result" keys)
wait_result() {
  local i want="^kiln-firstboot: ($1)( |$)"
  [ -z "${3:-}" ] || want="^kiln-firstboot: ($1) \($3\)( |$)"
  for i in $(seq "$2"); do
    kiln-firstboot status 2>/dev/null | head -n 1 | grep -Eq "$want" && return 0
    sleep 1
  done
  return 1
}
# prop UNIT PROPERTY: one property of a unit, as systemctl show has it
prop() { systemctl show -p "$2" --value "$1"; }
# kiln-firstboot's own run first (the report unit waits for it the same way)
if ! wait_result 'success|failure' 600 || ! wait_result success 1; then
  step not-joined
  exit 0
fi
step joined
"#;

/// One `KILN-TEST-STEP` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Host milliseconds since QEMU started.
    pub host_ms: u64,
    /// The step's name (the first word).
    pub name: String,
    /// `key=value` words after the name.
    pub values: BTreeMap<String, String>,
}

impl Step {
    /// A `key=value` word of the line.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }
}

/// The steps in console order.
pub fn steps(lines: &[Line]) -> Vec<Step> {
    lines
        .iter()
        .filter_map(|l| {
            let rest = l.text.strip_prefix("KILN-TEST-STEP ")?;
            let mut words = rest.split_whitespace();
            let name = words.next()?.to_string();
            let values = words
                .filter_map(|w| w.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            Some(Step {
                host_ms: l.host_ms,
                name,
                values,
            })
        })
        .collect()
}

/// The first step called `name`.
pub fn step<'a>(steps: &'a [Step], name: &str) -> Option<&'a Step> {
    steps.iter().find(|s| s.name == name)
}

/// The files a step printed: path → lines.
pub fn step_files(lines: &[Line], step: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let prefix = format!("KILN-TEST-STEP-FILE {step} ");
    for l in lines {
        if let Some(rest) = l.text.strip_prefix(&prefix) {
            let (path, line) = rest.split_once(' ').unwrap_or((rest, ""));
            out.entry(path.to_string())
                .or_default()
                .push(line.to_string());
        }
    }
    out
}

/// Every `KILN-STATUS` line in console order: (host ms, the status JSON).
pub fn statuses(lines: &[Line]) -> Vec<(u64, serde_json::Value)> {
    lines
        .iter()
        .filter_map(|l| {
            let json = l.text.strip_prefix("KILN-STATUS ")?;
            Some((l.host_ms, serde_json::from_str(json).ok()?))
        })
        .collect()
}

/// Console lines containing `needle`, with their host ms.
pub fn lines_with<'a>(lines: &'a [Line], needle: &str) -> Vec<&'a Line> {
    lines.iter().filter(|l| l.text.contains(needle)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(texts: &[&str]) -> Vec<Line> {
        texts
            .iter()
            .enumerate()
            .map(|(i, t)| Line {
                host_ms: 1000 * i as u64,
                text: t.to_string(),
            })
            .collect()
    }

    #[test]
    fn steps_files_and_statuses_are_read_in_order() {
        let l = lines(&[
            r#"KILN-STATUS {"result":"success"}"#,
            "KILN-TEST-STEP joined",
            "KILN-TEST-STEP restarting from=2 to=4 state=activating/auto-restart",
            "KILN-TEST-STEP-FILE failing /run/kiln/failure KUBELET_CONFIG_INVALID",
            "KILN-TEST-STEP-FILE failing /run/kiln/failure a message with spaces",
            "KILN-TEST-STEP-FILE recovered /run/kiln/status.json {}",
            r#"KILN-STATUS {"result":"failure","reason":"X"}"#,
            "KILN-STATUS not json",
        ]);
        let s = steps(&l);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].name, "joined");
        let r = step(&s, "restarting").unwrap();
        assert_eq!((r.host_ms, r.get("to")), (2000, Some("4")));
        assert_eq!(r.get("state"), Some("activating/auto-restart"));
        assert!(step(&s, "fixed").is_none());
        let f = step_files(&l, "failing");
        assert_eq!(
            f["/run/kiln/failure"],
            ["KUBELET_CONFIG_INVALID", "a message with spaces"]
        );
        assert_eq!(f.len(), 1);
        let st = statuses(&l);
        assert_eq!(st.len(), 2);
        assert_eq!((st[1].0, &st[1].1["reason"]), (6000, &"X".into()));
    }

    #[test]
    fn the_unit_runs_the_script_and_orders_the_report_after_it() {
        let tmp = tempfile::tempdir().unwrap();
        let root = Root {
            dir: tmp.path().to_path_buf(),
        };
        install(&root, "#!/bin/bash\necho hi\n").unwrap();
        let unit =
            std::fs::read_to_string(tmp.path().join("etc/systemd/system").join(UNIT)).unwrap();
        assert!(unit.contains("After=kiln-firstboot.service\n"), "{unit}");
        assert!(!unit.contains("Wants="), "{unit}");
        assert!(!unit.contains("poweroff"), "{unit}");
        assert!(unit.contains(GUEST_SCRIPT), "{unit}");
        let dropin = std::fs::read_to_string(
            tmp.path()
                .join("etc/systemd/system/kiln-test-report.service.d/10-after-join.conf"),
        )
        .unwrap();
        assert_eq!(dropin, format!("[Unit]\nAfter={UNIT}\n"));
    }
}
