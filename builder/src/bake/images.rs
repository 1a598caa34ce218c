//! The lock's container images in a Linux layer (issue 16): for the layer's platform, each
//! pinned image becomes one OCI archive, `usr/share/kiln/images/<name>.oci.tar`, holding the
//! pinned index (or manifest) as upstream published it, that platform's manifest, config and
//! layers, and an `index.json` naming the image for containerd. `kiln-images.service`
//! ([`crate::bake::units::kiln_images`]) imports the archives with `ctr images import`.
//!
//! Resolving ([`images_from_lock`]) reads the manifests from the store, checking each against
//! its digest; writing ([`write_archive`]) hashes every blob again as it streams into the tar,
//! so a store blob that changed after the check never reaches a layer. The archive is
//! byte-reproducible: fixed entry order (`oci-layout`, `index.json`, `blobs/`,
//! `blobs/sha256/`, blobs by digest), every mtime 0, owner root, ustar headers. The mtimes are
//! not the bake's SOURCE_DATE_EPOCH on purpose: the archive is content, the layer's image id
//! hashes it, and that id must not change with the clock (docs/contract.md, image id).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::bake::error::{io_err, BakeError};
use crate::image_def::{Arch, ImageDef, Os};
use crate::supply::lock::Lock;
use crate::supply::lock_image::{digest_hex, Image, ImageRef};
use crate::supply::registry::manifest::{self, Parsed};
use crate::supply::store::Store;

/// Where the archives are in the layer.
pub const IMAGES_DIR: &str = "usr/share/kiln/images";

/// The annotation containerd's importer names an image by (before `ref.name`).
pub const CONTAINERD_NAME: &str = "io.containerd.image.name";

/// One blob of an image, from the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageBlob {
    /// Lowercase hex sha256.
    pub hex: String,
    /// Size the referring document states.
    pub size: u64,
    /// The blob in the store.
    pub path: PathBuf,
}

/// A lock image resolved for one platform, ready to bake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageInput {
    /// The lock's name (`pause`): the archive is `<name>.oci.tar`.
    pub name: String,
    /// The lock's reference, `HOST/REPO[:TAG]`.
    pub reference: String,
    /// The pinned digest (the index, or the manifest of a single-platform image).
    pub digest: String,
    /// The pinned document's media type.
    pub media_type: String,
    /// The platform's manifest digest (the pinned digest for a single-platform image).
    pub platform_digest: String,
    /// Every blob, the pinned document first, then the manifest, config and layers.
    pub blobs: Vec<ImageBlob>,
}

impl ImageInput {
    /// `HOST/REPO` without the tag.
    fn repository(&self) -> String {
        match ImageRef::parse(&self.reference) {
            Ok(r) => format!("{}/{}", r.host, r.repository),
            Err(_) => self.reference.clone(),
        }
    }

    /// The reference pinned by digest: `HOST/REPO:TAG@sha256:…`, or `HOST/REPO@sha256:…`
    /// without a tag. containerd's CRI plugin normalises either to `HOST/REPO@sha256:…`.
    pub fn pinned_ref(&self) -> String {
        match ImageRef::parse(&self.reference) {
            Ok(r) if r.tag.is_some() => format!("{}@{}", self.reference, self.digest),
            _ => format!("{}@{}", self.repository(), self.digest),
        }
    }

    /// The names containerd gives the image on import: `HOST/REPO@sha256:…` (what the CRI
    /// plugin looks up for a digest reference) and, when the lock's reference has a tag,
    /// `HOST/REPO:TAG` (what a pod spec naming the tag looks up).
    pub fn names(&self) -> Vec<String> {
        let mut v = Vec::new();
        if matches!(ImageRef::parse(&self.reference), Ok(r) if r.tag.is_some()) {
            v.push(self.reference.clone());
        }
        v.push(format!("{}@{}", self.repository(), self.digest));
        v
    }

    /// The archive's path in the layer.
    pub fn layer_path(&self) -> String {
        format!("{IMAGES_DIR}/{}.oci.tar", self.name)
    }
}

fn image_err(def: &ImageDef, img: &Image, what: String) -> BakeError {
    BakeError::Image {
        image: def.name.clone(),
        lock_image: img.id(),
        detail: what,
    }
}

