//! Presets: named waiter definitions kept as data (docs/engine.md §4), like botocore's
//! `waiters-2.json`.
//!
//! A preset is a JSON file under `presets/` (compiled in) or in the operator's
//! `--presets-dir`:
//!
//! ```json
//! {
//!   "name": "latitude.server",
//!   "description": "…",
//!   "params": {
//!     "base_url":  { "description": "…", "kind": "base_url", "default": "https://api.latitude.sh" },
//!     "server_id": { "description": "…", "example": "sv_VLMmAD8EOwop2" }
//!   },
//!   "request": { "target": { "url": "{base_url}/servers/{server_id}" }, "state": "…", … }
//! }
//! ```
//!
//! `request` is a create request with `{param}` placeholders in its strings (`{{` and
//! `}}` are literal braces). A create request naming the preset gets the template
//! filled in with its `params` (or their defaults), then its own fields laid over it:
//! objects (`target`, `target.headers`, `poll`, `retry`, `labels`) merge key by key,
//! everything else (arrays included) is replaced. The result is validated by
//! [`Spec::from_request`] like any other request, so a preset can never make a
//! request mean something a hand-written one could not. The engine knows nothing of
//! presets.
//!
//! How a value is written into a string depends on where the string is:
//! - in `target.url`, a `segment` parameter is percent-encoded (so `a/b` stays one
//!   path segment and cannot climb out of the template); `base_url`, `url` and `path`
//!   parameters are checked and inserted as they are;
//! - in a JSONPath (`state` or `error` starting with `$`), the value is escaped for a
//!   single-quoted string literal;
//! - elsewhere it is inserted as it is.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::engine::spec::close;
use crate::engine::{FieldError, Limits, Spec};

mod fill;
use fill::{check_value, collect_placeholders, fill, is_param_name};

/// The built-in presets, compiled in from `presets/`.
const BUILTIN: &[(&str, &str)] = &[
    (
        "azure.aks_machine",
        include_str!("../presets/azure.aks_machine.json"),
    ),
    (
        "github.workflow_run",
        include_str!("../presets/github.workflow_run.json"),
    ),
    (
        "dns.resolves_to",
        include_str!("../presets/dns.resolves_to.json"),
    ),
    ("grpc.serving", include_str!("../presets/grpc.serving.json")),
    ("http.ok", include_str!("../presets/http.ok.json")),
    ("http.status", include_str!("../presets/http.status.json")),
    (
        "kubernetes.condition",
        include_str!("../presets/kubernetes.condition.json"),
    ),
    (
        "kubernetes.deleted",
        include_str!("../presets/kubernetes.deleted.json"),
    ),
    (
        "kubernetes.job",
        include_str!("../presets/kubernetes.job.json"),
    ),
    (
        "kubernetes.rollout",
        include_str!("../presets/kubernetes.rollout.json"),
    ),
    (
        "latitude.kubernetes_cluster",
        include_str!("../presets/latitude.kubernetes_cluster.json"),
    ),
    (
        "latitude.server",
        include_str!("../presets/latitude.server.json"),
    ),
    (
        "latitude.server_off",
        include_str!("../presets/latitude.server_off.json"),
    ),
    (
        "latitude.virtual_machine",
        include_str!("../presets/latitude.virtual_machine.json"),
    ),
    ("tcp.open", include_str!("../presets/tcp.open.json")),
    (
        "tls.valid_for",
        include_str!("../presets/tls.valid_for.json"),
    ),
];

/// How a parameter's value is checked, and written into `target.url`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ParamKind {
    /// Any non-empty text; percent-encoded in `target.url` (an id, a name).
    #[default]
    Segment,
    /// An absolute path starting with `/` (no `?` or `#`), inserted as it is.
    Path,
    /// An http or https URL without query or fragment, inserted without its trailing
    /// `/`: the host (and path prefix) the template's paths are appended to.
    BaseUrl,
    /// A whole http or https URL, inserted as it is.
    Url,
    /// An HTTP status code, 100 to 599, inserted as digits (into a condition).
    Status,
    /// A duration as CEL's `duration()` reads it, without a sign: numbers with units
    /// `h`, `m`, `s`, `ms`, `us`, `ns` (`5m`, `90s`, `1h30m`, `1.5h`), or `0`.
    Duration,
    /// A host and a port, `host:port` (`db.internal:5432`, `[::1]:443`), inserted as
    /// it is: the address of a `tcp://`, `tls://` or `grpc://` target.
    Address,
    /// A whole number from 0 to 1,000,000, inserted as digits (into a condition).
    Count,
    /// The name of one of the tenant's event sources, or empty for none: a
    /// template object holding the parameter as a whole value (`"{source}"`) is
    /// left out when it is empty, so that the wait listens only when asked.
    Source,
}

