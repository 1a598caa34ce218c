//! Windows: PowerShell user data in EC2 `<powershell>` form (run by cloudbase-init and by
//! EC2Launch alike) that writes the contract files under `C:\ProgramData\kiln\` and starts
//! kiln-firstboot; and the reader `--check` uses.

use base64::Engine as _;

use crate::render::model::{
    NodeFile, RenderError, PUBLIC_MODE, SECRET_MODE, TRUST_BUNDLE, WINDOWS_DIR,
};

/// The Windows service name of kiln-firstboot the script starts when it is registered.
pub const SERVICE: &str = "kiln-firstboot";
/// The binary the script runs when no service is registered (`C:\k\`, "Windows paths").
pub const BINARY: &str = r"C:\k\kiln-firstboot.exe";

const WRITE_FN: &str = "Write-KilnFile";
const ROOT_FN: &str = "Add-KilnRoot";

/// Renders the PowerShell user data.
pub fn render(files: &[NodeFile]) -> Vec<u8> {
    let mut s = String::new();
    s.push_str("<powershell>\n");
    s.push_str(
        "# kiln node contract v1: writes C:\\ProgramData\\kiln\\ and starts kiln-firstboot.\n",
    );
    s.push_str("# Written by `kiln render`. cloudbase-init and EC2Launch both run this block.\n");
    s.push_str("$ErrorActionPreference = 'Stop'\n");
    s.push_str(&format!("$dir = '{WINDOWS_DIR}'\n"));
    s.push_str("New-Item -ItemType Directory -Force -Path $dir | Out-Null\n");
    s.push_str(
        "# ProgramData lets Users add files: the kiln directory allows them to read only.\n",
    );
    s.push_str(
        "& icacls.exe $dir /inheritance:r /grant:r '*S-1-5-18:(OI)(CI)(F)' '*S-1-5-32-544:(OI)(CI)(F)' '*S-1-5-32-545:(OI)(CI)(RX)' | Out-Null\n",
    );
    s.push_str("if ($LASTEXITCODE -ne 0) { throw \"icacls failed on $dir\" }\n");
    s.push_str(&format!(
        "function {WRITE_FN}([string]$Name, [string]$Data, [bool]$Secret) {{\n"
    ));
    s.push_str("  $path = Join-Path $dir $Name\n");
    s.push_str("  $tmp = \"$path.tmp\"\n");
    s.push_str("  [IO.File]::WriteAllBytes($tmp, [Convert]::FromBase64String($Data))\n");
    s.push_str("  if ($Secret) {\n");
    s.push_str(
        "    # The Windows form of mode 0600: only LocalSystem and Administrators (by SID).\n",
    );
    s.push_str("    & icacls.exe $tmp /inheritance:r /grant:r '*S-1-5-18:(F)' '*S-1-5-32-544:(F)' | Out-Null\n");
    s.push_str("    if ($LASTEXITCODE -ne 0) { throw \"icacls failed on $tmp\" }\n");
    s.push_str("  }\n");
    s.push_str("  Move-Item -Force -LiteralPath $tmp -Destination $path\n");
    s.push_str("}\n");
    let mut made: Vec<String> = Vec::new();
    for f in files {
        if let Some((parent, _)) = f.name.replace('/', "\\").rsplit_once('\\') {
            if !made.iter().any(|m| m == parent) {
                // A registry host directory (inheriting the kiln directory's permissions).
                s.push_str(&format!(
                    "New-Item -ItemType Directory -Force -Path (Join-Path $dir '{parent}') | Out-Null\n"
                ));
                made.push(parent.to_string());
            }
        }
        s.push_str(&format!(
            "{WRITE_FN} '{}' '{}' ${}\n",
            f.name.replace('/', "\\"),
            base64::engine::general_purpose::STANDARD.encode(&f.contents),
            if f.mode == SECRET_MODE {
                "true"
            } else {
                "false"
            }
        ));
    }
    if let Some(bundle) = files.iter().find(|f| f.name == TRUST_BUNDLE) {
        add_roots(&mut s, bundle);
    }
    s.push_str(&format!(
        "if (Get-Service -Name '{SERVICE}' -ErrorAction SilentlyContinue) {{ Start-Service -Name '{SERVICE}' }} \
         else {{ & '{BINARY}' run; exit $LASTEXITCODE }}\n"
    ));
    s.push_str("</powershell>\n");
    s.into_bytes()
}

