//! Where a value lives in the target's JSON body: a JSON Pointer (RFC 6901, starts
//! with `/`) or a JSONPath query (RFC 9535, starts with `$`); or, as `@status`, not in
//! the body at all but in the HTTP status code of a 2xx answer (status-only waits).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use serde_json_path::JsonPath;

/// A parsed path. Cloning copies the parsed query.
#[derive(Clone, Debug)]
pub enum ValuePath {
    /// A JSON Pointer and its reference tokens, unescaped once here rather than at
    /// every poll.
    Pointer {
        text: String,
        tokens: Vec<String>,
    },
    Query {
        text: String,
        query: JsonPath,
    },
    /// `@status`: the state is the HTTP status code of a 2xx answer (e.g. "200"),
    /// which the prober reports without reading the body. Selects nothing in a body.
    HttpStatus,
}

/// The text of [`ValuePath::HttpStatus`].
pub const HTTP_STATUS: &str = "@status";

impl PartialEq for ValuePath {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl ValuePath {
    pub fn parse(text: &str) -> Result<Self, String> {
        if text == HTTP_STATUS {
            Ok(ValuePath::HttpStatus)
        } else if let Some(rest) = text.strip_prefix('/') {
            // RFC 6901: `~` must be followed by 0 or 1.
            let bytes = text.as_bytes();
            for (i, b) in bytes.iter().enumerate() {
                if *b == b'~' && !matches!(bytes.get(i + 1), Some(b'0' | b'1')) {
                    return Err(format!(
                        "\"{text}\" is not a valid JSON Pointer: \"~\" must be written \"~0\" and \"/\" inside a key \"~1\""
                    ));
                }
            }
            Ok(ValuePath::Pointer {
                text: text.to_string(),
                tokens: rest
                    .split('/')
                    .map(|t| t.replace("~1", "/").replace("~0", "~"))
                    .collect(),
            })
        } else if text.starts_with('$') {
            JsonPath::parse(text)
                .map(|query| ValuePath::Query {
                    text: text.to_string(),
                    query,
                })
                .map_err(|e| format!("\"{text}\" is not a valid JSONPath (RFC 9535): {e}"))
        } else {
            Err(format!(
                "\"{text}\" is neither a JSON Pointer (starting with \"/\", e.g. \"/data/attributes/status\") nor a JSONPath (starting with \"$\", e.g. \"$.items[*].status\"), nor \"@status\" (the HTTP status code)"
            ))
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            ValuePath::Pointer { text, .. } => text,
            ValuePath::Query { text, .. } => text,
            ValuePath::HttpStatus => HTTP_STATUS,
        }
    }

    /// The nodes the path selects, in document order. An absent pointer selects none.
    pub fn select<'a>(&self, body: &'a Value) -> Vec<&'a Value> {
        match self {
            ValuePath::Pointer { tokens, .. } => resolve(body, tokens).into_iter().collect(),
            ValuePath::Query { query, .. } => query.query(body).all(),
            ValuePath::HttpStatus => Vec::new(),
        }
    }

    /// The state values at this path, as strings: strings as they are, numbers and
    /// booleans as their JSON text, an array's elements one by one. `None` when the
    /// path selects nothing or only nulls (the "missing" observation).
    pub fn state_values(&self, body: &Value) -> Option<Vec<String>> {
        let mut out = Vec::new();
        for node in self.select(body) {
            match node {
                Value::Array(items) => items.iter().for_each(|v| push_scalar(v, &mut out)),
                other => push_scalar(other, &mut out),
            }
        }
        (!out.is_empty()).then_some(out)
    }

    /// The detail object at this path: the node itself, or an array of the nodes
    /// when a query selects several. `None` when absent or null.
    pub fn detail(&self, body: &Value) -> Option<Value> {
        let nodes: Vec<&Value> = self
            .select(body)
            .into_iter()
            .filter(|v| !v.is_null())
            .collect();
        match nodes.len() {
            0 => None,
            1 => Some(nodes[0].clone()),
            _ => Some(Value::Array(nodes.into_iter().cloned().collect())),
        }
    }
}

