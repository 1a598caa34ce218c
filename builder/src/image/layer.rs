//! What `kiln image` must know about a rootfs layer before it copies a base: how much it
//! unpacks to (for the free-space check) and which image it is (its `image.env`).
//! This pass only measures; `kiln install` verifies and checks every entry when it applies.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use kiln_firstboot::contract::{envfile, image_env, paths};

use crate::image::error::ImageError;

/// Facts about a layer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LayerFacts {
    /// The sum of the entries' sizes.
    pub unpacked_bytes: u64,
    /// How many entries (each takes an inode).
    pub entries: u64,
    /// `KILN_IMAGE_ID` of the layer's `image.env`, when it has one.
    pub image_id: Option<String>,
    /// `KILN_ARCH` of the layer's `image.env` (`amd64`, `arm64`), when it has one.
    pub arch: Option<String>,
    /// The layer's install manifest (`usr/lib/kiln/install.manifest`), when it has one.
    pub manifest: Option<String>,
    /// Each entry's size, by path (relative, as the install manifest names it).
    pub sizes: std::collections::BTreeMap<String, u64>,
}

/// The most of `image.env` read (the env-file codec's own limit is lower).
const MAX_ENV: u64 = 1 << 20;

/// The most of the install manifest read (a line per file; a layer has hundreds).
const MAX_MANIFEST: u64 = 16 << 20;

/// Measures `layer` (tar.zst): its tar headers, `image.env` and install manifest. A layer
/// kiln baked is read frame by frame, skipping the frames of big files' data
/// ([`crate::image::frames`]); any other zstd stream is decompressed whole.
pub fn peek(layer: &Path) -> Result<LayerFacts, ImageError> {
    let bad = |why: String| ImageError::Layer {
        layer: layer.to_path_buf(),
        why,
    };
    if let Ok(f) = File::open(layer) {
        let mut tar = tar::Archive::new(crate::image::frames::Frames::new(f));
        if let Ok(facts) = tar
            .entries_with_seek()
            .map_err(|e| bad(e.to_string()))
            .and_then(|es| measure(es, &bad))
        {
            return Ok(facts);
        }
    }
    let f = File::open(layer).map_err(|e| bad(e.to_string()))?;
    let dec = zstd::Decoder::new(f).map_err(|e| bad(format!("not zstd: {e}")))?;
    let mut tar = tar::Archive::new(dec);
    let entries = tar
        .entries()
        .map_err(|e| bad(format!("not a tar archive: {e}")))?;
    measure(entries, &bad)
}

fn measure<R: Read>(
    entries: tar::Entries<'_, R>,
    bad: &dyn Fn(String) -> ImageError,
) -> Result<LayerFacts, ImageError> {
    let mut facts = LayerFacts::default();
    let want = paths::IMAGE_ENV.trim_start_matches('/');
    for e in entries {
        let mut e = e.map_err(|e| bad(format!("reading an entry: {e}")))?;
        facts.entries += 1;
        facts.unpacked_bytes = facts.unpacked_bytes.saturating_add(e.size());
        let name = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        facts
            .sizes
            .insert(name.trim_start_matches("./").to_string(), e.size());
        if name.trim_start_matches("./") == want {
            let mut text = String::new();
            e.by_ref()
                .take(MAX_ENV)
                .read_to_string(&mut text)
                .map_err(|e| bad(format!("{want}: {e}")))?;
            let env = envfile::parse(&text).map_err(|e| bad(format!("{want}: {e}")))?;
            facts.image_id = env.get(image_env::KILN_IMAGE_ID).map(str::to_string);
            facts.arch = env.get(image_env::KILN_ARCH).map(str::to_string);
        } else if name.trim_start_matches("./") == crate::layer_contract::INSTALL_MANIFEST {
            let mut text = String::new();
            e.by_ref()
                .take(MAX_MANIFEST)
                .read_to_string(&mut text)
                .map_err(|e| bad(format!("{}: {e}", crate::layer_contract::INSTALL_MANIFEST)))?;
            facts.manifest = Some(text);
        }
    }
    Ok(facts)
}

/// Of the layer's unpacked bytes, how many the root already holds as the layer wants them:
/// files its install manifest lists with the sha256 and mode the layer's manifest has, which
/// `kiln install` leaves alone (an idempotent re-run or an upgrade that keeps most files).
pub fn already_there(root: &Path, facts: &LayerFacts) -> u64 {
    use crate::install::root::{Node, Root};
    let Some(new) = facts.manifest.as_deref() else {
        return 0;
    };
    let rel = crate::layer_contract::INSTALL_MANIFEST;
    let (dir, name) = rel.rsplit_once('/').expect("a path with a directory");
    let read = || -> Option<String> {
        let d = Root::open(root, None).ok()?.dir(dir).ok()??;
        if !matches!(d.node(name).ok()?, Node::File { .. }) {
            return None;
        }
        let mut text = String::new();
        d.open_file(name)
            .ok()?
            .take(MAX_MANIFEST)
            .read_to_string(&mut text)
            .ok()?;
        Some(text)
    };
    let parse = |t: &str| crate::install::parse_manifest(t, Path::new(rel)).ok();
    let (Some(old), Some(new)) = (read().as_deref().and_then(parse), parse(new)) else {
        return 0;
    };
    new.iter()
        .filter(|(p, o)| old.get(*p) == Some(o))
        .map(|(p, _)| facts.sizes.get(p).copied().unwrap_or(0))
        .sum()
}

/// `KILN_IMAGE_ID` of the `image.env` a mounted root holds, read without following a
/// symlink out of the root; `None` when it has none (a stock base).
pub fn installed_image_id(root: &Path) -> Result<Option<String>, ImageError> {
    use crate::install::root::{Node, Root};
    let host = root.join(paths::IMAGE_ENV.trim_start_matches('/'));
    let io = |e: std::io::Error| ImageError::Io {
        path: host.clone(),
        source: e,
    };
    let r = Root::open(root, None).map_err(io)?;
    let (dir, name) = paths::IMAGE_ENV
        .trim_start_matches('/')
        .rsplit_once('/')
        .expect("a path with a directory");
    let Ok(Some(d)) = r.dir(dir) else {
        return Ok(None);
    };
    if !matches!(d.node(name).map_err(io)?, Node::File { .. }) {
        return Ok(None);
    }
    let mut text = String::new();
    d.open_file(name)
        .map_err(io)?
        .take(MAX_ENV)
        .read_to_string(&mut text)
        .map_err(io)?;
    let env = envfile::parse(&text).map_err(|e| ImageError::Io {
        path: host.clone(),
        source: std::io::Error::other(format!(
            "the base's kiln image.env is unreadable ({e}); expected KEY=VALUE lines"
        )),
    })?;
    Ok(Some(
        env.get(image_env::KILN_IMAGE_ID)
            .unwrap_or("(no KILN_IMAGE_ID)")
            .to_string(),
    ))
}
