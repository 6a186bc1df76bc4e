//! Payload fingerprints: what makes "the same request".

use serde::{
    de::{self, Deserializer, MapAccess, SeqAccess, Visitor},
    Deserialize, Serialize,
};
use serde_json::{Number, Value};
use sha2::{Digest, Sha256};
use std::{borrow::Cow, fmt, io::Write};

/// The sha256 of a request payload, stored with the record and compared on
/// every retry: a key reused with another payload is a mismatch, never a
/// replay of the other request's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// The fingerprint of raw bytes.
    pub fn of_bytes(payload: &[u8]) -> Self {
        Self(hex::encode(Sha256::digest(payload)))
    }

    /// The fingerprint of a serialisable value, canonicalised: object keys
    /// are sorted, so two maps with the same entries in another order (a
    /// `HashMap`, or JSON from another client) have the same fingerprint.
    pub fn of_json<T: Serialize + ?Sized>(payload: &T) -> Result<Self, serde_json::Error> {
        let value = serde_json::to_value(payload)?;
        let mut hasher = Sha256::new();
        write_canonical(&value, &mut HashWriter(&mut hasher))?;
        Ok(Self(hex::encode(hasher.finalize())))
    }

    /// Builds a fingerprint from parts hashed one after another, each
    /// length-prefixed so that part boundaries cannot shift (`"ab" + "c"` and
    /// `"a" + "bc"` differ).
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        Self(hex::encode(hasher.finalize()))
    }

    /// The fingerprint of `parts` (each length-prefixed, as in
    /// [`of_parts`](Fingerprint::of_parts)) followed by the canonical form of
    /// the JSON document `json`, or `None` if `json` is not JSON. One pass:
    /// the document is parsed without copying its strings and written
    /// straight into the hash.
    pub(crate) fn of_parts_and_json(parts: &[&[u8]], json: &[u8]) -> Option<Self> {
        let document: Canonical<'_> = serde_json::from_slice(json).ok()?;
        let mut hasher = Sha256::new();
        for part in parts {
            hasher.update((part.len() as u64).to_be_bytes());
            hasher.update(part);
        }
        document.write(&mut HashWriter(&mut hasher)).ok()?;
        Some(Self(hex::encode(hasher.finalize())))
    }

    /// Wraps a fingerprint read back from a store.
    pub fn from_stored(hex: impl Into<String>) -> Self {
        Self(hex.into())
    }

    /// The fingerprint as stored (lowercase hex).
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `value` as compact JSON with every object's keys sorted.
pub(crate) fn canonical_json(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec fails only if a map key is not a string, which a
    // `Value` cannot hold.
    let _ = write_canonical(value, &mut out);
    out
}

/// Writes `value` as compact JSON with every object's keys sorted.
///
/// Sorting here, rather than relying on `serde_json::Map` being a sorted
/// map, matters: serde_json's `preserve_order` feature (enabled in most
/// programs through the AWS SDK's HTTPS client) makes it keep insertion
/// order, and then two equal objects would hash differently.
fn write_canonical<W: std::io::Write>(value: &Value, out: &mut W) -> Result<(), serde_json::Error> {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.write_all(b"{").map_err(serde_json::Error::io)?;
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.write_all(b",").map_err(serde_json::Error::io)?;
                }
                serde_json::to_writer(&mut *out, key)?;
                out.write_all(b":").map_err(serde_json::Error::io)?;
                write_canonical(value, out)?;
            }
            out.write_all(b"}").map_err(serde_json::Error::io)
        }
        Value::Array(items) => {
            out.write_all(b"[").map_err(serde_json::Error::io)?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.write_all(b",").map_err(serde_json::Error::io)?;
                }
                write_canonical(item, out)?;
            }
            out.write_all(b"]").map_err(serde_json::Error::io)
        }
        scalar => serde_json::to_writer(out, scalar),
    }
}

/// A JSON document parsed for canonicalisation: strings borrowed from the
/// input where they have no escapes, objects as entries sorted by key (the
/// last of duplicate keys wins, as in `serde_json::Value`), numbers as
/// `serde_json::Number`, so the output is byte for byte `canonical_json`'s.
enum Canonical<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(Cow<'a, str>),
    Array(Vec<Canonical<'a>>),
    Object(Vec<(Cow<'a, str>, Canonical<'a>)>),
}

impl Canonical<'_> {
    fn write<W: Write>(&self, out: &mut W) -> Result<(), serde_json::Error> {
        match self {
            Canonical::Null => out.write_all(b"null").map_err(serde_json::Error::io),
            Canonical::Bool(b) => out
                .write_all(if *b { b"true" } else { b"false" })
                .map_err(serde_json::Error::io),
            Canonical::Number(n) => serde_json::to_writer(out, n),
            Canonical::String(s) => serde_json::to_writer(out, &**s),
            Canonical::Array(items) => {
                out.write_all(b"[").map_err(serde_json::Error::io)?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.write_all(b",").map_err(serde_json::Error::io)?;
                    }
                    item.write(out)?;
                }
                out.write_all(b"]").map_err(serde_json::Error::io)
            }
            Canonical::Object(entries) => {
                out.write_all(b"{").map_err(serde_json::Error::io)?;
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.write_all(b",").map_err(serde_json::Error::io)?;
                    }
                    serde_json::to_writer(&mut *out, &**key)?;
                    out.write_all(b":").map_err(serde_json::Error::io)?;
                    value.write(out)?;
                }
                out.write_all(b"}").map_err(serde_json::Error::io)
            }
        }
    }
}

impl<'de> Deserialize<'de> for Canonical<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(CanonicalVisitor)
    }
}

struct CanonicalVisitor;

