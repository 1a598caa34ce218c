//! Every command example in `docs/*.md` and `README.md` is either run or syntax-checked, so a
//! doc change that breaks an example fails the suite.
//!
//! The rules, which a page's author follows:
//! - Every fenced block names its language. Command examples are ` ```sh ` (commands only)
//!   or ` ```console ` (`$ command` lines, each followed by the output it prints); anything
//!   else (output, diagrams, synopses, file listings) is ` ```text ` or its format's name.
//! - A `sh`/`console` block runs in a scratch directory of its own (`images/` and
//!   `docs/examples/render/{node.toml,ca.crt}` copied in, `HOME` pointing into it, the built
//!   `kiln` first on `PATH`, HTTP(S) proxies set to a closed loopback port). Every command
//!   must exit 0, unless the output shown for it contains `error`. A `console` block's shown
//!   output (stdout and stderr together) must match what the command prints: `…` inside a
//!   line matches any text, a line that is only `…` matches any number of lines.
//! - An `export` line holds for the lines after it in the same block, as in a shell.
//! - `<!-- doc-test: setup COMMAND -->` lines before a block run first (in the same scratch
//!   directory) to make the files the example needs; they are not shown on the page.
//! - A block that cannot run here is marked on the line before it with
//!   `<!-- doc-test: REASON -->`, REASON one of [`SKIP_REASONS`]. It is then checked for
//!   syntax only: every `kiln …` command line must be accepted by kiln's own clap definition,
//!   every `kiln-firstboot …` by firstboot's parser, and every `make TARGET` must name a
//!   target of the Makefile. An unmarked block that fails to run fails the test, so a marker
//!   is the only way out, and each one says why.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::CommandFactory;

/// Why a block is only syntax-checked.
const SKIP_REASONS: &[&str] = &[
    // reaches upstream download sites or a mirror at a real URL
    "needs-internet",
    // needs a cloud account or a running cluster (aws …, kubectl …)
    "needs-cloud",
    // needs root, a mount, a booted node or a VM (sudo …, systemctl, kiln-firstboot on a node)
    "needs-root-vm",
    // needs the kiln release signing key
    "needs-secret-key",
    // needs a filled artifact store at the paths shown (/srv/mirror, ~/.cache/kiln)
    "needs-mirror",
    // runs make targets or cargo builds of the whole project (they are CI itself)
    "needs-build",
    // needs a tool the test machine does not have (cloud-localds, pyspdxtools, gpg keys)
    "needs-tool",
    // inspects binaries of the reader's machine (a host's /usr/bin/runc, a Windows kubelet.exe)
    "needs-host-binaries",
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One fenced block of a page.
#[derive(Debug)]
struct Block {
    page: String,
    /// 1-based line of the opening fence.
    line: usize,
    lang: String,
    body: Vec<String>,
    /// `<!-- doc-test: … -->` directives right above the block (blank lines allowed between).
    skip: Option<String>,
    setup: Vec<String>,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{}", self.page, self.line)
    }
}

fn blocks_of(page: &str, text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(info) = lines[i].strip_prefix("```") else {
            i += 1;
            continue;
        };
        let lang = info.trim().to_string();
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].starts_with("```") {
            body.push(lines[i].to_string());
            i += 1;
        }
        if i == lines.len() {
            return Err(format!(
                "{page}:{}: fenced block is never closed",
                start + 1
            ));
        }
        i += 1;
        let mut skip = None;
        let mut setup = Vec::new();
        let mut j = start;
        while j > 0 {
            j -= 1;
            let l = lines[j].trim();
            if l.is_empty() {
                continue;
            }
            let Some(d) = l
                .strip_prefix("<!-- doc-test:")
                .and_then(|d| d.strip_suffix("-->"))
            else {
                break;
            };
            let d = d.trim();
            if let Some(cmd) = d.strip_prefix("setup ") {
                setup.insert(0, cmd.to_string());
            } else if SKIP_REASONS.contains(&d) {
                skip = Some(d.to_string());
            } else {
                return Err(format!(
                    "{page}:{}: unknown doc-test directive {d:?} (known: setup COMMAND, {})",
                    j + 1,
                    SKIP_REASONS.join(", ")
                ));
            }
        }
        out.push(Block {
            page: page.to_string(),
            line: start + 1,
            lang,
            body,
            skip,
            setup,
        });
    }
    Ok(out)
}

