//! `target.auth`: a credential waitd obtains for itself and sends with every
//! poll, where a static header would expire before the wait ends.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::schema;
use super::target::check_url;
use super::{Errors, Limits, REDACTED, opt, type_name};

/// How waitd authenticates its polls of the target.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Auth {
    /// Bearer tokens minted by the OAuth 2.0 client-credentials grant (RFC 6749
    /// §4.4) and sent as `Authorization: Bearer …`.
    Oauth2(OAuth2),
    /// A credential the operator holds, by name (`--credentials-file`): only a
    /// tenant the operator lists for it may name it.
    Credential(String),
}

/// The client-credentials grant: where to mint tokens and as which client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OAuth2 {
    /// The token endpoint (http or https; the SSRF guard judges it as it judges
    /// targets).
    #[schema(value_type = schema::TargetUrl)]
    pub token_url: String,
    #[schema(
        min_length = 1,
        max_length = 256,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub client_id: String,
    /// Write-only: every read shows `<redacted>`.
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub client_secret: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub scope: Option<String>,
    /// Sent as the `audience` form field (Auth0 and others ask for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        min_length = 1,
        max_length = 1024,
        pattern = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$"
    )]
    pub audience: Option<String>,
    /// Further form fields of the token request (at most 8).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = Option<schema::FormParams>)]
    pub params: BTreeMap<String, String>,
    /// How the client authenticates to the token endpoint: `body` (the default:
    /// `client_id` and `client_secret` as form fields) or `basic` (HTTP Basic).
    #[serde(default, skip_serializing_if = "ClientAuth::is_body")]
    pub client_auth: ClientAuth,
}

/// Where the token request carries the client's credentials.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ClientAuth {
    /// `client_secret_post`: form fields of the request body.
    #[default]
    Body,
    /// `client_secret_basic`: an `Authorization: Basic` header.
    Basic,
}

impl ClientAuth {
    fn is_body(&self) -> bool {
        *self == ClientAuth::Body
    }
}

/// The name `client_secret` is sealed under, with the header values.
pub const SEALED_CLIENT_SECRET: &str = ":oauth2.client_secret";

/// Form fields waitd writes itself, which `params` cannot give.
const OWN_FIELDS: &[&str] = &[
    "grant_type",
    "client_id",
    "client_secret",
    "scope",
    "audience",
];

const MAX_PARAMS: usize = 8;
const MAX_ID: usize = 256;
const MAX_SECRET: usize = 1024;
const MAX_TEXT: usize = 1024;

impl Auth {
    /// Adds the write-only fields to `sealed` ([`super::Target::secrets`]).
    pub(super) fn seal_into(&self, sealed: &mut BTreeMap<String, String>) {
        match self {
            Auth::Oauth2(o) => {
                sealed.insert(SEALED_CLIENT_SECRET.into(), o.client_secret.clone());
            }
            Auth::Credential(_) => {}
        }
    }

    /// Takes the write-only fields back from what was sealed.
    pub(super) fn restore_from(&mut self, sealed: &BTreeMap<String, String>) {
        match self {
            Auth::Oauth2(o) => {
                if let Some(secret) = sealed.get(SEALED_CLIENT_SECRET) {
                    o.client_secret = secret.clone();
                }
            }
            Auth::Credential(_) => {}
        }
    }

    pub(super) fn redact(&mut self) {
        match self {
            Auth::Oauth2(o) => o.client_secret = REDACTED.to_string(),
            Auth::Credential(_) => {}
        }
    }
}

/// Reads `target.auth`.
pub(super) fn parse_auth(v: &Value, limits: &Limits, errs: &mut Errors) -> Option<Auth> {
    const SHAPE: &str = "must be {\"oauth2\": {\"token_url\": …, \"client_id\": …, \"client_secret\": …}} or {\"credential\": \"NAME\"}";
    let Value::Object(obj) = v else {
        errs.push("target.auth", format!("{SHAPE}, not {}", type_name(v)));
        return None;
    };
    errs.unknown(obj, "target.auth", &["oauth2", "credential"]);
    if obj.len() > 1 {
        errs.push(
            "target.auth",
            "names one way: oauth2 or credential, not both",
        );
        return None;
    }
    if let Some(v) = opt(obj, "credential") {
        return match v {
            Value::String(name) if is_credential_name(name) => Some(Auth::Credential(name.clone())),
            Value::String(_) => {
                errs.push(
                    "target.auth.credential",
                    "is 1 to 64 of letters, digits, '_', '.' and '-': the name of a credential the operator holds",
                );
                None
            }
            other => {
                errs.push(
                    "target.auth.credential",
                    format!("must be a string, not {}", type_name(other)),
                );
                None
            }
        };
    }
    match opt(obj, "oauth2") {
        Some(Value::Object(o)) => parse_oauth2(o, limits, errs).map(Auth::Oauth2),
        Some(other) => {
            errs.push(
                "target.auth.oauth2",
                format!("must be an object, not {}", type_name(other)),
            );
            None
        }
        None => {
            // A null is "not given": `{"credential": null}` names no way, as `{}`.
            if obj.values().all(Value::is_null) {
                errs.push("target.auth", SHAPE);
            }
            None
        }
    }
}

