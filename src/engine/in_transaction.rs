//! The run inside a store transaction ([`Engine::run_in_transaction`]),
//! and what holding a key in a transaction means: begin; claim the key in
//! the transaction; run the operation, bounded by the transaction's time
//! limit, with the transaction; complete the record in it; commit; roll
//! back to give the key back. The loop is every run's
//! ([`run`](super::run)), with the key held this way
//! ([`Holding::Transaction`]): the cache, the duplicates of this process,
//! the claim's answers, the replay, the errors and the refusals are
//! decided there once.
//!
//! The store offers the transaction ([`Transactions`]); what each of its
//! answers means is decided here, as [`claim`](super::claim) and
//! [`completion`](super::completion) decide for a key held under a
//! lease.

use super::{
    attempt::Attempt,
    claim::{ClaimError, Claimed},
    claim_handle::ClaimHandle,
    codec::{Codec, Json},
    fence::{fence, takeover_of, Fence},
    holding::Holding,
    mode::Mode,
    outcome::{Outcome, OutcomeKind},
    sealing::stored_form,
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
    /// answered as `refusal` says, stored without any of the writes. The
    /// loop is every run's ([`run`](super::run)), with the key held in the
    /// transaction.
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
            let result = Err(Error::Store(StoreError::new(
                StoreErrorKind::Misconfigured,
                "this store cannot run an operation inside its transactions",
            )));
            self.report_answer(attempt, self.observed_start(), &result);
            return result;
        };
        let held = InTransaction {
            transactions,
            started: Instant::now(),
            limits: self.within_deadline(attempt, limits),
            open: None,
        };
        let holding = Holding::Transaction(Box::new(held));
        let started = self.observed_start();
        let result = self
            .run_unreported(
                attempt,
                Mode::Transactional,
                codec,
                refusal,
                holding,
                operation,
            )
            .await;
        self.report_answer(attempt, started, &result);
        result
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

    /// Completes the record in the transaction with `response`, and
    /// commits, within what is left of the time limit: with the
    /// operation's writes, or, answering a refusal, with them rolled back.
    /// A refused write of the operation's leaves the transaction open, its
    /// claim held, for the refusal's answer; any other failure commits
    /// nothing, and the key is free.
    pub(super) async fn complete_in_transaction<E>(
        &self,
        held: &InTransaction<'_, St::Write>,
        claim: &Claim,
        response: Vec<u8>,
        completing: Completing<St::Write>,
    ) -> Result<OutcomeKind, Error<E>> {
        let now_ms = self.now_ms();
        let expiration_s = self.expiration_s(now_ms);
        let answers_refusal = matches!(completing, Completing::RefusalAnswer);
        let finishing = async {
            let stored = self.stored(claim, &response, expiration_s).await;
            let writes = match completing {
                Completing::Operation(writes) => writes,
                Completing::RefusalAnswer => Vec::new(),
            };
            let completion = completion(
                claim,
                stored.map_err(finish_failed)?,
                writes,
                now_ms,
                expiration_s,
            );
            let transaction = held.open().map_err(finish_failed)?;
            if answers_refusal {
                transaction
                    .roll_back_writes()
                    .await
                    .map_err(finish_failed)?;
            }
            match transaction.complete(completion).await {
                Ok(completed) => applied(completed)?,
                // Only the operation's writes can be refused: a refusal's
                // answer carries none.
                Err(error) if !answers_refusal && error.write_refusal().is_some() => {
                    return Err(Finish::Refused(error))
                }
                Err(error) => return Err(finish_failed(error)),
            }
            transaction.commit().await.map_err(finish_failed)
        };
        match held.within_time_limit(finishing).await {
            Ok(()) => Ok(self.committed(claim, &response, expiration_s, now_ms)),
            Err(Finish::Refused(error)) => {
                debug!(record = %claim.id, %error, "a write of the operation's was refused");
                Err(Error::Store(error))
            }
            Err(Finish::Failed(error)) => Err(held.failed(claim, error).await),
        }
    }

    /// The bytes the completion of `claim` with `response` stores: sealed
    /// when the engine encrypts (within the transaction's time limit, as
    /// the completion is), `response` as it is otherwise.
    async fn stored(
        &self,
        claim: &Claim,
        response: &[u8],
        expiration_s: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let sealed = if self.encrypts() {
            self.sealed(&claim.id, &claim.fingerprint, expiration_s, response)
                .await?
        } else {
            None
        };
        Ok(stored_form(sealed, response))
    }

    /// A completion committed: told to this process.
    fn committed(
        &self,
        claim: &Claim,
        response: &[u8],
        expiration_s: u64,
        now_ms: u64,
    ) -> OutcomeKind {
        self.completed(claim, response, expiration_s, now_ms);
        debug!(record = %claim.id, outcome = "fresh", in_transaction = true, "idempotency");
        OutcomeKind::Fresh
    }
}

