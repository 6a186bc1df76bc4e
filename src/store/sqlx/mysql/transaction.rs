//! The MySQL store's transactions ([`Transactions`]): `START TRANSACTION`
//! on a connection of the pool's, the claim and the completion inside it,
//! and the [`SqlxMySqlTransaction`] the operation runs its SQL in. The
//! engine drives them
//! ([`Engine::run_in_transaction`](crate::Engine::run_in_transaction)).
//!
//! MySQL bounds a lock wait in whole seconds (`innodb_lock_wait_timeout`)
//! and has no bound on a statement but a `SELECT`'s: the claim's wait is
//! bounded here, to the millisecond, by giving up on the connection (which
//! ends its transaction); the server's own bounds are set to the next
//! whole second above the claim wait for the claim, above the time limit
//! for the operation's statements, and its `wait_timeout` a second past the
//! time limit, so that a client that stops answering (a Lambda frozen after
//! its timeout) holds no lock for long. The session's settings are put back
//! when the transaction ends.

use super::{
    answered, claim_on, complete_on, errors::from_sqlx, run_writes, take_over_on, SqlxMySqlStore,
    SqlxMySqlWrite,
};
use crate::{
    store::{
        transaction::{self, TransactionFuture},
        Claim, Completion, Conditional, OpenTransaction, OwnerToken, Takeover, Transaction,
        TransactionLimits, TransactionalStore, Transactions,
    },
    StoreError, StoreErrorKind,
};
use sqlx::{pool::PoolConnection, Executor, MySql, MySqlConnection};
use std::{
    fmt,
    future::Future,
    ops::{Deref, DerefMut},
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};
use tracing::warn;

/// The savepoint after the claim: [`SqlxMySqlTransaction::roll_back_writes`]
/// returns to it.
const HANDLER_SAVEPOINT: &str = "lambda_idempotency_handler";

/// The session's settings back at the server's: after the transaction.
const RESTORE: &str = "SET SESSION innodb_lock_wait_timeout = DEFAULT, wait_timeout = DEFAULT";

/// The open transaction an in-transaction handler runs its SQL in: the
/// connection on which it began and the key was claimed. Every statement
/// sent on it is part of the transaction, and commits with the completed
/// record, or not at all. Cheap to clone.
///
/// ```no_run
/// # use lambda_idempotency::store::sqlx::mysql::SqlxMySqlTransaction;
/// # async fn handler(tx: SqlxMySqlTransaction) -> Result<i64, sqlx::Error> {
/// let mut connection = tx.connection().await;
/// let balance: i64 = sqlx::query_scalar("SELECT balance FROM accounts WHERE id = ? FOR UPDATE")
///     .bind("acct_1")
///     .fetch_one(&mut *connection)
///     .await?;
/// # Ok(balance) }
/// ```
///
/// Do not send `COMMIT`, `ROLLBACK`, or a statement that commits by itself
/// (MySQL commits before and after DDL: `CREATE`, `ALTER`, `DROP`,
/// `TRUNCATE`): the engine ends the transaction.
#[derive(Clone)]
pub struct SqlxMySqlTransaction {
    held: Arc<Held>,
}

/// The connection while its transaction is open. Dropped with the
/// transaction still open (the handler's future was dropped, a panic
/// unwound through it, a claim that waited in vain), the connection is
/// closed rather than returned to the pool, so the server rolls the
/// transaction back.
struct Held {
    // Always `Some` until `Drop` takes it.
    connection: tokio::sync::Mutex<Option<PoolConnection<MySql>>>,
    open: AtomicBool,
    /// A statement was given up on mid-way: the connection's state is
    /// unknown, and it is closed rather than used again.
    broken: AtomicBool,
    takeover: OnceLock<Option<Takeover>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.open.load(Ordering::SeqCst) || self.broken.load(Ordering::SeqCst) {
            if let Some(connection) = self.connection.get_mut().take() {
                drop(connection.detach());
            }
        }
    }
}

/// The transaction's connection, for the handler's statements:
/// `&mut *connection` is an [`Executor`](sqlx::Executor), and a
/// `&mut MySqlConnection` for your own functions. Held, it keeps every
/// other statement of the transaction's waiting: drop it before the
/// handler returns.
pub struct TransactionConnection<'a>(tokio::sync::MutexGuard<'a, Option<PoolConnection<MySql>>>);

impl Deref for TransactionConnection<'_> {
    type Target = MySqlConnection;

    fn deref(&self) -> &MySqlConnection {
        match &*self.0 {
            Some(connection) => connection,
            // Only `Drop` takes it, when nothing can hold this guard.
            None => unreachable!("the transaction's connection is only taken when it is dropped"),
        }
    }
}

impl DerefMut for TransactionConnection<'_> {
    fn deref_mut(&mut self) -> &mut MySqlConnection {
        match &mut *self.0 {
            Some(connection) => connection,
            None => unreachable!("the transaction's connection is only taken when it is dropped"),
        }
    }
}

