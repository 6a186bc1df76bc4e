//! The orchestrator: claim, run, then complete or release.
//!
//! It decides everything from what the [`Store`] returns and never touches a
//! backend itself, so the same protocol runs on DynamoDB and in memory.

mod alert;
mod attempt;
mod builder;
mod cache;
mod claim;
mod codec;
mod detach;
mod mode;
mod outcome;

pub use attempt::Attempt;
pub use builder::{
    default_key_prefix, BuildError, EngineBuilder, DEFAULT_KEY_PREFIX, DEFAULT_LEASE,
    DEFAULT_MAX_LEASE, DEFAULT_RETENTION, DISABLED_IN_LAMBDA_VARIABLE, DISABLED_VARIABLE,
    MAX_DURATION,
};
pub use claim::{ClaimHandle, Takeover};

pub use codec::{Codec, Json};
pub(crate) use detach::detached;
pub use mode::Mode;
pub use outcome::{Outcome, OutcomeKind, Replayed};

use crate::{
    clock::duration_ms,
    store::{
        Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId, Removal,
        Status, Store,
    },
    Clock, Error, Fingerprint, StoreError, StoreErrorKind,
};
use cache::{CachedRecord, RecordCache};
use futures_util::FutureExt;
use serde::{de::DeserializeOwned, Serialize};
use std::{
    any::Any, convert::Infallible, future::Future, panic::AssertUnwindSafe, sync::Arc,
    time::Duration,
};
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

/// How many times a claim is tried when the record that refused it turns
/// out not to be live (it expired or was released between the condition
/// and the read).
pub(crate) const CLAIM_TRIES: usize = 3;

/// How many times a claim is tried when it conflicts with a concurrent
/// write (a PostgreSQL serialization failure or deadlock, a DynamoDB
/// transaction conflict) before a consistent read settles it.
pub(crate) const CONFLICT_TRIES: u32 = 5;

/// How many times a single-write commit is tried when it conflicts with a
/// concurrent one, or finds the record changed.
const COMMIT_TRIES: u32 = 4;

/// A random wait before trying a conflicted commit again: up to 10 ms,
/// doubling per try, so that duplicates stop colliding.
fn conflict_backoff(try_number: u32) -> Duration {
    let ceiling_ms = 10u64 << try_number.min(6);
    let noise = getrandom::u64().unwrap_or(ceiling_ms / 2);
    Duration::from_millis(noise % ceiling_ms + 1)
}

