//! The record's attribute names, configurable.

use std::collections::HashMap;

/// The names of the record's attributes in the DynamoDB table.
///
/// The defaults are those of the crate's record: `id` (the partition key),
/// `status`, `expiration` (the table's TTL attribute), `lease_until`,
/// `owner`, `fingerprint`, `response`, `created_at`, `completed_at`,
/// `attempt`, `first_started_at`, and `response_deflate` for a response
/// stored compressed ([`DynamoDbStore::compress_responses_above`](super::DynamoDbStore::compress_responses_above)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttributeNames {
    pub(crate) id: String,
    pub(crate) status: String,
    pub(crate) expiration: String,
    pub(crate) lease_until: String,
    pub(crate) owner: String,
    pub(crate) fingerprint: String,
    pub(crate) response: String,
    pub(crate) response_deflate: String,
    pub(crate) created_at: String,
    pub(crate) completed_at: String,
    pub(crate) attempt: String,
    pub(crate) first_started_at: String,
    pub(crate) steps: String,
}

impl Default for AttributeNames {
    fn default() -> Self {
        Self {
            id: "id".into(),
            status: "status".into(),
            expiration: "expiration".into(),
            lease_until: "lease_until".into(),
            owner: "owner".into(),
            fingerprint: "fingerprint".into(),
            response: "response".into(),
            response_deflate: "response_deflate".into(),
            created_at: "created_at".into(),
            completed_at: "completed_at".into(),
            attempt: "attempt".into(),
            first_started_at: "first_started_at".into(),
            steps: "steps".into(),
        }
    }
}

macro_rules! setters {
    ($($(#[$doc:meta])* $field:ident),* $(,)?) => {
        impl AttributeNames {
            $(
                $(#[$doc])*
                #[must_use]
                pub fn $field(mut self, name: impl Into<String>) -> Self {
                    self.$field = name.into();
                    self
                }
            )*
        }
    };
}

setters! {
    /// The partition key (type S) of the table.
    id,
    /// The record status.
    status,
    /// The expiration in epoch seconds; make it the table's TTL attribute.
    expiration,
    /// The lease end in epoch milliseconds.
    lease_until,
    /// The claim's fencing token.
    owner,
    /// The payload fingerprint.
    fingerprint,
    /// The stored outcome.
    response,
    /// The stored outcome, deflate-compressed (written only by a store
    /// that [compresses](super::DynamoDbStore::compress_responses_above)).
    response_deflate,
    /// The claim time in epoch milliseconds.
    created_at,
    /// The completion time in epoch milliseconds.
    completed_at,
    /// The attempt number of the claim (1, then one more per takeover).
    attempt,
    /// The first attempt's claim time in epoch milliseconds.
    first_started_at,
    /// The steps an operation recorded while in progress (recovery points):
    /// a list of maps, each a step's `name` (S) and `output` (B).
    steps,
}

/// `ExpressionAttributeNames` for each request, built once: DynamoDB rejects
/// names a request's expressions do not use.
#[derive(Debug, Clone)]
pub(super) struct ExpressionNames {
    pub(super) claim: HashMap<String, String>,
    pub(super) commit: HashMap<String, String>,
    pub(super) take_over: HashMap<String, String>,
    /// The takeover of a lapsed claim whose record holds steps: an update
    /// of the claim's attributes that keeps them.
    pub(super) take_over_stepped: HashMap<String, String>,
    /// A step's write, and its read.
    pub(super) step: HashMap<String, String>,
    pub(super) fence: HashMap<String, String>,
    pub(super) extend: HashMap<String, String>,
    pub(super) complete: HashMap<String, String>,
    /// The completion of a response stored compressed: `#response` names
    /// the compressed attribute.
    pub(super) complete_deflated: HashMap<String, String>,
    pub(super) exists: HashMap<String, String>,
    pub(super) exists_unless_in_progress: HashMap<String, String>,
}

impl ExpressionNames {
    pub(super) fn new(names: &AttributeNames) -> Self {
        let map = |pairs: &[(&str, &String)]| {
            pairs
                .iter()
                .map(|(placeholder, name)| ((*placeholder).to_owned(), (*name).clone()))
                .collect::<HashMap<_, _>>()
        };
        let complete = map(&[
            ("#status", &names.status),
            ("#owner", &names.owner),
            ("#response", &names.response),
            ("#expiration", &names.expiration),
            ("#completed_at", &names.completed_at),
            ("#lease_until", &names.lease_until),
            ("#steps", &names.steps),
        ]);
        Self {
            complete: complete.clone(),
            claim: map(&[("#id", &names.id), ("#expiration", &names.expiration)]),
            commit: map(&[
                ("#id", &names.id),
                ("#expiration", &names.expiration),
                ("#status", &names.status),
                ("#lease_until", &names.lease_until),
                ("#response", &names.response),
                ("#response_deflate", &names.response_deflate),
            ]),
            take_over: map(&[
                ("#status", &names.status),
                ("#owner", &names.owner),
                ("#lease_until", &names.lease_until),
                ("#steps", &names.steps),
            ]),
            take_over_stepped: map(&[
                ("#status", &names.status),
                ("#owner", &names.owner),
                ("#lease_until", &names.lease_until),
                ("#expiration", &names.expiration),
                ("#fingerprint", &names.fingerprint),
                ("#created_at", &names.created_at),
                ("#attempt", &names.attempt),
                ("#first_started_at", &names.first_started_at),
            ]),
            step: map(&[
                ("#status", &names.status),
                ("#owner", &names.owner),
                ("#steps", &names.steps),
            ]),
            fence: map(&[("#status", &names.status), ("#owner", &names.owner)]),
            extend: map(&[
                ("#status", &names.status),
                ("#owner", &names.owner),
                ("#lease_until", &names.lease_until),
                ("#expiration", &names.expiration),
            ]),
            exists: map(&[("#id", &names.id)]),
            exists_unless_in_progress: map(&[("#id", &names.id), ("#status", &names.status)]),

            complete_deflated: complete
                .into_iter()
                .chain([("#response".to_owned(), names.response_deflate.clone())])
                .collect(),
        }
    }
}
