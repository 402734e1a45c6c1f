//! What a token endpoint answers, read as a stranger's text: a token of at most
//! [`MAX_TOKEN`] bytes that can be a header value, or a sentence that says why
//! not.
//!
//! The endpoint was sent the client's secret, and may write it back in any
//! encoding at all (reversed, spaced out, halved, in Base64): no redaction can
//! find every one. So no text of its answer reaches a sentence: a refusal keeps
//! the endpoint's `error` code when it is one RFC 6749 (or RFC 8707) defines, with
//! a fixed sentence of what it means, and nothing else it wrote.

use std::time::Duration;

use http::StatusCode;
use serde_json::Value;

use super::{DEFAULT_LIFETIME, MAX_LIFETIME, MAX_TOKEN, TokenError};

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

/// The error codes of a token endpoint's refusal that the RFCs define (RFC 6749
/// §5.2, RFC 8707 §2), each with what it means. Only these are repeated.
const CODES: [(&str, &str); 8] = [
    (
        "invalid_request",
        "the request was malformed or lacks a field the endpoint needs",
    ),
    (
        "invalid_client",
        "the client was not authenticated: an unknown client_id or a wrong secret or assertion",
    ),
    (
        "invalid_grant",
        "the grant or assertion is invalid, expired or revoked",
    ),
    (
        "unauthorized_client",
        "this client may not use the client-credentials grant",
    ),
    (
        "unsupported_grant_type",
        "the endpoint does not support the client-credentials grant",
    ),
    (
        "invalid_scope",
        "the scope is invalid, unknown or beyond what the client may ask",
    ),
    (
        "invalid_target",
        "the audience or resource is invalid or unknown",
    ),
    ("access_denied", "the endpoint denied the request"),
];

/// The code an answer gives, with its meaning, when it is one of [`CODES`].
fn known_code(
    json: Option<&serde_json::Map<String, Value>>,
) -> Option<(&'static str, &'static str)> {
    let code = json?.get("error")?.as_str()?;
    CODES.iter().copied().find(|(c, _)| *c == code)
}

/// Reads a token endpoint's answer (RFC 6749 §5.1, §5.2). What it returns holds
/// no text of the answer but a code of [`CODES`].
pub fn read_answer(status: StatusCode, body: &[u8]) -> Result<Minted, TokenError> {
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
                crate::engine::bound::format_size(MAX_TOKEN)
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
            return Err(TokenError::Refused(
                "the token endpoint issued a token whose token_type is not Bearer; waitd sends bearer tokens only".into(),
            ));
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
    let code = known_code(json.as_ref());
    let said = match code {
        Some((code, meaning)) => format!(": {code} ({meaning})"),
        None => String::new(),
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
    if json.as_ref().is_some_and(|j| j.contains_key("error")) {
        return Err(TokenError::Refused(format!(
            "the token endpoint refused the client credentials ({status}) with an error code the OAuth 2.0 specifications do not define; its words are not shown, since they may repeat the client's secret"
        )));
    }
    Err(TokenError::Refused(format!(
        "the token endpoint answered {status}; check target.auth.oauth2.token_url"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SECRET: &str = "Zq7Xw9Kp2Lm4Vt";

    /// The secret as an endpoint may write it back: as it is, reversed, spaced
    /// out, halved, in Base64, in upper case.
    fn echoes() -> Vec<String> {
        use base64::Engine as _;
        let (a, b) = SECRET.split_at(SECRET.len() / 2);
        vec![
            SECRET.to_string(),
            SECRET.chars().rev().collect(),
            SECRET.chars().map(|c| format!("{c} ")).collect(),
            format!("{b}...{a}"),
            base64::engine::general_purpose::STANDARD.encode(SECRET),
            SECRET.to_ascii_uppercase(),
        ]
    }

    fn ok(body: &str) -> Result<Minted, TokenError> {
        read_answer(StatusCode::OK, body.as_bytes())
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
    fn an_oauth_error_is_refused_with_its_code_and_a_fixed_sentence_only() {
        let body = format!(
            r#"{{"error":"invalid_client","error_description":"client secret {SECRET} is wrong"}}"#
        );
        let err = read_answer(StatusCode::UNAUTHORIZED, body.as_bytes()).unwrap_err();
        let TokenError::Refused(why) = err else {
            panic!("{err:?}")
        };
        assert!(
            why.contains("invalid_client (the client was not authenticated"),
            "{why}"
        );
        assert!(!why.contains("is wrong"), "{why}");
        // A code of the endpoint's own is not repeated either: it may be the secret.
        let body = format!(r#"{{"error":"{SECRET}"}}"#);
        let why = read_answer(StatusCode::BAD_REQUEST, body.as_bytes())
            .unwrap_err()
            .to_string();
        assert!(why.contains("do not define"), "{why}");
        assert!(!why.contains(SECRET), "{why}");
    }

    #[test]
    fn a_server_error_or_throttling_may_pass() {
        for status in [500, 502, 503, 504, 429, 408] {
            let s = StatusCode::from_u16(status).unwrap();
            assert!(
                matches!(read_answer(s, b""), Err(TokenError::Transient(_))),
                "{status}"
            );
        }
        assert!(matches!(
            read_answer(StatusCode::NOT_FOUND, b""),
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
            prop::sample::select(echoes()).prop_map(|e| format!("\"{e}\"")),
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
        fn any_answer_is_read_to_an_end_with_none_of_its_text(
            body in answer(),
            status in prop_oneof![Just(200u16), Just(400), Just(401), Just(500), 100u16..600],
        ) {
            let status = StatusCode::from_u16(status).unwrap();
            match read_answer(status, &body) {
                Ok(m) => {
                    prop_assert!(status.is_success());
                    prop_assert!(m.token.len() <= MAX_TOKEN);
                    prop_assert!(m.lifetime >= Duration::from_secs(1) && m.lifetime <= MAX_LIFETIME);
                }
                Err(TokenError::Refused(why) | TokenError::Transient(why)) => {
                    for echo in echoes() {
                        let echo: Vec<char> = echo.chars().collect();
                        for piece in echo.windows(5) {
                            let piece: String = piece.iter().collect();
                            prop_assert!(!why.contains(&piece), "{} in {}", piece, why);
                        }
                    }
                    prop_assert!(why.chars().count() < 400, "{}", why.len());
                }
            }
        }
    }
}