/// Calls `call` again while it fails with a conflict (a concurrent write
/// won), a few times with jitter: for fenced writes, which a retry cannot
/// apply twice.
async fn retry_conflicts<T, F, Fut>(mut call: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut tries = 0;
    loop {
        match call().await {
            Err(error)
                if error.kind() == StoreErrorKind::Conflict && tries + 1 < CONFLICT_TRIES =>
            {
                debug!(tries, %error, "a fenced write conflicted; trying again");
                tokio::time::sleep(conflict_backoff(tries)).await;
                tries += 1;
            }
            result => return result,
        }
    }
}

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

    /// Deletes the record of `key` inside `scope`, so that the next request
    /// with the key runs instead of being replayed: for an operator who
    /// must evict a stored outcome (a response that should not be
    /// replayed). Keeps an `IN_PROGRESS` record, whose operation may be
    /// running ([`Forgotten::InProgress`]).
    ///
    /// Only this process's local cache is cleared; other warm instances
    /// may replay from theirs until it expires (keep the cache off, the
    /// default, where that matters).
    pub async fn forget(&self, scope: &str, key: &str) -> Result<Forgotten, StoreError> {
        self.remove(scope, key, Removal::UnlessInProgress).await
    }

    /// Like [`forget`](Engine::forget), but also deletes an `IN_PROGRESS`
    /// record: a stuck claim, or one whose operation is known to be dead.
    /// If it is still running, its completion will be refused and a retry
    /// can run it a second time.
    pub async fn forget_even_in_progress(
        &self,
        scope: &str,
        key: &str,
    ) -> Result<Forgotten, StoreError> {
        self.remove(scope, key, Removal::Any).await
    }

    async fn remove(
        &self,
        scope: &str,
        key: &str,
        removal: Removal,
    ) -> Result<Forgotten, StoreError> {
        let id = self.record_id(scope, key);
        self.evict(&id);
        let forgotten = match self.inner.store.remove(&id, removal).await? {
            Conditional::Applied => Forgotten::Removed,
            Conditional::Refused(None) => Forgotten::Absent,
            Conditional::Refused(Some(record)) => Forgotten::InProgress(record),
        };
        warn!(record = %id, outcome = "forgotten", result = forgotten.kind(), "idempotency record removed by an operator");
        Ok(forgotten)
    }

    /// Up to `limit` records of this engine's prefix that are
    /// `IN_PROGRESS`: live claims, and stuck ones whose lease passed
    /// ([`Record::is_lapsed`]; the next request with their key takes them
    /// over). For operators: it scans the store.
    pub async fn list_in_progress(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let prefix = format!("{}#", self.inner.key_prefix);
        self.inner.store.list_in_progress(&prefix, limit).await
    }

    /// The clock the engine measures leases and expirations with, in epoch
    /// milliseconds (for operators telling live claims from stuck ones).
    pub fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    /// The record of `key` inside `scope`, read with strong consistency, or
    /// `None` when there is none or it has expired: for operators and
    /// tests. It bypasses the local cache.
    pub async fn inspect(&self, scope: &str, key: &str) -> Result<Option<Record>, StoreError> {
        let id = self.record_id(scope, key);
        self.inner.store.get(&id, self.inner.clock.now_ms()).await
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
    /// the operation runs to its end on a task of its own whatever happens
    /// to the caller. (In Lambda nothing drops an invocation's future.)
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

    /// Like [`execute`](Engine::execute), on a task of its own from the
    /// claim to the completion: dropping this future (a client that left, a
    /// timeout) neither stops the operation nor leaves its claim in
    /// progress, so a retry gets its outcome rather than running it again
    /// once the lease lapses. A panic in the operation releases its claim
    /// and is raised again here. Needs a tokio runtime (without one it runs
    /// in place, as `execute` does).
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
        let (scope, key) = (attempt.scope.to_owned(), attempt.key.to_owned());
        let (fingerprint, deadline_ms) = (attempt.fingerprint.clone(), attempt.deadline_ms);
        let work = async move {
            let attempt = Attempt {
                scope: &scope,
                key: &key,
                fingerprint,
                deadline_ms,
            };
            engine.execute(&attempt, operation).await
        };
        detached(work, |work, runtime| runtime.spawn(work))
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
    /// writes (for the DynamoDB store,
    /// [`TransactWriteItem`](aws_sdk_dynamodb::types::TransactWriteItem)s)
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
        let result = self.run_unreported(attempt, mode, codec, operation).await;
        alert::operator_must_act(&result);
        result
    }

    async fn run_unreported<T, E, C, F, Fut>(
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
        let inner = &*self.inner;
        if inner.disabled {
            return self.run_disabled(operation).await;
        }
        let transactional = mode == Mode::Transactional;
        let id = self.record_id(attempt.scope, attempt.key);
        let now_ms = inner.clock.now_ms();

        if let Some(replay) = self.cached_replay(&id, attempt, codec, now_ms) {
            return replay;
        }

        // Without a fencing token nothing may run, even failing open.
        let mut claim = self.claim_for(id, attempt, now_ms).map_err(Error::Store)?;
        match self.claim(&mut claim).await {
            Ok(Claimed::Ours) => {}
            Ok(Claimed::Held(record)) => {
                return self.existing(record, codec, &attempt.fingerprint, now_ms)
            }
            Err(ClaimError::Outage(error)) if inner.fail_open && !transactional => {
                warn!(record = %claim.id, outcome = "unprotected", %error,
                    "idempotency store unavailable; running WITHOUT idempotency (fail-open)");
                let handle = ClaimHandle::unprotected();
                let (value, writes) = handle
                    .clone()
                    .scope(operation(handle))
                    .await
                    .map_err(Error::Operation)?;
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
                return Err(Error::Store(
                    StoreError::new(
                        StoreErrorKind::Other,
                        "the operation's value could not be serialised for storage",
                    )
                    .with_source(error),
                ));
            }
            Err(error) => {
                warn!(record = %claim.id, outcome = "not_recorded", %error,
                    "the operation's value could not be serialised; it is returned but not stored");
                return Ok(Outcome::new(value, OutcomeKind::NotRecorded));
            }
        };
        self.complete(claim, response, writes, transactional)
            .await
            .map(|kind| Outcome::new(value, kind))
    }

    /// Runs `operation` and commits its value and writes in **one** store
    /// write (for DynamoDB, one `TransactWriteItems`, or one `PutItem`
    /// without writes), conditioned as a claim is: no claim before it, so a
    /// first call costs one round trip instead of two.
    ///
    /// **Only for operations whose sole effect is the writes they return.**
    /// Concurrent duplicates may each run the operation; one commits, and
    /// the others get its stored value as a replay (or a 422 for another
    /// payload). Even a retry of a completed request runs the operation
    /// before learning that it is a replay. So an operation that calls a
    /// payment provider, sends a message or writes outside its returned
    /// writes must use [`run`](Engine::run) instead.
    ///
    /// A record in progress under a claim (made by another entry point)
    /// answers [`Error::InProgress`]; a lapsed claim is replaced. A
    /// transaction conflict with a concurrent duplicate is tried again, a
    /// few times with jitter, then settled by a consistent read. A commit
    /// that fails is an error ([`Error::Store`]): nothing was written. The
    /// operation gets a [`ClaimHandle`] without a claim (never a
    /// takeover, no lease to extend).
    ///
    /// Only stores whose [`Store::SINGLE_WRITE`] is `true` have it: using it
    /// with another store does not compile.
    pub async fn run_single_write<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        const {
            assert!(
                St::SINGLE_WRITE,
                "this store cannot commit in a single write: use Engine::run"
            )
        };
        let result = self.single_write(attempt, codec, operation).await;
        alert::operator_must_act(&result);
        result
    }

    /// The single-write protocol; callers have checked
    /// [`Store::SINGLE_WRITE`] at compile time.
    pub(crate) async fn single_write<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let inner = &*self.inner;
        if inner.disabled {
            return self.run_disabled(operation).await;
        }
        let id = self.record_id(attempt.scope, attempt.key);
        if let Some(replay) = self.cached_replay(&id, attempt, codec, inner.clock.now_ms()) {
            return replay;
        }
        let handle = ClaimHandle::unprotected();
        let (value, writes) = handle
            .clone()
            .scope(operation(handle))
            .await
            .map_err(Error::Operation)?;
        let response = codec.encode(&value).map_err(|error| {
            Error::Store(
                StoreError::new(
                    StoreErrorKind::Other,
                    "the operation's value could not be serialised for storage",
                )
                .with_source(error),
            )
        })?;
        let cached = inner
            .cache
            .as_ref()
            .map(|_| Arc::<[u8]>::from(&response[..]));
        for try_number in 0..COMMIT_TRIES {
            let now_ms = inner.clock.now_ms();
            // A fresh token per try: a retried transaction with other
            // parameters must not reuse one.
            let owner = OwnerToken::generate().map_err(Error::Store)?;
            let commit = Commit {
                id: id.clone(),
                owner: owner.clone(),
                fingerprint: attempt.fingerprint.clone(),
                response: response.clone(),
                now_ms,
                expiration_s: self.expiration_s(now_ms),
                writes: writes.clone(),
            };
            let expiration_s = commit.expiration_s;
            let record = match inner.store.commit(commit).await {
                Ok(Conditional::Applied) => None,
                // This very commit, landed before its retry.
                Ok(Conditional::Refused(Some(record))) if record.owner == owner => None,
                Ok(Conditional::Refused(Some(record))) if record.is_live(now_ms) => Some(record),
                // Gone or lapsed by the time it was read: commit again.
                Ok(Conditional::Refused(_)) => continue,
                Err(error) if error.kind() == StoreErrorKind::Conflict => {
                    debug!(record = %id, try_number, "single-write conflict; trying again");
                    tokio::time::sleep(conflict_backoff(try_number)).await;
                    continue;
                }
                Err(error) => {
                    warn!(record = %id, outcome = "store_error", %error, "single-write commit failed; nothing was written");
                    return Err(Error::Store(error));
                }
            };
            let Some(record) = record else {
                if let (Some(cache), Some(response)) = (&inner.cache, cached) {
                    cache.put(
                        id.clone(),
                        CachedRecord {
                            fingerprint: attempt.fingerprint.clone(),
                            expiration_s,
                            response,
                            completed_at_ms: Some(now_ms),
                            attempt: 1,
                        },
                    );
                }
                debug!(record = %id, outcome = "fresh", single_write = true, "idempotency");
                return Ok(Outcome::new(value, OutcomeKind::Fresh));
            };
            return self.existing(record, codec, &attempt.fingerprint, now_ms);
        }
        // Still contended: whoever won, its record says what happened.
        let now_ms = inner.clock.now_ms();
        match inner.store.get(&id, now_ms).await.map_err(Error::Store)? {
            Some(record) if record.is_live(now_ms) => {
                self.existing(record, codec, &attempt.fingerprint, now_ms)
            }
            // Duplicates kept colliding and none committed yet: the caller
            // retries, as for a request in progress (never a 5xx).
            _ => {
                debug!(record = %id, outcome = "in_progress", "single-write commits stayed contended");
                Err(Error::InProgress {
                    retry_after: Duration::from_secs(1),
                })
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
        let handle = ClaimHandle::unprotected();
        let (value, writes) = handle
            .clone()
            .scope(operation(handle))
            .await
            .map_err(Error::Operation)?;
        if !writes.is_empty() {
            return Err(Error::WritesNotCommitted(StoreError::new(
                StoreErrorKind::Misconfigured,
                "idempotency is disabled (IDEMPOTENCY_DISABLED=true): the operation ran, and none of its writes was committed",
            )));
        }
        debug!(outcome = "disabled", "idempotency");
        Ok(Outcome::new(value, OutcomeKind::Disabled))
    }

    /// Claims the key, and decides what a refusal means: a record under
    /// this claim's own token is its own write that landed (an SDK retry of
    /// a claim whose first answer was lost); a live record holds the key; a
    /// lapsed claim is taken over, as the next attempt (`claim` becomes the
    /// takeover); a record gone or no longer live by the time it was read is
    /// claimed again.
    async fn claim(&self, claim: &mut Claim) -> Result<Claimed, ClaimError> {
        let store = &self.inner.store;
        let mut conflicts = 0;
        let mut refusals = 0;
        while refusals < CLAIM_TRIES && conflicts < CONFLICT_TRIES {
            let found = match self.claim_once(claim).await {
                Ok(found) => found,
                // A concurrent write won (a serialization failure, a
                // transaction conflict): the winner's record decides, once
                // it is there to read.
                Err(error) if error.kind() == StoreErrorKind::Conflict => {
                    debug!(record = %claim.id, conflicts, %error, "the claim conflicted; trying again");
                    tokio::time::sleep(conflict_backoff(conflicts)).await;
                    conflicts += 1;
                    continue;
                }
                Err(error) if error.kind().is_outage() => {
                    return self.confirm_outage(claim, error).await
                }
                Err(error) => return Err(ClaimError::Failed(error)),
            };
            match found {
                Conditional::Applied => {}
                Conditional::Refused(Some(record)) if record.owner == claim.owner => {
                    debug!(record = %claim.id, "the claim had landed before its retry");
                }
                Conditional::Refused(Some(record)) if record.is_live(claim.now_ms) => {
                    return Ok(Claimed::Held(record))
                }
                Conditional::Refused(_) => {
                    refusals += 1;
                    continue;
                }
            }
            if claim.attempt > 1 {
                warn!(record = %claim.id, outcome = "takeover", attempt = claim.attempt,
                    "took over a claim whose lease passed: the previous attempt may have acted");
            }
            return Ok(Claimed::Ours);
        }
        // Still contended: whatever is there now says what happened.
        match store.get(&claim.id, claim.now_ms).await {
            Ok(found) => Claimed::by_read(claim, found).ok_or_else(|| {
                ClaimError::Failed(StoreError::new(
                    StoreErrorKind::Conflict,
                    format!(
                        "record {} kept changing during {} claim attempts",
                        claim.id,
                        refusals + conflicts as usize
                    ),
                ))
            }),
            Err(error) => Err(ClaimError::Failed(error)),
        }
    }

    /// A claim failed as an outage; a read tells whether the store is down.
    /// A statement can time out waiting on a duplicate's lock, and a writer
    /// demoted by a failover still answers reads: then the record found
    /// decides (this claim's own, landed before its answer was lost; a
    /// live record to replay or wait for), and the failure is not an
    /// outage that fail-open may run through. Only a store that cannot be
    /// read either is down.
    async fn confirm_outage(
        &self,
        claim: &Claim,
        error: StoreError,
    ) -> Result<Claimed, ClaimError> {
        match self.inner.store.get(&claim.id, claim.now_ms).await {
            Ok(found) => {
                debug!(record = %claim.id, %error, "the claim failed, but the store answers reads");
                Claimed::by_read(claim, found).ok_or(ClaimError::Failed(error))
            }
            Err(_) => Err(ClaimError::Outage(error)),
        }
    }

    /// One claim: a fresh claim, and the takeover of the lapsed claim it
    /// found, if that is what it found (`claim` then becomes the takeover).
    async fn claim_once(&self, claim: &mut Claim) -> Result<Conditional, StoreError> {
        let store = &self.inner.store;
        let found = store.claim(claim).await?;
        let Conditional::Refused(Some(lapsed)) = &found else {
            return Ok(found);
        };
        if lapsed.owner == claim.owner || !lapsed.is_lapsed(claim.now_ms) {
            return Ok(found);
        }
        let takeover = Claim {
            attempt: lapsed.attempt.saturating_add(1),
            first_started_ms: lapsed
                .first_started_ms
                .or(lapsed.created_at_ms)
                .unwrap_or(claim.now_ms),
            ..claim.clone()
        };
        let found = store.take_over(&takeover, &lapsed.owner).await?;
        *claim = takeover;
        Ok(found)
    }

    /// The operation's handle to the claim it runs under.
    fn handle(&self, claim: &Claim) -> ClaimHandle {
        let takeover = (claim.attempt > 1).then_some(Takeover {
            attempt: claim.attempt,
            first_started_at_ms: claim.first_started_ms,
        });
        ClaimHandle::held(
            Box::new(self.clone()),
            claim.id.clone(),
            claim.owner.clone(),
            claim.lease_until_ms,
            claim.expiration_s,
            takeover,
        )
    }

    /// Runs the operation, with the heartbeat beside it if configured: every
    /// third of the lease, the lease is extended by its length, until the
    /// operation ends or the claim is found lost.
    async fn run_claimed<Fut: Future>(&self, handle: &ClaimHandle, operation: Fut) -> Fut::Output {
        let Some(held) = handle.held_claim().filter(|_| self.inner.heartbeat) else {
            return operation.await;
        };
        let lease = Duration::from_millis(
            held.lease_until_ms()
                .saturating_sub(self.inner.clock.now_ms())
                .max(MIN_LEASE_MS),
        );
        let heartbeat = async {
            let mut beats = tokio::time::interval(lease / 3);
            beats.tick().await; // the first tick is immediate
            loop {
                beats.tick().await;
                match held.extend(lease).await {
                    Ok(()) => {}
                    Err(_) if held.is_lost() => break,
                    // A store error: the next beat tries again, well within
                    // the lease.
                    Err(error) => warn!(%error, "the heartbeat could not extend the lease"),
                }
            }
            std::future::pending::<Infallible>().await
        };
        tokio::pin!(operation);
        tokio::select! {
            output = &mut operation => output,
            never = heartbeat => match never {},
        }
    }

    fn claim_for(
        &self,
        id: RecordId,
        attempt: &Attempt<'_>,
        now_ms: u64,
    ) -> Result<Claim, StoreError> {
        let inner = &*self.inner;
        let capped = now_ms.saturating_add(duration_ms(inner.max_lease));
        let lease_until_ms = attempt
            .deadline_ms
            .map_or_else(
                || now_ms.saturating_add(duration_ms(inner.default_lease)),
                |deadline| deadline.min(capped),
            )
            .max(now_ms.saturating_add(MIN_LEASE_MS));
        // The record must outlive its lease, or it would count as absent (and
        // be taken over) while its owner still runs.
        let expiration_s = self.expiration_s(now_ms).max(lease_until_ms / 1000 + 1);
        Ok(Claim {
            id,
            owner: OwnerToken::generate()?,
            fingerprint: attempt.fingerprint.clone(),
            now_ms,
            lease_until_ms,
            expiration_s,
            attempt: 1,
            first_started_ms: now_ms,
        })
    }

    fn expiration_s(&self, now_ms: u64) -> u64 {
        (now_ms / 1000).saturating_add(self.inner.retention.as_secs())
    }

    /// Decides what a live record found at claim time means for this
    /// attempt: mismatch first (a different payload never learns anything
    /// about the other request), then replay, then in progress.
    fn existing<T, E>(
        &self,
        record: Record,
        codec: &impl Codec<T>,
        fingerprint: &Fingerprint,
        now_ms: u64,
    ) -> Result<Outcome<T>, Error<E>> {
        if &record.fingerprint != fingerprint {
            debug!(record = %record.id, outcome = "key_reused", "idempotency");
            return Err(Error::KeyReused);
        }
        match record.status {
            Status::Completed => {
                let Some(response) = record.response else {
                    return Err(Error::Store(StoreError::corrupt(format!(
                        "record {} is COMPLETED but holds no response",
                        record.id
                    ))));
                };
                let value = codec.decode(&response).map_err(|error| {
                    Error::Store(
                        StoreError::corrupt(format!(
                            "the response stored in record {} does not decode",
                            record.id
                        ))
                        .with_source(error),
                    )
                })?;
                debug!(record = %record.id, outcome = "replay", "idempotency");
                if let Some(cache) = &self.inner.cache {
                    cache.put(
                        record.id,
                        CachedRecord {
                            fingerprint: record.fingerprint,
                            expiration_s: record.expiration_s,
                            response: response.into(),
                            completed_at_ms: record.completed_at_ms,
                            attempt: record.attempt,
                        },
                    );
                }
                Ok(Outcome::replay(
                    value,
                    Replayed {
                        completed_at_ms: record.completed_at_ms,
                        expiration_s: record.expiration_s,
                        attempt: record.attempt,
                        cached: false,
                    },
                ))
            }
            Status::InProgress => {
                let left_ms = record
                    .lease_until_ms
                    .unwrap_or(record.expiration_s.saturating_mul(1000))
                    .saturating_sub(now_ms);
                // Whole seconds, rounded up (Retry-After has no fractions),
                // and at least one: a retry before the lease passes is wasted.
                let retry_after = Duration::from_secs(left_ms.div_ceil(1000).max(1));
                debug!(record = %record.id, outcome = "in_progress", retry_after_s = retry_after.as_secs(), "idempotency");
                Err(Error::InProgress { retry_after })
            }
        }
    }

    async fn complete<E>(
        &self,
        claim: Claim,
        response: Vec<u8>,
        writes: Vec<St::Write>,
        transactional: bool,
    ) -> Result<OutcomeKind, Error<E>> {
        let inner = &*self.inner;
        let now_ms = inner.clock.now_ms();
        let expiration_s = self.expiration_s(now_ms);
        let cached = inner
            .cache
            .as_ref()
            .map(|_| Arc::<[u8]>::from(&response[..]));
        let completion = Completion {
            id: claim.id.clone(),
            owner: claim.owner.clone(),
            response,
            now_ms,
            expiration_s,
            writes,
        };
        // A completion is fenced, so one that lost a race (at SERIALIZABLE,
        // a duplicate's claim reading the row) is safely tried again.
        let completed = retry_conflicts(|| inner.store.complete(completion.clone())).await;
        let applied = match completed {
            Ok(Conditional::Applied) => Ok(true),
            // This very completion, landed before its retry.
            Ok(Conditional::Refused(Some(record))) => {
                Ok(record.status == Status::Completed && record.owner == claim.owner)
            }
            Ok(Conditional::Refused(None)) => Ok(false),
            Err(error) => Err(error),
        };
        match applied {
            Ok(true) => {
                if let (Some(cache), Some(response)) = (&inner.cache, cached) {
                    cache.put(
                        claim.id.clone(),
                        CachedRecord {
                            fingerprint: claim.fingerprint,
                            expiration_s,
                            response,
                            completed_at_ms: Some(now_ms),
                            attempt: claim.attempt,
                        },
                    );
                }
                debug!(record = %claim.id, outcome = "fresh", "idempotency");
                Ok(OutcomeKind::Fresh)
            }
            Ok(false) => {
                warn!(record = %claim.id, outcome = "lease_lost", transactional,
                    "the lease passed and the key was taken over before completion; \
                     this outcome is not stored (raise the lease or the function timeout)");
                if transactional {
                    Err(Error::LeaseLost)
                } else {
                    Ok(OutcomeKind::LeaseLost)
                }
            }
            Err(error) if transactional => {
                warn!(record = %claim.id, outcome = "store_error", %error,
                    "transactional completion failed; releasing the claim");
                self.release(&claim).await;
                Err(Error::Store(error))
            }
            Err(error) => {
                warn!(record = %claim.id, outcome = "not_recorded", %error,
                    "the outcome could not be stored; the claim stays until its lease passes");
                Ok(OutcomeKind::NotRecorded)
            }
        }
    }

    /// Releases a claim so a retry can run; best effort, since a claim that
    /// cannot be released still expires with its lease.
    async fn release(&self, claim: &Claim) {
        match retry_conflicts(|| self.inner.store.release(&claim.id, &claim.owner)).await {
            // No record: released already (a retry of a release that had
            // landed), or never there. Nothing of ours is left.
            Ok(Conditional::Applied | Conditional::Refused(None)) => {}
            Ok(Conditional::Refused(Some(_))) => {
                warn!(record = %claim.id, outcome = "lease_lost", "the claim was taken over before it could be released")
            }
            Err(error) => {
                warn!(record = %claim.id, %error, "the claim could not be released; it stays until its lease passes")
            }
        }
    }

    /// A replay (or a rejection) from the local cache, if it holds the key.
    fn cached_replay<T, E>(
        &self,
        id: &RecordId,
        attempt: &Attempt<'_>,
        codec: &impl Codec<T>,
        now_ms: u64,
    ) -> Option<Result<Outcome<T>, Error<E>>> {
        let cached = self.cached(id, now_ms)?;
        if cached.fingerprint != attempt.fingerprint {
            debug!(record = %id, outcome = "key_reused", cached = true, "idempotency");
            return Some(Err(Error::KeyReused));
        }
        match codec.decode(&cached.response) {
            Ok(value) => {
                debug!(record = %id, outcome = "cached_replay", "idempotency");
                Some(Ok(Outcome::replay(
                    value,
                    Replayed {
                        completed_at_ms: cached.completed_at_ms,
                        expiration_s: cached.expiration_s,
                        attempt: cached.attempt,
                        cached: true,
                    },
                )))
            }
            // A value that no longer decodes (the type changed across a
            // deployment) is left to the store path, which reports it.
            Err(_) => {
                self.evict(id);
                None
            }
        }
    }

    /// Whether the compatibility mode's read of Powertools' record is
    /// skipped: idempotency is off, or the local cache holds `key` inside
    /// `scope` (the next call is answered from it, without a store call).
    #[cfg(feature = "powertools")]
    pub(crate) fn skips_powertools(&self, scope: &str, key: Option<&str>) -> bool {
        self.inner.disabled
            || key.is_some_and(|key| {
                let id = self.record_id(scope, key);
                self.cached(&id, self.inner.clock.now_ms()).is_some()
            })
    }

    fn cached(&self, id: &RecordId, now_ms: u64) -> Option<CachedRecord> {
        self.inner.cache.as_ref()?.get(id, now_ms)
    }

    fn evict(&self, id: &RecordId) {
        if let Some(cache) = &self.inner.cache {
            cache.remove(id);
        }
    }
}

