//! The sqlx store's transactions ([`Transactions`]): `BEGIN` with the
//! bounds set `LOCAL`, the claim and the completion inside it, and the
//! [`SqlxPgTransaction`] the operation runs its queries in. The statements
//! are the tokio-postgres store's; the engine drives both
//! ([`Engine::run_in_transaction`](crate::Engine::run_in_transaction)).

use super::{
    codec::{self, applied, decode, decode_optional},
    errors::{self, from_sqlx},
    query::{Query, Value},
    run_writes, SqlxPgWrite, SqlxPostgresStore,
};
use crate::{
    store::{
        pg,
        transaction::{self, TransactionFuture},
        Claim, Completion, Conditional, OpenTransaction, OwnerToken, Record, RecordId, Takeover,
        Transaction, TransactionLimits, TransactionalStore, Transactions,
    },
    StoreError, StoreErrorKind,
};
use sqlx::{pool::PoolConnection, postgres::PgRow, Executor, PgConnection, Postgres};
use std::{
    fmt,
    future::Future,
    ops::{Deref, DerefMut},
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
};
use tokio::sync::{Mutex, MutexGuard};
use tracing::warn;

/// The open transaction an in-transaction handler runs its queries in: a
/// sqlx connection on which `BEGIN` has run and the key has been claimed.
/// [`lock`](SqlxPgTransaction::lock) lends the connection (a
/// [`PgConnection`], an [`Executor`](sqlx::Executor)): every query sent
/// through it is part of the transaction, and commits with the completed
/// record, or not at all. Cheap to clone.
///
/// ```no_run
/// # use lambda_idempotency::store::sqlx::postgres::SqlxPgTransaction;
/// # async fn pay(tx: SqlxPgTransaction) -> Result<i64, sqlx::Error> {
/// let balance: i64 = sqlx::query_scalar("SELECT balance FROM accounts WHERE id = $1 FOR UPDATE")
///     .bind("acct_1")
///     .persistent(false) // through PgBouncer before 1.21 (see the module docs)
///     .fetch_one(&mut *tx.lock().await)
///     .await?;
/// # Ok(balance) }
/// ```
///
/// Do not send `COMMIT`, `ROLLBACK` or `SET SESSION` through it, nor
/// `begin` a sqlx transaction on it: the engine ends the transaction.
#[derive(Clone)]
pub struct SqlxPgTransaction {
    held: Arc<Held>,
}

/// The connection while its transaction is open. Dropped with the
/// transaction still open (the handler's future was dropped, a panic
/// unwound through it, a commit failed), the connection is detached from
/// the pool and closed rather than returned to it, so the server rolls the
/// transaction back and no other request ever runs inside it.
struct Held {
    // Always `Some` until `Drop` takes it.
    connection: Mutex<Option<PoolConnection<Postgres>>>,
    open: AtomicBool,
    /// The claim this transaction holds, once it does: a takeover's
    /// attempt.
    takeover: OnceLock<Option<Takeover>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if *self.open.get_mut() {
            if let Some(connection) = self.connection.get_mut().take() {
                // Out of the pool's hands; dropping the connection closes
                // its socket, and the server rolls back.
                drop(connection.detach());
            }
        }
    }
}

/// The transaction's connection, lent by [`SqlxPgTransaction::lock`]: it
/// dereferences to a [`PgConnection`], so `&mut *guard` is an
/// [`Executor`](sqlx::Executor) and what functions taking
/// `&mut PgConnection` take. Other users of the transaction (the engine's
/// completion among them) wait until it is dropped.
pub struct SqlxPgConnection<'a> {
    guard: MutexGuard<'a, Option<PoolConnection<Postgres>>>,
}

impl Deref for SqlxPgConnection<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        match self.guard.as_ref() {
            Some(connection) => connection,
            // Only `Drop` takes it, when nothing can lock it any more.
            None => unreachable!("the transaction's connection is only taken when it is dropped"),
        }
    }
}

impl DerefMut for SqlxPgConnection<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        match self.guard.as_mut() {
            Some(connection) => connection,
            None => unreachable!("the transaction's connection is only taken when it is dropped"),
        }
    }
}

