//! Canonical JSON: object keys sorted (by their UTF-8 bytes, which is code
//! point order), no insignificant whitespace, strings escaped as serde_json
//! escapes them, numbers in serde_json's shortest round-trip form. Two values
//! that are equal as JSON give the same bytes, whatever the key order they
//! were built or parsed with. Receipts are signed over it
//! ([`crate::receipt`]), and the session view's projection hash is taken
//! over it.
//!
//! [`write_value`] writes a [`Value`]. [`write_serialized`] writes any
//! `Serialize` type straight from its serde form, byte for byte what
//! `write_value(&serde_json::to_value(x)?)` writes, without building the
//! `Value` tree first (a receipt is signed on the hot path of every suspend,
//! resume and drain decision, and building the tree was most of that cost).

use std::borrow::Cow;
use std::ops::Range;

use serde::ser::{self, Error as _, Serialize};
use serde_json::{Error, Value};

/// Canonical JSON of `value` as a string.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::new();
    write_value(value, &mut out);
    // serde_json writes only UTF-8 (its input strings are `str`).
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Writes `value` canonically into `out`. Scalars and strings go through
/// serde_json's own writer (the same bytes its `Display` gives), straight
/// into `out`: nothing is cloned or formatted twice.
pub fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {
            // Writing JSON scalars into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, value);
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                let _ = serde_json::to_writer(&mut *out, key);
                out.push(b':');
                write_value(item, out);
            }
            out.push(b'}');
        }
    }
}

/// Writes `value`'s serde form canonically into `out`: the bytes
/// `write_value(&serde_json::to_value(value)?, out)` writes.
///
/// # Errors
/// What `serde_json::to_value` would fail with (a map key that is not a
/// string, a number or a bool; an integer beyond 64 bits; the type's own
/// error). `out` may then hold part of the value: the caller decides what
/// the failure writes.
pub fn write_serialized<T: Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) -> Result<(), Error> {
    value.serialize(Canonical { out })
}

/// Writes a scalar the way serde_json writes it (its `Value` writes the same).
fn scalar<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), Error> {
    serde_json::to_writer(out, value)
}

/// The serializer behind [`write_serialized`].
struct Canonical<'a> {
    out: &'a mut Vec<u8>,
}

/// `Serializer` methods whose value serde_json writes as it is (a `Value`
/// holds it unchanged).
macro_rules! scalar_methods {
    ($($method:ident: $t:ty),*) => {$(
        fn $method(self, v: $t) -> Result<(), Error> {
            scalar(self.out, &v)
        }
    )*};
}

impl<'a> ser::Serializer for Canonical<'a> {
    type Ok = ();
    type Error = Error;
    type SerializeSeq = Seq<'a>;
    type SerializeTuple = Seq<'a>;
    type SerializeTupleStruct = Seq<'a>;
    type SerializeTupleVariant = Seq<'a>;
    type SerializeMap = Object<'a>;
    type SerializeStruct = Object<'a>;
    type SerializeStructVariant = Object<'a>;

    scalar_methods!(
        serialize_bool: bool,
        serialize_i8: i8,
        serialize_i16: i16,
        serialize_i32: i32,
        serialize_i64: i64,
        serialize_u8: u8,
        serialize_u16: u16,
        serialize_u32: u32,
        serialize_u64: u64,
        serialize_char: char
    );

