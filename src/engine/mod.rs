//! The orchestrator: claim, run, then complete or release.
//!
//! It decides everything from what the [`Store`] returns and never touches a
//! backend itself, so the same protocol runs on DynamoDB, PostgreSQL, Redis
//! and in memory. One request through [`Engine::run`]:
//!
//! 1. **cache** ([`replay`]): a completed record this process has seen
//!    answers without a store call;
//! 2. **claim** ([`claim`]): a conditional write of an `IN_PROGRESS` record
//!    under a fresh owner token; a lapsed claim is taken over; a refusal
//!    hands back the record that holds the key, which [`replay`] turns into
//!    a replay, a 422-style mismatch or an in-progress answer;
//! 3. **run** ([`lease`]): the operation, with its [`ClaimHandle`] and the
//!    optional heartbeat that extends the lease;
//! 4. **complete or release** ([`completion`]): both fenced on the owner
//!    token, both retried on a conflict ([`conflicts`]).
//!
//! [`single_write`] is the protocol without a claim, for operations whose
//! only effects are the writes they return; [`operator`] holds what
//! operators call outside any request.

mod alert;
mod attempt;
mod builder;
mod cache;
mod claim;
mod claim_handle;
mod codec;
mod completion;
mod conflicts;
mod detach;
mod durable;
mod lease;
mod mode;
mod operator;
mod outcome;
mod panic;
mod replay;
mod retry_after;
mod single_write;

pub use attempt::Attempt;
pub(crate) use attempt::OwnedAttempt;
pub use builder::{
    default_key_prefix, BuildError, EngineBuilder, DEFAULT_KEY_PREFIX, DEFAULT_LEASE,
    DEFAULT_MAX_LEASE, DEFAULT_RETENTION, DISABLED_IN_LAMBDA_VARIABLE, DISABLED_VARIABLE,
    MAX_DURATION,
};
#[cfg(test)]
pub(crate) use claim::CLAIM_TRIES;
pub use claim_handle::{ClaimHandle, Takeover};

#[cfg(feature = "postgres")]
pub(crate) use codec::unserialisable;
pub use codec::{Codec, Json};
pub(crate) use detach::detached;
pub(crate) use durable::{DurableAttempt, DurableClaim};
pub use mode::Mode;
pub use operator::Forgotten;
pub use outcome::{Outcome, OutcomeKind, Replayed};
pub(crate) use panic::panic_message;
// Hints other than the lease come from the HTTP layer's route estimates.
#[cfg_attr(not(feature = "http"), allow(unused_imports))]
pub(crate) use retry_after::RetryHint;

use crate::{
    store::{Claim, RecordId, Store},
    Clock, Error, StoreError, StoreErrorKind,
};
use cache::RecordCache;
use claim::{ClaimError, Claimed};
use futures_util::FutureExt;
use lease::run_unclaimed;
use serde::{de::DeserializeOwned, Serialize};
use std::{future::Future, panic::AssertUnwindSafe, sync::Arc, time::Duration};
use tracing::{debug, warn};

/// Runs operations at most once per key, and replays their outcome to
/// every retry.
///
/// Cheap to clone: clones share the store, the configuration and the cache.
/// Build one per process (outside the Lambda handler) with
/// [`Engine::builder`].
#[derive(Debug)]
pub struct Engine<St> {
    inner: Arc<Inner<St>>,
}

impl<St> Clone for Engine<St> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

#[derive(Debug)]
struct Inner<St> {
    store: St,
    key_prefix: String,
    retention: Duration,
    max_lease: Duration,
    default_lease: Duration,
    cache: Option<RecordCache>,
    fail_open: bool,
    heartbeat: bool,
    disabled: bool,
    clock: Arc<dyn Clock>,
}

/// The shortest lease a claim gets, even when its deadline has passed.
const MIN_LEASE_MS: u64 = 1_000;

/// An operation starts only with at least this much of its lease left (its
/// claim's `now`, plus how long the claim took): a claim answered later than
/// that is given back and answered [`Error::LeaseLost`] (the caller
/// retries).
const START_MARGIN_MS: u64 = MIN_LEASE_MS / 10;

impl<St: Store> Engine<St> {
    /// Starts configuring an engine over `store`.
    pub fn builder(store: St) -> EngineBuilder<St> {
        EngineBuilder::new(store)
    }

    /// The store records are kept in.
    pub fn store(&self) -> &St {
        &self.inner.store
    }

    /// The record id `key` has inside `scope` with this engine's prefix.
    pub fn record_id(&self, scope: &str, key: &str) -> RecordId {
        RecordId::new(&self.inner.key_prefix, scope, key)
    }