/// Reads a stored manifest or config, checks it hashes to `digest`, and returns its bytes.
fn read_checked(
    store: &Store,
    def: &ImageDef,
    img: &Image,
    what: &str,
    digest: &str,
) -> Result<Vec<u8>, BakeError> {
    let hex = digest_hex(digest).ok_or_else(|| {
        image_err(
            def,
            img,
            format!("{what} {digest:?} is not a sha256 digest"),
        )
    })?;
    let path = store.blob_path(hex);
    let len = match std::fs::metadata(&path) {
        Ok(m) => m.len(),
        Err(_) => {
            return Err(image_err(
                def,
                img,
                format!(
                    "{what} {digest} is not in the store at {} (run `kiln fetch` or `kiln mirror sync` first)",
                    store.root().display()
                ),
            ))
        }
    };
    if len > manifest::MAX_MANIFEST {
        return Err(image_err(
            def,
            img,
            format!("{what} {digest} is {len} bytes, over the 4 MiB limit"),
        ));
    }
    let bytes = std::fs::read(&path).map_err(io_err(&path))?;
    let found = hex::encode(Sha256::digest(&bytes));
    if found != hex {
        return Err(BakeError::ImageBlob {
            lock_image: img.id(),
            path,
            expected: digest.to_string(),
            found: format!("sha256:{found}"),
        });
    }
    Ok(bytes)
}

/// The lock's images pinned for the definition's OS and `arch`, resolved from `store`. Images
/// the lock does not pin for this platform are left out; a pinned image that is missing or
/// incomplete in the store, or whose documents name another platform, is an error naming it.
/// Windows layers carry no images (yet): the result is empty.
pub fn images_from_lock(
    lock: &Lock,
    store: &Store,
    def: &ImageDef,
    arch: Arch,
) -> Result<Vec<ImageInput>, BakeError> {
    if def.os != Os::Linux {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for img in &lock.images {
        let Some(pin) = img.platform(def.os, arch) else {
            continue;
        };
        let root = read_checked(store, def, img, "index", &img.digest)?;
        let parsed = manifest::parse(&root, "")
            .map_err(|e| image_err(def, img, format!("index {}: {e}", img.digest)))?;
        let mut blobs = vec![blob(store, &img.digest, root.len() as u64)];
        let (media_type, platform_digest, man) = match parsed {
            Parsed::Index {
                media_type,
                manifests,
            } => {
                let d = manifest::select(&manifests, def.os, arch)
                    .map_err(|e| image_err(def, img, format!("index {}: {e}", img.digest)))?;
                if pin.digest.as_ref().is_some_and(|p| p != &d.digest) {
                    return Err(image_err(
                        def,
                        img,
                        format!(
                            "the index names {} for {}/{arch}, the lock pins {}",
                            d.digest,
                            def.os,
                            pin.digest.as_deref().unwrap_or_default()
                        ),
                    ));
                }
                let bytes = read_checked(store, def, img, "manifest", &d.digest)?;
                if bytes.len() as u64 != d.size {
                    return Err(image_err(
                        def,
                        img,
                        format!(
                            "manifest {}: the index states {} bytes, the store holds {}",
                            d.digest,
                            d.size,
                            bytes.len()
                        ),
                    ));
                }
                blobs.push(blob(store, &d.digest, d.size));
                let m = manifest::parse(&bytes, &d.media_type)
                    .map_err(|e| image_err(def, img, format!("manifest {}: {e}", d.digest)))?;
                (media_type, d.digest.clone(), m)
            }
            m @ Parsed::Manifest { .. } => {
                let mt = match &m {
                    Parsed::Manifest { media_type, .. } => media_type.clone(),
                    Parsed::Index { .. } => unreachable!(),
                };
                (mt, img.digest.clone(), m)
            }
        };
        let Parsed::Manifest { config, layers, .. } = man else {
            return Err(image_err(
                def,
                img,
                format!("{platform_digest} is an index inside an index"),
            ));
        };
        // The config states the platform the layers are for: it must be this one, whatever
        // the index claims.
        let cfg = read_checked(store, def, img, "config", &config.digest)?;
        let plat: manifest::Platform = serde_json::from_slice(&cfg).map_err(|e| {
            image_err(
                def,
                img,
                format!("config {}: no os/architecture: {e}", config.digest),
            )
        })?;
        if plat.os != def.os.as_str() || plat.architecture != arch.as_str() {
            return Err(image_err(
                def,
                img,
                format!(
                    "config {} is for {}/{}, the layer is {}/{arch}",
                    config.digest, plat.os, plat.architecture, def.os
                ),
            ));
        }
        for d in std::iter::once(&config).chain(&layers) {
            if !store.contains(d.hex()) {
                return Err(image_err(
                    def,
                    img,
                    format!(
                        "blob {} is not in the store at {} (run `kiln fetch` or `kiln mirror sync` first)",
                        d.digest,
                        store.root().display()
                    ),
                ));
            }
            blobs.push(blob(store, &d.digest, d.size));
        }
        out.push(ImageInput {
            name: img.name.clone(),
            reference: img.reference.clone(),
            digest: img.digest.clone(),
            media_type,
            platform_digest,
            blobs,
        });
    }
    Ok(out)
}

fn blob(store: &Store, digest: &str, size: u64) -> ImageBlob {
    let hex = digest_hex(digest).unwrap_or_default().to_string();
    ImageBlob {
        path: store.blob_path(&hex),
        hex,
        size,
    }
}

/// The `index.json` of an image's archive: one entry per [name](ImageInput::names), each the
/// pinned descriptor with the name as both `io.containerd.image.name` (what `ctr images
/// import` names the image) and `org.opencontainers.image.ref.name` (what skopeo's
/// `oci-archive:FILE:REF` selects).
pub fn index_json(img: &ImageInput) -> Vec<u8> {
    let size = img.blobs.first().map_or(0, |b| b.size);
    let manifests: Vec<_> = img
        .names()
        .into_iter()
        .map(|n| {
            json!({
                "mediaType": img.media_type,
                "digest": img.digest,
                "size": size,
                "annotations": {
                    CONTAINERD_NAME: n,
                    crate::supply::registry::layout::REF_NAME: n,
                },
            })
        })
        .collect();
    let doc = json!({
        "schemaVersion": 2,
        "mediaType": manifest::OCI_INDEX,
        "manifests": manifests,
    });
    let mut b = serde_json::to_vec(&doc).unwrap_or_default();
    b.push(b'\n');
    b
}

fn header(kind: tar::EntryType, mode: u32, size: u64) -> tar::Header {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    let _ = h.set_username("root");
    let _ = h.set_groupname("root");
    h.set_mtime(0);
    h.set_size(size);
    h
}

/// Counts and hashes what is read through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    n: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.hash.update(&buf[..k]);
        self.n += k as u64;
        Ok(k)
    }
}

