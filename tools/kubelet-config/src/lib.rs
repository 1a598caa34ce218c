//! kubelet's `KubeletConfiguration` rules, in one place: the stand-in kubelet
//! (`tools/standin-kubelet`) runs with them, and `kiln render` checks a node's kubelet
//! drop-in with them before a node ever sees it (issue 37: one owner for these rules).
//!
//! Loading `--config` as kubelet does (kubernetes/kubernetes):
//!
//! - `pkg/kubelet/kubeletconfig/configfiles/configfiles.go`: read the file; an empty file
//!   is an error (`kubelet config file %q was empty`);
//! - `pkg/kubelet/kubeletconfig/util/codec/codec.go` (`DecodeKubeletConfiguration`): decode
//!   strictly; if that fails with a strict-only error (an unknown field, a duplicate key),
//!   log `"Using lenient decoding as strict decoding failed"` and carry on with the lenient
//!   result; any other error (a wrong type, unparseable YAML, a wrong apiVersion or kind)
//!   is fatal (`failed to decode: …`);
//! - apimachinery's JSON/YAML serializer: YAML becomes JSON first (sigs.k8s.io/yaml), and
//!   in strict mode `YAMLToJSONStrict` reports duplicate keys and `UnmarshalStrict`
//!   unknown fields, joined after `strict decoding error: `;
//! - `cmd/kubelet/app/server.go` (`NewKubeletCommand`, `loadConfigFile`) wraps the
//!   result: `failed to load kubelet config file, path: P, error: failed to load Kubelet
//!   config file P, error …`.
//!
//! The drop-in directory (`--config-dir`) is [`dropin`].

pub mod credential_provider;
pub mod dropin;
pub mod feature_gates;
pub mod go_syntax;
pub mod types;
pub mod units;
pub mod validate;

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde::Deserializer;
use serde_json::{Map, Value};

pub use types::KubeletConfiguration;

/// The group/version and kind kubelet's scheme registers (`pkg/kubelet/apis/config/v1beta1`).
pub const API_VERSION: &str = "kubelet.config.k8s.io/v1beta1";
pub const KIND: &str = "KubeletConfiguration";

/// A decoded configuration, and the strict decoding error kubelet logged on the way.
#[derive(Debug)]
pub struct Loaded {
    pub config: KubeletConfiguration,
    pub lenient: Option<String>,
    /// The document as the JSON tree it was decoded from (drop-ins merge into it).
    pub tree: Value,
}

/// `loadConfigFile(path)`: `Err` is the whole error kubelet returns.
pub fn load(path: &str) -> Result<Loaded, String> {
    let wrap = |e: String| {
        format!(
            "failed to load kubelet config file, path: {path}, error: failed to load Kubelet config file {path}, error {e}"
        )
    };
    let data = std::fs::read(path).map_err(|e| {
        let what = if e.kind() == std::io::ErrorKind::NotFound {
            "no such file or directory".to_string()
        } else {
            e.to_string()
        };
        wrap(format!(
            "failed to read kubelet config file \"{path}\", error: open {path}: {what}"
        ))
    })?;
    if data.is_empty() {
        return Err(wrap(format!("kubelet config file \"{path}\" was empty")));
    }
    decode(&String::from_utf8_lossy(&data)).map_err(wrap)
}

/// A document as sigs.k8s.io/yaml turns it into JSON: the tree, and the keys a mapping
/// repeated (the later value wins), each as its dotted path.
pub fn tree(text: &str) -> Result<(Value, Vec<String>), String> {
    let dups = RefCell::new(Vec::new());
    let de = serde_yaml_ng::Deserializer::from_str(text);
    let value = Tree {
        path: String::new(),
        dups: &dups,
    }
    .deserialize(de)
    .map_err(|e| format!("failed to decode: error converting YAML to JSON: yaml: {e}"))?;
    Ok((value, dups.into_inner()))
}

