//! Where records live: the [`Store`] trait and its implementations.
//!
//! A store implements the three conditional writes of the protocol (claim,
//! complete, release) and a consistent read. It evaluates every condition
//! against the `now` it is handed, never its own clock, so tests can move
//! time and every participant agrees on what has expired.

use crate::{Fingerprint, OwnerToken, Record, RecordId, StoreError};
use std::future::Future;

#[cfg(feature = "dynamodb")]
pub(crate) mod dynamodb;
pub(crate) mod memory;

/// A request to claim a key: write a fresh `IN_PROGRESS` record unless a
/// live record holds the key.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The record to claim.
    pub id: RecordId,
    /// The new claim's fencing token.
    pub owner: OwnerToken,
    /// The payload's fingerprint.
    pub fingerprint: Fingerprint,
    /// The current time, epoch milliseconds.
    pub now_ms: u64,
    /// Until when the claim is live, epoch milliseconds.
    pub lease_until_ms: u64,
    /// When the record expires, epoch seconds.
    pub expiration_s: u64,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The key is now ours.
    Claimed,
    /// A live record holds the key: completed, or in progress under
    /// another owner's lease.
    Existing(Record),
}

/// A request to complete a claim: store the outcome, fenced on the owner.
#[derive(Debug, Clone)]
pub struct Completion<W> {
    /// The claimed record.
    pub id: RecordId,
    /// The claim's fencing token.
    pub owner: OwnerToken,
    /// The encoded outcome.
    pub response: Vec<u8>,
    /// The current time, epoch milliseconds.
    pub now_ms: u64,
    /// The refreshed expiration, epoch seconds.
    pub expiration_s: u64,
    /// Writes to commit atomically with the completion.
    pub writes: Vec<W>,
}

/// Whether a fenced write (completion or release) applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fenced {
    /// The record was still ours, and the write applied.
    Applied,
    /// The record belongs to another claim now (our lease passed and the key
    /// was taken over) or is gone: nothing was written.
    Lost,
}

/// Storage for idempotency records.
///
/// Implementations translate their backend's errors into [`StoreError`]s;
/// nothing above a store sees the backend.
pub trait Store: Send + Sync + 'static {
    /// An extra write that [`complete`](Store::complete) commits atomically
    /// with the completed record (see
    /// [`Engine::execute_transactional`](crate::Engine::execute_transactional)).
    type Write: Clone + Send + Sync + 'static;

    /// Claims the key, or returns the live record that holds it.
    ///
    /// A record held by the claim's own owner token is this claim (a retried
    /// write that had landed) and returns [`ClaimOutcome::Claimed`]. An
    /// expired record, or an `IN_PROGRESS` one whose lease has passed, is
    /// taken over.
    fn claim(&self, claim: &Claim)
        -> impl Future<Output = Result<ClaimOutcome, StoreError>> + Send;

    /// Marks the claim `COMPLETED` with its outcome, and commits the extra
    /// writes with it, all or nothing, if and only if the record is still
    /// `IN_PROGRESS` under this owner.
    fn complete(
        &self,
        completion: Completion<Self::Write>,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Deletes the claim if and only if it is still `IN_PROGRESS` under this
    /// owner, so that a retry can run again. A record already gone counts as
    /// released.
    fn release(
        &self,
        id: &RecordId,
        owner: &OwnerToken,
    ) -> impl Future<Output = Result<Fenced, StoreError>> + Send;

    /// Reads the record with strong consistency; an expired record is absent.
    fn get(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> impl Future<Output = Result<Option<Record>, StoreError>> + Send;
}
