//! A baked Flatcar sysext placed by Ignition at first boot, the way Flatcar users add
//! software to a stock image (the sysext-bakery layout): the `.raw` fetched into
//! `/opt/extensions/<name>/` and checked against its sha512, linked as
//! `/etc/extensions/<name>.raw` for systemd-sysext, the bake's systemd-sysupdate transfer file
//! in `/etc/sysupdate.<name>.d/`, the sysupdate timer enabled, and a drop-in that updates this
//! extension and asks for a reboot (`/run/reboot-required`, what kured watches) when a new
//! image landed. The transfer file's `MatchPattern` names the Kubernetes minor, so sysupdate
//! takes patch releases of it and never a new minor (the version-skew policy).

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sha2::{Digest, Sha512};

use crate::image_def::Arch;
use crate::render::model::RenderError;

/// Everything Ignition needs to place one baked sysext.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sysext {
    /// The extension name (`kubernetes`): `/etc/extensions/<name>.raw`.
    pub name: String,
    /// The image's file name, `<name>-<kubernetes version>-<arch>.raw`.
    pub file: String,
    /// Where nodes fetch it (`https://…/<file>`).
    pub url: String,
    /// sha512 of the exact bytes, hex.
    pub sha512: String,
    /// The bake's transfer file (`<name>.conf`), as written.
    pub transfer: Vec<u8>,
    /// For a signed DDI (`kiln bake --sysext-ddi`): the certificate its dm-verity root hash is
    /// signed for (`<name>.verity.crt`, PEM), which nodes must trust.
    pub verity_cert: Option<Vec<u8>>,
}

/// The policy under which a node's `systemd-sysext` merges only extensions whose dm-verity
/// signature verifies (systemd's default sysext policy merges unsigned images too, and from
/// systemd 259 falls back to unsigned verity when a signature does not verify).
pub const SIGNED_POLICY: &str = "root=signed+absent:usr=signed+absent";

/// Whether `raw` is a GPT disk image (a DDI) rather than a bare filesystem: "EFI PART" at
/// byte 512 (UEFI 2.10, 5.3.2).
pub fn is_gpt(raw: &Path) -> std::io::Result<bool> {
    use std::io::{Seek as _, SeekFrom};
    let mut f = std::fs::File::open(raw)?;
    f.seek(SeekFrom::Start(512))?;
    let mut sig = [0u8; 8];
    Ok(f.read_exact(&mut sig).is_ok() && &sig == b"EFI PART")
}

/// The most a transfer file may hold.
const MAX_TRANSFER: u64 = 64 * 1024;

/// A `<name>` of an extension: what systemd-sysext and a unit drop-in name accept.
fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && !n.starts_with('.')
}

