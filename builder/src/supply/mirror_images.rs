//! The lock's images inside a mirror pack: which blobs an image consists of (to pack them,
//! parents first), and on unpack which blob may be accepted next and with what digest and
//! size, learnt from the verified parents, so a pack can carry nothing the lock does not reach.

use std::collections::HashMap;

use crate::supply::lock_image::{digest_hex, Image};
use crate::supply::registry::layout;
use crate::supply::registry::manifest::{self, Parsed};
use crate::supply::store::{Expect, Store};

/// Every blob of `image` in the store, parents first: the index, each pinned platform's
/// manifest, then their configs and layers, as `(hex, size)`. An error names what is missing.
pub fn closure(store: &Store, image: &Image) -> Result<Vec<(String, u64)>, String> {
    let (root, root_len) = layout::read_manifest(store, &image.digest)?;
    let root_hex = digest_hex(&image.digest).unwrap_or_default().to_string();
    let mut out = vec![(root_hex, root_len)];
    let manifests: Vec<String> = match &root {
        Parsed::Index { manifests, .. } => image
            .platforms
            .iter()
            .map(|p| manifest::select(manifests, p.os, p.arch).map(|d| d.digest.clone()))
            .collect::<Result<_, _>>()?,
        Parsed::Manifest { .. } => Vec::new(),
    };
    let walk = if manifests.is_empty() {
        vec![image.digest.clone()]
    } else {
        manifests.clone()
    };
    for m in &manifests {
        let (_, len) = layout::read_manifest(store, m)?;
        out.push((digest_hex(m).unwrap_or_default().to_string(), len));
    }
    for m in &walk {
        let (Parsed::Manifest { config, layers, .. }, _) = layout::read_manifest(store, m)? else {
            return Err(format!("{m} is an index inside an index"));
        };
        for d in std::iter::once(&config).chain(&layers) {
            if !store.contains(d.hex()) {
                return Err(format!("{}: blob {} is missing", image.id(), d.digest));
            }
            out.push((d.hex().to_string(), d.size));
        }
    }
    Ok(out)
}

/// What a pack may still deliver for the lock's images.
#[derive(Debug)]
pub struct Unpacking {
    images: Vec<Image>,
    // hex → (expectation, the image it belongs to when it is a manifest or index to parse).
    allowed: HashMap<String, (Expect, Option<usize>)>,
}

impl Unpacking {
    /// Starts with the images' pinned root digests.
    pub fn new(images: Vec<Image>) -> Unpacking {
        let mut allowed = HashMap::new();
        for (i, img) in images.iter().enumerate() {
            if let Some(h) = digest_hex(&img.digest) {
                allowed.insert(
                    h.to_string(),
                    (
                        Expect {
                            sha256: h.to_string(),
                            size: manifest::MAX_MANIFEST,
                            exact: false,
                            what: img.id(),
                        },
                        Some(i),
                    ),
                );
            }
        }
        Unpacking { images, allowed }
    }

    /// The expectation for blob `hex`, if the images reach it through what was stored so far.
    pub fn expect(&self, hex: &str) -> Option<Expect> {
        self.allowed.get(hex).map(|(e, _)| e.clone())
    }

    /// After blob `hex` was stored (verified): when it is a manifest or index, the blobs it
    /// names (for the pinned platforms only) become acceptable.
    pub fn stored(&mut self, store: &Store, hex: &str) -> Result<(), String> {
        let Some((_, Some(i))) = self.allowed.get(hex).cloned() else {
            return Ok(());
        };
        let img = self.images[i].clone();
        let (parsed, _) = layout::read_manifest(store, &format!("sha256:{hex}"))?;
        let exact = |d: &manifest::Descriptor, parse: bool| {
            (
                d.hex().to_string(),
                (
                    Expect {
                        sha256: d.hex().to_string(),
                        size: d.size,
                        exact: true,
                        what: img.id(),
                    },
                    parse.then_some(i),
                ),
            )
        };
        match parsed {
            Parsed::Index { manifests, .. } => {
                for p in &img.platforms {
                    let d = manifest::select(&manifests, p.os, p.arch)?;
                    if p.digest.as_ref().is_some_and(|pin| pin != &d.digest) {
                        return Err(format!(
                            "{}: the index names {} for {}/{}, the lock pins another",
                            img.id(),
                            d.digest,
                            p.os,
                            p.arch
                        ));
                    }
                    let (k, v) = exact(d, true);
                    self.allowed.insert(k, v);
                }
            }
            Parsed::Manifest { config, layers, .. } => {
                for d in std::iter::once(&config).chain(&layers) {
                    let (k, v) = exact(d, false);
                    self.allowed.entry(k).or_insert(v);
                }
            }
        }
        Ok(())
    }
}
