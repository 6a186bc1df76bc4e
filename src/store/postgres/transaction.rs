//! The PostgreSQL store's transactions ([`Transactions`]): `BEGIN` with
//! the bounds set `LOCAL`, the claim and the completion inside it, and the
//! [`PgTransaction`] the operation runs its SQL in. The engine drives them
//! ([`Engine::run_in_transaction`](crate::Engine::run_in_transaction)).

use super::{
    codec::{decode, decode_optional, ClaimValues},
    errors, PgValue, PgWrite, PostgresStore,
};
use crate::{
    store::{
        pg::{self, int8},
        transaction::{self, TransactionFuture},
        Claim, Completion, Conditional, OpenTransaction, OwnerToken, Record, RecordId, Takeover,
        Transaction, TransactionLimits, TransactionalStore, Transactions,
    },
    StoreError, StoreErrorKind,
};
use deadpool_postgres::Object;
use std::{
    fmt,
    future::Future,
    ops::Deref,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, OnceLock,
    },
};
use tokio_postgres::types::{ToSql, Type};
use tracing::warn;

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
}

/// The connection while its transaction is open. Dropped with the
/// transaction still open (the handler's future was dropped, a panic
/// unwound through it), the connection is closed rather than returned to
/// the pool, so the server rolls the transaction back.
struct Held {
    // Always `Some` until `Drop` takes it.
    object: Option<Object>,
    open: AtomicBool,
    /// The claim this transaction holds, once it does: a takeover's
    /// attempt.
    takeover: OnceLock<Option<Takeover>>,
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
            .field("takeover", &self.takeover())
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

