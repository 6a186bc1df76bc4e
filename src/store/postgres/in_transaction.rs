//! The handler inside the PostgreSQL transaction: the claim, the handler's
//! reads, locks and writes, and the completed record in one `BEGIN` …
//! `COMMIT` ([`Engine::run_in_transaction`]).

use super::{
    codec::{decode, decode_optional, int8, ClaimValues},
    errors, PgValue, PgWrite, PostgresStore,
};
use crate::{
    engine::{fence, takeover_of, Codec, Fence, Json},
    store::{Claim, Record, RecordId},
    Attempt, ClaimHandle, Engine, Error, Outcome, OutcomeKind, StoreError, StoreErrorKind,
    Takeover,
};
use deadpool_postgres::Object;
use futures_util::FutureExt;
use serde::{de::DeserializeOwned, Serialize};
use std::{
    fmt,
    future::Future,
    ops::Deref,
    panic::AssertUnwindSafe,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use tokio_postgres::types::{ToSql, Type};
use tracing::{debug, warn};

/// How long a duplicate's claim waits, by default, for the transaction
/// that holds its key to end (PostgreSQL's `lock_timeout` on the claim).
pub const DEFAULT_CLAIM_WAIT: Duration = Duration::from_millis(100);

/// How long, by default, the whole transaction may take, from `BEGIN` to
/// `COMMIT`.
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(10);

/// The savepoint after the claim: [`PgTransaction::roll_back_writes`]
/// returns to it.
const HANDLER_SAVEPOINT: &str = "lambda_idempotency_handler";

/// The longest timeout PostgreSQL takes (`INT_MAX` milliseconds, about 24
/// days); the claim wait and the time limit are capped to it, and
/// the idle timeout a second later stays within it too.
const LONGEST_MS: u64 = i32::MAX as u64 - 1_000;

/// How long before the invocation's deadline the transaction ends, to
/// leave time to roll back and answer.
const DEADLINE_MARGIN_MS: u64 = 250;

fn bounded_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .clamp(1, LONGEST_MS)
}

/// The bounds of [`Engine::run_in_transaction`]: how long a concurrent
/// duplicate waits for the key, and how long the handler's transaction may
/// last.
///
/// ```
/// use lambda_idempotency::store::postgres::TransactionLimits;
/// use std::time::Duration;
///
/// let limits = TransactionLimits::new()
///     .claim_wait(Duration::from_millis(50))
///     .time_limit(Duration::from_secs(5));
/// assert_eq!(limits.time_limit_value(), Duration::from_secs(5));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionLimits {
    claim_wait: Duration,
    time_limit: Duration,
}

impl Default for TransactionLimits {
    fn default() -> Self {
        Self {
            claim_wait: DEFAULT_CLAIM_WAIT,
            time_limit: DEFAULT_TIME_LIMIT,
        }
    }
}

impl TransactionLimits {
    /// [`DEFAULT_CLAIM_WAIT`] and [`DEFAULT_TIME_LIMIT`].
    pub fn new() -> Self {
        Self::default()
    }

    /// How long a duplicate's claim waits on the transaction that holds
    /// its key (`SET LOCAL lock_timeout`; from 1 ms to about 24 days,
    /// PostgreSQL's longest). If that
    /// transaction commits within it, the duplicate gets its stored
    /// outcome (a replay); otherwise it is told the key is in progress
    /// ([`Error::InProgress`], a 409) at once.
    #[must_use]
    pub fn claim_wait(mut self, wait: Duration) -> Self {
        self.claim_wait = Duration::from_millis(bounded_ms(wait));
        self
    }

