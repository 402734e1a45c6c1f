//! A request body's JSON, read as `serde_json` reads it but for one thing: an
//! object that names a key twice is refused rather than read as its last value,
//! so that `{"want": ["on"], "want": ["off"]}` never silently means one of them.
//!
//! Written here because `serde_json` keeps the last value without a word and
//! offers no switch for it; its own limits still hold (the reader below is
//! driven by `serde_json`'s deserializer, whose nesting limit bounds it).

use std::fmt;

use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// A JSON value in which no object names a key twice.
pub struct Strict(pub Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Strict, D::Error> {
        d.deserialize_any(Read).map(Strict)
    }
}

/// Reads one value, refusing a key named twice in any object within it.
pub fn from_slice(bytes: &[u8]) -> serde_json::Result<Value> {
    serde_json::from_slice::<Strict>(bytes).map(|s| s.0)
}

struct Read;

impl<'de> Visitor<'de> for Read {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(n.into())
    }

    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(n.into())
    }

    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(n).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                // The key is not quoted: a key may be a header's name, and one
                // sent by mistake may hold a credential.
                return Err(A::Error::custom(
                    "a key appears twice in one object; send each key once",
                ));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_key_named_twice_is_refused_at_any_depth() {
        for text in [
            r#"{"want":["on"],"want":["off"]}"#,
            r#"{"target":{"url":"a","url":"b"}}"#,
            r#"[1,{"a":{"b":1,"b":2}}]"#,
            r#"{"a":1,"\u0061":2}"#,
        ] {
            let e = from_slice(text.as_bytes()).unwrap_err();
            assert!(e.to_string().contains("appears twice"), "{text}: {e}");
        }
    }

    #[test]
    fn nesting_past_serde_json_s_limit_is_refused_without_a_crash() {
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        assert!(from_slice(deep.as_bytes()).is_err());
        let deep = format!("{}1{}", r#"{"a":"#.repeat(100_000), "}".repeat(100_000));
        assert!(from_slice(deep.as_bytes()).is_err());
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e300f64..1e300).prop_map(Value::from),
            "\\PC{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
                prop::collection::btree_map("\\PC{0,6}", inner, 0..8)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Without a repeated key it reads exactly what `serde_json` reads.
        #[test]
        fn it_reads_what_serde_json_reads(v in json()) {
            let text = v.to_string();
            prop_assert_eq!(from_slice(text.as_bytes()).unwrap(), serde_json::from_str::<Value>(&text).unwrap());
        }
    }
}
