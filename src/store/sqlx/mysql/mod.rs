//! The MySQL store on sqlx (feature `sqlx-mysql`): the protocol as
//! conditional `INSERT`, `UPDATE` and `DELETE` statements over your own
//! [`MySqlPool`](sqlx::MySqlPool), for MySQL 8, Aurora MySQL and MariaDB;
//! and the handler inside the transaction that holds its claim
//! ([`SqlxMySqlTransaction`]).
//!
//! ```no_run
//! use lambda_idempotency::{store::sqlx::mysql::SqlxMySqlStore, Engine};
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // Once, in `main`: your pool, and the table the records live in.
//! let pool = sqlx::MySqlPool::connect_lazy("mysql://app@db.internal:3306/app")?;
//! let store = SqlxMySqlStore::new(pool, "idempotency")?;
//! store.create_table().await?;
//! let engine = Engine::builder(store).build();
//! # let _ = engine; Ok(()) }
//! ```
//!
#![doc = include_str!("docs.md")]

mod abandoned;
mod codec;
mod errors;
mod statements;
mod steps;
mod transaction;
mod write;

pub use transaction::{SqlxMySqlTransaction, TransactionConnection};
pub use write::{MySqlValue, SqlxMySqlWrite};

use super::super::{
    Accuracy, Claim, Completion, Conditional, Extension, OwnerToken, Record, RecordId,
    RecordedStep, Removal, SizeSource, StepWrite, Store, TableSize, Transactions,
};
use crate::{StoreError, StoreErrorKind};
use codec::{decode, int8};
use errors::{from_sqlx, from_write, number};
use sqlx::{pool::PoolConnection, Executor, MySql, MySqlConnection, MySqlPool};
use statements::{fill, Literal, Literal::*, Statements, ID_CHARS};
use std::sync::Arc;

/// The MySQL error number of a duplicate key: the claim's record is there.
const DUPLICATE_KEY: u16 = 1062;

/// A [`Store`] in a MySQL table, over an [`MySqlPool`] of yours. Cheap to
/// clone: clones share the pool.
#[derive(Clone)]
pub struct SqlxMySqlStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: MySqlPool,
    table: String,
    sql: Statements,
}

impl std::fmt::Debug for SqlxMySqlStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlxMySqlStore")
            .field("table", &self.inner.table)
            .finish_non_exhaustive()
    }
}

impl SqlxMySqlStore {
    /// A store of records in `table` (letters, digits and `_`, up to 64
    /// characters, as MySQL names a table), over `pool`. Nothing is sent:
    /// [`create_table`](Self::create_table) makes the table.
    pub fn new(pool: MySqlPool, table: impl Into<String>) -> Result<Self, StoreError> {
        let table = table.into();
        let valid = !table.is_empty()
            && table.len() <= 64
            && table.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(StoreError::new(
                StoreErrorKind::Misconfigured,
                format!(
                    "{table:?} is not a table name this store uses: letters, digits and `_`, \
                     up to 64 characters"
                ),
            ));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                sql: Statements::new(&table),
                pool,
                table,
            }),
        })
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The pool.
    pub fn pool(&self) -> &MySqlPool {
        &self.inner.pool
    }

    /// Creates the table if it is not there (`CREATE TABLE IF NOT EXISTS`;
    /// see the module docs for its columns). A table that was there
    /// without the `steps` column (made before recovery points) is a
    /// [`StoreErrorKind::Misconfigured`] error naming the migration that
    /// adds it ("Migrations" in the module docs), and is left as it is.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        use sqlx::Row;
        let pool = &self.inner.pool;
        pool.execute(self.inner.sql.create.as_str())
            .await
            .map_err(|e| from_sqlx("CREATE TABLE", e))?;
        let has_steps: i64 = pool
            .fetch_one(self.inner.sql.has_steps.as_str())
            .await
            .and_then(|row| row.try_get(0))
            .map_err(|e| from_sqlx("read the table's columns", e))?;
        if has_steps == 0 {
            return Err(StoreError::new(
                StoreErrorKind::Misconfigured,
                format!(
                    "MySQL table {} has no `steps` column: it predates recovery points; `{}` \
                     adds it (the store's docs, \"Migrations\")",
                    self.inner.table,
                    statements::ADD_STEPS.replace("<table>", &self.inner.table)
                ),
            ));
        }
        Ok(())
    }

    /// Deletes up to `batch` records that expired before `now_s` (epoch
    /// seconds); the count deleted. Nothing in MySQL deletes them by
    /// itself: every read and condition compares `expiration_s`, so they
    /// are never served. Schedule it, until it deletes fewer than `batch`.
    pub async fn purge_expired(&self, now_s: u64, batch: u32) -> Result<u64, StoreError> {
        let purge = fill(
            &self.inner.sql.purge,
            &[Int(int8(now_s)?), UInt(u64::from(batch))],
        );
        let deleted = (&self.inner.pool)
            .execute(purge.as_str())
            .await
            .map_err(|e| from_sqlx("DELETE (purge)", e))?;
        Ok(deleted.rows_affected())
    }

    /// A connection of the pool's.
    async fn connection(&self) -> Result<PoolConnection<MySql>, StoreError> {
        self.inner
            .pool
            .acquire()
            .await
            .map_err(|e| from_sqlx("connect", e))
    }
}