    /// How long the transaction may take from `BEGIN` to `COMMIT` (from 1
    /// ms to about 24 days, PostgreSQL's longest timeout). Past it the handler is stopped, everything is rolled back,
    /// and the caller gets [`Error::TimeLimitExceeded`], every time (a
    /// handler that answers once the limit has passed is rolled back too,
    /// whatever it answered: its statement may have been cancelled by the
    /// server's bound). The server enforces the limit too
    /// (`statement_timeout` on each statement, and
    /// `idle_in_transaction_session_timeout` a second later), so a
    /// statement still running at the limit ends there and releases its
    /// locks, and a process that stops answering (a Lambda frozen after
    /// its timeout) holds no lock for longer either. With an invocation deadline
    /// ([`Attempt::deadline`](crate::Attempt::deadline), the Lambda
    /// context's), the limit ends 250 ms before it at the latest.
    #[must_use]
    pub fn time_limit(mut self, limit: Duration) -> Self {
        self.time_limit = Duration::from_millis(bounded_ms(limit));
        self
    }

    /// The configured claim wait.
    pub fn claim_wait_value(&self) -> Duration {
        self.claim_wait
    }

    /// The configured time limit.
    pub fn time_limit_value(&self) -> Duration {
        self.time_limit
    }
}

/// The open transaction an in-transaction handler runs its SQL in: a
/// [`tokio_postgres::Client`] (it dereferences to one) on which `BEGIN`
/// has run and the key has been claimed. Every statement sent through it
/// is part of the transaction, and commits with the completed record, or
/// not at all. Cheap to clone.
///
/// Do not send `COMMIT`, `ROLLBACK` or `SET SESSION` through it: the
/// engine ends the transaction. Prefer `query_typed`/`execute_typed`
/// (unnamed statements, one round trip); `query` and `prepare` work too,
/// since their prepared statements live inside the transaction, which
/// PgBouncer in transaction mode and RDS Proxy keep on one server
/// connection.
#[derive(Clone)]
pub struct PgTransaction {
    held: Arc<Held>,
    takeover: Option<Takeover>,
}

/// The connection while its transaction is open. Dropped with the
/// transaction still open (the handler's future was dropped, a panic
/// unwound through it), the connection is closed rather than returned to
/// the pool, so the server rolls the transaction back.
struct Held {
    // Always `Some` until `Drop` takes it.
    object: Option<Object>,
    open: AtomicBool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.open.load(Ordering::SeqCst) {
            if let Some(object) = self.object.take() {
                drop(Object::take(object));
            }
        }
    }
}

impl Deref for PgTransaction {
    type Target = tokio_postgres::Client;

    fn deref(&self) -> &Self::Target {
        match &self.held.object {
            Some(object) => object,
            // `object` is only taken by `Drop`, when nothing can see it.
            None => unreachable!("the transaction's connection is only taken when it is dropped"),
        }
    }
}

impl fmt::Debug for PgTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTransaction")
            .field("open", &self.held.open.load(Ordering::SeqCst))
            .field("takeover", &self.takeover)
            .finish_non_exhaustive()
    }
}

impl PgTransaction {
    /// The transaction the operation running on this task runs in, when it
    /// runs inside one: for handlers that are not handed it (an event
    /// consumer's, under
    /// `IdempotentEventLayer::in_transaction`). `None` elsewhere, and in
    /// tasks the operation spawns (pass it to them).
    pub fn current() -> Option<PgTransaction> {
        crate::ClaimHandle::current().and_then(|claim| claim.transaction().cloned())
    }

    /// Whether this attempt took over a claim whose lease had passed (made
    /// by the deferred form, [`Engine::run`] and its kin): the previous
    /// attempt may have acted outside the database. A claim made in a
    /// transaction never survives its transaction, so it is never taken
    /// over.
    pub fn takeover(&self) -> Option<Takeover> {
        self.takeover
    }

    /// Undoes every statement the handler sent so far, and keeps the claim:
    /// for a business-rule refusal (a balance too low, a constraint that
    /// failed) whose answer should be stored as the request's outcome
    /// while none of its writes is. After a failed statement PostgreSQL
    /// refuses every other until this runs (`25P02`), so call it before
    /// returning the refusal, then return the refusal as the handler's
    /// value (an `Ok`). It can be called more than once.
    pub async fn roll_back_writes(&self) -> Result<(), StoreError> {
        self.batch_execute(&format!("ROLLBACK TO SAVEPOINT {HANDLER_SAVEPOINT}"))
            .await
            .map_err(|e| errors::from_pg("ROLLBACK TO SAVEPOINT", e))
    }

