//! Decoding JSON into a [`serde_json::Value`] while refusing duplicate
//! object keys, at any depth.
//!
//! RFC 8259 §4 says names within an object SHOULD be unique and leaves what
//! a parser does with repeats open; `serde_json` keeps the last. A wire
//! message with two `method` keys would then mean different things to
//! different parsers (a proxy that checks the first, berth that acts on the
//! last), so the transports refuse such a message whole instead
//! (JSON-RPC -32600, with the key and its JSON Pointer path).
//!
//! The check rides the one parse: a visitor builds the `Value` as
//! `serde_json`'s own does and looks each key up in the object being built
//! before inserting it. Nothing is allocated for the check on the path of a
//! valid message; the path of a duplicate is collected while the error
//! unwinds.

use std::cell::RefCell;
use std::fmt;

use serde::de::{DeserializeSeed, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Why a message could not be decoded.
#[derive(Debug)]
pub enum JsonDecodeError {
    /// Not JSON (or trailing bytes after the value).
    Syntax(serde_json::Error),
    /// An object repeats a key.
    DuplicateKey {
        /// The repeated key.
        key: String,
        /// JSON Pointer (RFC 6901) of the repeated member, e.g. `/method` or
        /// `/params/prompt/0/text`.
        path: String,
    },
}

impl fmt::Display for JsonDecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Syntax(e) => write!(f, "{e}"),
            Self::DuplicateKey { key, path } => {
                write!(f, "duplicate key {key:?} at {path}")
            }
        }
    }
}

impl std::error::Error for JsonDecodeError {}

/// Parses `bytes` as one JSON value, refusing any object that repeats a key.
///
/// # Errors
/// [`JsonDecodeError::Syntax`] for what `serde_json::from_slice` refuses;
/// [`JsonDecodeError::DuplicateKey`] naming the first repeated key found.
pub fn from_slice(bytes: &[u8]) -> Result<Value, JsonDecodeError> {
    let trail = RefCell::new(Vec::new());
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = Seed { trail: &trail }
        .deserialize(&mut de)
        .and_then(|v| de.end().map(|()| v));
    match parsed {
        Ok(value) => Ok(value),
        Err(e) => {
            let trail = trail.into_inner();
            match trail.first() {
                Some(key) => Err(JsonDecodeError::DuplicateKey {
                    key: key.clone(),
                    path: trail.iter().rev().fold(String::new(), |mut path, seg| {
                        path.push('/');
                        path.push_str(&seg.replace('~', "~0").replace('/', "~1"));
                        path
                    }),
                }),
                None => Err(JsonDecodeError::Syntax(e)),
            }
        }
    }
}

/// Builds one value; on a duplicate key, `trail` holds the path segments,
/// innermost first.
#[derive(Clone, Copy)]
struct Seed<'a> {
    trail: &'a RefCell<Vec<String>>,
}

impl<'de> DeserializeSeed<'de> for Seed<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Seed<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(self)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        loop {
            match seq.next_element_seed(self) {
                Ok(Some(v)) => out.push(v),
                Ok(None) => return Ok(Value::Array(out)),
                Err(e) => {
                    let mut trail = self.trail.borrow_mut();
                    if !trail.is_empty() {
                        trail.push(out.len().to_string());
                    }
                    return Err(e);
                }
            }
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                let message = format!("duplicate key {key:?}");
                *self.trail.borrow_mut() = vec![key];
                return Err(A::Error::custom(message));
            }
            match map.next_value_seed(self) {
                Ok(v) => {
                    out.insert(key, v);
                }
                Err(e) => {
                    let mut trail = self.trail.borrow_mut();
                    if !trail.is_empty() {
                        trail.push(key);
                    }
                    return Err(e);
                }
            }
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn decodes_as_serde_json_does() {
        for text in [
            r#"{"a":1,"b":[1,2.5,-3,"x",null,true,{"c":{}}],"d":"é\u0000"}"#,
            "[]",
            "12345678901234567890",
            "\"s\"",
        ] {
            let ours = from_slice(text.as_bytes()).unwrap();
            let theirs: Value = serde_json::from_str(text).unwrap();
            assert_eq!(ours, theirs, "{text}");
        }
        assert!(matches!(
            from_slice(b"{\"a\":1} x"),
            Err(JsonDecodeError::Syntax(_))
        ));
        assert!(matches!(
            from_slice(b"{\"a\":"),
            Err(JsonDecodeError::Syntax(_))
        ));
    }

    #[test]
    fn refuses_a_duplicate_key_at_any_depth_naming_its_path() {
        let dup = |text: &str| match from_slice(text.as_bytes()) {
            Err(JsonDecodeError::DuplicateKey { key, path }) => json!([key, path]),
            other => panic!("{text}: {other:?}"),
        };
        assert_eq!(
            dup(r#"{"method":"session/list","method":"session/close"}"#),
            json!(["method", "/method"])
        );
        assert_eq!(
            dup(r#"{"params":{"prompt":[{"text":"a"},{"type":"x","type":"y"}]}}"#),
            json!(["type", "/params/prompt/1/type"])
        );
        assert_eq!(dup(r#"{"a/b":{"~":1,"~":2}}"#), json!(["~", "/a~1b/~0"]));
        // The same key in sibling objects is no duplicate.
        assert!(from_slice(br#"[{"a":1},{"a":2}]"#).is_ok());
    }
}
