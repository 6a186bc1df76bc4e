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
mod transaction;
mod write;

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
        },
        Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId, Removal,
        Store,
    },
    StoreError, StoreErrorKind,
};
use codec::{applied, decode, decode_optional, Binds};
use errors::{from_sqlx, from_write};
use sqlx::{
    postgres::{PgArguments, PgRow},
    Executor, PgPool, Postgres,
};
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
    /// alike (see "Poolers" below); on a direct connection,
    /// [`prepared_statements`](SqlxPostgresStore::prepared_statements)
    /// saves round trips.
    pub fn new(pool: PgPool, table: impl Into<String>) -> Result<Self, StoreError> {
        let table = table.into();
        if let Some(error) = table_name_error(&table) {
            return Err(StoreError::new(StoreErrorKind::Misconfigured, error));
        }
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                sql: Statements::new(&table),
                table,
                prepared: false,
            }),
        })
    }

    /// Whether the store's own statements are prepared once per connection
    /// and kept in sqlx's statement cache (sqlx's default for a query):
    /// each call is then one round trip instead of four. Only where a
    /// named prepared statement stays on the connection that prepared it:
    /// a direct connection (RDS, Aurora), or PgBouncer 1.21 or later with
    /// `max_prepared_statements` set; never through PgBouncer before 1.21
    /// in transaction mode. Needs sqlx's statement cache (on by default;
    /// not `statement_cache_capacity(0)`). Off by default.
    #[must_use]
    pub fn prepared_statements(self, prepared: bool) -> Self {
        let inner = Inner {
            pool: self.inner.pool.clone(),
            table: self.inner.table.clone(),
            sql: Statements::new(&self.inner.table),
            prepared,
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The pool.
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// A statement of the store's, named and cached or not as the store is
    /// set.
    fn query<'q>(
        &self,
        sql: &'q str,
        arguments: PgArguments,
    ) -> sqlx::query::Query<'q, Postgres, PgArguments> {
        sqlx::query_with(sql, arguments).persistent(self.inner.prepared)
    }

    /// Runs one statement of the store's and returns its rows. Unprepared,
    /// it runs in a transaction of its own: sqlx parses it and binds it in
    /// two exchanges, and a pooler in transaction mode (PgBouncer, RDS
    /// Proxy) may hand the server connection to another client between
    /// them when no transaction holds it, binding the parameters to
    /// another client's statement.
    async fn rows(
        &self,
        sql: &str,
        arguments: PgArguments,
        operation: &'static str,
    ) -> Result<Vec<PgRow>, StoreError> {
        if self.inner.prepared {
            return self
                .query(sql, arguments)
                .fetch_all(&self.inner.pool)
                .await
                .map_err(|e| from_sqlx(operation, e));
        }
        let mut transaction = self
            .inner
            .pool
            .begin()
            .await
            .map_err(|e| from_sqlx("BEGIN", e))?;
        let rows = self
            .query(sql, arguments)
            .fetch_all(&mut *transaction)
            .await
            .map_err(|e| from_sqlx(operation, e))?;
        transaction
            .commit()
            .await
            .map_err(|e| from_sqlx("COMMIT", e))?;
        Ok(rows)
    }

    /// Runs an answered conditional write.
    async fn answer(
        &self,
        sql: &str,
        arguments: PgArguments,
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        let rows = self.rows(sql, arguments, operation).await?;
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
        write: &str,
        arguments: PgArguments,
        writes: Vec<SqlxPgWrite>,
        id: &RecordId,
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        let mut transaction = self
            .inner
            .pool
            .begin()
            .await
            .map_err(|e| from_sqlx("BEGIN", e))?;
        let applied = self
            .query(write, arguments)
            .fetch_optional(&mut *transaction)
            .await
            .map_err(|e| from_sqlx(operation, e))?
            .is_some();
        if !applied {
            let found = self
                .query(&self.inner.sql.get, Binds::new().add(id.as_str()).done()?)
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
    pub async fn purge_expired(&self, now_s: u64, batch: u32) -> Result<u64, StoreError> {
        let now = int8(now_s)?;
        let batch = i64::from(batch.max(1));
        let mut total = 0;
        loop {
            let arguments = Binds::new().add(now).add(batch).done()?;
            let deleted = if self.inner.prepared {
                self.query(&self.inner.sql.purge, arguments)
                    .execute(&self.inner.pool)
                    .await
            } else {
                // One statement: it is its own transaction, and its parse
                // and bind stay on one server connection inside it.
                let mut transaction = self
                    .inner
                    .pool
                    .begin()
                    .await
                    .map_err(|e| from_sqlx("BEGIN", e))?;
                let deleted = self
                    .query(&self.inner.sql.purge, arguments)
                    .execute(&mut *transaction)
                    .await;
                if deleted.is_ok() {
                    transaction
                        .commit()
                        .await
                        .map_err(|e| from_sqlx("COMMIT", e))?;
                }
                deleted
            }
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
    pub async fn create_table(&self) -> Result<(), StoreError> {
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
                Binds::new().add(table.as_str()).done()?,
                "read the table's columns",
            )
            .await?;
        let id_is_unique: bool = self
            .rows(
                ID_IS_UNIQUE_QUERY,
                Binds::new().add(table.as_str()).done()?,
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

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.sql.claim,
            codec::claim(claim)?,
            "INSERT (claim)",
        )
        .await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.sql.take_over,
            codec::take_over(claim, lapsed)?,
            "UPDATE (take over)",
        )
        .await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        let arguments = Binds::new()
            .add(extension.id.as_str())
            .add(extension.owner.as_str())
            .add(int8(extension.lease_until_ms)?)
            .add(int8(extension.expiration_s)?)
            .done()?;
        self.answer(&self.inner.sql.extend, arguments, "UPDATE (extend)")
            .await
    }

    async fn complete(
        &self,
        completion: Completion<SqlxPgWrite>,
    ) -> Result<Conditional, StoreError> {
        let arguments = completion_arguments(&completion)?;
        if completion.writes.is_empty() {
            return self
                .answer(&self.inner.sql.complete, arguments, "UPDATE (complete)")
                .await;
        }
        self.transaction(
            &self.inner.sql.fenced_complete,
            arguments,
            completion.writes,
            &completion.id,
            "UPDATE (complete)",
        )
        .await
    }

    async fn commit(&self, commit: Commit<SqlxPgWrite>) -> Result<Conditional, StoreError> {
        let arguments = Binds::new()
            .add(commit.id.as_str())
            .add(commit.owner.as_str())
            .add(commit.fingerprint.as_str())
            .add(int8(commit.expiration_s)?)
            .add(commit.response.as_slice())
            .add(int8(commit.now_ms)?)
            .add(int8(commit.now_ms / 1000)?)
            .done()?;
        self.transaction(
            &self.inner.sql.commit,
            arguments,
            commit.writes,
            &commit.id,
            "INSERT (commit)",
        )
        .await
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        let arguments = Binds::new().add(id.as_str()).add(owner.as_str()).done()?;
        self.answer(&self.inner.sql.release, arguments, "DELETE (release)")
            .await
    }

    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        let sql = match removal {
            Removal::Any => &self.inner.sql.remove_any,
            Removal::UnlessInProgress => &self.inner.sql.remove_unless_in_progress,
        };
        self.answer(
            sql,
            Binds::new().add(id.as_str()).done()?,
            "DELETE (remove)",
        )
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
                Binds::new().add(prefix).add(limit).done()?,
                "SELECT (list in progress)",
            )
            .await?;
        rows.iter().map(decode).collect()
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let rows = self
            .rows(
                &self.inner.sql.get,
                Binds::new().add(id.as_str()).done()?,
                "SELECT",
            )
            .await?;
        Ok(rows
            .first()
            .map(decode)
            .transpose()?
            .filter(|record| !record.is_expired(now_ms)))
    }

    fn transactions(&self) -> Option<&dyn super::super::Transactions<SqlxPgWrite>> {
        Some(self)
    }
}

/// The completion statement's parameters, in its order.
fn completion_arguments<W>(completion: &Completion<W>) -> Result<PgArguments, StoreError> {
    Binds::new()
        .add(completion.id.as_str())
        .add(completion.owner.as_str())
        .add(completion.response.as_slice())
        .add(int8(completion.expiration_s)?)
        .add(int8(completion.now_ms)?)
        .done()
}