    async fn end(&self, statement: &'static str) -> Result<(), StoreError> {
        self.batch_execute(statement)
            .await
            .map_err(|e| errors::from_pg(statement, e))?;
        self.held.open.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Rolls back, best effort: a connection whose rollback failed is
    /// closed when the last handle drops, which rolls back too.
    async fn roll_back(&self) {
        if let Err(error) = self.end("ROLLBACK").await {
            warn!(%error, "ROLLBACK failed; the connection is closed instead");
        }
    }

    async fn row(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
        Ok(self.query_typed(sql, params).await?.into_iter().next())
    }
}

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

impl PostgresStore {
    /// Takes a connection and begins a transaction bounded by `limits`.
    async fn begin(&self, limits: &TransactionLimits) -> Result<PgTransaction, StoreError> {
        let object = self.client().await?;
        let time_limit_ms = bounded_ms(limits.time_limit);
        // Numbers, formatted into the SQL: SET takes no parameters. All of
        // it LOCAL, so nothing outlives the transaction (PgBouncer in
        // transaction mode hands the server connection on at COMMIT).
        let begin = format!(
            "BEGIN; SET LOCAL lock_timeout = {claim_wait}; \
             SET LOCAL statement_timeout = {statement}; \
             SET LOCAL idle_in_transaction_session_timeout = {idle}",
            claim_wait = bounded_ms(limits.claim_wait),
            statement = time_limit_ms,
            idle = time_limit_ms + 1_000,
        );
        let transaction = PgTransaction {
            held: Arc::new(Held {
                object: Some(object),
                open: AtomicBool::new(true),
            }),
            takeover: None,
        };
        transaction
            .batch_execute(&begin)
            .await
            .map_err(|e| errors::from_pg("BEGIN", e))?;
        Ok(transaction)
    }

