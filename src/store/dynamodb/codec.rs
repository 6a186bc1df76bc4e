//! Records to DynamoDB items and back. Decoding never panics: a stored item
//! with a missing attribute, a wrong type or an unknown status is a
//! `CorruptRecord` error, and is never replayed.

use super::AttributeNames;
use crate::deflate::{inflate, Compression};
use crate::{
    store::{Claim, Commit, OwnerToken, Record, RecordId, Status},
    Fingerprint, StoreError,
};
use aws_sdk_dynamodb::{primitives::Blob, types::AttributeValue};
use serde::de::DeserializeOwned;
use std::collections::HashMap;

pub(super) type Item = HashMap<String, AttributeValue>;

pub(super) fn number(n: u64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

pub(super) fn string(s: &str) -> AttributeValue {
    AttributeValue::S(s.to_owned())
}

/// The fresh `IN_PROGRESS` item a claim writes, under `key`.
pub(super) fn claim_item(names: &AttributeNames, key: Item, claim: &Claim) -> Item {
    let mut item = key;
    item.extend([
        (names.status.clone(), string(Status::InProgress.as_str())),
        (names.expiration.clone(), number(claim.expiration_s)),
        (names.lease_until.clone(), number(claim.lease_until_ms)),
        (names.owner.clone(), string(claim.owner.as_str())),
        (
            names.fingerprint.clone(),
            string(claim.fingerprint.as_str()),
        ),
        (names.created_at.clone(), number(claim.now_ms)),
        (names.attempt.clone(), number(u64::from(claim.attempt))),
        (
            names.first_started_at.clone(),
            number(claim.first_started_ms),
        ),
    ]);
    item
}

/// The `COMPLETED` item a single-write commit puts under `key`; the
/// response moves into it, so a large body is not copied.
pub(super) fn commit_item(
    names: &AttributeNames,
    key: Item,
    commit: &mut Commit<impl Sized>,
) -> Item {
    let mut item = key;
    item.extend([
        (names.status.clone(), string(Status::Completed.as_str())),
        (names.expiration.clone(), number(commit.expiration_s)),
        (names.owner.clone(), string(commit.owner.as_str())),
        (
            names.fingerprint.clone(),
            string(commit.fingerprint.as_str()),
        ),
        (
            names.response.clone(),
            AttributeValue::B(Blob::new(std::mem::take(&mut commit.response))),
        ),
        (names.created_at.clone(), number(commit.now_ms)),
        (names.completed_at.clone(), number(commit.now_ms)),
        (names.attempt.clone(), number(1)),
        (names.first_started_at.clone(), number(commit.now_ms)),
    ]);
    item
}

/// Decodes a stored item whose id is in the attribute `id_attribute`.
pub(super) fn decode(
    names: &AttributeNames,
    id_attribute: &str,
    mut item: Item,
) -> Result<Record, StoreError> {
    let id: String = required(&mut item, id_attribute)?;
    let status: String = required(&mut item, &names.status)?;
    let status = status.parse::<Status>().map_err(|_| {
        StoreError::corrupt(format!(
            "record {id}: attribute `{}` holds unknown status {status:?}",
            names.status
        ))
    })?;
    let record = Record {
        owner: OwnerToken::from_stored(required::<String>(&mut item, &names.owner)?),
        fingerprint: Fingerprint::from_stored(required::<String>(&mut item, &names.fingerprint)?),
        expiration_s: required(&mut item, &names.expiration)?,
        lease_until_ms: optional(&mut item, &names.lease_until)?,
        response: match (
            item.remove(&names.response),
            item.remove(&names.response_deflate),
        ) {
            (None, None) => None,
            (Some(AttributeValue::B(blob)), _) => Some(blob.into_inner()),
            (Some(_), _) => return Err(wrong_type(&names.response, "binary (B)")),
            (None, Some(AttributeValue::B(blob))) => Some(
                inflate(&blob.into_inner(), INFLATED_LIMIT).map_err(|error| {
                    StoreError::corrupt(format!(
                        "attribute `{}` does not inflate",
                        names.response_deflate
                    ))
                    .with_source(error)
                })?,
            ),
            (None, Some(_)) => return Err(wrong_type(&names.response_deflate, "binary (B)")),
        },
        created_at_ms: optional(&mut item, &names.created_at)?,
        // Records written before attempts were counted are first attempts.
        attempt: optional(&mut item, &names.attempt)?.unwrap_or(1),
        first_started_ms: optional(&mut item, &names.first_started_at)?,
        completed_at_ms: optional(&mut item, &names.completed_at)?,
        status,
        id: RecordId::from_stored(id),
    };
    record.checked()
}

/// A stored response larger than this once inflated is corrupt: an item
/// holds at most 400 KB, and deflate rarely gains more than 100 to 1 on
/// real responses.
const INFLATED_LIMIT: u64 = 64 * 1024 * 1024;

/// Responses are deflated at zlib's default level (6): the store compresses only
/// large ones, where the smaller item saves write units.
pub(super) const DEFLATE_LEVEL: Compression = Compression::new(6);

fn required<T: DeserializeOwned>(item: &mut Item, name: &str) -> Result<T, StoreError> {
    optional(item, name)?
        .ok_or_else(|| StoreError::corrupt(format!("attribute `{name}` is missing")))
}

fn optional<T: DeserializeOwned>(item: &mut Item, name: &str) -> Result<Option<T>, StoreError> {
    item.remove(name)
        .map(|value| {
            serde_dynamo::from_attribute_value(value).map_err(|error| {
                StoreError::corrupt(format!("attribute `{name}` has the wrong type"))
                    .with_source(error)
            })
        })
        .transpose()
}

fn wrong_type(name: &str, expected: &str) -> StoreError {
    StoreError::corrupt(format!(
        "attribute `{name}` has the wrong type, expected {expected}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deflate::deflate;
    use crate::StoreErrorKind;
    use aws_sdk_dynamodb::primitives::Blob;

    fn completed_item() -> Item {
        HashMap::from([
            ("id".to_owned(), string("p#abc")),
            ("status".to_owned(), string("COMPLETED")),
            ("expiration".to_owned(), number(2_000_000_000)),
            ("owner".to_owned(), string("o1")),
            ("fingerprint".to_owned(), string("f1")),
            (
                "response".to_owned(),
                AttributeValue::B(Blob::new(b"{\"ok\":1}".to_vec())),
            ),
            ("completed_at".to_owned(), number(5)),
        ])
    }

    #[test]
    fn decodes_a_completed_item() {
        let record = decode(&AttributeNames::default(), "id", completed_item()).unwrap();
        assert_eq!(record.status, Status::Completed);
        assert_eq!(record.expiration_s, 2_000_000_000);
        assert_eq!(record.response.as_deref(), Some(&b"{\"ok\":1}"[..]));
        assert_eq!(record.completed_at_ms, Some(5));
        assert_eq!(record.lease_until_ms, None);
    }

    #[test]
    fn bad_items_are_corrupt_records_not_panics() {
        let names = AttributeNames::default();
        type Mutation = Box<dyn Fn(&mut Item)>;
        let cases: Vec<(&str, Mutation)> = vec![
            (
                "unknown status",
                Box::new(|i| {
                    i.insert("status".into(), string("DONE"));
                }),
            ),
            (
                "status as number",
                Box::new(|i| {
                    i.insert("status".into(), number(1));
                }),
            ),
            (
                "expiration as string",
                Box::new(|i| {
                    i.insert("expiration".into(), string("soon"));
                }),
            ),
            (
                "negative expiration",
                Box::new(|i| {
                    i.insert("expiration".into(), AttributeValue::N("-1".into()));
                }),
            ),
            (
                "expiration not a number",
                Box::new(|i| {
                    i.insert("expiration".into(), AttributeValue::N("x".into()));
                }),
            ),
            (
                "response as string",
                Box::new(|i| {
                    i.insert("response".into(), string("{}"));
                }),
            ),
            (
                "missing owner",
                Box::new(|i| {
                    i.remove("owner");
                }),
            ),
            (
                "missing response",
                Box::new(|i| {
                    i.remove("response");
                }),
            ),
            (
                "in progress without lease",
                Box::new(|i| {
                    i.insert("status".into(), string("IN_PROGRESS"));
                }),
            ),
        ];
        for (case, mutate) in cases {
            let mut item = completed_item();
            mutate(&mut item);
            let error = decode(&names, &names.id, item).expect_err(case);
            assert_eq!(
                error.kind(),
                StoreErrorKind::CorruptRecord,
                "{case}: {error}"
            );
        }
    }

    #[test]
    fn a_compressed_response_is_read_back_and_a_plain_one_still_is() {
        let names = AttributeNames::default();
        let body = br#"{"receipt":"0123456789abcdef0123456789abcdef0123456789abcdef"}"#.repeat(40);
        let mut item = completed_item();
        item.remove("response");
        item.insert(
            "response_deflate".into(),
            AttributeValue::B(Blob::new(deflate(&body, DEFLATE_LEVEL).expect("smaller"))),
        );
        let record = decode(&names, &names.id, item).unwrap();
        assert_eq!(record.response.as_deref(), Some(&body[..]));
        // Records written before, or by a store that does not compress.
        let record = decode(&names, &names.id, completed_item()).unwrap();
        assert_eq!(record.response.as_deref(), Some(&b"{\"ok\":1}"[..]));
        // Not deflate: corrupt, never replayed.
        let mut item = completed_item();
        item.remove("response");
        item.insert(
            "response_deflate".into(),
            AttributeValue::B(Blob::new(b"\xff\xff not deflate".to_vec())),
        );
        let error = decode(&names, &names.id, item).expect_err("corrupt");
        assert_eq!(error.kind(), StoreErrorKind::CorruptRecord);
        // Incompressible bytes are stored as they are.
        assert_eq!(deflate(b"ab", DEFLATE_LEVEL), None);
    }

    /// A response sealed by the engine's encryption is ciphertext: the
    /// store's own compression (`compress_responses_above`) finds it no
    /// smaller and stores it as it is, so turning both on costs a deflate
    /// attempt and nothing else.
    #[cfg(feature = "encryption")]
    #[test]
    fn a_sealed_response_is_not_compressed_again() {
        use crate::encryption::{Encryption, RawKeys};
        use futures_util::FutureExt;
        let body = br#"{"receipt":"0123456789abcdef0123456789abcdef0123456789abcdef"}"#.repeat(400);
        assert!(
            deflate(&body, DEFLATE_LEVEL).is_some(),
            "the plaintext compresses"
        );
        for compress_above in [usize::MAX, 0] {
            let encryption = Encryption::new(RawKeys::new("k", &[3; 32]).unwrap(), "t")
                .compress_above(compress_above);
            let sealed = encryption
                .seal_response(
                    &RecordId::from_stored("p#1"),
                    &crate::Fingerprint::from_stored("f"),
                    1,
                    &body,
                )
                .now_or_never()
                .expect("raw keys never wait")
                .unwrap()
                .unwrap();
            assert_eq!(
                deflate(&sealed, DEFLATE_LEVEL),
                None,
                "compress_above {compress_above}"
            );
        }
    }

    #[test]
    fn configured_names_are_used() {
        let names = AttributeNames::default().status("st").response("resp");
        let mut item = completed_item();
        let status = item.remove("status").unwrap();
        let response = item.remove("response").unwrap();
        item.insert("st".into(), status);
        item.insert("resp".into(), response);
        assert_eq!(
            decode(&names, &names.id, item).unwrap().status,
            Status::Completed
        );
        assert!(decode(&names, &names.id, completed_item()).is_err());
    }
}
