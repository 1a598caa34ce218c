//! The node.toml sections beyond identity and credentials: `[kubelet]`'s drop-in, `[sysctl]`,
//! `[containerd.config]` and the proxy's coverage rule; each checked with the rules the node applies.

use std::collections::BTreeMap;

use super::{plain_token, RawContainerd, RawKubelet, RawNodeSection, RawSwap, Validator};
use crate::proxy_url;
use crate::render::config::{ApiServer, ConfigError};
use crate::render::{containerd_config, kubelet_dropin};

impl Validator<'_> {
    /// `node.kube_reserved`, `node.system_reserved`, `node.eviction_hard`: the node.env
    /// overrides of the image's RESERVATION formula (docs/contract.md, "Sizing"), each checked
    /// twice, as node.env's shape (what kiln-firstboot reads: `contract::sizing::parse_pairs`)
    /// and as kubelet parses it before it starts (`kiln-kubelet-config`'s `run_checks`:
    /// cpu, memory, ephemeral-storage and pid only; known eviction signals; quantities).
    pub(super) fn reserved(
        &self,
        node: &RawNodeSection,
    ) -> Result<[Option<String>; 3], ConfigError> {
        use kiln_firstboot::contract::sizing::parse_pairs;
        let mut out: [Option<String>; 3] = Default::default();
        let tables = [
            ("node.kube_reserved", &node.kube_reserved, '='),
            ("node.system_reserved", &node.system_reserved, '='),
            ("node.eviction_hard", &node.eviction_hard, '<'),
        ];
        for (i, (key, table, sep)) in tables.into_iter().enumerate() {
            if table.is_empty() {
                continue;
            }
            let value = table
                .iter()
                .map(|(k, v)| format!("{k}{sep}{v}"))
                .collect::<Vec<_>>()
                .join(",");
            parse_pairs(&value, sep).map_err(|e| self.invalid(key, e, format!("{value:?}")))?;
            let map = Some(table.clone());
            let mut kc = kiln_kubelet_config::KubeletConfiguration::default();
            match i {
                0 => kc.kube_reserved = map,
                1 => kc.system_reserved = map,
                _ => kc.eviction_hard = map,
            }
            kiln_kubelet_config::validate::run_checks(&kc).map_err(|e| {
                self.invalid(
                    key,
                    "values kubelet accepts (it refuses the rest before it starts)",
                    e,
                )
            })?;
            out[i] = Some(value);
        }
        Ok(out)
    }

    /// `[sysctl]`: each name and value by the contract's rules (kiln-firstboot checks names and
    /// values again with the same code), integers as their decimal text, sorted by name.
    pub(super) fn sysctl(
        &self,
        table: &BTreeMap<String, toml::Value>,
    ) -> Result<Vec<(String, String)>, ConfigError> {
        use kiln_firstboot::contract::sysctl;
        if table.len() > sysctl::MAX_ENTRIES {
            let max = format!("at most {} settings", sysctl::MAX_ENTRIES);
            return Err(self.invalid("sysctl", &max, table.len()));
        }
        let mut out = Vec::with_capacity(table.len());
        for (name, value) in table {
            let key = format!("sysctl.{name:?}");
            let value = match value {
                toml::Value::String(s) => s.trim().to_string(),
                toml::Value::Integer(n) => n.to_string(),
                other => {
                    return Err(self.invalid(&key, "a string or an integer", other.type_str()))
                }
            };
            sysctl::check(name, &value).map_err(|e| {
                // The contract's "[name: ]expected …, found …", split for this error's shape.
                let e = e.strip_prefix(&format!("{name}: ")).unwrap_or(&e);
                let e = e.strip_prefix("expected ").unwrap_or(e);
                let (expected, found) = e.rsplit_once(", found ").unwrap_or((e, "another value"));
                self.invalid(&key, expected, found)
            })?;
            out.push((name.clone(), value));
        }
        Ok(out)
    }

    /// `swap.file_size`: bytes (an integer or a quantity such as `"2Gi"`), whole 4 KiB pages,
    /// at least 40 KiB (mkswap's 10 pages), at most 1 TiB; kiln-firstboot's rule for
    /// `SWAP_FILE_SIZE` checks it again on the node.
    pub(super) fn swap_file_size(
        &self,
        swap: Option<&RawSwap>,
    ) -> Result<Option<u64>, ConfigError> {
        let Some(v) = swap.and_then(|s| s.file_size.as_ref()) else {
            return Ok(None);
        };
        let key = "swap.file_size";
        let expected =
            "a size in bytes or a quantity (\"2Gi\"), whole 4 KiB pages, 40 KiB to 1 TiB";
        let bytes = match v {
            toml::Value::Integer(n) => u64::try_from(*n).ok(),
            toml::Value::String(q) => kiln_kubelet_config::units::parse_quantity(q)
                .ok()
                .filter(|b| b.fract() == 0.0 && *b >= 0.0 && *b < 2f64.powi(62))
                .map(|b| b as u64),
            _ => None,
        };
        match bytes {
            Some(b) if (40 << 10..=1 << 40).contains(&b) && b % 4096 == 0 => Ok(Some(b)),
            _ => Err(self.invalid(key, expected, v)),
        }
    }

    /// `kubelet.config_file`, then `[kubelet.config]` over it, then what `[swap]` sets, as one
    /// checked drop-in.
    pub(super) fn kubelet_dropin(
        &self,
        kubelet: &RawKubelet,
        swap: Option<&RawSwap>,
    ) -> Result<Option<Vec<u8>>, ConfigError> {
        let refused = |r: kubelet_dropin::Refusal| self.invalid(&r.key, &r.expected, r.found);
        let mut parts = Vec::new();
        if let Some(file) = &kubelet.config_file {
            let key = "kubelet.config_file";
            let bytes = self.read(key, file)?;
            let text = String::from_utf8(bytes).map_err(|_| {
                self.invalid(key, "a YAML or JSON text", "bytes that are not UTF-8")
            })?;
            parts.push(kubelet_dropin::file_part(key, &text).map_err(refused)?);
        }
        if let Some(table) = &kubelet.config {
            parts.push(kubelet_dropin::table_part("kubelet.config", table).map_err(refused)?);
        }
        if let Some(swap) = swap {
            for p in &parts {
                if let Some(f) = ["failSwapOn", "memorySwap"]
                    .into_iter()
                    .find(|f| p.tree.get(f).is_some())
                {
                    return Err(self.invalid(
                        &format!("{}.{f}", p.key),
                        "swap set in one place: [swap] sets failSwapOn and memorySwap",
                        format!("{f} set beside [swap]"),
                    ));
                }
            }
            let behavior = swap.behavior.as_deref().unwrap_or("LimitedSwap");
            if !matches!(behavior, "LimitedSwap" | "NoSwap") {
                return Err(self.invalid(
                    "swap.behavior",
                    "LimitedSwap or NoSwap (kubelet's memorySwap.swapBehavior)",
                    format!("{behavior:?}"),
                ));
            }
            let mut table = toml::Table::new();
            table.insert("failSwapOn".into(), toml::Value::Boolean(false));
            let mut mem = toml::Table::new();
            mem.insert("swapBehavior".into(), toml::Value::String(behavior.into()));
            table.insert("memorySwap".into(), toml::Value::Table(mem));
            parts.push(kubelet_dropin::table_part("swap", &table).map_err(refused)?);
        }
        kubelet_dropin::render(parts).map_err(refused)
    }

    /// With a proxy set, NO_PROXY must cover the API server and the metadata address, the
    /// rule kiln-firstboot's doctor checks on the node (`doctor::net::proxy`, the same
    /// matching code): kubelet would reach the API server through the proxy, and the agents
    /// that read instance metadata would get the proxy's answer.
    pub(super) fn no_proxy_covers(
        &self,
        no_proxy: &[String],
        api: &ApiServer,
    ) -> Result<(), ConfigError> {
        use kiln_firstboot::doctor::net::no_proxy_covers;
        let joined = no_proxy.join(",");
        let mut caught = Vec::new();
        if let Some((host, port)) = api.endpoint.rsplit_once(':') {
            let port = port.parse().unwrap_or(443);
            if !no_proxy_covers(&joined, host, port) {
                caught.push(format!("the API server {host}"));
            }
        }
        if !no_proxy_covers(&joined, "169.254.169.254", 80) {
            caught.push("the metadata address 169.254.169.254".to_string());
        }
        if caught.is_empty() {
            return Ok(());
        }
        Err(self.invalid(
            "proxy.no_proxy",
            "entries that cover the API server and the metadata address 169.254.169.254 when a proxy is set (kiln-firstboot's doctor fails `proxy` otherwise)",
            format!("{no_proxy:?}, which does not cover {}", caught.join(" or ")),
        ))
    }
}

