//! The `kiln-report` task: on Windows, Task Scheduler runs `kiln-firstboot report` where
//! systemd's `kiln-report.timer` and kubelet's `OnFailure=` do on Linux. `kiln bake` writes
//! the task definition into the layer (`C:\k\kiln\kiln-report.xml`, builder
//! `bake/units.rs`); `install` registers it with `schtasks.exe`, `uninstall` removes it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The task's name in Task Scheduler's root folder.
pub const TASK_NAME: &str = "kiln-report";

/// Where the layer carries the task definition, under the binaries' folder.
pub fn definition(bin_dir: &Path) -> PathBuf {
    bin_dir.join("kiln").join("kiln-report.xml")
}

/// Registers (or replaces) task `name` from the definition at `xml`. A missing definition is
/// an error naming it: a layer from before the task existed needs baking again.
pub fn register(name: &str, xml: &Path) -> Result<(), String> {
    if !xml.is_file() {
        return Err(format!(
            "{}: the kiln-report task definition is missing (bake the layer with this kiln)",
            xml.display()
        ));
    }
    let xml = xml.display().to_string();
    let args = ["/Create", "/TN", name, "/XML", &xml, "/F"];
    schtasks(&args)
}

/// Removes task `name`.
pub fn unregister(name: &str) -> Result<(), String> {
    schtasks(&["/Delete", "/TN", name, "/F"])
}

fn schtasks(args: &[&str]) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    crate::service::run("schtasks.exe", args, deadline).map_err(|e| e.message().to_string())
}
