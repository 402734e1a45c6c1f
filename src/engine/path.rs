//! Where a value lives in the target's JSON body: a JSON Pointer (RFC 6901, starts
//! with `/`) or a JSONPath query (RFC 9535, starts with `$`); or, as `@status`, not in
//! the body at all but in the HTTP status code of a 2xx answer (status-only waits).

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use super::jsonpath::{self, Budget, Exceeded};

/// A parsed path. Cloning copies the parsed query.
#[derive(Clone, Debug)]
pub enum ValuePath {
    /// A JSON Pointer and its reference tokens, unescaped once here rather than at
    /// every poll.
    Pointer { text: String, tokens: Vec<String> },
    Query {
        text: String,
        query: jsonpath::Query,
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
            jsonpath::Query::parse(text)
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

    /// The nodes the path selects, in document order. An absent pointer selects
    /// none. Every node touched is charged to `budget`.
    pub fn select<'a>(
        &self,
        body: &'a Value,
        budget: &mut Budget,
    ) -> Result<Vec<&'a Value>, Exceeded> {
        match self {
            ValuePath::Pointer { tokens, .. } => {
                budget.nodes(1 + tokens.len() as u64)?;
                Ok(resolve(body, tokens).into_iter().collect())
            }
            ValuePath::Query { query, .. } => query.select(body, budget),
            ValuePath::HttpStatus => Ok(Vec::new()),
        }
    }

    /// The state values at this path, as strings: strings as they are, numbers and
    /// booleans as their JSON text, an array's elements one by one. What is
    /// produced is charged to `budget` by its size.
    pub fn state_values(&self, body: &Value, budget: &mut Budget) -> Result<Selected, Exceeded> {
        let nodes = self.select(body, budget)?;
        if nodes.is_empty() {
            return Ok(Selected::Nothing);
        }
        let mut out = Vec::new();
        for node in nodes {
            match node {
                Value::Array(items) => {
                    for v in items {
                        budget.nodes(1)?;
                        push_scalar(v, &mut out, budget)?;
                    }
                }
                other => push_scalar(other, &mut out, budget)?,
            }
        }
        Ok(if out.is_empty() {
            Selected::OnlyNull
        } else {
            Selected::Values(out)
        })
    }

    /// The detail object at this path: the node itself, or an array of the nodes
    /// when a query selects several. `None` when absent or null.
    pub fn detail(&self, body: &Value, budget: &mut Budget) -> Result<Option<Value>, Exceeded> {
        let nodes: Vec<&Value> = self
            .select(body, budget)?
            .into_iter()
            .filter(|v| !v.is_null())
            .collect();
        // One node is at most the body, copied once. Several may repeat one
        // another (`$[0,0,0,…]`) or hold one another (`$..*`), which copies the
        // body once per node, so each copy past the first is charged by its size
        // before it is made.
        for node in nodes.iter().skip(1) {
            let mut w = Measured {
                len: 0,
                left: budget.bytes_left(),
            };
            serde_json::to_writer(&mut w, node).map_err(|_| Exceeded::Bytes)?;
            budget.bytes(w.len)?;
        }
        Ok(match nodes.len() {
            0 => None,
            1 => Some(nodes[0].clone()),
            _ => Some(Value::Array(nodes.into_iter().cloned().collect())),
        })
    }
}