impl Validator<'_> {
    /// `[containerd.config]` or `containerd.config_file` (one of them): a containerd config
    /// fragment, checked by [`containerd_config::render`] and written with its version first.
    pub(super) fn containerd_config(
        &self,
        raw: &RawContainerd,
    ) -> Result<Option<String>, ConfigError> {
        let (key, table) = match (&raw.config, &raw.config_file) {
            (None, None) => return Ok(None),
            (Some(_), Some(_)) => {
                return Err(self.invalid(
                    "containerd.config_file",
                    "one of `containerd.config_file` or `[containerd.config]`",
                    "both",
                ))
            }
            (Some(t), None) => ("containerd.config", t.clone()),
            (None, Some(file)) => {
                let key = "containerd.config_file";
                let bytes = self.read(key, file)?;
                let text = String::from_utf8(bytes)
                    .map_err(|_| self.invalid(key, "a TOML text", "bytes that are not UTF-8"))?;
                let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
                    self.invalid(key, "a containerd config fragment (TOML)", e.message())
                })?;
                (key, table)
            }
        };
        containerd_config::render(key, &table)
            .map(|(_, text)| Some(text))
            .map_err(|r| self.invalid(&r.key, &r.expected, r.found))
    }
}

/// The most `[[kubelet.credential_provider]]` entries kiln writes.
pub const MAX_CREDENTIAL_PROVIDERS: usize = 16;
/// The largest `credential-providers.json` kiln writes: what kiln-firstboot reads.
pub const MAX_CREDENTIAL_PROVIDERS_BYTES: usize = 256 * 1024;

