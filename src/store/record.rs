//! The idempotency record: one per scoped key.

use super::{OwnerToken, RecordId};
use crate::{Fingerprint, StoreError};
use std::{fmt, str::FromStr};

/// Where a record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Claimed; the operation is running (or its invocation died and the
    /// lease has yet to pass).
    InProgress,
    /// The operation completed and its outcome is stored.
    Completed,
}

impl Status {
    /// The stored value: `IN_PROGRESS` or `COMPLETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::InProgress => "IN_PROGRESS",
            Status::Completed => "COMPLETED",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "IN_PROGRESS" => Ok(Status::InProgress),
            "COMPLETED" => Ok(Status::Completed),
            _ => Err(UnknownStatus),
        }
    }
}

/// A stored status that is neither `IN_PROGRESS` nor `COMPLETED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnknownStatus;

impl fmt::Display for UnknownStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown record status")
    }
}

impl std::error::Error for UnknownStatus {}

/// One idempotency record, as a store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// The partition key.
    pub id: RecordId,
    /// In progress or completed.
    pub status: Status,
    /// The fencing token of the claim that wrote this record.
    pub owner: OwnerToken,
    /// The fingerprint of the payload that claimed the key.
    pub fingerprint: Fingerprint,
    /// Epoch seconds after which the record is treated as absent (the TTL
    /// attribute; DynamoDB deletes lazily, so every read compares it).
    pub expiration_s: u64,
    /// Epoch milliseconds until which an `IN_PROGRESS` claim is live.
    pub lease_until_ms: Option<u64>,
    /// The stored outcome, once completed.
    pub response: Option<Vec<u8>>,
    /// Epoch milliseconds of the claim, for operators.
    pub created_at_ms: Option<u64>,
    /// Which attempt at the operation this record's claim is: 1 for the
    /// first, and one more for each takeover of a claim whose lease passed
    /// (its invocation crashed or timed out, maybe after acting).
    pub attempt: u32,
    /// Epoch milliseconds of the first attempt's claim, kept across
    /// takeovers.
    pub first_started_ms: Option<u64>,
    /// Epoch milliseconds of the completion, for operators.
    pub completed_at_ms: Option<u64>,
}

impl Record {
    /// The record, if it keeps the invariants every stored record keeps (a
    /// `COMPLETED` record holds a response, an `IN_PROGRESS` one a lease);
    /// a [`CorruptRecord`](crate::StoreErrorKind::CorruptRecord) error
    /// otherwise, so that it is never replayed. Stores call it on what they
    /// decode.
    pub fn checked(self) -> Result<Self, StoreError> {
        match self.status {
            Status::Completed if self.response.is_none() => Err(StoreError::corrupt(format!(
                "record {}: COMPLETED without a response",
                self.id
            ))),
            Status::InProgress if self.lease_until_ms.is_none() => Err(StoreError::corrupt(
                format!("record {}: IN_PROGRESS without a lease", self.id),
            )),
            _ => Ok(self),
        }
    }

    /// Whether the record has passed its expiration and counts as absent.
    pub fn is_expired(&self, now_ms: u64) -> bool {
        self.expiration_s < now_ms / 1000
    }

    /// Whether the record's claim was abandoned at `now_ms`: it is
    /// `IN_PROGRESS`, not expired, and its lease has passed. Such a claim
    /// is taken over ([`Store::take_over`](super::Store::take_over)).
    pub fn is_lapsed(&self, now_ms: u64) -> bool {
        self.status == Status::InProgress && !self.is_expired(now_ms) && !self.is_live(now_ms)
    }

    /// Whether the record still blocks a new claim at `now_ms`: not expired,
    /// and either completed or in progress under a lease that has not passed.
    pub fn is_live(&self, now_ms: u64) -> bool {
        if self.is_expired(now_ms) {
            return false;
        }
        match self.status {
            Status::Completed => true,
            // Like the claim condition, where `#lease_until < :now_ms` is false
            // for a missing attribute: without a lease the claim lasts until
            // the record expires.
            Status::InProgress => self.lease_until_ms.is_none_or(|lease| lease >= now_ms),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_prints_as_it_is_stored_and_an_unknown_one_says_so() {
        for status in [Status::InProgress, Status::Completed] {
            assert_eq!(status.to_string(), status.as_str());
            assert_eq!(status.to_string().parse::<Status>(), Ok(status));
        }
        // What an operator reads in the error a stored record's status
        // fails with (the stores wrap it with the value found).
        let unknown = "PENDING".parse::<Status>().unwrap_err();
        assert_eq!(unknown.to_string(), "unknown record status");
    }

    fn record(status: Status, expiration_s: u64, lease_until_ms: Option<u64>) -> Record {
        Record {
            id: RecordId::from_stored("p#1"),
            status,
            owner: OwnerToken::from_stored("o"),
            fingerprint: Fingerprint::from_stored("f"),
            expiration_s,
            lease_until_ms,
            response: None,
            created_at_ms: None,
            attempt: 1,
            first_started_ms: None,
            completed_at_ms: None,
        }
    }

    #[test]
    fn liveness_follows_the_claim_condition() {
        let now_ms = 1_000_000;
        assert!(record(Status::Completed, 1000, None).is_live(now_ms));
        assert!(!record(Status::Completed, 999, None).is_live(now_ms));
        assert!(record(Status::InProgress, 2000, Some(now_ms)).is_live(now_ms));
        assert!(!record(Status::InProgress, 2000, Some(now_ms - 1)).is_live(now_ms));
        assert!(record(Status::InProgress, 2000, None).is_live(now_ms));
    }

    #[test]
    fn status_round_trips_and_rejects_unknown_values() {
        for status in [Status::InProgress, Status::Completed] {
            assert_eq!(status.as_str().parse::<Status>(), Ok(status));
        }
        assert_eq!("EXPIRED".parse::<Status>(), Err(UnknownStatus));
    }
}