    /// Claims `claim`'s key inside the transaction: a fresh claim, or the
    /// takeover of a lapsed one (then `claim` becomes the takeover).
    async fn claim_in(
        &self,
        transaction: &PgTransaction,
        claim: &mut Claim,
    ) -> Result<Claimed, StoreError> {
        let values = ClaimValues::of(claim)?;
        let answer = transaction
            .row(&self.inner.sql.claim, &values.claim())
            .await;
        let found = match answered(answer, "INSERT (claim in transaction)")? {
            Answer::Busy => return Ok(Claimed::Busy),
            Answer::Applied => return Ok(Claimed::Ours),
            Answer::Refused(Some(record)) => record,
            // The statement's snapshot predates the transaction that
            // committed the record it waited for: read it with a new one.
            Answer::Refused(None) => match self.get_in(transaction, &claim.id).await? {
                Some(record) => record,
                None => return Ok(Claimed::Busy),
            },
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
        let values = ClaimValues::of(&takeover)?;
        let lapsed = found.owner.as_str();
        let answer = transaction
            .row(&self.inner.sql.take_over, &values.take_over(&lapsed))
            .await;
        match answered(answer, "UPDATE (take over in transaction)")? {
            Answer::Applied => {
                warn!(record = %takeover.id, outcome = "takeover", attempt = takeover.attempt,
                    "took over a claim whose lease passed: the previous attempt may have acted");
                *claim = takeover;
                Ok(Claimed::Ours)
            }
            Answer::Refused(Some(record))
                if fence(Some(&record), &takeover.owner, claim.now_ms) == Fence::Held =>
            {
                Ok(Claimed::Held(record))
            }
            Answer::Busy | Answer::Refused(_) => Ok(Claimed::Busy),
        }
    }

    async fn get_in(
        &self,
        transaction: &PgTransaction,
        id: &RecordId,
    ) -> Result<Option<Record>, StoreError> {
        match transaction
            .row(&self.inner.sql.get, &[(&id.as_str(), Type::TEXT)])
            .await
        {
            Ok(row) => row.as_ref().map(decode).transpose(),
            Err(error) => Err(errors::from_pg("SELECT (in transaction)", error)),
        }
    }

    /// Completes the claimed record with `response`, fenced on its owner.
    async fn complete_in(
        &self,
        transaction: &PgTransaction,
        claim: &Claim,
        response: &[u8],
        now_ms: u64,
        expiration_s: u64,
    ) -> Result<bool, StoreError> {
        let (expiration, now) = (int8(expiration_s)?, int8(now_ms)?);
        let answer = transaction
            .row(
                &self.inner.sql.complete,
                &[
                    (&claim.id.as_str(), Type::TEXT),
                    (&claim.owner.as_str(), Type::TEXT),
                    (&response, Type::BYTEA),
                    (&expiration, Type::INT8),
                    (&now, Type::INT8),
                ],
            )
            .await;
        match answer {
            // A statement of the handler's failed and nothing rolled it
            // back: the transaction accepts no other statement.
            Err(error) if error.code().map(|c| c.code()) == Some("25P02") => Err(StoreError::new(
                StoreErrorKind::WriteRejected,
                "a statement of the operation failed and the operation returned a value anyway; \
                     nothing was committed (after a refusal, call PgTransaction::roll_back_writes \
                     before returning it)",
            )
            .with_source(error)),
            answer => Ok(matches!(
                answered(answer, "UPDATE (complete in transaction)")?,
                Answer::Applied
            )),
        }
    }
}

/// An answered statement's result.
enum Answer {
    Applied,
    Refused(Option<Record>),
    /// `55P03` (the claim wait passed), `40001` or `40P01`: another
    /// transaction holds the key, or won a race for it.
    Busy,
}

fn answered(
    row: Result<Option<tokio_postgres::Row>, tokio_postgres::Error>,
    operation: &'static str,
) -> Result<Answer, StoreError> {
    let row = match row {
        Ok(Some(row)) => row,
        Ok(None) => {
            return Err(StoreError::new(
                StoreErrorKind::Other,
                format!("{operation}: no answer row"),
            ))
        }
        Err(error) => {
            let error = errors::from_pg(operation, error);
            return match error.kind() {
                StoreErrorKind::Conflict => Ok(Answer::Busy),
                _ => Err(error),
            };
        }
    };
    let applied: bool = row
        .try_get("applied")
        .map_err(|e| StoreError::corrupt("the answer has no `applied`").with_source(e))?;
    if applied {
        return Ok(Answer::Applied);
    }
    Ok(Answer::Refused(decode_optional(&row)?))
}

impl Engine<PostgresStore> {
    /// Runs `operation` inside one PostgreSQL transaction with its claim:
    /// `BEGIN`; claim the key; the operation's own reads, locks
    /// (`SELECT … FOR UPDATE`) and writes through the [`PgTransaction`] it
    /// is handed; its value stored in the completed record; `COMMIT`. The
    /// business effect and the record commit together or not at all, and
    /// the operation can check (a balance) before it writes.
    ///
    /// - A concurrent duplicate waits at most
    ///   [`claim_wait`](TransactionLimits::claim_wait) for the
    ///   transaction that holds the key: it then gets the committed outcome
    ///   as a replay, or [`Error::InProgress`] (a 409) at once. It never
    ///   runs.
    /// - A record already there keeps every meaning it has elsewhere: a
    ///   replay, [`Error::KeyReused`] for another payload, in progress for
    ///   a live claim of the deferred form ([`run`](Engine::run)), and the
    ///   takeover of a lapsed one ([`PgTransaction::takeover`]).
    /// - An operation error ([`Error::Operation`]), a panic, a dropped
    ///   future or a crash rolls everything back, the claim too: the key is
    ///   free, and the retry runs as a first attempt (it is not told of a
    ///   takeover, since nothing of the first attempt survived in the
    ///   database; effects outside it are not covered).
    /// - A business refusal whose answer should be stored: call
    ///   [`PgTransaction::roll_back_writes`] and return the answer as the
    ///   value ([`RefusalRules`](super::RefusalRules) names the SQLSTATEs
    ///   and constraints that are refusals).
    /// - Past [`time_limit`](TransactionLimits::time_limit), the operation
    ///   is stopped, everything is rolled back, and the caller gets
    ///   [`Error::TimeLimitExceeded`].
    /// - The store unreachable: [`Error::Store`], and nothing runs (never
    ///   fail-open: the operation needs the database anyway).
    ///
    /// ```no_run
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
    /// ```
    pub async fn run_in_transaction<T, E, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        limits: TransactionLimits,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        T: Serialize + DeserializeOwned,
        F: FnOnce(PgTransaction) -> Fut,
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
        F: FnOnce(PgTransaction) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let no_refusals = |_: &crate::WriteRefusal| None;
        self.transaction_run(
            attempt,
            limits,
            codec,
            no_refusals,
            |_, transaction| async move {
                operation(transaction)
                    .await
                    .map(|value| (value, Vec::new()))
            },
        )
        .await
    }

