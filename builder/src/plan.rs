//! The bake plan: what a bake of an image definition needs and would write, for one format
//! and architecture, decided once from the definition, the lock and the store, before any
//! blob is read — and where kiln's directories are when no flag names them ([`Dirs`]).
//!
//! `kiln plan` prints plans; `kiln bake` (and `bake --fetch`) acts on one: the format and
//! architecture checks, the artifacts the lock pins or leaves out, what the store lacks, the
//! version skew and the kiln-firstboot binary are answered here and nowhere else. The bake
//! itself ([`crate::bake::inputs_from_lock`], `Layer::assemble`) asserts what the plan
//! decided rather than deciding again.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bake::target::all_outputs;
use crate::bake::target_of;
use crate::image_def::{Arch, Format, ImageDef, Os};
use crate::supply::lock::{Artifact, Image, Lock};
use crate::supply::skew::{SkewError, SkewWarning};
use crate::supply::store::Store;

/// Where kiln keeps its files when no flag or variable names them: the one owner of these
/// defaults (the store of `fetch`, `plan` and `bake`, the bake cache, kiln-firstboot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    /// `$XDG_CACHE_HOME/kiln`, else `$HOME/.cache/kiln`.
    pub cache: PathBuf,
    /// `$KILN_CACHE` when set and not empty.
    pub kiln_cache: Option<PathBuf>,
}

impl Dirs {
    /// The directories this process's environment gives.
    pub fn from_env() -> Dirs {
        Dirs {
            cache: cache_home(std::env::var_os("XDG_CACHE_HOME"), std::env::var_os("HOME")),
            kiln_cache: std::env::var_os("KILN_CACHE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        }
    }

    /// The store `plan` and `bake` read when neither `--store` nor `$KILN_STORE` names one:
    /// `$KILN_CACHE`, else [`Dirs::cache`] (what `kiln fetch` fills by default).
    pub fn store(&self) -> PathBuf {
        self.kiln_cache
            .clone()
            .unwrap_or_else(|| self.cache.clone())
    }

    /// The bake cache's default: `bake/` in [`Dirs::cache`].
    pub fn bake_cache(&self) -> PathBuf {
        self.cache.join("bake")
    }

    /// Where kiln looks for the kiln-firstboot it ships for an OS and architecture when no
    /// `--firstboot` names one, in order; `exe` is kiln's own binary
    /// ([`std::env::current_exe`], symlinks resolved):
    /// 1. an unpacked release archive or an installed prefix (`make dist`):
    ///    `PREFIX/bin/kiln` ships `PREFIX/lib/kiln/<os>-<arch>/kiln-firstboot[.exe]`;
    /// 2. a build in kiln's repository: `target/<profile>/kiln` ships what `make firstboot` /
    ///    `make windows` put in `target/firstboot/`;
    /// 3. `target/firstboot/` under the current directory (a kiln from elsewhere run in the
    ///    repository).
    pub fn firstboot_candidates(os: Os, arch: Arch, exe: Option<&Path>) -> Vec<PathBuf> {
        let in_target = match (os, arch) {
            (Os::Windows, _) => "kiln-firstboot.exe",
            (Os::Linux, Arch::Arm64) => "arm64/kiln-firstboot",
            (Os::Linux, _) => "kiln-firstboot",
        };
        let file = match os {
            Os::Windows => "kiln-firstboot.exe",
            Os::Linux => "kiln-firstboot",
        };
        let mut out = Vec::new();
        if let Some(prefix) = exe.and_then(Path::parent).and_then(Path::parent) {
            out.push(
                prefix
                    .join("lib/kiln")
                    .join(format!("{os}-{arch}"))
                    .join(file),
            );
            out.push(prefix.join("firstboot").join(in_target));
        }
        out.push(Path::new("target/firstboot").join(in_target));
        out.dedup();
        out
    }

    /// The kiln-firstboot a bake ships when `--firstboot` names none: the first of
    /// [`Dirs::firstboot_candidates`] that is a file, else `Err` with every place looked at.
    pub fn firstboot(os: Os, arch: Arch) -> Result<PathBuf, Vec<PathBuf>> {
        let exe = std::env::current_exe().ok();
        let looked = Dirs::firstboot_candidates(os, arch, exe.as_deref());
        looked.iter().find(|p| p.is_file()).cloned().ok_or(looked)
    }
}

/// Which kiln-firstboot a bake of `os`/`arch` ships: `given` (`--firstboot`), else the first
/// that exists of [`Dirs::firstboot_candidates`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FirstbootChoice {
    /// The binary (when none was found: the first place looked at).
    pub path: PathBuf,
    /// Whether it is a file.
    pub exists: bool,
    /// Every place looked at, in order (just `path` when `--firstboot` named it).
    pub looked: Vec<PathBuf>,
}

impl FirstbootChoice {
    /// `--firstboot FILE` when given, else the default search.
    pub fn resolve(given: Option<&Path>, os: Os, arch: Arch) -> FirstbootChoice {
        match given {
            Some(p) => FirstbootChoice {
                path: p.to_path_buf(),
                exists: p.is_file(),
                looked: vec![p.to_path_buf()],
            },
            None => match Dirs::firstboot(os, arch) {
                Ok(path) => FirstbootChoice {
                    looked: vec![path.clone()],
                    path,
                    exists: true,
                },
                Err(looked) => FirstbootChoice {
                    path: looked[0].clone(),
                    exists: false,
                    looked,
                },
            },
        }
    }