impl fmt::Debug for SqlxPgConnection<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxPgConnection").finish_non_exhaustive()
    }
}

impl fmt::Debug for SqlxPgTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxPgTransaction")
            .field("open", &self.held.open.load(Ordering::SeqCst))
            .field("takeover", &self.takeover())
            .finish_non_exhaustive()
    }
}

impl SqlxPgTransaction {
    /// The transaction's connection, for the handler's queries:
    /// `sqlx::query(…).execute(&mut *tx.lock().await)`. Waits while another
    /// clone holds it; hold it no longer than the queries need (the
    /// completion waits for it too, and
    /// [`roll_back_writes`](SqlxPgTransaction::roll_back_writes) refuses to
    /// run while it is lent).
    pub async fn lock(&self) -> SqlxPgConnection<'_> {
        SqlxPgConnection {
            guard: self.held.connection.lock().await,
        }
    }

    /// The transaction the operation running on this task runs in, when it
    /// runs inside one: for handlers that are not handed it (an event
    /// consumer's, under `IdempotentEventLayer::in_transaction`). `None`
    /// elsewhere, and in tasks the operation spawns (pass it to them).
    pub fn current() -> Option<SqlxPgTransaction> {
        transaction::current()
    }

    /// Whether this attempt took over a claim whose lease had passed (made
    /// by the deferred form, [`Engine::run`](crate::Engine::run) and its
    /// kin): the previous attempt may have acted outside the database. A
    /// claim made in a transaction never survives its transaction, so it
    /// is never taken over.
    pub fn takeover(&self) -> Option<Takeover> {
        self.held.takeover.get().copied().flatten()
    }

    /// Undoes every query the handler sent so far, and keeps the claim:
    /// for a business-rule refusal (a balance too low, a constraint that
    /// failed) whose answer should be stored as the request's outcome
    /// while none of its writes is. After a failed statement PostgreSQL
    /// refuses every other until this runs (`25P02`), so call it before
    /// returning the refusal, then return the refusal as the handler's
    /// value (an `Ok`). It can be called more than once.
    ///
    /// Drop the guard [`lock`](SqlxPgTransaction::lock) gave first: while
    /// the connection is lent, this is an error
    /// ([`Misconfigured`](StoreErrorKind::Misconfigured)) rather than a
    /// wait that would last until the time limit (the guard's holder is
    /// usually the caller itself).
    pub async fn roll_back_writes(&self) -> Result<(), StoreError> {
        let Ok(guard) = self.held.connection.try_lock() else {
            return Err(StoreError::new(
                StoreErrorKind::Misconfigured,
                "SqlxPgTransaction::roll_back_writes was called while the transaction's \
                 connection is lent (a guard from SqlxPgTransaction::lock is alive): drop it \
                 first",
            ));
        };
        let mut connection = SqlxPgConnection { guard };
        Executor::execute(
            &mut *connection,
            sqlx::raw_sql(&pg::roll_back_writes_statement()),
        )
        .await
        .map_err(|e| from_sqlx("ROLLBACK TO SAVEPOINT", e))?;
        Ok(())
    }

    /// Runs statements without parameters (sqlx's simple query: one
    /// exchange, several statements).
    async fn simple(&self, sql: &str, operation: &'static str) -> Result<(), StoreError> {
        // Executor's own methods return a boxed future: sqlx's `async fn`
        // forms trip rustc's higher-ranked lifetime check inside the
        // `Send` futures the engine boxes.
        let mut connection = self.lock().await;
        Executor::execute(&mut *connection, sqlx::raw_sql(sql))
            .await
            .map_err(|e| from_sqlx(operation, e))?;
        Ok(())
    }

    async fn end(&self, statement: &'static str) -> Result<(), StoreError> {
        self.simple(statement, statement).await?;
        self.held.open.store(false, Ordering::SeqCst);
        Ok(())
    }

    async fn row(&self, query: Query<'_>) -> Result<Option<PgRow>, sqlx::Error> {
        let mut connection = self.lock().await;
        query.fetch_optional(&mut *connection).await
    }
}