    /// [`transaction_run`](Engine::transaction_run) for an adapter that is
    /// generic over its store (the HTTP layer, the consumers): its
    /// operation returns its store's writes, which are `PgWrite`s, since
    /// this engine is PostgreSQL's.
    #[cfg_attr(not(any(feature = "http", feature = "consumers")), allow(dead_code))]
    pub(crate) async fn transaction_run_for_adapter<T, E, C, R, W, F, Fut>(
        &self,
        attempt: &Attempt<'_>,
        limits: TransactionLimits,
        codec: &C,
        refusal: R,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        C: Codec<T>,
        R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>>,
        W: 'static,
        F: FnOnce(ClaimHandle) -> Fut,
        Fut: Future<Output = Result<(T, Vec<W>), E>>,
    {
        self.transaction_run(attempt, limits, codec, refusal, |claim, _| async move {
            let (value, writes) = operation(claim).await?;
            let writes: Box<dyn std::any::Any> = Box::new(writes);
            let writes = writes
                .downcast::<Vec<PgWrite>>()
                .map(|writes| *writes)
                .unwrap_or_default();
            Ok((value, writes))
        })
        .await
    }

    /// The in-transaction protocol, for the adapters: the operation gets
    /// its [`ClaimHandle`] (which holds the transaction too) and the
    /// transaction, and returns its value and [`PgWrite`]s to run in the
    /// transaction before the completion.
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
        R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>>,
        F: FnOnce(ClaimHandle, PgTransaction) -> Fut,
        Fut: Future<Output = Result<(T, Vec<PgWrite>), E>>,
    {
        let started = Instant::now();
        let limits = self.within_deadline(attempt, limits);
        if self.is_disabled() {
            return self
                .run_disabled_in_transaction(started, &limits, operation)
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
        let mut transaction = match self
            .claim_in_transaction(&mut claim, &limits, attempt, codec)
            .await
        {
            Ok(transaction) => transaction,
            Err(answer) => return answer,
        };
        transaction.takeover = (claim.attempt > 1).then_some(Takeover {
            attempt: claim.attempt,
            first_started_at_ms: claim.first_started_ms,
        });
        let handle = ClaimHandle::in_transaction(transaction.takeover, transaction.clone());
        // Until this returns: its duplicates in this process wait on it.
        let _running = self.local_runs().start(&claim, &handle);
        let run = handle.clone().scope(operation(handle, transaction.clone()));
        let (value, writes) = match self.bounded(&transaction, started, &limits, run).await {
            Ok(ran) => ran,
            Err(error) => {
                debug!(record = %claim.id, outcome = error.kind().as_str(), in_transaction = true,
                    "idempotency: the transaction was rolled back; the key is free");
                return Err(error);
            }
        };
        let value = write_or_refuse(&transaction, value, &writes, refusal).await?;
        self.complete_in_transaction(&transaction, &claim, codec, value, started, &limits)
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
                limits.time_limit(limits.time_limit.min(left))
            }
            None => limits,
        }
    }