    /// Why a bake cannot ship it, naming what to do next: there is none, or it is not a
    /// binary for `os`/`arch` (the bake's inspection gate, run here on its headers); `None`
    /// when it can.
    pub fn missing(&self, os: Os, arch: Arch) -> Option<String> {
        if self.exists {
            return crate::bake::inspect_gate(os, arch)(&self.path, "kiln-firstboot")
                .err()
                .map(|e| format!("{}: {e}", self.path.display()));
        }
        let looked: Vec<String> = self
            .looked
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        let build = match os {
            Os::Windows => "`make windows`",
            Os::Linux if arch == Arch::Arm64 => "`make firstboot-arm64`",
            Os::Linux => "`make firstboot-amd64`",
        };
        Some(format!(
            "no kiln-firstboot for {os}/{arch}: expected a file at {}, found none. Build it in \
             kiln's repository with {build} (docs/building.md), use the one in a kiln release \
             archive (lib/kiln/{os}-{arch}/), or pass --firstboot FILE",
            looked.join(", ")
        ))
    }
}

/// kiln's cache directory: `$XDG_CACHE_HOME/kiln`, else `$HOME/.cache/kiln`. An empty or
/// relative `XDG_CACHE_HOME` is ignored, as the XDG Base Directory specification says ("If
/// $XDG_CACHE_HOME is either not set or empty, a default equal to $HOME/.cache should be
/// used"; "If an implementation encounters a relative path in any of these variables it
/// should consider the path invalid and ignore it").
fn cache_home(xdg: Option<OsString>, home: Option<OsString>) -> PathBuf {
    if let Some(x) = xdg.map(PathBuf::from).filter(|p| p.is_absolute()) {
        return x.join("kiln");
    }
    let home = home.map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache").join("kiln")
}

/// A format or architecture the definition does not have.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "image definition {image}: {what} {asked} is not one of the definition's {whats} ({allowed})"
)]
pub struct PlanError {
    /// The definition file.
    pub image: String,
    /// `format` or `arch`.
    pub what: &'static str,
    /// `formats` or `architectures`.
    pub whats: &'static str,
    /// What was asked for.
    pub asked: String,
    /// What the definition has.
    pub allowed: String,
}

/// One artifact a bake needs.
#[derive(Debug, Clone, Serialize)]
pub struct Need {
    /// The artifact's name (`kubelet`, `crictl`, …).
    pub name: String,
    /// The lock's pin for this OS and architecture, if it has one.
    pub pin: Option<Pin>,
    /// Whether the store holds the pinned bytes (`false` without a pin or a store).
    pub in_store: bool,
    /// Why the definition lets the bake leave it out when the lock does not pin it
    /// (`optional = true`); `None` for a required artifact.
    pub optional: Option<String>,
}

