//! A wait's webhooks (`notify`): what each is, and how a request's list is read.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::target::check_url;
use super::{Errors, Limits, close, opt, schema, type_name};

/// Where to announce a wait's events: a webhook, signed and delivered at least once
/// (Standard Webhooks).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Notify {
    /// The http or https URL that receives a POST per event (at most 2048 bytes; the
    /// SSRF guard applies, as to targets).
    #[schema(value_type = schema::TargetUrl)]
    pub url: String,
    /// The Standard Webhooks signing secret: `whsec_` and the base64 of 24 to 64
    /// random bytes. Write-only: every read shows `<redacted>`.
    #[schema(value_type = schema::WebhookSecret)]
    pub secret: String,
    /// Which events to announce: `ended` (any terminal event, the default) or event
    /// kinds (`created`, `state`, `retry`, `succeeded`, `failed`, `timed_out`,
    /// `canceled`, `error`).
    #[serde(default = "ended_only")]
    #[schema(value_type = Option<Vec<schema::NotifyEvent>>, min_items = 1, max_items = 9)]
    pub events: Vec<String>,
}

fn ended_only() -> Vec<String> {
    vec!["ended".to_string()]
}

/// The most webhooks one wait may carry.
pub const MAX_NOTIFY: usize = 4;

/// What `notify[].events` may name: `ended`, then the event kinds, each with its bit
/// in [`Notify::kinds`].
pub const NOTIFY_EVENTS: &[(&str, i32)] = &[
    ("ended", 8 | 16 | 32 | 64 | 128),
    ("created", 1),
    ("state", 2),
    ("retry", 4),
    ("succeeded", 8),
    ("failed", 16),
    ("timed_out", 32),
    ("canceled", 64),
    ("error", 128),
];

impl Notify {
    /// The event kinds this webhook announces, as a bit set (the store's trigger
    /// matches an event's kind against it: see [`NOTIFY_EVENTS`]).
    pub fn kinds(&self) -> i32 {
        self.events
            .iter()
            .filter_map(|e| NOTIFY_EVENTS.iter().find(|(n, _)| n == e))
            .fold(0, |acc, (_, bit)| acc | bit)
    }

    /// The secret's key bytes (the base64 after `whsec_`); `None` when it is not one.
    pub fn key(&self) -> Option<Vec<u8>> {
        secret_key(&self.secret)
    }
}

/// The key bytes of a `whsec_…` secret.
pub fn secret_key(secret: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    let b64 = secret.strip_prefix("whsec_")?;
    base64::engine::general_purpose::STANDARD.decode(b64).ok()
}

/// `notify`: at most [`MAX_NOTIFY`] webhooks, each with a URL, a Standard Webhooks
/// secret and the events it announces.
pub(super) fn parse_notify(v: Option<&Value>, limits: &Limits, errs: &mut Errors) -> Vec<Notify> {
    let Some(v) = v else {
        return Vec::new();
    };
    let Value::Array(items) = v else {
        errs.push(
            "notify",
            format!(
                "must be an array of webhooks, e.g. [{{\"url\": \"https://ci.example.com/hook\", \"secret\": \"whsec_…\"}}], not {}",
                type_name(v)
            ),
        );
        return Vec::new();
    };
    if items.len() > MAX_NOTIFY {
        errs.push(
            "notify",
            format!("has {} webhooks; the limit is {MAX_NOTIFY}", items.len()),
        );
        return Vec::new();
    }
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("notify[{i}]");
        let Value::Object(obj) = item else {
            errs.push(
                &at,
                format!(
                    "must be an object with a url and a secret, not {}",
                    type_name(item)
                ),
            );
            continue;
        };
        errs.unknown(obj, &at, &["url", "secret", "events"]);
        let url = match obj.get("url") {
            None | Some(Value::Null) => {
                errs.push(
                    &format!("{at}.url"),
                    "is required: the http or https URL that receives the webhook",
                );
                None
            }
            Some(Value::String(s)) => check_url(&format!("{at}.url"), s, limits, errs),
            Some(other) => {
                errs.push(
                    &format!("{at}.url"),
                    format!("must be a string, not {}", type_name(other)),
                );
                None
            }
        };
        // Never echo the secret, not even a wrong one.
        const SECRET_HELP: &str = "a Standard Webhooks secret: whsec_ followed by the base64 of 24 to 64 random bytes, e.g. from `echo whsec_$(openssl rand -base64 32)`";
        let secret = match obj.get("secret") {
            None | Some(Value::Null) => {
                errs.push(
                    &format!("{at}.secret"),
                    format!("is required (waitd signs every webhook, so a receiver can tell it from a forgery): {SECRET_HELP}"),
                );
                None
            }
            Some(Value::String(s)) => match secret_key(s) {
                Some(key) if (24..=64).contains(&key.len()) => Some(s.clone()),
                Some(key) => {
                    errs.push(
                        &format!("{at}.secret"),
                        format!("holds a key of {} bytes; use {SECRET_HELP}", key.len()),
                    );
                    None
                }
                None => {
                    errs.push(&format!("{at}.secret"), format!("is not {SECRET_HELP}"));
                    None
                }
            },
            Some(other) => {
                errs.push(
                    &format!("{at}.secret"),
                    format!("must be a string, not {}", type_name(other)),
                );
                None
            }
        };
        let events = match opt(obj, "events") {
            None => ended_only(),
            Some(Value::Array(list)) if !list.is_empty() => {
                let mut events: Vec<String> = Vec::new();
                for (j, e) in list.iter().enumerate() {
                    match e.as_str() {
                        Some(name) if NOTIFY_EVENTS.iter().any(|(n, _)| *n == name) => {
                            if !events.iter().any(|x| x == name) {
                                events.push(name.to_string());
                            }
                        }
                        _ => {
                            let shown: String = e
                                .as_str()
                                .map(|t| t.chars().take(32).collect())
                                .unwrap_or_else(|| type_name(e).to_string());
                            let names: Vec<&str> = NOTIFY_EVENTS.iter().map(|(n, _)| *n).collect();
                            let hint = names
                                .iter()
                                .find(|n| e.as_str().is_some_and(|t| close(n, t)))
                                .map(|n| format!(" (did you mean \"{n}\"?)"))
                                .unwrap_or_default();
                            errs.push(
                                &format!("{at}.events[{j}]"),
                                format!(
                                    "is \"{shown}\", which is not an event{hint}; name ended or one of {}",
                                    names[1..].join(", ")
                                ),
                            );
                        }
                    }
                }
                events
            }
            Some(_) => {
                errs.push(
                    &format!("{at}.events"),
                    "must be a non-empty array of events, e.g. [\"ended\"] or [\"state\", \"ended\"]",
                );
                Vec::new()
            }
        };
        if let (Some(url), Some(secret)) = (url, secret) {
            out.push(Notify {
                url,
                secret,
                events,
            });
        }
    }
    out
}