/// 1 to 64 of letters, digits, `_`, `.` and `-`.
pub fn is_credential_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

fn parse_oauth2(obj: &Map<String, Value>, limits: &Limits, errs: &mut Errors) -> Option<OAuth2> {
    const AT: &str = "target.auth.oauth2";
    errs.unknown(
        obj,
        AT,
        &[
            "token_url",
            "client_id",
            "client_secret",
            "scope",
            "audience",
            "params",
            "client_auth",
        ],
    );
    let token_url = match opt(obj, "token_url") {
        None => {
            errs.push(
                &format!("{AT}.token_url"),
                "is required: the token endpoint, e.g. \"https://login.example.com/oauth2/token\"",
            );
            None
        }
        Some(Value::String(s)) => check_url(&format!("{AT}.token_url"), s, limits, errs),
        Some(other) => {
            errs.push(
                &format!("{AT}.token_url"),
                format!("must be a string, not {}", type_name(other)),
            );
            None
        }
    };
    let client_id = text(obj, "client_id", MAX_ID, true, errs);
    let client_secret = text(obj, "client_secret", MAX_SECRET, true, errs);
    let scope = text(obj, "scope", MAX_TEXT, false, errs);
    let audience = text(obj, "audience", MAX_TEXT, false, errs);
    let params = parse_params(opt(obj, "params"), errs);
    let client_auth = match opt(obj, "client_auth") {
        None => Some(ClientAuth::Body),
        Some(Value::String(s)) if s == "body" => Some(ClientAuth::Body),
        Some(Value::String(s)) if s == "basic" => Some(ClientAuth::Basic),
        Some(_) => {
            errs.push(
                &format!("{AT}.client_auth"),
                "must be \"body\" (client_id and client_secret as form fields, the default) or \"basic\" (HTTP Basic)",
            );
            None
        }
    };
    Some(OAuth2 {
        token_url: token_url?,
        client_id: client_id??,
        client_secret: client_secret??,
        scope: scope?,
        audience: audience?,
        params: params?,
        client_auth: client_auth?,
    })
}

/// A text field of at most `max` bytes without control characters; the outer
/// `None` when it is refused, the inner when it is absent. A secret is never
/// echoed, nor is any other value (the field's name says which).
fn text(
    obj: &Map<String, Value>,
    name: &str,
    max: usize,
    required: bool,
    errs: &mut Errors,
) -> Option<Option<String>> {
    let field = format!("target.auth.oauth2.{name}");
    match opt(obj, name) {
        None if required => {
            errs.push(&field, "is required");
            None
        }
        None => Some(None),
        Some(Value::String(s)) => {
            if s.is_empty() || s.len() > max {
                errs.push(
                    &field,
                    format!("must be 1 to {max} bytes long, not {}", s.len()),
                );
                None
            } else if s.chars().any(char::is_control) {
                errs.push(&field, "has a control character (such as CR or LF), which a token request cannot carry");
                None
            } else {
                Some(Some(s.clone()))
            }
        }
        Some(other) => {
            errs.push(
                &field,
                format!("must be a string, not {}", type_name(other)),
            );
            None
        }
    }
}

fn parse_params(v: Option<&Value>, errs: &mut Errors) -> Option<BTreeMap<String, String>> {
    const AT: &str = "target.auth.oauth2.params";
    let obj = match v {
        None => return Some(BTreeMap::new()),
        Some(Value::Object(o)) => o,
        Some(other) => {
            errs.push(
                AT,
                format!(
                    "must be an object of form field → value strings, not {}",
                    type_name(other)
                ),
            );
            return None;
        }
    };
    if obj.len() > MAX_PARAMS {
        errs.push(
            AT,
            format!("has {} fields; the limit is {MAX_PARAMS}", obj.len()),
        );
        return None;
    }
    let mut params = BTreeMap::new();
    let mut ok = true;
    for (name, value) in obj {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !valid {
            errs.push(
                AT,
                "has a field name that is not 1 to 64 of letters, digits, '_', '.' and '-'",
            );
            ok = false;
            continue;
        }
        let field = format!("{AT}.{name}");
        if OWN_FIELDS.contains(&name.as_str()) {
            errs.push(
                &field,
                "is written by waitd itself; give it as its own field of target.auth.oauth2 (grant_type is always client_credentials)",
            );
            ok = false;
            continue;
        }
        match value {
            Value::String(s) if s.len() <= MAX_TEXT && !s.chars().any(char::is_control) => {
                params.insert(name.clone(), s.clone());
            }
            Value::String(_) => {
                errs.push(
                    &field,
                    format!("must be at most {MAX_TEXT} bytes without control characters"),
                );
                ok = false;
            }
            other => {
                errs.push(
                    &field,
                    format!("must be a string, not {}", type_name(other)),
                );
                ok = false;
            }
        }
    }
    ok.then_some(params)
}