/// The record under `id`, as a read on `connection` finds it (expired or
/// not).
async fn read(
    sql: &Statements,
    connection: &mut MySqlConnection,
    id: &RecordId,
) -> Result<Option<Record>, StoreError> {
    let row = connection
        .fetch_optional(fill(&sql.get, &[Text(id.as_str())]).as_str())
        .await
        .map_err(|e| from_sqlx("SELECT", e))?;
    row.as_ref().map(decode).transpose()
}

/// A write's answer: applied when it changed a row, else refused with the
/// record a read on the same connection finds just after.
async fn answered(
    sql: &Statements,
    connection: &mut MySqlConnection,
    changed: bool,
    id: &RecordId,
) -> Result<Conditional, StoreError> {
    if changed {
        return Ok(Conditional::Applied);
    }
    Ok(Conditional::Refused(read(sql, connection, id).await?))
}

/// A claim's values as MySQL's columns, refused before any statement when
/// one does not fit.
struct ClaimValues<'a> {
    id: &'a str,
    owner: &'a str,
    fingerprint: &'a str,
    expiration: i64,
    lease: i64,
    now: i64,
    now_s: i64,
    attempt: i32,
    first_started: i64,
}

impl<'a> ClaimValues<'a> {
    fn of(claim: &'a Claim) -> Result<Self, StoreError> {
        if claim.id.as_str().chars().count() > ID_CHARS {
            return Err(StoreError::new(
                StoreErrorKind::Rejected,
                format!(
                    "record id of {} characters: the table holds up to {ID_CHARS} (a shorter key prefix); nothing was written",
                    claim.id.as_str().chars().count()
                ),
            ));
        }
        Ok(Self {
            id: claim.id.as_str(),
            owner: claim.owner.as_str(),
            fingerprint: claim.fingerprint.as_str(),
            expiration: int8(claim.expiration_s)?,
            lease: int8(claim.lease_until_ms)?,
            now: int8(claim.now_ms)?,
            now_s: int8(claim.now_ms / 1000)?,
            attempt: i32::try_from(claim.attempt).unwrap_or(i32::MAX),
            first_started: int8(claim.first_started_ms)?,
        })
    }

    /// The claim's own columns, in the order each claim statement sets
    /// them: owner, fingerprint, expiration, lease, creation, attempt,
    /// first start.
    fn columns(&self) -> [Literal<'a>; 7] {
        [
            Text(self.owner),
            Text(self.fingerprint),
            Int(self.expiration),
            Int(self.lease),
            Int(self.now),
            Int(self.attempt.into()),
            Int(self.first_started),
        ]
    }
}

