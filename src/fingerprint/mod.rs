//! Payload fingerprints: what makes "the same request".

mod canonical;
mod pointer;
mod streaming;

pub use pointer::{InvalidJsonPointer, JsonPointer};

pub(crate) use canonical::select;
#[cfg(feature = "http")]
pub(crate) use canonical::{pointed, Pointed};
pub(crate) use streaming::{canonical, write_canonical};

use crate::lower_hex::shared_lower_hex;
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::{fmt, sync::Arc};

/// The sha256 of a request payload, stored with the record and compared on
/// every retry: a key reused with another payload is a mismatch, never a
/// replay of the other request's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fingerprint(Arc<str>);

impl Fingerprint {
    /// The fingerprint of raw bytes.
    pub fn of_bytes(payload: &[u8]) -> Self {
        Self(shared_lower_hex(&[], &Sha256::digest(payload)))
    }

    /// The fingerprint of a serialisable value, as canonical JSON: object
    /// keys sorted, so two maps with the same entries in another order (a
    /// `HashMap`, or JSON from another client) have the same fingerprint;
    /// numbers by their exact text, so two values that differ anywhere,
    /// 128-bit integers included, never share one.
    ///
    /// A value whose JSON has no canonical form (a hand-written `Serialize`
    /// that emits a key twice, or nesting deeper than 128) is fingerprinted
    /// by its serialised bytes. Fails only when the value cannot be
    /// serialised as JSON at all (a map with keys that are not strings or
    /// numbers, or a `Serialize` implementation that fails): that error is
    /// returned, never hashed.
    pub fn of_json<T: Serialize + ?Sized>(payload: &T) -> Result<Self, serde_json::Error> {
        let serialised = serde_json::to_vec(payload)?;
        let mut hasher = Sha256::new();
        if write_canonical(&serialised, &mut HashWriter(&mut hasher)).is_err() {
            hasher = Sha256::new();
            hasher.update(&serialised);
        }
        Ok(Self(shared_lower_hex(&[], &hasher.finalize())))
    }

    /// Builds a fingerprint from parts hashed one after another, each
    /// length-prefixed so that part boundaries cannot shift (`"ab" + "c"` and
    /// `"a" + "bc"` differ).
    pub fn of_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Self {
        Self(shared_lower_hex(&[], &hash_parts(parts).finalize()))
    }

