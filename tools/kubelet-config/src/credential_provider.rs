//! kubelet's image credential provider plugins, registered as kubelet v1.36 does at start:
//! the stand-in kubelet runs this, and `kiln render` checks node.toml's
//! `[[kubelet.credential_provider]]` with the same [`decode`] and [`validate`] (one owner).
//!
//! Sources, kubernetes v1.36 (as vendored by openshift/microshift, `kubernetes=1.36.2`):
//!
//! - `pkg/kubelet/kuberuntime/kuberuntime_manager.go`: if either
//!   `--image-credential-provider-config` or `--image-credential-provider-bin-dir` is set,
//!   `RegisterCredentialProviderPlugins` runs; its error is logged as `"Failed to register CRI
//!   auth plugins"` and kubelet exits 1. Both are flags only: KubeletConfiguration has no field
//!   for them, and neither is deprecated.
//! - `pkg/credentialprovider/plugin/plugin.go` (`RegisterCredentialProviderPlugins`): the bin
//!   dir must exist; the config is read, validated, then each provider's binary is looked up
//!   with `exec.LookPath(filepath.Join(binDir, name))`, which for a path with a `/` returns ""
//!   on failure, so the message names no path (`plugin binary executable  did not exist`).
//! - `pkg/credentialprovider/plugin/config.go` (`readCredentialProviderConfig`, `decode`,
//!   `validateCredentialProviderConfig`): a file, or since v1.34 a directory whose
//!   `*.json`/`*.yaml`/`*.yml` entries are read in sorted order; decoded strictly (an unknown
//!   field is an error: the codec factory is `serializer.EnableStrict`); a provider name twice
//!   across files is an error; then the field rules below, reported together.

use std::path::Path;

use serde_json::{Map, Value};

use crate::go_syntax::{format_duration, is_qualified_name, schemeless_url};
use crate::validate::aggregate;

/// The config file's group (`kubelet.config.k8s.io`) and the versions the plugin scheme
/// registers (`staging/src/k8s.io/kubelet/config/{v1,v1beta1,v1alpha1}/register.go`).
pub const CONFIG_API_VERSIONS: [&str; 3] = [
    "kubelet.config.k8s.io/v1",
    "kubelet.config.k8s.io/v1alpha1",
    "kubelet.config.k8s.io/v1beta1",
];
/// The config file's kind.
pub const CONFIG_KIND: &str = "CredentialProviderConfig";
/// The exec plugin API versions a provider may speak (`plugin.go`, `apiVersions`), sorted as
/// kubelet lists them in its `Unsupported value` message.
pub const PROVIDER_API_VERSIONS: [&str; 3] = [
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
];
/// `tokenAttributes.cacheType` values (`validCacheTypes`).
const CACHE_TYPES: [&str; 2] = ["ServiceAccount", "Token"];

/// One provider of a decoded config, as validation needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    /// `name`: also the binary's file name in the bin dir.
    pub name: String,
    /// `matchImages`.
    pub match_images: Vec<String>,
    /// `defaultCacheDuration` in nanoseconds, when given.
    pub default_cache_duration: Option<i128>,
    /// `apiVersion`.
    pub api_version: String,
    /// `tokenAttributes`, when given.
    pub token_attributes: Option<Map<String, Value>>,
}

/// kubelet's decode error without the document it echoes (`Object 'Kind' is missing in
/// '{…}'` prints the whole file, a provider's `env` values included): for kiln's own messages,
/// which may end up in CI logs; the stand-in prints kubelet's text as it is.
pub fn error_without_document(e: &str) -> String {
    match e.find("Object 'Kind' is missing in '") {
        Some(i) => format!(
            "{}Object 'Kind' is missing (the document is not shown)",
            &e[..i]
        ),
        None => e.to_string(),
    }
}