/// One parameter of a preset.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Param {
    /// What to pass.
    pub description: String,
    /// Used when the request does not give the parameter; without one the parameter
    /// is required.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
    /// A sample value, for documentation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub example: Option<String>,
    pub kind: ParamKind,
    /// True when the parameter has no default.
    pub required: bool,
}

/// A named waiter definition.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Preset {
    /// The name a request gives as `preset`, e.g. `latitude.server`.
    pub name: String,
    /// What the preset waits for, and how it reads the target.
    pub description: String,
    /// The parameters, by name.
    pub params: BTreeMap<String, Param>,
    /// The create request it stands for, with `{param}` placeholders.
    #[schema(value_type = Object)]
    pub request: Value,
}

/// A preset file, as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PresetFile {
    name: String,
    description: String,
    #[serde(default)]
    params: BTreeMap<String, ParamFile>,
    request: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamFile {
    description: String,
    #[serde(default)]
    default: Option<String>,
    #[serde(default)]
    example: Option<String>,
    #[serde(default)]
    kind: ParamKind,
}

/// A preset as `GET /presets` lists it: without its request template.
#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct PresetSummary {
    pub name: String,
    pub description: String,
    pub params: BTreeMap<String, Param>,
}

sentence_error! {
    /// Why a preset file is refused; the sentence follows its file's name ("the
    /// preset file x.json …").
    pub struct PresetError;
}

impl Preset {
    pub fn summary(&self) -> PresetSummary {
        PresetSummary {
            name: self.name.clone(),
            description: self.description.clone(),
            params: self.params.clone(),
        }
    }

    /// Parses and checks one preset file. `expected_name` is the name the file must
    /// carry (its file name without `.json`).
    pub fn parse(text: &str, expected_name: &str) -> Result<Preset, PresetError> {
        let file: PresetFile =
            serde_json::from_str(text).map_err(|e| format!("is not a valid preset: {e}"))?;
        let preset = Preset {
            name: file.name,
            description: file.description,
            params: file
                .params
                .into_iter()
                .map(|(k, p)| {
                    let param = Param {
                        required: p.default.is_none(),
                        description: p.description,
                        default: p.default,
                        example: p.example,
                        kind: p.kind,
                    };
                    (k, param)
                })
                .collect(),
            request: file.request,
        };
        if preset.name != expected_name {
            return Err(format!(
                "names the preset \"{}\", but its file name says \"{expected_name}\"; make them agree",
                preset.name
            ).into());
        }
        if preset.name.is_empty()
            || preset.name.len() > 100
            || !preset
                .name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
        {
            return Err(format!(
                "has the name \"{}\"; a preset name is 1 to 100 characters of a-z, 0-9, '.', '_' and '-'",
                preset.name
            ).into());
        }
        for (name, p) in &preset.params {
            if !is_param_name(name) {
                return Err(format!(
                    "has a parameter \"{name}\"; parameter names are a-z, 0-9 and '_', starting with a letter"
                ).into());
            }
            if name == "base_url" && p.kind != ParamKind::BaseUrl {
                return Err(
                    "declares base_url without \"kind\": \"base_url\"; base_url is always a host to append paths to"
                        .into(),
                );
            }
            for (what, v) in [("default", &p.default), ("example", &p.example)] {
                if let Some(v) = v {
                    check_value(p.kind, v)
                        .map_err(|e| format!("has a {what} for parameter {name} that {e}"))?;
                }
            }
        }
        let Value::Object(request) = &preset.request else {
            return Err("has a request that is not a JSON object".into());
        };
        for reserved in ["preset", "params"] {
            if request.contains_key(reserved) {
                return Err(format!(
                    "has \"{reserved}\" in its request; a preset cannot name another preset"
                )
                .into());
            }
        }
        let mut used = Vec::new();
        collect_placeholders(&preset.request, &mut used)?;
        for u in &used {
            if !preset.params.contains_key(u) {
                return Err(format!(
                    "uses {{{u}}} in its request, but declares no parameter \"{u}\""
                )
                .into());
            }
        }
        for name in preset.params.keys() {
            if !used.contains(name) {
                return Err(format!(
                    "declares the parameter \"{name}\", but its request never uses {{{name}}}"
                )
                .into());
            }
        }
        Ok(preset)
    }

