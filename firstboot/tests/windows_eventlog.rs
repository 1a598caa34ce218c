//! The Windows Event Log's record layout and the SCM events diagnosis takes from it, on every
//! host: records are built byte by byte from the documented `EVENTLOGRECORD` layout (winnt.h),
//! since Wine's `ReadEventLogW` returns none (docs/windows.md, "What is tested").

use kiln_firstboot::diagnose::conclude;
use kiln_firstboot::windows::eventlog::{
    parse_records, scm_events, status_text, EventRecord, Watched, SCM_SOURCE,
};
use kiln_firstboot::Reason;

fn utf16z(s: &str) -> Vec<u8> {
    s.encode_utf16()
        .chain(Some(0))
        .flat_map(u16::to_le_bytes)
        .collect()
}

/// One record as `ReadEventLogW` lays it out: the 56-byte header, source and computer names,
/// the insertion strings, the data, padding to a DWORD, the length again.
fn record(
    number: u32,
    time: u32,
    event_id: u32,
    source: &str,
    strings: &[&str],
    data: &[u8],
) -> Vec<u8> {
    let mut body = utf16z(source);
    body.extend(utf16z("NODE-1"));
    let string_off = 56 + body.len();
    for s in strings {
        body.extend(utf16z(s));
    }
    let data_off = 56 + body.len();
    body.extend_from_slice(data);
    while !(56 + body.len() + 4).is_multiple_of(4) {
        body.push(0);
    }
    let len = (56 + body.len() + 4) as u32;
    let mut r = Vec::new();
    for v in [len, 0x654c_664c, number, time, time, event_id] {
        r.extend(v.to_le_bytes());
    }
    for v in [1u16, strings.len() as u16, 0, 0] {
        r.extend(v.to_le_bytes());
    }
    for v in [
        0u32,
        string_off as u32,
        0,
        0,
        data.len() as u32,
        data_off as u32,
    ] {
        r.extend(v.to_le_bytes());
    }
    r.extend(body);
    r.extend(len.to_le_bytes());
    r
}

/// SCM's 7031, "The %1 service terminated unexpectedly. It has done this %2 time(s). The
/// following corrective action will be taken in %3 milliseconds: %5.", with the severity bits
/// the real EventID carries.
fn crash_7031(number: u32, time: u32, display: &str, data: &[u8]) -> Vec<u8> {
    let strings = [display, "1", "10000", "1", "Restart the service"];
    record(number, time, 0xC000_1B77, SCM_SOURCE, &strings, data)
}

const WATCHED: [Watched<'static>; 2] = [
    Watched {
        unit: "kubelet.service",
        service: "kubelet",
        display: "Kubernetes kubelet",
    },
    Watched {
        unit: "containerd.service",
        service: "containerd",
        display: "containerd container runtime",
    },
];

#[test]
fn records_parse_as_laid_out() {
    let mut buf = crash_7031(
        41,
        1_700_000_100,
        "Kubernetes kubelet",
        &utf16z("kubelet/4"),
    );
    buf.extend(record(
        42,
        1_700_000_200,
        7036,
        SCM_SOURCE,
        &["containerd container runtime", "running"],
        &[],
    ));
    let recs = parse_records(&buf).unwrap();
    assert_eq!(recs.len(), 2);
    let r = &recs[0];
    assert_eq!(
        (r.record_number, r.time_generated, r.event_id, r.event_type),
        (41, 1_700_000_100, 7031, 1)
    );
    assert_eq!(r.source, SCM_SOURCE);
    assert_eq!(r.strings[0], "Kubernetes kubelet");
    assert_eq!(r.strings[4], "Restart the service");
    assert_eq!(r.data, utf16z("kubelet/4"));
    assert_eq!(recs[1].strings, ["containerd container runtime", "running"]);
    assert!(parse_records(&[]).unwrap().is_empty());
}

#[test]
fn broken_records_are_errors_naming_the_offset() {
    let good = record(1, 10, 7034, SCM_SOURCE, &["kubelet", "2"], &[1, 2]);
    let n = good.len();
    // Every truncation of a second record after a good one.
    for cut in 1..n {
        let mut buf = good.clone();
        buf.extend_from_slice(&good[..cut]);
        let e = parse_records(&buf).unwrap_err();
        assert!(
            e.starts_with(&format!("event record at byte {n}:")),
            "{cut}: {e}"
        );
    }
    let patched = |at: usize, v: u32| {
        let mut b = good.clone();
        b[at..at + 4].copy_from_slice(&v.to_le_bytes());
        b
    };
    let cases = [
        (patched(0, 0), "length 0 does not fit"),
        (patched(0, n as u32 + 4), "does not fit"),
        (patched(0, n as u32 - 2), "does not fit"),
        (patched(4, 0x1234_5678), "no LfLe signature"),
        (patched(n - 4, 8), "trailing length differs"),
        (patched(36, n as u32 - 4), "string unterminated"),
        (patched(36, 8), "strings outside the record"),
        (patched(52, n as u32 - 4), "data outside the record"),
        (patched(48, u32::MAX), "data outside the record"),
    ];
    for (buf, want) in cases {
        let e = parse_records(&buf).unwrap_err();
        assert!(
            e.starts_with("event record at byte 0: ") && e.contains(want),
            "{want}: {e}"
        );
    }
    // A source name with no NUL before the trailing length.
    let mut b = good.clone();
    for x in &mut b[56..n - 4] {
        *x = 0x41;
    }
    assert!(parse_records(&b)
        .unwrap_err()
        .contains("source name unterminated"));
}