    /// Undoes every statement the handler sent so far, and keeps the claim:
    /// for a business-rule refusal (a balance too low, a constraint that
    /// failed) whose answer should be stored as the request's outcome
    /// while none of its writes is. After a failed statement PostgreSQL
    /// refuses every other until this runs (`25P02`), so call it before
    /// returning the refusal, then return the refusal as the handler's
    /// value (an `Ok`). It can be called more than once.
    pub async fn roll_back_writes(&self) -> Result<(), StoreError> {
        self.batch_execute(&pg::roll_back_writes_statement())
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

    async fn row(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Option<tokio_postgres::Row>, tokio_postgres::Error> {
        Ok(self.query_typed(sql, params).await?.into_iter().next())
    }
}

/// A transaction of the store's: the connection and the statements it
/// runs.
struct Open {
    store: PostgresStore,
    transaction: PgTransaction,
}

impl PostgresStore {
    /// Takes a connection and begins a transaction bounded by `limits`.
    async fn begin(&self, limits: &TransactionLimits) -> Result<PgTransaction, StoreError> {
        let object = self.client().await?;
        let begin = pg::begin_bounded(limits);
        let transaction = PgTransaction {
            held: Arc::new(Held {
                object: Some(object),
                open: AtomicBool::new(true),
                takeover: OnceLock::new(),
            }),
        };
        transaction
            .batch_execute(&begin)
            .await
            .map_err(|e| errors::from_pg("BEGIN", e))?;
        Ok(transaction)
    }
}

impl Open {
    async fn get(&self, id: &RecordId) -> Result<Option<Record>, StoreError> {
        match self
            .transaction
            .row(&self.store.inner.sql.get, &[(&id.as_str(), Type::TEXT)])
            .await
        {
            Ok(row) => row.as_ref().map(decode).transpose(),
            Err(error) => Err(errors::from_pg("SELECT (in transaction)", error)),
        }
    }

    /// A claim's or a takeover's answer: applied, or refused with the
    /// committed record (read with a new snapshot when the statement's
    /// predates the transaction that committed the record it waited for).
    async fn conditional(
        &self,
        answer: Result<Option<tokio_postgres::Row>, tokio_postgres::Error>,
        operation: &'static str,
        id: &RecordId,
    ) -> Result<Conditional, StoreError> {
        match answered(answer, operation)? {
            Conditional::Refused(None) => Ok(Conditional::Refused(self.get(id).await?)),
            answer => Ok(answer),
        }
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        let values = ClaimValues::of(claim)?;
        let answer = match self.store.inner.partitions {
            None => {
                self.transaction
                    .row(&self.store.inner.sql.claim, &values.claim())
                    .await
            }
            // The record's lock, held until the transaction ends (a
            // duplicate waits on it as on the plain table's row), then the
            // claim: sent together. The claim's partition is made before
            // the transaction's first statement may need it.
            Some(_) => {
                self.store.ensure_partition_of(claim.now_ms).await?;
                let key = pg::partitioned::lock_key(&self.store.inner.table, claim.id.as_str());
                let lock: [(&(dyn ToSql + Sync), Type); 1] = [(&key, Type::INT8)];
                let params = values.claim();
                let (locked, answer) = tokio::join!(
                    self.transaction
                        .query_typed(pg::partitioned::LOCK_RECORD, &lock),
                    self.transaction.row(&self.store.inner.sql.claim, &params),
                );
                if let Err(error) = locked {
                    return Err(errors::from_pg("SELECT pg_advisory_xact_lock", error));
                }
                answer
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
        let values = ClaimValues::of(claim)?;
        let lapsed = lapsed.as_str();
        let answer = self
            .transaction
            .row(&self.store.inner.sql.take_over, &values.take_over(&lapsed))
            .await;
        let taken = self
            .conditional(answer, "UPDATE (take over in transaction)", &claim.id)
            .await?;
        if taken == Conditional::Applied {
            let _ = self.transaction.held.takeover.set(claim.takeover());
        }
        Ok(taken)
    }

    async fn hold(&self) -> Result<(), StoreError> {
        // The claim waited as long as a duplicate may; the operation's own
        // locks wait as the server's setting says (within the time limit).
        self.transaction
            .batch_execute(&pg::hold_statement())
            .await
            .map_err(|e| errors::from_pg("SAVEPOINT", e))
    }

    /// Runs the completion's [`PgWrite`]s, then completes the record,
    /// fenced on its owner.
    async fn complete(&self, completion: Completion<PgWrite>) -> Result<Conditional, StoreError> {
        run_writes(&self.transaction, &completion.writes).await?;
        let (expiration, now) = (int8(completion.expiration_s)?, int8(completion.now_ms)?);
        let response = completion.response.as_slice();
        let answer = self
            .transaction
            .row(
                &self.store.inner.sql.complete,
                &[
                    (&completion.id.as_str(), Type::TEXT),
                    (&completion.owner.as_str(), Type::TEXT),
                    (&response, Type::BYTEA),
                    (&expiration, Type::INT8),
                    (&now, Type::INT8),
                ],
            )
            .await;
        match answer {
            // A statement of the operation failed and nothing rolled it
            // back: the transaction accepts no other statement.
            Err(error) if error.code().map(|c| c.code()) == Some(pg::FAILED_TRANSACTION) => Err(StoreError::new(
                StoreErrorKind::WriteRejected,
                "a statement of the operation failed and the operation returned a value anyway; \
                     nothing was committed (after a refusal, call PgTransaction::roll_back_writes \
                     before returning it)",
            )
            .with_source(error)),
            answer => answered(answer, "UPDATE (complete in transaction)"),
        }
    }
}

impl OpenTransaction for PgTransaction {
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()> {
        Box::pin(PgTransaction::roll_back_writes(self))
    }
}

impl OpenTransaction for Open {
    fn roll_back_writes(&self) -> TransactionFuture<'_, ()> {
        Box::pin(self.transaction.roll_back_writes())
    }
}

impl Transaction<PgWrite> for Open {
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

    fn write(&self, writes: Vec<PgWrite>) -> TransactionFuture<'_, ()> {
        Box::pin(async move { run_writes(&self.transaction, &writes).await })
    }

    fn complete(&self, completion: Completion<PgWrite>) -> TransactionFuture<'_, Conditional> {
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

impl Transactions<PgWrite> for PostgresStore {
    fn begin<'a>(
        &'a self,
        limits: &'a TransactionLimits,
    ) -> TransactionFuture<'a, Arc<dyn Transaction<PgWrite>>> {
        Box::pin(async move {
            let transaction = PostgresStore::begin(self, limits).await?;
            let open: Arc<dyn Transaction<PgWrite>> = Arc::new(Open {
                store: self.clone(),
                transaction,
            });
            Ok(open)
        })
    }

    fn expect_open_at_once(&self, transactions: usize) {
        self.warn_if_pool_short(transactions);
    }
}

impl TransactionalStore for PostgresStore {
    type Transaction = PgTransaction;
}

/// An answered statement's result: applied, or refused with the record the
/// statement saw (`None` when its snapshot saw none). `55P03` (the claim
/// wait passed), `40001` and `40P01` are
/// [`Conflict`](StoreErrorKind::Conflict)s: another transaction holds the
/// key, or won a race for it.
fn answered(
    row: Result<Option<tokio_postgres::Row>, tokio_postgres::Error>,
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
        Err(error) => return Err(errors::from_pg(operation, error)),
    };
    let applied: bool = row
        .try_get("applied")
        .map_err(|e| StoreError::corrupt("the answer has no `applied`").with_source(e))?;
    if applied {
        return Ok(Conditional::Applied);
    }
    Ok(Conditional::Refused(decode_optional(&row)?))
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