/// A key held inside one of the store's transactions: what it is begun
/// with, and, once its claim is this attempt's, the transaction.
pub(super) struct InTransaction<'t, W> {
    transactions: &'t dyn Transactions<W>,
    limits: TransactionLimits,
    /// When the run began, which the time limit counts from.
    started: Instant,
    /// The transaction that holds the claim; `None` until it does.
    open: Option<Arc<dyn Transaction<W>>>,
}

impl<W: 'static> InTransaction<'_, W> {
    /// How long a claim waits on another transaction's lock.
    pub(super) fn claim_wait(&self) -> Duration {
        self.limits.claim_wait_value()
    }

    /// Begins the transaction and claims the key in it. A key held by
    /// another (a live record, or another transaction past the claim
    /// wait) or a failure rolls the transaction back; another
    /// transaction's is a [`Conflict`](StoreErrorKind::Conflict), a key in
    /// progress.
    pub(super) async fn claim(&mut self, claim: &mut Claim) -> Result<Claimed, ClaimError> {
        let transaction = self
            .transactions
            .begin(&self.limits)
            .await
            .map_err(ClaimError::Failed)?;
        let within = match claim_within(&*transaction, claim).await {
            Ok(Within::Ours) => transaction.hold().await.map(|()| Within::Ours),
            other => other,
        };
        let answer = match within {
            Ok(Within::Ours) => {
                self.open = Some(transaction);
                return Ok(Claimed::Ours);
            }
            Ok(Within::Held(record)) => Ok(Claimed::Held(record)),
            Ok(Within::Busy) => Err(ClaimError::Failed(StoreError::new(
                StoreErrorKind::Conflict,
                "another transaction holds the key",
            ))),
            Err(error) => Err(ClaimError::Failed(error)),
        };
        transaction.roll_back().await;
        answer
    }

    /// The operation's handle: the takeover it is, if it is one, and the
    /// transaction to run its statements in.
    pub(super) fn handle(&self, claim: &Claim) -> ClaimHandle {
        match &self.open {
            Some(transaction) => ClaimHandle::in_transaction(
                claim.takeover(),
                transaction.handed(),
                Some(claim.id.clone()),
            ),
            // Never: the handle is made once the claim is this
            // transaction's; `bounded` then refuses to run the operation.
            None => ClaimHandle::unprotected(claim.takeover()),
        }
    }

