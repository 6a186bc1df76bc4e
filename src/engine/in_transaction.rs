//! The run inside a store transaction ([`Engine::run_in_transaction`]):
//! begin; claim the key in the transaction; run the operation, bounded by
//! the transaction's time limit, with the transaction; complete the
//! record in it; commit. Everything else (the cache, the duplicates of this
//! process, the fence, the replay) is the other runs'.
//!
//! The store offers the transaction ([`Transactions`]); what each of its
//! answers means is decided here, as [`run`](super::run) decides for the
//! claims outside a transaction.

use super::{
    attempt::Attempt,
    claim_handle::ClaimHandle,
    codec::{unserialisable, Codec, Json},
    fence::{fence, takeover_of, Fence},
    outcome::{Outcome, OutcomeKind},
    state::Engine,
};
use crate::{
    store::{
        transaction, Claim, Completion, Conditional, Record, Store, Transaction, TransactionLimits,
        TransactionalStore, Transactions,
    },
    Error, StoreError, StoreErrorKind, WriteRefusal,
};
use futures_util::FutureExt;
use serde::{de::DeserializeOwned, Serialize};
use std::{future::Future, panic::AssertUnwindSafe, sync::Arc, time::Duration};
// The time limit is measured on tokio's clock, as every wait of the
// engine's: the same as the machine's, but under a paused test clock (the
// simulator's), which moves it.
use tokio::time::Instant;
use tracing::{debug, warn};

/// How long before the invocation's deadline the transaction ends, to
/// leave time to roll back and answer.
const DEADLINE_MARGIN_MS: u64 = 250;

/// What the claim inside the transaction found.
enum Claimed {
    /// The key is this transaction's.
    Ours,
    /// A committed, live record holds the key.
    Held(Record),
    /// Another transaction holds the key and did not end within the claim
    /// wait (or a concurrent write won).
    Busy,
}

/// Why the typed operation did not answer: its own error, or a store
/// whose transaction is not the one it names (never, for a store that
/// keeps [`TransactionalStore`]'s contract).
enum Handed<E> {
    Operation(E),
    Mismatched,
}

