//! The PostgreSQL store: the protocol as conditional `INSERT … ON CONFLICT`,
//! `UPDATE` and `DELETE` statements (feature `postgres`).
//!
//! ```no_run
//! use lambda_idempotency::{store::postgres::PostgresStore, Engine};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Once, in `main`: a pool of two connections, opened on first use.
//! let store = PostgresStore::connect("postgres://app@db.internal:5432/app", "idempotency", 2)?;
//! let engine = Engine::builder(store).build();
//! # let _ = engine; Ok(()) }
//! ```
//!
//! # The table
//!
//! ```sql
#![doc = include_str!("../pg/table.sql")]
//! ```
//!
//! [`PostgresStore::create_table`] runs it (`IF NOT EXISTS`). Nothing in
//! PostgreSQL deletes expired rows by itself: every read and condition
//! compares `expiration_s`, so they are never served, and
//! [`PostgresStore::purge_expired`] deletes them in batches. Schedule it
//! (an EventBridge rule invoking a small function, `pg_cron`), or run
//! `lambda-idempotency --store postgres://… purge-expired` (the `lambda-idempotency-cli` package);
//! it is safe to run concurrently with itself and with traffic.
//!
#![doc = include_str!("docs.md")]

mod codec;
mod connection;
mod errors;
mod partitioned;
mod steps;
mod table;
mod tls;
mod transaction;
mod write;

pub use super::pg::partitioning::{PartitionCleanup, PartitionInfo, Partitioning};
pub use super::pg::refusal::{Refusal, RefusalRules, RefusalSource};
pub use super::transaction::{TransactionLimits, DEFAULT_CLAIM_WAIT, DEFAULT_TIME_LIMIT};
pub use tls::{tls_connector, TlsConnector};
pub use transaction::PgTransaction;
pub use write::{PgValue, PgWrite};
/// The pool and driver crates, for building a pool of your own (TLS, other
/// settings).
pub use {deadpool_postgres, tokio_postgres};

use super::pg::upkeep::Partitions;
use super::pg::{int8, statements::Statements, table::table_name_error, table_size as size};
use super::{
    Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId, RecordedStep,
    Removal, StepWrite, Store, TableSize,
};
use crate::{StoreError, StoreErrorKind};
use codec::{decode, decode_optional, ClaimValues};
use connection::{config, pool};
use deadpool_postgres::{Object, Pool};
use std::sync::Arc;
use tokio_postgres::types::{ToSql, Type};

