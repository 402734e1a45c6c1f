//! Why an outbound request came to nothing: one type for probes and webhooks, with
//! whether it is worth trying again and a sentence a person can act on.
//!
//! The sentences never hold the request's URL (its query may carry a token) nor a
//! header value (header values are secrets).

use std::fmt;
use std::time::Duration;

use super::guard::ResolveError;

/// Who was asked: the sentences name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Peer {
    /// A wait's target, polled by a probe.
    Target,
    /// A webhook's receiver, sent a delivery.
    Receiver,
    /// An OAuth 2.0 token endpoint, asked for a token.
    TokenEndpoint,
}

impl Peer {
    /// "target", "receiver" or "token endpoint".
    pub fn as_str(self) -> &'static str {
        match self {
            Peer::Target => "target",
            Peer::Receiver => "receiver",
            Peer::TokenEndpoint => "token endpoint",
        }
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request that got no answer, or an answer that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The SSRF guard refused the URL, or every address its host resolves to.
    #[error("{0}")]
    Refused(String),
    /// The request cannot be made as asked (a URL that does not parse, a secret
    /// that cannot be read): the same request would fail again.
    #[error("{0}")]
    Invalid(String),
    /// The host's name could not be resolved (no such name, no DNS server, no
    /// address).
    #[error("{0}")]
    Resolve(String),
    /// No connection: refused, reset, unreachable, or a TLS handshake that failed.
    #[error("could not connect to the {peer}: {cause}")]
    Connect { peer: Peer, cause: String },
    /// Connected, but the exchange broke off.
    #[error("the request to the {peer} failed: {cause}")]
    Failed { peer: Peer, cause: String },
    /// No whole answer within the bound on one request.
    #[error("the {peer} did not answer within {}", crate::engine::duration::format(*within))]
    Timeout { peer: Peer, within: Duration },
    /// The answer's body is larger than what is read of it.
    #[error("the response body exceeded the {} limit", crate::engine::bound::format_size(*max))]
    TooLarge { max: usize },
}

impl Error {
    /// Whether the same request may succeed later: a network's trouble may pass;
    /// a refusal, a bad request or an oversized answer will not.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Refused(_) | Error::Invalid(_) | Error::TooLarge { .. } => false,
            Error::Resolve(_)
            | Error::Connect { .. }
            | Error::Failed { .. }
            | Error::Timeout { .. } => true,
        }
    }

    /// What a client (hyper's) or a body read failed with, classified: the guard's
    /// refusal and a failed lookup keep their own sentences; otherwise the causes
    /// under hyper's generic wrappers are named.
    pub fn of(peer: Peer, e: &(dyn std::error::Error + 'static)) -> Error {
        if let Some(resolve) = find_source::<ResolveError>(e) {
            return match resolve {
                ResolveError::Forbidden { .. } => Error::Refused(resolve.to_string()),
                _ => Error::Resolve(resolve.to_string()),
            };
        }
        let connect = e
            .downcast_ref::<hyper_util::client::legacy::Error>()
            .is_some_and(|e| e.is_connect());
        let cause = cause_text(e);
        if connect {
            Error::Connect { peer, cause }
        } else {
            Error::Failed { peer, cause }
        }
    }
}

/// The first error of type `E` in `err`'s source chain (including `err`).
fn find_source<'a, E: std::error::Error + 'static>(
    err: &'a (dyn std::error::Error + 'static),
) -> Option<&'a E> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(found) = e.downcast_ref::<E>() {
            return Some(found);
        }
        cur = e.source();
    }
    None
}

/// What went wrong under a client error, without its generic top line and hyper's
/// "client error (Connect)" wrappers.
fn cause_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = e.source();
    while let Some(err) = cur {
        let text = err.to_string();
        if !text.is_empty()
            && !text.starts_with("client error (")
            && parts.last().is_none_or(|last| !last.contains(&text))
        {
            parts.push(text);
        }
        cur = err.source();
    }
    if parts.is_empty() {
        error_chain(e)
    } else {
        parts.join(": ")
    }
}

/// Every message in an error's source chain, joined by ": ", skipping one that
/// repeats the previous (hyper often wraps an error with its own text).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(err);
    while let Some(e) = cur {
        let text = e.to_string();
        if !text.is_empty() && parts.last().is_none_or(|last| !last.contains(&text)) {
            parts.push(text);
        }
        cur = e.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct E(&'static str, Option<Box<E>>);
    impl fmt::Display for E {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for E {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|e| e as _)
        }
    }

    #[test]
    fn an_error_chain_skips_repeated_messages() {
        let e = E(
            "outer: refused",
            Some(Box::new(E(
                "refused",
                Some(Box::new(E("os error 111", None))),
            ))),
        );
        assert_eq!(error_chain(&e), "outer: refused: os error 111");
    }

    #[test]
    fn a_failure_names_the_causes_under_the_generic_top_line() {
        let e = E(
            "error sending request",
            Some(Box::new(E(
                "client error (SendRequest)",
                Some(Box::new(E("connection reset", None))),
            ))),
        );
        let err = Error::of(Peer::Receiver, &e);
        assert_eq!(
            err.to_string(),
            "the request to the receiver failed: connection reset"
        );
        assert!(err.is_transient());
    }

    #[test]
    fn a_refusal_keeps_the_guards_sentence_and_is_not_retried() {
        let refused = ResolveError::Forbidden {
            host: "evil.test".into(),
            reasons: vec!["127.0.0.1 is a loopback address".into()],
        };
        let err = Error::of(Peer::Target, &refused);
        assert_eq!(err, Error::Refused(refused.to_string()));
        assert!(!err.is_transient());
        let lookup = ResolveError::NoAddresses {
            host: "nowhere.test".into(),
        };
        let err = Error::of(Peer::Target, &lookup);
        assert_eq!(
            err.to_string(),
            "the host nowhere.test resolves to no addresses"
        );
        assert!(err.is_transient());
    }

    #[test]
    fn the_sentences_name_the_peer_and_the_bound() {
        let t = Error::Timeout {
            peer: Peer::Target,
            within: Duration::from_millis(200),
        };
        assert_eq!(t.to_string(), "the target did not answer within 200ms");
        assert!(t.is_transient());
        let big = Error::TooLarge { max: 64 * 1024 };
        assert_eq!(
            big.to_string(),
            "the response body exceeded the 64 KiB limit"
        );
        assert!(!big.is_transient());
        assert!(!Error::Invalid("no".into()).is_transient());
    }
}
