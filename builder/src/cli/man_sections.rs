//! The man page sections clap cannot write: EXIT STATUS and EXAMPLES. Both come from
//! `docs/cli.md`, whose exit code table and examples the documentation tests already hold to
//! kiln's behaviour, so a page and the guide cannot disagree.

use std::fmt::Write as _;

/// The command line guide, compiled in.
const GUIDE: &str = include_str!("../../../docs/cli.md");

/// The most examples one page lists; a command group's page would otherwise list all of its
/// subcommands' examples.
const MAX_EXAMPLES: usize = 4;

/// The roff of both sections for the page of `command` (`kiln`, `kiln lock verify`, …).
pub fn roff(command: &str) -> String {
    let mut out = exit_status(GUIDE);
    let examples = examples(GUIDE, command);
    if !examples.is_empty() {
        out.push_str(".SH EXAMPLES\n.nf\n");
        for e in examples {
            let _ = writeln!(out, "{}", escape(&e));
        }
        out.push_str(".fi\n");
        out.push_str(".PP\nMore in the kiln command line guide, docs/cli.md.\n");
    }
    out
}

/// EXIT STATUS from the guide's `## Exit codes` table (`| code | meaning |` rows).
fn exit_status(guide: &str) -> String {
    let mut out = String::from(".SH \"EXIT STATUS\"\n");
    let table = guide
        .split_once("\n## Exit codes\n")
        .map_or("", |(_, rest)| rest.split("\n## ").next().unwrap_or(""));
    for row in table.lines().filter(|l| l.starts_with('|')) {
        // `\|` is a `|` inside a cell.
        let row = row.replace("\\|", "\u{1}");
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let [code, meaning] = cells[..] else { continue };
        if code.parse::<u8>().is_err() {
            continue;
        }
        let _ = write!(
            out,
            ".TP\n\\fB{code}\\fR\n{}\n",
            escape(&meaning.replace('`', "").replace('\u{1}', "|"))
        );
    }
    out
}

/// The example command lines of the guide (before its generated reference) that run
/// `command`: `$ kiln …` lines of console blocks and `kiln …` lines of sh blocks.
fn examples(guide: &str, command: &str) -> Vec<String> {
    let guide = guide.split("\n## Reference").next().unwrap_or(guide);
    let mut found = Vec::new();
    let mut in_block = false;
    for line in guide.lines() {
        if line.starts_with("```") {
            in_block = !in_block && (line == "```console" || line == "```sh");
            continue;
        }
        if !in_block {
            continue;
        }
        let cmd = line.strip_prefix("$ ").unwrap_or(line);
        let runs = cmd
            .strip_prefix(command)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '));
        if runs && command != "kiln" && !found.iter().any(|f: &String| f == cmd) {
            found.push(cmd.to_string());
        }
        if found.len() == MAX_EXAMPLES {
            break;
        }
    }
    found
}

/// Text as roff reads it literally: backslashes doubled, a leading `.` or `'` guarded.
fn escape(text: &str) -> String {
    let text = text.replace('\\', "\\e");
    if text.starts_with('.') || text.starts_with('\'') {
        format!("\\&{text}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_holds_every_code_of_the_guide() {
        let s = exit_status(GUIDE);
        for code in [0, 1, 2, 3, 4, 5, 6, 141] {
            assert!(s.contains(&format!(".TP\n\\fB{code}\\fR\n")), "{code}: {s}");
        }
        assert!(s.contains("kiln plan … | head -1"), "{s}");
    }

    #[test]
    fn examples_are_the_commands_own() {
        let e = examples(GUIDE, "kiln lock verify");
        assert!(!e.is_empty());
        assert!(e.iter().all(|l| l.starts_with("kiln lock verify")), "{e:?}");
        // A group's page gathers its subcommands' examples, up to the cap.
        let lock = examples(GUIDE, "kiln lock");
        assert!(lock.len() > 1 && lock.len() <= MAX_EXAMPLES, "{lock:?}");
        assert!(examples(GUIDE, "kiln").is_empty());
        assert!(examples(GUIDE, "kiln nosuchcommand").is_empty());
    }

    #[test]
    fn roff_text_cannot_start_a_request() {
        assert_eq!(escape(".hidden"), "\\&.hidden");
        assert_eq!(escape("a\\b"), "a\\eb");
    }
}
