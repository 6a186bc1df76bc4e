//! The protocol split across invocations: the claim made in one
//! invocation, completed (or released) in a later one, by an owner token
//! the caller keeps.
//!
//! [`Engine::execute`](crate::Engine::execute) claims, runs and completes
//! within one call, under an owner token it generates and forgets. Some
//! callers cannot: an AWS Lambda durable function suspends and is invoked
//! again, its code replaying from the start, so the invocation that claims
//! a key is not the one that completes it. These calls let such a caller
//! run the same protocol in pieces. The caller derives the owner token
//! from something every invocation of its work sees alike (a durable
//! execution's ARN), so that a later invocation proves by the token that
//! the claim is its own, rather than by a token it would have had to keep.
//!
//! [`lambda-idempotency-durable`](https://docs.rs/lambda-idempotency-durable)
//! is built on these calls; they are public so that it can be released on
//! its own, with each preview of the AWS Durable Execution SDK.
//!
//! - [`claim`]: claims the key, or says why not (a completed record to
//!   replay, another owner's live claim, the key reused with another
//!   payload). A record already claimed under the same owner token is the
//!   caller's own.
//! - [`complete`]: stores the value, fenced on the owner token.
//! - [`release`]: gives the key back, fenced on the owner token, so that
//!   another owner may run it.
//!
//! Unlike [`Engine::execute`](crate::Engine::execute), every call here
//! fails closed, on an engine built with
//! [`fail_open`](crate::EngineBuilder::fail_open) too: nothing here runs
//! an operation, so a store outage is the caller's to retry or report.
//! The engine's heartbeat does not run either: the claim holds for the
//! [`SplitAttempt`]'s lease, which must cover the whole split work.
//!
//! ```
//! use lambda_idempotency::{
//!     split::{self, SplitAttempt, SplitClaim},
//!     store::OwnerToken,
//!     Engine, Fingerprint, Json, MemoryStore, OutcomeKind,
//! };
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let engine = Engine::builder(MemoryStore::new()).build();
//! // The same in every invocation of one execution.
//! let attempt = |owner: &str| {
//!     SplitAttempt::new(
//!         "orders",
//!         "order-77",
//!         Fingerprint::of_bytes(b"order-77, 100"),
//!         OwnerToken::from_stored(owner),
//!         Duration::from_secs(3600),
//!     )
//! };
//! let first = attempt("execution-1");
//! let claimed = split::claim::<_, String>(&engine, &first, &Json).await?;
//! assert_eq!(claimed, SplitClaim::Ours);
//! // A later invocation of the same execution finds its own claim...
//! let again = split::claim::<_, String>(&engine, &first, &Json).await?;
//! assert_eq!(again, SplitClaim::Ours);
//! // ...and completes it.
//! let stored = split::complete(&engine, &first, serde_json::to_vec("ch_1")?).await?;
//! assert_eq!(stored, OutcomeKind::Fresh);
//! // Another execution gets the value, and runs nothing.
//! let duplicate = split::claim(&engine, &attempt("execution-2"), &Json).await?;
//! assert_eq!(duplicate, SplitClaim::Replay("ch_1".to_owned()));
//! # Ok(())
//! # }
//! ```

use crate::{
    store::{OwnerToken, Store},
    Codec, Engine, Error, Fingerprint, OutcomeKind, StoreError,
};
use std::{convert::Infallible, sync::Arc, time::Duration};

/// One owner's claim on one key, for [`claim`], [`complete`] and
/// [`release`]: the same in every invocation that works on it.
///
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct SplitAttempt {
    pub(crate) scope: Arc<str>,
    pub(crate) key: Arc<str>,
    pub(crate) fingerprint: Fingerprint,
    /// The same in every invocation of the caller's work.
    pub(crate) owner: OwnerToken,
    /// How long the claim holds: nothing renews it.
    pub(crate) lease: Duration,
}