/// Records in a PostgreSQL table. Cheap to clone.
#[derive(Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    table: String,
    sql: Statements,
    /// `Some` for the partitioned layout.
    partitions: Option<Partitions>,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("table", &self.inner.table)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// A store over `table` (default `idempotency`; an identifier,
    /// optionally schema-qualified), through `pool`.
    pub fn new(pool: Pool, table: impl Into<String>) -> Result<Self, StoreError> {
        let table = table.into();
        if let Some(error) = table_name_error(&table) {
            return Err(StoreError::new(StoreErrorKind::Misconfigured, error));
        }
        Ok(Self::build(pool, table, None))
    }

    fn build(pool: Pool, table: String, partitioning: Option<Partitioning>) -> Self {
        let sql = match partitioning {
            Some(_) => super::pg::partitioned::statements(&table),
            None => Statements::new(&table),
        };
        let partitions = partitioning.map(Partitions::new);
        Self {
            inner: Arc::new(Inner {
                pool,
                sql,
                table,
                partitions,
            }),
        }
    }

    /// A store over `table`, through a new pool of at most `max_size`
    /// connections to `url` (`postgres://user:password@host:port/database`),
    /// without TLS. Connections open on first use. Build it once, in `main`.
    ///
    /// For RDS, Aurora and RDS Proxy, use
    /// [`connect_tls`](PostgresStore::connect_tls).
    pub fn connect(
        url: &str,
        table: impl Into<String>,
        max_size: usize,
    ) -> Result<Self, StoreError> {
        Self::new(pool(config(url)?, max_size, tokio_postgres::NoTls)?, table)
    }

    /// Like [`connect`](PostgresStore::connect), over TLS, trusting the
    /// certificate authorities in `root_certificates` (PEM) and nothing
    /// else: for RDS, Amazon's bundle
    /// (`https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem`,
    /// shipped with the function, for example with `include_bytes!`).
    ///
    /// TLS is required: a URL without `sslmode` (or with `prefer`) is
    /// taken as `sslmode=require`, a server that does not speak TLS is an
    /// error rather than a plain connection, and the certificate's chain
    /// and host name are always verified (libpq's `verify-full`). A URL
    /// that says `sslmode=disable` is a
    /// [`Misconfigured`](StoreErrorKind::Misconfigured) error.
    pub fn connect_tls(
        url: &str,
        table: impl Into<String>,
        max_size: usize,
        root_certificates: &[u8],
    ) -> Result<Self, StoreError> {
        let mut config = config(url)?;
        match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => {
                return Err(StoreError::new(
                    StoreErrorKind::Misconfigured,
                    "connect_tls was given a PostgreSQL URL with sslmode=disable",
                ))
            }
            _ => {
                config.ssl_mode(tokio_postgres::config::SslMode::Require);
            }
        }
        let connector = tls::tls_connector(root_certificates)?;
        Self::new(pool(config, max_size, connector)?, table)
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }
    /// Deletes records that expired before `now_s` (epoch seconds), in
    /// batches of `batch`, until none is left; returns how many. Safe to run
    /// concurrently: each batch skips rows another run holds.
    ///
    /// The partitioned layout deletes no rows: its answer is a
    /// `Misconfigured` error (use
    /// [`drop_expired_partitions`](PostgresStore::drop_expired_partitions)).
    pub async fn purge_expired(&self, now_s: u64, batch: u32) -> Result<u64, StoreError> {
        if self.inner.partitions.is_some() {
            return Err(super::pg::upkeep::purge_refused());
        }
        let client = self.client().await?;
        let now = int8(now_s)?;
        let batch = i64::from(batch.max(1));
        let mut total = 0;
        loop {
            let deleted = client
                .execute_typed(
                    &self.inner.sql.purge,
                    &[(&now, Type::INT8), (&batch, Type::INT8)],
                )
                .await
                .map_err(|e| errors::from_pg("DELETE (purge expired)", e))?;
            total += deleted;
            if deleted < batch as u64 {
                return Ok(total);
            }
        }
    }

    async fn client(&self) -> Result<Object, StoreError> {
        self.inner.pool.get().await.map_err(errors::from_pool)
    }

    /// Runs an answered conditional write.
    async fn answer(
        &self,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        operation: &'static str,
        id: &RecordId,
    ) -> Result<Conditional, StoreError> {
        let client = self.client().await?;
        let rows = match self.inner.partitions {
            None => client.query_typed(sql, params).await,
            Some(_) => Self::locked(&client, &self.inner.table, id.as_str(), sql, params).await,
        };
        let row = rows
            .map_err(|e| errors::from_pg(operation, e))?
            .into_iter()
            .next()
            .ok_or_else(|| {
                StoreError::new(StoreErrorKind::Other, format!("{operation}: no answer row"))
            })?;
        let applied: bool = row
            .try_get("applied")
            .map_err(|e| StoreError::corrupt("the answer has no `applied`").with_source(e))?;
        if applied {
            return Ok(Conditional::Applied);
        }
        Ok(Conditional::Refused(decode_optional(&row)?))
    }

    /// Runs `write` (a statement `RETURNING 1` when it applies) and the
    /// handler's writes in one transaction; a refusal rolls back and reports
    /// the record found.
    async fn transaction(
        &self,
        write: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
        writes: &[PgWrite],
        id: &RecordId,
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        let mut client = self.client().await?;
        let transaction = client
            .transaction()
            .await
            .map_err(|e| errors::from_pg("BEGIN", e))?;
        if self.inner.partitions.is_some() {
            transaction
                .query_typed(
                    super::pg::partitioned::LOCK_RECORD,
                    &[(
                        &super::pg::partitioned::lock_key(&self.inner.table, id.as_str()),
                        Type::INT8,
                    )],
                )
                .await
                .map_err(|e| errors::from_pg("SELECT pg_advisory_xact_lock", e))?;
        }
        let applied = !transaction
            .query_typed(write, params)
            .await
            .map_err(|e| errors::from_pg(operation, e))?
            .is_empty();
        if !applied {
            let rows = transaction
                .query_typed(&self.inner.sql.get, &[(&id.as_str(), Type::TEXT)])
                .await
                .map_err(|e| errors::from_pg("SELECT", e))?;
            let found = rows.first().map(decode).transpose()?;
            transaction
                .rollback()
                .await
                .map_err(|e| errors::from_pg("ROLLBACK", e))?;
            return Ok(Conditional::Refused(found));
        }
        for (index, write) in writes.iter().enumerate() {
            let params: Vec<_> = write.params.iter().map(PgValue::typed).collect();
            if let Err(error) = transaction.execute_typed(&write.sql, &params).await {
                // Dropping the transaction rolls it back.
                return Err(errors::from_write(index, error));
            }
        }
        transaction
            .commit()
            .await
            .map_err(|e| errors::from_pg("COMMIT", e))?;
        Ok(Conditional::Applied)
    }
}