impl<St: Store> claim::Extender for Engine<St> {
    fn now_ms(&self) -> u64 {
        self.inner.clock.now_ms()
    }

    fn max_lease_ms(&self) -> u64 {
        duration_ms(self.inner.max_lease)
    }

    fn extend<'a>(
        &'a self,
        extension: &'a Extension,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Conditional, StoreError>> + Send + 'a>> {
        Box::pin(self.inner.store.extend(extension))
    }
}

/// The text a panic was raised with, when it was a string (as `panic!`
/// and `unwrap` raise).
pub(crate) fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(a panic without a message)")
}

/// What [`Engine::forget`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Forgotten {
    /// The record was deleted: the next request with the key runs.
    Removed,
    /// There was no record.
    Absent,
    /// The record is `IN_PROGRESS` and was kept: its operation may be
    /// running. [`Engine::forget_even_in_progress`] removes it anyway.
    InProgress(Record),
}

impl Forgotten {
    fn kind(&self) -> &'static str {
        match self {
            Forgotten::Removed => "removed",
            Forgotten::Absent => "absent",
            Forgotten::InProgress(_) => "in_progress",
        }
    }
}

/// Why a claim failed.
enum ClaimError {
    /// The store could neither claim nor be read: an outage, which
    /// fail-open may run through.
    Outage(StoreError),
    /// Anything else, an outage the store's reads contradict included.
    Failed(StoreError),
}

/// What a claim decided.
enum Claimed {
    /// The key is this attempt's.
    Ours,
    /// A live record holds the key.
    Held(Record),
}

impl Claimed {
    /// What the record a read found under the claim's id decides: this
    /// claim's own write (landed, its answer lost), or a live record that
    /// holds the key; nothing when there is neither.
    fn by_read(claim: &Claim, found: Option<Record>) -> Option<Self> {
        match found {
            Some(record) if record.owner == claim.owner => Some(Claimed::Ours),
            Some(record) if record.is_live(claim.now_ms) => Some(Claimed::Held(record)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests;