impl<St: TransactionalStore> Engine<St> {
    /// Runs `operation` inside one transaction of the store's with its
    /// claim: begin; claim the key; the operation's own reads, locks
    /// (`SELECT … FOR UPDATE`) and writes through the transaction it is
    /// handed (PostgreSQL's
    /// [`PgTransaction`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/postgres/struct.PgTransaction.html));
    /// its value stored in the completed record; commit. The business
    /// effect and the record commit together or not at all, and the
    /// operation can check (a balance) before it writes.
    ///
    /// - A concurrent duplicate waits at most
    ///   [`claim_wait`](TransactionLimits::claim_wait) for the
    ///   transaction that holds the key: it then gets the committed outcome
    ///   as a replay, or [`Error::InProgress`] (a 409) at once. It never
    ///   runs.
    /// - A record already there keeps every meaning it has elsewhere: a
    ///   replay, [`Error::KeyReused`] for another payload, in progress for
    ///   a live claim of the deferred form ([`run`](Engine::run)), and the
    ///   takeover of a lapsed one (the transaction's `takeover()`).
    /// - An operation error ([`Error::Operation`]), a panic, a dropped
    ///   future or a crash rolls everything back, the claim too: the key is
    ///   free, and the retry runs as a first attempt (it is not told of a
    ///   takeover, since nothing of the first attempt survived in the
    ///   database; effects outside it are not covered).
    /// - A business refusal whose answer should be stored: roll the
    ///   operation's writes back (PostgreSQL:
    ///   `PgTransaction::roll_back_writes`) and return the answer as the
    ///   value (PostgreSQL's `RefusalRules` name the SQLSTATEs and
    ///   constraints that are refusals).
    /// - Past [`time_limit`](TransactionLimits::time_limit), the operation
    ///   is stopped, everything is rolled back, and the caller gets
    ///   [`Error::TimeLimitExceeded`].
    /// - The store unreachable: [`Error::Store`], and nothing runs (never
    ///   fail-open: the operation needs the database anyway).
    ///
    /// ```no_run
    /// # #[cfg(feature = "postgres")] {
    /// use lambda_idempotency::{
    ///     store::postgres::{tokio_postgres::types::Type, PostgresStore, TransactionLimits},
    ///     Attempt, Engine, Fingerprint,
    /// };
    ///
    /// # async fn example(engine: Engine<PostgresStore>) -> Result<(), Box<dyn std::error::Error>> {
    /// let attempt = Attempt::new("tenant-1", "order-42", Fingerprint::of_json(&1250)?);
    /// let outcome = engine
    ///     .run_in_transaction(&attempt, TransactionLimits::new(), |tx| async move {
    ///         let rows = tx
    ///             .query_typed(
    ///                 "SELECT balance FROM accounts WHERE id = $1 FOR UPDATE",
    ///                 &[(&"acct_1", Type::TEXT)],
    ///             )
    ///             .await?;
    ///         let balance: i64 = match rows.first() {
    ///             Some(row) => row.try_get(0)?,
    ///             None => return Ok("no such account".to_owned()),
    ///         };
    ///         if balance < 1250 {
    ///             return Ok("insufficient funds".to_owned());
    ///         }
    ///         tx.execute_typed(
    ///             "UPDATE accounts SET balance = balance - 1250 WHERE id = $1",
    ///             &[(&"acct_1", Type::TEXT)],
    ///         )
    ///         .await?;
    ///         Ok::<_, lambda_idempotency::store::postgres::tokio_postgres::Error>("paid".to_owned())
    ///     })
    ///     .await?;
    /// # let _ = outcome; Ok(()) }
    /// # }
    /// ```
    pub async fn run_in_transaction<T, E, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        limits: TransactionLimits,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(St::Transaction) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        self.run_in_transaction_with(attempt, limits, &Json, operation)
            .await
    }

    /// Like [`run_in_transaction`](Engine::run_in_transaction), with the
    /// value stored by `codec` rather than as JSON.
    pub async fn run_in_transaction_with<T, E, C, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        limits: TransactionLimits,
        codec: &C,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        F: FnOnce(St::Transaction) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let no_refusals = |_: &WriteRefusal| None;
        let ran = self
            .transaction_run(attempt, limits, codec, no_refusals, |claim| async move {
                let transaction = claim
                    .transaction::<St::Transaction>()
                    .cloned()
                    .ok_or(Handed::Mismatched)?;
                match operation(transaction).await {
                    Ok(value) => Ok((value, Vec::new())),
                    Err(error) => Err(Handed::Operation(error)),
                }
            })
            .await;
        ran.map_err(|error| {
            error.map_operation(|handed| match handed {
                Handed::Operation(error) => Error::Operation(error),
                Handed::Mismatched => Error::Store(StoreError::new(
                    StoreErrorKind::Misconfigured,
                    "the store's transaction is not its TransactionalStore::Transaction",
                )),
            })
        })
    }
}

