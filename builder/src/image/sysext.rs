//! Flatcar bases: a sysext layer (`kiln bake --format sysext`) is placed, verified, as
//! `/etc/extensions/<file name>` on the root partition (Flatcar's partition 9, `ROOT`),
//! where systemd-sysext merges it at every boot. Not the OEM partition: that holds the
//! cloud vendor's extensions, which Flatcar activates only through the `oem-*` names its
//! release ships, and the ROOT partition is where an operator's own extensions live.

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::image::error::ImageError;
use crate::install::root::{Node, Root};
use crate::install::verify::{self, LayerTrust, Verification};
use crate::install::InstallError;

/// The directory systemd-sysext reads (besides /var/lib/extensions), relative to the root.
pub const EXTENSIONS: &str = "etc/extensions";

/// Whether `layer` is a squashfs image (magic `hsqs`, little-endian 0x73717368) or a signed
/// disk image of one (`kiln bake --sysext-ddi`: a GPT).
pub fn is_sysext(layer: &Path) -> bool {
    let mut b = [0u8; 4];
    let squashfs = File::open(layer)
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
        && &b == b"hsqs";
    squashfs || crate::render::sysext::is_gpt(layer).unwrap_or(false)
}

/// A signed disk image must have its certificate beside it; checked before the base is
/// copied.
pub fn check_signed(layer: &Path) -> Result<(), ImageError> {
    let file = layer
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    crate::render::sysext::verity_cert(layer, family(&file), &file)
        .map(|_| ())
        .map_err(|e| ImageError::Layer {
            layer: layer.to_path_buf(),
            why: e.to_string(),
        })
}

/// The directory `name` in `dir`, made when missing; an error for anything else there.
fn subdir(dir: &crate::install::root::Dir, name: &str) -> io::Result<crate::install::root::Dir> {
    match dir.node(name)? {
        Node::Missing => dir.mkdir(name),
        Node::Dir => dir.subdir(name),
        _ => Err(io::Error::other(format!("{name} is not a directory"))),
    }
}

/// Writes `bytes` as `name` in `dir` (0644), through a temp file renamed over it.
fn put(dir: &crate::install::root::Dir, name: &str, bytes: &[u8]) -> io::Result<()> {
    let (tmp, mut f) = dir.create_temp()?;
    let r = (|| {
        f.write_all(bytes)?;
        use std::os::unix::fs::PermissionsExt;
        f.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        f.sync_all()
    })();
    match r {
        Ok(()) => dir.rename(&tmp, name),
        Err(e) => {
            let _ = dir.unlink(&tmp);
            Err(e)
        }
    }
}

/// For a signed disk image: its certificate (`<name>.verity.crt` beside it) as
/// `/etc/verity.d/kiln-<name>.crt` and the signed-only `systemd-sysext.service` drop-in, as
/// `kiln render --sysext` places them; without either the node's systemd-sysext could not
/// verify the image and would not merge it. Returns what it wrote.
fn place_signed(
    layer: &Path,
    etc: &crate::install::root::Dir,
    fam: &str,
    file: &str,
) -> Result<Vec<String>, ImageError> {
    let cert =
        crate::render::sysext::verity_cert(layer, fam, file).map_err(|e| ImageError::Layer {
            layer: layer.to_path_buf(),
            why: e.to_string(),
        })?;
    let Some(cert) = cert else {
        return Ok(Vec::new());
    };
    let io = |e: io::Error| ImageError::Io {
        path: Path::new("/etc").join("verity.d"),
        source: e,
    };
    put(
        &subdir(etc, "verity.d").map_err(io)?,
        &format!("kiln-{fam}.crt"),
        &cert,
    )
    .map_err(io)?;
    let dropin = subdir(etc, "systemd")
        .and_then(|d| subdir(&d, "system"))
        .and_then(|d| subdir(&d, "systemd-sysext.service.d"))
        .map_err(io)?;
    put(
        &dropin,
        "kiln-signed.conf",
        crate::render::sysext::signed_dropin().as_bytes(),
    )
    .map_err(io)?;
    Ok(vec![
        format!("etc/verity.d/kiln-{fam}.crt"),
        "etc/systemd/system/systemd-sysext.service.d/kiln-signed.conf".into(),
    ])
}

/// The name that versions of one sysext share: `flatcar` of `flatcar-v1.36.1-x86-64.raw`
/// (`kiln bake` names images `<name>-<kubernetes version>-<arch>.raw`).
fn family(file: &str) -> &str {
    file.split_once("-v").map_or(file, |(f, _)| f)
}

