//! kiln-firstboot's man page, `kiln-firstboot.8`, rendered as roff from the text of its
//! `--help` ([`kiln_firstboot::cli::USAGE`]), so the page cannot say anything the program's
//! own help does not: a flag added to the help is on the page at the next build. `kiln man`
//! writes it beside kiln's pages; the rootfs layer installs it gzipped at
//! [`LAYER_PATH`].
//!
//! The help's shape, which [`render`] relies on and refuses to guess past: a first line
//! `kiln-firstboot: DESCRIPTION`; sections opened by an unindented line ending in `:`
//! (`USAGE:` holds the synopsis; any other, e.g. `RUN FLAGS:` or `DOCTOR (NOTE):`, is a
//! section of text and flags); a flag line `  --flag [METAVAR] description` with its
//! description continued on more deeply indented lines, and section text as lines indented
//! like flags that are not flags; and unindented paragraphs after the sections
//! (`Label: text` becomes a section `LABEL`, `See …` the SEE ALSO section).

use std::io::Write as _;

/// The page's file name.
pub const PAGE: &str = "kiln-firstboot.8";

/// Where the rootfs layer installs the page, gzipped.
pub const LAYER_PATH: &str = "usr/share/man/man8/kiln-firstboot.8.gz";

/// Escapes text for roff: backslashes, hyphens (so they stay ASCII hyphens that can be
/// searched and copied), apostrophes, and a control character at the start of a line.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\e"),
            '-' => out.push_str("\\-"),
            '\'' => out.push_str("\\*(Aq"),
            c => out.push(c),
        }
    }
    if out.starts_with('.') {
        out.insert_str(0, "\\&");
    }
    out
}