impl Validator<'_> {
    /// `[[kubelet.credential_provider]]`: kubelet's `CredentialProviderConfig` (kubelet.config.k8s.io/v1)
    /// as JSON, checked with kubelet's own decoding and rules (`kiln-kubelet-config`'s
    /// `credential_provider`, which the stand-in kubelet runs) and kiln's: a provider name is
    /// a plain file name (its binary in the image's `CREDENTIAL_PROVIDER_BIN_DIR`), env names
    /// are variable names, and `kubelet.extra_args` does not set the two flags as well.
    pub(super) fn credential_providers(
        &self,
        kubelet: &RawKubelet,
    ) -> Result<Option<Vec<u8>>, ConfigError> {
        use kiln_kubelet_config::credential_provider::{decode, validate, PROVIDER_API_VERSIONS};
        let list = &kubelet.credential_provider;
        if list.is_empty() {
            return Ok(None);
        }
        if let Some((i, a)) = kubelet
            .extra_args
            .iter()
            .enumerate()
            .find(|(_, a)| a.starts_with("--image-credential-provider-"))
        {
            return Err(self.invalid(
                &format!("kubelet.extra_args[{i}]"),
                "no credential provider flag beside [[kubelet.credential_provider]], which sets both",
                format!("{a:?}"),
            ));
        }
        if list.len() > MAX_CREDENTIAL_PROVIDERS {
            let max = format!("at most {MAX_CREDENTIAL_PROVIDERS} providers");
            return Err(self.invalid("kubelet.credential_provider", &max, list.len()));
        }
        let mut providers = Vec::new();
        for (i, p) in list.iter().enumerate() {
            let key = format!("kubelet.credential_provider[{i}]");
            let plain = |s: &str| {
                !s.is_empty()
                    && s.len() <= 64
                    && s.starts_with(|c: char| c.is_ascii_alphanumeric())
                    && s.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            };
            if !plain(&p.name) {
                return Err(self.invalid(
                    &format!("{key}.name"),
                    "the provider's binary name in the image's CREDENTIAL_PROVIDER_BIN_DIR: 1-64 of [A-Za-z0-9._-], starting with a letter or digit",
                    format!("{:?}", p.name),
                ));
            }
            for name in p.env.keys() {
                let var = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
                if !var {
                    return Err(self.invalid(
                        &format!("{key}.env"),
                        "environment variable names ([A-Za-z_][A-Za-z0-9_]*)",
                        format!("{name:?}"),
                    ));
                }
            }
            let env: Vec<serde_json::Value> = p
                .env
                .iter()
                .map(|(k, v)| serde_json::json!({ "name": k, "value": v }))
                .collect();
            let mut entry = serde_json::json!({
                "name": p.name,
                "matchImages": p.match_images,
                "defaultCacheDuration": p.default_cache_duration,
                "apiVersion": p.api_version.as_deref().unwrap_or(PROVIDER_API_VERSIONS[0]),
            });
            if !p.args.is_empty() {
                entry["args"] = serde_json::json!(p.args);
            }
            if !env.is_empty() {
                entry["env"] = serde_json::Value::Array(env);
            }
            // One provider at a time, so each of kubelet's errors names its entry.
            let one = serde_json::json!({
                "apiVersion": "kubelet.config.k8s.io/v1",
                "kind": "CredentialProviderConfig",
                "providers": [entry.clone()],
            });
            let checked = decode(&one.to_string()).map(|d| validate(&d, true));
            let errs = match checked {
                Ok(errs) => errs,
                Err(e) => vec![e],
            };
            if !errs.is_empty() {
                return Err(self.invalid(
                    &key,
                    "a provider kubelet v1.36 accepts (its CredentialProviderConfig rules)",
                    kiln_kubelet_config::validate::aggregate(&errs),
                ));
            }
            if providers
                .iter()
                .any(|q: &serde_json::Value| q["name"] == entry["name"])
            {
                return Err(self.invalid(
                    &format!("{key}.name"),
                    "each provider once (kubelet: Duplicate value)",
                    format!("{:?} again", p.name),
                ));
            }
            providers.push(entry);
        }
        let config = serde_json::json!({
            "apiVersion": "kubelet.config.k8s.io/v1",
            "kind": "CredentialProviderConfig",
            "providers": providers,
        });
        let mut text = serde_json::to_vec_pretty(&config).unwrap_or_default();
        text.push(b'\n');
        // What kiln-firstboot reads (config.rs): a larger file would stop every node.
        if text.len() > MAX_CREDENTIAL_PROVIDERS_BYTES {
            return Err(self.invalid(
                "kubelet.credential_provider",
                &format!("at most {MAX_CREDENTIAL_PROVIDERS_BYTES} bytes as written"),
                format!("{} bytes", text.len()),
            ));
        }
        Ok(Some(text))
    }
}