/// A transaction of the store's: the connection and the statements it
/// runs.
struct Open {
    store: SqlxPostgresStore,
    transaction: SqlxPgTransaction,
}

impl SqlxPostgresStore {
    /// Takes a connection and begins a transaction bounded by `limits`.
    async fn begin(&self, limits: &TransactionLimits) -> Result<SqlxPgTransaction, StoreError> {
        let connection = self
            .inner
            .pool
            .acquire()
            .await
            .map_err(|e| from_sqlx("acquire a connection", e))?;
        let transaction = SqlxPgTransaction {
            held: Arc::new(Held {
                connection: Mutex::new(Some(connection)),
                open: AtomicBool::new(true),
                takeover: OnceLock::new(),
            }),
        };
        transaction
            .simple(&pg::begin_bounded(limits), "BEGIN")
            .await?;
        Ok(transaction)
    }
}

impl Open {
    fn prepared(&self) -> bool {
        self.store.inner.prepared
    }

    /// A statement of the store's, as the store sends them (a simple
    /// query, or a prepared one).
    fn query<'q>(&self, sql: &'q str, values: &[Value<'_>]) -> Result<Query<'q>, StoreError> {
        self.store.query(sql, values)
    }

    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        let get = self.query(&self.store.inner.sql.get, &[Value::Text(id.as_str())])?;
        match self.transaction.row(get).await {
            Ok(row) => row.as_ref().map(decode).transpose(),
            Err(error) => Err(from_sqlx("SELECT (in transaction)", error)),
        }
    }

    /// A claim's or a takeover's answer: applied, or refused with the
    /// committed record (read with a new snapshot when the statement's
    /// predates the transaction that committed the record it waited for).
    async fn conditional(
        &self,
        answer: Result<Option<PgRow>, sqlx::Error>,
        operation: &'static str,
        id: &RecordId,
    ) -> Result<Conditional, StoreError> {
        match answered(answer, operation)? {
            Conditional::Refused(None) => Ok(Conditional::Refused(self.get(id).await?)),
            answer => Ok(answer),
        }
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        let claim_query = self.query(&self.store.inner.sql.claim, &codec::claim(claim)?)?;
        let answer = match self.store.inner.partitions {
            None => self.transaction.row(claim_query).await,
            // The record's lock, held until the transaction ends (a
            // duplicate waits on it as on the plain table's row), then the
            // claim: one message in the default mode. The claim's
            // partition is made first, since a failed statement would end
            // the transaction.
            Some(_) => {
                self.store.ensure_partition_of(claim.now_ms).await?;
                let lock = pg::partitioned::lock_record(&self.store.inner.table, claim.id.as_str());
                let mut connection = self.transaction.lock().await;
                claim_query
                    .fetch_all_after(&lock, &mut connection)
                    .await
                    .map(|rows| rows.into_iter().next())
            }
        };
        self.conditional(answer, "INSERT (claim in transaction)", &claim.id)
            .await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        let take_over = self.query(
            &self.store.inner.sql.take_over,
            &codec::take_over(claim, lapsed)?,
        )?;
        let answer = self.transaction.row(take_over).await;
        let taken = self
            .conditional(answer, "UPDATE (take over in transaction)", &claim.id)
            .await?;
        if taken == Conditional::Applied {
            let _ = self.transaction.held.takeover.set(claim.takeover());
        }
        Ok(taken)
    }

    async fn write(&self, writes: Vec<SqlxPgWrite>) -> Result<(), StoreError> {
        let mut connection = self.transaction.lock().await;
        run_writes(&mut connection, writes, self.prepared()).await
    }

