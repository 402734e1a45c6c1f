//! What a token endpoint answers, read as a stranger's text: a token of at most
//! [`MAX_TOKEN`] bytes that can be a header value, or a sentence that says why
//! not, cut short and without the client's secret.

use std::time::Duration;

use http::StatusCode;
use serde_json::Value;

use super::{DEFAULT_LIFETIME, MAX_LIFETIME, MAX_TOKEN, TokenError};

/// The longest error text kept from a token endpoint's answer.
const MAX_DESCRIPTION: usize = 300;

/// A token endpoint's answer, read.
#[derive(Debug, PartialEq, Eq)]
pub struct Minted {
    /// The token.
    pub token: String,
    /// How long it lives.
    pub lifetime: Duration,
}

/// What is left of a token's life when it is minted again: a tenth of it, at
/// most a minute.
pub fn margin(lifetime: Duration) -> Duration {
    (lifetime / 10).min(Duration::from_secs(60))
}

/// Reads a token endpoint's answer (RFC 6749 §5.1, §5.2). None of `secrets` (the
/// client's secret in every form the request carried it) appears in what it
/// returns, whatever the case of its percent-escapes.
pub fn read_answer(
    status: StatusCode,
    body: &[u8],
    secrets: &[&str],
) -> Result<Minted, TokenError> {
    let json: Option<serde_json::Map<String, Value>> = serde_json::from_slice(body).ok();
    if status.is_success() {
        let Some(json) = json else {
            return Err(TokenError::Refused(format!(
                "the token endpoint answered {status} with a body that is not a JSON object, so there is no access_token in it"
            )));
        };
        let token = match json.get("access_token") {
            Some(Value::String(t)) if !t.is_empty() => t,
            _ => {
                return Err(TokenError::Refused(format!(
                    "the token endpoint answered {status} without an access_token"
                )));
            }
        };
        if token.len() > MAX_TOKEN {
            return Err(TokenError::Refused(format!(
                "the token endpoint issued a token of {} bytes; the limit is {}",
                token.len(),
                crate::outbound::format_size(MAX_TOKEN)
            )));
        }
        if !token.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(TokenError::Refused(
                "the token endpoint issued a token with characters a header cannot carry".into(),
            ));
        }
        if let Some(kind) = json.get("token_type")
            && !kind
                .as_str()
                .is_some_and(|k| k.eq_ignore_ascii_case("bearer"))
        {
            return Err(TokenError::Refused(format!(
                "the token endpoint issued a token of type {}; waitd sends bearer tokens only",
                // The text itself, not its JSON, in which a secret's quotes and
                // backslashes would be escaped out of the redaction's reach.
                match kind.as_str() {
                    Some(text) => format!("\"{}\"", clean(text, secrets)),
                    None => clean(&kind.to_string(), secrets),
                }
            )));
        }
        let seconds = match json.get("expires_in") {
            Some(Value::Number(n)) => n.as_f64(),
            // Some endpoints write it as a string.
            Some(Value::String(s)) => s.trim().parse::<f64>().ok(),
            _ => None,
        };
        let lifetime = match seconds {
            Some(s) if s.is_finite() && s >= 1.0 => {
                Duration::from_secs_f64(s.min(MAX_LIFETIME.as_secs_f64()))
            }
            Some(s) if s.is_finite() && s >= 0.0 => Duration::from_secs(1),
            _ => DEFAULT_LIFETIME,
        };
        return Ok(Minted {
            token: token.clone(),
            lifetime,
        });
    }
    let code = json
        .as_ref()
        .and_then(|j| j.get("error"))
        .and_then(Value::as_str)
        .map(|c| clean(c, secrets));
    let description = json
        .as_ref()
        .and_then(|j| j.get("error_description"))
        .and_then(Value::as_str)
        .map(|d| clean(d, secrets));
    let said = match (&code, &description) {
        (Some(c), Some(d)) => format!(": {c}: {d}"),
        (Some(c), None) => format!(": {c}"),
        (None, Some(d)) => format!(": {d}"),
        (None, None) => String::new(),
    };
    if matches!(status.as_u16(), 408 | 425 | 429) || status.is_server_error() {
        return Err(TokenError::Transient(format!(
            "the token endpoint answered {status}{said}"
        )));
    }
    if code.is_some() {
        return Err(TokenError::Refused(format!(
            "the token endpoint refused the client credentials ({status}){said}"
        )));
    }
    Err(TokenError::Refused(format!(
        "the token endpoint answered {status}{said}; check target.auth.oauth2.token_url"
    )))
}

