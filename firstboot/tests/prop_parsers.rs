//! Property tests for kiln-firstboot's parsers, on stable Rust in `make test`: a fixed seed
//! and a fixed number of cases each, with a hand-written generator (firstboot takes no
//! crates, not even for tests). The cargo-fuzz targets in `firstboot/fuzz/` search the same
//! properties without the bounds (`make fuzz`).
//!
//! - the env codec: write then parse gives the same entries, whatever the values hold;
//! - the command line parser: never panics, and what it accepts is what it was given;
//! - the URL parser: never panics; a valid URL survives parse → display → parse;
//! - the max-pods map: never panics; a written map reads back first-wins;
//! - the JSON reader: never panics, nesting is bounded, strings survive the writer;
//! - the HTTP response parser: never panics; a generated response, whole or split
//!   anywhere, chunked or not, reads back as sent;
//! - the credential scanner and the redactor: the values written into a kubeconfig are
//!   found, and none of them survives redaction wherever it sits in a text.

use kiln_firstboot::cli::{self, Command};
use kiln_firstboot::config::parse_max_pods;
use kiln_firstboot::contract::envfile;
use kiln_firstboot::http::{parse_response, ResponseError, Url};
use kiln_firstboot::json::{self, Value};
use kiln_firstboot::redact::{secrets_in, Redactor, MARK};

/// Cases per property: enough to reach the odd corners, few enough for a debug build in
/// well under a second each.
const CASES: usize = 2000;

/// xorshift64*: small, fast and deterministic; a failing case is replayed by its index.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// A string of up to `max` characters drawn from `alphabet`.
    fn string_from(&mut self, alphabet: &[char], max: usize) -> String {
        let n = self.below(max + 1);
        (0..n).map(|_| *self.pick(alphabet)).collect()
    }

    /// Any `char`, biased towards ASCII and the awkward ones.
    fn any_char(&mut self) -> char {
        match self.below(4) {
            0 => char::from_u32(self.below(0x80) as u32).unwrap(),
            1 => *self.pick(AWKWARD),
            2 => char::from_u32(self.below(0x11_0000) as u32).unwrap_or('\u{fffd}'),
            _ => (b' ' + self.below(95) as u8) as char,
        }
    }

    fn any_string(&mut self, max: usize) -> String {
        let n = self.below(max + 1);
        (0..n).map(|_| self.any_char()).collect()
    }

    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max + 1);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// Characters that mean something to a shell, systemd, JSON, a URL or HTTP.
const AWKWARD: &[char] = &[
    '"', '\'', '\\', '$', '`', '\n', '\r', '\t', ' ', '#', '=', '{', '}', '[', ']', ':', ',', '/',
    '?', '@', '%', '\0', '\u{7f}', 'é', '\u{2028}', '\u{feff}', '😀',
];

#[test]
fn env_codec_round_trips_any_value() {
    let key_start: Vec<char> = ('A'..='Z').collect();
    let key_rest: Vec<char> = ('A'..='Z').chain('0'..='9').chain(['_']).collect();
    let mut rng = Rng::new(0x6b69_6c6e_0001);
    for case in 0..CASES {
        let mut want: Vec<(String, String)> = Vec::new();
        for _ in 0..rng.below(8) {
            let key = format!("{}{}", rng.pick(&key_start), rng.string_from(&key_rest, 12));
            if want.iter().any(|(k, _)| *k == key) {
                continue;
            }
            want.push((key, rng.any_string(40)));
        }
        let mut text = String::new();
        if rng.chance(30) {
            text.push_str("# a comment\n\n");
        }
        for (k, v) in &want {
            envfile::write_line(&mut text, k, v);
        }
        let got = envfile::parse(&text)
            .unwrap_or_else(|e| panic!("case {case}: {e}\n{text:?}"))
            .entries()
            .to_vec();
        assert_eq!(got, want, "case {case}: {text:?}");
    }
}

#[test]
fn env_parser_never_panics() {
    let mut rng = Rng::new(0x6b69_6c6e_0002);
    for _ in 0..CASES {
        let mut text = String::new();
        for _ in 0..rng.below(6) {
            match rng.below(3) {
                0 => text.push_str("KEY="),
                1 => text.push_str(&format!("K{}=\"", rng.below(3))),
                _ => {}
            }
            text.push_str(&rng.any_string(30));
            text.push('\n');
        }
        let _ = envfile::parse(&text);
    }
}