fn pages() -> Vec<(String, String)> {
    let root = repo();
    let mut names: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    names.sort();
    names.push("README.md".into());
    names
        .into_iter()
        .map(|n| {
            let t = std::fs::read_to_string(root.join(&n)).unwrap();
            (n, t)
        })
        .collect()
}

/// A command example: the command (continuation lines joined) and, for `console`, the output
/// shown after it.
#[derive(Debug)]
struct Example {
    command: String,
    shown: Option<Vec<String>>,
}

fn examples(b: &Block) -> Vec<Example> {
    let mut out: Vec<Example> = Vec::new();
    let console = b.lang == "console";
    let mut lines = b.body.iter();
    while let Some(l) = lines.next() {
        let mut cmd = if console {
            match l.strip_prefix("$ ") {
                Some(c) => c.to_string(),
                None => {
                    if let Some(Example { shown: Some(s), .. }) = out.last_mut() {
                        s.push(l.clone());
                    }
                    continue;
                }
            }
        } else {
            l.clone()
        };
        while cmd.ends_with('\\') {
            cmd.pop();
            match lines.next() {
                Some(next) => cmd.push_str(next),
                None => break,
            }
        }
        let bare = cmd.trim();
        if bare.is_empty() || bare.starts_with('#') {
            continue;
        }
        out.push(Example {
            command: cmd,
            shown: console.then(Vec::new),
        });
    }
    for e in &mut out {
        if let Some(s) = &mut e.shown {
            while s.last().is_some_and(|l| l.trim().is_empty()) {
                s.pop();
            }
        }
    }
    out
}

/// Splits a shell line into simple commands (words, quotes removed), dropping comments and
/// redirections. Enough shell for documentation: quotes, `$(…)`, `&&`, `||`, `;`, `|`, `&`.
fn simple_commands(line: &str) -> Vec<Vec<String>> {
    let mut cmds = vec![Vec::new()];
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    let mut redirect = false;
    let end_word = |word: &mut String,
                    in_word: &mut bool,
                    redirect: &mut bool,
                    cmds: &mut Vec<Vec<String>>| {
        if *in_word {
            if *redirect {
                *redirect = false;
            } else {
                cmds.last_mut().unwrap().push(std::mem::take(word));
            }
            word.clear();
            *in_word = false;
        }
    };
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            if let Some(n) = chars.next() {
                                word.push(n);
                            }
                        }
                        _ => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(n) = chars.next() {
                    word.push(n);
                }
            }
            '$' if chars.peek() == Some(&'(') => {
                in_word = true;
                word.push('$');
                let mut depth = 0;
                for c in chars.by_ref() {
                    word.push(c);
                    match c {
                        '(' => depth += 1,
                        ')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                }
            }
            '#' if !in_word => break,
            ' ' | '\t' => end_word(&mut word, &mut in_word, &mut redirect, &mut cmds),
            ';' | '&' | '|' => {
                end_word(&mut word, &mut in_word, &mut redirect, &mut cmds);
                if chars.peek() == Some(&c) {
                    chars.next();
                }
                cmds.push(Vec::new());
            }
            '>' | '<' => {
                // `2>`: the fd number is part of the redirection, not a word.
                if in_word && word.chars().all(|c| c.is_ascii_digit()) {
                    word.clear();
                    in_word = false;
                } else {
                    end_word(&mut word, &mut in_word, &mut redirect, &mut cmds);
                }
                while chars.peek().is_some_and(|n| matches!(n, '>' | '&')) {
                    chars.next();
                }
                // `2>&1` names no file
                if chars.peek().is_some_and(char::is_ascii_digit) {
                    chars.next();
                } else {
                    redirect = true;
                }
            }
            _ => {
                in_word = true;
                word.push(c);
            }
        }
    }
    end_word(&mut word, &mut in_word, &mut redirect, &mut cmds);
    cmds.retain(|c| !c.is_empty());
    // `sudo`, `VAR=value` prefixes and `( … )` subshells do not change what runs.
    for c in &mut cmds {
        while let Some(first) = c.first() {
            let assignment = first.split_once('=').is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
            });
            if first == "sudo" || assignment {
                c.remove(0);
            } else if let Some(rest) = first.strip_prefix('(') {
                c[0] = rest.to_string();
                if c[0].is_empty() {
                    c.remove(0);
                }
            } else {
                break;
            }
        }
        if let Some(last) = c.last_mut() {
            if last.ends_with(')') && !last.contains('(') {
                last.pop();
            }
        }
        c.retain(|w| !w.is_empty());
    }
    cmds.retain(|c| !c.is_empty());
    cmds
}

