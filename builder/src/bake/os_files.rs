//! The OS-specific files of a layer: containerd's registry hosts, the Windows `C:\k` files
//! and the Linux units, sysctl, modules and configuration files.

use std::collections::BTreeMap;

use crate::bake::error::{io_err, BakeError};
use crate::bake::images;
use crate::bake::layer::*;
use crate::bake::render;
use crate::bake::units;
use crate::digest::{self, Sums};
use crate::image_def::{Format, ImageDef};
use sha2::{Digest, Sha256};

impl Layer {
    /// The lock's images as OCI archives under [`images::IMAGES_DIR`], written into the bake's
    /// scratch directory and checked as they stream; returns their paths on the node, for
    /// `kiln-images.service`. The unit runs `/usr/bin/ctr`, so the layer must ship it.
    fn add_images(&mut self, req: &BakeRequest<'_>) -> Result<Vec<String>, BakeError> {
        let mut out = Vec::new();
        if req.images.is_empty() {
            return Ok(out);
        }
        if !self.entries.contains_key("usr/bin/ctr") {
            return Err(BakeError::Artifact {
                image: req.def.name.clone(),
                name: "containerd".into(),
                expected: format!(
                    "a member placed at /usr/bin/ctr: kiln-images.service imports the {} baked image(s) with it",
                    req.images.len()
                ),
                found: "no /usr/bin/ctr in the layer (add it to the containerd artifact's members, or drop it from `only`)".into(),
            });
        }
        for img in req.images {
            let path = img.layer_path();
            let scratch = req
                .work
                .join("images")
                .join(format!("{}.oci.tar", img.name));
            images::write_archive_file(img, &scratch)?;
            let d = digest::hash_file(&scratch, Sums::Sha256AndSha1).map_err(io_err(&scratch))?;
            self.add(
                &path,
                Node::File {
                    data: Data::File(scratch),
                    mode: 0o644,
                    size: d.size,
                    sha256: d.sha256,
                    sha1: d.sha1.unwrap_or_default(),
                },
                Origin::Image {
                    name: img.name.clone(),
                    digest: img.digest.clone(),
                },
            )?;
            self.images.push(ImageRecord {
                name: img.name.clone(),
                reference: img.reference.clone(),
                digest: img.digest.clone(),
                platform_digest: img.platform_digest.clone(),
                path: format!("/{path}"),
            });
            out.push(format!("/{path}"));
        }
        Ok(out)
    }