/// node.toml's `[trust]` on Windows: Go there takes its roots from the system's certificate
/// stores, not from files (`crypto/x509`, `root_windows.go`: `systemVerify` builds the chain
/// with `CertGetCertificateChain`, whose default engine trusts `LocalMachine\Root`), so each
/// certificate of the bundle goes into `LocalMachine\Root` through .NET's `X509Store`
/// (no PowerShell module needed, Server Core included), as DER split at render time. The
/// store is consulted at each verification, so containerd.exe, started before the user data,
/// trusts them from its next pull.
fn add_roots(s: &mut String, bundle: &NodeFile) {
    let ders = std::str::from_utf8(&bundle.contents)
        .ok()
        .and_then(|t| crate::render::pki::pem_certificates(t).ok())
        .unwrap_or_default();
    s.push_str(
        "# [trust]: each certificate of trust.d\\bundle.crt into the machine's root store.\n",
    );
    s.push_str(&format!("function {ROOT_FN}([string]$Der) {{\n"));
    s.push_str("  $bytes = [Convert]::FromBase64String($Der)\n");
    s.push_str("  $cert = New-Object System.Security.Cryptography.X509Certificates.X509Certificate2 -ArgumentList (,$bytes)\n");
    s.push_str("  $store = New-Object System.Security.Cryptography.X509Certificates.X509Store -ArgumentList 'Root', 'LocalMachine'\n");
    s.push_str("  $store.Open('ReadWrite')\n");
    s.push_str("  try { $store.Add($cert) } finally { $store.Close() }\n");
    s.push_str("}\n");
    for der in ders {
        s.push_str(&format!(
            "{ROOT_FN} '{}'\n",
            base64::engine::general_purpose::STANDARD.encode(der)
        ));
    }
}