impl<'de> Visitor<'de> for CanonicalVisitor {
    type Value = Canonical<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Canonical::Null)
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Canonical::Null)
    }

    fn visit_bool<E>(self, b: bool) -> Result<Self::Value, E> {
        Ok(Canonical::Bool(b))
    }

    fn visit_u64<E>(self, n: u64) -> Result<Self::Value, E> {
        Ok(Canonical::Number(n.into()))
    }

    fn visit_i64<E>(self, n: i64) -> Result<Self::Value, E> {
        Ok(Canonical::Number(n.into()))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
        Number::from_f64(n)
            .map(Canonical::Number)
            .ok_or_else(|| E::custom("not a JSON number"))
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
        Ok(Canonical::String(Cow::Borrowed(s)))
    }

    fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
        Ok(Canonical::String(Cow::Owned(s.to_owned())))
    }

    fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
        Ok(Canonical::String(Cow::Owned(s)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Canonical::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries: Vec<(Cow<'de, str>, Canonical<'de>)> =
            Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(key) = map.next_key::<Canonical<'de>>()? {
            let Canonical::String(key) = key else {
                return Err(de::Error::custom("an object key that is not a string"));
            };
            entries.push((key, map.next_value()?));
        }
        // Stable: equal keys stay in document order, and the last one wins.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.reverse();
        entries.dedup_by(|later, earlier| later.0 == earlier.0);
        entries.reverse();
        Ok(Canonical::Object(entries))
    }
}

struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn json_key_order_does_not_matter() {
        let a: serde_json::Value =
            serde_json::from_str(r#"{"a":1,"b":{"x":[1,2],"y":null}}"#).unwrap();
        let b: serde_json::Value =
            serde_json::from_str(r#"{ "b": {"y": null, "x": [1, 2]}, "a": 1 }"#).unwrap();
        assert_eq!(
            Fingerprint::of_json(&a).unwrap(),
            Fingerprint::of_json(&b).unwrap()
        );

        let map: HashMap<&str, i32> = [("k1", 1), ("k2", 2), ("k3", 3)].into();
        let reversed: HashMap<&str, i32> = [("k3", 3), ("k2", 2), ("k1", 1)].into();
        assert_eq!(
            Fingerprint::of_json(&map).unwrap(),
            Fingerprint::of_json(&reversed).unwrap()
        );
    }

    #[test]
    fn canonical_form_sorts_nested_keys_whatever_the_map_order() {
        // Built in insertion order on purpose: with serde_json's
        // `preserve_order` (on in this crate's test build, through the AWS
        // SDK) the map keeps it, and the canonical writer must still sort.
        let mut inner = serde_json::Map::new();
        inner.insert("z".into(), Value::from(1));
        inner.insert("a".into(), Value::from("x\"y"));
        let mut outer = serde_json::Map::new();
        outer.insert(
            "list".into(),
            Value::Array(vec![Value::Object(inner), Value::Null]),
        );
        outer.insert("b".into(), Value::from(1.5));
        let mut out = Vec::new();
        write_canonical(&Value::Object(outer), &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"b":1.5,"list":[{"a":"x\"y","z":1},null]}"#
        );
    }

    /// Found by the `json_fingerprint` fuzz target: a number beyond u64
    /// parses as a float, and without correctly rounded float parsing its
    /// canonical form read back as another float, so the canonical form was
    /// not a fixed point.
    #[test]
    fn canonical_form_is_a_fixed_point_for_large_numbers() {
        for input in [
            "1111111111111166111667",
            "[1e400]",
            "-0.0",
            "123456789012345678901234567890",
            "0.30000000000000004",
        ] {
            let Ok(value) = serde_json::from_str::<Value>(input) else {
                continue;
            };
            let canonical = canonical_json(&value);
            let reparsed: Value = serde_json::from_slice(&canonical).unwrap();
            assert_eq!(reparsed, value, "{input}");
            assert_eq!(canonical_json(&reparsed), canonical, "{input}");
        }
    }

    #[test]
    fn one_pass_canonicalisation_matches_the_value_path() {
        for input in [
            r#"{"b":1,"a":{"z":[1,2.5,-3,{"y":null,"x":true}],"a":"\u00e9\"q"},"c":"plain"}"#,
            r#"{"dup":1,"dup":2,"a":0}"#,
            r#"[1e400, 1111111111111166111667, -0.0, 18446744073709551615, -9223372036854775808]"#,
            r#""just a string with \n escapes""#,
            "  42 ",
        ] {
            let Ok(value) = serde_json::from_str::<Value>(input) else {
                continue;
            };
            let document: Canonical<'_> = serde_json::from_str(input).unwrap();
            let mut one_pass = Vec::new();
            document.write(&mut one_pass).unwrap();
            assert_eq!(
                String::from_utf8(one_pass).unwrap(),
                String::from_utf8(canonical_json(&value)).unwrap(),
                "{input}"
            );
        }
        assert!(Fingerprint::of_parts_and_json(&[b"x"], b"{not json").is_none());
    }

    #[test]
    fn different_values_differ() {
        let a = serde_json::json!({"amount": 100});
        let b = serde_json::json!({"amount": 101});
        assert_ne!(
            Fingerprint::of_json(&a).unwrap(),
            Fingerprint::of_json(&b).unwrap()
        );
        assert_ne!(Fingerprint::of_bytes(b"x"), Fingerprint::of_bytes(b"y"));
    }

    #[test]
    fn parts_are_length_prefixed() {
        assert_ne!(
            Fingerprint::of_parts([b"ab".as_slice(), b"c"]),
            Fingerprint::of_parts([b"a".as_slice(), b"bc"])
        );
    }
}