/// A claim on `connection` (the pool's, or a transaction's): a fresh
/// record where there is none, or in place of an expired one; whether it
/// changed a row.
async fn claim_on(
    sql: &Statements,
    connection: &mut MySqlConnection,
    claim: &Claim,
) -> Result<bool, StoreError> {
    let v = ClaimValues::of(claim)?;
    let insert = fill(&sql.claim, &[&[Text(v.id)][..], &v.columns()].concat());
    let inserted = connection.execute(insert.as_str()).await;
    match inserted {
        Ok(_) => return Ok(true),
        Err(error) if number(&error) == Some(DUPLICATE_KEY) => {}
        Err(error) => return Err(from_sqlx("INSERT (claim)", error)),
    }
    // A record is there: replaced only if it has expired.
    let reclaim = fill(
        &sql.reclaim,
        &[&v.columns()[..], &[Text(v.id), Int(v.now_s)]].concat(),
    );
    let replaced = connection
        .execute(reclaim.as_str())
        .await
        .map_err(|e| from_sqlx("UPDATE (claim an expired record)", e))?;
    Ok(replaced.rows_affected() > 0)
}

/// A takeover of the lapsed claim of `lapsed` on `connection`; whether it
/// changed the row.
async fn take_over_on(
    sql: &Statements,
    connection: &mut MySqlConnection,
    claim: &Claim,
    lapsed: &OwnerToken,
) -> Result<bool, StoreError> {
    let v = ClaimValues::of(claim)?;
    let take_over = fill(
        &sql.take_over,
        &[
            &v.columns()[..],
            &[Text(v.id), Text(lapsed.as_str()), Int(v.now)],
        ]
        .concat(),
    );
    let taken = connection
        .execute(take_over.as_str())
        .await
        .map_err(|e| from_sqlx("UPDATE (take over)", e))?;
    Ok(taken.rows_affected() > 0)
}

/// The fenced completion on `connection`; whether it changed the row.
async fn complete_on(
    sql: &Statements,
    connection: &mut MySqlConnection,
    completion: &Completion<SqlxMySqlWrite>,
) -> Result<bool, StoreError> {
    let complete = fill(
        &sql.complete,
        &[
            Bytes(&completion.response),
            Int(int8(completion.expiration_s)?),
            Int(int8(completion.now_ms)?),
            Text(completion.id.as_str()),
            Text(completion.owner.as_str()),
        ],
    );
    let completed = connection
        .execute(complete.as_str())
        .await
        .map_err(|e| from_sqlx("UPDATE (complete)", e))?;
    Ok(completed.rows_affected() > 0)
}

/// Runs the operation's writes on `connection`, in order.
async fn run_writes(
    connection: &mut sqlx::MySqlConnection,
    writes: &[SqlxMySqlWrite],
) -> Result<(), StoreError> {
    for (index, write) in writes.iter().enumerate() {
        write
            .query()
            .execute(&mut *connection)
            .await
            .map_err(|error| from_write(index, error))?;
    }
    Ok(())
}

impl Store for SqlxMySqlStore {
    type Write = SqlxMySqlWrite;
    const DB_SYSTEM: &'static str = "mysql";
    const STEPS: bool = true;