#[test]
fn scm_failures_of_this_boot_become_lines_and_restarts() {
    let since = 1_700_000_000;
    // Newest first, as ReadEventLogW reads backwards.
    let recs: Vec<EventRecord> = [
        // Not failures, not the SCM, or another service: ignored.
        crash_7031(10, since + 43, "kubelet-extra", &utf16z("kubelet-extra/4")),
        crash_7031(9, since + 42, "Print Spooler", &utf16z("Spooler/4")),
        record(
            8,
            since + 41,
            0xC000_1B77,
            "kubelet",
            &["Kubernetes kubelet"],
            &[],
        ),
        record(
            7,
            since + 40,
            7036,
            SCM_SOURCE,
            &["Kubernetes kubelet", "running"],
            &[],
        ),
        // Named by service name, by service name in the data, and by display name.
        record(
            6,
            since + 30,
            0xC000_1B7A,
            SCM_SOURCE,
            &["kubelet", "3"],
            &[],
        ),
        crash_7031(
            5,
            since + 20,
            "Some Display Name Windows Localized",
            &utf16z("KUBELET/4"),
        ),
        crash_7031(4, since + 10, "Kubernetes kubelet", &[]),
        // 7009 names the service in its second string; 7000 names containerd.
        record(
            3,
            since + 6,
            0xC000_1B61,
            SCM_SOURCE,
            &["30000", "containerd"],
            &[],
        ),
        record(
            2,
            since + 5,
            0xC000_1B58,
            SCM_SOURCE,
            &["containerd container runtime", "%%1053"],
            &[],
        ),
        // Before this boot: ignored.
        crash_7031(1, since - 5, "Kubernetes kubelet", &[]),
    ]
    .iter()
    .flat_map(|r| parse_records(r).unwrap())
    .collect();
    let e = scm_events(&recs, &WATCHED, since);
    assert_eq!(e.restarts_of("kubelet.service"), Some(2));
    assert_eq!(e.restarts_of("containerd.service"), Some(0));
    assert_eq!(e.lines.len(), 5, "{:#?}", e.lines);
    assert_eq!(
        e.lines[0],
        "containerd: service failure, SCM event 7000: failed to start (containerd container runtime | %%1053)"
    );
    assert!(e.lines[1].starts_with("containerd: service failure, SCM event 7009: "));
    assert!(e.lines[2].starts_with("kubelet: service failure, SCM event 7031: "));
    assert!(e.lines[4].starts_with(
        "kubelet: service failure, SCM event 7034: failed: terminated unexpectedly (kubelet | 3)"
    ));
    // No records at all: zero restarts, which is known, not unknown.
    let none = scm_events(&[], &WATCHED, since);
    assert_eq!(
        (none.restarts_of("kubelet.service"), none.lines.len()),
        (Some(0), 0)
    );
}

#[test]
fn event_log_restarts_and_lines_reach_the_same_reasons_as_the_journal() {
    use kiln_firstboot::diagnose::UnitState;
    let since = 1_700_000_000;
    let recs: Vec<EventRecord> = (0..3)
        .flat_map(|i| parse_records(&crash_7031(i, since + i, "Kubernetes kubelet", &[])).unwrap())
        .collect();
    let e = scm_events(&recs, &WATCHED, since);
    // The SCM shows kubelet running between its recovery restarts; the 7031 count is what
    // tells the crash loop apart, as NRestarts does on Linux.
    let kubelet = UnitState {
        name: "kubelet.service".into(),
        active_state: "active".into(),
        result: "success".into(),
        restarts: e.restarts_of("kubelet.service"),
        ..UnitState::default()
    };
    assert!(!kubelet.is_healthy() && kubelet.has_died(3));
    let lines: Vec<String> = e.lines.iter().map(|l| format!("eventlog: {l}")).collect();
    let d = conclude(vec![kubelet], &lines, "kubelet.service");
    assert_eq!(d.reason, Reason::KubeletExited);
    assert_eq!(
        d.message,
        "kubelet.service is active (result=success, restarts=3)"
    );
    assert_eq!(d.log.len(), 3, "{:?}", d.log);
    // The journal's signature table applies to event log lines like any other line.
    let mut lines = lines;
    lines.push("eventlog: kubelet: x509: certificate signed by unknown authority".into());
    assert_eq!(
        conclude(Vec::new(), &lines, "kubelet.service").reason,
        Reason::ApiX509
    );
}