impl Need {
    /// Whether the bake would leave this artifact out: optional and not pinned.
    pub fn left_out(&self) -> bool {
        self.pin.is_none() && self.optional.is_some()
    }
}

/// A lock entry, as much of it as a plan shows.
#[derive(Debug, Clone, Serialize)]
pub struct Pin {
    /// Pinned version.
    pub version: String,
    /// Pinned sha256.
    pub sha256: String,
    /// Size in bytes: the lock's recorded size, else the stored blob's, else `None`.
    pub bytes: Option<u64>,
    /// The lock entry itself (what `bake --fetch` fetches).
    #[serde(skip)]
    pub entry: Artifact,
}

/// The plan for one format and architecture of a definition.
#[derive(Debug, Clone, Serialize)]
pub struct BakePlan {
    /// `sysext`, `rootfs` or `windows`.
    pub format: Format,
    /// `amd64` or `arm64`.
    pub arch: Arch,
    /// What the definition places, in its order.
    pub artifacts: Vec<Need>,
    /// The container images the layer carries (Linux only), each with this platform's pin
    /// only.
    #[serde(skip)]
    pub images: Vec<Image>,
    /// The layer's images (`name (reference)`) whose blobs the store lacks (all of them without a
    /// store).
    pub images_missing: Vec<String>,
    /// The kiln-firstboot binary the bake would ship, and whether it exists.
    pub firstboot: PathBuf,
    /// Whether `firstboot` is a file.
    pub firstboot_exists: bool,
    /// Why the bake cannot ship a kiln-firstboot (none found: every place looked at and what
    /// to do; or one for another OS or architecture); `None` when it can.
    pub firstboot_missing: Option<String>,
    /// The files the bake writes into its output directory.
    pub outputs: Vec<String>,
    /// The bytes of the inputs the bake reads (compressed upstream archives and binaries),
    /// where the lock or the store knows them; the layer is of the same order.
    pub input_bytes: u64,
    /// Why the bake would refuse the lock's versions here, if it would: kubelet's version is
    /// not the definition's `kubernetes.version`, or the versions cannot run together
    /// (`supply::skew`).
    pub refused: Option<String>,
    /// A version pairing that bakes today and that kubelet's next minor refuses.
    pub warning: Option<String>,
    #[serde(skip)]
    skew: Option<SkewError>,
}