fn make_targets() -> Vec<String> {
    let text = std::fs::read_to_string(repo().join("Makefile")).unwrap();
    text.lines()
        .filter(|l| !l.starts_with(['\t', '#', ' ', '.']))
        .filter_map(|l| l.split_once(':'))
        .filter(|(_, rest)| !rest.starts_with('='))
        .flat_map(|(t, _)| t.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter(|t| !t.contains(['$', '=', '?']))
        .collect()
}

/// Checks one command line's `kiln`, `kiln-firstboot` and `make` invocations for syntax.
fn check_syntax(line: &str, targets: &[String]) -> Result<(), String> {
    for words in simple_commands(line) {
        let prog = Path::new(&words[0])
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_default();
        match prog.as_str() {
            "kiln" => {
                if let Err(e) = kiln::cli::Cli::command().try_get_matches_from(&words) {
                    use clap::error::ErrorKind::{DisplayHelp, DisplayVersion};
                    if !matches!(e.kind(), DisplayHelp | DisplayVersion) {
                        return Err(format!("{words:?}: kiln refuses it: {}", e.render()));
                    }
                }
            }
            "kiln-firstboot" => {
                kiln_firstboot::cli::parse(&words[1..])
                    .map_err(|e| format!("{words:?}: kiln-firstboot refuses it: {e}"))?;
            }
            "make" => {
                for t in words[1..]
                    .iter()
                    .filter(|w| !w.starts_with('-') && !w.contains('='))
                {
                    if !targets.contains(t) {
                        return Err(format!("{words:?}: the Makefile has no target {t:?}"));
                    }
                }
            }
            _ if (words[0].starts_with("scripts/") || words[0].starts_with("bench/"))
                && !repo().join(&words[0]).is_file() =>
            {
                return Err(format!("{words:?}: no such script in the repository"));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Does `actual` match the `shown` lines (`…` placeholders)?
fn output_matches(shown: &[String], actual: &[&str]) -> bool {
    fn line_matches(pat: &str, text: &str) -> bool {
        let parts: Vec<&str> = pat.split('…').collect();
        if parts.len() == 1 {
            return pat.trim_end() == text.trim_end();
        }
        let mut rest = text;
        for (i, p) in parts.iter().enumerate() {
            if i == 0 {
                let Some(r) = rest.strip_prefix(p) else {
                    return false;
                };
                rest = r;
            } else if i == parts.len() - 1 {
                return rest.trim_end().ends_with(p.trim_end());
            } else {
                match rest.find(p) {
                    Some(k) => rest = &rest[k + p.len()..],
                    None => return false,
                }
            }
        }
        true
    }
    match shown.split_first() {
        None => actual.is_empty(),
        Some((first, rest)) if first.trim() == "…" => {
            (0..=actual.len()).any(|k| output_matches(rest, &actual[k..]))
        }
        Some((first, rest)) => {
            !actual.is_empty()
                && line_matches(first, actual[0])
                && output_matches(rest, &actual[1..])
        }
    }
}

fn scratch(dir: &Path) {
    let root = repo();
    let copy = |from: &Path, to: &Path| {
        let o = Command::new("cp")
            .arg("-a")
            .arg(from)
            .arg(to)
            .output()
            .unwrap();
        assert!(o.status.success(), "cp {from:?}: {o:?}");
    };
    copy(&root.join("images"), dir);
    for f in ["node.toml", "ca.crt"] {
        copy(&root.join("docs/examples/render").join(f), dir);
    }
    std::fs::create_dir_all(dir.join("home")).unwrap();
}

/// Runs one line in the page's scratch directory; returns (exit status, stdout+stderr).
fn run_line(dir: &Path, line: &str) -> (Option<i32>, String) {
    let bin = Path::new(env!("CARGO_BIN_EXE_kiln")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let o = Command::new("bash")
        .arg("-o")
        .arg("pipefail")
        .arg("-c")
        .arg(format!("exec 2>&1; {line}"))
        .current_dir(dir)
        .env("PATH", path)
        .env("HOME", dir.join("home"))
        .env_remove("KILN_TRUSTED_KEY")
        .env_remove("KILN_SECRET_KEY")
        .env_remove("KILN_SIGN_KEY")
        .env("NO_COLOR", "1")
        // Nothing a documented command does may leave the machine: every HTTP client it
        // starts goes to a closed loopback port instead.
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("ALL_PROXY", "http://127.0.0.1:9")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

/// Checks every page; returns the failures (empty when all is well) and counts.
fn check_pages(pages: &[(String, String)]) -> (Vec<String>, usize, usize) {
    let targets = make_targets();
    let mut failures = Vec::new();
    let (mut ran, mut syntax_only) = (0, 0);
    for (page, text) in pages {
        let blocks = match blocks_of(page, text) {
            Ok(b) => b,
            Err(e) => {
                failures.push(e);
                continue;
            }
        };
        for b in &blocks {
            if b.lang.is_empty() {
                failures.push(format!(
                    "{}: fenced block without a language: tag it `sh` or `console` (a command \
                     example) or `text` (anything else)",
                    b.at()
                ));
                continue;
            }
            if b.lang != "sh" && b.lang != "console" {
                continue;
            }
            let exs = examples(b);
            if exs.is_empty() {
                failures.push(format!("{}: a {} block without a command", b.at(), b.lang));
            }
            for e in &exs {
                if let Err(msg) = check_syntax(&e.command, &targets) {
                    failures.push(format!("{}: {msg}", b.at()));
                }
            }
            if b.skip.is_some() {
                syntax_only += 1;
                continue;
            }
            ran += 1;
            let dir = tempfile::tempdir().unwrap();
            scratch(dir.path());
            for s in &b.setup {
                let (code, out) = run_line(dir.path(), s);
                if code != Some(0) {
                    failures.push(format!("{}: setup `{s}` exited {code:?}:\n{out}", b.at()));
                }
            }
            // `export` lines hold for the rest of their block, as in the reader's shell.
            let mut exports = String::new();
            for e in &exs {
                let line = format!("{exports}{}", e.command);
                if e.command.trim_start().starts_with("export ") {
                    exports.push_str(&e.command);
                    exports.push('\n');
                }
                let (code, out) = run_line(dir.path(), &line);
                let may_fail = e
                    .shown
                    .as_ref()
                    .is_some_and(|s| s.iter().any(|l| l.contains("error")));
                if code != Some(0) && !may_fail {
                    failures.push(format!(
                        "{}: `{}` exited {code:?} (mark the block with <!-- doc-test: REASON --> \
                         if it cannot run here):\n{out}",
                        b.at(),
                        e.command
                    ));
                    continue;
                }
                if let Some(shown) = &e.shown {
                    let actual: Vec<&str> = out.lines().collect();
                    if !output_matches(shown, &actual) {
                        let mut m = String::new();
                        let _ = writeln!(m, "{}: `{}` printed something else", b.at(), e.command);
                        let _ = writeln!(m, "--- shown on the page");
                        for l in shown {
                            let _ = writeln!(m, "{l}");
                        }
                        let _ = writeln!(m, "--- printed (exit {code:?})");
                        m.push_str(&out);
                        failures.push(m);
                    }
                }
            }
        }
    }
    (failures, ran, syntax_only)
}

#[test]
fn every_documented_command_runs_or_parses() {
    let (failures, ran, syntax_only) = check_pages(&pages());
    eprintln!("docs examples: {ran} blocks run, {syntax_only} checked for syntax only");
    assert!(
        failures.is_empty(),
        "{} documentation example(s) fail:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(
        ran >= 10,
        "only {ran} blocks ran: the harness lost its pages"
    );
}

/// The README is the way in: it links every page of `docs/`, and says what kiln does not do.
#[test]
fn the_readme_links_every_doc_page() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let missing: Vec<String> = pages()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|n| n.starts_with("docs/") && !readme.contains(&format!("]({n})")))
        .collect();
    assert!(missing.is_empty(), "README.md links none of {missing:?}");
    assert!(readme.contains("What kiln does not do"));
}

#[test]
fn the_harness_catches_broken_examples() {
    let page = |body: &str| vec![("docs/t.md".to_string(), body.to_string())];
    let cases = [
        // a flag kiln does not have, in a block marked as not runnable
        "<!-- doc-test: needs-internet -->\n```sh\nkiln fetch --lock images/artifacts.lock\n```\n",
        // a flag kiln-firstboot does not have
        "<!-- doc-test: needs-root-vm -->\n```sh\nsudo kiln-firstboot run --no-such\n```\n",
        // a make target that does not exist
        "<!-- doc-test: needs-build -->\n```sh\nmake tests\n```\n",
        // output that differs
        "```console\n$ kiln contract\nKILN_CONTRACT=2\n```\n",
        // an unmarked block that cannot run
        "```sh\nkiln lock verify /nonexistent.lock\n```\n",
        // an untagged block
        "```\nkiln contract\n```\n",
        // an unknown marker
        "<!-- doc-test: too-hard -->\n```sh\nkiln contract\n```\n",
    ];
    for body in cases {
        let (failures, _, _) = check_pages(&page(body));
        assert_eq!(failures.len(), 1, "{body}\n{failures:#?}");
    }
    // an export holds for the block's later lines, and only for them
    let carried =
        "```sh\nexport KILN_X=1\ntest \"$KILN_X\" = 1\n```\n```sh\ntest -z \"$KILN_X\"\n```\n";
    let (failures, ran, _) = check_pages(&page(carried));
    assert!(failures.is_empty() && ran == 2, "{failures:#?}");
    let good = "```console\n$ kiln contract\nKILN_…\n$ kiln contract\n…\n```\n";
    let (failures, ran, _) = check_pages(&page(good));
    assert!(failures.is_empty() && ran == 1, "{failures:#?}");
}

#[test]
fn shell_lines_split_into_commands() {
    let cases: &[(&str, &[&[&str]])] = &[
        ("kiln contract", &[&["kiln", "contract"]]),
        (
            "sudo kiln install a.tar.zst --root /mnt  # comment",
            &[&["kiln", "install", "a.tar.zst", "--root", "/mnt"]],
        ),
        (
            "kiln render -p cloud-init node.toml > user-data 2>&1 && cat user-data",
            &[
                &["kiln", "render", "-p", "cloud-init", "node.toml"],
                &["cat", "user-data"],
            ],
        ),
        (
            "KILN_SIGN_KEY=a@b kiln bake 'x y.toml'; echo $?",
            &[&["kiln", "bake", "x y.toml"], &["echo", "$?"]],
        ),
        (
            "cargo run -- --metadata-url $(cat /tmp/u) | tee x",
            &[
                &["cargo", "run", "--", "--metadata-url", "$(cat /tmp/u)"],
                &["tee", "x"],
            ],
        ),
        (
            "(umask 077; echo a > f)",
            &[&["umask", "077"], &["echo", "a"]],
        ),
    ];
    for (line, want) in cases {
        let got = simple_commands(line);
        let want: Vec<Vec<String>> = want
            .iter()
            .map(|c| c.iter().map(|w| w.to_string()).collect())
            .collect();
        assert_eq!(got, want, "{line}");
    }
}