impl Validator<'_> {
    pub(super) fn proxy_url(&self, key: &str, url: &str) -> Result<(), ConfigError> {
        if let Some(host) = proxy_url::credentials_host(url) {
            let found = format!("a URL with credentials before `@{host}` (not shown)");
            return Err(self.invalid(key, proxy_url::NO_CREDENTIALS, found));
        }
        let ok = proxy_url::scheme_rest(url).is_some_and(|r| !r.is_empty()) && plain_token(url);
        if !ok {
            return Err(self.invalid(
                key,
                "an http:// or https:// URL without whitespace or quotes",
                format!("{url:?}"),
            ));
        }
        Ok(())
    }

    pub(super) fn api_server(&self, url: &str) -> Result<ApiServer, ConfigError> {
        let bad = || {
            self.invalid(
                "api_server",
                "an https://host[:port] URL without a path",
                format!("{url:?}"),
            )
        };
        let rest = url.strip_prefix("https://").ok_or_else(bad)?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.is_empty() || rest.contains(['/', '?', '#', '@']) || !plain_token(rest) {
            return Err(bad());
        }
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(bad)?;
            if h.parse::<std::net::Ipv6Addr>().is_err() {
                return Err(bad());
            }
            (format!("[{h}]"), after.strip_prefix(':'))
        } else {
            match rest.split_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (rest.to_string(), None),
            }
        };
        let port = match port {
            None => 443,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => n,
                _ => return Err(bad()),
            },
        };
        if host.is_empty() {
            return Err(bad());
        }
        Ok(ApiServer {
            url: format!("https://{rest}"),
            endpoint: format!("{host}:{port}"),
        })
    }
}
