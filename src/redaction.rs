//! What a record keeps of a value: all of it, or with what must never be
//! stored removed or masked (a one-time secret, a full card number), while
//! the first caller gets the whole value.
//!
//! [`Redact`] wraps any [`Codec`] with a function of your own;
//! [`RedactedJson`] stores values as JSON with the fields a
//! [`JsonRedaction`] names removed or replaced. The HTTP layer takes the
//! same [`JsonRedaction`], or a hook of its own, and can keep no body at
//! all (`IdempotencyLayer::redact_json`, `redact` and `withhold_bodies`).
//!
//! A retry gets the value as it was stored, redacted, marked as a replay
//! (`Outcome::Replayed`, the `Idempotent-Replayed: true` header): never
//! the fields taken out, and never a second run. That is safe because a
//! retry needs to know what happened, not to receive the secret a second
//! time: the caller that sent the request got it once, as a response with
//! no idempotency key would have given it, and a caller that lost that
//! response fetches the resource it names (its id is kept) through the
//! API's own read path, with its own authorisation. A retry that needs the
//! removed field cannot get it from the record, by design: keep the field
//! out of the redaction if retries must see it.
//!
//! The local cache and the duplicates that wait on a run in the same
//! process read the stored value too, so they get it redacted as well.

use crate::{error::BoxError, Codec, JsonPointer};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// Fields of a JSON document removed or replaced before it is stored,
/// each named by a [`JsonPointer`]. A field the document does not have is
/// left absent (a replacement never adds one).
///
/// ```
/// use lambda_idempotency::{JsonPointer, JsonRedaction};
/// use serde_json::json;
///
/// let redaction = JsonRedaction::new()
///     .remove(JsonPointer::new("/client_secret")?)
///     .replace(JsonPointer::new("/card/number")?, "************4242");
/// let mut charge = json!({
///     "id": "ch_1",
///     "client_secret": "pi_1_secret_x",
///     "card": { "number": "4242424242424242", "exp": "12/30" },
/// });
/// redaction.apply(&mut charge);
/// assert_eq!(charge, json!({ "id": "ch_1", "card": { "number": "************4242", "exp": "12/30" } }));
/// # Ok::<(), lambda_idempotency::InvalidJsonPointer>(())
/// ```
#[derive(Debug, Clone, Default)]
pub struct JsonRedaction {
    edits: Vec<(JsonPointer, Edit)>,
}

#[derive(Debug, Clone)]
enum Edit {
    Remove,
    Replace(Value),
}

impl JsonRedaction {
    /// A redaction that changes nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Removes the field at `pointer` (an array element is removed, and
    /// the elements after it move up; the empty pointer, the whole
    /// document, leaves `null`).
    pub fn remove(mut self, pointer: JsonPointer) -> Self {
        self.edits.push((pointer, Edit::Remove));
        self
    }

    /// Replaces the value at `pointer`, where there is one, with `with`.
    pub fn replace(mut self, pointer: JsonPointer, with: impl Into<Value>) -> Self {
        self.edits.push((pointer, Edit::Replace(with.into())));
        self
    }

    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.edits.is_empty()
    }

    /// Applies every edit to `document`, in the order they were added.
    pub fn apply(&self, document: &mut Value) {
        for (pointer, edit) in &self.edits {
            match edit {
                Edit::Replace(with) => {
                    if let Some(value) = document.pointer_mut(pointer.as_str()) {
                        *value = with.clone();
                    }
                }
                Edit::Remove => remove(document, pointer.as_str()),
            }
        }
    }
}