/// Writes `img` as an OCI archive to `w`, hashing every blob as it streams: a blob whose bytes
/// are not its digest, or not the size its parent states, is an error naming the image, the
/// digest and the store path.
pub fn write_archive(img: &ImageInput, w: impl Write) -> Result<(), BakeError> {
    let mut tar = tar::Builder::new(w);
    let io = |e: std::io::Error| BakeError::Io {
        path: PathBuf::from(img.layer_path()),
        source: e,
    };
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    let index = index_json(img);
    for (path, bytes) in [("oci-layout", &layout[..]), ("index.json", &index[..])] {
        let mut h = header(tar::EntryType::Regular, 0o644, bytes.len() as u64);
        tar.append_data(&mut h, path, bytes).map_err(io)?;
    }
    for dir in ["blobs/", "blobs/sha256/"] {
        let mut h = header(tar::EntryType::Directory, 0o755, 0);
        tar.append_data(&mut h, dir, std::io::empty()).map_err(io)?;
    }
    let mut blobs: Vec<&ImageBlob> = img.blobs.iter().collect();
    blobs.sort_by(|a, b| a.hex.cmp(&b.hex));
    blobs.dedup_by(|a, b| a.hex == b.hex);
    for b in blobs {
        let f = std::fs::File::open(&b.path).map_err(io_err(&b.path))?;
        let mut r = Hashing {
            inner: f.take(b.size),
            hash: Sha256::new(),
            n: 0,
        };
        let mut h = header(tar::EntryType::Regular, 0o644, b.size);
        tar.append_data(&mut h, format!("blobs/sha256/{}", b.hex), &mut r)
            .map_err(io)?;
        let found = hex::encode(r.hash.finalize());
        if r.n != b.size || found != b.hex {
            return Err(BakeError::ImageBlob {
                lock_image: format!("{} ({})", img.name, img.reference),
                path: b.path.clone(),
                expected: format!("sha256:{} ({} bytes)", b.hex, b.size),
                found: format!("sha256:{found} ({} bytes read)", r.n),
            });
        }
    }
    tar.into_inner().map_err(io)?.flush().map_err(io)?;
    Ok(())
}

/// Writes `img`'s archive to `path` (a scratch file the layer then points at).
pub fn write_archive_file(img: &ImageInput, path: &Path) -> Result<(), BakeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    let f = std::fs::File::create(path).map_err(io_err(path))?;
    write_archive(img, std::io::BufWriter::new(f))
}