/// The flags of every subcommand, so random command lines often get past the first word.
const FLAGS: &[&str] = &[
    "run",
    "status",
    "report",
    "--root",
    "--provider",
    "--metadata-url",
    "--systemctl",
    "--kubeadm",
    "--vmware-rpctool",
    "--console",
    "--no-start",
    "--deadline",
    "--healthz-url",
    "--journalctl",
    "--json",
    "--help",
    "-h",
    "--version",
    "-V",
    "--deadline=0",
    "--deadline=18446744073709551616",
    "--provider=auto",
    "--provider=aws",
    "--no-start=1",
    "--metadata-url=http://127.0.0.1:1/",
    "--",
    "-",
    "=",
    "--=x",
    "",
];

#[test]
fn cli_parser_never_panics_and_keeps_what_it_accepts() {
    let mut rng = Rng::new(0x6b69_6c6e_0003);
    for case in 0..CASES {
        let args: Vec<String> = (0..rng.below(8))
            .map(|_| {
                if rng.chance(70) {
                    rng.pick(FLAGS).to_string()
                } else {
                    rng.any_string(12)
                }
            })
            .collect();
        match cli::parse(&args) {
            Ok(Command::Run(o)) => {
                if let Some(d) = o.deadline {
                    assert!(d > 0, "case {case}: {args:?}");
                }
                if let Some(u) = &o.metadata_url {
                    assert!(Url::parse(u).is_ok(), "case {case}: {args:?}");
                }
                assert!(Url::parse(&o.healthz_url).is_ok(), "case {case}: {args:?}");
            }
            Ok(_) => {}
            // An error names what it refused, never an empty message.
            Err(e) => assert!(!e.is_empty(), "case {case}: {args:?}"),
        }
    }
}

#[test]
fn url_parser_never_panics_and_valid_urls_round_trip() {
    let host_chars: Vec<char> = ('a'..='z').chain('0'..='9').chain(['.', '-']).collect();
    let path_chars: Vec<char> = ('a'..='z')
        .chain(['/', '?', '=', '&', '%', '.', '-', '_', '~'])
        .collect();
    let mut rng = Rng::new(0x6b69_6c6e_0004);
    for case in 0..CASES {
        // Anything at all: no panic.
        let junk = if rng.chance(50) {
            format!("http://{}", rng.any_string(30))
        } else {
            rng.any_string(30)
        };
        if let Ok(u) = Url::parse(&junk) {
            assert!(u.path.starts_with('/'), "case {case}: {junk:?} -> {u:?}");
            assert!(!u.host.is_empty(), "case {case}: {junk:?}");
        }
        // A valid URL: its parts come back, and so does its display form.
        let host = match rng.below(3) {
            0 => format!(
                "{}{}",
                rng.pick(&host_chars[..26]),
                rng.string_from(&host_chars, 20)
            ),
            1 => format!(
                "{}.{}.{}.{}",
                rng.below(256),
                rng.below(256),
                rng.below(256),
                rng.below(256)
            ),
            _ => ["::1", "fd00::a", "fe80::1:2", "2001:db8::42"][rng.below(4)].to_string(),
        };
        let port = rng.chance(50).then(|| rng.below(65536) as u16);
        let path = format!("/{}", rng.string_from(&path_chars, 30));
        let shown_host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        let text = match port {
            Some(p) => format!("http://{shown_host}:{p}{path}"),
            None => format!("http://{shown_host}{path}"),
        };
        let u = Url::parse(&text).unwrap_or_else(|e| panic!("case {case}: {e}"));
        assert_eq!(
            (u.host.as_str(), u.port, u.path.as_str()),
            (host.as_str(), port.unwrap_or(80), path.as_str()),
            "case {case}: {text}"
        );
        assert_eq!(Url::parse(&u.to_string()), Ok(u), "case {case}: {text}");
    }
}