    /// The request with the parameters filled in (defaults for those not given). The
    /// caller has checked `values` with [`Registry::apply`].
    fn fill(&self, values: &HashMap<String, String>) -> Value {
        fill(&self.request, "", &self.params, values)
    }

    /// Sample parameters: each one's example, else its default, else "x".
    fn sample_params(&self) -> HashMap<String, String> {
        self.params
            .iter()
            .map(|(k, p)| {
                let v = p
                    .example
                    .clone()
                    .or_else(|| p.default.clone())
                    .unwrap_or_else(|| "x".into());
                (k.clone(), v)
            })
            .collect()
    }

    /// Validates the preset's request, filled with sample parameters, as a create
    /// request: a preset that could never make a valid wait is a mistake.
    pub fn check(&self, limits: &Limits) -> Result<(), Vec<FieldError>> {
        Spec::from_request(&self.fill(&self.sample_params()), limits).map(|_| ())
    }
}

/// The presets a server knows: the built-in ones and those of `--presets-dir`.
#[derive(Clone, Debug)]
pub struct Registry {
    presets: BTreeMap<String, Preset>,
}

impl Registry {
    /// The built-in presets only.
    pub fn builtin() -> Registry {
        let presets = BUILTIN
            .iter()
            .map(|(name, text)| {
                let p = Preset::parse(text, name)
                    .unwrap_or_else(|e| panic!("built-in preset presets/{name}.json {e}"));
                (name.to_string(), p)
            })
            .collect();
        Registry { presets }
    }

    /// The built-in presets plus every `*.json` file of `dir` (a file whose name
    /// equals a built-in one replaces it). Each file from `dir` is also validated as a
    /// request against `limits` with sample parameters. Any problem is an error
    /// naming the file.
    pub fn load(
        dir: Option<&Path>,
        limits: &Limits,
    ) -> Result<Registry, crate::config::SettingError> {
        Registry::load_dir(dir, limits)
    }

    fn load_dir(
        dir: Option<&Path>,
        limits: &Limits,
    ) -> Result<Registry, crate::config::SettingError> {
        let mut reg = Registry::builtin();
        let Some(dir) = dir else {
            return Ok(reg);
        };
        let entries = std::fs::read_dir(dir)
            .map_err(|e| format!("cannot read the presets directory {}: {e}", dir.display()))?;
        let mut files: Vec<std::path::PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
            .collect();
        files.sort();
        for path in files {
            let shown = path.display();
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .ok_or_else(|| format!("the preset file {shown} has a name that is not UTF-8"))?;
            let text = std::fs::read_to_string(&path)
                .map_err(|e| format!("cannot read the preset file {shown}: {e}"))?;
            let preset =
                Preset::parse(&text, stem).map_err(|e| format!("the preset file {shown} {e}"))?;
            preset.check(limits).map_err(|errs| {
                let list: Vec<String> = errs
                    .iter()
                    .map(|e| format!("{} {}", e.field, e.message))
                    .collect();
                format!(
                    "the preset file {shown} does not make a valid wait request: {}",
                    list.join("; ")
                )
            })?;
            if reg.presets.contains_key(stem) {
                tracing::info!(preset = stem, file = %shown, "a preset file replaces the built-in preset");
            }
            reg.presets.insert(stem.to_string(), preset);
        }
        Ok(reg)
    }

    pub fn get(&self, name: &str) -> Option<&Preset> {
        self.presets.get(name)
    }