    /// One `certs.d/<host>/hosts.toml` per registry, with its CA files beside it.
    /// `layer_dir` is the layer path of `certs.d`; `node_path` turns a layer path into the
    /// path containerd sees on the node (`/usr/lib/…` or `C:\k\…`).
    pub(crate) fn add_registries(
        &mut self,
        def: &ImageDef,
        keys: &BTreeMap<String, String>,
        layer_dir: &str,
        node_path: impl Fn(&str) -> String,
    ) -> Result<(), BakeError> {
        for (ri, reg) in def.containerd.registries.iter().enumerate() {
            let dir = format!("{layer_dir}/{}", render::certs_dir_name(&reg.host, def.os));
            let mut cas = Vec::new();
            for (ci, ca) in reg.ca.iter().enumerate() {
                let src = def.base_dir.join(ca);
                let pem = std::fs::read(&src).map_err(io_err(&src))?;
                if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                    return Err(BakeError::Artifact {
                        image: def.name.clone(),
                        name: format!("containerd.registry[{ri}].ca[{ci}]"),
                        expected: "a PEM certificate".into(),
                        found: format!("{} without a BEGIN CERTIFICATE line", src.display()),
                    });
                }
                let name = format!("{dir}/ca-{ci}.crt");
                let sha256 = hex::encode(Sha256::digest(&pem));
                let sha1 = hex::encode(sha1::Sha1::digest(&pem));
                let size = pem.len() as u64;
                self.add(
                    &name,
                    Node::File {
                        data: Data::Inline(pem),
                        mode: 0o644,
                        size,
                        sha256,
                        sha1,
                    },
                    config_origin(keys, &["containerd.registry"]),
                )?;
                cas.push(node_path(&name));
            }
            self.add_text(
                &format!("{dir}/hosts.toml"),
                render::hosts_toml(reg, &cas),
                config_origin(keys, &["containerd.registry"]),
            )?;
        }
        Ok(())
    }

    /// containerd's Windows files under `k/containerd` (`C:\k\containerd`): config.toml,
    /// `certs.d`, and the proxy environment kiln-firstboot install gives the service.
    pub(crate) fn add_windows_files(
        &mut self,
        def: &ImageDef,
        lock_keys: &BTreeMap<String, String>,
    ) -> Result<(), BakeError> {
        let containerd_version = lock_keys.get("lock.containerd.version").map(String::as_str);
        self.add_text(
            "k/containerd/config.toml",
            render::containerd_config_windows(def, containerd_version),
            config_origin(
                lock_keys,
                &[
                    "containerd.sandbox_image",
                    "containerd.registry",
                    "lock.containerd.version",
                ],
            ),
        )?;
        self.add_registries(def, lock_keys, "k/containerd/certs.d", |p| {
            format!("C:\\{}", p.replace('/', "\\"))
        })?;
        self.add_text(
            "k/kiln/kiln-report.xml",
            units::KILN_REPORT_TASK.into(),
            Origin::Kiln("task".into()),
        )?;
        if let Some(env) = render::containerd_env_windows(def) {
            self.add_text(
                "k/containerd/containerd.env",
                env,
                config_origin(lock_keys, &["containerd.proxy"]),
            )?;
        }
        Ok(())
    }

    #[allow(
        clippy::too_many_lines,
        reason = "the list of files a Linux layer carries, one add per file in docs/contract.md's order; each is a line or two"
    )]
    pub(crate) fn add_linux_files(
        &mut self,
        req: &BakeRequest<'_>,
        keys: &BTreeMap<String, String>,
        lock_keys: &BTreeMap<String, String>,
        _versions: &BTreeMap<String, String>,
    ) -> Result<(), BakeError> {
        let def = req.def;
        let containerd_version = lock_keys.get("lock.containerd.version").map(String::as_str);
        let archives = self.add_images(req)?;
        let sandbox = images::sandbox_image(def, req.images)?;
        let mut config_keys = config_origin(
            lock_keys,
            &[
                "containerd.sandbox_image",
                "kubernetes.cgroup_driver",
                "containerd.registry",
                "lock.containerd.version",
            ],
        );
        if sandbox != def.containerd.sandbox_image {
            if let Origin::Config(k) = &mut config_keys {
                k.insert("lock.image.sandbox".into(), sandbox.clone());
            }
        }
        self.add_text(
            "usr/lib/kiln/containerd/config.toml",
            render::containerd_config(def, containerd_version, &sandbox),
            config_keys,
        )?;
        self.add_registries(def, keys, "usr/lib/kiln/containerd/certs.d", |p| {
            format!("/{p}")
        })?;
        if !def.sysctl.is_empty() {
            self.add_text(
                "usr/lib/sysctl.d/90-kiln.conf",
                render::sysctl_conf(def),
                config_origin(keys, &["sysctl"]),
            )?;
        }
        if !def.modules.is_empty() {
            self.add_text(
                "usr/lib/modules-load.d/kiln.conf",
                render::modules_conf(def),
                config_origin(keys, &["modules"]),
            )?;
        }
        let mut proxy = Vec::new();
        if let Some(p) = &def.containerd.proxy {
            for (k, v) in [
                ("HTTP_PROXY", &p.http),
                ("HTTPS_PROXY", &p.https),
                ("NO_PROXY", &p.no_proxy),
            ] {
                if let Some(v) = v {
                    proxy.push((k.to_string(), v.clone()));
                }
            }
        }
        // A rootfs layer's modules-load.d is in place when systemd-modules-load runs; a
        // sysext's may be merged after it, so the sysext keeps containerd's own modprobe.
        let overlay_loaded =
            req.format == Format::Rootfs && def.modules.iter().any(|m| m == "overlay");
        let units_dir = "usr/lib/systemd/system";
        let mut unit_texts: Vec<(String, String, bool, Origin)> = vec![
            (
                "kiln-firstboot.service".into(),
                units::KILN_FIRSTBOOT.into(),
                true,
                Origin::Kiln("unit".into()),
            ),
            (
                "kubelet.service".into(),
                units::KUBELET.into(),
                false,
                Origin::Kiln("unit".into()),
            ),
            (
                "kiln-report.service".into(),
                units::KILN_REPORT.into(),
                false,
                Origin::Kiln("unit".into()),
            ),
            (
                "kiln-report.timer".into(),
                units::KILN_REPORT_TIMER.into(),
                true,
                Origin::Kiln("unit".into()),
            ),
            (
                "containerd.service".into(),
                units::containerd(&proxy, overlay_loaded),
                true,
                config_origin(keys, &["containerd.proxy"]),
            ),
        ];
        if !archives.is_empty() {
            unit_texts.push((
                "kiln-images.service".into(),
                units::kiln_images(&archives, &format!("linux/{}", req.arch)),
                true,
                Origin::Kiln("unit".into()),
            ));
        }
        for u in &def.units {
            unit_texts.push((
                u.name.clone(),
                u.content.clone(),
                u.enable,
                config_origin(keys, &["unit"]),
            ));
        }
        for (name, text, enable, origin) in unit_texts {
            if enable {
                for target in units::wanted_by(&text) {
                    // A sysext may only hold /usr, so it carries vendor-style wants links;
                    // a rootfs gets the /etc links `systemctl enable` itself would create.
                    let (link, dest) = match req.format {
                        Format::Sysext => (
                            format!("{units_dir}/{target}.wants/{name}"),
                            format!("../{name}"),
                        ),
                        _ => (
                            format!("etc/systemd/system/{target}.wants/{name}"),
                            format!("/{units_dir}/{name}"),
                        ),
                    };
                    self.add(
                        &link,
                        Node::Symlink(dest),
                        Origin::Kiln("unit enablement".into()),
                    )?;
                }
            }
            self.add_text(&format!("{units_dir}/{name}"), text, origin)?;
        }
        if req.format == Format::Rootfs {
            // kiln-firstboot's man page, from its --help text, for `man kiln-firstboot` on
            // the node. A sysext (Flatcar) ships no usr/share and no man.
            let page = crate::firstboot_man::page().map_err(|detail| BakeError::Tool {
                tool: "kiln-firstboot.8".into(),
                detail,
            })?;
            let gz = crate::firstboot_man::gzip(page.as_bytes());
            let (sha256, sha1) = (
                hex::encode(Sha256::digest(&gz)),
                hex::encode(sha1::Sha1::digest(&gz)),
            );
            let size = gz.len() as u64;
            self.add(
                crate::firstboot_man::LAYER_PATH,
                Node::File {
                    data: Data::Inline(gz),
                    mode: 0o644,
                    size,
                    sha256,
                    sha1,
                },
                Origin::Kiln("man page of kiln-firstboot (from its --help)".into()),
            )?;
        }
        if req.format == Format::Sysext {
            let sx = def.sysext.as_ref().ok_or_else(|| BakeError::Format {
                image: def.name.clone(),
                format: Format::Sysext,
                allowed: def.formats.clone(),
            })?;
            let text = render::extension_release(def, req.arch).unwrap_or_default();
            // systemd matches the release file to the image's name: `<name>` when nodes link
            // it as /etc/extensions/<name>.raw (the sysupdate layout), the versioned file
            // stem when the image is used under its published file name.
            let stem = render::sysext_file_name(def, req.arch)
                .unwrap_or_default()
                .trim_end_matches(".raw")
                .to_string();
            for n in [sx.name.as_str(), stem.as_str()] {
                self.add_text(
                    &format!("usr/lib/extension-release.d/extension-release.{n}"),
                    text.clone(),
                    config_origin(
                        keys,
                        &["sysext.id", "sysext.sysext_level", "sysext.version_id"],
                    ),
                )?;
            }
        }
        Ok(())
    }
}
