//! Property tests, fixed case counts, no persistence files, for the builder's text parsers:
//! the artifact lock, image definitions, `node.toml`, the user data `kiln render --check`
//! reads (cloud-config, MIME multipart, Ignition, PowerShell) and `Content-Range`.
//!
//! For each: arbitrary input never panics; near-valid mutations of the committed examples
//! (`images/`, `docs/examples/render/`) never panic and, when refused, the message names the
//! file; what is accepted round-trips through the writer where one exists.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use kiln::image_def::{DefError, ImageDef};
use kiln::render::ConfigError;
use kiln::render::{check_payload, render_payload, NodeConfig, Provisioner, RenderOptions};
use kiln::supply::fetch::content_range_start;
use kiln::supply::lock::{Lock, LockError};
use proptest::prelude::*;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// One edit of a text: what a hand-edited file gets wrong.
#[derive(Debug, Clone)]
enum Edit {
    DropLine(usize),
    DupLine(usize),
    SwapLines(usize, usize),
    /// Replaces what follows the first `=` of a line.
    Value(usize, String),
    /// Replaces the key before the first `=` of a line.
    Key(usize, String),
    Truncate(usize),
    Insert(usize, String),
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "\"\"",
            "0",
            "-1",
            "4294967296",
            "18446744073709551616",
            "true",
            "[]",
            "{}",
            "\"..\"",
            "\"/etc/passwd\"",
            "\"../x\"",
            "\"a b\"",
            "\"C:\\\\x\"",
            "\"\\u0000\"",
            "\"http://\"",
            "\"https://h/\"",
            "[\"\"]",
            "'''\nx\n'''",
            "\"v1.36.1\"",
            "\"linux\"",
            "\"windows\"",
            "\"zip\"",
            "\"sysext\"",
            "\"$(id)\"",
            "\"a\\nb\"",
            "nan",
            "1e400",
            "{ from = \"x\", to = \"../y\" }",
            "\"Boundary\"",
        ])
        .prop_map(String::from),
        "[ -~]{0,24}",
        any::<String>(),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    let line = any::<prop::sample::Index>();
    prop_oneof![
        1 => line.clone().prop_map(|i| Edit::DropLine(i.index(1 << 16))),
        1 => line.clone().prop_map(|i| Edit::DupLine(i.index(1 << 16))),
        1 => (line.clone(), line.clone())
            .prop_map(|(a, b)| Edit::SwapLines(a.index(1 << 16), b.index(1 << 16))),
        4 => (line.clone(), fragment()).prop_map(|(i, v)| Edit::Value(i.index(1 << 16), v)),
        1 => (line.clone(), "[a-z_.\\[\\]]{0,12}").prop_map(|(i, k)| Edit::Key(i.index(1 << 16), k)),
        1 => line.clone().prop_map(|i| Edit::Truncate(i.index(1 << 20))),
        1 => (line, fragment()).prop_map(|(i, s)| Edit::Insert(i.index(1 << 20), s)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut lines: Vec<String> = text.lines().map(String::from).collect();
    for e in edits {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let n = lines.len();
        match e {
            Edit::DropLine(i) => {
                lines.remove(i % n);
            }
            Edit::DupLine(i) => {
                let l = lines[i % n].clone();
                lines.insert(i % n, l);
            }
            Edit::SwapLines(a, b) => lines.swap(a % n, b % n),
            Edit::Value(i, v) => {
                let l = &mut lines[i % n];
                if let Some((k, _)) = l.split_once('=') {
                    *l = format!("{k}= {v}");
                }
            }
            Edit::Key(i, k) => {
                let l = &mut lines[i % n];
                if let Some((_, v)) = l.split_once('=') {
                    *l = format!("{k} ={v}");
                }
            }
            Edit::Truncate(at) => {
                let mut joined = lines.join("\n");
                let mut at = at % (joined.len() + 1);
                while !joined.is_char_boundary(at) {
                    at -= 1;
                }
                joined.truncate(at);
                lines = joined.lines().map(String::from).collect();
            }
            Edit::Insert(at, s) => {
                let mut joined = lines.join("\n");
                let mut at = at % (joined.len() + 1);
                while !joined.is_char_boundary(at) {
                    at -= 1;
                }
                joined.insert_str(at, s);
                lines = joined.lines().map(String::from).collect();
            }
        }
    }
    lines.join("\n") + "\n"
}

// ---- the artifact lock ----

fn check_lock(text: &str) -> Result<Lock, String> {
    let path = Path::new("/prop/kiln.lock");
    match Lock::parse(text, path) {
        Ok(lock) => Ok(lock),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("/prop/kiln.lock"),
                "refusal names no file: {msg}"
            );
            if let LockError::Invalid { field, .. } = &e {
                assert!(msg.contains(&format!("`{field}`")), "{msg}");
            }
            Err(msg)
        }
    }
}