    fn serialize_i128(self, v: i128) -> Result<(), Error> {
        // A `Value` number holds 64 bits.
        match (i64::try_from(v), u64::try_from(v)) {
            (Ok(v), _) => scalar(self.out, &v),
            (_, Ok(v)) => scalar(self.out, &v),
            _ => Err(Error::custom("number out of range")),
        }
    }
    fn serialize_u128(self, v: u128) -> Result<(), Error> {
        match u64::try_from(v) {
            Ok(v) => scalar(self.out, &v),
            Err(_) => Err(Error::custom("number out of range")),
        }
    }
    fn serialize_f32(self, v: f32) -> Result<(), Error> {
        // A `Value` holds an f32 as the f64 it widens to.
        scalar(self.out, &f64::from(v))
    }
    fn serialize_f64(self, v: f64) -> Result<(), Error> {
        // Non-finite: `null`, as a `Value` holds it.
        scalar(self.out, &v)
    }
    fn serialize_str(self, v: &str) -> Result<(), Error> {
        scalar(self.out, v)
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Error> {
        // A `Value` holds bytes as an array of numbers.
        scalar(self.out, v)
    }
    fn serialize_none(self) -> Result<(), Error> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Error> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Error> {
        self.serialize_none()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Error> {
        scalar(self.out, variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        // `{"variant": value}`: one key, nothing to sort.
        self.out.push(b'{');
        scalar(self.out, variant)?;
        self.out.push(b':');
        value.serialize(Canonical {
            out: &mut *self.out,
        })?;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Seq<'a>, Error> {
        Ok(Seq::open(self.out, None))
    }
    fn serialize_tuple(self, len: usize) -> Result<Seq<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(self, _name: &'static str, len: usize) -> Result<Seq<'a>, Error> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Seq<'a>, Error> {
        Ok(Seq::open(self.out, Some(variant)))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Object<'a>, Error> {
        Ok(Object::new(self.out, None))
    }
    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Object<'a>, Error> {
        Ok(Object::new(self.out, None))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Object<'a>, Error> {
        Ok(Object::new(self.out, Some(variant)))
    }
}

/// An array being written (inside `{"variant": …}` for a tuple variant).
struct Seq<'a> {
    out: &'a mut Vec<u8>,
    first: bool,
    variant: bool,
}

impl<'a> Seq<'a> {
    fn open(out: &'a mut Vec<u8>, variant: Option<&'static str>) -> Self {
        if let Some(variant) = variant {
            out.push(b'{');
            // A variant name is a plain string.
            let _ = scalar(out, variant);
            out.push(b':');
        }
        out.push(b'[');
        Seq {
            out,
            first: true,
            variant: variant.is_some(),
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        if !self.first {
            self.out.push(b',');
        }
        self.first = false;
        value.serialize(Canonical {
            out: &mut *self.out,
        })
    }

    fn close(self) -> Result<(), Error> {
        self.out.push(b']');
        if self.variant {
            self.out.push(b'}');
        }
        Ok(())
    }
}

/// The four array-shaped serde traits, all [`Seq::element`] then
/// [`Seq::close`].
macro_rules! seq_impl {
    ($($trait:ident :: $method:ident),*) => {$(
        impl ser::$trait for Seq<'_> {
            type Ok = ();
            type Error = Error;
            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
                self.element(value)
            }
            fn end(self) -> Result<(), Error> {
                self.close()
            }
        }
    )*};
}

seq_impl!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// An object being collected: each value is written into `values` as it
/// comes; on `end` the entries are written sorted by key (the last of equal
/// keys wins, as in a `Value` map), inside `{"variant": …}` for a struct
/// variant.
struct Object<'a> {
    out: &'a mut Vec<u8>,
    variant: Option<&'static str>,
    values: Vec<u8>,
    entries: Vec<(Cow<'static, str>, Range<usize>)>,
    key: Option<Cow<'static, str>>,
}

impl<'a> Object<'a> {
    fn new(out: &'a mut Vec<u8>, variant: Option<&'static str>) -> Self {
        Object {
            out,
            variant,
            values: Vec::new(),
            entries: Vec::new(),
            key: None,
        }
    }

    fn entry<T: Serialize + ?Sized>(
        &mut self,
        key: Cow<'static, str>,
        value: &T,
    ) -> Result<(), Error> {
        let start = self.values.len();
        value.serialize(Canonical {
            out: &mut self.values,
        })?;
        self.entries.push((key, start..self.values.len()));
        Ok(())
    }

    fn close(mut self) -> Result<(), Error> {
        // Stable: of equal keys the last written stays last.
        self.entries.sort_by(|a, b| a.0.cmp(&b.0));
        if let Some(variant) = self.variant {
            self.out.push(b'{');
            scalar(self.out, variant)?;
            self.out.push(b':');
        }
        self.out.push(b'{');
        let mut first = true;
        for (i, (key, range)) in self.entries.iter().enumerate() {
            if self.entries.get(i + 1).is_some_and(|next| next.0 == *key) {
                continue;
            }
            if !first {
                self.out.push(b',');
            }
            first = false;
            scalar(self.out, key.as_ref())?;
            self.out.push(b':');
            self.out.extend_from_slice(&self.values[range.clone()]);
        }
        self.out.push(b'}');
        if self.variant.is_some() {
            self.out.push(b'}');
        }
        Ok(())
    }
}

/// A map key as a `Value` map holds it: a string as is, a number or a bool
/// in its JSON form; anything else is refused as serde_json refuses it.
fn key_string<T: Serialize + ?Sized>(key: &T) -> Result<String, Error> {
    match serde_json::to_value(key)? {
        Value::String(key) => Ok(key),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(Error::custom("key must be a string")),
    }
}