    /// The fingerprint of `parts` (each length-prefixed, as in
    /// [`of_parts`](Fingerprint::of_parts)) followed by the canonical form of
    /// the JSON document `json`, or `None` if `json` has none (not JSON, a
    /// duplicate key, too deep). One pass over the document, written
    /// straight into the hash.
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn of_parts_and_json<'a>(
        parts: impl IntoIterator<Item = &'a [u8]>,
        json: &[u8],
    ) -> Option<Self> {
        let mut hasher = hash_parts(parts);
        write_canonical(json, &mut HashWriter(&mut hasher)).ok()?;
        Some(Self(shared_lower_hex(&[], &hasher.finalize())))
    }

    /// The fingerprint of the values at `pointers` in the JSON document
    /// `json`, each in canonical form (see [`of_json`](Fingerprint::of_json)),
    /// in the order given: what counts when the rest of a payload may change
    /// between honest retries (a timestamp, a nonce, a trace id the client
    /// generates again). A pointer with nothing at it counts as absent,
    /// which differs from a `null` there. A document that is not JSON (or
    /// holds a duplicate key, or is nested deeper than 128) has no parts to
    /// select: it is fingerprinted whole, by its bytes.
    ///
    /// ```
    /// use lambda_idempotency::{Fingerprint, JsonPointer};
    ///
    /// let pointers = [JsonPointer::new("/amount")?, JsonPointer::new("/currency")?];
    /// let first = br#"{"amount":1250,"currency":"eur","sent_at":"2026-11-24T10:00:00Z"}"#;
    /// let retry = br#"{"sent_at":"2026-11-24T10:00:05Z","currency":"eur","amount":1250}"#;
    /// let other = br#"{"amount":1251,"currency":"eur","sent_at":"2026-11-24T10:00:05Z"}"#;
    /// assert_eq!(Fingerprint::of_json_pointers(first, &pointers), Fingerprint::of_json_pointers(retry, &pointers));
    /// assert_ne!(Fingerprint::of_json_pointers(first, &pointers), Fingerprint::of_json_pointers(other, &pointers));
    /// # Ok::<(), lambda_idempotency::InvalidJsonPointer>(())
    /// ```
    pub fn of_json_pointers(json: &[u8], pointers: &[JsonPointer]) -> Self {
        Self(shared_lower_hex(&[], &selection(json, pointers).finalize()))
    }

    /// Wraps a fingerprint read back from a store.
    pub fn from_stored(hex: impl Into<String>) -> Self {
        Self(Arc::from(hex.into()))
    }

    /// Wraps one read back as text the store keeps: allocated once, where
    /// [`from_stored`](Self::from_stored) would make a `String` first.
    pub(crate) fn from_stored_text(hex: &str) -> Self {
        Self(Arc::from(hex))
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

/// A hash of `parts`, each length-prefixed, ready for more.
fn hash_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Sha256 {
    let mut hasher = Sha256::new();
    for part in parts {
        hash_part(&mut hasher, part);
    }
    hasher
}

/// The hash of the values at `pointers` in `json` (each length-prefixed,
/// absent ones marked), or of `json` whole when it has no canonical form.
pub(crate) fn selection(json: &[u8], pointers: &[JsonPointer]) -> Sha256 {
    let Ok(values) = select(json, pointers.iter().map(JsonPointer::as_str)) else {
        return hash_parts([&b"whole"[..], json]);
    };
    let mut hasher = hash_parts([&b"selected"[..]]);
    for (pointer, value) in pointers.iter().zip(&values) {
        hash_part(&mut hasher, pointer.as_str().as_bytes());
        match value {
            Some(value) => {
                hash_part(&mut hasher, b"value");
                hash_part(&mut hasher, value);
            }
            None => hash_part(&mut hasher, b"absent"),
        }
    }
    hasher
}

/// Hashes one length-prefixed part.
pub(crate) fn hash_part(hasher: &mut Sha256, part: &[u8]) {
    hasher.update((part.len() as u64).to_be_bytes());
    hasher.update(part);
}

/// `value` as canonical JSON (see the [`canonical`](mod@canonical) module).
#[cfg_attr(not(feature = "lambda"), allow(dead_code))]
pub(crate) fn canonical_json(value: &Value) -> Vec<u8> {
    // A `Value` always serialises, and cannot hold a duplicate key; only
    // nesting beyond the depth limit falls back to its plain serialisation.
    let serialised = serde_json::to_vec(value).unwrap_or_default();
    canonical(&serialised).unwrap_or(serialised)
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

    fn pointers(pointers: &[&str]) -> Vec<JsonPointer> {
        pointers
            .iter()
            .map(|pointer| JsonPointer::new(*pointer).unwrap())
            .collect()
    }

    #[test]
    fn selected_values_count_and_the_rest_does_not() {
        let selected = pointers(&["/order/id", "/amount"]);
        let of = |json: &str| Fingerprint::of_json_pointers(json.as_bytes(), &selected);
        let first = of(r#"{"order":{"id":7,"note":"a"},"amount":12.50,"nonce":"x1"}"#);
        assert_eq!(
            first,
            of(r#"{"nonce":"x2","amount":12.50,"order":{"note":"b","id":7}}"#)
        );
        // Exact numbers: 12.5 is not 12.50, and 20-digit ids never round.
        assert_ne!(first, of(r#"{"order":{"id":7},"amount":12.5}"#));
        let big = pointers(&["/id"]);
        assert_ne!(
            Fingerprint::of_json_pointers(br#"{"id":98765432109876543210}"#, &big),
            Fingerprint::of_json_pointers(br#"{"id":98765432109876543211}"#, &big)
        );
        // Absent, null and present differ.
        let absent = of(r#"{"order":{"id":7}}"#);
        assert_ne!(absent, of(r#"{"order":{"id":7},"amount":null}"#));
        assert_ne!(absent, first);
        // A selected object is canonical inside.
        let whole_order = pointers(&["/order"]);
        assert_eq!(
            Fingerprint::of_json_pointers(br#"{"order":{"a":1,"b":[1,2]}}"#, &whole_order),
            Fingerprint::of_json_pointers(br#"{"order":{ "b":[1, 2],"a":1 }}"#, &whole_order)
        );
        // The order of the pointers is part of the selection.
        let swapped = pointers(&["/amount", "/order/id"]);
        let json = br#"{"order":{"id":7},"amount":7}"#;
        assert_ne!(
            Fingerprint::of_json_pointers(json, &selected),
            Fingerprint::of_json_pointers(json, &swapped)
        );
    }

    #[test]
    fn a_document_without_a_canonical_form_counts_whole() {
        let selected = pointers(&["/a"]);
        let of = |json: &[u8]| Fingerprint::of_json_pointers(json, &selected);
        assert_eq!(of(b"not json"), of(b"not json"));
        assert_ne!(of(b"not json"), of(b"not json!"));
        // A duplicate key: parsers disagree on its value, so nothing is selected.
        assert_ne!(of(br#"{"a":1,"a":2,"b":1}"#), of(br#"{"a":1,"a":2,"b":2}"#));
        assert_ne!(of(b"not json"), of(br#"{"a":"not json"}"#));
    }

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
        assert_eq!(
            String::from_utf8(canonical_json(&Value::Object(outer))).unwrap(),
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

    /// Issue 10, item 8: values beyond 64 bits used to fail to serialise,
    /// and the error text was hashed, so all of them shared one fingerprint.
    #[test]
    fn values_beyond_64_bits_are_fingerprinted_exactly() {
        #[derive(serde::Serialize)]
        struct Transfer {
            amount: u128,
        }
        let a = Fingerprint::of_json(&Transfer { amount: u128::MAX }).unwrap();
        let b = Fingerprint::of_json(&Transfer {
            amount: u128::MAX - 1,
        })
        .unwrap();
        assert_ne!(a, b);
        assert_eq!(
            a,
            Fingerprint::of_json(&Transfer { amount: u128::MAX }).unwrap()
        );
    }

    #[test]
    fn values_that_do_not_serialise_are_an_error_not_a_fingerprint() {
        let map: HashMap<(u8, u8), u8> = [((1, 2), 3)].into();
        assert!(Fingerprint::of_json(&map).is_err());
    }

    #[test]
    fn json_bodies_with_no_canonical_form_are_refused() {
        assert!(Fingerprint::of_parts_and_json([b"x".as_slice()], b"{not json").is_none());
        assert!(Fingerprint::of_parts_and_json([b"x".as_slice()], br#"{"a":1,"a":2}"#).is_none());
        assert_eq!(
            Fingerprint::of_parts_and_json([b"x".as_slice()], br#"{ "b":2, "a":1 }"#),
            Fingerprint::of_parts_and_json([b"x".as_slice()], br#"{"a":1,"b":2}"#)
        );
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