/// Whether `w` is a metavar (`DIR`, `SECS`, `NAME`).
fn is_metavar(w: &str) -> bool {
    !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// One flag of a FLAGS section.
struct Flag {
    names: Vec<String>,
    metavar: Option<String>,
    text: Vec<String>,
}

/// Parses one `  --flag [METAVAR] description` line.
fn flag_line(line: &str) -> Flag {
    let mut rest = line.trim_start();
    let mut names = Vec::new();
    // `-q, --quiet`: names separated by commas.
    loop {
        let (w, r) = rest.split_once(' ').unwrap_or((rest, ""));
        match w.strip_suffix(',') {
            Some(name) => names.push(name.to_string()),
            None => {
                names.push(w.to_string());
                rest = r;
                break;
            }
        }
        rest = r.trim_start();
    }
    let trimmed = rest.trim_start();
    let (w, r) = trimmed.split_once(' ').unwrap_or((trimmed, ""));
    let metavar = is_metavar(w).then(|| w.to_string());
    if metavar.is_some() {
        rest = r;
    }
    let text = rest.trim();
    Flag {
        names,
        metavar,
        text: if text.is_empty() {
            Vec::new()
        } else {
            vec![text.to_string()]
        },
    }
}

/// Renders `usage` (firstboot's `--help` text) as the man page `kiln-firstboot.8`, for
/// kiln-firstboot `version`. Fails, naming the line, when the text has a shape the page
/// cannot carry faithfully.
pub fn render(usage: &str, version: &str) -> Result<String, String> {
    let bad = |n: usize, line: &str, expected: &str| {
        format!(
            "kiln-firstboot's --help text (firstboot/src/cli.rs USAGE), line {}: expected {expected}, found {line:?}",
            n + 1
        )
    };
    let mut lines = usage.lines().enumerate();
    let (n, first) = lines
        .next()
        .ok_or("kiln-firstboot's --help text is empty")?;
    let (name, about) = first
        .split_once(": ")
        .filter(|(name, _)| *name == "kiln-firstboot")
        .ok_or_else(|| bad(n, first, "`kiln-firstboot: DESCRIPTION`"))?;
    let mut page = String::new();
    page.push_str(".ie \\n(.g .ds Aq \\(aq\n.el .ds Aq '\n");
    page.push_str(&format!(
        ".TH KILN\\-FIRSTBOOT 8 \"\" \"{} {}\" \"System Administration\"\n",
        esc(name),
        esc(version)
    ));
    page.push_str(&format!(".SH NAME\n{} \\- {}\n", esc(name), esc(about)));

    #[derive(PartialEq)]
    enum In {
        Nothing,
        Synopsis,
        Flags,
        Text,
    }
    let mut state = In::Nothing;
    // Whether section text is open (a paragraph that following text lines continue).
    let mut para = false;
    let mut flags: Vec<Flag> = Vec::new();
    let flush = |page: &mut String, flags: &mut Vec<Flag>| {
        for f in flags.drain(..) {
            let names: Vec<String> = f
                .names
                .iter()
                .map(|n| format!("\\fB{}\\fR", esc(n)))
                .collect();
            page.push_str(".TP\n");
            page.push_str(&names.join(", "));
            if let Some(m) = &f.metavar {
                page.push_str(&format!(" \\fI{}\\fR", esc(m)));
            }
            page.push('\n');
            for t in &f.text {
                page.push_str(&esc(t));
                page.push('\n');
            }
        }
    };
    for (n, line) in lines {
        let indented = line.starts_with(' ');
        if line.trim().is_empty() {
            if state == In::Synopsis {
                page.push_str(".fi\n");
            }
            flush(&mut page, &mut flags);
            state = match state {
                In::Text => In::Text,
                _ => In::Nothing,
            };
            continue;
        }
        if !indented {
            flush(&mut page, &mut flags);
            if state == In::Synopsis {
                page.push_str(".fi\n");
            }
            if let Some(head) = line.strip_suffix(':') {
                let (title, note) = match head.split_once(" (") {
                    Some((t, note)) => (t, Some(format!("({note}"))),
                    None => (head, None),
                };
                if title == "USAGE" {
                    page.push_str(".SH SYNOPSIS\n.nf\n");
                    state = In::Synopsis;
                } else {
                    page.push_str(&format!(".SH \"{}\"\n", esc(title)));
                    if let Some(note) = note {
                        page.push_str(&format!(".PP\n{}\n", esc(&note)));
                    }
                    state = In::Flags;
                    para = false;
                }
                continue;
            }
            // A paragraph after the sections.
            if let Some((label, text)) = line.split_once(": ").filter(|(l, _)| {
                l.split(' ').count() <= 3 && l.chars().all(|c| c.is_ascii_alphabetic() || c == ' ')
            }) {
                page.push_str(&format!(
                    ".SH \"{}\"\n{}\n",
                    esc(&label.to_ascii_uppercase()),
                    esc(text)
                ));
            } else if line.starts_with("See ") {
                page.push_str(&format!(
                    ".SH \"SEE ALSO\"\n.BR kiln (1)\n.PP\n{}\n",
                    esc(line)
                ));
            } else if state == In::Text {
                page.push_str(&format!("{}\n", esc(line)));
            } else {
                page.push_str(&format!(".PP\n{}\n", esc(line)));
            }
            state = In::Text;
            continue;
        }
        match state {
            In::Synopsis => {
                let l = line.strip_prefix("  ").unwrap_or(line);
                page.push_str(&esc(l));
                page.push('\n');
            }
            In::Flags => {
                if line.starts_with("  -") {
                    flags.push(flag_line(line));
                    para = false;
                } else if let Some(f) = flags.last_mut().filter(|_| line.starts_with("   ")) {
                    f.text.push(line.trim().to_string());
                } else {
                    // Text of the section (what a subcommand does), before its flags.
                    flush(&mut page, &mut flags);
                    if !para {
                        page.push_str(".PP\n");
                        para = true;
                    }
                    page.push_str(&esc(line.trim()));
                    page.push('\n');
                }
            }
            In::Nothing | In::Text => {
                return Err(bad(n, line, "a heading ending in `:` before indented text"))
            }
        }
    }
    if state == In::Synopsis {
        page.push_str(".fi\n");
    }
    flush(&mut page, &mut flags);
    Ok(page)
}

/// The page for the kiln-firstboot this kiln was built with.
pub fn page() -> Result<String, String> {
    render(kiln_firstboot::cli::USAGE, env!("CARGO_PKG_VERSION"))
}

/// `bytes` gzipped the same way every time: best compression, mtime 0, no file name, OS
/// byte "unknown", so the layer that carries it stays reproducible.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .operating_system(255)
        .write(Vec::new(), flate2::Compression::best());
    // Writing into a Vec cannot fail.
    let _ = gz.write_all(bytes);
    gz.finish().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_of_the_help_is_a_tagged_paragraph_of_the_page() {
        let page = page().unwrap();
        let usage = kiln_firstboot::cli::USAGE;
        let mut seen = 0;
        for line in usage.lines().filter(|l| l.starts_with("  --")) {
            let f = flag_line(line);
            let mut tag = format!("\\fB{}\\fR", esc(&f.names[0]));
            if let Some(m) = &f.metavar {
                tag.push_str(&format!(" \\fI{m}\\fR"));
            }
            assert!(
                page.contains(&format!(".TP\n{tag}\n")),
                "kiln-firstboot.8: expected a .TP paragraph tagged {tag:?} for {line:?}, found none in:\n{page}"
            );
            seen += 1;
        }
        assert!(seen >= 12, "only {seen} flag lines in USAGE");
        // The odd one: a metavar followed by one space only.
        assert!(page.contains(".TP\n\\fB\\-\\-vmware\\-rpctool\\fR \\fIPATH\\fR\nguestinfo reader"));
    }

    #[test]
    fn a_help_text_of_another_shape_is_refused_naming_the_line() {
        let e = render("kiln-firstboot: x\n\nUSAGE:\n  a\n\n  stray\n", "1").unwrap_err();
        assert!(e.contains("line 6") && e.contains("stray"), "{e}");
        let e = render("firstboot does things\n", "1").unwrap_err();
        assert!(e.contains("line 1"), "{e}");
        let e = render("kiln-firstboot: x\n  --a  b\n", "1").unwrap_err();
        assert!(e.contains("line 2") && e.contains("heading"), "{e}");
    }

    #[test]
    fn gzip_is_deterministic_and_carries_no_time_or_name() {
        let a = gzip(b"hello");
        assert_eq!(a, gzip(b"hello"));
        assert_eq!(
            &a[..4],
            &[0x1f, 0x8b, 8, 0],
            "magic, deflate, no FNAME flag"
        );
        assert_eq!(&a[4..8], &[0, 0, 0, 0], "mtime 0");
        assert_eq!(a[9], 255, "OS unknown");
        let mut out = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&a[..]), &mut out).unwrap();
        assert_eq!(out, "hello");
    }
}