#[test]
fn max_pods_map_never_panics_and_reads_back_first_wins() {
    let type_chars: Vec<char> = ('a'..='z')
        .chain('0'..='9')
        .chain(['.', '-', '_', 'A', 'S'])
        .collect();
    let mut rng = Rng::new(0x6b69_6c6e_0005);
    for case in 0..CASES {
        let _ = parse_max_pods(&rng.any_string(60));
        let mut text = String::new();
        let mut want: Vec<(String, u32)> = Vec::new();
        for _ in 0..rng.below(10) {
            let ty = format!(
                "{}{}",
                rng.pick(&type_chars[..26]),
                rng.string_from(&type_chars, 15)
            );
            let n = 1 + rng.below(u32::MAX as usize) as u32;
            match rng.below(4) {
                0 => text.push_str(&format!("# {}\n", rng.string_from(&type_chars, 10))),
                1 => text.push('\n'),
                _ => {}
            }
            let sep = [" ", "\t", "   ", " \t "][rng.below(4)];
            text.push_str(&format!(
                "{}{ty}{sep}{n}{}\n",
                [" ", ""][rng.below(2)],
                [" ", ""][rng.below(2)]
            ));
            if !want.iter().any(|(t, _)| *t == ty) {
                want.push((ty, n));
            }
        }
        assert_eq!(parse_max_pods(&text), Ok(want), "case {case}: {text:?}");
    }
}

const JSON_BITS: &[&str] = &[
    "{", "}", "[", "]", ",", ":", "\"", "\\", "\\u", "\\ud800", "\\udc00", "0", "-", "1e9", "1.5",
    "true", "false", "null", " ", "\"k\"", "\"\\n\"", "1e999999", "-0",
];

#[test]
fn json_reader_never_panics_bounds_nesting_and_round_trips_strings() {
    let mut rng = Rng::new(0x6b69_6c6e_0006);
    for case in 0..CASES {
        let mut text = String::new();
        for _ in 0..rng.below(30) {
            if rng.chance(80) {
                let bit: &&str = rng.pick(JSON_BITS);
                text.push_str(bit);
            } else {
                text.push(rng.any_char());
            }
        }
        let _ = json::parse(&text);
        let s = rng.any_string(40);
        let mut out = String::new();
        json::write_str(&mut out, &s);
        assert_eq!(
            json::parse(&out),
            Ok(Value::String(s)),
            "case {case}: {out:?}"
        );
    }
    // Nesting: shallow documents parse, deep ones are refused, and a very deep one neither
    // overflows the stack nor takes long.
    for depth in [1, 10, 50] {
        let doc = "[".repeat(depth) + &"]".repeat(depth);
        assert!(json::parse(&doc).is_ok(), "depth {depth}");
        let doc = "{\"a\":".repeat(depth) + "1" + &"}".repeat(depth);
        assert!(json::parse(&doc).is_ok(), "object depth {depth}");
    }
    for depth in [100, 10_000, 1_000_000] {
        let doc = "[".repeat(depth) + &"]".repeat(depth);
        assert!(json::parse(&doc).is_err(), "depth {depth}");
        let doc = "{\"a\":".repeat(depth);
        assert!(json::parse(&doc).is_err(), "object depth {depth}");
    }
}

/// A generated response: status, headers, body, and its bytes on the wire.
type Generated = (u16, Vec<(String, String)>, Vec<u8>, Vec<u8>);