/// A stranger's text made fit for a reason: at most [`MAX_DESCRIPTION`]
/// characters, control characters as spaces, each of `secrets` as `<redacted>`
/// (matched ignoring ASCII case, as a percent-escape may come back in either).
fn clean(text: &str, secrets: &[&str]) -> String {
    let mut scrubbed = text.to_string();
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        scrubbed = redact(&scrubbed, secret);
    }
    let cut = scrubbed.chars().count() > MAX_DESCRIPTION;
    let mut out: String = scrubbed
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_DESCRIPTION)
        .collect();
    if cut {
        // The cut may have left the start of a secret at the end.
        for secret in secrets {
            let lower = out.to_ascii_lowercase();
            if let Some(n) = (4..secret.len().min(out.len())).rev().find(|&n| {
                secret.is_char_boundary(n) && lower.ends_with(&secret[..n].to_ascii_lowercase())
            }) {
                out.truncate(out.len() - n);
            }
        }
        out.push('…');
    }
    out
}

/// `text` with every occurrence of `secret`, ignoring ASCII case, replaced by
/// the redaction mark. ASCII case changes no byte's place, so what is found in
/// the lowered text is cut from the text itself.
fn redact(text: &str, secret: &str) -> String {
    let (lower, needle) = (text.to_ascii_lowercase(), secret.to_ascii_lowercase());
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    while let Some(i) = lower[from..].find(&needle) {
        out.push_str(&text[from..from + i]);
        out.push_str(crate::engine::spec::REDACTED);
        from += i + needle.len();
    }
    out.push_str(&text[from..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &str = "s3cret-value";

    fn ok(body: &str) -> Result<Minted, TokenError> {
        read_answer(StatusCode::OK, body.as_bytes(), &[SECRET])
    }

    /// A token type that repeats the secret, with the quotes and backslashes its
    /// JSON escapes, shows neither the secret nor its escaped form.
    #[test]
    fn a_token_type_that_repeats_a_secret_with_quotes_hides_it() {
        let secret = r#"ab"cd\ef-Q"#;
        let body = serde_json::json!({"access_token": "t", "token_type": format!("x {secret} y")})
            .to_string();
        let e = read_answer(StatusCode::OK, body.as_bytes(), &[secret]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("of type"), "{text}");
        assert!(!text.contains(secret), "{text}");
        assert!(!text.contains(r#"ab\"cd"#), "{text}");
    }

    #[test]
    fn a_token_answer_gives_the_token_and_its_life() {
        let m = ok(r#"{"access_token":"abc","token_type":"Bearer","expires_in":3599}"#).unwrap();
        assert_eq!(m.token, "abc");
        assert_eq!(m.lifetime, Duration::from_secs(3599));
        let m = ok(r#"{"access_token":"abc","expires_in":"120"}"#).unwrap();
        assert_eq!(m.lifetime, Duration::from_secs(120));
        let m = ok(r#"{"access_token":"abc"}"#).unwrap();
        assert_eq!(m.lifetime, DEFAULT_LIFETIME);
        let m = ok(r#"{"access_token":"abc","expires_in":1e12}"#).unwrap();
        assert_eq!(m.lifetime, MAX_LIFETIME);
        let m = ok(r#"{"access_token":"abc","expires_in":0}"#).unwrap();
        assert_eq!(m.lifetime, Duration::from_secs(1));
    }

    #[test]
    fn what_is_not_a_bearer_token_is_refused_with_a_sentence() {
        for (body, says) in [
            ("<html>", "not a JSON object"),
            (r#"{"token":"x"}"#, "without an access_token"),
            (r#"{"access_token":""}"#, "without an access_token"),
            (r#"{"access_token":"a b"}"#, "cannot carry"),
            (
                r#"{"access_token":"x","token_type":"mac"}"#,
                "bearer tokens only",
            ),
        ] {
            match ok(body) {
                Err(TokenError::Refused(why)) => assert!(why.contains(says), "{body}: {why}"),
                other => panic!("{body}: {other:?}"),
            }
        }
        let long = format!(r#"{{"access_token":"{}"}}"#, "a".repeat(MAX_TOKEN + 1));
        assert!(matches!(ok(&long), Err(TokenError::Refused(w)) if w.contains("limit")));
    }

    #[test]
    fn an_oauth_error_is_refused_with_its_code_and_description_without_the_secret() {
        let body = format!(
            r#"{{"error":"invalid_client","error_description":"client secret {SECRET} is wrong\r\nreally"}}"#
        );
        let err = read_answer(StatusCode::UNAUTHORIZED, body.as_bytes(), &[SECRET]).unwrap_err();
        let TokenError::Refused(why) = err else {
            panic!("{err:?}")
        };
        assert!(why.contains("invalid_client"), "{why}");
        assert!(why.contains("is wrong"), "{why}");
        assert!(!why.contains(SECRET), "{why}");
        assert!(!why.contains('\n'), "{why}");
    }

    #[test]
    fn a_server_error_or_throttling_may_pass() {
        for status in [500, 502, 503, 504, 429, 408] {
            let s = StatusCode::from_u16(status).unwrap();
            assert!(
                matches!(
                    read_answer(s, b"", &[SECRET]),
                    Err(TokenError::Transient(_))
                ),
                "{status}"
            );
        }
        assert!(matches!(
            read_answer(StatusCode::NOT_FOUND, b"", &[SECRET]),
            Err(TokenError::Refused(w)) if w.contains("token_url")
        ));
    }

    #[test]
    fn the_margin_is_a_tenth_of_the_life_at_most_a_minute() {
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(200));
        assert_eq!(margin(Duration::from_secs(3600)), Duration::from_secs(60));
    }

    /// JSON-ish answers, nested and long, past the read limit.
    fn answer() -> impl Strategy<Value = Vec<u8>> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            "[a-z0-9 \\\\\"]{0,40}".prop_map(|s| format!("\"{s}\"")),
            any::<f64>().prop_map(|f| f.to_string()),
            Just(format!("\"{SECRET}\"")),
        ];
        let value = leaf.prop_recursive(200, 400, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::vec(
                    (
                        prop_oneof![
                            Just("access_token".to_string()),
                            Just("expires_in".to_string()),
                            Just("token_type".to_string()),
                            Just("error".to_string()),
                            Just("error_description".to_string()),
                            "[a-z]{1,8}".prop_map(|s| s),
                        ],
                        inner
                    ),
                    0..5
                )
                .prop_map(|v| {
                    let fields: Vec<String> =
                        v.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", fields.join(","))
                }),
            ]
        });
        prop_oneof![
            value.prop_map(String::into_bytes),
            prop::collection::vec(any::<u8>(), 0..super::super::MAX_ANSWER * 2),
            (1usize..5000).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n)).into_bytes()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn any_answer_is_read_to_an_end_without_the_secret(
            body in answer(),
            status in prop_oneof![Just(200u16), Just(400), Just(401), Just(500), 100u16..600],
        ) {
            let status = StatusCode::from_u16(status).unwrap();
            match read_answer(status, &body, &[SECRET]) {
                Ok(m) => {
                    prop_assert!(status.is_success());
                    prop_assert!(m.token.len() <= MAX_TOKEN);
                    prop_assert!(m.lifetime >= Duration::from_secs(1) && m.lifetime <= MAX_LIFETIME);
                }
                Err(TokenError::Refused(why) | TokenError::Transient(why)) => {
                    prop_assert!(!why.contains(SECRET), "{}", why);
                    prop_assert!(why.chars().count() < 800, "{}", why.len());
                }
            }
        }
    }
}
