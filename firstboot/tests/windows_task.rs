//! The `kiln-report` task (Task Scheduler) that runs `kiln-firstboot report` on Windows: the
//! definition `kiln bake` puts in the layer (the fixture, which builder's
//! `report_task_is_firstboots_fixture` keeps equal to what it bakes) agrees with what
//! kiln-firstboot registers and parses; under Wine, `schtasks.exe` registers and removes it.

use std::path::Path;

use kiln_firstboot::cli::{self, Command};
use kiln_firstboot::windows::{node_services, task};

const FIXTURE: &str = include_str!("fixtures/windows/kiln-report.xml");

/// The text between `<tag>` and `</tag>`.
fn element<'a>(xml: &'a str, tag: &str) -> &'a str {
    let open = format!("<{tag}>");
    let start = xml.find(&open).unwrap_or_else(|| panic!("no <{tag}>")) + open.len();
    let end = xml[start..].find(&format!("</{tag}>")).unwrap() + start;
    &xml[start..end]
}

#[test]
fn the_task_runs_report_from_the_layer_and_watches_the_kubelet_service() {
    let bin_dir = Path::new(r"C:\k");
    let exe = bin_dir.join("kiln-firstboot.exe").display().to_string();
    assert_eq!(
        element(FIXTURE, "Command").replace('/', "\\"),
        exe.replace('/', "\\")
    );
    let args: Vec<String> = element(FIXTURE, "Arguments")
        .split(' ')
        .map(str::to_string)
        .collect();
    match cli::parse(&args) {
        Ok(Command::Report { quiet, .. }) => assert!(quiet),
        other => panic!("{args:?} is not `report --quiet`: {other:?}"),
    }
    // The event trigger names kubelet by the display name `install` gives its service, the
    // name the SCM puts in its events' param1.
    let kubelet = node_services(bin_dir, Path::new("C:\\"))
        .into_iter()
        .find(|s| s.name == "kubelet")
        .unwrap();
    let sub = element(FIXTURE, "Subscription");
    assert!(
        sub.contains(&format!("@Name='param1']='{}'", kubelet.display_name)),
        "{sub}"
    );
    for id in ["7023", "7024", "7031", "7034"] {
        assert!(sub.contains(&format!("EventID={id}")), "{id}: {sub}");
    }
    assert_eq!(element(FIXTURE, "Interval"), "PT1M");
    assert_eq!(element(FIXTURE, "UserId"), "S-1-5-18");
    assert_eq!(
        task::definition(bin_dir)
            .display()
            .to_string()
            .replace('/', "\\"),
        r"C:\k\kiln\kiln-report.xml"
    );
}

#[test]
fn a_missing_definition_is_an_error_naming_it() {
    let missing = std::env::temp_dir()
        .join("kiln-no-such-dir")
        .join("kiln-report.xml");
    let e = task::register("kiln-report-never", &missing).unwrap_err();
    assert!(
        e.contains("kiln-report.xml") && e.contains("task definition is missing"),
        "{e}"
    );
}

/// Under Wine: Wine's `schtasks.exe` hands the definition to its Task Scheduler
/// (taskschd.dll), whose XML reader must accept it, and stores the task in
/// `C:\windows\system32\tasks`. Wine drops the triggers and the action while reading
/// (`read_triggers`/`read_actions` are stubs) and runs no task, so only registration is
/// checked here.
#[cfg(windows)]
#[test]
fn schtasks_registers_and_removes_the_task() {
    let name = format!("kiln-report-test-{}", std::process::id());
    let dir = std::env::temp_dir().join(format!("kiln-task-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let xml = dir.join("kiln-report.xml");
    std::fs::write(&xml, FIXTURE).unwrap();
    let windir = std::env::var("SystemRoot").unwrap_or_else(|_| r"C:\windows".into());
    let stored = Path::new(&windir)
        .join("system32")
        .join("tasks")
        .join(&name);
    task::register(&name, &xml).unwrap();
    assert!(stored.is_file(), "{} missing", stored.display());
    // Registering again replaces it (/F), as `install` run twice must.
    task::register(&name, &xml).unwrap();
    task::unregister(&name).unwrap();
    assert!(!stored.exists(), "{} still there", stored.display());
    // Not tried here: a truncated definition makes Wine's schtasks.exe hang (its XML reader
    // waits for more), which `register` ends at its 60 s bound with an error.
}
