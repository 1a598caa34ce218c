//! The Windows layer carries the real kiln-firstboot.exe: `make binary-gate` builds it
//! (`make windows`) and runs this test with `KILN_FIRSTBOOT_EXE` pointing at it; the bake must
//! pass the PE gate and put exactly those bytes at `k/kiln-firstboot.exe` in the zip.
//! Without the variable (a plain `cargo test`), a mingw-built PE stands in.

use crate::bake_support;

use std::process::Command;

use bake_support::*;

#[test]
fn windows_zip_carries_kiln_firstboot_exe_byte_for_byte() {
    let fx = fixture(Bins::Real);
    if let Some(exe) = std::env::var_os("KILN_FIRSTBOOT_EXE") {
        let bytes = std::fs::read(&exe)
            .unwrap_or_else(|e| panic!("KILN_FIRSTBOOT_EXE={exe:?}: cannot read it: {e}"));
        std::fs::write(&fx.firstboot_exe, bytes).unwrap();
    }
    let want = std::fs::read(&fx.firstboot_exe).unwrap();
    let out = fx.dir.path().join("out");
    ok(
        &bake_cli(
            &fx,
            &repo().join("images/windows.toml"),
            "windows",
            "amd64",
            &out,
            &[],
        ),
        "kiln bake windows",
    );
    let zip = out.join(format!("windows-{}-amd64.zip", kube_version()));
    let x = fx.dir.path().join("x");
    let unzip = Command::new("unzip")
        .arg("-q")
        .arg("-d")
        .arg(&x)
        .arg(&zip)
        .output()
        .unwrap();
    ok(&unzip, "unzip");
    let got = std::fs::read(x.join("k/kiln-firstboot.exe")).unwrap();
    assert!(
        got == want,
        "k/kiln-firstboot.exe in {zip:?} differs from the binary given to bake"
    );
    let inspect = kiln()
        .args(["inspect", "--json", "--os", "windows", "--arch", "amd64"])
        .arg(x.join("k/kiln-firstboot.exe"))
        .output()
        .unwrap();
    ok(&inspect, "kiln inspect");
    let json = String::from_utf8(inspect.stdout).unwrap();
    assert!(json.contains("\"subsystem\":\"console\""), "{json}");
    assert!(json.contains("\"is_64\":true"), "{json}");
}