    /// Every preset, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Preset> {
        self.presets.values()
    }

    /// Turns a create request that names a preset into the plain request it stands
    /// for: the preset's template with its parameters filled in, and the request's
    /// own fields laid over it. A request without `preset` and `params` comes back as
    /// it is. The errors name `preset` or `params.<name>`.
    pub fn apply<'a>(&self, request: &'a Value) -> Result<Cow<'a, Value>, Vec<FieldError>> {
        let Some(obj) = request.as_object() else {
            return Ok(Cow::Borrowed(request));
        };
        // A null is "not given", as for every other field.
        let preset_v = obj.get("preset").filter(|v| !v.is_null());
        let params_v = obj.get("params").filter(|v| !v.is_null());
        if preset_v.is_none() && params_v.is_none() {
            if !obj.contains_key("preset") && !obj.contains_key("params") {
                return Ok(Cow::Borrowed(request));
            }
            let mut plain = obj.clone();
            plain.remove("preset");
            plain.remove("params");
            return Ok(Cow::Owned(Value::Object(plain)));
        }
        let err = |field: &str, message: String| {
            vec![FieldError {
                field: field.to_string(),
                message,
            }]
        };
        let preset = match preset_v {
            None => {
                return Err(err(
                    "params",
                    "is given without a preset; name one with \"preset\" (GET /presets lists them), or leave params out".into(),
                ));
            }
            Some(Value::String(name)) => self.get(name).ok_or_else(|| {
                let shown: String = name.chars().take(100).collect();
                let hint = self
                    .presets
                    .keys()
                    .find(|k| close(k, name))
                    .map(|k| format!(" (did you mean \"{k}\"?)"))
                    .unwrap_or_default();
                err(
                    "preset",
                    format!(
                        "\"{shown}\" is not a preset of this server{hint}; the presets are {} (GET /presets describes them)",
                        self.names().join(", ")
                    ),
                )
            })?,
            Some(_) => {
                return Err(err(
                    "preset",
                    "must be a string naming a preset, such as \"latitude.server\"".into(),
                ));
            }
        };
        let given = match params_v {
            None => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(_) => {
                return Err(err(
                    "params",
                    format!(
                        "must be an object of parameter names to values, e.g. {{\"{}\": \"…\"}}",
                        preset.params.keys().next().map_or("id", |k| k.as_str())
                    ),
                ));
            }
        };

        let mut errors = Vec::new();
        let mut values: HashMap<String, String> = HashMap::new();
        for (name, v) in &given {
            let shown: String = name.chars().take(64).collect();
            let field = format!("params.{shown}");
            let Some(def) = preset.params.get(name) else {
                let hint = preset
                    .params
                    .keys()
                    .find(|k| close(k, name))
                    .map(|k| format!(" (did you mean \"{k}\"?)"))
                    .unwrap_or_default();
                errors.push(FieldError {
                    field,
                    message: format!(
                        "is not a parameter of preset {}{hint}; its parameters are {}",
                        preset.name,
                        preset.params.keys().cloned().collect::<Vec<_>>().join(", ")
                    ),
                });
                continue;
            };
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Number(_) | Value::Bool(_) => v.to_string(),
                _ => {
                    errors.push(FieldError {
                        field,
                        message: "must be a string (numbers and booleans are taken as their text)"
                            .into(),
                    });
                    continue;
                }
            };
            match check_value(def.kind, &text) {
                Ok(()) => {
                    values.insert(name.clone(), text);
                }
                Err(e) => errors.push(FieldError {
                    field,
                    message: e.0,
                }),
            }
        }
        for (name, def) in &preset.params {
            if given.contains_key(name) {
                continue;
            }
            match &def.default {
                Some(d) => {
                    values.insert(name.clone(), d.clone());
                }
                None => errors.push(FieldError {
                    field: format!("params.{name}"),
                    message: format!(
                        "is required by preset {}: {}{}",
                        preset.name,
                        def.description,
                        def.example
                            .as_ref()
                            .map(|e| format!(" (e.g. \"{e}\")"))
                            .unwrap_or_default()
                    ),
                }),
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }

        let mut merged = preset.fill(&values);
        let overlay: Map<String, Value> = obj
            .iter()
            .filter(|(k, _)| *k != "preset" && *k != "params")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        merge(&mut merged, &Value::Object(overlay));
        Ok(Cow::Owned(merged))
    }

    fn names(&self) -> Vec<String> {
        self.presets.keys().cloned().collect()
    }
}

/// Lays `overlay` over `base`: objects merge key by key (recursively), anything else
/// replaces. A `null` in the overlay replaces too, which the request parser reads as
/// "not given": that is how a request drops a preset's optional field.
pub fn merge(base: &mut Value, overlay: &Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(k) {
                    Some(slot) if slot.is_object() && v.is_object() => merge(slot, v),
                    _ => {
                        b.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (b, o) => *b = o.clone(),
    }
}

#[cfg(test)]
mod tests;