/// `decode(data)`: one file's providers. `Err` is kubelet's error text.
pub fn decode(text: &str) -> Result<Vec<Provider>, String> {
    let (value, dups) = crate::tree(text)?;
    let Value::Object(top) = &value else {
        return Err(format!("Object 'Kind' is missing in '{value}'"));
    };
    let kind = top.get("kind").and_then(Value::as_str).unwrap_or("");
    let api = top.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    if kind.is_empty() {
        return Err(format!("Object 'Kind' is missing in '{value}'"));
    }
    if !CONFIG_API_VERSIONS.contains(&api) || kind != CONFIG_KIND {
        return Err(format!(
            "no kind \"{kind}\" is registered for version \"{api}\" in scheme \"pkg/credentialprovider/plugin/plugin.go:69\""
        ));
    }
    let v1 = api == CONFIG_API_VERSIONS[0];
    let mut strict: Vec<String> = crate::duplicate_keys_error(&dups).into_iter().collect();
    let mut unknown = |path: String| strict.push(format!("unknown field \"{path}\""));
    for k in top.keys() {
        if !["apiVersion", "kind", "providers"].contains(&k.as_str()) {
            unknown(k.clone());
        }
    }
    let mut out = Vec::new();
    let providers = match top.get("providers") {
        None | Some(Value::Null) => &Vec::new(),
        Some(Value::Array(a)) => a,
        Some(v) => {
            return Err(unmarshal(
                v,
                "CredentialProviderConfig.providers",
                "[]v1.CredentialProvider",
            ))
        }
    };
    for (i, p) in providers.iter().enumerate() {
        out.push(decode_provider(i, p, v1, &mut unknown)?);
    }
    if strict.is_empty() {
        Ok(out)
    } else {
        // apimachinery runtime.NewStrictDecodingError: fatal here (decode returns it).
        Err(format!("strict decoding error: {}", strict.join(", ")))
    }
}

/// One entry of `providers`: its fields typed, the ones it does not know reported to
/// `unknown` (Go's path, `providers[i].field`).
fn decode_provider(
    i: usize,
    p: &Value,
    v1: bool,
    unknown: &mut impl FnMut(String),
) -> Result<Provider, String> {
    let Value::Object(p) = p else {
        return Err(unmarshal(
            p,
            "CredentialProviderConfig.providers",
            "v1.CredentialProvider",
        ));
    };
    let mut allowed = vec![
        "name",
        "matchImages",
        "defaultCacheDuration",
        "apiVersion",
        "args",
        "env",
    ];
    if v1 {
        allowed.push("tokenAttributes");
    }
    for k in p.keys() {
        if !allowed.contains(&k.as_str()) {
            unknown(format!("providers[{i}].{k}"));
        }
    }
    let string = |field: &str| -> Result<String, String> {
        match p.get(field) {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(v) => Err(unmarshal(
                v,
                &format!("CredentialProvider.providers.{field}"),
                "string",
            )),
        }
    };
    let strings = |field: &str| -> Result<Vec<String>, String> {
        match p.get(field) {
            None | Some(Value::Null) => Ok(Vec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(unmarshal(
                        v,
                        &format!("CredentialProvider.providers.{field}"),
                        "string",
                    )),
                })
                .collect(),
            Some(v) => Err(unmarshal(
                v,
                &format!("CredentialProvider.providers.{field}"),
                "[]string",
            )),
        }
    };
    let name = string("name")?;
    let match_images = strings("matchImages")?;
    strings("args")?;
    let default_cache_duration = match p.get("defaultCacheDuration") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(crate::units::parse_duration(s)?),
        Some(v) => {
            return Err(unmarshal(
                v,
                "CredentialProvider.providers.defaultCacheDuration",
                "string",
            ))
        }
    };
    if let Some(env) = p.get("env") {
        let Value::Array(env) = env else {
            return Err(unmarshal(
                env,
                "CredentialProvider.providers.env",
                "[]v1.ExecEnvVar",
            ));
        };
        for (j, e) in env.iter().enumerate() {
            let Value::Object(e) = e else {
                return Err(unmarshal(
                    e,
                    "CredentialProvider.providers.env",
                    "v1.ExecEnvVar",
                ));
            };
            for (k, v) in e {
                if k != "name" && k != "value" {
                    unknown(format!("providers[{i}].env[{j}].{k}"));
                } else if !v.is_string() {
                    return Err(unmarshal(
                        v,
                        &format!("ExecEnvVar.providers.env.{k}"),
                        "string",
                    ));
                }
            }
        }
    }
    let token_attributes = match p.get("tokenAttributes") {
        None | Some(Value::Null) => None,
        Some(Value::Object(t)) => Some(t.clone()),
        Some(v) => {
            return Err(unmarshal(
                v,
                "CredentialProvider.providers.tokenAttributes",
                "v1.ServiceAccountTokenAttributes",
            ))
        }
    };
    Ok(Provider {
        name,
        match_images,
        default_cache_duration,
        api_version: string("apiVersion")?,
        token_attributes,
    })
}

/// encoding/json's type error, as the strict JSON decoder words it.
fn unmarshal(v: &Value, field: &str, go_type: &str) -> String {
    let what = match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    format!("json: cannot unmarshal {what} into Go struct field {field} of type {go_type}")
}

