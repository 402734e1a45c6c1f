//! The JSON Schema of the request's value types, for the types in [`super::spec`]
//! to derive theirs from (`#[schema(value_type = …)]`). The bounds are read from
//! the same [`Limits`] defaults and grammar the validator applies, so the OpenAPI
//! document cannot drift from what a request is checked against. What a schema
//! cannot say (a timeout over the server's `--max-timeout`, `want` and `fail`
//! overlapping, a poll interval under the floor) the validator answers with a 400.

use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};
use utoipa::{PartialSchema, ToSchema};

use super::Limits;

/// What the duration grammar ([`super::duration::parse`]) reads: whole numbers, each
/// with a unit.
pub const DURATION_PATTERN: &str = "^([0-9]+(ms|s|m|h|d))+$";

/// The label names a wait can carry ([`super::spec::is_label_name`]).
pub const LABEL_NAME_PATTERN: &str = "^[A-Za-z0-9._/-]{1,63}$";

/// Header names (RFC 9110 tokens, at most 64 bytes).
pub const HEADER_NAME_PATTERN: &str = "^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$";

/// What `target.url` (and `notify[].url`) looks like: `http://` or `https://`, then
/// a non-empty authority and no whitespace, control character or backslash: the
/// server refuses those with a 400.
pub const URL_PATTERN: &str =
    "^[Hh][Tt][Tt][Pp][Ss]?://[^\\x00-\\x20\\x7f\\\\/?#][^\\x00-\\x20\\x7f\\\\]*$";

/// What `target.url` looks like: an http or https URL as [`URL_PATTERN`],
/// `tcp://host:port`, `tls://host:port`, `grpc://host:port[/package.Service]`,
/// or `dns://name[?type=TYPE[&resolver=host:port]]`.
pub const TARGET_URL_PATTERN: &str = "^(?:[Hh][Tt][Tt][Pp][Ss]?://[^\\x00-\\x20\\x7f\\\\/?#][^\\x00-\\x20\\x7f\\\\]*|(?:[Tt][Cc][Pp]|[Tt][Ll][Ss])://[^\\x00-\\x20\\x7f\\\\/?#]+:[0-9]{1,5}/?|[Gg][Rr][Pp][Cc]://[^\\x00-\\x20\\x7f\\\\/?#]+:[0-9]{1,5}(?:/[A-Za-z0-9_.]{0,200})?|[Dd][Nn][Ss]://[A-Za-z0-9_.-]{1,254}(?:\\?[^\\x00-\\x20\\x7f\\\\#]*)?)$";

fn limits() -> Limits {
    Limits::default()
}

macro_rules! schema_type {
    ($(#[$doc:meta])* $ty:ident, $name:literal, $body:expr) => {
        $(#[$doc])*
        pub struct $ty;

        impl PartialSchema for $ty {
            fn schema() -> RefOr<Schema> {
                $body.into()
            }
        }

        impl ToSchema for $ty {
            fn name() -> std::borrow::Cow<'static, str> {
                $name.into()
            }
        }
    };
}

schema_type!(
    /// A duration such as `30s` or `1h30m`.
    DurationText,
    "Duration",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(DURATION_PATTERN))
        .description(Some(
            "Whole numbers, each with a unit (ms, s, m, h, d): `250ms`, `30s`, `1h30m`"
        ))
        .examples(["30s"])
);

schema_type!(
    /// A JSON Pointer, a JSONPath, or `@status`.
    PathText,
    "ValuePath",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(limits().max_path_len))
        .description(Some(
            "A JSON Pointer (`/data/attributes/status`), a JSONPath (`$.items[*].status`), or `@status` (the HTTP status code)"
        ))
        .examples(["/data/attributes/status"])
);

schema_type!(
    /// A CEL expression over `body`, `status`, `headers` and `state`.
    ConditionText,
    "Condition",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .min_length(Some(1))
        .max_length(Some(super::condition::MAX_LEN))
        .description(Some(
            "A CEL expression (the Common Expression Language) over `body` (the JSON body, null when not JSON), `status` (an int), `headers` (lower-case names) and `state` (what the state path yields); it must evaluate to a bool"
        ))
        .examples(["body.status.readyReplicas >= body.spec.replicas"])
);

schema_type!(
    /// One state of a set: a string, number or boolean, compared as its JSON text.
    StateValue,
    "StateValue",
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([
            Type::String,
            Type::Number,
            Type::Boolean,
        ]))
        .max_length(Some(limits().max_value_len))
        .description(Some(
            "A state: a string, number or boolean, compared as its JSON text"
        ))
);