    /// Runs `operation` at most once for the attempt's scoped key.
    ///
    /// - The first attempt claims the key, runs the operation, stores its
    ///   value (serialised as JSON) and returns it as
    ///   [`OutcomeKind::Fresh`].
    /// - Later attempts with the same payload get the stored value as a
    ///   [`OutcomeKind::Replay`] without running anything; with another
    ///   payload, [`Error::KeyReused`].
    /// - While another attempt holds the claim: [`Error::InProgress`], with
    ///   the time left on its lease.
    /// - If the operation fails, its claim is released and its error comes
    ///   back as [`Error::Operation`]; the next attempt runs it again.
    /// - If the store cannot be reached, the operation does not run:
    ///   [`Error::Store`] (unless the engine fails open).
    /// - If the claim is answered only after its lease has passed (or with
    ///   less than 100 ms of it left), the operation does not run: the
    ///   claim is given back and the caller gets [`Error::LeaseLost`], to
    ///   retry.
    ///
    /// # When this future is dropped
    ///
    /// The operation runs inside this future: dropped (a client that
    /// disconnects from a server, a `tokio::time::timeout`, a `select!`
    /// that another branch won), it stops where it was, and its claim stays
    /// in progress until its lease lapses; then a retry runs it again, after
    /// whatever the first run did. The claim is not released on drop, since
    /// an operation that had acted would then run again at once. Where the
    /// caller may give up, call [`execute_detached`](Engine::execute_detached):
    /// the operation runs to its end whatever happens to the caller. (In
    /// Lambda nothing drops an invocation's future.)
    pub async fn execute<T, E, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.execute_with(attempt, &Json, operation).await
    }

    /// Like [`execute`](Engine::execute), detached from the caller from the
    /// claim to the completion: dropping this future (a client that left, a
    /// timeout) neither stops the operation nor leaves its claim in
    /// progress, so a retry gets its outcome rather than running it again
    /// once the lease lapses. The work is polled once in place and, if it
    /// waits for anything, moved to a task of its own in that same poll (a
    /// replay costs no task). Task-locals of the caller are therefore set
    /// in the operation until it first waits, and not after: pass values in
    /// its closure instead. A panic in the operation releases its claim and
    /// is raised again here. Needs a tokio runtime (without one it runs in
    /// place, as `execute` does).
    ///
    /// ```
    /// use lambda_idempotency::{Attempt, Engine, Fingerprint, MemoryStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let engine = Engine::builder(MemoryStore::new()).build();
    /// let attempt = Attempt::new("tenant-1", "order-42", Fingerprint::of_json(&1250)?);
    /// let charge = engine
    ///     .execute_detached(&attempt, || async { Ok::<_, std::io::Error>("ch_1".to_owned()) })
    ///     .await?;
    /// assert_eq!(charge.into_value(), "ch_1");
    /// # Ok(()) }
    /// ```
    pub async fn execute_detached<T, E, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned + Send + 'static,
        E: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let engine = self.clone();
        let owned = OwnedAttempt::from(attempt);
        let work = async move { engine.execute(&owned.attempt(), operation).await };
        detached(Box::pin(work), |work, runtime| runtime.spawn(work))
            .await
            .unwrap_or_else(|| {
                Err(Error::Store(StoreError::new(
                    StoreErrorKind::Other,
                    "the runtime shut down while the operation ran; its claim stays in progress until its lease lapses",
                )))
            })
    }

    /// Like [`execute`](Engine::execute), with values stored by `codec`
    /// rather than as JSON.
    pub async fn execute_with<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run(attempt, Mode::Plain, codec, |_| async {
            operation().await.map(|value| (value, Vec::new()))
        })
        .await
    }

    /// Like [`execute`](Engine::execute), but the operation also returns
    /// writes (for the DynamoDB store, `TransactWriteItem`s)
    /// that commit in one transaction with the fenced completion: the
    /// business effect and the completed record become visible together or
    /// not at all.
    ///
    /// So, unlike [`execute`](Engine::execute), an outcome that cannot be
    /// stored is an error, because its writes did not happen either:
    /// [`Error::LeaseLost`] when the lease passed and another attempt
    /// took the key over, [`Error::Store`] when the store failed or rejected
    /// one of the writes (then the claim is released, so a retry can run).
    /// This is [`run`](Engine::run) in [`Mode::Transactional`].
    pub async fn execute_transactional<T, E, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        self.run(attempt, Mode::Transactional, &Json, |_| operation())
            .await
    }

    /// The single entry point the other `execute` methods and the adapters
    /// (the HTTP layer, the event consumers) call; use it to write an
    /// adapter of your own.
    ///
    /// `operation` gets a [`ClaimHandle`] (is this a [`Takeover`] of a
    /// lapsed claim, whose attempt may have acted? extend the lease, learn
    /// that it was lost) and returns its value and the writes to commit with
    /// the completion (an empty `Vec` for none); `codec` stores the value.
    /// The mode says what happens when the outcome cannot be stored (see
    /// [`Mode`]); an operation that returns writes is run as
    /// [`Mode::Transactional`] whatever the mode says, since its writes
    /// exist only if the completion commits.
    pub async fn run<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        mode: Mode,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        self.run_with_refusals(attempt, mode, codec, |_| None, operation)
            .await
    }

    /// Like [`run`](Engine::run), with business-rule refusals of the
    /// operation's writes answered rather than failed: when the store
    /// refuses one of the writes committed with the completion (a
    /// PostgreSQL constraint or SQLSTATE, a DynamoDB condition on a
    /// business item: a [`WriteRefusal`](crate::WriteRefusal)), `refusal`
    /// decides. `Some(Ok(value))`: `value` is the outcome, stored (without
    /// any write) and replayed like any other; `Some(Err(error))`: the claim
    /// is released and the caller gets [`Error::Operation`]; `None`: a
    /// fault, as with `run` ([`Error::Store`], claim released).
    pub async fn run_with_refusals<T, E, C, R, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        mode: Mode,
        codec: &C,
        refusal: R,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let result = self
            .run_unreported(attempt, mode, codec, refusal, operation)
            .await;
        alert::operator_must_act(&result);
        result
    }

    async fn run_unreported<T, E, C, R, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        mode: Mode,
        codec: &C,
        refusal: R,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let inner = &*self.inner;
        if inner.disabled {
            return self.run_disabled(operation).await;
        }
        let transactional = mode == Mode::Transactional;
        let id = self.record_id(attempt.scope, attempt.key);
        let now_ms = inner.clock.now_ms();
        // How long the claim takes, measured apart from `clock`, which
        // gives the wall-clock instants that leases are written in.
        let began = tokio::time::Instant::now();

        if let Some(replay) = self.cached_replay(&id, attempt, codec, now_ms) {
            return replay;
        }

        // Without a fencing token nothing may run, even failing open.
        let mut claim = self.claim_for(id, attempt, now_ms).map_err(Error::Store)?;
        match self.claim(&mut claim).await {
            Ok(Claimed::Ours) => {}
            Ok(Claimed::Held(record)) => return self.existing(record, codec, attempt, now_ms),
            Err(ClaimError::Outage(error))
                if inner.fail_open && !transactional && !attempt.caution.fail_closed =>
            {
                warn!(record = %claim.id, outcome = "unprotected", %error,
                    "idempotency store unavailable; running WITHOUT idempotency (fail-open)");
                let (value, writes) = run_unclaimed(operation, attempt.taking_over).await?;
                if !writes.is_empty() {
                    // Its writes need the store that just failed: they are
                    // not committed, so the value must not be reported.
                    warn!(record = %claim.id, outcome = "writes_not_committed",
                        "an operation with writes ran during a store outage (fail-open); none of its writes was committed; declare it transactional");
                    return Err(Error::WritesNotCommitted(error));
                }
                return Ok(Outcome::new(value, OutcomeKind::Unprotected));
            }
            // Duplicates raced for the key and none of them could tell
            // who holds it: the caller retries, as for a claim in progress.
            Err(ClaimError::Failed(error)) if error.kind() == StoreErrorKind::Conflict => {
                debug!(record = %claim.id, outcome = "in_progress", %error, "idempotency");
                return Err(Error::InProgress {
                    retry_after: Duration::from_secs(1),
                });
            }
            Err(ClaimError::Outage(error) | ClaimError::Failed(error)) => {
                warn!(record = %claim.id, outcome = "store_error", kind = error.kind().as_str(), %error, "idempotency claim failed");
                return Err(Error::Store(error));
            }
        }

        // A claim answered late (a slow network, an SDK's retries) may hold
        // a lease that has passed, or is about to: its operation would run
        // as a zombie from its first instant, beside whichever attempt takes
        // the key over. It does not run; the claim is given back (fenced,
        // so nothing another attempt now owns is touched), and the caller
        // retries. The time is the claim's `now` plus how long the claim
        // took by a monotonic clock (tokio's, which paused tests move), so
        // a wall clock stepped meanwhile, or a test clock that moves on
        // every read, does not decide it.
        let took_ms = u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX);
        let started_ms = now_ms.saturating_add(took_ms);
        if claim.lease_until_ms < started_ms.saturating_add(START_MARGIN_MS) {
            warn!(record = %claim.id, outcome = "lease_lost", lease_until_ms = claim.lease_until_ms, now_ms = started_ms,
                "the claim was answered after its lease had passed (or with too little of it left); the operation did not run");
            self.release(&claim).await;
            return Err(Error::LeaseLost);
        }

        let handle = self.handle(&claim);
        let scoped = handle.clone();
        // Built inside the future, so that a closure that panics before it
        // returns one unwinds through the same guard.
        let operation = async move { scoped.clone().scope(operation(scoped)).await };
        // The value is encoded inside the guard too: a `Serialize` that
        // panics must not keep the claim either.
        let ran = AssertUnwindSafe(async {
            let (value, writes) = self.run_claimed(&handle, operation).await?;
            let response = codec.encode(&value);
            Ok((value, writes, response))
        })
        .catch_unwind()
        .await;
        let ran = match ran {
            Ok(ran) => ran,
            Err(panic) if attempt.caution.keep_claim_on_panic => {
                warn!(record = %claim.id, outcome = "panicked", panic = panic_message(&*panic),
                    "the operation panicked and may have acted; its claim is kept until its lease passes, and the next attempt is a takeover");
                std::panic::resume_unwind(panic);
            }
            Err(panic) => {
                // The invocation is dying, but a retry need not wait for
                // its lease: Powertools deletes the claim on any exception.
                warn!(record = %claim.id, outcome = "panicked", panic = panic_message(&*panic),
                    "the operation panicked; its claim is released so that a retry can run it");
                self.release(&claim).await;
                std::panic::resume_unwind(panic);
            }
        };
        let (value, writes, response) = match ran {
            Ok(done) => done,
            Err(error) => {
                self.release(&claim).await;
                debug!(record = %claim.id, outcome = "operation_error", "idempotency");
                return Err(Error::Operation(error));
            }
        };
        let transactional = transactional || !writes.is_empty();
        let response = match response {
            Ok(response) => response,
            Err(error) if transactional => {
                self.release(&claim).await;
                return Err(Error::Store(codec::unserialisable(error)));
            }
            Err(error) => {
                warn!(record = %claim.id, outcome = "not_recorded", %error,
                    "the operation's value could not be serialised; it is returned but not stored");
                return Ok(Outcome::new(value, OutcomeKind::NotRecorded));
            }
        };
        let refusable = !writes.is_empty();
        match self
            .complete(claim.clone(), response, writes, transactional, refusable)
            .await
        {
            Ok(kind) => Ok(Outcome::new(value, kind)),
            Err(Error::Store(error)) if refusable && error.write_refusal().is_some() => {
                self.answer_refusal(claim, codec, refusal, error).await
            }
            Err(error) => Err(error),
        }
    }

    /// A refused write, its claim still held: answered as `refusal`
    /// decides (the answer completed without writes, or the claim
    /// released).
    async fn answer_refusal<T, E, C, R>(
        &self,
        claim: Claim,
        codec: &C,
        refusal: R,
        error: StoreError,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>>,
    {
        let answer = error.write_refusal().and_then(refusal);
        match answer {
            Some(Ok(answer)) => match codec.encode(&answer) {
                Ok(response) => {
                    debug!(record = %claim.id, outcome = "refused", "a write was refused: its answer is stored");
                    self.complete(claim, response, Vec::new(), true, false)
                        .await
                        .map(|kind| Outcome::new(answer, kind))
                }
                Err(encoding) => {
                    self.release(&claim).await;
                    Err(Error::Store(codec::unserialisable(encoding)))
                }
            },
            Some(Err(answer)) => {
                self.release(&claim).await;
                Err(Error::Operation(answer))
            }
            None => {
                warn!(record = %claim.id, outcome = "store_error", %error,
                    "transactional completion failed; releasing the claim");
                self.release(&claim).await;
                Err(Error::Store(error))
            }
        }
    }

    /// Idempotency is off: the operation runs, unprotected, and nothing is
    /// stored.
    async fn run_disabled<T, E, F, Fut>(&self, operation: F) -> Result<Outcome<T>, Error<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let (value, writes) = run_unclaimed(operation, None).await?;
        if !writes.is_empty() {
            return Err(Error::WritesNotCommitted(StoreError::new(
                StoreErrorKind::Misconfigured,
                "idempotency is disabled (IDEMPOTENCY_DISABLED=true): the operation ran, and none of its writes was committed",
            )));
        }
        debug!(outcome = "disabled", "idempotency");
        Ok(Outcome::new(value, OutcomeKind::Disabled))
    }

    pub(crate) fn expiration_s(&self, now_ms: u64) -> u64 {
        (now_ms / 1000).saturating_add(self.inner.retention.as_secs())
    }

    /// Whether idempotency is turned off (`IDEMPOTENCY_DISABLED=true`).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn is_disabled(&self) -> bool {
        self.inner.disabled
    }
}

#[cfg(test)]
mod tests;