/// containerd's sandbox image for the layer: the definition's `containerd.sandbox_image`,
/// pinned by digest when a baked image has the same repository. A tag that differs from the
/// lock's is an error (which one was meant is a guess); a reference that already carries a
/// digest, or names a repository no baked image has, is used as written.
pub fn sandbox_image(def: &ImageDef, images: &[ImageInput]) -> Result<String, BakeError> {
    let want = &def.containerd.sandbox_image;
    if want.contains('@') {
        return Ok(want.clone());
    }
    let Ok(w) = ImageRef::parse(want) else {
        return Ok(want.clone());
    };
    let same_repo = |img: &&ImageInput| {
        ImageRef::parse(&img.reference)
            .is_ok_and(|r| (&r.host, &r.repository) == (&w.host, &w.repository))
    };
    // The image with the definition's tag, else any of its repository (which must then agree).
    let hit = images
        .iter()
        .filter(same_repo)
        .find(|i| ImageRef::parse(&i.reference).is_ok_and(|r| r.tag == w.tag))
        .or_else(|| images.iter().find(same_repo));
    if let Some(img) = hit {
        let r = ImageRef::parse(&img.reference).map_err(|e| BakeError::Artifact {
            image: def.name.clone(),
            name: img.name.clone(),
            expected: "a reference HOST/REPO[:TAG]".into(),
            found: e,
        })?;
        if w.tag.is_some() && r.tag.is_some() && w.tag != r.tag {
            return Err(BakeError::Artifact {
                image: def.name.clone(),
                name: format!("containerd.sandbox_image ({want})"),
                expected: format!(
                    "the tag of the lock's image {} ({}), which the layer bakes",
                    img.name, img.reference
                ),
                found: format!(
                    "tag {}: make containerd.sandbox_image and the lock agree",
                    w.tag.as_deref().unwrap_or_default()
                ),
            });
        }
        return Ok(img.pinned_ref());
    }
    Ok(want.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(reference: &str) -> ImageInput {
        ImageInput {
            name: "pause".into(),
            reference: reference.into(),
            digest: format!("sha256:{}", "ab".repeat(32)),
            media_type: manifest::OCI_INDEX.into(),
            platform_digest: format!("sha256:{}", "cd".repeat(32)),
            blobs: Vec::new(),
        }
    }

    #[test]
    fn the_sandbox_image_is_pinned_to_the_baked_image_of_its_tag() {
        let def = ImageDef::parse(
            include_str!("../../../images/ubuntu.toml"),
            Path::new("images/ubuntu.toml"),
        )
        .unwrap();
        assert_eq!(def.containerd.sandbox_image, "registry.k8s.io/pause:3.10.2");
        let d = format!("sha256:{}", "ab".repeat(32));
        let other = ImageInput {
            name: "other".into(),
            ..input("registry.example/pause:3.10")
        };
        let (old, new) = (
            input("registry.k8s.io/pause:3.9"),
            input("registry.k8s.io/pause:3.10.2"),
        );
        let cases: Vec<(Vec<ImageInput>, Result<String, &str>)> = vec![
            (vec![], Ok("registry.k8s.io/pause:3.10.2".into())),
            (
                vec![other.clone()],
                Ok("registry.k8s.io/pause:3.10.2".into()),
            ),
            (
                vec![other, old.clone(), new],
                Ok(format!("registry.k8s.io/pause:3.10.2@{d}")),
            ),
            (
                vec![old],
                Err("make containerd.sandbox_image and the lock agree"),
            ),
            (
                vec![input("registry.k8s.io/pause")],
                Ok(format!("registry.k8s.io/pause@{d}")),
            ),
        ];
        for (images, want) in cases {
            let got = sandbox_image(&def, &images).map_err(|e| e.to_string());
            match (&got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, &w),
                (Err(g), Err(w)) => assert!(g.contains(w), "{g}"),
                (g, w) => panic!("{g:?} vs {w:?}"),
            }
        }
    }

    #[test]
    fn names_and_pinned_references() {
        let d = format!("sha256:{}", "ab".repeat(32));
        let cases: &[(&str, &[String], String)] = &[
            (
                "registry.k8s.io/pause:3.10.1",
                &[
                    "registry.k8s.io/pause:3.10.1".to_string(),
                    format!("registry.k8s.io/pause@{d}"),
                ],
                format!("registry.k8s.io/pause:3.10.1@{d}"),
            ),
            (
                "127.0.0.1:5000/kiln/pause",
                &[format!("127.0.0.1:5000/kiln/pause@{d}")],
                format!("127.0.0.1:5000/kiln/pause@{d}"),
            ),
        ];
        for (r, names, pinned) in cases {
            let i = input(r);
            assert_eq!(&i.names(), names, "{r}");
            assert_eq!(&i.pinned_ref(), pinned, "{r}");
        }
        // index.json: one entry per name, both annotations the same name.
        let v: serde_json::Value =
            serde_json::from_slice(&index_json(&input("registry.k8s.io/pause:3.10.1"))).unwrap();
        let m = v["manifests"].as_array().unwrap();
        assert_eq!(m.len(), 2);
        for e in m {
            assert_eq!(e["digest"], d.as_str());
            assert_eq!(
                e["annotations"][CONTAINERD_NAME],
                e["annotations"]["org.opencontainers.image.ref.name"]
            );
        }
    }
}