fn response(rng: &mut Rng) -> Generated {
    let status = [200u16, 201, 204, 301, 404, 500, 503][rng.below(7)];
    let body = if status == 204 {
        Vec::new()
    } else {
        rng.bytes(300)
    };
    let name_chars: Vec<char> = ('a'..='z').chain(['-']).collect();
    let mut headers = Vec::new();
    for _ in 0..rng.below(4) {
        let name = format!("x-{}", rng.string_from(&name_chars, 10));
        let value_chars: Vec<char> = (' '..='~').collect();
        let value = rng.string_from(&value_chars, 20).trim().to_string();
        headers.push((name, value));
    }
    let chunked = rng.chance(50) && status != 204;
    let mut wire = format!("HTTP/1.1 {status} Whatever\r\n").into_bytes();
    for (k, v) in &headers {
        wire.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    if chunked {
        wire.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
        let mut rest = &body[..];
        while !rest.is_empty() {
            let n = 1 + rng.below(rest.len());
            wire.extend_from_slice(format!("{n:x}\r\n").as_bytes());
            wire.extend_from_slice(&rest[..n]);
            wire.extend_from_slice(b"\r\n");
            rest = &rest[n..];
        }
        wire.extend_from_slice(b"0\r\n\r\n");
    } else {
        wire.extend_from_slice(format!("Content-Length: {}\r\n\r\n", body.len()).as_bytes());
        wire.extend_from_slice(&body);
    }
    (status, headers, body, wire)
}

#[test]
fn http_response_parser_never_panics_and_reads_what_was_sent() {
    const CAP: usize = 4096;
    let mut rng = Rng::new(0x6b69_6c6e_0007);
    for case in 0..CASES {
        let (status, headers, body, wire) = response(&mut rng);
        let r = parse_response(&wire, true, CAP)
            .unwrap_or_else(|e| panic!("case {case}: {e}"))
            .unwrap_or_else(|| panic!("case {case}: incomplete at EOF"));
        assert_eq!((r.status, &r.body), (status, &body), "case {case}");
        for (k, v) in &headers {
            assert!(
                r.headers.iter().any(|(rk, rv)| rk == k && rv == v),
                "case {case}: {k}"
            );
        }
        // Arriving in pieces: every prefix is "more, please" or the same answer.
        let cut = rng.below(wire.len());
        match parse_response(&wire[..cut], false, CAP) {
            Ok(None) => {}
            Ok(Some(early)) => assert_eq!(early, r, "case {case}: cut at {cut}"),
            Err(e) => panic!("case {case}: a prefix of a valid response is {e}"),
        }
        // Cut short at EOF: an error, never a shorter body.
        if let Ok(Some(short)) = parse_response(&wire[..cut], true, CAP) {
            assert_eq!(short, r, "case {case}: cut at {cut}");
        }
        // A smaller cap refuses the body rather than truncating it.
        if body.len() > 16 {
            match parse_response(&wire, true, 16) {
                Err(ResponseError::Invalid(_)) => {}
                other => panic!("case {case}: {other:?}"),
            }
        }
        // Mutated: any byte changed, dropped or doubled, and pure noise: no panic, and
        // never a body over the cap.
        let mut bad = wire.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(bad.len());
            match rng.below(3) {
                0 => bad[i] = rng.next() as u8,
                1 => {
                    bad.remove(i);
                }
                _ => bad.insert(i, bad[i]),
            }
            if bad.is_empty() {
                break;
            }
        }
        for input in [bad, rng.bytes(200)] {
            for eof in [false, true] {
                if let Ok(Some(r)) = parse_response(&input, eof, CAP) {
                    assert!(r.body.len() <= CAP, "case {case}");
                }
            }
        }
    }
}

#[test]
fn found_secrets_never_survive_redaction() {
    let secret_chars: Vec<char> = ('a'..='z')
        .chain('A'..='Z')
        .chain('0'..='9')
        .chain(['+', '/', '=', '-', '_', '.', '$', '!', '@'])
        .collect();
    let mut rng = Rng::new(0x6b69_6c6e_0008);
    for case in 0..CASES {
        let secrets: Vec<String> = (0..1 + rng.below(3))
            .map(|_| {
                let n = 6 + rng.below(40);
                (0..n).map(|_| *rng.pick(&secret_chars)).collect::<String>()
            })
            .collect();
        let keys = [
            "token",
            "client-key-data",
            "password",
            "tlsBootstrapToken",
            "certificateKey",
        ];
        let mut file = String::from("apiVersion: v1\nusers:\n- name: u\n  user:\n");
        for s in &secrets {
            let q = ["", "\"", "'"][rng.below(3)];
            file.push_str(&format!("    {}: {q}{s}{q}\n", rng.pick(&keys)));
        }
        let found = secrets_in(&file);
        for s in &secrets {
            assert!(
                found.contains(s),
                "case {case}: {s:?} not found in {file:?}: {found:?}"
            );
        }
        let mut r = Redactor::shapes_only();
        r.add_all(&found);
        // Each secret somewhere in noise, alone, twice, or next to another.
        let mut text = rng.any_string(30);
        for s in &secrets {
            text.push_str(s);
            text.push_str(&rng.any_string(5));
            if rng.chance(30) {
                text.push_str(s);
            }
        }
        text.push_str(&rng.any_string(30));
        let out = r.redact(&text);
        for s in &secrets {
            assert!(
                !out.as_str().contains(s.as_str()),
                "case {case}: {s:?} in {out}"
            );
        }
        assert!(out.as_str().contains(MARK), "case {case}");
    }
}