schema_type!(
    /// The key a listening wait names: a string, or a number taken as its text.
    EventKeyText,
    "EventKey",
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Number]))
        .min_length(Some(1))
        .max_length(Some(super::spec::MAX_KEY))
        .description(Some(
            "The key an event must carry to be this wait's: a string of 1 to 256 bytes, or a number, taken as its JSON text"
        ))
);

/// An object of at most `most` string values (of at most `value_len` bytes) whose
/// names match `names`.
fn string_map(most: usize, names: &str, value_len: usize) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .max_properties(Some(most))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(names)),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(value_len)),
        ))
}

schema_type!(
    /// `labels`: names as [`LABEL_NAME_PATTERN`], string values.
    Labels,
    "Labels",
    string_map(
        limits().max_labels,
        LABEL_NAME_PATTERN,
        limits().max_label_len
    )
    .examples([serde_json::json!({"pipeline": "1234"})])
);

schema_type!(
    /// `target.headers`: sent with every poll; values are never shown back.
    Headers,
    "Headers",
    string_map(
        limits().max_headers,
        HEADER_NAME_PATTERN,
        limits().max_header_len
    )
);

/// A form field name of `target.auth.oauth2.params`.
pub const FORM_FIELD_PATTERN: &str = "^[A-Za-z0-9_.-]{1,64}$";

schema_type!(
    /// `target.auth.oauth2.params`: extra form fields of the token request
    /// (`grant_type`, `client_id`, `client_secret`, `scope` and `audience` are
    /// refused: waitd writes them).
    FormParams,
    "FormParams",
    string_map(8, FORM_FIELD_PATTERN, 1024)
);

schema_type!(
    /// An http or https URL: `notify[].url`, `target.auth.oauth2.token_url`.
    TargetUrl,
    "TargetUrl",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(limits().max_url_len))
        .pattern(Some(URL_PATTERN))
        .examples(["https://api.example.com/servers/1"])
);

schema_type!(
    /// `target.url`: http or https, or `tcp://host:port` or `tls://host:port`.
    PollUrl,
    "PollUrl",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(limits().max_url_len))
        .pattern(Some(TARGET_URL_PATTERN))
        .examples(["https://api.example.com/servers/1", "tcp://db.internal:5432"])
);

schema_type!(
    /// `target.tls.ca` and `target.tls.client_cert`: PEM certificates.
    PemCertificates,
    "PemCertificates",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(super::spec::tls::MAX_PEM_LEN))
        .description(Some(
            "One or more PEM certificates (at most 16), each from `-----BEGIN CERTIFICATE-----` to `-----END CERTIFICATE-----`"
        ))
        .examples(["-----BEGIN CERTIFICATE-----\nMIIB…\n-----END CERTIFICATE-----\n"])
);

schema_type!(
    /// `target.tls.client_key`: a PEM private key, or `<redacted>` as every read
    /// shows it.
    PemPrivateKey,
    "PemPrivateKey",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .max_length(Some(super::spec::tls::MAX_PEM_LEN))
        .description(Some(
            "One PEM private key, not encrypted: PKCS#8 (`-----BEGIN PRIVATE KEY-----`), PKCS#1 (`-----BEGIN RSA PRIVATE KEY-----`) or SEC1 (`-----BEGIN EC PRIVATE KEY-----`). Write-only: reads show `<redacted>`"
        ))
        .examples(["-----BEGIN PRIVATE KEY-----\nMIGH…\n-----END PRIVATE KEY-----\n"])
);

/// What `notify[].secret` looks like: a Standard Webhooks secret, or `<redacted>` as
/// every read shows it.
pub const WEBHOOK_SECRET_PATTERN: &str = "^(whsec_[A-Za-z0-9+/]{32,88}={0,2}|<redacted>)$";

schema_type!(
    /// `notify[].secret`: `whsec_` and base64; write-only.
    WebhookSecret,
    "WebhookSecret",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .pattern(Some(WEBHOOK_SECRET_PATTERN))
        .description(Some(
            "A Standard Webhooks secret: `whsec_` and the base64 of 24 to 64 random bytes. Write-only: reads show `<redacted>`"
        ))
        .examples(["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"])
);

schema_type!(
    /// One entry of `notify[].events`.
    NotifyEvent,
    "NotifyEvent",
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(
            super::spec::NOTIFY_EVENTS.iter().map(|(n, _)| *n)
        ))
        .description(Some(
            "`ended` (any terminal event) or an event kind"
        ))
);