impl Store for PostgresStore {
    type Write = PgWrite;

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
        let values = ClaimValues::of(claim)?;
        let params = values.claim();
        self.inserting(claim.now_ms, || {
            self.answer(&self.inner.sql.claim, &params, "INSERT (claim)", &claim.id)
        })
        .await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        let values = ClaimValues::of(claim)?;
        let lapsed = lapsed.as_str();
        self.answer(
            &self.inner.sql.take_over,
            &values.take_over(&lapsed),
            "UPDATE (take over)",
            &claim.id,
        )
        .await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        let (lease, expiration, now) = (
            int8(extension.lease_until_ms)?,
            int8(extension.expiration_s)?,
            int8(extension.now_ms)?,
        );
        let params: [(&(dyn ToSql + Sync), Type); 5] = [
            (&extension.id.as_str(), Type::TEXT),
            (&extension.owner.as_str(), Type::TEXT),
            (&lease, Type::INT8),
            (&expiration, Type::INT8),
            (&now, Type::INT8),
        ];
        // The partitioned layout's extension also compares the writer's
        // now with the record's expiration.
        let params = match self.inner.partitions {
            Some(_) => &params[..],
            None => &params[..4],
        };
        self.answer(
            &self.inner.sql.extend,
            params,
            "UPDATE (extend)",
            &extension.id,
        )
        .await
    }

    async fn complete(&self, completion: Completion<PgWrite>) -> Result<Conditional, StoreError> {
        let (expiration, now) = (int8(completion.expiration_s)?, int8(completion.now_ms)?);
        let params: [(&(dyn ToSql + Sync), Type); 5] = [
            (&completion.id.as_str(), Type::TEXT),
            (&completion.owner.as_str(), Type::TEXT),
            (&completion.response, Type::BYTEA),
            (&expiration, Type::INT8),
            (&now, Type::INT8),
        ];
        if completion.writes.is_empty() {
            return self
                .answer(
                    &self.inner.sql.complete,
                    &params,
                    "UPDATE (complete)",
                    &completion.id,
                )
                .await;
        }
        self.transaction(
            &self.inner.sql.fenced_complete,
            &params,
            &completion.writes,
            &completion.id,
            "UPDATE (complete)",
        )
        .await
    }

    async fn commit(&self, commit: Commit<PgWrite>) -> Result<Conditional, StoreError> {
        let (expiration, now, now_s) = (
            int8(commit.expiration_s)?,
            int8(commit.now_ms)?,
            int8(commit.now_ms / 1000)?,
        );
        let id = commit.id.as_str();
        let params: [(&(dyn ToSql + Sync), Type); 7] = [
            (&id, Type::TEXT),
            (&commit.owner.as_str(), Type::TEXT),
            (&commit.fingerprint.as_str(), Type::TEXT),
            (&expiration, Type::INT8),
            (&commit.response, Type::BYTEA),
            (&now, Type::INT8),
            (&now_s, Type::INT8),
        ];
        self.inserting(commit.now_ms, || {
            self.transaction(
                &self.inner.sql.commit,
                &params,
                &commit.writes,
                &commit.id,
                "INSERT (commit)",
            )
        })
        .await
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        self.answer(
            &self.inner.sql.release,
            &[(&id.as_str(), Type::TEXT), (&owner.as_str(), Type::TEXT)],
            "DELETE (release)",
            id,
        )
        .await
    }

    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        let sql = match removal {
            Removal::Any => &self.inner.sql.remove_any,
            Removal::UnlessInProgress => &self.inner.sql.remove_unless_in_progress,
        };
        self.answer(sql, &[(&id.as_str(), Type::TEXT)], "DELETE (remove)", id)
            .await
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let client = self.client().await?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = client
            .query_typed(
                &self.inner.sql.list_in_progress,
                &[(&prefix, Type::TEXT), (&limit, Type::INT8)],
            )
            .await
            .map_err(|e| errors::from_pg("SELECT (list in progress)", e))?;
        rows.iter().map(decode).collect()
    }

    /// Two statements on the primary key's index, `query.limit` rows at
    /// most (`pg::abandoned`): the cursor is the last id read.
    async fn list_abandoned(
        &self,
        query: &super::AbandonedQuery,
    ) -> Result<super::AbandonedPage, StoreError> {
        let sql = super::pg::abandoned::AbandonedSql::new(
            &self.inner.table,
            self.inner.partitions.is_some(),
        );
        let client = self.client().await?;
        let after = query.cursor.as_ref().map_or("", |c| c.as_str());
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let read = client
            .query_typed(&sql.read, &[(&after, Type::TEXT), (&limit, Type::INT8)])
            .await
            .map_err(|e| errors::from_pg("SELECT (list abandoned)", e))?;
        let (last, count): (Option<String>, i64) = match read.first() {
            Some(row) => (row.get(0), row.get(1)),
            None => (None, 0),
        };
        let Some(last) = last else {
            return Ok(super::AbandonedPage::default());
        };
        let (before, now_s) = (int8(query.lease_before_ms)?, int8(query.now_ms / 1000)?);
        let rows = client
            .query_typed(
                &sql.rows,
                &[
                    (&after, Type::TEXT),
                    (&last.as_str(), Type::TEXT),
                    (&query.prefix.as_str(), Type::TEXT),
                    (&before, Type::INT8),
                    (&now_s, Type::INT8),
                ],
            )
            .await
            .map_err(|e| errors::from_pg("SELECT (list abandoned)", e))?;
        let records = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        let next = (count >= limit).then(|| super::PageCursor::from_stored(last));
        Ok(super::AbandonedPage::new(records, next))
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query_typed(&self.inner.sql.get, &[(&id.as_str(), Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("SELECT", e))?;
        Ok(rows
            .first()
            .map(decode)
            .transpose()?
            .filter(|record| !record.is_expired(now_ms)))
    }

    /// Estimated from the catalog (`pg_class.reltuples`,
    /// `pg_total_relation_size`), over the partitions in the partitioned
    /// layout: see [`table_size`](mod@super::table_size).
    async fn table_size(&self, _now_ms: u64) -> Result<Option<TableSize>, StoreError> {
        let client = self.client().await?;
        let table = self.inner.table.as_str();
        let rows = client
            .query_typed(size::TABLE_SIZE, &[(&table, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("SELECT (table size)", e))?;
        let row = rows.first().ok_or_else(|| {
            StoreError::new(StoreErrorKind::Other, "SELECT (table size): no answer row")
        })?;
        let read = |e| StoreError::corrupt("the table size answer").with_source(e);
        size::table_size(
            table,
            row.try_get(0).map_err(read)?,
            row.try_get(1).map_err(read)?,
            row.try_get(2).map_err(read)?,
        )
        .map(Some)
    }

    fn transactions(&self) -> Option<&dyn super::Transactions<PgWrite>> {
        Some(self)
    }
}
