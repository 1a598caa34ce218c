//! docs/contract.md stays exactly true: its reason-code table lists every `Reason` in order
//! with the code's exit status and hint, its status JSON example is valid JSON with the
//! keys in the order kiln writes them, every section names the module that implements it,
//! and every path `kiln_firstboot::contract::paths` defines is on the page.

use kiln_firstboot::Reason;

fn contract() -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/contract.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn reason_table_matches_the_code() {
    let doc = contract();
    let start = doc
        .find("| reason | exit | meaning | hint |")
        .expect("reason table");
    let rows: Vec<Vec<String>> = doc[start..]
        .lines()
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), Reason::ALL.len(), "{rows:?}");
    for (row, r) in rows.iter().zip(Reason::ALL) {
        assert_eq!(row.len(), 4, "{row:?}");
        assert_eq!(row[0], format!("`{}`", r.code()), "{row:?}");
        assert_eq!(row[1], r.exit_code().to_string(), "{}", r.code());
        assert_eq!(row[3], r.hint(), "hint of {}", r.code());
        assert!(!row[2].is_empty(), "{} has no meaning", r.code());
    }
}

#[test]
fn every_signature_reason_is_in_the_table() {
    let doc = contract();
    for s in kiln_firstboot::diagnose::SIGNATURES {
        assert!(doc.contains(&format!("| `{}` |", s.reason.code())));
    }
}

#[test]
fn status_example_parses_with_keys_in_order() {
    let doc = contract();
    let at = doc.find("## Status JSON").unwrap();
    let block = &doc[at..];
    let json = &block[block.find("```json\n").unwrap() + 8..];
    let json = &json[..json.find("```").unwrap()];
    let v = kiln_firstboot::json::parse(json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    let kiln_firstboot::json::Value::Object(members) = v else {
        panic!("not an object")
    };
    let keys: Vec<&str> = members.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        [
            "kiln_contract",
            "kiln_version",
            "image_id",
            "provider",
            "node_name",
            "result",
            "reason",
            "message",
            "hint",
            "phases",
            "sizing",
            "log",
            "units"
        ]
    );
}

#[test]
fn every_section_names_its_implementation_and_the_files_exist() {
    let doc = contract();
    let lines: Vec<&str> = doc.lines().collect();
    let first = lines.iter().position(|l| *l == "## Conventions").unwrap();
    let mut sections = 0;
    for (i, l) in lines.iter().enumerate().skip(first) {
        if !(l.starts_with("## ") || l.starts_with("### ")) {
            continue;
        }
        sections += 1;
        let note = lines[i + 1..]
            .iter()
            .find(|l| !l.is_empty())
            .unwrap_or_else(|| panic!("{l}: nothing follows"));
        assert!(note.starts_with("Implemented by: "), "{l}: {note}");
        for link in note.split("](../").skip(1) {
            let rel = &link[..link.find(')').unwrap()];
            let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("..")
                .join(rel);
            assert!(path.is_file(), "{l}: {rel} does not exist");
        }
    }
    assert!(sections >= 19, "{sections} sections");
}

#[test]
fn every_contract_path_is_documented() {
    use kiln_firstboot::contract::paths::*;
    let doc = contract();
    for p in [
        IMAGE_DIR,
        IMAGE_ENV,
        MAX_PODS_MAP,
        DEFAULT_KUBELET_CONFIG,
        INSTALL_MANIFEST,
        CONTAINERD_CONFIG,
        CONTAINERD_CERTS_D,
        FIRSTBOOT_BIN,
        BIN_DIR,
        CNI_BIN_DIR,
        SYSCTL_CONF,
        MODULES_LOAD_CONF,
        SYSTEMD_UNIT_DIR,
        NODE_DIR,
        NODE_ENV,
        CA_CRT,
        BOOTSTRAP_KUBECONFIG,
        BOOTSTRAP_TOKEN,
        KUBEADM_JOIN,
        KUBELET_CONFIG_OVERRIDE,
        RUN_DIR,
        KUBELET_ENV,
        RUN_BOOTSTRAP_KUBECONFIG,
        STATUS_JSON,
        FAILURE,
        CAPI_SUCCESS,
        CAPI_FAILURE,
        KUBELET_KUBECONFIG,
        KUBELET_PKI_DIR,
        KUBEADM_KUBELET_CONF,
    ] {
        assert!(doc.contains(p), "{p} is not in docs/contract.md");
    }
}