impl SplitAttempt {
    /// The claim of `key` in `scope` (keys of two scopes never share a
    /// record), for the payload whose fingerprint is `fingerprint`, by
    /// `owner`, held for `lease` from the claim.
    ///
    /// `owner` must be the same in every invocation of the caller's work
    /// and differ from every other's: [`claim`] treats a record claimed
    /// under it as the caller's own. Derive it from what identifies the
    /// work (a durable execution's ARN, hashed), and build it with
    /// [`OwnerToken::from_stored`].
    ///
    /// `lease` is how long the claim holds: nothing renews it, so it must
    /// cover the whole work, suspensions included. It is not capped by the
    /// engine's [`max_lease`](crate::EngineBuilder::max_lease); it is
    /// capped at [`MAX_DURATION`](crate::MAX_DURATION), and the record is
    /// kept at least that long, and the engine's retention after it
    /// completes.
    pub fn new(
        scope: impl Into<Arc<str>>,
        key: impl Into<Arc<str>>,
        fingerprint: Fingerprint,
        owner: OwnerToken,
        lease: Duration,
    ) -> Self {
        Self {
            scope: scope.into(),
            key: key.into(),
            fingerprint,
            owner,
            lease,
        }
    }

    /// The records' scope.
    pub fn scope(&self) -> &str {
        &self.scope
    }

    /// The idempotency key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The owner token the claim is made and fenced with.
    pub fn owner(&self) -> &OwnerToken {
        &self.owner
    }
}

/// What [`claim`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SplitClaim<T> {
    /// The key is the caller's: a new claim, or one made earlier under
    /// the same owner token (an invocation that claimed and then lost the
    /// answer, or crashed before it could remember). Run the work, then
    /// [`complete`] or [`release`].
    Ours,
    /// A completed record with the same fingerprint holds the key: this
    /// value, decoded by the codec. Do not run; nothing is held.
    Replay(T),
    /// Idempotency is turned off on the engine
    /// ([`DISABLED_VARIABLE`](crate::DISABLED_VARIABLE)): run, and store
    /// nothing (neither [`complete`] nor [`release`] is needed).
    Disabled,
}

/// Claims `attempt`'s key in `engine`'s store for `attempt`'s owner.
///
/// A new key, a lapsed claim (taken over, and logged as a takeover) or
/// the owner's own claim is [`SplitClaim::Ours`]; a completed record with
/// the same fingerprint is [`SplitClaim::Replay`], decoded with `codec`.
/// A completed record replays under any owner token, the caller's own
/// included.
///
/// # Errors
///
/// - [`Error::InProgress`]: another owner's claim is live; `retry_after`
///   is the time left on its lease.
/// - [`Error::KeyReused`]: the key's record holds another fingerprint.
/// - [`Error::LeaseLost`]: the claim was answered after its lease had
///   passed (or with too little of it left): the work would have run as a
///   zombie beside whoever takes the key over. The claim is given back:
///   claim again.
/// - [`Error::Store`]: the store failed, or a completed record does not
///   decode with `codec` (its kind, [`StoreErrorKind`](crate::StoreErrorKind),
///   says which, and whether trying again may help). Never failed open.
pub async fn claim<St: Store, T>(
    engine: &Engine<St>,
    attempt: &SplitAttempt,
    codec: &impl Codec<T>,
) -> Result<SplitClaim<T>, Error<Infallible>> {
    engine.claim_split(attempt, codec).await
}

/// Completes `attempt`'s claim with `response` (the value encoded as the
/// codec given to [`claim`] decodes it), fenced on the owner token.
///
/// Returns [`OutcomeKind::Fresh`] when the record is completed by this
/// owner, now or by an earlier call whose answer was lost (so a retry
/// after a lost answer is safe), and [`OutcomeKind::LeaseLost`] when the
/// claim's lease passed and another owner took the key over: `response`
/// is then not stored (and a warning is logged).
///
/// Call it only on a claim that was not [`release`]d: a first attempt's
/// released record is gone (the completion is `LeaseLost`), but a
/// takeover's is kept, lapsed, under the owner's token until another owner
/// claims the key, and a completion then still lands.
///
/// # Errors
///
/// The store's error, after conflicts were tried again: the record may or
/// may not be completed, and calling again is safe.
pub async fn complete<St: Store>(
    engine: &Engine<St>,
    attempt: &SplitAttempt,
    response: Vec<u8>,
) -> Result<OutcomeKind, StoreError> {
    engine.complete_split(attempt, response).await
}

/// Releases `attempt`'s claim, so that another owner may run the key (the
/// work failed, and did nothing that must not run twice). A record that is
/// gone, completed, or another owner's is left alone, and that is not an
/// error.
///
/// # Errors
///
/// The store's error, after conflicts were tried again: the claim may
/// still hold (until its lease passes), and calling again is safe.
pub async fn release<St: Store>(
    engine: &Engine<St>,
    attempt: &SplitAttempt,
) -> Result<(), StoreError> {
    engine.release_split(attempt).await
}