    /// Runs the operation, with the transaction as
    /// [`current`](crate::store::transaction::current), within what is
    /// left of the time limit; its panic is caught. Past the limit the
    /// answer is [`Error::TimeLimitExceeded`], the transaction rolled back
    /// (or its connection closed, when a statement may still run).
    pub(super) async fn bounded<E, Fut: Future>(
        &self,
        operation: Fut,
    ) -> Result<std::thread::Result<Fut::Output>, Error<E>> {
        let transaction = self.open().map_err(Error::Store)?;
        let operation = transaction::scope(transaction.handed(), operation);
        let ran = AssertUnwindSafe(tokio::time::timeout(self.remaining(), operation))
            .catch_unwind()
            .await;
        match ran {
            // Answered once the limit had passed: the server's own
            // statement_timeout (the same limit, counted from the
            // statement's start, so never earlier) may be what ended it,
            // and the handler may have turned its `57014` into an answer
            // of its own (a 500) before the engine's timer was polled. The
            // limit decides, whatever the handler made of it.
            Ok(Ok(_)) if self.remaining().is_zero() => {
                transaction.roll_back().await;
                Err(self.time_limit_exceeded("answered"))
            }
            Ok(Ok(output)) => Ok(Ok(output)),
            // A statement of the operation's may still run on the server
            // (until its statement_timeout): the connection is closed
            // rather than waited for (the transaction dropped), and the
            // server rolls back.
            Ok(Err(_elapsed)) => Err(self.time_limit_exceeded("ran")),
            Err(panic) => Ok(Err(panic)),
        }
    }

    /// Rolls the transaction back: nothing of the run stays, the key is
    /// free.
    pub(super) async fn roll_back(&self, claim: &Claim) {
        if let Some(transaction) = &self.open {
            transaction.roll_back().await;
            debug!(record = %claim.id, in_transaction = true,
                "idempotency: the transaction was rolled back; the key is free");
        }
    }

    /// Idempotency is off: the operation still runs in its transaction,
    /// with its writes, and nothing is recorded.
    pub(super) async fn run_disabled<T, E, F, Fut>(
        mut self: Box<Self>,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<W>), E>>,
    {
        let transaction = self
            .transactions
            .begin(&self.limits)
            .await
            .map_err(Error::Store)?;
        self.open = Some(Arc::clone(&transaction));
        let handle = ClaimHandle::in_transaction(None, transaction.handed(), None);
        let ran = self
            .bounded(Box::pin(handle.clone().scope(operation(handle))))
            .await?;
        let (value, writes) = match ran {
            Ok(Ok(ran)) => ran,
            Ok(Err(error)) => {
                transaction.roll_back().await;
                return Err(Error::Operation(error));
            }
            Err(panic) => {
                transaction.roll_back().await;
                std::panic::resume_unwind(panic);
            }
        };
        if let Err(error) = transaction.write(writes).await {
            transaction.roll_back().await;
            return Err(Error::Store(error));
        }
        transaction.commit().await.map_err(Error::Store)?;
        Ok(Outcome::new(value, OutcomeKind::Disabled))
    }

    /// The transaction that holds the claim.
    fn open(&self) -> Result<&Arc<dyn Transaction<W>>, StoreError> {
        self.open.as_ref().ok_or_else(not_open)
    }

    /// `finishing` within what is left of the time limit.
    async fn within_time_limit<E>(
        &self,
        finishing: impl Future<Output = Result<(), Finish<Error<E>>>>,
    ) -> Result<(), Finish<Error<E>>> {
        match tokio::time::timeout(self.remaining(), finishing).await {
            Ok(finished) => finished,
            Err(_) => Err(Finish::Failed(Error::TimeLimitExceeded {
                limit: self.limits.time_limit_value(),
            })),
        }
    }

    /// A completion that failed: nothing is committed, the key is free.
    async fn failed<E>(&self, claim: &Claim, error: Error<E>) -> Error<E> {
        if let Error::Store(error) = &error {
            warn!(record = %claim.id, %error, "the completion in transaction failed");
        }
        // Past the time limit, a statement may still run: the connection
        // is closed instead of waited for.
        if !matches!(error, Error::TimeLimitExceeded { .. }) {
            self.roll_back(claim).await;
        }
        warn!(record = %claim.id, outcome = error.kind().as_str(),
            "the transaction could not complete its record; nothing was committed and the key is free, unless its COMMIT landed and its answer was lost (a retry then replays it)");
        error
    }

