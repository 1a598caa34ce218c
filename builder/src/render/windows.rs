//! Windows: PowerShell user data in EC2 `<powershell>` form (run by cloudbase-init and by
//! EC2Launch alike) that writes the contract files under `C:\ProgramData\kiln\` and starts
//! kiln-firstboot; and the reader `--check` uses.

use base64::Engine as _;

use crate::render::model::{NodeFile, RenderError, PUBLIC_MODE, SECRET_MODE, WINDOWS_DIR};

/// The Windows service name of kiln-firstboot the script starts when it is registered.
pub const SERVICE: &str = "kiln-firstboot";
/// The binary the script runs when no service is registered (`C:\k\`, "Windows paths").
pub const BINARY: &str = r"C:\k\kiln-firstboot.exe";

const WRITE_FN: &str = "Write-KilnFile";

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
    s.push_str(&format!(
        "if (Get-Service -Name '{SERVICE}' -ErrorAction SilentlyContinue) {{ Start-Service -Name '{SERVICE}' }} \
         else {{ & '{BINARY}' run; exit $LASTEXITCODE }}\n"
    ));
    s.push_str("</powershell>\n");
    s.into_bytes()
}

/// Reads the PowerShell user data back into the files it writes.
pub fn parse(text: &str, source: &str) -> Result<(Vec<NodeFile>, Vec<String>), RenderError> {
    let err = |m: String| RenderError::check(source, m);
    let mut files = Vec::new();
    let mut notes = Vec::new();
    let mut defined = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.starts_with(&format!("function {WRITE_FN}(")) {
            defined = true;
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
            n if crate::render::registries::is_host_file(&n) => n,
            _ if name.is_empty() || name.contains(['\\', '/', ':']) => {
                return Err(err(format!(
                    "{at}: file name {name:?} must be a plain name or a registry's file \
                     (containerd\\certs.d\\<registry>\\hosts.toml or ca.crt)"
                )));
            }
            n => n,
        };
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
