//! Assembling a [`Layer`] from a [`BakeRequest`]: the artifacts' members placed where the
//! definition says, kiln-firstboot, the rendered configuration, units and manifests.

use std::collections::BTreeMap;

use crate::bake::error::{io_err, BakeError};
use crate::bake::layer::*;
use crate::bake::prepare;
use crate::bake::progress::{self, Phase, Tracker};
use crate::bake::render;
use crate::bake::target::ReadyFile;
use crate::digest::{self, Sums};
use crate::image_def::{Format, Os};
use sha2::{Digest, Sha256};

impl Layer {
    /// Builds the layer for one definition, arch and format.
    pub fn assemble(req: &BakeRequest<'_>) -> Result<Layer, BakeError> {
        Layer::assemble_with(req, &progress::Silent)
    }

    /// [`Layer::assemble`], reporting the `extract` phase (every artifact prepared, then
    /// kiln-firstboot hashed and inspected) to `rep`.
    pub fn assemble_with(
        req: &BakeRequest<'_>,
        rep: &dyn progress::Reporter,
    ) -> Result<Layer, BakeError> {
        Layer::assemble_ready(req, rep, &|_| {})
    }

    /// [`Layer::assemble_with`], handing each artifact file to `ready` as soon as it is
    /// final (extracted or verified, hashed and gated), while other artifacts are still being
    /// prepared: the bake compresses its pieces meanwhile ([`crate::bake::precompress`]).
    #[allow(
        clippy::too_many_lines,
        reason = "the layer's assembly in the order docs/bake.md describes (checks, parallel preparation, placement, config, units, manifests); its steps share the layer being built"
    )]
    pub fn assemble_ready(
        req: &BakeRequest<'_>,
        rep: &dyn progress::Reporter,
        ready: &(dyn Fn(ReadyFile) + Sync),
    ) -> Result<Layer, BakeError> {
        let def = req.def;
        if !def.formats.contains(&req.format) {
            return Err(BakeError::Format {
                image: def.name.clone(),
                format: req.format,
                allowed: def.formats.clone(),
            });
        }
        let mut layer = Layer::new(req);
        let keys = config_keys(def);
        let mut versions = BTreeMap::new();
        let mut lock_keys = keys.clone();

        // Artifacts, in definition order: checked here, then prepared in parallel (extract,
        // hash, gate), then placed in order.
        let mut planned: Vec<(&ArtifactInput, Vec<&MemberMap>, String)> = Vec::new();
        for p in def.artifacts.iter() {
            let Some(a) = req.artifacts.iter().find(|a| a.name == p.name) else {
                if p.optional {
                    // Left out: the lock does not pin it for this target (the caller said
                    // so when it built the inputs).
                    continue;
                }
                return Err(BakeError::MissingArtifact {
                    image: def.name.clone(),
                    name: p.name.clone(),
                    os: def.os,
                    arch: req.arch,
                });
            };
            if a.name == "kubelet" && a.version != def.kubernetes.version {
                return Err(BakeError::Artifact {
                    image: def.name.clone(),
                    name: a.name.clone(),
                    expected: format!("version {} (kubernetes.version)", def.kubernetes.version),
                    found: format!("version {} in the lock", a.version),
                });
            }
            let members: Vec<&MemberMap> = a
                .members
                .iter()
                .filter(|m| p.only.is_empty() || p.only.iter().any(|o| o == &m.to))
                .collect();
            for o in &p.only {
                if !a.members.iter().any(|m| &m.to == o) {
                    return Err(BakeError::Artifact {
                        image: def.name.clone(),
                        name: a.name.clone(),
                        expected: format!("a member with to = {o:?} (artifact.only)"),
                        found: format!(
                            "members {:?}",
                            a.members.iter().map(|m| &m.to).collect::<Vec<_>>()
                        ),
                    });
                }
            }
            if members.is_empty() {
                return Err(BakeError::Artifact {
                    image: def.name.clone(),
                    name: a.name.clone(),
                    expected: "at least one member".into(),
                    found: "none".into(),
                });
            }
            let prefix = def.prefix_of(p);
            planned.push((a, members, prefix));
            if let Some(k) = p.version_env_key() {
                versions.insert(k, a.version.clone());
            }
            lock_keys.insert(format!("lock.{}.version", a.name), a.version.clone());
            layer.artifacts.push(ArtifactRecord {
                name: a.name.clone(),
                version: a.version.clone(),
                url: a.url.clone(),
                sha256: a.sha256.clone(),
            });
        }

        // The extract phase's bytes: every download, then kiln-firstboot. A file that cannot
        // be read counts 0 here; reading it fails below with the error that names it.
        let blob_size = |p: &std::path::Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let sizes: Vec<u64> = planned.iter().map(|(a, _, _)| blob_size(&a.blob)).collect();
        let fb_total = blob_size(req.firstboot);
        let extract = Tracker::start(rep, Phase::Extract, sizes.iter().sum::<u64>() + fb_total);
        let tracker = &extract;
        // The gate reads a whole binary into memory; one at a time keeps peak memory at about
        // the largest binary while extraction and hashing run in parallel.
        let gate_turn = std::sync::Mutex::new(());
        let gate_turn = &gate_turn;
        let prepared: Vec<Result<Vec<prepare::Prepared>, BakeError>> = std::thread::scope(|sc| {
            let handles: Vec<_> = planned
                .iter()
                .enumerate()
                .zip(&sizes)
                .map(|((ai, (a, members, _)), &size)| {
                    sc.spawn(move || {
                        let work = req.work.join(format!("extract-{ai}"));
                        let files = prepare::prepare(a, members, req.cache, &work)?;
                        for f in &files {
                            let label = format!("{} {} member {}", a.name, a.version, f.from);
                            let _turn = gate_turn.lock().unwrap_or_else(|e| e.into_inner());
                            (req.gate)(&f.path, &label).map_err(|why| BakeError::Inspect {
                                what: label.clone(),
                                path: f.path.clone(),
                                why: Box::new(why),
                            })?;
                            drop(_turn);
                            ready(ReadyFile {
                                path: f.path.clone(),
                                size: f.size,
                                sha256: f.sha256.clone(),
                            });
                        }
                        tracker.add(size);
                        Ok(files)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("artifact preparation panicked"))
                .collect()
        });
        for ((a, _, prefix), files) in planned.iter().zip(prepared) {
            for f in files? {
                layer.add(
                    &format!("{prefix}/{}", f.to),
                    Node::File {
                        data: Data::File(f.path),
                        mode: 0o755,
                        size: f.size,
                        sha256: f.sha256,
                        sha1: f.sha1,
                    },
                    Origin::Artifact {
                        name: a.name.clone(),
                        member: f.from,
                    },
                )?;
            }
        }

        // kiln-firstboot, hashed and gated like any artifact.
        let fb =
            digest::hash_file(req.firstboot, Sums::Sha256AndSha1).map_err(io_err(req.firstboot))?;
        let (fb_size, fb_sha, fb_sha1) = (fb.size, fb.sha256, fb.sha1.unwrap_or_default());
        (req.gate)(req.firstboot, "kiln-firstboot").map_err(|why| BakeError::Inspect {
            // Not a lock entry: the image definition and --arch decide what it must be.
            what: format!("kiln-firstboot for image {} --arch {}", def.name, req.arch),
            path: req.firstboot.to_path_buf(),
            why: Box::new(why),
        })?;
        tracker.add(fb_total);
        extract.finish();
        let (fb_path, kiln_dir) = match def.os {
            Os::Linux => ("usr/bin/kiln-firstboot", "usr/lib/kiln"),
            Os::Windows => ("k/kiln-firstboot.exe", "k/kiln"),
        };
        layer.add(
            fb_path,
            Node::File {
                data: Data::File(req.firstboot.to_path_buf()),
                mode: 0o755,
                size: fb_size,
                sha256: fb_sha.clone(),
                sha1: fb_sha1,
            },
            Origin::Artifact {
                name: "kiln-firstboot".into(),
                member: "kiln-firstboot".into(),
            },
        )?;
        layer.artifacts.push(ArtifactRecord {
            name: "kiln-firstboot".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            url: "NOASSERTION".into(),
            sha256: fb_sha,
        });
        layer.artifacts.sort_by(|a, b| a.name.cmp(&b.name));

        // Rendered files.
        layer.add_text(
            &format!("{kiln_dir}/max-pods.map"),
            render::max_pods_map(def),
            config_origin(&keys, &["max_pods"]),
        )?;
        let table =
            def.sizing
                .load_table(&def.base_dir)
                .map_err(|source| BakeError::SizingTable {
                    image: def.name.clone(),
                    source,
                })?;
        if let Some(table) = table {
            let sha256 = hex::encode(Sha256::digest(&table));
            let sha1 = hex::encode(sha1::Sha1::digest(&table));
            let size = table.len() as u64;
            layer.add(
                &format!("{kiln_dir}/aws-eni.tsv"),
                Node::File {
                    data: Data::Inline(table),
                    mode: 0o644,
                    size,
                    sha256,
                    sha1,
                },
                config_origin(&keys, &["sizing.aws_table", "sizing.aws_table_sha256"]),
            )?;
        }
        layer.add_text(
            &format!("{kiln_dir}/kubelet-config.yaml"),
            render::kubelet_config(def),
            config_origin(
                &keys,
                &["kubernetes.cgroup_driver", "kubernetes.cluster_domain"],
            ),
        )?;
        match def.os {
            Os::Linux => layer.add_linux_files(req, &keys, &lock_keys, &versions)?,
            Os::Windows => layer.add_windows_files(def, &lock_keys)?,
        }

        // The image id covers every entry but the files that carry it.
        layer.image_id = layer.compute_image_id();
        layer.add_text(
            &format!("{kiln_dir}/image.env"),
            render::image_env(def, req.arch, &layer.image_id, &versions),
            Origin::Kiln("image facts: id and versions".into()),
        )?;
        if req.format == Format::Rootfs {
            let m = layer.install_manifest();
            layer.add_text(INSTALL_MANIFEST, m, Origin::Kiln("install manifest".into()))?;
        }
        Ok(layer)
    }
}
