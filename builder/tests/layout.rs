//! The shape of `builder/src` and `firstboot/src` (issue 13): no source file over 600 lines, and no import cycle
//! between its files. A file's module imports another when it names it in a path: `crate::…`,
//! `super::…`, `self::…`, or a child module it declares (`mod x;` then `x::…`). Inline
//! `#[cfg(test)]` modules at the end of a file are left out: tests may reach anywhere.
//!
//! `cargo nextest run -p kiln --test it -E 'test(/^layout::/)'` prints every cycle it finds, file by file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a file under `builder/src` may have.
const MAX_LINES: usize = 600;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Both crates' sources: the rules hold for kiln-firstboot too (issue 13).
fn crates() -> [(&'static str, PathBuf); 2] {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    [
        ("builder/src", src_dir()),
        ("firstboot/src", root.join("firstboot/src")),
    ]
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file (`["bake", "layer"]` for `bake/layer.rs`, `["bake"]` for
/// `bake/mod.rs`, `[]` for `lib.rs`), and whether the file is a directory module.
fn module_of(rel: &Path) -> (Vec<String>, bool) {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop().unwrap();
    let stem = file.trim_end_matches(".rs");
    match stem {
        "mod" | "lib" | "main" => (parts, true),
        _ => {
            parts.push(stem.to_string());
            (parts, false)
        }
    }
}

/// The code of a file without comments and without a trailing `#[cfg(test)]` module.
fn code_of(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        // Drop string contents roughly: a path inside a message is not an import.
        let mut in_str = false;
        let mut prev = ' ';
        for c in line.chars() {
            if c == '"' && prev != '\\' {
                in_str = !in_str;
            } else if !in_str {
                out.push(c);
            }
            prev = if prev == '\\' && c == '\\' { ' ' } else { c };
        }
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every `a::b::c` path in `code` (identifiers joined by `::`), with `use` trees expanded.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    // `use` trees: `use a::{b, c::{d, e}};`
    let mut rest = code;
    while let Some(i) = rest.find("use ") {
        let before = rest[..i].chars().next_back();
        let after_use = &rest[i + 4..];
        if before.is_some_and(is_ident) {
            rest = after_use;
            continue;
        }
        let end = after_use.find(';').unwrap_or(after_use.len());
        let tree: String = after_use[..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        expand(&[], &tree, &mut out);
        rest = &after_use[end..];
    }
    // Plain paths anywhere else.
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if is_ident(chars[i]) && (i == 0 || (!is_ident(chars[i - 1]) && chars[i - 1] != ':')) {
            let mut segs = Vec::new();
            let mut j = i;
            loop {
                let s = j;
                while j < chars.len() && is_ident(chars[j]) {
                    j += 1;
                }
                segs.push(chars[s..j].iter().collect::<String>());
                if j + 2 < chars.len()
                    && chars[j] == ':'
                    && chars[j + 1] == ':'
                    && is_ident(chars[j + 2])
                {
                    j += 2;
                } else {
                    break;
                }
            }
            if segs.len() > 1 {
                out.push(segs);
            }
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

fn expand(prefix: &[String], tree: &str, out: &mut Vec<Vec<String>>) {
    let (head, group) = match tree.find('{') {
        Some(b) if tree.ends_with('}') => (&tree[..b], Some(&tree[b + 1..tree.len() - 1])),
        _ => (tree, None),
    };
    let mut p: Vec<String> = prefix.to_vec();
    p.extend(
        head.split("::")
            .filter(|s| !s.is_empty())
            .map(|s| s.split(" as ").next().unwrap_or(s).to_string()),
    );
    match group {
        None => out.push(p),
        Some(g) => {
            let mut depth = 0;
            let mut start = 0;
            let bytes = g.as_bytes();
            for (k, &b) in bytes.iter().enumerate() {
                match b {
                    b'{' => depth += 1,
                    b'}' => depth -= 1,
                    b',' if depth == 0 => {
                        expand(&p, &g[start..k], out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            if start < g.len() {
                expand(&p, &g[start..], out);
            }
        }
    }
}

struct Graph {
    /// Module path → file (relative to `src`).
    files: BTreeMap<Vec<String>, String>,
    /// File → files it imports.
    edges: BTreeMap<String, BTreeSet<String>>,
}

fn graph() -> Graph {
    graph_of(&src_dir())
}

fn graph_of(src: &Path) -> Graph {
    let src = src.to_path_buf();
    let mut all = Vec::new();
    rust_files(&src, &mut all);
    let mut files = BTreeMap::new();
    let mut info = Vec::new();
    for p in &all {
        let rel = p.strip_prefix(&src).unwrap();
        let name = rel.to_string_lossy().into_owned();
        if name == "main.rs" {
            continue;
        }
        let (module, is_dir) = module_of(rel);
        files.insert(module.clone(), name.clone());
        info.push((name, module, is_dir, std::fs::read_to_string(p).unwrap()));
    }
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, module, is_dir, text) in &info {
        let code = code_of(text);
        let children: BTreeSet<String> = code
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let l = l
                    .strip_prefix("pub mod ")
                    .or_else(|| l.strip_prefix("pub(crate) mod "))
                    .or_else(|| l.strip_prefix("mod "))?;
                l.strip_suffix(';').map(str::to_string)
            })
            .collect();
        // The module `super` and `self` name from this file.
        let here: Vec<String> = module.clone();
        let parent: Vec<String> = if *is_dir || !here.is_empty() {
            here[..here.len().saturating_sub(1)].to_vec()
        } else {
            Vec::new()
        };
        for path in paths_in(&code) {
            let mut abs: Vec<String> = match path[0].as_str() {
                "crate" => path[1..].to_vec(),
                "self" => here
                    .iter()
                    .cloned()
                    .chain(path[1..].iter().cloned())
                    .collect(),
                "super" => {
                    let mut base = parent.clone();
                    let mut k = 1;
                    while path.get(k).map(String::as_str) == Some("super") {
                        base.pop();
                        k += 1;
                    }
                    base.into_iter().chain(path[k..].iter().cloned()).collect()
                }
                first if children.contains(first) => {
                    here.iter().cloned().chain(path.iter().cloned()).collect()
                }
                _ => continue,
            };
            // The longest module prefix that is a file.
            while !abs.is_empty() && !files.contains_key(&abs) {
                abs.pop();
            }
            let Some(target) = files.get(&abs) else {
                continue;
            };
            if target != name {
                edges
                    .entry(name.clone())
                    .or_default()
                    .insert(target.clone());
            }
        }
    }
    Graph { files, edges }
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on: BTreeSet<String>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit(t: &mut T<'_>, v: &str) {
        t.index.insert(v.to_string(), t.next);
        t.low.insert(v.to_string(), t.next);
        t.next += 1;
        t.stack.push(v.to_string());
        t.on.insert(v.to_string());
        let succ: Vec<String> =
            t.g.edges
                .get(v)
                .map(|s| s.iter().cloned().collect())
                .unwrap_or_default();
        for w in succ {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let lw = t.low[&w];
                let lv = t.low[v];
                t.low.insert(v.to_string(), lv.min(lw));
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low[v];
                t.low.insert(v.to_string(), lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(&w);
                let done = w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for f in g.files.values() {
        if !t.index.contains_key(f) {
            visit(&mut t, f);
        }
    }
    t.out
}

#[test]
fn no_import_cycles() {
    let mut msg = String::new();
    for (name, src) in crates() {
        let g = graph_of(&src);
        for c in &cycles(&g) {
            msg.push_str(&format!("{name}: cycle of {} files:\n", c.len()));
            for f in c {
                let inside: Vec<&String> = g.edges[f].iter().filter(|t| c.contains(t)).collect();
                msg.push_str(&format!("  {f} -> {inside:?}\n"));
            }
        }
    }
    assert!(msg.is_empty(), "import cycles:\n{msg}");
}

#[test]
fn the_checker_sees_edges() {
    // A checker that finds no edges at all would pass the test above for nothing.
    let g = graph();
    let cli = &g.edges["cli/mod.rs"];
    assert!(cli.iter().any(|f| f.starts_with("cli/")), "{cli:?}");
    let n: usize = g.edges.values().map(BTreeSet::len).sum();
    assert!(n > 50, "only {n} import edges found");
    let fb = graph_of(&crates()[1].1);
    let n: usize = fb.edges.values().map(BTreeSet::len).sum();
    assert!(n > 30, "only {n} import edges found in firstboot/src");
    // And it finds a cycle when there is one.
    let mut looped = Graph {
        files: g.files.clone(),
        edges: g.edges.clone(),
    };
    looped
        .edges
        .entry("cli/mod.rs".into())
        .or_default()
        .insert("lib.rs".into());
    looped
        .edges
        .entry("lib.rs".into())
        .or_default()
        .insert("cli/mod.rs".into());
    assert!(!cycles(&looped).is_empty());
}

#[test]
fn no_source_file_over_600_lines() {
    let mut long: Vec<String> = Vec::new();
    for (name, src) in crates() {
        let mut all = Vec::new();
        rust_files(&src, &mut all);
        long.extend(all.iter().filter_map(|p| {
            let n = std::fs::read_to_string(p).unwrap().lines().count();
            (n > MAX_LINES).then(|| {
                format!(
                    "{name}/{} ({n} lines)",
                    p.strip_prefix(&src).unwrap().display()
                )
            })
        }));
    }
    long.sort();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines (a file that long usually holds two concepts): {long:?}"
    );
}

/// The builder's top-level modules by layer: a module imports only from its own layer or a
/// lower one (issue 35: "no import up a layer"); cycles within a layer are the cycle test's.
/// `lib.rs` and `main.rs` declare and dispatch and sit above all of them.
const BUILDER_LAYERS: &[&[&str]] = &[
    // leaves: one job each, no kiln imports
    &[
        "archive_rules",
        "atomic_file",
        "bounded_read",
        "digest",
        "exit",
        "firstboot_man",
        "proxy_url",
        "sizing",
    ],
    // what the others exchange: the signed supply chain (and kiln's own signatures), the
    // layer's own files
    &["supply", "layer_contract", "attest"],
    // an image definition read, a layer installed
    &["image_def", "install"],
    // a layer baked, a node's files rendered
    &["bake", "render"],
    // decided once from all of the above: the bake plan; a disk image built from a layer
    &["plan", "image"],
    // arguments and printing
    &["cli"],
];

/// kiln-firstboot's, the same way. `lib` is the crate root: it declares the modules and
/// re-exports `contract`'s reason codes, which every layer may name.
const FIRSTBOOT_LAYERS: &[&[&str]] = &[
    // the contract, the crate root's re-exports, and helpers with no firstboot imports
    &[
        "lib",
        "contract",
        "json",
        "text",
        "fsutil",
        "clock",
        "http",
        "service",
        "signatures",
        "systemd_bus",
        "standin",
        "error",
        "netaddr",
    ],
    // helpers on those: redaction, waits, sizing, the console, the Windows system calls,
    // the YAML reader (on json)
    &[
        "redact", "wait", "sizing", "console", "windows", "swap", "yaml",
    ],
    // the node's inputs read: its config, its platform, kubelet's flags
    &["config", "provider", "kubelet_env"],
    // the command line; checks and steps on a configured node
    &["cli", "doctor", "kubeadm", "diagnose"],
    // the reporter
    &["reporter"],
    // waiting for the join, the post-boot report, kubelet's Windows service
    &["joined", "report", "windows_kubelet"],
    // the boot
    &["run"],
    // the Windows service entry, which runs the boot
    &["windows_main"],
];

fn layer_of(layers: &[&[&str]], module: &str) -> Option<usize> {
    layers.iter().position(|l| l.contains(&module))
}

/// Each edge between top-level modules that goes up a layer, as `from -> to (file -> file)`.
fn upward_imports(src: &Path, layers: &[&[&str]]) -> Vec<String> {
    let g = graph_of(src);
    let top = |f: &str| {
        f.split('/')
            .next()
            .unwrap_or(f)
            .trim_end_matches(".rs")
            .to_string()
    };
    let mut up = Vec::new();
    for (from, targets) in &g.edges {
        for to in targets {
            let (a, b) = (top(from), top(to));
            if a == b || a == "lib" {
                continue;
            }
            match (layer_of(layers, &a), layer_of(layers, &b)) {
                (Some(la), Some(lb)) if lb <= la => {}
                (la, lb) => up.push(format!(
                    "{a} (layer {la:?}) -> {b} (layer {lb:?}): {from} -> {to}"
                )),
            }
        }
    }
    up
}

/// Asserts that no import in `src` goes up a layer of `layers` (named `table` in the
/// message), and that every top-level module but `main` (and `lib` where the table leaves it
/// out) has a layer, so a new module cannot slip past the rule.
fn assert_layered(src: &Path, layers: &[&[&str]], table: &str) {
    let up = upward_imports(src, layers);
    assert!(
        up.is_empty(),
        "imports up a layer (or from a module not in {table}):\n{}",
        up.join("\n")
    );
    for e in std::fs::read_dir(src).unwrap() {
        let name = e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if name != "main" && (name != "lib" || layers.concat().contains(&"lib")) {
            assert!(
                layer_of(layers, &name).is_some(),
                "{name} has no layer in {table}"
            );
        }
    }
}

#[test]
fn no_builder_import_goes_up_a_layer() {
    assert_layered(&src_dir(), BUILDER_LAYERS, "BUILDER_LAYERS");
    // And the check sees an upward import when there is one: supply may not know the CLI.
    let mut swapped: Vec<&[&str]> = BUILDER_LAYERS.to_vec();
    swapped.swap(1, 5);
    assert!(!upward_imports(&src_dir(), &swapped).is_empty());
}

#[test]
fn no_firstboot_import_goes_up_a_layer() {
    let src = &crates()[1].1;
    assert_layered(src, FIRSTBOOT_LAYERS, "FIRSTBOOT_LAYERS");
    // The Windows helpers sit low because the service entry does not live among them.
    let mut swapped: Vec<&[&str]> = FIRSTBOOT_LAYERS.to_vec();
    swapped.swap(0, 6);
    assert!(!upward_imports(src, &swapped).is_empty());
}