/// RFC 6901 evaluation of unescaped reference tokens, as `serde_json`'s `pointer`
/// does it: an array index is decimal digits without a leading zero.
fn resolve<'a>(mut node: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    for token in tokens {
        node = match node {
            Value::Object(map) => map.get(token.as_str())?,
            Value::Array(items) => {
                let t = token.as_str();
                if !t.bytes().all(|b| b.is_ascii_digit()) || (t.starts_with('0') && t.len() > 1) {
                    return None;
                }
                items.get(t.parse::<usize>().ok()?)?
            }
            _ => return None,
        };
    }
    Some(node)
}

fn push_scalar(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Null => {}
        Value::String(s) => out.push(s.clone()),
        // Objects and nested arrays are not states; their JSON text never matches a
        // set entry, so they read as an unrecognised state rather than vanish.
        other => out.push(other.to_string()),
    }
}

impl Serialize for ValuePath {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ValuePath {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        ValuePath::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pointer_selects_what_rfc_6901_evaluation_selects() {
        let doc = json!({
            "a": [10, {"x": "y"}, 12],
            "b/c": 1, "m~n": 2, "": 3, "0": 4,
            "o": {"": {"k": 5}},
        });
        for p in [
            "/a",
            "/a/0",
            "/a/1/x",
            "/a/01",
            "/a/+1",
            "/a/-1",
            "/a/-",
            "/a/3",
            "/a/",
            "/b~1c",
            "/m~0n",
            "/",
            "/0",
            "/o//k",
            "/o/",
            "/missing",
            "/a/0/deeper",
            "/b~1c/x",
        ] {
            let path = ValuePath::parse(p).unwrap();
            let want: Vec<&Value> = doc.pointer(p).into_iter().collect();
            assert_eq!(path.select(&doc), want, "{p}");
        }
    }

    #[test]
    fn at_status_names_the_http_status_and_selects_nothing_in_a_body() {
        let p = ValuePath::parse("@status").unwrap();
        assert_eq!(p, ValuePath::HttpStatus);
        assert_eq!(p.as_str(), "@status");
        assert_eq!(p.state_values(&json!({"status": 200})), None);
        assert!(ValuePath::parse("@other").is_err());
    }

    #[test]
    fn a_pointer_reads_one_value() {
        let p = ValuePath::parse("/data/attributes/status").unwrap();
        let body = json!({"data": {"attributes": {"status": "on"}}});
        assert_eq!(p.state_values(&body), Some(vec!["on".to_string()]));
    }

    #[test]
    fn absent_and_null_values_are_missing() {
        let p = ValuePath::parse("/data/attributes/status").unwrap();
        assert_eq!(p.state_values(&json!({"data": {}})), None);
        assert_eq!(
            p.state_values(&json!({"data": {"attributes": {"status": null}}})),
            None
        );
        assert_eq!(p.state_values(&json!("text")), None);
    }

    #[test]
    fn a_query_reads_every_match_and_scalars_become_text() {
        let p = ValuePath::parse("$.items[*].ready").unwrap();
        let body = json!({"items": [{"ready": true}, {"ready": 3}, {"ready": "x"}]});
        assert_eq!(
            p.state_values(&body),
            Some(vec!["true".to_string(), "3".to_string(), "x".to_string()])
        );
    }

    #[test]
    fn a_pointer_to_an_array_reads_its_elements() {
        let p = ValuePath::parse("/statuses").unwrap();
        assert_eq!(
            p.state_values(&json!({"statuses": ["a", "b"]})),
            Some(vec!["a".to_string(), "b".to_string()])
        );
    }

    #[test]
    fn paths_that_are_neither_form_are_refused_with_an_example() {
        assert!(
            ValuePath::parse("data.status")
                .unwrap_err()
                .contains("JSON Pointer")
        );
        assert!(ValuePath::parse("$[").unwrap_err().contains("JSONPath"));
        assert!(ValuePath::parse("/a~2").unwrap_err().contains("~0"));
    }

    #[test]
    fn a_detail_is_the_node_itself() {
        let p = ValuePath::parse("/properties/status/provisioningError").unwrap();
        let body =
            json!({"properties": {"status": {"provisioningError": {"code": "SkuNotAvailable"}}}});
        assert_eq!(p.detail(&body), Some(json!({"code": "SkuNotAvailable"})));
        assert_eq!(p.detail(&json!({})), None);
    }
}