impl BakePlan {
    /// Plans a bake of `def` as `format` for `arch` from `lock`, looking into `store` (if
    /// any) for the pinned bytes; `firstboot` is the binary the bake would ship. `image`
    /// names the definition file in errors.
    pub fn new(
        image: &Path,
        def: &ImageDef,
        lock: &Lock,
        store: Option<&Store>,
        format: Format,
        arch: Arch,
        firstboot: FirstbootChoice,
    ) -> Result<BakePlan, PlanError> {
        let refuse = |what, asked: String, allowed: Vec<String>| PlanError {
            image: image.display().to_string(),
            what,
            whats: if what == "format" {
                "formats"
            } else {
                "architectures"
            },
            asked,
            allowed: allowed.join(", "),
        };
        if !def.formats.contains(&format) {
            let allowed = def.formats.iter().map(ToString::to_string).collect();
            return Err(refuse("format", format.to_string(), allowed));
        }
        if !def.arch.contains(&arch) {
            let allowed = def.arch.iter().map(ToString::to_string).collect();
            return Err(refuse("arch", arch.to_string(), allowed));
        }
        let artifacts: Vec<Need> = def
            .artifacts
            .iter()
            .map(|p| {
                let art = lock.find(&p.name, def.os, arch);
                let blob = art.and_then(|a| store.and_then(|s| s.lookup(a)));
                Need {
                    name: p.name.clone(),
                    pin: art.map(|a| Pin {
                        version: a.version.clone(),
                        sha256: a.sha256.clone(),
                        bytes: (a.size > 0)
                            .then_some(a.size)
                            .or_else(|| blob_size(blob.as_deref())),
                        entry: a.clone(),
                    }),
                    in_store: blob.is_some(),
                    optional: p.optional.then(|| p.reason.clone().unwrap_or_default()),
                }
            })
            .collect();
        let images: Vec<Image> = lock
            .images
            .iter()
            .filter(|_| def.os == Os::Linux)
            .filter_map(|img| {
                let pin = img.platform(def.os, arch)?.clone();
                Some(Image {
                    platforms: vec![pin],
                    ..img.clone()
                })
            })
            .collect();
        let (skew, warning) = match crate::bake::check_skew(lock, def, arch) {
            Ok(w) => (None, w.as_ref().map(SkewWarning::to_string)),
            Err(crate::bake::BakeError::Skew { source, .. }) => (Some(source), None),
            Err(_) => (None, None),
        };
        let input_bytes = artifacts
            .iter()
            .filter_map(|n| n.pin.as_ref().and_then(|p| p.bytes))
            .sum::<u64>()
            + blob_size(Some(&firstboot.path)).unwrap_or(0);
        let version = kubelet_version_mismatch(image, def, lock, arch);
        let images_missing = images_missing(&images, store);
        Ok(BakePlan {
            format,
            arch,
            artifacts,
            images,
            images_missing,
            firstboot_missing: firstboot.missing(def.os, arch),
            firstboot_exists: firstboot.exists,
            firstboot: firstboot.path,
            outputs: all_outputs(target_of(format), def, arch),
            input_bytes,
            refused: skew.as_ref().map(ToString::to_string).or(version),
            warning,
            skew,
        })
    }

    /// Looks into `store` again after a fetch filled it: which pinned blobs are there now (and
    /// the size of those the lock gives none for). Every other decision stays as planned.
    pub fn restat(&mut self, store: &Store) {
        let mut added = 0;
        for need in &mut self.artifacts {
            let Some(pin) = need.pin.as_mut() else {
                continue;
            };
            let blob = store.lookup(&pin.entry);
            need.in_store = blob.is_some();
            if pin.bytes.is_none() {
                pin.bytes = blob_size(blob.as_deref());
                added += pin.bytes.unwrap_or(0);
            }
        }
        self.input_bytes += added;
        self.images_missing = images_missing(&self.images, Some(store));
    }

    /// Whether the lock pins every artifact this target needs (an optional one it does
    /// not pin is left out, not needed) in versions that can run together.
    pub fn covered(&self) -> bool {
        self.refused.is_none()
            && self
                .artifacts
                .iter()
                .all(|n| n.pin.is_some() || n.left_out())
    }

    /// Whether a bake could run now: covered, every pinned blob stored, kiln-firstboot there.
    /// `kiln plan` says "ready to bake" only then, and `kiln bake` checks the same.
    pub fn ready(&self) -> bool {
        self.covered()
            && self.artifacts.iter().all(|n| n.in_store || n.left_out())
            && self.images_missing.is_empty()
            && self.firstboot_missing.is_none()
    }

    /// The version-skew refusal, if the lock's versions cannot run together.
    pub fn skew(&self) -> Option<&SkewError> {
        self.skew.as_ref()
    }

    /// The optional artifacts the lock does not pin here: the bake leaves them out.
    pub fn left_out(&self) -> impl Iterator<Item = &Need> {
        self.artifacts.iter().filter(|n| n.left_out())
    }

    /// The required artifacts the lock does not pin here.
    pub fn unpinned(&self) -> impl Iterator<Item = &Need> {
        self.artifacts
            .iter()
            .filter(|n| n.pin.is_none() && !n.left_out())
    }

    /// The pinned artifacts whose bytes the store lacks (what `bake --fetch` fetches).
    pub fn missing_artifacts(&self) -> Vec<Artifact> {
        self.artifacts
            .iter()
            .filter(|n| !n.in_store)
            .filter_map(|n| n.pin.as_ref().map(|p| p.entry.clone()))
            .collect()
    }

