//! The PostgreSQL store on sqlx: the same records, table and statements
//! as [`PostgresStore`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/postgres/struct.PostgresStore.html)
//! (tokio-postgres), over the application's own [`PgPool`] (feature
//! `sqlx-postgres`).
//!
//! ```no_run
//! use lambda_idempotency::{store::sqlx::postgres::SqlxPostgresStore, Engine};
//! use lambda_idempotency::store::sqlx::postgres::sqlx::postgres::PgPoolOptions;
//!
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! // Once, in `main`: the application's pool, shared with its own queries.
//! let pool = PgPoolOptions::new()
//!     .max_connections(4)
//!     .connect_lazy("postgres://app@db.internal:5432/app")?;
//! let store = SqlxPostgresStore::new(pool, "idempotency")?;
//! store.create_table().await?;
//! let engine = Engine::builder(store).build();
//! # let _ = engine; Ok(()) }
//! ```
//!
//! # The table
//!
//! ```sql
#![doc = include_str!("../../pg/table.sql")]
//! ```
//!
//! The same table as the tokio-postgres store's, written by the same
//! statements: both stores can serve one table at once, and either
//! replays what the other completed. [`SqlxPostgresStore::create_table`]
//! runs the DDL (`IF NOT EXISTS`) and checks the table's shape;
//! [`SqlxPostgresStore::purge_expired`] deletes expired rows in batches
//! (nothing in PostgreSQL deletes them by itself; every read and condition
//! compares `expiration_s`, so they are never served).
//!
#![doc = include_str!("docs.md")]

mod codec;
mod errors;
mod partitioned;
mod query;
mod steps;
mod transaction;
mod write;

pub use super::super::pg::partitioning::{PartitionCleanup, PartitionInfo, Partitioning};
pub use super::super::pg::refusal::{Refusal, RefusalRules, RefusalSource};
pub use super::super::transaction::{TransactionLimits, DEFAULT_CLAIM_WAIT, DEFAULT_TIME_LIMIT};
/// The driver crate, for building a pool (`sqlx::postgres::PgPoolOptions`).
pub use sqlx;
pub use transaction::{SqlxPgConnection, SqlxPgTransaction};
pub use write::SqlxPgWrite;

use crate::{
    store::{
        pg::{
            int8,
            statements::Statements,
            table::{
                shape_error, split_ddl, table_ddl, table_differences, table_name_error,
                COLUMNS_QUERY, ID_IS_UNIQUE_QUERY,
            },
            table_size::{table_size as pg_table_size, TABLE_SIZE},
            upkeep::{self, Partitions},
        },
        Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId,
        RecordedStep, Removal, StepWrite, Store, TableSize,
    },
    StoreError, StoreErrorKind,
};
use codec::{applied, decode, decode_optional};
use errors::{from_sqlx, from_write};
use query::{
    Query,
    Value::{self, Bytes, Int8, Text},
};
use sqlx::{postgres::PgRow, Executor, PgPool};
use std::sync::Arc;

/// Records in a PostgreSQL table, through the application's sqlx
/// [`PgPool`]. Cheap to clone.
#[derive(Clone)]
pub struct SqlxPostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    table: String,
    sql: Statements,
    /// Whether the store's statements are named and cached per connection
    /// ([`SqlxPostgresStore::prepared_statements`]).
    prepared: bool,
    /// `Some` for the partitioned layout
    /// ([`SqlxPostgresStore::partitioned`]).
    partitions: Option<Partitions>,
}

impl std::fmt::Debug for SqlxPostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqlxPostgresStore")
            .field("table", &self.inner.table)
            .field("prepared_statements", &self.inner.prepared)
            .finish_non_exhaustive()
    }
}