impl<St: Store> Engine<St> {
    /// The run inside a store transaction, for the adapters (generic over
    /// their store, which offers its transactions through
    /// [`Store::transactions`]): the operation gets its [`ClaimHandle`],
    /// which holds the transaction, and returns its value and the writes to
    /// run in the transaction before the completion; a refused write is
    /// answered as `refusal` says, stored without any of the writes.
    pub(crate) async fn transaction_run<T, E, C, R, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        limits: TransactionLimits,
        codec: &C,
        refusal: R,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        R: FnOnce(&WriteRefusal) -> Option<Result<T, E>>,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let Some(transactions) = self.store().transactions() else {
            return Err(Error::Store(StoreError::new(
                StoreErrorKind::Misconfigured,
                "this store cannot run an operation inside its transactions",
            )));
        };
        let started = Instant::now();
        let limits = self.within_deadline(attempt, limits);
        if self.is_disabled() {
            return self
                .run_disabled_in_transaction(transactions, started, &limits, operation)
                .await;
        }
        let mut claim = match self.claim_unless_cached(attempt, codec) {
            Ok(claim) => claim,
            Err(answer) => return answer,
        };
        // A duplicate of a transaction under way in this process waits on it
        // in memory (as long as it would wait on its lock, or as the attempt
        // says), holding no connection: its replay, or the key once free.
        if let Some(run) = self.local_runs().get(&claim.id) {
            let wait = attempt.wait_in_process.unwrap_or(limits.claim_wait_value());
            let until = Some(tokio::time::Instant::now() + wait);
            if let Some(answer) = Box::pin(self.after_local_run(&run, attempt, until, codec)).await
            {
                return answer;
            }
            claim = match self.claim_unless_cached(attempt, codec) {
                Ok(claim) => claim,
                Err(answer) => return answer,
            };
        }
        let transaction = match self
            .claim_in_transaction(transactions, &mut claim, &limits, attempt, codec)
            .await
        {
            Ok(transaction) => transaction,
            Err(answer) => return answer,
        };
        let handed = transaction.handed();
        let handle = ClaimHandle::in_transaction(claim.takeover(), Arc::clone(&handed));
        // Until this returns: its duplicates in this process wait on it.
        let _running = self.local_runs().start(&claim, &handle);
        let run = transaction::scope(handed, handle.clone().scope(operation(handle)));
        let (value, writes) = match self.bounded(&*transaction, started, &limits, run).await {
            Ok(ran) => ran,
            Err(error) => {
                debug!(record = %claim.id, outcome = error.kind().as_str(), in_transaction = true,
                    "idempotency: the transaction was rolled back; the key is free");
                return Err(error);
            }
        };
        let completing = Completing {
            transaction: &*transaction,
            claim: &claim,
            started,
            limits: &limits,
        };
        self.complete_in_transaction(completing, codec, value, writes, refusal)
            .await
    }

    /// The limits, never past the invocation's deadline: a Lambda stopped
    /// at its timeout would hold the transaction until the server's own
    /// bound.
    fn within_deadline(
        &self,
        attempt: &Attempt<'_>,
        limits: TransactionLimits,
    ) -> TransactionLimits {
        match attempt.deadline_ms {
            Some(deadline_ms) => {
                let left_ms = deadline_ms.saturating_sub(self.now_ms());
                let left = Duration::from_millis(left_ms.saturating_sub(DEADLINE_MARGIN_MS));
                limits.time_limit(limits.time_limit_value().min(left))
            }
            None => limits,
        }
    }

    /// Idempotency is off: the operation still runs in its transaction,
    /// with its writes, and nothing is recorded.
    async fn run_disabled_in_transaction<T, E, F, Fut>(
        &self,
        transactions: &dyn Transactions<St::Write>,
        started: Instant,
        limits: &TransactionLimits,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let transaction = transactions.begin(limits).await.map_err(Error::Store)?;
        let handed = transaction.handed();
        let handle = ClaimHandle::in_transaction(None, Arc::clone(&handed));
        let run = transaction::scope(handed, handle.clone().scope(operation(handle)));
        let (value, writes) = self.bounded(&*transaction, started, limits, run).await?;
        if let Err(error) = transaction.write(writes).await {
            transaction.roll_back().await;
            return Err(Error::Store(error));
        }
        transaction.commit().await.map_err(Error::Store)?;
        Ok(Outcome::new(value, OutcomeKind::Disabled))
    }

    /// Begins the transaction and claims the key in it; a key held by
    /// another (a replay, a mismatch, in progress) or a failure answers the
    /// attempt, the transaction rolled back.
    async fn claim_in_transaction<T, E, C: Codec<T>>(
        &self,
        transactions: &dyn Transactions<St::Write>,
        claim: &mut Claim,
        limits: &TransactionLimits,
        attempt: &Attempt<'_>,
        codec: &C,
    ) -> Result<Arc<dyn Transaction<St::Write>>, Result<Outcome<T>, Error<E>>> {
        let transaction = transactions
            .begin(limits)
            .await
            .map_err(|e| Err(Error::Store(e)))?;
        let claimed = match claim_within(&*transaction, claim).await {
            Ok(Claimed::Ours) => transaction.hold().await.map(|()| Claimed::Ours),
            other => other,
        };
        let answer = match claimed {
            Ok(Claimed::Ours) => return Ok(transaction),
            Ok(Claimed::Held(record)) => self.existing(record, codec, attempt, claim.now_ms),
            Ok(Claimed::Busy) => {
                debug!(record = %claim.id, outcome = "in_progress", in_transaction = true, "idempotency");
                Err(Error::InProgress {
                    retry_after: Duration::from_secs(1),
                })
            }
            Err(error) => {
                warn!(record = %claim.id, outcome = "store_error", kind = error.kind().as_str(), %error,
                    "idempotency claim in transaction failed");
                Err(Error::Store(error))
            }
        };
        transaction.roll_back().await;
        Err(answer)
    }

    /// Completes the record in the transaction with the operation's value
    /// and writes (or a refusal's answer without them), and commits, within
    /// what is left of the time limit; on failure nothing is committed and
    /// the key is free.
    async fn complete_in_transaction<T, E, C, R>(
        &self,
        completing: Completing<'_, St::Write>,
        codec: &C,
        value: T,
        writes: Vec<St::Write>,
        refusal: R,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        R: FnOnce(&WriteRefusal) -> Option<Result<T, E>>,
    {
        let Completing {
            transaction,
            claim,
            started,
            limits,
        } = completing;
        let now_ms = self.now_ms();
        let expiration_s = self.expiration_s(now_ms);
        let completion = |response: Vec<u8>, writes| Completion {
            id: claim.id.clone(),
            owner: claim.owner.clone(),
            response,
            now_ms,
            expiration_s,
            writes,
        };
        let finishing = async {
            let response = codec
                .encode(&value)
                .map_err(|error| Error::Store(unserialisable(error)))?;
            let completed = transaction
                .complete(completion(response.clone(), writes))
                .await;
            let (value, response) = match completed {
                Ok(completed) => {
                    applied(completed)?;
                    (value, response)
                }
                Err(error) => match error.write_refusal().and_then(refusal) {
                    // Stored without the writes: rolled back to the claim.
                    Some(Ok(answer)) => {
                        transaction.roll_back_writes().await.map_err(Error::Store)?;
                        let response = codec
                            .encode(&answer)
                            .map_err(|error| Error::Store(unserialisable(error)))?;
                        let completed = transaction
                            .complete(completion(response.clone(), Vec::new()))
                            .await
                            .map_err(Error::Store)?;
                        applied(completed)?;
                        debug!(record = %claim.id, outcome = "refused", "a write was refused: its answer is stored");
                        (answer, response)
                    }
                    Some(Err(answer)) => return Err(Error::Operation(answer)),
                    None => return Err(Error::Store(error)),
                },
            };
            transaction.commit().await.map_err(Error::Store)?;
            Ok((value, response))
        };
        let finished = match tokio::time::timeout(remaining(started, limits), finishing).await {
            Ok(finished) => finished,
            Err(_) => Err(Error::TimeLimitExceeded {
                limit: limits.time_limit_value(),
            }),
        };
        let (value, response) = match finished {
            Ok(finished) => finished,
            Err(error) => {
                if let Error::Store(error) = &error {
                    warn!(record = %claim.id, %error, "the completion in transaction failed");
                }
                // Past the time limit, a statement may still run: the
                // connection is closed instead of waited for.
                if !matches!(error, Error::TimeLimitExceeded { .. }) {
                    transaction.roll_back().await;
                }
                // A refusal the application answered with an error of its
                // own is its answer, not a failure.
                if !matches!(error, Error::Operation(_)) {
                    warn!(record = %claim.id, outcome = error.kind().as_str(),
                        "the transaction could not complete its record; nothing was committed, the key is free");
                }
                return Err(error);
            }
        };
        self.completed(claim, &response, expiration_s, now_ms);
        debug!(record = %claim.id, outcome = "fresh", in_transaction = true, "idempotency");
        Ok(Outcome::new(value, OutcomeKind::Fresh))
    }

    /// Runs the operation within what is left of the time limit; on its
    /// error, its panic or the limit, rolls the transaction back.
    async fn bounded<T, E, Fut>(
        &self,
        transaction: &dyn Transaction<St::Write>,
        started: Instant,
        limits: &TransactionLimits,
        operation: Fut,
    ) -> Result<T, Error<E>>
    where
        Fut: Future<Output = Result<T, E>>,
    {
        let ran = AssertUnwindSafe(tokio::time::timeout(remaining(started, limits), operation))
            .catch_unwind()
            .await;
        match ran {
            // Answered once the limit had passed: the server's own
            // statement_timeout (the same limit, counted from the
            // statement's start, so never earlier) may be what ended it,
            // and the handler may have turned its `57014` into an answer
            // of its own (a 500) before the engine's timer was polled. The
            // limit decides, whatever the handler made of it.
            Ok(Ok(_)) if remaining(started, limits).is_zero() => {
                transaction.roll_back().await;
                Err(time_limit_exceeded(limits, "answered"))
            }
            Ok(Ok(Ok(value))) => Ok(value),
            Ok(Ok(Err(error))) => {
                transaction.roll_back().await;
                Err(Error::Operation(error))
            }
            // A statement of the operation's may still run on the server
            // (until its statement_timeout): the connection is closed
            // rather than waited for, and the server rolls back.
            Ok(Err(_elapsed)) => Err(time_limit_exceeded(limits, "ran")),
            Err(panic) => {
                transaction.roll_back().await;
                std::panic::resume_unwind(panic);
            }
        }
    }
}