impl Sysext {
    /// Reads a baked sysext: `raw` is the `.raw` `kiln bake --format sysext` wrote, and its
    /// transfer file `<name>.conf` is beside it. `url` is where nodes fetch the image; without
    /// it, the transfer file's `[Source] Path=` (the definition's `update_url`) plus the file
    /// name, which is where sysupdate looks for updates too.
    pub fn from_bake(raw: &Path, url: Option<&str>) -> Result<Sysext, RenderError> {
        let err = |path: &Path, message: String| RenderError::Sysext {
            path: path.to_path_buf(),
            message,
        };
        let file = raw
            .file_name()
            .and_then(|f| f.to_str())
            .ok_or_else(|| err(raw, "expected a file name".into()))?
            .to_string();
        // What `kiln bake` writes (bake::render::sysext_file_name): `<name>-<kubernetes
        // version>-<systemd arch>.raw`, with its transfer file `<name>.conf` beside it. The
        // version may hold `-` (`1.36.4-standin`) and so may the name, so the name is the
        // shortest prefix whose transfer file is there, with a version and a known
        // architecture after it.
        let arch_after = |rest: &str| {
            [Arch::Amd64, Arch::Arm64].iter().any(|a| {
                rest.strip_suffix(a.systemd_name())
                    .and_then(|v| v.strip_suffix('-'))
                    .is_some_and(|v| !v.is_empty())
            })
        };
        let name = file
            .strip_suffix(".raw")
            .and_then(|stem| {
                stem.match_indices('-')
                    .map(|(i, _)| (&stem[..i], &stem[i + 1..]))
                    .find(|(n, rest)| {
                        valid_name(n)
                            && arch_after(rest)
                            && raw.with_file_name(format!("{n}.conf")).exists()
                    })
                    .map(|(n, _)| n.to_string())
            })
            .ok_or_else(|| {
                err(
                    raw,
                    format!(
                        "expected a baked sysext named <name>-<kubernetes version>-<arch>.raw with the transfer file <name>.conf kiln bake --format sysext writes beside it, found {file:?} without one"
                    ),
                )
            })?;
        if !valid_name(&file) {
            return Err(err(
                raw,
                format!("file name {file:?} has characters a URL or unit cannot carry"),
            ));
        }
        // A FIFO or device named like an image would be read forever: only a regular file.
        let meta = std::fs::metadata(raw).map_err(|e| RenderError::io(raw, e))?;
        if !meta.is_file() {
            return Err(err(
                raw,
                "expected a regular file (the baked image), found something else".into(),
            ));
        }
        let sha512 = sha512_file(raw).map_err(|e| RenderError::io(raw, e))?;
        let conf_path: PathBuf = raw.with_file_name(format!("{name}.conf"));
        // A transfer file is a few hundred bytes; read at most 64 KiB (a symlink to a device
        // or a huge file is refused, not read into the config).
        let mut transfer = Vec::new();
        std::fs::File::open(&conf_path)
            .and_then(|f| f.take(MAX_TRANSFER + 1).read_to_end(&mut transfer))
            .map_err(|e| {
                err(
                    &conf_path,
                    format!("the bake's systemd-sysupdate transfer file beside {file} cannot be read ({e}); kiln bake --format sysext writes it"),
                )
            })?;
        if transfer.len() as u64 > MAX_TRANSFER {
            return Err(err(
                &conf_path,
                format!("expected a systemd-sysupdate transfer file of at most {MAX_TRANSFER} bytes, found a larger one"),
            ));
        }
        let text = String::from_utf8_lossy(&transfer);
        let base = source_path(&text).ok_or_else(|| {
            err(
                &conf_path,
                format!("expected a [Source] section with Path= (the update URL) in the transfer file of {file}, found none"),
            )
        })?;
        let url = match url {
            Some(u) => u.to_string(),
            None => format!("{}/{file}", base.trim_end_matches('/')),
        };
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return Err(err(
                raw,
                format!(
                    "nodes fetch the image from {:?}: expected an https:// (or http://) URL",
                    crate::render::model::url_for_message(&url)
                ),
            ));
        }
        let verity_cert = verity_cert(raw, &name, &file)?;
        Ok(Sysext {
            name,
            file,
            url,
            sha512,
            transfer,
            verity_cert,
        })
    }

    /// Where Ignition writes the image.
    pub fn image_path(&self) -> String {
        format!("/opt/extensions/{}/{}", self.name, self.file)
    }

    /// Ignition's `verification.hash` for the image.
    pub fn hash(&self) -> String {
        format!("sha512-{}", self.sha512)
    }

    /// The Ignition `storage.files` entries: the image (fetched and verified), the transfer
    /// file, and a no-op transfer so the stock `systemd-sysupdate.service`, which also updates
    /// `/etc/sysupdate.d/`, has something there and does not fail.
    pub fn files(&self, root: &Value) -> Vec<Value> {
        let data = crate::render::model::data_url;
        let mut v = vec![
            json!({
                "path": self.image_path(),
                "mode": 0o644,
                "overwrite": true,
                "user": root,
                "group": root,
                "contents": {"source": self.url, "verification": {"hash": self.hash()}},
            }),
            json!({
                "path": format!("/etc/sysupdate.{0}.d/{0}.conf", self.name),
                "mode": 0o644,
                "overwrite": true,
                "user": root,
                "group": root,
                "contents": {"source": data(&self.transfer)},
            }),
            json!({
                "path": "/etc/sysupdate.d/noop.conf",
                "mode": 0o644,
                "overwrite": true,
                "user": root,
                "group": root,
                "contents": {"source": data(NOOP_TRANSFER.as_bytes())},
            }),
        ];
        v.extend(self.signed_files(root));
        v
    }

    /// The certificate file and the `systemd-sysext.service` drop-in of a signed image.
    fn signed_files(&self, root: &Value) -> Vec<Value> {
        let Some(cert) = &self.verity_cert else {
            return Vec::new();
        };
        vec![json!({
            "path": format!("/etc/verity.d/kiln-{}.crt", self.name),
            "mode": 0o644,
            "overwrite": true,
            "user": root,
            "group": root,
            "contents": {"source": crate::render::model::data_url(cert)},
        })]
    }

    /// The `storage.links` entry systemd-sysext merges.
    pub fn link(&self) -> Value {
        json!({
            "path": format!("/etc/extensions/{}.raw", self.name),
            "target": self.image_path(),
            "hard": false,
            "overwrite": true,
        })
    }

    /// The `systemd.units` entries: the sysupdate timer enabled, and the service's drop-in.
    pub fn units(&self) -> Vec<Value> {
        let mut v = vec![
            json!({"name": "systemd-sysupdate.timer", "enabled": true}),
            json!({
                "name": "systemd-sysupdate.service",
                "dropins": [{"name": format!("kiln-{}.conf", self.name), "contents": self.dropin()}],
            }),
        ];
        if self.verity_cert.is_some() {
            v.push(json!({
                "name": "systemd-sysext.service",
                "dropins": [{"name": "kiln-signed.conf", "contents": signed_dropin()}],
            }));
        }
        v
    }

    /// The `systemd-sysupdate.service` drop-in: update this extension's transfer set, and
    /// touch `/run/reboot-required` when the current image changed.
    pub fn dropin(&self) -> String {
        let n = &self.name;
        format!(
            "# Written by kiln render: update the {n} extension within its Kubernetes minor\n\
             # (/etc/sysupdate.{n}.d/{n}.conf) and ask for a reboot when a new image landed.\n\
             [Service]\n\
             ExecStartPre=/usr/bin/sh -c 'readlink --canonicalize /etc/extensions/{n}.raw > /run/kiln-sysupdate-{n}.before'\n\
             ExecStartPre=/usr/lib/systemd/systemd-sysupdate -C {n} update\n\
             ExecStartPost=/usr/bin/sh -c 'readlink --canonicalize /etc/extensions/{n}.raw | cmp -s - /run/kiln-sysupdate-{n}.before || touch /run/reboot-required'\n"
        )
    }
}

