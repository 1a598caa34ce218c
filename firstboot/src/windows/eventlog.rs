//! The Windows Event Log, both ways: what the Service Control Manager recorded this boot about
//! kubelet and containerd (the System log, read with `OpenEventLogW`/`ReadEventLogW`), for
//! diagnosis; and kiln-firstboot's own final status, written to the Application log
//! (`ReportEventW`) so Event Viewer shows it.
//!
//! The record layout (`EVENTLOGRECORD`, winnt.h) is parsed by plain code, tested on every host
//! with records built byte by byte; only the calls are Windows-only.

/// The legacy source name the Service Control Manager writes its System log events under.
pub const SCM_SOURCE: &str = "Service Control Manager";
/// kiln-firstboot's event source in the Application log.
pub const SOURCE: &str = "kiln-firstboot";
/// The Application log key `install` registers the source under, with EventCreate.exe's
/// message table (its IDs 1 to 1000 print the event's one string), as Go's
/// `golang.org/x/sys/windows/svc/eventlog.InstallAsEventCreate` does.
pub const SOURCE_KEY: &str =
    r"SYSTEM\CurrentControlSet\Services\EventLog\Application\kiln-firstboot";
/// kiln-firstboot's event IDs: a run (or `report`) that ended in success, and in failure.
pub const EVENT_SUCCESS: u32 = 1;
pub const EVENT_FAILURE: u32 = 2;
/// `ReportEventW` takes strings of at most 31,839 characters.
const EVENT_TEXT_CAP: usize = 31_000;

/// `EVENTLOGRECORD`'s fixed part: 56 bytes before the source name.
const HEADER: usize = 56;
/// `Reserved`, always `ELF_LOG_SIGNATURE` ("LfLe").
const SIGNATURE: u32 = 0x654c_664c;

/// One record of a classic event log, as `ReadEventLogW` returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    pub record_number: u32,
    /// Seconds since 1970-01-01 UTC.
    pub time_generated: u32,
    /// The event code: the low 16 bits of `EventID` (SCM's 7034 is `0xC0001B7A`).
    pub event_id: u16,
    pub event_type: u16,
    pub source: String,
    /// The insertion strings (`%1`, `%2`, …), not the formatted message.
    pub strings: Vec<String>,
    /// The binary data; the SCM puts the service's key name there (`kubelet/…` in UTF-16).
    pub data: Vec<u8>,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A NUL-terminated UTF-16 string at `at` in `rec`, ending before `end`; its text and the
/// offset after its NUL.
fn wstr(rec: &[u8], at: usize, end: usize) -> Option<(String, usize)> {
    let mut units = Vec::new();
    let mut i = at;
    while i + 2 <= end {
        let c = u16_at(rec, i);
        i += 2;
        if c == 0 {
            return Some((String::from_utf16_lossy(&units), i));
        }
        units.push(c);
    }
    None
}

/// Parses the records `ReadEventLogW` put in a buffer. Every length and offset is checked
/// against the record it is in; a record that does not hold together is an error naming its
/// byte offset (the buffer cannot be walked past it).
pub fn parse_records(buf: &[u8]) -> Result<Vec<EventRecord>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let bad = |what: &str| format!("event record at byte {at}: {what}");
        let rest = &buf[at..];
        if rest.len() < HEADER + 4 {
            return Err(bad("truncated header"));
        }
        let len = u32_at(rest, 0) as usize;
        if len < HEADER + 4 || len > rest.len() || !len.is_multiple_of(4) {
            return Err(bad(&format!("length {len} does not fit")));
        }
        let rec = &rest[..len];
        if u32_at(rec, 4) != SIGNATURE {
            return Err(bad("no LfLe signature"));
        }
        // The length is repeated in the record's last DWORD.
        if u32_at(rec, len - 4) as usize != len {
            return Err(bad("trailing length differs"));
        }
        let end = len - 4;
        let (num_strings, string_off) = (u16_at(rec, 26) as usize, u32_at(rec, 36) as usize);
        let (data_len, data_off) = (u32_at(rec, 48) as usize, u32_at(rec, 52) as usize);
        let source = wstr(rec, HEADER, end).ok_or_else(|| bad("source name unterminated"))?;
        if num_strings > 0 && !(HEADER..=end).contains(&string_off) {
            return Err(bad("strings outside the record"));
        }
        let mut strings = Vec::with_capacity(num_strings.min(64));
        let mut s_at = string_off;
        for _ in 0..num_strings {
            let (s, next) = wstr(rec, s_at, end).ok_or_else(|| bad("string unterminated"))?;
            strings.push(s);
            s_at = next;
        }
        let data = match data_off.checked_add(data_len) {
            _ if data_len == 0 => Vec::new(),
            Some(e) if data_off >= HEADER && e <= end => rec[data_off..e].to_vec(),
            _ => return Err(bad("data outside the record")),
        };
        out.push(EventRecord {
            record_number: u32_at(rec, 8),
            time_generated: u32_at(rec, 12),
            event_id: (u32_at(rec, 20) & 0xFFFF) as u16,
            event_type: u16_at(rec, 24),
            source: source.0,
            strings,
            data,
        });
        at += len;
    }
    Ok(out)
}