/// The transaction a completion is written in, its claim, and its bound.
struct Completing<'a, W> {
    transaction: &'a dyn Transaction<W>,
    claim: &'a Claim,
    started: Instant,
    limits: &'a TransactionLimits,
}

/// Claims `claim`'s key inside the transaction: a fresh claim, or the
/// takeover of a lapsed one (then `claim` becomes the takeover). The
/// transaction's answers mean what the store's do outside one, but for a
/// [`Conflict`](StoreErrorKind::Conflict) (the claim waited in vain on
/// another transaction's, or the database ended a race) and a refusal
/// with no committed record to see yet: both are a key in progress.
async fn claim_within<W: 'static>(
    transaction: &dyn Transaction<W>,
    claim: &mut Claim,
) -> Result<Claimed, StoreError> {
    let found = match busy_if_conflict(transaction.claim(claim).await)? {
        None => return Ok(Claimed::Busy),
        Some(Conditional::Applied) => return Ok(Claimed::Ours),
        Some(Conditional::Refused(None)) => return Ok(Claimed::Busy),
        Some(Conditional::Refused(Some(found))) => found,
    };
    match fence(Some(&found), &claim.owner, claim.now_ms) {
        Fence::Held | Fence::OwnCompletion => return Ok(Claimed::Held(found)),
        // Expired meanwhile: the next attempt claims it.
        Fence::Free => return Ok(Claimed::Busy),
        // This transaction's own claim: its token is new to the store.
        Fence::OwnClaim => return Ok(Claimed::Ours),
        Fence::Lapsed => {}
    }
    let takeover = takeover_of(claim, &found);
    match busy_if_conflict(transaction.take_over(&takeover, &found.owner).await)? {
        Some(Conditional::Applied) => {
            warn!(record = %takeover.id, outcome = "takeover", attempt = takeover.attempt,
                "took over a claim whose lease passed: the previous attempt may have acted");
            *claim = takeover;
            Ok(Claimed::Ours)
        }
        Some(Conditional::Refused(Some(record)))
            if fence(Some(&record), &takeover.owner, claim.now_ms) == Fence::Held =>
        {
            Ok(Claimed::Held(record))
        }
        None | Some(Conditional::Refused(_)) => Ok(Claimed::Busy),
    }
}