/// Removes the value at `pointer` (RFC 6901) from `document`, if there is
/// one.
fn remove(document: &mut Value, pointer: &str) {
    // A checked pointer is empty (the whole document: nothing of it is
    // kept) or starts with `/`.
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        *document = Value::Null;
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match document.pointer_mut(parent) {
        Some(Value::Object(object)) => {
            object.remove(&last);
        }
        Some(Value::Array(array)) => {
            // RFC 6901's index: `0`, or digits without a leading zero (no
            // sign), as serde_json's own `pointer_mut` reads it.
            let digits = !last.is_empty() && last.bytes().all(|b| b.is_ascii_digit());
            if let (true, Ok(index)) = (digits, last.parse::<usize>()) {
                if index < array.len() && (last == "0" || !last.starts_with('0')) {
                    array.remove(index);
                }
            }
        }
        _ => {}
    }
}

/// A [`Codec`] that stores each value as `redact` leaves it, through
/// `codec`: the first caller gets the value the operation returned, every
/// replay the redacted one.
///
/// ```
/// use lambda_idempotency::{Engine, Json, MemoryStore, Redact};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Clone, Serialize, Deserialize)]
/// struct Charge {
///     id: String,
///     client_secret: Option<String>,
/// }
///
/// // Stored without its secret; replays read `client_secret: None`.
/// let codec = Redact::new(Json, |charge: &Charge| Charge { client_secret: None, ..charge.clone() });
/// # let _ = (codec, Engine::builder(MemoryStore::new()).build());
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Redact<C, F> {
    codec: C,
    redact: F,
}

impl<C, F> Redact<C, F> {
    /// Stores values through `codec` as `redact` leaves them.
    pub fn new(codec: C, redact: F) -> Self {
        Self { codec, redact }
    }
}

impl<T, C: Codec<T>, F: Fn(&T) -> T> Codec<T> for Redact<C, F> {
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        self.codec.encode(&(self.redact)(value))
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        self.codec.decode(bytes)
    }
}

/// A [`Codec`] that stores values as JSON (as [`Json`](crate::Json)
/// does) with the fields its [`JsonRedaction`] names removed or replaced.
///
/// What is stored must still read back as the value's type: a required
/// field removed, or replaced with a value of another type, would make
/// every replay fail to decode. The codec reads it back when it stores it,
/// so such a redaction shows at the first request that completes: its
/// caller gets the value, `OutcomeKind::NotRecorded`, nothing is stored,
/// and the claim holds the key until the record would have expired
/// (retries are told it is in progress, never run again, never given a
/// record they cannot read). Remove `Option` fields and fields with
/// `#[serde(default)]`; replace others with a value of their type.
///
/// With an empty redaction it is [`Json`](crate::Json), at its cost.
#[derive(Debug, Clone, Default)]
pub struct RedactedJson(pub JsonRedaction);

