//! A `dns://NAME?type=TYPE` target: one question to a resolver is the whole
//! observation, so the URL holds the name, the record type and (where the
//! operator lets a wait choose one) the resolver, and nothing else.
//!
//! The form is one: the type goes in the query (`?type=A`, default `A`), never
//! in a field of its own or in the path, so that a wait reads back as one URL
//! and two waits that ask the same question carry the same one.

use super::{Errors, Limits};

/// The record types a wait may ask for.
pub const RECORD_TYPES: [&str; 7] = ["A", "AAAA", "CNAME", "TXT", "MX", "SRV", "NS"];

const FIELD: &str = "target.url";
const EXAMPLE: &str = "write dns://NAME?type=TYPE, e.g. \"dns://db.example.com?type=A\" (TYPE one of A, AAAA, CNAME, TXT, MX, SRV, NS; A when left out)";

/// What a `dns://` URL asks, read and checked.
#[derive(Debug, PartialEq, Eq)]
pub struct Question {
    /// The name, in lower case, without a trailing dot.
    pub name: String,
    /// One of [`RECORD_TYPES`].
    pub record_type: &'static str,
    /// The resolver the wait names, `host:port` (the host as an http URL reads
    /// it); `None`: the operator's.
    pub resolver: Option<String>,
}

impl Question {
    /// The URL in its one written form.
    pub fn url(&self) -> String {
        match &self.resolver {
            None => format!("dns://{}?type={}", self.name, self.record_type),
            Some(r) => format!("dns://{}?type={}&resolver={r}", self.name, self.record_type),
        }
    }
}

/// Reads a `dns://` URL the validator already accepted (or any text: a
/// sentence saying what is wrong with it).
pub fn question(s: &str) -> Result<Question, String> {
    let lower = s.get(..6).map(str::to_ascii_lowercase);
    let Some(rest) = lower.as_deref().filter(|p| *p == "dns://").map(|_| &s[6..]) else {
        return Err(format!("does not start with dns://; {EXAMPLE}"));
    };
    if s.bytes().any(|b| b <= 0x20 || b == 0x7f || b == b'\\') {
        return Err(format!(
            "contains a space, a control character or a backslash; {EXAMPLE}"
        ));
    }
    if rest.contains('#') {
        return Err(format!(
            "has a fragment, which a question cannot send; {EXAMPLE}"
        ));
    }
    let (name, query) = rest.split_once('?').unwrap_or((rest, ""));
    if name.contains('/') {
        return Err(format!(
            "has a path; the record type goes in the query; {EXAMPLE}"
        ));
    }
    if name.contains('@') {
        return Err(format!(
            "carries credentials, which a question cannot send; {EXAMPLE}"
        ));
    }
    if name.contains(':') || name.starts_with('[') {
        return Err(format!(
            "has a port or an address after dns://, where the name asked about goes; a resolver is named by ?resolver=HOST:PORT; {EXAMPLE}"
        ));
    }
    let name = check_name(name).map_err(|why| format!("{why}; {EXAMPLE}"))?;
    let mut record_type = None;
    let mut resolver = None;
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let shown: String = key.chars().take(32).collect();
        match key {
            "type" if record_type.is_some() => {
                return Err("names type twice; give it once".into());
            }
            "type" => {
                let Some(t) = RECORD_TYPES.iter().find(|t| t.eq_ignore_ascii_case(value)) else {
                    let shown: String = value.chars().take(16).collect();
                    return Err(format!(
                        "asks for the record type \"{shown}\", which waitd does not ask for; {EXAMPLE}"
                    ));
                };
                record_type = Some(*t);
            }
            "resolver" if resolver.is_some() => {
                return Err("names resolver twice; give it once".into());
            }
            "resolver" => resolver = Some(check_resolver(value)?),
            _ => {
                return Err(format!(
                    "has the query parameter \"{shown}\"; a dns:// URL takes type and resolver only; {EXAMPLE}"
                ));
            }
        }
    }
    Ok(Question {
        name,
        record_type: record_type.unwrap_or("A"),
        resolver,
    })
}

/// A DNS name as written in a URL: labels of letters, digits, `-` and `_`
/// (SRV names start with one), each 1–63 bytes, 253 in all; lower-cased,
/// without its trailing dot.
fn check_name(name: &str) -> Result<String, String> {
    let name = name.strip_suffix('.').unwrap_or(name);
    if name.is_empty() {
        return Err("has no name to ask about".into());
    }
    if name.len() > 253 {
        return Err(format!(
            "names a name of {} bytes; a DNS name has at most 253",
            name.len()
        ));
    }
    for label in name.split('.') {
        if label.is_empty() || label.len() > 63 {
            return Err("names a name with an empty label or one over 63 bytes".into());
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(
                "names a name with a character other than letters, digits, '-', '_' and '.' (write an internationalised name in its xn-- form)"
                    .into(),
            );
        }
    }
    Ok(name.to_ascii_lowercase())
}

/// `resolver=HOST:PORT`: a host and a port, the host read as an http URL's
/// would be, so that the guard judges the address it means.
fn check_resolver(value: &str) -> Result<String, String> {
    let example = "write resolver=HOST:PORT, e.g. resolver=10.0.0.2:53";
    let url = url::Url::parse(&format!("http://{value}/"))
        .map_err(|e| format!("names a resolver that is not HOST:PORT ({e}); {example}"))?;
    let plain = url.path() == "/"
        && url.query().is_none()
        && url.fragment().is_none()
        && url.username().is_empty()
        && url.password().is_none();
    match (url.host_str(), url.port()) {
        (Some(host), Some(port)) if plain && !host.is_empty() => Ok(format!("{host}:{port}")),
        _ => Err(format!(
            "names a resolver that is not HOST:PORT (a port is required); {example}"
        )),
    }
}

/// `target.url` of a DNS target, written back in its one form; with a
/// resolver only where the operator lets a wait choose one.
pub(super) fn check_dns_url(s: &str, limits: &Limits, errs: &mut Errors) -> Option<String> {
    if s.len() > limits.max_url_len {
        errs.push(
            FIELD,
            format!(
                "is {} bytes long; the limit is {}",
                s.len(),
                limits.max_url_len
            ),
        );
        return None;
    }
    match question(s) {
        Ok(q) if q.resolver.is_some() && !limits.dns_tenant_resolvers => {
            errs.push(
                FIELD,
                "names a resolver, which this server does not let a wait choose: leave resolver= out to ask the server's own resolver (its operator can allow it with --dns-tenant-resolvers)",
            );
            None
        }
        Ok(q) => Some(q.url()),
        Err(why) => {
            errs.push(FIELD, why);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_has_one_written_form() {
        let q = question("DNS://Db.Example.COM.?type=aaaa").unwrap();
        assert_eq!(q.url(), "dns://db.example.com?type=AAAA");
        let q = question("dns://_sip._tcp.example.com?type=SRV&resolver=0x7f.1:5353").unwrap();
        assert_eq!(
            q.url(),
            "dns://_sip._tcp.example.com?type=SRV&resolver=127.0.0.1:5353"
        );
        assert_eq!(question("dns://example.com").unwrap().record_type, "A");
        for bad in [
            "dns://",
            "dns://example.com/x",
            "dns://example.com:53",
            "dns://example.com?type=PTR",
            "dns://example.com?type=A&type=A",
            "dns://example.com?class=IN",
            "dns://example.com?resolver=10.0.0.2",
            "dns://exa mple.com",
            "dns://a..b",
            "dns://user@example.com",
        ] {
            assert!(question(bad).is_err(), "{bad}");
        }
    }
}