/// A conditional write's answer, `None` when it was a conflict.
fn busy_if_conflict(
    answer: Result<Conditional, StoreError>,
) -> Result<Option<Conditional>, StoreError> {
    match answer {
        Ok(answer) => Ok(Some(answer)),
        Err(error) if error.kind() == StoreErrorKind::Conflict => Ok(None),
        Err(error) => Err(error),
    }
}

/// The completion applied; a refusal cannot happen (the row is locked by
/// this transaction since its claim), and is an error if it does.
fn applied<E>(completed: Conditional) -> Result<(), Error<E>> {
    match completed {
        Conditional::Applied => Ok(()),
        Conditional::Refused(_) => Err(Error::Store(StoreError::new(
            StoreErrorKind::Other,
            "the record claimed in this transaction refused its completion",
        ))),
    }
}

/// The operation `ran` (or `answered`) past its transaction's time limit:
/// logged, and the error the caller gets.
fn time_limit_exceeded<E>(limits: &TransactionLimits, how: &str) -> Error<E> {
    warn!(
        limit_ms = limits.time_limit_value().as_millis() as u64,
        outcome = "time_limit_exceeded",
        "the operation {how} past its transaction's time limit; rolled back"
    );
    Error::TimeLimitExceeded {
        limit: limits.time_limit_value(),
    }
}

fn remaining(started: Instant, limits: &TransactionLimits) -> Duration {
    limits.time_limit_value().saturating_sub(started.elapsed())
}