/// The type meta a KubeletConfiguration document must carry, checked on its tree.
pub fn type_meta(value: &Value) -> Result<(), String> {
    let Value::Object(obj) = value else {
        return Err(format!(
            "failed to decode: couldn't get version/kind; json parse error: json: cannot unmarshal {} into Go value of type struct {{ APIVersion string \"json:\\\"apiVersion,omitempty\\\"\"; Kind string \"json:\\\"kind,omitempty\\\"\" }}",
            json_kind(value)
        ));
    };
    check_type_meta(obj, value)
}

/// The YAML-to-JSON conversion's strict-only complaint about repeated keys, if any.
pub fn duplicate_keys_error(dups: &[String]) -> Option<String> {
    (!dups.is_empty()).then(|| {
        let lines: Vec<String> = dups
            .iter()
            .map(|k| format!("  key {k:?} already set in map"))
            .collect();
        format!(
            "error converting YAML to JSON: yaml: unmarshal errors:\n{}",
            lines.join("\n")
        )
    })
}

/// The typed configuration of a tree, and the fields it does not know (Go's paths).
pub fn typed(value: Value) -> Result<(KubeletConfiguration, Vec<String>), String> {
    let mut unknown = Vec::new();
    let config: KubeletConfiguration = serde_ignored::deserialize(value, |path| {
        // serde_ignored writes `?` for the Option around each field; Go's path has none.
        let path = path.to_string();
        let path: Vec<&str> = path.split('.').filter(|s| *s != "?").collect();
        unknown.push(path.join("."));
    })
    .map_err(|e| format!("json: {e}"))?;
    Ok((config, unknown))
}

/// `DecodeKubeletConfiguration`, on the file's text.
pub fn decode(text: &str) -> Result<Loaded, String> {
    let (value, dups) = tree(text)?;
    type_meta(&value)?;
    let (config, unknown) = typed(value.clone()).map_err(|e| format!("failed to decode: {e}"))?;
    let mut strict: Vec<String> = Vec::new();
    strict.extend(duplicate_keys_error(&dups));
    strict.extend(unknown.iter().map(|p| format!("unknown field \"{p}\"")));
    let lenient = (!strict.is_empty()).then(|| {
        // apimachinery runtime.NewStrictDecodingError
        format!("strict decoding error: {}", strict.join(", "))
    });
    Ok(Loaded {
        config,
        lenient,
        tree: value,
    })
}

/// apimachinery's `Object 'Kind' is missing` and the scheme's `no kind … is registered`.
fn check_type_meta(obj: &Map<String, Value>, whole: &Value) -> Result<(), String> {
    let field = |k: &str| obj.get(k).and_then(Value::as_str).unwrap_or("");
    let (version, kind) = (field("apiVersion"), field("kind"));
    if kind.is_empty() {
        return Err(format!(
            "failed to decode: Object 'Kind' is missing in '{whole}'"
        ));
    }
    if version.is_empty() {
        return Err(format!(
            "failed to decode: Object 'apiVersion' is missing in '{whole}'"
        ));
    }
    if version != API_VERSION || kind != KIND {
        return Err(format!(
            "failed to decode: no kind {kind:?} is registered for version {version:?} in scheme \"pkg/kubelet/apis/config/scheme/scheme.go\""
        ));
    }
    Ok(())
}

fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// YAML to a JSON tree, as sigs.k8s.io/yaml converts it, noting every key a mapping repeats
/// (the later value wins, as in the lenient conversion).
struct Tree<'a> {
    path: String,
    dups: &'a RefCell<Vec<String>>,
}

impl<'de> DeserializeSeed<'de> for Tree<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Tree<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom(format!("json: unsupported value: {v}")))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Tree {
            path: format!("{}[{}]", self.path, out.len()),
            dups: self.dups,
        })? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key_seed(Tree {
            path: self.path.clone(),
            dups: self.dups,
        })? {
            // sigs.k8s.io/yaml turns non-string keys into their text.
            let key = match key {
                Value::String(s) => s,
                other => other.to_string(),
            };
            let path = if self.path.is_empty() {
                key.clone()
            } else {
                format!("{}.{key}", self.path)
            };
            let value = map.next_value_seed(Tree {
                path: path.clone(),
                dups: self.dups,
            })?;
            if out.insert(key, value).is_some() {
                self.dups.borrow_mut().push(path);
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests;