/// What placing did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Placed {
    /// What was proven about the image.
    pub verified: Option<Verification>,
    /// The path written, relative to the root (empty when it was already there).
    pub written: String,
    /// Other versions of the same sysext removed (with `--replace`).
    pub removed: Vec<String>,
    /// For a signed disk image: the certificate and the policy drop-in written.
    pub signed: Vec<String>,
}

/// Places the sysext `layer` into `/etc/extensions/` of the mounted `root`.
pub fn place(
    layer: &Path,
    root: &Path,
    trust: &LayerTrust,
    replace: bool,
    base: &Path,
    partition: u32,
) -> Result<Placed, ImageError> {
    let refuse = |e: InstallError| ImageError::Install {
        base: base.to_path_buf(),
        partition,
        source: Box::new(e),
    };
    let name = layer
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".raw"))
        .ok_or_else(|| ImageError::Layer {
            layer: layer.to_path_buf(),
            why: "a sysext image must be named NAME.raw (systemd-sysext matches NAME to its extension-release file)".into(),
        })?;
    let mut f = File::open(layer).map_err(crate::image::error::io_err(layer))?;
    let v = verify::verify_layer(&mut f, layer, trust).map_err(|e| refuse(e.into()))?;
    let host = root.join(EXTENSIONS);
    let io = |e: io::Error| ImageError::Io {
        path: host.clone(),
        source: e,
    };
    let r = Root::open(root, None).map_err(io)?;
    let etc = r.dir("etc").map_err(io)?.ok_or_else(|| ImageError::Layer {
        layer: root.join("etc"),
        why: "the root partition has no /etc: not a Flatcar ROOT partition (name it with --partition N)".into(),
    })?;
    let ext = match etc.node("extensions").map_err(io)? {
        Node::Missing => etc.mkdir("extensions").map_err(io)?,
        Node::Dir => etc.subdir("extensions").map_err(io)?,
        _ => {
            return Err(io(io::Error::other(
                "is not a directory (a symlink or file where systemd-sysext looks for images)",
            )))
        }
    };
    let fam = family(&name);
    let others: Vec<String> = ext
        .names()
        .map_err(io)?
        .into_iter()
        .filter(|n| n != &name && n.ends_with(".raw") && family(n) == fam)
        .collect();
    if !others.is_empty() && !replace {
        return Err(ImageError::OtherVersion {
            base: base.to_path_buf(),
            found: format!("/{EXTENSIONS}/{}", others.join(", ")),
            want: name.clone(),
        });
    }
    let mut placed = Placed {
        verified: Some(v.clone()),
        ..Default::default()
    };
    let same = match ext.node(&name).map_err(io)? {
        Node::File { .. } => {
            let mut h = Sha256::new();
            io::copy(&mut ext.open_file(&name).map_err(io)?, &mut h).map_err(io)?;
            hex::encode(h.finalize()) == v.sha256
        }
        Node::Missing => false,
        _ => {
            return Err(io(io::Error::other(format!(
                "{name} exists and is not a file"
            ))))
        }
    };
    if !same {
        // Copied from the file that was verified, re-hashed on the way: a layer changed
        // between the check and the copy is refused.
        let (tmp, mut out) = ext.create_temp().map_err(io)?;
        let mut h = Sha256::new();
        f = File::open(layer).map_err(crate::image::error::io_err(layer))?;
        let mut buf = vec![0u8; 1 << 20];
        let r = (|| -> io::Result<()> {
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                h.update(&buf[..n]);
                out.write_all(&buf[..n])?;
            }
            use std::os::unix::fs::PermissionsExt;
            out.set_permissions(std::fs::Permissions::from_mode(0o644))?;
            out.sync_all()
        })();
        let got = hex::encode(h.finalize());
        if let Err(e) = r {
            let _ = ext.unlink(&tmp);
            return Err(io(e));
        }
        if got != v.sha256 {
            let _ = ext.unlink(&tmp);
            return Err(refuse(InstallError::Hostile {
                archive: layer.to_path_buf(),
                entry: "(whole image)".into(),
                why: format!(
                    "the file changed while it was copied (sha256 {got}, verified {})",
                    v.sha256
                ),
            }));
        }
        ext.rename(&tmp, &name).map_err(io)?;
        placed.written = format!("{EXTENSIONS}/{name}");
    }
    for o in others {
        ext.unlink(&o).map_err(io)?;
        placed.removed.push(format!("{EXTENSIONS}/{o}"));
    }
    placed.signed = place_signed(layer, &etc, fam, &name)?;
    Ok(placed)
}