    /// Runs the completion's [`SqlxPgWrite`]s, then completes the record,
    /// fenced on its owner.
    async fn complete(
        &self,
        completion: Completion<SqlxPgWrite>,
    ) -> Result<Conditional, StoreError> {
        let complete = self.query(
            &self.store.inner.sql.complete,
            &super::completion_values(&completion)?,
        )?;
        self.write(completion.writes).await?;
        let answer = self.transaction.row(complete).await;
        match answer {
            // A statement of the operation failed and nothing rolled it
            // back: the transaction accepts no other statement.
            Err(error) if errors::sqlstate(&error) == Some(pg::FAILED_TRANSACTION) => {
                Err(StoreError::new(
                    StoreErrorKind::WriteRejected,
                    "a statement of the operation failed and the operation returned a value \
                     anyway; nothing was committed (after a refusal, call \
                     SqlxPgTransaction::roll_back_writes before returning it)",
                )
                .with_source(error))
            }
            answer => answered(answer, "UPDATE (complete in transaction)"),
        }
    }
}

impl OpenTransaction for SqlxPgTransaction {
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()> {
        Box::pin(SqlxPgTransaction::roll_back_writes(self))
    }
}

impl OpenTransaction for Open {
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()> {
        Box::pin(self.transaction.roll_back_writes())
    }
}

impl Transaction<SqlxPgWrite> for Open {
    fn claim<'a>(&'a self, claim: &'a Claim) -> TransactionFuture<'a, Conditional> {
        Box::pin(Open::claim(self, claim))
    }

    fn take_over<'a>(
        &'a self,
        claim: &'a Claim,
        lapsed: &'a OwnerToken,
    ) -> TransactionFuture<'a, Conditional> {
        Box::pin(Open::take_over(self, claim, lapsed))
    }

    fn hold(&self) -> TransactionFuture<'_, ()> {
        Box::pin(async move {
            self.transaction
                .simple(&pg::hold_statement(), "SAVEPOINT")
                .await
        })
    }

    fn write(&self, writes: Vec<SqlxPgWrite>) -> TransactionFuture<'_, ()> {
        Box::pin(Open::write(self, writes))
    }

    fn complete(&self, completion: Completion<SqlxPgWrite>) -> TransactionFuture<'_, Conditional> {
        Box::pin(Open::complete(self, completion))
    }

    fn commit(&self) -> TransactionFuture<'_, ()> {
        Box::pin(self.transaction.end("COMMIT"))
    }

    fn roll_back(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async {
            if let Err(error) = self.transaction.end("ROLLBACK").await {
                warn!(%error, "ROLLBACK failed; the connection is closed instead");
            }
        })
    }

    fn handed(&self) -> Arc<dyn OpenTransaction> {
        Arc::new(self.transaction.clone())
    }
}

impl Transactions<SqlxPgWrite> for SqlxPostgresStore {
    fn begin<'a>(
        &'a self,
        limits: &'a TransactionLimits,
    ) -> TransactionFuture<'a, Arc<dyn Transaction<SqlxPgWrite>>> {
        Box::pin(async move {
            let transaction = SqlxPostgresStore::begin(self, limits).await?;
            let open: Arc<dyn Transaction<SqlxPgWrite>> = Arc::new(Open {
                store: self.clone(),
                transaction,
            });
            Ok(open)
        })
    }

    fn expect_open_at_once(&self, transactions: usize) {
        let max = self.inner.pool.options().get_max_connections();
        pg::warn_if_pool_short(usize::try_from(max).unwrap_or(usize::MAX), transactions);
    }
}

impl TransactionalStore for SqlxPostgresStore {
    type Transaction = SqlxPgTransaction;
}

/// An answered statement's result: applied, or refused with the record the
/// statement saw (`None` when its snapshot saw none). `55P03` (the claim
/// wait passed), `40001` and `40P01` are
/// [`Conflict`](StoreErrorKind::Conflict)s: another transaction holds the
/// key, or won a race for it.
fn answered(
    row: Result<Option<PgRow>, sqlx::Error>,
    operation: &'static str,
) -> Result<Conditional, StoreError> {
    let row = match row {
        Ok(Some(row)) => row,
        Ok(None) => {
            return Err(StoreError::new(
                StoreErrorKind::Other,
                format!("{operation}: no answer row"),
            ))
        }
        Err(error) => return Err(from_sqlx(operation, error)),
    };
    if applied(&row)? {
        return Ok(Conditional::Applied);
    }
    Ok(Conditional::Refused(decode_optional(&row)?))
}