/// An accepted lock written back by `to_toml` parses to the same lock, and writes the same.
fn lock_round_trips(lock: &Lock) {
    let text = lock.to_toml();
    let back = Lock::parse(&text, &lock.path)
        .unwrap_or_else(|e| panic!("to_toml output refused: {e}\n{text}"));
    assert_eq!(&back, lock);
    assert_eq!(back.to_toml(), text);
}

#[test]
fn the_committed_lock_round_trips() {
    let lock = check_lock(&read("images/artifacts.lock")).unwrap();
    assert!(lock.artifacts.len() > 10);
    lock_round_trips(&lock);
}

// ---- image definitions ----

fn check_def(text: &str) -> Result<ImageDef, String> {
    let path = Path::new("/prop/image.toml");
    match ImageDef::parse(text, path) {
        Ok(d) => Ok(d),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("/prop/image.toml"),
                "refusal names no file: {msg}"
            );
            if let DefError::Invalid { key, .. } = &e {
                assert!(
                    !key.is_empty() && msg.contains(&format!("`{key}`")),
                    "{msg}"
                );
            }
            Err(msg)
        }
    }
}

/// An accepted definition serialised with its own `Serialize` is accepted again, unchanged.
fn def_round_trips(def: &ImageDef) {
    let text = toml::to_string(def).unwrap_or_else(|e| panic!("serialising: {e}"));
    let back = check_def(&text).unwrap_or_else(|e| panic!("own output refused: {e}\n{text}"));
    assert_eq!(toml::to_string(&back).unwrap(), text);
}

const IMAGES: &[&str] = &[
    "images/flatcar.toml",
    "images/ubuntu.toml",
    "images/windows.toml",
];