/// Reads the PowerShell user data back into the files it writes.
pub fn parse(text: &str, source: &str) -> Result<(Vec<NodeFile>, Vec<String>), RenderError> {
    let err = |m: String| RenderError::check(source, m);
    let mut files = Vec::new();
    let mut notes = Vec::new();
    let mut defined = false;
    let mut roots: Vec<Vec<u8>> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with(&format!("function {WRITE_FN}(")) {
            defined = true;
            continue;
        }
        // PowerShell matches command names without regard to case and takes any blank
        // between arguments: a line that runs one of kiln's two commands must be spelled as
        // kiln writes it, or --check could not see what it does.
        let command = line.split_whitespace().next().unwrap_or("");
        let ours = [WRITE_FN, ROOT_FN]
            .into_iter()
            .find(|c| c.eq_ignore_ascii_case(command));
        if let Some(c) = ours {
            if !line.starts_with(&format!("{c} ")) || line.contains('\t') {
                return Err(err(format!(
                    "line {}: expected `{c} '…'` spelled as kiln render writes it, found {command:?} with other spelling or blanks",
                    i + 1
                )));
            }
        }
        if let Some(arg) = line.strip_prefix(&format!("{ROOT_FN} ")) {
            let der = arg
                .strip_prefix('\'')
                .and_then(|a| a.strip_suffix('\''))
                .and_then(|a| base64::engine::general_purpose::STANDARD.decode(a).ok())
                .ok_or_else(|| {
                    err(format!(
                        "line {}: expected {ROOT_FN} 'BASE64 DER', found {line}",
                        i + 1
                    ))
                })?;
            roots.push(der);
            continue;
        }
        let Some(args) = line.strip_prefix(&format!("{WRITE_FN} ")) else {
            if line.contains(&format!("Start-Service -Name '{SERVICE}'")) {
                notes.push(format!("starts the {SERVICE} service (or runs {BINARY})"));
            }
            continue;
        };
        let at = format!("line {}", i + 1);
        let parts: Vec<&str> = args.split(' ').collect();
        let [name, data, secret] = parts[..] else {
            return Err(err(format!(
                "{at}: expected {WRITE_FN} 'NAME' 'BASE64' $true|$false"
            )));
        };
        let unquote = |s: &str| {
            s.strip_prefix('\'')
                .and_then(|s| s.strip_suffix('\''))
                .map(str::to_string)
                .ok_or_else(|| err(format!("{at}: expected a single-quoted string, found {s}")))
        };
        let name = unquote(name)?;
        let contents = base64::engine::general_purpose::STANDARD
            .decode(unquote(data)?)
            .map_err(|e| err(format!("{at}: {name}: not valid base64: {e}")))?;
        let mode = match secret {
            "$true" => SECRET_MODE,
            "$false" => PUBLIC_MODE,
            other => {
                return Err(err(format!(
                    "{at}: expected $true or $false, found {other}"
                )))
            }
        };
        // A registry host directory's file is the one nested name (`containerd\certs.d\…`).
        let name = match name.replace('\\', "/") {
            n if crate::render::registries::is_host_file(&n) || n == TRUST_BUNDLE => n,
            _ if name.is_empty() || name.contains(['\\', '/', ':']) => {
                return Err(err(format!(
                    "{at}: file name {name:?} must be a plain name or a registry's file \
                     (containerd\\certs.d\\<registry>\\hosts.toml or ca.crt)"
                )));
            }
            n => n,
        };
        // A second write of a name would leave the node with the last one, which --check
        // would not be reading.
        if files.iter().any(|f: &NodeFile| f.name == name) {
            return Err(err(format!("{at}: {name} is written twice")));
        }
        files.push(NodeFile {
            name,
            mode,
            contents,
        });
    }
    if !defined {
        return Err(err(format!(
            "no `function {WRITE_FN}` found: not PowerShell user data written by kiln render"
        )));
    }
    // What goes into LocalMachine\Root must be the bundle the node keeps, no more, no less.
    let bundle = files
        .iter()
        .find(|f| f.name == TRUST_BUNDLE)
        .map(|f| {
            std::str::from_utf8(&f.contents)
                .ok()
                .and_then(|t| crate::render::pki::pem_certificates(t).ok())
                .unwrap_or_default()
        })
        .unwrap_or_default();
    if roots != bundle {
        return Err(err(format!(
            "expected one {ROOT_FN} line per certificate of {TRUST_BUNDLE} ({} there), in its order; found {} that do not match",
            bundle.len(),
            roots.len()
        )));
    }
    if !roots.is_empty() {
        notes.push(format!(
            "adds {} certificate(s) to LocalMachine\\Root ([trust])",
            roots.len()
        ));
    }
    Ok((files, notes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let files = vec![
            NodeFile {
                name: "node.env".into(),
                mode: PUBLIC_MODE,
                contents: b"KILN_CONTRACT=1\n".to_vec(),
            },
            NodeFile {
                name: "bootstrap-token".into(),
                mode: SECRET_MODE,
                contents: b"abcdef.0123456789abcdef\n".to_vec(),
            },
        ];
        let text = String::from_utf8(render(&files)).unwrap();
        assert!(text.starts_with("<powershell>\n") && text.ends_with("</powershell>\n"));
        let (back, notes) = parse(&text, "w").unwrap();
        assert_eq!(back, files);
        assert_eq!(notes.len(), 1, "{notes:?}");

        let broken = text.replace("$true", "$maybe");
        assert!(parse(&broken, "w")
            .unwrap_err()
            .to_string()
            .contains("found $maybe"));
        let e = parse("<powershell>\nWrite-Host hi\n</powershell>\n", "w").unwrap_err();
        assert!(
            e.to_string().contains("no `function Write-KilnFile`"),
            "{e}"
        );
    }
}