/// The SCM events that say a service failed, what each means, and which insertion string
/// names the service (its display name).
fn scm_failure(id: u16) -> Option<(&'static str, usize)> {
    Some(match id {
        7000 => ("failed to start", 0),
        7009 => ("failed to connect to the SCM in time (start timeout)", 1),
        7011 => ("failed to answer a control in time", 1),
        7023 => ("failed: terminated with an error", 0),
        7024 => ("failed: terminated with a service-specific error", 0),
        7031 => ("failed: terminated unexpectedly, recovery action taken", 0),
        7034 => ("failed: terminated unexpectedly", 0),
        _ => return None,
    })
}

/// A service diagnosis asks about: its unit name (`kubelet.service`), SCM name and display
/// name.
#[derive(Debug, Clone, Copy)]
pub struct Watched<'a> {
    pub unit: &'a str,
    pub service: &'a str,
    pub display: &'a str,
}

impl Watched<'_> {
    /// The record is about this service: the string that names the service is its display
    /// or service name, or the record's data starts with the service name (UTF-16, then `/`
    /// or NUL), compared without case as Windows compares service names.
    fn named_by(&self, r: &EventRecord, index: usize) -> bool {
        let by_string = r.strings.get(index).is_some_and(|s| {
            s.eq_ignore_ascii_case(self.display) || s.eq_ignore_ascii_case(self.service)
        });
        let units: Vec<u16> = r.data.chunks_exact(2).map(|c| u16_at(c, 0)).collect();
        let name: String = String::from_utf16_lossy(&units)
            .chars()
            .take_while(|&c| c != '/' && c != '\0')
            .collect();
        by_string || name.eq_ignore_ascii_case(self.service)
    }
}

/// What the System log says about the watched services since `since` (seconds since 1970).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScmEvents {
    /// One line per failure event, oldest first: `kubelet: service failure, SCM event 7034: …`.
    pub lines: Vec<String>,
    /// Per unit, how many times the SCM restarted it (event 7031: terminated, recovery action
    /// taken), as systemd's `NRestarts`.
    pub restarts: Vec<(String, u32)>,
}

impl ScmEvents {
    /// The restart count of `unit`.
    pub fn restarts_of(&self, unit: &str) -> Option<u32> {
        self.restarts.iter().find(|(u, _)| u == unit).map(|r| r.1)
    }
}