impl<T: Serialize + DeserializeOwned> Codec<T> for RedactedJson {
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        if self.0.is_empty() {
            // As `Json`: nothing to take out, nothing to read back.
            return Ok(serde_json::to_vec(value)?);
        }
        let mut document = serde_json::to_value(value)?;
        self.0.apply(&mut document);
        let bytes = serde_json::to_vec(&document)?;
        serde_json::from_slice::<T>(&bytes)
            .map_err(|error| format!("the redacted value no longer reads as its type: {error}"))?;
        Ok(bytes)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Whether `json` holds a number that a `serde_json::Value` cannot hold
/// exactly: an integer past `i64` or `u64`, or a decimal with more digits
/// than an `f64` keeps (`0.123456789012345678901`). Written again, it would
/// come out rounded. `1.50` is not one: it comes out `1.5`, the same value.
/// Numbers inside strings are not numbers.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) fn has_number_a_value_rounds(json: &[u8]) -> bool {
    let mut in_string = false;
    let mut escaped = false;
    let mut at = 0;
    while at < json.len() {
        let byte = json[at];
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            at += 1;
            continue;
        }
        if byte == b'"' {
            in_string = true;
            at += 1;
            continue;
        }
        if byte == b'-' || byte.is_ascii_digit() {
            let end = json[at..]
                .iter()
                .position(|b| !matches!(b, b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'))
                .map_or(json.len(), |length| at + length);
            let token = &json[at..end];
            let integer = !token.iter().any(|b| matches!(b, b'.' | b'e' | b'E'));
            let text = std::str::from_utf8(token).unwrap_or_default();
            let rounded = if integer {
                text.parse::<i64>().is_err() && text.parse::<u64>().is_err()
            } else {
                !decimal_survives_f64(text)
            };
            if rounded {
                return true;
            }
            at = end;
            continue;
        }
        at += 1;
    }
    false
}

/// Whether the decimal `text` is exactly the value of the `f64` it parses
/// to, written as Rust writes it (the shortest decimal that reads back).
#[cfg_attr(not(feature = "http"), allow(dead_code))]
fn decimal_survives_f64(text: &str) -> bool {
    let Ok(parsed) = text.parse::<f64>() else {
        return false;
    };
    if !parsed.is_finite() {
        return false;
    }
    match (decimal_digits(text), decimal_digits(&parsed.to_string())) {
        (Some(written), Some(read_back)) => written == read_back,
        _ => false,
    }
}

/// A decimal as its sign, significant digits and the power of ten of the
/// point after them (`-1.50e1` is `(true, "15", 2)`, and zero has no
/// digits and no sign); `None` for an exponent past `i64`.
#[cfg_attr(not(feature = "http"), allow(dead_code))]
fn decimal_digits(text: &str) -> Option<(bool, String, i64)> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], unsigned[at + 1..].parse::<i64>().ok()?),
        None => (unsigned, 0),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{whole}{fraction}");
    let leading = digits.len() - digits.trim_start_matches('0').len();
    let point = i64::try_from(whole.len())
        .ok()?
        .checked_add(exponent)?
        .checked_sub(i64::try_from(leading).ok()?)?;
    let significant = digits.trim_start_matches('0').trim_end_matches('0');
    if significant.is_empty() {
        return Some((false, String::new(), 0));
    }
    Some((negative, significant.to_owned(), point))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    fn pointer(pointer: &str) -> JsonPointer {
        JsonPointer::new(pointer).unwrap()
    }

    #[test]
    fn fields_are_removed_or_replaced_where_they_are_and_nowhere_else() {
        let redaction = JsonRedaction::new()
            .remove(pointer("/secret"))
            .remove(pointer("/items/1"))
            .remove(pointer("/a~1b"))
            .remove(pointer("/missing/deep"))
            .replace(pointer("/card/number"), "****4242")
            .replace(pointer("/absent"), "never added");
        let mut document = json!({
            "id": "ch_1",
            "secret": "s",
            "items": [0, 1, 2],
            "a/b": true,
            "card": { "number": "4242424242424242" },
        });
        redaction.apply(&mut document);
        assert_eq!(
            document,
            json!({ "id": "ch_1", "items": [0, 2], "card": { "number": "****4242" } })
        );
    }

    #[test]
    fn numbers_a_value_rounds_are_found_outside_strings_only() {
        for (json, past) in [
            (r#"{"a":18446744073709551615}"#, false),
            (r#"{"a":18446744073709551616}"#, true),
            (r#"{"a":-9223372036854775808}"#, false),
            (r#"[1,-9223372036854775809]"#, true),
            (
                r#"{"a":1.5,"b":-0.25,"c":1.50,"d":1e2,"e":0.0,"f":-0.0}"#,
                false,
            ),
            (r#"{"a":0.1,"b":3.141592653589793,"c":2.5e-8}"#, false),
            (r#"{"a":1e400}"#, true),
            (r#"{"a":123456789012345678901234.5}"#, true),
            (r#"{"a":0.123456789012345678901}"#, true),
            (r#"{"a":12345678901234567.89}"#, true),
            (
                r#"{"a":"18446744073709551616","b\"":"\"99999999999999999999"}"#,
                false,
            ),
        ] {
            assert_eq!(has_number_a_value_rounds(json.as_bytes()), past, "{json}");
        }
    }

    #[test]
    fn an_array_index_that_is_not_one_removes_nothing() {
        let mut document = json!({ "items": [0, 1, 2] });
        for index in ["01", "3", "-", "x"] {
            JsonRedaction::new()
                .remove(pointer(&format!("/items/{index}")))
                .apply(&mut document);
        }
        assert_eq!(document, json!({ "items": [0, 1, 2] }));
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Charge {
        id: String,
        client_secret: Option<String>,
    }

    #[test]
    fn the_redacted_json_is_what_is_stored_and_read_back() {
        let codec =
            RedactedJson(JsonRedaction::new().replace(pointer("/client_secret"), Value::Null));
        let bytes = codec
            .encode(&Charge {
                id: "ch_1".into(),
                client_secret: Some("pi_secret".into()),
            })
            .unwrap();
        assert!(!String::from_utf8_lossy(&bytes).contains("pi_secret"));
        let replayed: Charge = codec.decode(&bytes).unwrap();
        assert_eq!(
            replayed,
            Charge {
                id: "ch_1".into(),
                client_secret: None
            }
        );
    }

    #[test]
    fn a_redaction_the_type_cannot_read_back_is_refused_when_stored() {
        let codec = RedactedJson(JsonRedaction::new().remove(pointer("/id")));
        let error = Codec::<Charge>::encode(
            &codec,
            &Charge {
                id: "ch_1".into(),
                client_secret: None,
            },
        )
        .unwrap_err();
        assert!(
            error.to_string().contains("no longer reads as its type"),
            "{error}"
        );
    }

    #[test]
    fn the_typed_hook_stores_what_it_returns() {
        let codec = Redact::new(crate::Json, |charge: &Charge| Charge {
            id: charge.id.clone(),
            client_secret: None,
        });
        let bytes = codec
            .encode(&Charge {
                id: "ch_1".into(),
                client_secret: Some("pi_secret".into()),
            })
            .unwrap();
        assert_eq!(bytes, br#"{"id":"ch_1","client_secret":null}"#);
    }
}

#[cfg(test)]
mod outside_review {
    use super::*;
    use serde_json::json;

    /// RFC 6901 array indices are `0` or digits without a leading zero;
    /// `+1` is none (serde_json's own `pointer_mut`, which `replace` uses,
    /// refuses it). `remove` parses the token with `usize::from_str`, which
    /// accepts a leading `+`, so `remove("/items/+1")` removes element 1
    /// while `replace("/items/+1")` changes nothing: the two edits disagree
    /// on which value a pointer names.
    #[test]
    fn a_plus_signed_index_names_no_element() {
        let mut removed = json!({ "items": [0, 1, 2] });
        JsonRedaction::new()
            .remove(JsonPointer::new("/items/+1").unwrap())
            .apply(&mut removed);
        let mut replaced = json!({ "items": [0, 1, 2] });
        JsonRedaction::new()
            .replace(JsonPointer::new("/items/+1").unwrap(), "x")
            .apply(&mut replaced);
        assert_eq!(replaced, json!({ "items": [0, 1, 2] }));
        assert_eq!(removed, json!({ "items": [0, 1, 2] }));
    }

    /// `JsonPointer::new("")` is accepted (the whole document), and
    /// `remove` of it silently does nothing: the response is stored whole,
    /// every field the user meant to take out included, with no error and
    /// no WARN (a failing hook would at least have withheld the body).
    /// Either refuse the pointer, or withhold the body.
    #[test]
    fn removing_the_whole_document_does_not_keep_it() {
        let mut document = json!({ "client_secret": "pi_secret" });
        JsonRedaction::new()
            .remove(JsonPointer::new("").unwrap())
            .apply(&mut document);
        assert!(
            !document.to_string().contains("pi_secret"),
            "stored: {document}"
        );
    }
}