/// The `systemd-sysext.service` drop-in for signed extensions: merge only what verifies.
pub fn signed_dropin() -> String {
    format!(
        "# Written by kiln render: merge only extensions whose dm-verity signature verifies\n\
         # against a certificate in /etc/verity.d/ (systemd's default sysext policy would merge\n\
         # unsigned images too).\n\
         [Service]\n\
         ExecStart=\n\
         ExecStart=/usr/bin/systemd-sysext refresh --image-policy={SIGNED_POLICY}\n"
    )
}

/// The certificate beside a signed DDI (`<name>.verity.crt`): required for a GPT image (a
/// DDI kiln signed), refused for a bare squashfs (a stale file from another bake).
pub fn verity_cert(raw: &Path, name: &str, file: &str) -> Result<Option<Vec<u8>>, RenderError> {
    let err = |path: &Path, message: String| RenderError::Sysext {
        path: path.to_path_buf(),
        message,
    };
    let cert_path = raw.with_file_name(format!("{name}.verity.crt"));
    let gpt = is_gpt(raw).map_err(|e| RenderError::io(raw, e))?;
    let cert = match crate::bounded_read::read_regular(&cert_path, 64 * 1024) {
        Ok(c) => Some(c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(RenderError::io(&cert_path, e)),
    };
    match (gpt, cert) {
        (false, None) => Ok(None),
        (true, Some(c)) if c.starts_with(b"-----BEGIN CERTIFICATE-----") => Ok(Some(c)),
        (true, Some(_)) => Err(err(
            &cert_path,
            "expected a PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        )),
        (true, None) => Err(err(
            raw,
            format!("{file} is a signed disk image (kiln bake --sysext-ddi), but its certificate {name}.verity.crt is not beside it: nodes could not verify it"),
        )),
        (false, Some(_)) => Err(err(
            &cert_path,
            format!("a verity certificate beside {file}, which is a bare squashfs, not a signed disk image: left from another bake? remove it or bake with --sysext-ddi"),
        )),
    }
}

/// A transfer that matches nothing: Flatcar's `systemd-sysupdate.service` runs
/// `systemd-sysupdate update` on `/etc/sysupdate.d/`, which fails with no transfer at all.
const NOOP_TRANSFER: &str =
    "# Written by kiln render: systemd-sysupdate.service updates /etc/sysupdate.d/ too,\n\
# and fails when it holds no transfer; this one matches nothing.\n\
[Source]\n\
Type=regular-file\n\
Path=/\n\
MatchPattern=kiln-noop-@v.raw\n\
\n\
[Target]\n\
Type=regular-file\n\
Path=/\n";

/// `Path=` of the `[Source]` section of a transfer file.
fn source_path(text: &str) -> Option<String> {
    let mut in_source = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_source = line == "[Source]";
        } else if in_source {
            if let Some(v) = line.strip_prefix("Path=") {
                return Some(v.trim().to_string()).filter(|v| !v.is_empty());
            }
        }
    }
    None
}

fn sha512_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha512::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bake(dir: &Path, file: &str, conf: Option<&str>) -> PathBuf {
        let raw = dir.join(file);
        std::fs::write(&raw, b"sqsh-stand-in").unwrap();
        if let Some(c) = conf {
            std::fs::write(dir.join("kubernetes.conf"), c).unwrap();
        }
        raw
    }

    const CONF: &str = "[Transfer]\nVerify=false\n\n[Source]\nType=url-file\nPath=https://images.example.com/kiln/flatcar/\nMatchPattern=kubernetes-v1.36.@v-x86-64.raw\n";

    #[test]
    fn reads_a_bake_and_derives_the_url() {
        let d = tempfile::tempdir().unwrap();
        let raw = bake(d.path(), "kubernetes-v1.36.1-x86-64.raw", Some(CONF));
        let s = Sysext::from_bake(&raw, None).unwrap();
        assert_eq!(s.name, "kubernetes");
        assert_eq!(
            s.url,
            "https://images.example.com/kiln/flatcar/kubernetes-v1.36.1-x86-64.raw"
        );
        assert_eq!(s.sha512.len(), 128);
        assert_eq!(s.transfer, CONF.as_bytes());
        assert!(s
            .dropin()
            .contains("systemd-sysupdate -C kubernetes update"));
        let s = Sysext::from_bake(&raw, Some("http://127.0.0.1:1/x.raw")).unwrap();
        assert_eq!(s.url, "http://127.0.0.1:1/x.raw");
    }

    /// Issue 39: a signed DDI (a GPT image) brings its certificate to the node and a
    /// `systemd-sysext.service` drop-in that merges only what verifies; a DDI without its
    /// certificate, or a certificate beside a bare squashfs, is refused by name.
    #[test]
    fn a_signed_image_brings_its_certificate_and_the_signed_only_policy() {
        let d = tempfile::tempdir().unwrap();
        let raw = bake(d.path(), "kubernetes-v1.36.1-x86-64.raw", Some(CONF));
        let cert = d.path().join("kubernetes.verity.crt");
        std::fs::write(
            &cert,
            "-----BEGIN CERTIFICATE-----\nMA==\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let e = Sysext::from_bake(&raw, None).unwrap_err().to_string();
        assert!(
            e.contains("bare squashfs") && e.contains("kubernetes.verity.crt"),
            "{e}"
        );
        let mut gpt = vec![0u8; 1024];
        gpt[512..520].copy_from_slice(b"EFI PART");
        std::fs::write(&raw, &gpt).unwrap();
        let s = Sysext::from_bake(&raw, None).unwrap();
        let root = json!({"name": "root"});
        let files = s.files(&root);
        assert!(files
            .iter()
            .any(|f| f["path"] == "/etc/verity.d/kiln-kubernetes.crt"));
        let units = serde_json::to_string(&s.units()).unwrap();
        assert!(
            units.contains("systemd-sysext.service") && units.contains(SIGNED_POLICY),
            "{units}"
        );
        std::fs::remove_file(&cert).unwrap();
        let e = Sysext::from_bake(&raw, None).unwrap_err().to_string();
        assert!(
            e.contains("signed disk image") && e.contains("not beside it"),
            "{e}"
        );
    }

    /// Issue 38: `render --sysext` takes any name `kiln bake` writes, a version without `v`
    /// or with `-` in it included (the fixture's `1.36.4-standin` was refused), and a name
    /// with `-` in it.
    #[test]
    fn takes_every_name_bake_writes() {
        for (file, conf, name) in [
            (
                "kubernetes-1.36.4-standin-x86-64.raw",
                "kubernetes.conf",
                "kubernetes",
            ),
            (
                "kubernetes-v1.36.4-arm64.raw",
                "kubernetes.conf",
                "kubernetes",
            ),
            (
                "k8s-node-v1.36.4-rc.1-x86-64.raw",
                "k8s-node.conf",
                "k8s-node",
            ),
        ] {
            let d = tempfile::tempdir().unwrap();
            let raw = d.path().join(file);
            std::fs::write(&raw, b"sqsh-stand-in").unwrap();
            std::fs::write(d.path().join(conf), CONF).unwrap();
            let s = Sysext::from_bake(&raw, None).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(s.name, name, "{file}");
        }
    }

    #[test]
    fn refuses_what_bake_does_not_write() {
        let d = tempfile::tempdir().unwrap();
        let cases = [
            (
                "kubernetes.raw",
                Some(CONF),
                "expected a baked sysext named",
            ),
            ("kubernetes-v1.36.1-x86-64.raw", None, "transfer file"),
            (
                "kubernetes-v1.36.1-x86-64.raw",
                Some("[Transfer]\nVerify=false\n"),
                "[Source] section with Path=",
            ),
            (
                "k8s$(id)-v1.36.1-x86-64.raw",
                Some(CONF),
                "expected a baked sysext named",
            ),
        ];
        for (file, conf, want) in cases {
            let _ = std::fs::remove_file(d.path().join("kubernetes.conf"));
            let raw = bake(d.path(), file, conf);
            let e = Sysext::from_bake(&raw, None).unwrap_err().to_string();
            assert!(e.contains(want) && e.contains(file), "{file}: {e}");
        }
        let conf = d.path().join("kubernetes.conf");
        let _ = std::fs::remove_file(&conf);
        let raw = bake(d.path(), "kubernetes-v1.36.1-x86-64.raw", None);
        std::os::unix::fs::symlink("/dev/zero", &conf).unwrap();
        let e = Sysext::from_bake(&raw, None).unwrap_err().to_string();
        assert!(e.contains("at most 65536 bytes"), "{e}");
        std::fs::remove_file(&conf).unwrap();
        // A FIFO named like an image, its transfer file beside it: refused as no file.
        std::fs::write(&conf, CONF).unwrap();
        let fifo = d.path().join("kubernetes-v1.36.2-x86-64.raw");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let e = Sysext::from_bake(&fifo, None).unwrap_err().to_string();
        assert!(e.contains("expected a regular file"), "{e}");
        let raw = bake(d.path(), "kubernetes-v1.36.1-x86-64.raw", Some(CONF));
        let e = Sysext::from_bake(&raw, Some("ftp://me:s3cret@mirror/x.raw"))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("expected an https://") && !e.contains("s3cret"),
            "{e}"
        );
    }
}