#[test]
fn status_text_leads_with_the_result_and_fits_report_event() {
    let t = status_text(
        Some("CONFIG_MISSING"),
        "node.env is missing",
        "KILN-STATUS {}",
    );
    assert_eq!(
        t,
        "kiln-firstboot: result=failure reason=CONFIG_MISSING\r\nnode.env is missing\r\n\r\nKILN-STATUS {}"
    );
    assert_eq!(
        status_text(None, "", "KILN-STATUS {}"),
        "kiln-firstboot: result=success\r\n\r\nKILN-STATUS {}"
    );
    // ReportEventW takes at most 31,839 characters a string; multi-byte text is cut whole.
    let long = "é".repeat(40_000);
    let t = status_text(Some("X"), &long, "KILN-STATUS {}");
    assert!(t.len() <= 31_000 && t.starts_with("kiln-firstboot: result=failure"));
}

/// Under Wine: the calls themselves. Wine 8's `ReadEventLogW` is a stub that finds no record
/// and its `ReportEventW` only prints the strings on its `eventlog` debug channel
/// (dlls/advapi32/eventlog.c); docs/windows.md says what that leaves untested.
#[cfg(windows)]
mod wine {
    use std::path::PathBuf;
    use std::process::Command;

    use kiln_firstboot::diagnose::{self, ReportOptions};
    use kiln_firstboot::windows::eventlog::{self, SOURCE_KEY};
    use kiln_firstboot::Reason;

    const EXE: &str = env!("CARGO_BIN_EXE_kiln-firstboot");
    /// What a log without records gives, which is all Wine 8's `ReadEventLogW` returns.
    const UNAVAILABLE: &str = "event log unavailable: ReadEventLogW(System) found no record at all (Windows error 38, end of log), not even this boot's EventLog 6005";

    fn temp_root(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "kiln-evt-{tag}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn an_unreadable_event_log_is_a_note_in_the_diagnosis_not_a_failure() {
        assert_eq!(
            eventlog::this_boot(&["kubelet.service"]).unwrap_err(),
            UNAVAILABLE
        );
        let mut opts = ReportOptions::new(&temp_root("diag"));
        opts.kubelet_unit = "kiln-no-such-kubelet.service".into();
        opts.containerd_unit = "kiln-no-such-containerd.service".into();
        let lines = diagnose::read_logs(&opts);
        assert_eq!(lines, [format!("eventlog: {UNAVAILABLE}")]);
        // The rest of the diagnosis goes on and keeps the note in its log.
        let d = diagnose::diagnose(&opts);
        assert_eq!(d.reason, Reason::JoinTimeout);
        assert_eq!(d.log, lines);
    }

    #[test]
    fn the_final_status_goes_through_report_event() {
        // Wine's RegisterEventSourceW hands out a handle and its ReportEventW takes the event.
        eventlog::report(false, "kiln-firstboot: result=failure reason=TEST").unwrap();
        eventlog::report(true, "kiln-firstboot: result=success").unwrap();
        let root = temp_root("run");
        let out = Command::new(EXE)
            .args(["run", "--provider", "none", "--no-start", "--deadline", "5"])
            .arg("--root")
            .arg(&root)
            .arg("--console")
            .arg(root.join("console.log"))
            // Wine prints an error event's text on its `eventlog` channel, to the Unix stderr
            // it inherited (the suite's log, not `out`): `err:eventlog:ReportEventW L"…"`.
            .env("WINEDEBUG", "-all,+eventlog")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "{stderr}");
        assert!(stderr.contains("CONFIG_MISSING"), "{stderr}");
        // A failed RegisterEventSourceW/ReportEventW would be a warning here.
        assert!(!stderr.contains("event log"), "{stderr}");
    }

    fn source_value(name: &str) -> Option<String> {
        let out = Command::new("reg")
            .args(["query", &format!("HKLM\\{SOURCE_KEY}"), "/v", name])
            .output()
            .expect("run reg.exe");
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    #[test]
    fn install_registers_the_application_log_source_and_uninstall_removes_it() {
        eventlog::register_source().unwrap();
        let file = source_value("EventMessageFile").expect("EventMessageFile");
        assert!(
            file.contains("REG_EXPAND_SZ")
                && file.contains(r"%SystemRoot%\System32\EventCreate.exe"),
            "{file}"
        );
        let types = source_value("TypesSupported").expect("TypesSupported");
        assert!(types.trim_end().ends_with("0x7"), "{types}");
        // Again: an update in place, not an error.
        eventlog::register_source().unwrap();
        eventlog::unregister_source().unwrap();
        assert_eq!(source_value("EventMessageFile"), None);
        eventlog::unregister_source().unwrap();
    }
}
