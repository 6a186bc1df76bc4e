//! Which outputs can be stored: those a duplicate can be answered with.

use aws_durable_execution_sdk::BoxError;
use lambda_idempotency::{Codec, JsonRedaction};
use serde::{de::DeserializeOwned, Serialize};
use serde_json::Value;

/// Stores values as JSON, and only those whose JSON decodes back to the
/// same JSON: a replay must give a duplicate what the first run returned
/// (the first run is given the value read back, too). serde_json
/// writes some values it cannot read back (`f64::NAN` and the infinities
/// as `null`), and refuses others (a map keyed by tuples); either is an
/// encoding error here, so the engine stores nothing and its claim holds.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct StorableJson;

/// Why an output was not stored.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotStorable {
    /// serde_json could not write it.
    #[error("the output does not serialise as JSON: {0}")]
    DoesNotSerialise(#[source] serde_json::Error),
    /// serde_json wrote it, and cannot read it back as its type (a `NaN`
    /// written as `null`, say): every duplicate would find a record it
    /// cannot replay.
    #[error("the output's JSON does not decode back to its type: {0}")]
    DoesNotDecode(#[source] serde_json::Error),
    /// The redacted JSON does not read back as the output's type (a
    /// required field removed, or replaced with a value of another type):
    /// every duplicate would find a record it cannot replay.
    #[error("the redacted output's JSON does not decode as its type: {0}")]
    RedactedDoesNotDecode(#[source] serde_json::Error),
    /// It reads back as another value (a serialisation that loses or
    /// changes something): a duplicate would get something else.
    #[error("the output's JSON decodes back to another value: {first} became {again}")]
    Changes {
        /// The JSON written.
        first: String,
        /// The JSON of what it decoded to.
        again: String,
    },
}

impl StorableJson {
    /// The bytes to store for `value` with `redaction` applied, and the
    /// value the first run gets: `value` read back whole, as
    /// [`stored`](Self::stored) gives it. Fails as `stored` does, and when
    /// the redacted JSON does not read back as `T`.
    pub(super) fn stored_redacted<T: Serialize + DeserializeOwned>(
        value: &T,
        redaction: &JsonRedaction,
    ) -> Result<(Vec<u8>, T), NotStorable> {
        let (bytes, whole) = Self::stored(value)?;
        if redaction.is_empty() {
            return Ok((bytes, whole));
        }
        let mut document: Value =
            serde_json::from_slice(&bytes).map_err(NotStorable::DoesNotDecode)?;
        redaction.apply(&mut document);
        let redacted = serde_json::to_vec(&document).map_err(NotStorable::DoesNotSerialise)?;
        serde_json::from_slice::<T>(&redacted).map_err(NotStorable::RedactedDoesNotDecode)?;
        Ok((redacted, whole))
    }

    /// The bytes to store for `value`, and the value a replay of them
    /// gives (what a duplicate gets), or why it cannot be stored.
    pub(super) fn stored<T: Serialize + DeserializeOwned>(
        value: &T,
    ) -> Result<(Vec<u8>, T), NotStorable> {
        let bytes = serde_json::to_vec(value).map_err(NotStorable::DoesNotSerialise)?;
        let decoded: T = serde_json::from_slice(&bytes).map_err(NotStorable::DoesNotDecode)?;
        let again = serde_json::to_vec(&decoded).map_err(NotStorable::DoesNotSerialise)?;
        // The same bytes, or, for maps a hash orders anew on each
        // serialisation, the same JSON value.
        if again == bytes || same_value(&bytes, &again) {
            Ok((bytes, decoded))
        } else {
            Err(NotStorable::Changes {
                first: String::from_utf8_lossy(&bytes).into_owned(),
                again: String::from_utf8_lossy(&again).into_owned(),
            })
        }
    }
}

impl<T: Serialize + DeserializeOwned> Codec<T> for StorableJson {
    fn encode(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        Ok(Self::stored(value)?.0)
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, BoxError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

fn same_value(first: &[u8], again: &[u8]) -> bool {
    match (
        serde_json::from_slice::<Value>(first),
        serde_json::from_slice::<Value>(again),
    ) {
        (Ok(first), Ok(again)) => first == again,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use std::collections::HashMap;

    fn storable<T: Serialize + DeserializeOwned>(value: &T) -> Result<Vec<u8>, String> {
        Codec::<T>::encode(&StorableJson, value).map_err(|error| error.to_string())
    }

    #[test]
    fn outputs_that_read_back_as_themselves_are_stored() {
        assert_eq!(storable(&1.5f64).as_deref(), Ok(&b"1.5"[..]));
        assert_eq!(storable(&u128::MAX).map(|b| b.len()), Ok(39));
        // A hash map's order differs between serialisations; its value
        // does not.
        let map: HashMap<String, u32> = (0..64).map(|n| (format!("k{n}"), n)).collect();
        assert!(storable(&map).is_ok());
        assert!(storable(&Option::<f64>::None).is_ok());
    }

    #[test]
    fn outputs_that_do_not_are_refused_with_the_reason() {
        let nan = storable(&f64::NAN).unwrap_err();
        assert!(nan.contains("does not decode back"), "{nan}");
        assert!(storable(&vec![1.0, f64::INFINITY]).is_err());
        let tuples: HashMap<(u8, u8), u8> = HashMap::from([((1, 2), 3)]);
        let refused = storable(&tuples).unwrap_err();
        assert!(refused.contains("does not serialise"), "{refused}");
        // Some(None) is written as null, which reads back as None: the
        // same JSON, so a duplicate gets what the first run returned.
        assert!(storable(&Some(Option::<u8>::None)).is_ok());

        #[derive(Serialize, Deserialize)]
        struct Visits {
            #[serde(skip_deserializing)]
            seen: u32,
        }
        let changes = storable(&Visits { seen: 5 }).unwrap_err();
        assert!(
            changes.contains(r#"{"seen":5} became {"seen":0}"#),
            "{changes}"
        );
    }
}