#[test]
fn the_committed_image_definitions_round_trip() {
    for rel in IMAGES {
        let def = check_def(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        def_round_trips(&def);
    }
}

// ---- node.toml ----

fn check_node(text: &str) -> Result<NodeConfig, String> {
    let path = Path::new("/prop/node.toml");
    match NodeConfig::parse(text, path, &repo("docs/examples/render")) {
        Ok(c) => Ok(c),
        Err(e) => {
            let msg = e.to_string();
            match &e {
                // A file node.toml points to is named instead.
                ConfigError::Read { path, .. } => {
                    assert!(msg.contains(&path.display().to_string()), "{msg}")
                }
                ConfigError::Invalid { key, .. } => {
                    assert!(msg.contains("/prop/node.toml"), "{msg}");
                    assert!(
                        !key.is_empty() && msg.contains(&format!("`{key}`")),
                        "{msg}"
                    );
                }
                ConfigError::Parse { .. } => assert!(msg.contains("/prop/node.toml"), "{msg}"),
            }
            Err(msg)
        }
    }
}

/// What a node config writes is read back the same: `node.env` by kiln-firstboot's own
/// parser, and every payload by `render --check`.
fn node_round_trips(c: &NodeConfig) {
    let env = kiln_firstboot::contract::envfile::parse(&c.node_env())
        .unwrap_or_else(|e| panic!("node.env refused by firstboot: {e:?}\n{}", c.node_env()));
    assert_eq!(env.get("CLUSTER_NAME"), Some(c.cluster_name.as_str()));
    assert_eq!(env.get("NODE_NAME"), c.node_name.as_deref());
    assert_eq!(env.get("HTTPS_PROXY"), c.https_proxy.as_deref());
    let args = c.kubelet_extra_args.join(" ");
    assert_eq!(
        env.get("KUBELET_EXTRA_ARGS"),
        (!args.is_empty()).then_some(args.as_str())
    );
    let files = c.files();
    for p in [
        Provisioner::CloudInit,
        Provisioner::Ignition,
        Provisioner::Windows,
    ] {
        for gzip in [false, true] {
            let opts = RenderOptions {
                gzip,
                ..RenderOptions::default()
            };
            let data = render_payload(&files, p, opts).unwrap();
            let checked = check_payload(&data, "prop-user-data")
                .unwrap_or_else(|e| panic!("{p} (gzip {gzip}): own payload refused: {e}"));
            assert_eq!(checked.provisioner, p);
            assert_eq!(checked.files, files, "{p} (gzip {gzip})");
        }
    }
}

#[test]
fn the_example_node_configs_round_trip() {
    for rel in [
        "docs/examples/render/node.toml",
        "docs/examples/render/node-kubeadm.toml",
    ] {
        let c = check_node(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
        node_round_trips(&c);
    }
}

// ---- user data read by `render --check` ----

fn check_user_data(data: &[u8]) {
    if let Err(e) = check_payload(data, "/prop/user-data") {
        let msg = e.to_string();
        assert!(
            msg.contains("/prop/user-data"),
            "refusal names no file: {msg}"
        );
    }
}

/// Wraps cloud-config documents in MIME multipart, the way `cloud-init devel make-mime` and
/// Terraform's `cloudinit_config` do, with a chosen spelling of the `boundary` parameter.
fn multipart(parts: &[(String, bool)], param: &str, boundary: &str, crlf: bool) -> String {
    let mut s =
        format!("Content-Type: multipart/mixed; {param}=\"{boundary}\"\nMIME-Version: 1.0\n\n");
    for (i, (body, b64)) in parts.iter().enumerate() {
        s.push_str(&format!("--{boundary}\n"));
        s.push_str("Content-Type: text/cloud-config; charset=\"us-ascii\"\n");
        s.push_str("MIME-Version: 1.0\n");
        s.push_str(&format!(
            "Content-Disposition: attachment; filename=\"part-{i}.yaml\"\n"
        ));
        if i > 0 {
            s.push_str("Merge-Type: list(append)+dict(no_replace,recurse_list)+str()\n");
        }
        if *b64 {
            s.push_str("Content-Transfer-Encoding: base64\n\n");
            let enc = base64::engine::general_purpose::STANDARD.encode(body);
            for chunk in enc.as_bytes().chunks(76) {
                s.push_str(std::str::from_utf8(chunk).unwrap());
                s.push('\n');
            }
        } else {
            s.push_str("Content-Transfer-Encoding: 7bit\n\n");
            s.push_str(body);
            if !body.ends_with('\n') {
                s.push('\n');
            }
        }
        // The line break before a delimiter belongs to the delimiter (RFC 2046 5.1.1), as
        // Python's email generator writes it.
        s.push('\n');
    }
    s.push_str(&format!("--{boundary}--\n"));
    if crlf {
        s = s.replace('\n', "\r\n");
    }
    s
}

fn example_files() -> Vec<kiln::render::NodeFile> {
    check_node(&read("docs/examples/render/node.toml"))
        .unwrap()
        .files()
}

/// `boundary=` is a MIME parameter name: case does not matter (RFC 2045 section 5.1).
#[test]
fn multipart_boundary_parameter_is_case_insensitive() {
    let files = example_files();
    let cc = String::from_utf8(
        render_payload(&files, Provisioner::CloudInit, RenderOptions::default()).unwrap(),
    )
    .unwrap();
    for param in ["boundary", "Boundary", "BOUNDARY", "bOuNdArY"] {
        let text = multipart(&[(cc.clone(), false)], param, "==kiln==", false);
        let got = check_payload(text.as_bytes(), "u").unwrap_or_else(|e| panic!("{param}: {e}"));
        assert_eq!(got.files, files, "{param}");
    }
}

fn boundary_param() -> impl Strategy<Value = String> {
    "[bB][oO][uU][nN][dD][aA][rR][yY]"
}

// ---- the properties ----

proptest! {
    #![proptest_config(config(256))]

    #[test]
    fn lock_arbitrary_text_never_panics(text in any::<String>()) {
        let _ = check_lock(&text);
    }

    #[test]
    fn lock_mutations_are_refused_by_name_or_round_trip(
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        let text = apply(&read("images/artifacts.lock"), &edits);
        if let Ok(lock) = check_lock(&text) {
            lock_round_trips(&lock);
        }
    }

    #[test]
    fn image_def_arbitrary_text_never_panics(text in any::<String>()) {
        let _ = check_def(&text);
    }

    #[test]
    fn image_def_mutations_are_refused_by_name_or_round_trip(
        which in 0..IMAGES.len(),
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        let text = apply(&read(IMAGES[which]), &edits);
        if let Ok(def) = check_def(&text) {
            def_round_trips(&def);
        }
    }

    #[test]
    fn node_toml_arbitrary_text_never_panics(text in any::<String>()) {
        let _ = check_node(&text);
    }

    #[test]
    fn node_toml_mutations_are_refused_by_name_or_round_trip(
        kubeadm in any::<bool>(),
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        let rel = if kubeadm {
            "docs/examples/render/node-kubeadm.toml"
        } else {
            "docs/examples/render/node.toml"
        };
        let text = apply(&read(rel), &edits);
        if let Ok(c) = check_node(&text) {
            node_round_trips(&c);
        }
    }

    #[test]
    fn user_data_arbitrary_bytes_never_panic(data in prop::collection::vec(any::<u8>(), 0..512)) {
        check_user_data(&data);
    }

    #[test]
    fn user_data_with_known_heads_never_panics(
        head in prop::sample::select(vec![
            &b"#cloud-config\n"[..],
            b"{",
            b"<powershell>\n",
            b"#ps1\n",
            b"Content-Type: multipart/mixed; boundary=b\n\n--b\n",
            b"MIME-Version: 1.0\nContent-Type: multipart/mixed; BOUNDARY=\"\"\n\n",
            b"\x1f\x8b",
        ]),
        tail in prop::collection::vec(any::<u8>(), 0..512),
    ) {
        check_user_data(&[head, &tail[..]].concat());
    }

    #[test]
    fn user_data_example_mutations_never_panic(
        which in prop::sample::select(vec![
            "docs/examples/render/user-data.cloud-init",
            "docs/examples/render/user-data-kubeadm.cloud-init",
            "docs/examples/render/config.ign",
            "docs/examples/render/user-data.windows.ps1",
        ]),
        edits in prop::collection::vec(edit(), 1..4),
    ) {
        check_user_data(apply(&read(which), &edits).as_bytes());
    }

    /// Multipart user data of several cloud-config parts (plain or base64, LF or CRLF, any
    /// spelling of `boundary`) lists exactly the files the parts write, appended in order.
    #[test]
    fn multipart_round_trips(
        split in 0usize..5,
        b64 in any::<(bool, bool)>(),
        crlf in any::<bool>(),
        param in boundary_param(),
        boundary in "[A-Za-z0-9'()+_,./:=?-]{1,40}",
    ) {
        let files = example_files();
        let split = split.min(files.len());
        let render = |fs: &[kiln::render::NodeFile]| {
            String::from_utf8(
                render_payload(fs, Provisioner::CloudInit, RenderOptions::default()).unwrap(),
            )
            .unwrap()
        };
        let parts = vec![(render(&files[..split]), b64.0), (render(&files[split..]), b64.1)];
        let text = multipart(&parts, &param, &boundary, crlf);
        let got = check_payload(text.as_bytes(), "u");
        let got = got.unwrap_or_else(|e| panic!("{e}\n{text}"));
        prop_assert_eq!(got.provisioner, Provisioner::CloudInit);
        prop_assert_eq!(got.files, files);
    }

    /// PowerShell user data: arbitrary lines after the head never panic; a `Write-KilnFile`
    /// line with a broken argument is refused with its line number.
    #[test]
    fn powershell_reader_never_panics(
        lines in prop::collection::vec(
            prop_oneof![
                Just("function Write-KilnFile([string]$Name) {".to_string()),
                "Write-KilnFile '[a-z.-]{0,12}' '[A-Za-z0-9+/=]{0,16}' \\$(true|false|maybe)",
                "Write-KilnFile [ -~]{0,30}",
                any::<String>(),
            ],
            0..8,
        ),
    ) {
        let text = format!("<powershell>\n{}\n</powershell>\n", lines.join("\n"));
        if let Err(e) = check_payload(text.as_bytes(), "/prop/user-data.ps1") {
            let msg = e.to_string();
            prop_assert!(msg.contains("/prop/user-data.ps1"), "{}", msg);
        }
    }

    /// Whatever names, modes and bytes the Windows renderer is given (distinct plain names,
    /// as a node config's files are: the reader refuses a name written twice), the reader
    /// returns them unchanged.
    #[test]
    fn powershell_round_trips(
        files in prop::collection::btree_map(
            "[A-Za-z0-9._-]{1,20}",
            (any::<bool>(), prop::collection::vec(any::<u8>(), 0..300)),
            0..6,
        ),
    ) {
        let files: Vec<kiln::render::NodeFile> = files
            .into_iter()
            .map(|(name, (secret, contents))| (name, secret, contents))
            .map(|(name, secret, contents)| kiln::render::NodeFile {
                name,
                mode: if secret { 0o600 } else { 0o644 },
                contents,
            })
            .collect();
        let data = render_payload(&files, Provisioner::Windows, RenderOptions::default()).unwrap();
        let got = check_payload(&data, "w").unwrap();
        prop_assert_eq!(got.files, files);
    }

    #[test]
    fn content_range_arbitrary_text_never_panics(v in any::<String>()) {
        let _ = content_range_start(&v);
    }

    /// A consistent `bytes START-END/TOTAL` gives START, in any case of the unit; one that
    /// contradicts itself gives nothing.
    #[test]
    fn content_range_well_formed(
        start in any::<u64>(),
        len in any::<u64>(),
        extra in any::<u64>(),
        star in any::<bool>(),
        unit in "[bB][yY][tT][eE][sS]",
    ) {
        let end = start.saturating_add(len);
        let total = if star {
            "*".to_string()
        } else {
            end.checked_add(1 + extra % 1000).map_or("*".into(), |t| t.to_string())
        };
        prop_assert_eq!(content_range_start(&format!("{unit} {start}-{end}/{total}")), Some(start));
        if len > 0 {
            prop_assert_eq!(content_range_start(&format!("bytes {end}-{start}/*")), None);
        }
        if !star && end < u64::MAX {
            prop_assert_eq!(content_range_start(&format!("bytes {start}-{end}/{end}")), None);
        }
        prop_assert_eq!(content_range_start(&format!("bytes */{end}")), None);
        prop_assert_eq!(content_range_start(&format!("bytes +{start}-{end}/*")), None);
    }
}

/// Found by `multipart_round_trips`: with boundary `E`, the CA's `-----END CERTIFICATE-----`
/// line contains `--E`; only a whole delimiter line ends a part (RFC 2046 §5.1.1), so the
/// certificate and the files after it stay whole.
#[test]
fn a_boundary_inside_a_content_line_is_not_a_delimiter() {
    let files = example_files();
    let render = |fs: &[kiln::render::NodeFile]| {
        String::from_utf8(
            render_payload(fs, Provisioner::CloudInit, RenderOptions::default()).unwrap(),
        )
        .unwrap()
    };
    let (first, rest) = (render(&files[..1]), render(&files[1..]));
    assert!(
        rest.contains("-----END"),
        "the example must carry a PEM block"
    );
    let text = multipart(&[(first, false), (rest, false)], "bOUNdaRY", "E", false);
    let got = check_payload(text.as_bytes(), "u").unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(got.files, files);
}