impl fmt::Debug for SqlxMySqlTransaction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxMySqlTransaction")
            .field("open", &self.held.open.load(Ordering::SeqCst))
            .field("takeover", &self.takeover())
            .finish_non_exhaustive()
    }
}

impl SqlxMySqlTransaction {
    /// The transaction the operation running on this task runs in, when it
    /// runs inside one: for handlers that are not handed it (an event
    /// consumer's). `None` elsewhere, and in tasks the operation spawns
    /// (pass it to them).
    pub fn current() -> Option<SqlxMySqlTransaction> {
        transaction::current()
    }

    /// The transaction's connection, to run statements in it.
    pub async fn connection(&self) -> TransactionConnection<'_> {
        TransactionConnection(self.held.connection.lock().await)
    }

    /// Whether this attempt took over a claim whose lease had passed (made
    /// outside a transaction, by [`Engine::run`](crate::Engine::run) and
    /// its kin): the previous attempt may have acted outside the database.
    pub fn takeover(&self) -> Option<Takeover> {
        self.held.takeover.get().copied().flatten()
    }

    /// Undoes every statement the handler sent so far, and keeps the claim:
    /// for a business-rule refusal whose answer should be stored as the
    /// request's outcome while none of its writes is. Call it before
    /// returning the refusal as the handler's value. It can be called more
    /// than once.
    pub async fn roll_back_writes(&self) -> Result<(), StoreError> {
        self.execute(&format!("ROLLBACK TO SAVEPOINT {HANDLER_SAVEPOINT}"))
            .await
    }

    async fn execute(&self, statement: &str) -> Result<(), StoreError> {
        let mut connection = self.connection().await;
        connection
            .execute(statement)
            .await
            .map(drop)
            .map_err(|e| from_sqlx("statement in transaction", e))
    }

    /// Ends the transaction with `statement` (`COMMIT`, `ROLLBACK`), and
    /// puts the session's settings back; a connection whose settings could
    /// not be put back is closed.
    async fn end(&self, statement: &'static str) -> Result<(), StoreError> {
        self.execute(statement).await?;
        self.held.open.store(false, Ordering::SeqCst);
        if let Err(error) = self.execute(RESTORE).await {
            warn!(%error, "the session's settings could not be put back; the connection is closed");
            self.held.broken.store(true, Ordering::SeqCst);
        }
        Ok(())
    }
}

/// Whole seconds, at least one, above `duration`: MySQL's lock waits.
fn seconds_above(duration: Duration) -> u64 {
    duration
        .as_millis()
        .div_ceil(1000)
        .try_into()
        .unwrap_or(u64::MAX)
        .clamp(1, 1_073_741_824)
}

/// A transaction of the store's: its connection, and its bounds.
struct Open {
    store: SqlxMySqlStore,
    transaction: SqlxMySqlTransaction,
    limits: TransactionLimits,
}

impl SqlxMySqlStore {
    /// Takes a connection and begins a transaction bounded by `limits`.
    async fn begin(&self, limits: &TransactionLimits) -> Result<SqlxMySqlTransaction, StoreError> {
        let connection = self.connection().await?;
        let transaction = SqlxMySqlTransaction {
            held: Arc::new(Held {
                connection: tokio::sync::Mutex::new(Some(connection)),
                open: AtomicBool::new(false),
                broken: AtomicBool::new(false),
                takeover: OnceLock::new(),
            }),
        };
        transaction
            .execute(&format!(
                "SET SESSION innodb_lock_wait_timeout = {}, wait_timeout = {}",
                seconds_above(limits.claim_wait_value()),
                seconds_above(limits.time_limit_value()) + 1,
            ))
            .await?;
        // From here, dropped unfinished, the connection is closed.
        transaction.held.open.store(true, Ordering::SeqCst);
        transaction.execute("START TRANSACTION").await?;
        Ok(transaction)
    }
}

impl Open {
    /// `statement` on the transaction's connection, given up on after the
    /// claim wait: a claim that waits on another transaction's lock past
    /// it is a conflict, and its connection is closed (the server then
    /// rolls its transaction back).
    async fn within_claim_wait<T, F>(&self, statement: F) -> Result<T, StoreError>
    where
        F: Future<Output = Result<T, StoreError>>,
    {
        match tokio::time::timeout(self.limits.claim_wait_value(), statement).await {
            Ok(answer) => answer,
            Err(_) => {
                self.transaction.held.broken.store(true, Ordering::SeqCst);
                Err(StoreError::new(
                    StoreErrorKind::Conflict,
                    "MySQL: another transaction holds the key past the claim wait",
                ))
            }
        }
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        let sql = &self.store.inner.sql;
        self.within_claim_wait(async {
            let mut connection = self.transaction.connection().await;
            let changed = claim_on(sql, &mut connection, claim).await?;
            answered(sql, &mut connection, changed, &claim.id).await
        })
        .await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        let sql = &self.store.inner.sql;
        let taken = self
            .within_claim_wait(async {
                let mut connection = self.transaction.connection().await;
                let changed = take_over_on(sql, &mut connection, claim, lapsed).await?;
                answered(sql, &mut connection, changed, &claim.id).await
            })
            .await?;
        if taken == Conditional::Applied {
            let _ = self.transaction.held.takeover.set(claim.takeover());
        }
        Ok(taken)
    }