/// What a state path found in a body.
#[derive(Clone, Debug, PartialEq)]
pub enum Selected {
    /// The state values, in document order.
    Values(Vec<String>),
    /// The path selects nothing.
    Nothing,
    /// The path selects only nulls.
    OnlyNull,
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

fn push_scalar(v: &Value, out: &mut Vec<String>, budget: &mut Budget) -> Result<(), Exceeded> {
    let text = match v {
        Value::Null => return Ok(()),
        Value::String(s) => {
            budget.bytes(s.len() as u64)?;
            s.clone()
        }
        // Objects and nested arrays are not states; their JSON text never matches a
        // set entry, so they read as an unrecognised state rather than vanish. The
        // text is written under the budget, not built whole and measured after.
        other => {
            let mut w = Capped {
                buf: Vec::new(),
                left: budget.bytes_left(),
            };
            serde_json::to_writer(&mut w, other).map_err(|_| Exceeded::Bytes)?;
            budget.bytes(w.buf.len() as u64)?;
            String::from_utf8(w.buf).map_err(|_| Exceeded::Bytes)?
        }
    };
    out.push(text);
    Ok(())
}

/// A writer that refuses to grow past `left` bytes.
struct Capped {
    buf: Vec<u8>,
    left: u64,
}

impl std::io::Write for Capped {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        if (self.buf.len() + b.len()) as u64 > self.left {
            return Err(std::io::Error::other("over budget"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A writer that only counts, and refuses to count past `left` bytes.
struct Measured {
    len: u64,
    left: u64,
}

impl std::io::Write for Measured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.len += b.len() as u64;
        if self.len > self.left {
            return Err(std::io::Error::other("over budget"));
        }
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
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

    fn vals(p: &ValuePath, body: &Value) -> Option<Vec<String>> {
        match p.state_values(body, &mut Budget::default()).unwrap() {
            Selected::Values(v) => Some(v),
            _ => None,
        }
    }

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
            assert_eq!(
                path.select(&doc, &mut Budget::default()).unwrap(),
                want,
                "{p}"
            );
        }
    }

    #[test]
    fn at_status_names_the_http_status_and_selects_nothing_in_a_body() {
        let p = ValuePath::parse("@status").unwrap();
        assert_eq!(p, ValuePath::HttpStatus);
        assert_eq!(p.as_str(), "@status");
        assert_eq!(vals(&p, &json!({"status": 200})), None);
        assert!(ValuePath::parse("@other").is_err());
    }

    #[test]
    fn a_pointer_reads_one_value() {
        let p = ValuePath::parse("/data/attributes/status").unwrap();
        let body = json!({"data": {"attributes": {"status": "on"}}});
        assert_eq!(vals(&p, &body), Some(vec!["on".to_string()]));
    }

    #[test]
    fn absent_and_null_values_are_missing() {
        let p = ValuePath::parse("/data/attributes/status").unwrap();
        assert_eq!(vals(&p, &json!({"data": {}})), None);
        assert_eq!(
            vals(&p, &json!({"data": {"attributes": {"status": null}}})),
            None
        );
        assert_eq!(vals(&p, &json!("text")), None);
    }

    #[test]
    fn a_query_reads_every_match_and_scalars_become_text() {
        let p = ValuePath::parse("$.items[*].ready").unwrap();
        let body = json!({"items": [{"ready": true}, {"ready": 3}, {"ready": "x"}]});
        assert_eq!(
            vals(&p, &body),
            Some(vec!["true".to_string(), "3".to_string(), "x".to_string()])
        );
    }

    #[test]
    fn a_pointer_to_an_array_reads_its_elements() {
        let p = ValuePath::parse("/statuses").unwrap();
        assert_eq!(
            vals(&p, &json!({"statuses": ["a", "b"]})),
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
        assert_eq!(
            p.detail(&body, &mut Budget::default()).unwrap(),
            Some(json!({"code": "SkuNotAvailable"}))
        );
        assert_eq!(p.detail(&json!({}), &mut Budget::default()).unwrap(), None);
    }

    #[test]
    fn a_detail_repeating_a_large_node_stops_at_the_budget() {
        // 250 copies of a 600 KB object would be 150 MB.
        let big: serde_json::Map<String, Value> = (0..20_000)
            .map(|i| (format!("k{i}"), json!("abcdefghijklmnopqrst")))
            .collect();
        let body = json!([big]);
        let repeated = format!("$[{}]", vec!["0"; 250].join(","));
        let p = ValuePath::parse(&repeated).unwrap();
        assert_eq!(
            p.detail(&body, &mut Budget::default()),
            Err(Exceeded::Bytes)
        );
        let p = ValuePath::parse("$..*").unwrap();
        let deep = (0..100).fold(json!("x".repeat(20_000)), |v, _| json!([v]));
        assert_eq!(
            p.detail(&deep, &mut Budget::default()),
            Err(Exceeded::Bytes)
        );
        // The node itself, however large, is copied as before, and so are a few.
        let p = ValuePath::parse("/0").unwrap();
        assert_eq!(
            p.detail(&body, &mut Budget::default()).unwrap(),
            Some(Value::Object(big.clone()))
        );
        let p = ValuePath::parse("$[0,0]").unwrap();
        assert!(p.detail(&body, &mut Budget::default()).is_ok());
    }
}