    /// The operation ran (or answered) past its transaction's time limit:
    /// logged, and the error the caller gets.
    fn time_limit_exceeded<E>(&self, how: &str) -> Error<E> {
        let limit = self.limits.time_limit_value();
        warn!(
            limit_ms = limit.as_millis() as u64,
            outcome = "time_limit_exceeded",
            "the operation {how} past its transaction's time limit; rolled back"
        );
        Error::TimeLimitExceeded { limit }
    }

    fn remaining(&self) -> Duration {
        self.limits
            .time_limit_value()
            .saturating_sub(self.started.elapsed())
    }
}

/// Why a completion in the transaction did not commit: a refused write,
/// the transaction still open for the refusal's answer; or a failure.
/// What a completion in a transaction commits beside its record.
pub(super) enum Completing<W> {
    /// The operation's writes.
    Operation(Vec<W>),
    /// A refusal's answer: the operation's writes rolled back to the
    /// claim first.
    RefusalAnswer,
}

enum Finish<E> {
    Refused(StoreError),
    Failed(E),
}

fn finish_failed<E>(error: StoreError) -> Finish<Error<E>> {
    Finish::Failed(Error::Store(error))
}

/// No transaction holds the claim: never, once a claim is this
/// transaction's.
fn not_open() -> StoreError {
    StoreError::new(
        StoreErrorKind::Other,
        "no transaction of the store's holds this claim",
    )
}

/// The completion of `claim` with `response` and `writes`.
fn completion<W>(
    claim: &Claim,
    response: Vec<u8>,
    writes: Vec<W>,
    now_ms: u64,
    expiration_s: u64,
) -> Completion<W> {
    Completion {
        id: claim.id.clone(),
        owner: claim.owner.clone(),
        response,
        now_ms,
        expiration_s,
        writes,
    }
}

/// What the claim inside the transaction found.
enum Within {
    /// The key is this transaction's.
    Ours,
    /// A committed, live record holds the key.
    Held(Record),
    /// Another transaction holds the key and did not end within the claim
    /// wait (or a concurrent write won).
    Busy,
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
) -> Result<Within, StoreError> {
    let found = match busy_if_conflict(transaction.claim(claim).await)? {
        None => return Ok(Within::Busy),
        Some(Conditional::Applied) => return Ok(Within::Ours),
        Some(Conditional::Refused(None)) => return Ok(Within::Busy),
        Some(Conditional::Refused(Some(found))) => found,
    };
    match fence(Some(&found), &claim.owner, claim.now_ms) {
        Fence::Held | Fence::OwnCompletion => return Ok(Within::Held(found)),
        // Expired meanwhile: the next attempt claims it.
        Fence::Free => return Ok(Within::Busy),
        // This transaction's own claim: its token is new to the store.
        Fence::OwnClaim => return Ok(Within::Ours),
        Fence::Lapsed => {}
    }
    super::sealing::not_a_sealed_completion(&found)?;
    let takeover = takeover_of(claim, &found);
    match busy_if_conflict(transaction.take_over(&takeover, &found.owner).await)? {
        Some(Conditional::Applied) => {
            warn!(record = %takeover.id, outcome = "takeover", attempt = takeover.attempt,
                "took over a claim whose lease passed: the previous attempt may have acted");
            *claim = takeover;
            Ok(Within::Ours)
        }
        Some(Conditional::Refused(Some(record)))
            if fence(Some(&record), &takeover.owner, claim.now_ms) == Fence::Held =>
        {
            Ok(Within::Held(record))
        }
        None | Some(Conditional::Refused(_)) => Ok(Within::Busy),
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
fn applied<E>(completed: Conditional) -> Result<(), Finish<Error<E>>> {
    match completed {
        Conditional::Applied => Ok(()),
        Conditional::Refused(_) => Err(finish_failed(StoreError::new(
            StoreErrorKind::Other,
            "the record claimed in this transaction refused its completion",
        ))),
    }
}