    async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        self.write_step(step).await
    }

    async fn steps(&self, id: &RecordId, now_ms: u64) -> Result<Vec<RecordedStep>, StoreError> {
        self.read_steps(id, now_ms).await
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        let sql = &self.inner.sql;
        let mut connection = self.connection().await?;
        let changed = claim_on(sql, &mut connection, claim).await?;
        answered(sql, &mut connection, changed, &claim.id).await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        let sql = &self.inner.sql;
        let mut connection = self.connection().await?;
        let changed = take_over_on(sql, &mut connection, claim, lapsed).await?;
        answered(sql, &mut connection, changed, &claim.id).await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        let sql = &self.inner.sql;
        let mut connection = self.connection().await?;
        let extend = fill(
            &sql.extend,
            &[
                Int(int8(extension.lease_until_ms)?),
                Int(int8(extension.expiration_s)?),
                Text(extension.id.as_str()),
                Text(extension.owner.as_str()),
            ],
        );
        let extended = connection
            .execute(extend.as_str())
            .await
            .map_err(|e| from_sqlx("UPDATE (extend)", e))?;
        let changed = extended.rows_affected() > 0;
        match answered(sql, &mut connection, changed, &extension.id).await? {
            // MySQL counts the rows a write changed, not those it matched:
            // an extension to the lease the claim already has (one sent
            // again) changes none, and holds.
            Conditional::Refused(Some(found))
                if found.status == super::super::Status::InProgress
                    && found.owner == extension.owner
                    && found.lease_until_ms == Some(extension.lease_until_ms)
                    && found.expiration_s == extension.expiration_s =>
            {
                Ok(Conditional::Applied)
            }
            answer => Ok(answer),
        }
    }

    async fn complete(
        &self,
        completion: Completion<SqlxMySqlWrite>,
    ) -> Result<Conditional, StoreError> {
        let sql = &self.inner.sql;
        let mut connection = self.connection().await?;
        if completion.writes.is_empty() {
            let changed = complete_on(sql, &mut connection, &completion).await?;
            return answered(sql, &mut connection, changed, &completion.id).await;
        }
        // The writes and the completion in one transaction: dropped
        // without its commit, sqlx rolls it back.
        let mut transaction = sqlx::Connection::begin(&mut *connection)
            .await
            .map_err(|e| from_sqlx("BEGIN", e))?;
        if !complete_on(sql, &mut transaction, &completion).await? {
            let found = read(sql, &mut transaction, &completion.id).await?;
            return Ok(Conditional::Refused(found));
        }
        run_writes(&mut transaction, &completion.writes).await?;
        transaction
            .commit()
            .await
            .map_err(|e| from_sqlx("COMMIT", e))?;
        Ok(Conditional::Applied)
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        let sql = &self.inner.sql;
        let mut connection = self.connection().await?;
        let release = fill(&sql.release, &[Text(id.as_str()), Text(owner.as_str())]);
        let released = connection
            .execute(release.as_str())
            .await
            .map_err(|e| from_sqlx("DELETE (release)", e))?;
        answered(sql, &mut connection, released.rows_affected() > 0, id).await
    }

    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        let sql = &self.inner.sql;
        let statement = match removal {
            Removal::Any => &sql.remove_any,
            Removal::UnlessInProgress => &sql.remove_unless_in_progress,
        };
        let mut connection = self.connection().await?;
        let remove = fill(statement, &[Text(id.as_str())]);
        let removed = connection
            .execute(remove.as_str())
            .await
            .map_err(|e| from_sqlx("DELETE (remove)", e))?;
        answered(sql, &mut connection, removed.rows_affected() > 0, id).await
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = u64::try_from(limit).unwrap_or(u64::MAX);
        let list = fill(
            &self.inner.sql.list_in_progress,
            &[Text(prefix), Text(prefix), UInt(limit)],
        );
        let rows = (&self.inner.pool)
            .fetch_all(list.as_str())
            .await
            .map_err(|e| from_sqlx("SELECT (list in progress)", e))?;
        rows.iter().map(decode).collect()
    }

    /// Two statements on the primary key, `query.limit` rows at most (the
    /// `abandoned` module): the cursor is the last id read.
    async fn list_abandoned(
        &self,
        query: &crate::store::AbandonedQuery,
    ) -> Result<crate::store::AbandonedPage, StoreError> {
        self.abandoned_page(query).await
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let mut connection = self.connection().await?;
        Ok(read(&self.inner.sql, &mut connection, id)
            .await?
            .filter(|record| !record.is_expired(now_ms)))
    }

    /// InnoDB's estimates from `information_schema.TABLES` (`TABLE_ROWS`,
    /// `DATA_LENGTH + INDEX_LENGTH`): see [`table_size`](mod@crate::store::table_size).
    async fn table_size(&self, _now_ms: u64) -> Result<Option<TableSize>, StoreError> {
        use sqlx::Row;
        let row = (&self.inner.pool)
            .fetch_optional(self.inner.sql.table_size.as_str())
            .await
            .map_err(|e| from_sqlx("SELECT (table size)", e))?
            .ok_or_else(|| {
                StoreError::new(
                    StoreErrorKind::Misconfigured,
                    format!(
                        "the MySQL table {} does not exist in the connection's database \
                         (create_table makes it)",
                        self.inner.table
                    ),
                )
            })?;
        let read = |e| StoreError::corrupt("the table size answer").with_source(e);
        let rows: u64 = row.try_get(0).map_err(read)?;
        let bytes: u64 = row.try_get(1).map_err(read)?;
        Ok(Some(
            TableSize::new(rows, Accuracy::Estimated, SizeSource::InformationSchema).bytes(bytes),
        ))
    }

    fn transactions(&self) -> Option<&dyn Transactions<SqlxMySqlWrite>> {
        Some(self)
    }
}