/// `validateCredentialProviderConfig`: every field error, in kubelet's order and words
/// (apimachinery `field.Error`; the path is `providers.<field>`, with no index, as kubelet
/// builds it). `token_gate` is the `KubeletServiceAccountTokenForCredentialProviders` feature
/// gate (beta, on by default since v1.34).
pub fn validate(providers: &[Provider], token_gate: bool) -> Vec<String> {
    let mut errs = Vec::new();
    if providers.is_empty() {
        errs.push("providers: Required value: at least 1 item in plugins is required".to_string());
    }
    let mut seen: Vec<&str> = Vec::new();
    for p in providers {
        let n = p.name.as_str();
        let invalid = |why: &str| format!("providers.name: Invalid value: {n:?}: {why}");
        if n.contains('/') {
            errs.push(invalid("provider name cannot contain '/'"));
        }
        if n.contains(' ') {
            errs.push(invalid("provider name cannot contain spaces"));
        }
        if n == "." {
            errs.push(invalid("provider name cannot be '.'"));
        }
        if n == ".." {
            errs.push(invalid("provider name cannot be '..'"));
        }
        if seen.contains(&n) {
            errs.push(format!("providers.name: Duplicate value: {n:?}"));
        }
        seen.push(n);
        if p.api_version.is_empty() {
            errs.push("providers.apiVersion: Required value".to_string());
        } else if !PROVIDER_API_VERSIONS.contains(&p.api_version.as_str()) {
            errs.push(format!(
                "providers.apiVersion: Unsupported value: {:?}: supported values: {}",
                p.api_version,
                quoted(&PROVIDER_API_VERSIONS)
            ));
        }
        if p.match_images.is_empty() {
            errs.push(
                "providers.matchImages: Required value: at least 1 item in matchImages is required"
                    .to_string(),
            );
        }
        for m in &p.match_images {
            if let Err(e) = schemeless_url(m) {
                errs.push(format!(
                    "providers.matchImages: Invalid value: {m:?}: match image is invalid: {e}"
                ));
            }
        }
        match p.default_cache_duration {
            None => errs.push("providers.defaultCacheDuration: Required value".to_string()),
            Some(d) if d < 0 => errs.push(format!(
                "providers.defaultCacheDuration: Invalid value: \"{}\": must be greater than or equal to 0",
                format_duration(d)
            )),
            Some(_) => {}
        }
        if let Some(t) = &p.token_attributes {
            errs.extend(token_attributes(t, &p.api_version, token_gate));
        }
    }
    errs
}

