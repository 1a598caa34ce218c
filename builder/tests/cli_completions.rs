//! Shell completions and man pages come from the clap definition (`kiln completions`,
//! `kiln man`), and they work in the real programs: a real bash completes subcommands and
//! flags through the generated function, and groff renders every page without a warning.

use std::path::Path;
use std::process::Command;

fn kiln() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
}

/// What the generated bash function offers for the command line `words` (the cursor at the
/// end of the last word), run in a real `bash` the way readline's programmable completion
/// calls it: `COMP_WORDS`, `COMP_CWORD`, `COMP_LINE`, `COMP_POINT` set, then
/// `_kiln CMD CUR PREV`.
fn bash_complete(words: &[&str]) -> Vec<String> {
    let script = kiln().args(["completions", "bash"]).output().unwrap();
    assert!(script.status.success(), "{script:?}");
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("kiln.bash");
    std::fs::write(&file, &script.stdout).unwrap();
    let line = words.join(" ");
    let cword = words.len() - 1;
    let prev = if cword > 0 { words[cword - 1] } else { "" };
    let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
    let program = format!(
        "source '{}'\nCOMP_WORDS=({})\nCOMP_CWORD={cword}\nCOMP_LINE='{line}'\nCOMP_POINT={}\n\
         _kiln kiln '{}' '{prev}'\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        file.display(),
        quoted.join(" "),
        line.len(),
        words[cword],
    );
    let o = Command::new("bash")
        .args(["--norc", "--noprofile", "-c", &program])
        .output()
        .expect("bash must be installed: it is the shell the completion is tested in");
    assert!(
        o.status.success(),
        "bash failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

#[test]
fn bash_completes_subcommands_and_flags() {
    assert_eq!(bash_complete(&["kiln", "ba"]), ["bake"]);
    assert_eq!(bash_complete(&["kiln", "mirror", "s"]), ["sync"]);
    let flags = bash_complete(&["kiln", "bake", "--ar"]);
    assert_eq!(flags, ["--arch"]);
    // Every subcommand is offered on an empty word, and nothing that is not one.
    let all = bash_complete(&["kiln", ""]);
    for sub in [
        "bake",
        "fetch",
        "mirror",
        "lock",
        "render",
        "install",
        "image",
        "completions",
        "man",
    ] {
        assert!(all.iter().any(|c| c == sub), "{sub} not offered: {all:?}");
    }
    assert!(
        !all.iter().any(|c| c == "sync"),
        "a nested subcommand offered at the top: {all:?}"
    );
}

#[test]
fn every_shell_gets_a_script_that_names_the_commands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = kiln().args(["completions", shell]).output().unwrap();
        assert!(o.status.success(), "{shell}: {o:?}");
        let text = String::from_utf8(o.stdout).unwrap();
        for word in ["bake", "mirror", "trusted-key"] {
            assert!(text.contains(word), "{shell} script lacks {word}");
        }
    }
    // An unknown shell is a usage error (exit 2) naming the choices.
    let o = kiln().args(["completions", "tcsh"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bash"));
}

fn groff_warnings(page: &Path) -> String {
    // -k: preconv, as man-db runs it (the pages are UTF-8); -ww: every warning; -z: no output.
    let o = Command::new("groff")
        .args(["-k", "-man", "-ww", "-z", "-Tutf8"])
        .arg(page)
        .output()
        .expect("groff must be installed (make deps installs groff-base)");
    assert!(o.status.success(), "groff failed on {}", page.display());
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn man_pages_for_every_command_render_cleanly() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("man");
    let o = kiln().arg("man").arg("--out").arg(&out).output().unwrap();
    assert!(o.status.success(), "{o:?}");
    for page in [
        "kiln.1",
        "kiln-bake.1",
        "kiln-fetch.1",
        "kiln-mirror.1",
        "kiln-mirror-sync.1",
        "kiln-lock-verify.1",
        "kiln-render.1",
        "kiln-install.1",
    ] {
        let p = out.join(page);
        assert!(p.is_file(), "{page} not written");
        assert_eq!(groff_warnings(&p), "", "{page}");
    }
    // The pages name the command as typed, and carry the flags' help.
    let sync = std::fs::read_to_string(out.join("kiln-mirror-sync.1")).unwrap();
    assert!(sync.contains("kiln mirror sync"), "{sync}");
    assert!(sync.contains("trusted\\-key"), "{sync}");
    let n = std::fs::read_dir(&out).unwrap().count();
    assert!(n >= 20, "only {n} pages");
    // Nothing but the pages: no temporary files left behind.
    for e in std::fs::read_dir(&out).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(name.ends_with(".1") || name == "kiln-firstboot.8", "{name}");
    }
}

/// The words of `text` for comparison: lowercase, without the punctuation a page turns
/// into layout (a heading's colon, a parenthesised note's brackets).
fn words(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|w| w.trim_end_matches(':').to_lowercase())
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn kiln_firstboot_has_a_man_page_that_says_what_its_help_says() {
    let d = tempfile::tempdir().unwrap();
    let o = kiln()
        .arg("man")
        .arg("--out")
        .arg(d.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let page = d.path().join("kiln-firstboot.8");
    assert!(page.is_file(), "kiln man wrote no kiln-firstboot.8");
    assert_eq!(groff_warnings(&page), "", "kiln-firstboot.8");
    // What `man` shows: no wrapping (so no hyphenation), no bold or underline.
    let o = Command::new("groff")
        .args(["-k", "-man", "-Tutf8", "-rLL=1000n", "-P-cbou"])
        .arg(&page)
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    let shown = words(&String::from_utf8(o.stdout).unwrap());
    // Every word of kiln-firstboot's --help (its USAGE), in its order, is on the page (the
    // page only adds its own headings and references, and calls USAGE by man's name).
    let help = kiln_firstboot::cli::USAGE.replacen("\nUSAGE:\n", "\nSYNOPSIS:\n", 1);
    assert_ne!(
        help,
        kiln_firstboot::cli::USAGE,
        "USAGE has no USAGE: heading"
    );
    let mut at = 0;
    for w in words(&help) {
        match shown[at..].iter().position(|s| *s == w) {
            Some(i) => at += i + 1,
            None => panic!(
                "kiln-firstboot.8: expected {w:?} (from kiln-firstboot --help) after word {at} \
                 of the rendered page, found it missing:\n{}",
                shown.join(" ")
            ),
        }
    }
    for flag in help.split_whitespace().filter(|w| w.starts_with("--")) {
        let flag = flag.trim_matches(|c: char| !(c.is_alphanumeric() || c == '-'));
        assert!(
            shown.iter().any(|s| s.contains(flag)),
            "kiln-firstboot.8 lacks {flag}"
        );
    }
}