/// Picks the watched services' failure events out of `records`, newest first as
/// `ReadEventLogW` reads backwards.
pub fn scm_events(records: &[EventRecord], watched: &[Watched<'_>], since: u32) -> ScmEvents {
    let recs = records
        .iter()
        .rev()
        .filter(|r| r.time_generated >= since && r.source == SCM_SOURCE);
    let mut out = ScmEvents {
        restarts: watched.iter().map(|w| (w.unit.to_string(), 0)).collect(),
        ..ScmEvents::default()
    };
    for r in recs {
        let Some((what, index)) = scm_failure(r.event_id) else {
            continue;
        };
        let Some(i) = watched.iter().position(|w| w.named_by(r, index)) else {
            continue;
        };
        if r.event_id == 7031 {
            out.restarts[i].1 += 1;
        }
        let label = watched[i]
            .unit
            .strip_suffix(".service")
            .unwrap_or(watched[i].unit);
        let mut line = format!("{label}: service failure, SCM event {}: {what}", r.event_id);
        if !r.strings.is_empty() {
            line.push_str(" (");
            line.push_str(&r.strings.join(" | "));
            line.push(')');
        }
        out.lines.push(line);
    }
    out
}

/// The text of kiln-firstboot's status event: one summary line, the message, then the same
/// `KILN-STATUS` line as the console's, cut to what `ReportEventW` takes.
pub fn status_text(reason: Option<&str>, message: &str, status_line: &str) -> String {
    let mut t = match reason {
        None => "kiln-firstboot: result=success".to_string(),
        Some(code) => format!("kiln-firstboot: result=failure reason={code}\r\n{message}"),
    };
    t.push_str("\r\n\r\n");
    t.push_str(status_line);
    if t.len() > EVENT_TEXT_CAP {
        let mut cut = EVENT_TEXT_CAP;
        while !t.is_char_boundary(cut) {
            cut -= 1;
        }
        t.truncate(cut);
    }
    t
}

#[cfg(windows)]
pub use calls::{register_source, report, this_boot, unregister_source};

/// Writes a final status to the Application log ([`status_text`], redacted); a failure is a
/// warning on stderr, never a failed run.
#[cfg(windows)]
pub fn publish(
    reason: Option<crate::Reason>,
    message: &str,
    status_line: &str,
    redactor: &crate::redact::Redactor,
) {
    let text = status_text(reason.map(|r| r.code()), message, status_line);
    if let Err(e) = report(reason.is_none(), redactor.redact(&text).as_str()) {
        crate::redact::eprint(&redactor.redact(&format!("kiln-firstboot: warning: {e}")));
    }
}

#[cfg(windows)]
mod calls {
    use std::ffi::c_void;
    use std::ptr::{null, null_mut};

    use super::super::firmware::{
        wide, Handle, RegCloseKey, RegCreateKeyExW, RegSetValueExW, ERROR_FILE_NOT_FOUND,
        ERROR_SUCCESS, HKEY_LOCAL_MACHINE, KEY_SET_VALUE,
    };
    use super::{parse_records, scm_events, EventRecord, ScmEvents, Watched, SOURCE, SOURCE_KEY};

    const EVENTLOG_SEQUENTIAL_READ: u32 = 0x1;
    const EVENTLOG_BACKWARDS_READ: u32 = 0x8;
    const EVENTLOG_ERROR_TYPE: u16 = 0x1;
    const EVENTLOG_INFORMATION_TYPE: u16 = 0x4;
    const ERROR_HANDLE_EOF: u32 = 38;
    const ERROR_INSUFFICIENT_BUFFER: u32 = 122;
    const REG_DWORD: u32 = 4;
    const REG_EXPAND_SZ: u32 = 2;
    /// How much of the System log one diagnosis reads at most, newest first.
    const READ_CAP: usize = 4 << 20;

    #[link(name = "advapi32")]
    extern "system" {
        fn OpenEventLogW(server: *const u16, log: *const u16) -> Handle;
        fn ReadEventLogW(
            log: Handle,
            flags: u32,
            offset: u32,
            buf: *mut c_void,
            size: u32,
            read: *mut u32,
            needed: *mut u32,
        ) -> i32;
        fn CloseEventLog(log: Handle) -> i32;
        fn RegisterEventSourceW(server: *const u16, source: *const u16) -> Handle;
        fn ReportEventW(
            log: Handle,
            kind: u16,
            category: u16,
            id: u32,
            sid: *mut c_void,
            num_strings: u16,
            data_size: u32,
            strings: *const *const u16,
            data: *mut c_void,
        ) -> i32;
        fn DeregisterEventSource(log: Handle) -> i32;
        fn RegDeleteKeyW(key: Handle, sub: *const u16) -> i32;
    }

    #[link(name = "kernel32")]
    extern "system" {
        fn GetLastError() -> u32;
        fn GetTickCount64() -> u64;
    }

    fn last_error() -> u32 {
        // SAFETY: GetLastError has no preconditions.
        unsafe { GetLastError() }
    }

    /// When this boot began, in seconds since 1970 (the clock minus the uptime).
    fn boot_time() -> u32 {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        // SAFETY: GetTickCount64 has no preconditions.
        let up = unsafe { GetTickCount64() } / 1000;
        now.saturating_sub(up + 1) as u32
    }

    /// The records of `log` written this boot, newest first: those after the newest EventLog
    /// 6005 ("The Event log service was started", written at every start), or, without one,
    /// those since the clock's boot time; at most [`READ_CAP`] bytes are read. A log that
    /// yields no record at all cannot be the System log of a running Windows (it holds at
    /// least that 6005): an error.
    fn read_this_boot(log: &str) -> Result<Vec<EventRecord>, String> {
        let name = wide(log);
        // SAFETY: a null server is the local machine; the name is NUL-terminated.
        let h = unsafe { OpenEventLogW(null(), name.as_ptr()) };
        if h.is_null() {
            return Err(format!(
                "OpenEventLogW({log}): Windows error {}",
                last_error()
            ));
        }
        let since = boot_time();
        let mut buf = vec![0u8; 64 * 1024];
        let (mut out, mut total, mut seen) = (Vec::new(), 0, 0);
        let (mut boundary, mut found) = (false, false);
        let result = loop {
            let (mut read, mut needed) = (0u32, 0u32);
            // SAFETY: h is open; buf is writable for its length, which is passed.
            let ok = unsafe {
                ReadEventLogW(
                    h,
                    EVENTLOG_SEQUENTIAL_READ | EVENTLOG_BACKWARDS_READ,
                    0,
                    buf.as_mut_ptr().cast(),
                    buf.len() as u32,
                    &mut read,
                    &mut needed,
                )
            };
            if ok == 0 {
                match last_error() {
                    ERROR_HANDLE_EOF if seen == 0 => {
                        break Err(format!(
                            "ReadEventLogW({log}) found no record at all (Windows error 38, end of \
                             log), not even this boot's EventLog 6005"
                        ))
                    }
                    ERROR_HANDLE_EOF => break Ok(()),
                    ERROR_INSUFFICIENT_BUFFER if (needed as usize) <= READ_CAP => {
                        buf.resize(needed as usize, 0);
                        continue;
                    }
                    e => break Err(format!("ReadEventLogW({log}): Windows error {e}")),
                }
            }
            let n = (read as usize).min(buf.len());
            let recs = match parse_records(&buf[..n]) {
                Ok(r) => r,
                Err(e) => break Err(format!("{log} log: {e}")),
            };
            total += n;
            seen += recs.len();
            for r in recs {
                // Older than a day before the clock's boot time is an earlier boot for sure.
                found = r.source == "EventLog" && r.event_id == 6005;
                boundary = found || u64::from(r.time_generated) + 86_400 < u64::from(since);
                if boundary {
                    break;
                }
                out.push(r);
            }
            if boundary || total >= READ_CAP || n == 0 {
                break Ok(());
            }
        };
        // SAFETY: h was opened above and is closed once.
        unsafe { CloseEventLog(h) };
        result?;
        if !found {
            out.retain(|r| r.time_generated >= since);
        }
        Ok(out)
    }

    /// The SCM's failure events of this boot for `units` (unit names as the image names
    /// them); an error reads `event log unavailable: …`.
    pub fn this_boot(units: &[&str]) -> Result<ScmEvents, String> {
        let specs = super::super::node_services(std::path::Path::new(r"C:\k"), "C:\\".as_ref());
        let watched: Vec<Watched<'_>> = units
            .iter()
            .filter(|u| !u.is_empty())
            .map(|&unit| {
                let service = super::super::service_name(unit);
                let display = specs
                    .iter()
                    .find(|s| s.name.eq_ignore_ascii_case(service))
                    .map_or(service, |s| s.display_name.as_str());
                Watched {
                    unit,
                    service,
                    display,
                }
            })
            .collect();
        let records =
            read_this_boot("System").map_err(|e| format!("event log unavailable: {e}"))?;
        Ok(scm_events(&records, &watched, 0))
    }

    /// Writes `text` to the Application log as kiln-firstboot's event
    /// ([`super::EVENT_SUCCESS`] or [`super::EVENT_FAILURE`]).
    pub fn report(success: bool, text: &str) -> Result<(), String> {
        let (source, text_w) = (wide(SOURCE), wide(text));
        // SAFETY: a null server is the local machine; the source name is NUL-terminated.
        let h = unsafe { RegisterEventSourceW(null(), source.as_ptr()) };
        if h.is_null() {
            return Err(format!(
                "event log: RegisterEventSourceW({SOURCE}): Windows error {}",
                last_error()
            ));
        }
        let (kind, id) = match success {
            true => (EVENTLOG_INFORMATION_TYPE, super::EVENT_SUCCESS),
            false => (EVENTLOG_ERROR_TYPE, super::EVENT_FAILURE),
        };
        let strings = [text_w.as_ptr()];
        // SAFETY: h is a registered source; one NUL-terminated string, no SID, no data.
        let ok = unsafe {
            ReportEventW(
                h,
                kind,
                0,
                id,
                null_mut(),
                1,
                0,
                strings.as_ptr(),
                null_mut(),
            )
        };
        let err = (ok == 0).then(last_error);
        // SAFETY: h came from RegisterEventSourceW and is released once.
        unsafe { DeregisterEventSource(h) };
        match err {
            Some(e) => Err(format!("event log: ReportEventW: Windows error {e}")),
            None => Ok(()),
        }
    }

    /// Registers kiln-firstboot as an Application log source (`install`): EventCreate.exe's
    /// message table, error, warning and information events.
    pub fn register_source() -> Result<(), String> {
        let path = wide(SOURCE_KEY);
        let mut key: Handle = null_mut();
        // SAFETY: the path is NUL-terminated; `key` receives the opened key.
        let rc = unsafe {
            RegCreateKeyExW(
                HKEY_LOCAL_MACHINE,
                path.as_ptr(),
                0,
                null_mut(),
                0,
                KEY_SET_VALUE,
                null_mut(),
                &mut key,
                null_mut(),
            )
        };
        if rc != ERROR_SUCCESS {
            return Err(format!("creating HKLM\\{SOURCE_KEY}: Windows error {rc}"));
        }
        let file: Vec<u8> = wide(r"%SystemRoot%\System32\EventCreate.exe")
            .iter()
            .flat_map(|c| c.to_le_bytes())
            .collect();
        let values: [(&str, u32, Vec<u8>); 3] = [
            ("EventMessageFile", REG_EXPAND_SZ, file),
            ("TypesSupported", REG_DWORD, 7u32.to_le_bytes().to_vec()),
            ("CustomSource", REG_DWORD, 1u32.to_le_bytes().to_vec()),
        ];
        let mut result = Ok(());
        for (name, kind, data) in &values {
            let name_w = wide(name);
            // SAFETY: key is open; data is in the layout `kind` wants, its length passed.
            let rc = unsafe {
                RegSetValueExW(
                    key,
                    name_w.as_ptr(),
                    0,
                    *kind,
                    data.as_ptr(),
                    data.len() as u32,
                )
            };
            if rc != ERROR_SUCCESS {
                result = Err(format!(
                    "setting {name} of HKLM\\{SOURCE_KEY}: Windows error {rc}"
                ));
                break;
            }
        }
        // SAFETY: key was opened above and is closed once.
        unsafe { RegCloseKey(key) };
        result
    }

    /// Removes the source's key (`uninstall`); a missing one is not an error.
    pub fn unregister_source() -> Result<(), String> {
        let path = wide(SOURCE_KEY);
        // SAFETY: the path is NUL-terminated.
        match unsafe { RegDeleteKeyW(HKEY_LOCAL_MACHINE, path.as_ptr()) } {
            ERROR_SUCCESS | ERROR_FILE_NOT_FOUND => Ok(()),
            rc => Err(format!("deleting HKLM\\{SOURCE_KEY}: Windows error {rc}")),
        }
    }
}