    /// The layer's images whose blobs `store` lacks.
    pub fn missing_images(&self, store: &Store) -> Vec<Image> {
        self.images
            .iter()
            .filter(|img| !crate::supply::registry::layout::missing(store, img).is_empty())
            .cloned()
            .collect()
    }
}

/// Plans every (format, arch) pair asked for: `formats`/`arches` empty means all of the
/// definition's. `firstboot` gives the binary for a target (the bake's default or the
/// user's).
pub fn plan(
    image: &Path,
    def: &ImageDef,
    lock: &Lock,
    store: Option<&Store>,
    formats: &[Format],
    arches: &[Arch],
    firstboot: &dyn Fn(Arch) -> FirstbootChoice,
) -> Result<Vec<BakePlan>, PlanError> {
    let formats = if formats.is_empty() {
        &def.formats[..]
    } else {
        formats
    };
    let arches = if arches.is_empty() {
        &def.arch[..]
    } else {
        arches
    };
    let mut out = Vec::new();
    for &format in formats {
        for &arch in arches {
            out.push(BakePlan::new(
                image,
                def,
                lock,
                store,
                format,
                arch,
                firstboot(arch),
            )?);
        }
    }
    Ok(out)
}

/// Why kubelet's version in `lock` for `arch` is not the definition's `kubernetes.version`
/// (which bake compares verbatim: it names the layer and goes into image.env), with what to
/// do; `None` when it is, or when the lock has no kubelet here (reported as not covered).
pub fn kubelet_version_mismatch(
    image: &Path,
    def: &ImageDef,
    lock: &Lock,
    arch: Arch,
) -> Option<String> {
    if !def.artifacts.iter().any(|p| p.name == "kubelet") {
        return None;
    }
    let found = &lock.find("kubelet", def.os, arch)?.version;
    (found != &def.kubernetes.version).then(|| {
        format!(
            "{}: kubernetes.version is {}, but the lock pins kubelet {found} for {}/{arch}: \
             bake the lock's version with --kubernetes-version {found}, or set \
             [kubernetes] version = \"{found}\" in the definition",
            image.display(),
            def.kubernetes.version,
            def.os
        )
    })
}

/// `images_missing` of a plan: the images of `images` whose blobs `store` lacks.
fn images_missing(images: &[Image], store: Option<&Store>) -> Vec<String> {
    images
        .iter()
        .filter(|img| {
            store.is_none_or(|s| !crate::supply::registry::layout::missing(s, img).is_empty())
        })
        .map(Image::id)
        .collect()
}

fn blob_size(p: Option<&Path>) -> Option<u64> {
    p.and_then(|p| std::fs::metadata(p).ok()).map(|m| m.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_relative_xdg_cache_home_is_ignored() {
        let home = Some("/home/u".into());
        for (xdg, want) in [
            (Some("/var/cache"), "/var/cache/kiln"),
            (Some(""), "/home/u/.cache/kiln"),
            (Some("rel/cache"), "/home/u/.cache/kiln"),
            (None, "/home/u/.cache/kiln"),
        ] {
            assert_eq!(
                cache_home(xdg.map(Into::into), home.clone()),
                Path::new(want),
                "{xdg:?}"
            );
        }
    }

    #[test]
    fn the_store_is_kiln_cache_else_the_cache_and_the_bake_cache_sits_in_the_cache() {
        let d = Dirs {
            cache: "/c/kiln".into(),
            kiln_cache: None,
        };
        assert_eq!(d.store(), Path::new("/c/kiln"));
        assert_eq!(d.bake_cache(), Path::new("/c/kiln/bake"));
        let d = Dirs {
            kiln_cache: Some("/srv/store".into()),
            ..d
        };
        assert_eq!(d.store(), Path::new("/srv/store"));
        assert_eq!(d.bake_cache(), Path::new("/c/kiln/bake"));
    }
}