impl ser::SerializeMap for Object<'_> {
    type Ok = ();
    type Error = Error;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        self.key = Some(Cow::Owned(key_string(key)?));
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Error::custom("a map value came before its key"))?;
        self.entry(key, value)
    }
    fn end(self) -> Result<(), Error> {
        self.close()
    }
}

/// Struct fields and struct-variant fields: entries keyed by field name.
macro_rules! struct_impl {
    ($($trait:ident),*) => {$(
        impl ser::$trait for Object<'_> {
            type Ok = ();
            type Error = Error;
            fn serialize_field<T: Serialize + ?Sized>(
                &mut self,
                key: &'static str,
                value: &T,
            ) -> Result<(), Error> {
                self.entry(Cow::Borrowed(key), value)
            }
            fn end(self) -> Result<(), Error> {
                self.close()
            }
        }
    )*};
}

struct_impl!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;
    use serde_json::json;

    use super::*;

    /// What the signing bytes were built from before: the `Value` first.
    fn through_value<T: Serialize>(value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        write_value(
            &serde_json::to_value(value).unwrap_or(Value::Null),
            &mut out,
        );
        out
    }

    fn direct<T: Serialize>(value: &T) -> Vec<u8> {
        let mut out = Vec::new();
        write_serialized(value, &mut out).unwrap();
        out
    }

    #[derive(Serialize)]
    enum Shape {
        Unit,
        Newtype(u8),
        Tuple(i32, String),
        Struct { z: bool, a: Option<f64> },
    }

    #[derive(Serialize)]
    struct Unit;

    #[derive(Serialize)]
    struct Wrapper(String);

    #[derive(Serialize)]
    struct Inner {
        zeta: String,
        alpha: Vec<Shape>,
    }

    #[derive(Serialize)]
    struct Everything {
        zz: u64,
        b: i64,
        aa: f64,
        f32: f32,
        nan: f64,
        text: String,
        ch: char,
        none: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        skipped: Option<String>,
        unit: (),
        unit_struct: Unit,
        wrapper: Wrapper,
        big: u128,
        small: i128,
        tuple: (u8, &'static str),
        bytes: &'static [u8],
        shapes: Vec<Shape>,
        inner: Inner,
        value: Value,
        map: BTreeMap<u32, String>,
        #[serde(flatten)]
        flat: BTreeMap<String, Value>,
    }

    #[test]
    fn it_writes_what_the_value_tree_wrote() {
        let everything = Everything {
            zz: u64::MAX,
            b: -7,
            aa: 0.016_666_666_666_666_666,
            f32: 0.1,
            nan: f64::NAN,
            text: "quote \" backslash \\ newline \n tab \t nul \u{0} é 日本 \u{1F600}".into(),
            ch: '\u{7f}',
            none: None,
            skipped: None,
            unit: (),
            unit_struct: Unit,
            wrapper: Wrapper("w".into()),
            big: 12,
            small: -12,
            tuple: (1, "two"),
            bytes: b"\x00\xff",
            shapes: vec![
                Shape::Unit,
                Shape::Newtype(3),
                Shape::Tuple(-1, "t".into()),
                Shape::Struct {
                    z: true,
                    a: Some(1e300),
                },
                Shape::Struct { z: false, a: None },
            ],
            inner: Inner {
                zeta: "z".into(),
                alpha: vec![],
            },
            value: json!({"z": [1, {"y": null, "b": 2.5}], "a": {"d": "x", "c": true}, "": 0}),
            map: [(10, "ten".into()), (2, "two".into())].into(),
            flat: [
                ("zz".to_owned(), json!("flattened last wins")),
                ("m".to_owned(), json!({"q": 1, "p": 2})),
            ]
            .into(),
        };
        assert_eq!(
            String::from_utf8(direct(&everything)).unwrap(),
            String::from_utf8(through_value(&everything)).unwrap()
        );
        for value in [
            json!(null),
            json!([]),
            json!({}),
            json!("s"),
            json!(-0.0),
            json!(1.5e-7),
            json!([{"b": 1, "a": [{"d": 1, "c": 2}]}]),
        ] {
            assert_eq!(direct(&value), through_value(&value), "{value}");
        }
    }

    #[test]
    fn refusals_match_serde_json() {
        #[derive(Serialize)]
        struct Huge {
            n: u128,
        }
        let mut out = Vec::new();
        assert!(write_serialized(&Huge { n: u128::MAX }, &mut out).is_err());
        assert!(serde_json::to_value(Huge { n: u128::MAX }).is_err());
        let keyed: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(write_serialized(&keyed, &mut Vec::new()).is_err());
        assert!(serde_json::to_value(&keyed).is_err());
    }
}