    async fn hold(&self) -> Result<(), StoreError> {
        // The claim waited as long as a duplicate may; the operation's own
        // locks wait within its time limit.
        self.transaction
            .execute(&format!(
                "SET SESSION innodb_lock_wait_timeout = {}",
                seconds_above(self.limits.time_limit_value())
            ))
            .await?;
        self.transaction
            .execute(&format!("SAVEPOINT {HANDLER_SAVEPOINT}"))
            .await
    }

    async fn write(&self, writes: Vec<SqlxMySqlWrite>) -> Result<(), StoreError> {
        let mut connection = self.transaction.connection().await;
        run_writes(&mut connection, &writes).await
    }

    async fn complete(
        &self,
        completion: Completion<SqlxMySqlWrite>,
    ) -> Result<Conditional, StoreError> {
        let sql = &self.store.inner.sql;
        let mut connection = self.transaction.connection().await;
        run_writes(&mut connection, &completion.writes).await?;
        let changed = complete_on(sql, &mut connection, &completion).await?;
        answered(sql, &mut connection, changed, &completion.id).await
    }

    async fn roll_back(&self) {
        if self.transaction.held.broken.load(Ordering::SeqCst) {
            // Closed when the last handle drops.
            return;
        }
        if let Err(error) = self.transaction.end("ROLLBACK").await {
            warn!(%error, "ROLLBACK failed; the connection is closed instead");
            self.transaction.held.broken.store(true, Ordering::SeqCst);
        }
    }
}

impl OpenTransaction for SqlxMySqlTransaction {
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()> {
        Box::pin(SqlxMySqlTransaction::roll_back_writes(self))
    }
}

impl OpenTransaction for Open {
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()> {
        Box::pin(self.transaction.roll_back_writes())
    }
}

impl Transaction<SqlxMySqlWrite> for Open {
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
        Box::pin(Open::hold(self))
    }

    fn write(&self, writes: Vec<SqlxMySqlWrite>) -> TransactionFuture<'_, ()> {
        Box::pin(Open::write(self, writes))
    }

    fn complete(
        &self,
        completion: Completion<SqlxMySqlWrite>,
    ) -> TransactionFuture<'_, Conditional> {
        Box::pin(Open::complete(self, completion))
    }

    fn commit(&self) -> TransactionFuture<'_, ()> {
        Box::pin(self.transaction.end("COMMIT"))
    }

    fn roll_back(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(Open::roll_back(self))
    }

    fn handed(&self) -> Arc<dyn OpenTransaction> {
        Arc::new(self.transaction.clone())
    }
}

impl Transactions<SqlxMySqlWrite> for SqlxMySqlStore {
    fn begin<'a>(
        &'a self,
        limits: &'a TransactionLimits,
    ) -> TransactionFuture<'a, Arc<dyn Transaction<SqlxMySqlWrite>>> {
        Box::pin(async move {
            let transaction = SqlxMySqlStore::begin(self, limits).await?;
            let open: Arc<dyn Transaction<SqlxMySqlWrite>> = Arc::new(Open {
                store: self.clone(),
                transaction,
                limits: *limits,
            });
            Ok(open)
        })
    }

    fn expect_open_at_once(&self, transactions: usize) {
        let max = self.inner.pool.options().get_max_connections() as usize;
        if max < transactions {
            warn!(
                pool_max_connections = max,
                transactions_at_once = transactions,
                "the MySQL pool is smaller than the transactions the in-transaction form may hold \
                 open at once: handlers will wait for a connection, one after another; make the \
                 pool's max_connections at least {transactions}"
            );
        }
    }
}

impl TransactionalStore for SqlxMySqlStore {
    type Transaction = SqlxMySqlTransaction;
}

#[cfg(test)]
mod tests {
    use super::seconds_above;
    use std::time::Duration;

    #[test]
    fn mysql_waits_whole_seconds_above_the_bound() {
        assert_eq!(seconds_above(Duration::ZERO), 1);
        assert_eq!(seconds_above(Duration::from_millis(100)), 1);
        assert_eq!(seconds_above(Duration::from_millis(1000)), 1);
        assert_eq!(seconds_above(Duration::from_millis(1001)), 2);
        assert_eq!(seconds_above(Duration::MAX), 1_073_741_824);
    }
}