/// The `tokenAttributes` rules (service-account tokens for providers, KEP-4412).
fn token_attributes(t: &Map<String, Value>, api: &str, gate: bool) -> Vec<String> {
    let mut errs = Vec::new();
    let f = "providers.tokenAttributes";
    if !gate {
        errs.push(format!("{f}: Forbidden: tokenAttributes is not supported when KubeletServiceAccountTokenForCredentialProviders feature gate is disabled"));
    }
    if t.get("serviceAccountTokenAudience")
        .and_then(Value::as_str)
        .unwrap_or("")
        .is_empty()
    {
        errs.push(format!("{f}.serviceAccountTokenAudience: Required value"));
    }
    let require = t.get("requireServiceAccount").and_then(Value::as_bool);
    if require.is_none() {
        errs.push(format!("{f}.requireServiceAccount: Required value"));
    }
    if api != PROVIDER_API_VERSIONS[0] {
        errs.push(format!(
            "{f}: Forbidden: tokenAttributes is only supported for {} API version",
            PROVIDER_API_VERSIONS[0]
        ));
    }
    let keys = |k: &str| -> Vec<String> {
        t.get(k)
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let (required, optional) = (
        keys("requiredServiceAccountAnnotationKeys"),
        keys("optionalServiceAccountAnnotationKeys"),
    );
    if require == Some(false) && !required.is_empty() {
        errs.push(format!("{f}.requiredServiceAccountAnnotationKeys: Forbidden: requireServiceAccount cannot be false when requiredServiceAccountAnnotationKeys is set"));
    }
    for (field, list) in [
        ("requiredServiceAccountAnnotationKeys", &required),
        ("optionalServiceAccountAnnotationKeys", &optional),
    ] {
        let mut seen: Vec<&str> = Vec::new();
        for k in list {
            if !is_qualified_name(&k.to_lowercase()) {
                errs.push(format!("{f}.{field}: Invalid value: {k:?}: name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
            }
            if seen.contains(&k.as_str()) {
                errs.push(format!("{f}.{field}: Duplicate value: {k:?}"));
            }
            seen.push(k);
        }
    }
    let mut both: Vec<&String> = required.iter().filter(|k| optional.contains(k)).collect();
    both.sort();
    both.dedup();
    if !both.is_empty() {
        errs.push(format!(
            "{f}: Invalid value: {both:?}: annotation keys cannot be both required and optional"
        ));
    }
    match t.get("cacheType").and_then(Value::as_str).unwrap_or("") {
        "" => errs.push(format!("{f}.cacheType: Required value: cacheType is required to be set when tokenAttributes is specified. Supported values are: ServiceAccount, Token")),
        c if CACHE_TYPES.contains(&c) => {}
        c => errs.push(format!(
            "{f}.cacheType: Unsupported value: {c:?}: supported values: {}",
            quoted(&CACHE_TYPES)
        )),
    }
    errs
}

/// `"a", "b"`: how apimachinery lists supported values.
fn quoted(values: &[&str]) -> String {
    values
        .iter()
        .map(|v| format!("{v:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `RegisterCredentialProviderPlugins(config, binDir)`, as a whole: `Ok` is the providers'
/// names in order; `Err` is the error kubelet logs before it exits 1.
pub fn register(config: &str, bin_dir: &str, token_gate: bool) -> Result<Vec<String>, String> {
    match std::fs::metadata(bin_dir) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("plugin binary directory {bin_dir} did not exist"))
        }
        Err(e) => return Err(format!("error inspecting binary directory {bin_dir}: {e}")),
    }
    if config.is_empty() {
        return Err("credential provider config path is empty".into());
    }
    let meta = std::fs::metadata(config).map_err(|e| {
        format!(
            "unable to access path {config:?}: stat {config}: {}",
            go_io(&e)
        )
    })?;
    let files: Vec<String> = if meta.is_dir() {
        let mut files: Vec<String> = std::fs::read_dir(config)
            .map_err(|e| format!("unable to read directory {config:?}: {e}"))?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .map(|e| e.path().to_string_lossy().into_owned())
            .filter(|p| {
                Path::new(p)
                    .extension()
                    .is_some_and(|x| x == "json" || x == "yaml" || x == "yml")
            })
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(format!(
                "no configuration files found in directory {config:?}"
            ));
        }
        files
    } else {
        vec![config.to_string()]
    };
    let mut providers: Vec<Provider> = Vec::new();
    for f in &files {
        let data = std::fs::read(f)
            .map_err(|e| format!("unable to read file {f:?}: open {f}: {}", go_io(&e)))?;
        let decoded = decode(&String::from_utf8_lossy(&data))
            .map_err(|e| format!("error decoding config {f:?}: {e}"))?;
        for p in decoded {
            if providers.iter().any(|q| q.name == p.name) {
                return Err(format!(
                    "duplicate provider name {:?} found in configuration file(s)",
                    p.name
                ));
            }
            providers.push(p);
        }
    }
    let errs = validate(&providers, token_gate);
    if !errs.is_empty() {
        return Err(format!(
            "failed to validate credential provider config: {}",
            aggregate(&errs)
        ));
    }
    for p in &providers {
        let bin = Path::new(bin_dir).join(&p.name);
        // exec.LookPath of a path with a slash: "" and the error (findExecutable).
        match std::fs::metadata(&bin) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err("plugin binary executable  did not exist".into())
            }
            Err(e) => {
                return Err(format!(
                    "error inspecting binary executable : exec: {:?}: {}",
                    bin.display().to_string(),
                    go_io(&e)
                ))
            }
            Ok(m) if m.is_dir() => {
                return Err(format!(
                    "error inspecting binary executable : exec: {:?}: is a directory",
                    bin.display().to_string()
                ))
            }
            Ok(m) if !executable(&m) => {
                return Err(format!(
                    "error inspecting binary executable : exec: {:?}: permission denied",
                    bin.display().to_string()
                ))
            }
            Ok(_) => {}
        }
    }
    Ok(providers.into_iter().map(|p| p.name).collect())
}

#[cfg(unix)]
fn executable(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    m.permissions().mode() & 0o111 != 0
}

#[cfg(not(unix))]
fn executable(_m: &std::fs::Metadata) -> bool {
    true
}

/// An I/O error as Go words it (`no such file or directory`, without Rust's `(os error 2)`).
fn go_io(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_lowercase(),
        None => s,
    }
}

#[cfg(test)]
#[path = "credential_provider_tests.rs"]
mod tests;