    /// Idempotency is off: the operation still runs in its transaction,
    /// with its writes, and nothing is recorded.
    async fn run_disabled_in_transaction<T, E, F, Fut>(
        &self,
        started: Instant,
        limits: &TransactionLimits,
        operation: F,
    ) -> Result<Outcome<T>, Error<E>>
    where
        F: FnOnce(ClaimHandle, PgTransaction) -> Fut,
        Fut: Future<Output = Result<(T, Vec<PgWrite>), E>>,
    {
        let transaction = self.store().begin(limits).await.map_err(Error::Store)?;
        let handle = ClaimHandle::in_transaction(None, transaction.clone());
        let run = handle.clone().scope(operation(handle, transaction.clone()));
        let (value, writes) = self.bounded(&transaction, started, limits, run).await?;
        if let Err(error) = run_writes(&transaction, &writes).await {
            transaction.roll_back().await;
            return Err(Error::Store(error));
        }
        transaction.end("COMMIT").await.map_err(Error::Store)?;
        Ok(Outcome::new(value, OutcomeKind::Disabled))
    }

    /// Begins the transaction and claims the key in it; a key held by
    /// another (a replay, a mismatch, in progress) or a failure answers the
    /// attempt, the transaction rolled back.
    async fn claim_in_transaction<T, E, C: Codec<T>>(
        &self,
        claim: &mut Claim,
        limits: &TransactionLimits,
        attempt: &Attempt<'_>,
        codec: &C,
    ) -> Result<PgTransaction, Result<Outcome<T>, Error<E>>> {
        let store = self.store();
        let transaction = store
            .begin(limits)
            .await
            .map_err(|e| Err(Error::Store(e)))?;
        let claimed = store.claim_in(&transaction, claim).await;
        // The claim waited as long as a duplicate may; the operation's own
        // locks wait as the server's setting says (within the time limit).
        let claimed = match claimed {
            Ok(Claimed::Ours) => transaction
                .batch_execute(&format!(
                    "SET LOCAL lock_timeout TO DEFAULT; SAVEPOINT {HANDLER_SAVEPOINT}"
                ))
                .await
                .map(|()| Claimed::Ours)
                .map_err(|e| errors::from_pg("SAVEPOINT", e)),
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

    /// Completes the record in the transaction, and commits, within what is
    /// left of the time limit; on failure nothing is committed and the key
    /// is free.
    async fn complete_in_transaction<T, E, C: Codec<T>>(
        &self,
        transaction: &PgTransaction,
        claim: &Claim,
        codec: &C,
        value: T,
        started: Instant,
        limits: &TransactionLimits,
    ) -> Result<Outcome<T>, Error<E>> {
        let response = match codec.encode(&value) {
            Ok(response) => response,
            Err(error) => {
                transaction.roll_back().await;
                return Err(Error::Store(crate::engine::unserialisable(error)));
            }
        };
        let now_ms = self.now_ms();
        let expiration_s = self.expiration_s(now_ms);
        let finished = async {
            if !self
                .store()
                .complete_in(transaction, claim, &response, now_ms, expiration_s)
                .await?
            {
                // The row is locked by this transaction since the claim:
                // nothing else can have changed it.
                return Err(StoreError::new(
                    StoreErrorKind::Other,
                    "the record claimed in this transaction refused its completion",
                ));
            }
            transaction.end("COMMIT").await
        };
        let finished = match tokio::time::timeout(remaining(started, limits), finished).await {
            Ok(finished) => finished.map_err(Error::Store),
            Err(_) => Err(Error::TimeLimitExceeded {
                limit: limits.time_limit,
            }),
        };
        if let Err(error) = finished {
            if let Error::Store(error) = &error {
                warn!(record = %claim.id, %error, "the completion in transaction failed");
            }
            // Past the time limit, a statement may still run: the
            // connection is closed instead of waited for.
            if !matches!(error, Error::TimeLimitExceeded { .. }) {
                transaction.roll_back().await;
            }
            warn!(record = %claim.id, outcome = error.kind().as_str(),
                "the transaction could not complete its record; nothing was committed, the key is free");
            return Err(error);
        }
        self.remember(
            &claim.id,
            &claim.fingerprint,
            &response,
            expiration_s,
            Some(now_ms),
            claim.attempt,
        );
        self.local_runs()
            .completed(claim, &response, expiration_s, now_ms);
        debug!(record = %claim.id, outcome = "fresh", in_transaction = true, "idempotency");
        Ok(Outcome::new(value, OutcomeKind::Fresh))
    }

    /// Runs the operation within what is left of the time limit; on its
    /// error, its panic or the limit, rolls the transaction back.
    async fn bounded<T, E, Fut>(
        &self,
        transaction: &PgTransaction,
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

/// The operation `ran` (or `answered`) past its transaction's time limit:
/// logged, and the error the caller gets.
fn time_limit_exceeded<E>(limits: &TransactionLimits, how: &str) -> Error<E> {
    warn!(
        limit_ms = limits.time_limit.as_millis() as u64,
        outcome = "time_limit_exceeded",
        "the operation {how} past its transaction's time limit; rolled back"
    );
    Error::TimeLimitExceeded {
        limit: limits.time_limit,
    }
}

/// Runs the operation's [`PgWrite`]s in the transaction, in order.
async fn run_writes(transaction: &PgTransaction, writes: &[PgWrite]) -> Result<(), StoreError> {
    for (index, write) in writes.iter().enumerate() {
        let params: Vec<_> = write.params.iter().map(PgValue::typed).collect();
        transaction
            .execute_typed(&write.sql, &params)
            .await
            .map_err(|error| errors::from_write(index, error))?;
    }
    Ok(())
}

/// Runs the operation's [`PgWrite`]s; one the application names a refusal
/// is answered as it says, without any of its writes (the value it gives
/// is what is stored). Any other failure rolls the transaction back.
async fn write_or_refuse<T, E, R>(
    transaction: &PgTransaction,
    value: T,
    writes: &[PgWrite],
    refusal: R,
) -> Result<T, Error<E>>
where
    R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>>,
{
    let error = match run_writes(transaction, writes).await {
        Ok(()) => return Ok(value),
        Err(error) => error,
    };
    let answer = error.write_refusal().and_then(refusal);
    let undone = match &answer {
        Some(Ok(_)) => transaction.roll_back_writes().await,
        _ => Ok(()),
    };
    match (answer, undone) {
        (Some(Ok(answer)), Ok(())) => Ok(answer),
        (Some(Err(answer)), _) => {
            transaction.roll_back().await;
            Err(Error::Operation(answer))
        }
        (_, Err(undo)) => {
            transaction.roll_back().await;
            Err(Error::Store(undo))
        }
        (None, _) => {
            transaction.roll_back().await;
            Err(Error::Store(error))
        }
    }
}

fn remaining(started: Instant, limits: &TransactionLimits) -> Duration {
    limits.time_limit.saturating_sub(started.elapsed())
}

impl<St: crate::store::Store> Engine<St> {
    /// This engine as PostgreSQL's, when it is one: the adapters'
    /// `in_transaction` settings exist only on such engines.
    #[cfg_attr(not(any(feature = "http", feature = "consumers")), allow(dead_code))]
    pub(crate) fn as_postgres(&self) -> Option<&Engine<PostgresStore>> {
        (self as &dyn std::any::Any).downcast_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_stay_within_what_postgresql_takes() {
        let limits = TransactionLimits::new()
            .claim_wait(Duration::ZERO)
            .time_limit(Duration::MAX);
        assert_eq!(limits.claim_wait_value(), Duration::from_millis(1));
        assert_eq!(limits.time_limit_value(), Duration::from_millis(LONGEST_MS));
        assert!(LONGEST_MS + 1_000 <= i32::MAX as u64);
        let defaults = TransactionLimits::default();
        assert_eq!(defaults.claim_wait_value(), DEFAULT_CLAIM_WAIT);
        assert_eq!(defaults.time_limit_value(), DEFAULT_TIME_LIMIT);
    }
}