impl SqlxPostgresStore {
    /// A store over `table` (default `idempotency`; an identifier,
    /// optionally schema-qualified), through `pool`. Its statements work
    /// directly and through PgBouncer in transaction mode and RDS Proxy
    /// alike (see "Poolers" below): each is one simple query, one round
    /// trip, with its values written into it as literals.
    pub fn new(pool: PgPool, table: impl Into<String>) -> Result<Self, StoreError> {
        let table = table.into();
        if let Some(error) = table_name_error(&table) {
            return Err(StoreError::new(StoreErrorKind::Misconfigured, error));
        }
        Ok(Self::build(pool, table, false, None))
    }

    fn build(
        pool: PgPool,
        table: String,
        prepared: bool,
        partitioning: Option<Partitioning>,
    ) -> Self {
        let sql = match partitioning {
            Some(_) => super::super::pg::partitioned::statements(&table),
            None => Statements::new(&table),
        };
        Self {
            inner: Arc::new(Inner {
                pool,
                sql,
                table,
                prepared,
                partitions: partitioning.map(Partitions::new),
            }),
        }
    }

    /// Whether the store's own statements are prepared once per connection
    /// and kept in sqlx's statement cache (sqlx's default for a query),
    /// their values bound: the server then parses and plans each statement
    /// once per connection rather than at every call (a call is one round
    /// trip either way, once the statement is prepared on the connection;
    /// BENCHMARKS.md has the difference). Only where a named prepared
    /// statement stays on the connection that prepared it: a direct
    /// connection (RDS, Aurora), or PgBouncer 1.21 or later with
    /// `max_prepared_statements` set; never through PgBouncer before 1.21
    /// in transaction mode. Needs sqlx's statement cache (on by default;
    /// not `statement_cache_capacity(0)`). Off by default.
    #[must_use]
    pub fn prepared_statements(self, prepared: bool) -> Self {
        Self::build(
            self.inner.pool.clone(),
            self.inner.table.clone(),
            prepared,
            self.partitioning(),
        )
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// `sql` with `values`, sent as the store is set: a simple query, or
    /// a named and cached statement.
    fn query<'q>(&self, sql: &'q str, values: &[Value<'_>]) -> Result<Query<'q>, StoreError> {
        Query::new(sql, values, self.inner.prepared)
    }

    /// Runs one statement of the store's and returns its rows. By default
    /// a simple query (one exchange, one statement: the server runs it as
    /// a transaction of its own, and no pooler can split it); prepared, a
    /// named statement sqlx has cached on the connection.
    async fn rows(
        &self,
        sql: &str,
        values: &[Value<'_>],
        operation: &'static str,
    ) -> Result<Vec<PgRow>, StoreError> {
        self.query(sql, values)?
            .fetch_all(&self.inner.pool)
            .await
            .map_err(|e| from_sqlx(operation, e))
    }

    /// Runs an answered conditional write on the record `id` (behind its
    /// lock in the partitioned layout).
    async fn answer(
        &self,
        sql: &str,
        values: &[Value<'_>],
        operation: &'static str,
        id: &RecordId,
    ) -> Result<Conditional, StoreError> {
        let rows = match self.inner.partitions {
            None => self.rows(sql, values, operation).await?,
            Some(_) => self.locked_rows(id, sql, values, operation).await?,
        };
        let row = rows.first().ok_or_else(|| {
            StoreError::new(StoreErrorKind::Other, format!("{operation}: no answer row"))
        })?;
        if applied(row)? {
            return Ok(Conditional::Applied);
        }
        Ok(Conditional::Refused(decode_optional(row)?))
    }

    /// Runs `write` (a statement `RETURNING 1` when it applies) and the
    /// handler's writes in one transaction; a refusal rolls back and reports
    /// the record found.
    async fn transaction(
        &self,
        write: Query<'_>,
        writes: Vec<SqlxPgWrite>,
        id: &RecordId,
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        // The partitioned layout's writes come after the record's lock,
        // taken with `BEGIN` (one simple query).
        let begin = match self.inner.partitions {
            None => self.inner.pool.begin().await,
            Some(_) => {
                let begin =
                    super::super::pg::partitioned::begin_locked(&self.inner.table, id.as_str());
                self.inner.pool.begin_with(begin).await
            }
        };
        let mut transaction = begin.map_err(|e| from_sqlx("BEGIN", e))?;
        let applied = write
            .fetch_optional(&mut *transaction)
            .await
            .map_err(|e| from_sqlx(operation, e))?
            .is_some();
        if !applied {
            let found = self
                .query(&self.inner.sql.get, &[Text(id.as_str())])?
                .fetch_optional(&mut *transaction)
                .await
                .map_err(|e| from_sqlx("SELECT", e))?;
            let found = found.as_ref().map(decode).transpose()?;
            transaction
                .rollback()
                .await
                .map_err(|e| from_sqlx("ROLLBACK", e))?;
            return Ok(Conditional::Refused(found));
        }
        // A write that fails returns early: dropping the sqlx transaction
        // rolls it back.
        run_writes(&mut transaction, writes, self.inner.prepared).await?;
        transaction
            .commit()
            .await
            .map_err(|e| from_sqlx("COMMIT", e))?;
        Ok(Conditional::Applied)
    }

    /// Deletes records that expired before `now_s` (epoch seconds), in
    /// batches of `batch`, until none is left; returns how many. Safe to run
    /// concurrently: each batch skips rows another run holds.
    ///
    /// The partitioned layout deletes no rows: its answer is a
    /// `Misconfigured` error (use
    /// [`drop_expired_partitions`](SqlxPostgresStore::drop_expired_partitions)).
    pub async fn purge_expired(&self, now_s: u64, batch: u32) -> Result<u64, StoreError> {
        if self.inner.partitions.is_some() {
            return Err(upkeep::purge_refused());
        }
        let now = int8(now_s)?;
        let batch = i64::from(batch.max(1));
        let mut total = 0;
        loop {
            // One statement: it is its own transaction.
            let deleted = self
                .query(&self.inner.sql.purge, &[Int8(now), Int8(batch)])?
                .execute(&self.inner.pool)
                .await
                .map_err(|e| from_sqlx("DELETE (purge expired)", e))?
                .rows_affected();
            total += deleted;
            if deleted < batch as u64 {
                return Ok(total);
            }
        }
    }

    /// Creates the table and its expiration index if they are missing (the
    /// DDL above), then checks the table: one that was already there with
    /// another shape (a column missing or of another type, `id` not
    /// unique, a column of its own that inserts cannot leave empty) is a
    /// [`StoreErrorKind::Misconfigured`] error naming each difference, and
    /// is left as it is.
    ///
    /// For the partitioned layout ([`SqlxPostgresStore::partitioned`]): the
    /// partitioned table (the tokio-postgres store's docs show its DDL),
    /// checked the same way (a plain table of the name is refused), and its
    /// partitions for today and the days ahead.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        if self.inner.partitions.is_some() {
            return self.create_partitioned_table().await;
        }
        let ddl = table_ddl(&self.inner.table);
        // The table, then its check, then its index: an index is not added to
        // a table of another shape. DDL without parameters: sqlx sends it
        // as a simple query, one exchange, through any pooler.
        let (create_table, create_index) = split_ddl(&ddl);
        sqlx::raw_sql(create_table)
            .execute(&self.inner.pool)
            .await
            .map_err(|e| from_sqlx("CREATE TABLE", e))?;
        self.check_table().await?;
        sqlx::raw_sql(create_index)
            .execute(&self.inner.pool)
            .await
            .map_err(|e| from_sqlx("CREATE INDEX", e))?;
        Ok(())
    }

    async fn check_table(&self) -> Result<(), StoreError> {
        use sqlx::Row;
        let table = &self.inner.table;
        let columns = self
            .rows(
                COLUMNS_QUERY,
                &[Text(table.as_str())],
                "read the table's columns",
            )
            .await?;
        let id_is_unique: bool = self
            .rows(
                ID_IS_UNIQUE_QUERY,
                &[Text(table.as_str())],
                "read the table's indexes",
            )
            .await?
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or(false);
        let found: Vec<(String, String, bool)> = columns
            .iter()
            .filter_map(|row| {
                Some((
                    row.try_get(0).ok()?,
                    row.try_get(1).ok()?,
                    row.try_get(2).ok()?,
                ))
            })
            .collect();
        match shape_error(table, &table_differences(&found, id_is_unique)) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// Runs the operation's [`SqlxPgWrite`]s on `connection`, in order.
pub(super) async fn run_writes(
    connection: &mut sqlx::PgConnection,
    writes: Vec<SqlxPgWrite>,
    prepared: bool,
) -> Result<(), StoreError> {
    for (index, write) in writes.into_iter().enumerate() {
        if let Some(error) = write.unencodable {
            return Err(from_write(index, sqlx::Error::Encode(error.into())));
        }
        let query = sqlx::query_with(&write.sql, write.arguments).persistent(prepared);
        Executor::execute(&mut *connection, query)
            .await
            .map_err(|error| from_write(index, error))?;
    }
    Ok(())
}

impl Store for SqlxPostgresStore {
    type Write = SqlxPgWrite;

    const SINGLE_WRITE: bool = true;
    const DB_SYSTEM: &'static str = "postgresql";
    const STEPS: bool = true;

    async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        self.write_step(step).await
    }

    async fn steps(&self, id: &RecordId, now_ms: u64) -> Result<Vec<RecordedStep>, StoreError> {
        self.read_steps(id, now_ms).await
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        let values = codec::claim(claim)?;
        self.inserting(claim.now_ms, || {
            self.answer(&self.inner.sql.claim, &values, "INSERT (claim)", &claim.id)
        })
        .await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.sql.take_over,
            &codec::take_over(claim, lapsed)?,
            "UPDATE (take over)",
            &claim.id,
        )
        .await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        let values = [
            Text(extension.id.as_str()),
            Text(extension.owner.as_str()),
            Int8(int8(extension.lease_until_ms)?),
            Int8(int8(extension.expiration_s)?),
            Int8(int8(extension.now_ms)?),
        ];
        // The partitioned layout's extension also compares the writer's
        // now with the record's expiration.
        let values = match self.inner.partitions {
            Some(_) => &values[..],
            None => &values[..4],
        };
        self.answer(
            &self.inner.sql.extend,
            values,
            "UPDATE (extend)",
            &extension.id,
        )
        .await
    }

    async fn complete(
        &self,
        completion: Completion<SqlxPgWrite>,
    ) -> Result<Conditional, StoreError> {
        let values = completion_values(&completion)?;
        if completion.writes.is_empty() {
            return self
                .answer(
                    &self.inner.sql.complete,
                    &values,
                    "UPDATE (complete)",
                    &completion.id,
                )
                .await;
        }
        let write = self.query(&self.inner.sql.fenced_complete, &values)?;
        self.transaction(
            write,
            completion.writes,
            &completion.id,
            "UPDATE (complete)",
        )
        .await
    }

    async fn commit(&self, commit: Commit<SqlxPgWrite>) -> Result<Conditional, StoreError> {
        let values = [
            Text(commit.id.as_str()),
            Text(commit.owner.as_str()),
            Text(commit.fingerprint.as_str()),
            Int8(int8(commit.expiration_s)?),
            Bytes(commit.response.as_slice()),
            Int8(int8(commit.now_ms)?),
            Int8(int8(commit.now_ms / 1000)?),
        ];
        if self.inner.partitions.is_none() {
            let write = self.query(&self.inner.sql.commit, &values)?;
            return self
                .transaction(write, commit.writes, &commit.id, "INSERT (commit)")
                .await;
        }
        // Its row may need a partition made first: then written again.
        self.inserting(commit.now_ms, || async {
            let write = self.query(&self.inner.sql.commit, &values)?;
            self.transaction(write, commit.writes.clone(), &commit.id, "INSERT (commit)")
                .await
        })
        .await
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        let values = [Text(id.as_str()), Text(owner.as_str())];
        self.answer(&self.inner.sql.release, &values, "DELETE (release)", id)
            .await
    }

    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        let sql = match removal {
            Removal::Any => &self.inner.sql.remove_any,
            Removal::UnlessInProgress => &self.inner.sql.remove_unless_in_progress,
        };
        self.answer(sql, &[Text(id.as_str())], "DELETE (remove)", id)
            .await
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = self
            .rows(
                &self.inner.sql.list_in_progress,
                &[Text(prefix), Int8(limit)],
                "SELECT (list in progress)",
            )
            .await?;
        rows.iter().map(decode).collect()
    }

    /// Two statements on the primary key's index, `query.limit` rows at
    /// most (`pg::abandoned`): the cursor is the last id read.
    async fn list_abandoned(
        &self,
        query: &crate::store::AbandonedQuery,
    ) -> Result<crate::store::AbandonedPage, StoreError> {
        use sqlx::Row as _;
        let sql = crate::store::pg::abandoned::AbandonedSql::new(
            &self.inner.table,
            self.inner.partitions.is_some(),
        );
        let after = query.cursor.as_ref().map_or("", |c| c.as_str());
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let read = self
            .rows(
                &sql.read,
                &[Text(after), Int8(limit)],
                "SELECT (list abandoned)",
            )
            .await?;
        let (last, count): (Option<String>, i64) = match read.first() {
            Some(row) => (
                row.try_get(0)
                    .map_err(|e| from_sqlx("SELECT (list abandoned)", e))?,
                row.try_get(1)
                    .map_err(|e| from_sqlx("SELECT (list abandoned)", e))?,
            ),
            None => (None, 0),
        };
        let Some(last) = last else {
            return Ok(crate::store::AbandonedPage::default());
        };
        let rows = self
            .rows(
                &sql.rows,
                &[
                    Text(after),
                    Text(&last),
                    Text(&query.prefix),
                    Int8(crate::store::pg::int8(query.lease_before_ms)?),
                    Int8(crate::store::pg::int8(query.now_ms / 1000)?),
                ],
                "SELECT (list abandoned)",
            )
            .await?;
        let records = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        let next = (count >= limit).then(|| crate::store::PageCursor::from_stored(last));
        Ok(crate::store::AbandonedPage::new(records, next))
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let rows = self
            .rows(&self.inner.sql.get, &[Text(id.as_str())], "SELECT")
            .await?;
        Ok(rows
            .first()
            .map(decode)
            .transpose()?
            .filter(|record| !record.is_expired(now_ms)))
    }

    /// Estimated from the catalog (`pg_class.reltuples`,
    /// `pg_total_relation_size`), over the partitions of a partitioned
    /// table: see [`table_size`](mod@crate::store::table_size).
    async fn table_size(&self, _now_ms: u64) -> Result<Option<TableSize>, StoreError> {
        use sqlx::Row;
        let table = self.inner.table.as_str();
        let rows = self
            .rows(TABLE_SIZE, &[Text(table)], "SELECT (table size)")
            .await?;
        let row = rows.first().ok_or_else(|| {
            StoreError::new(StoreErrorKind::Other, "SELECT (table size): no answer row")
        })?;
        let read = |e| StoreError::corrupt("the table size answer").with_source(e);
        pg_table_size(
            table,
            row.try_get(0).map_err(read)?,
            row.try_get(1).map_err(read)?,
            row.try_get(2).map_err(read)?,
        )
        .map(Some)
    }

    fn transactions(&self) -> Option<&dyn super::super::Transactions<SqlxPgWrite>> {
        Some(self)
    }
}

/// The completion statement's values, in its order.
fn completion_values<W>(completion: &Completion<W>) -> Result<[Value<'_>; 5], StoreError> {
    Ok([
        Text(completion.id.as_str()),
        Text(completion.owner.as_str()),
        Bytes(completion.response.as_slice()),
        Int8(int8(completion.expiration_s)?),
        Int8(int8(completion.now_ms)?),
    ])
}
