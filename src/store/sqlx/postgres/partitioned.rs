//! The partitioned layout over sqlx (`Partitioning`, the tokio-postgres
//! store's option): each write behind the record's lock, the partitions'
//! upkeep (`pg::upkeep`, shared with the tokio-postgres store) over a
//! pooled connection, a record's history. The SQL is the PostgreSQL
//! stores' shared one (`pg::partitioned`); why it is built this way: "A
//! table that never bloats" in the tokio-postgres store's docs.
//!
//! The upkeep's statements go as simple queries, their values written in
//! (`query::fill`), whatever
//! [`prepared_statements`](SqlxPostgresStore::prepared_statements) says:
//! they are rare, and a simple query is one exchange through any pooler.

use super::{
    codec::decode,
    errors::from_sqlx,
    query::{
        Query,
        Value::{self, Text},
    },
    SqlxPostgresStore,
};
use crate::{
    store::{
        pg::{
            partitioned::{
                self, create_partition, is_missing_partition, newest_expiration, partition_name,
                LOCK_UPKEEP, MISSING_DAYS, PARTITIONS, PARTITION_SIZE, TABLE_KIND,
            },
            partitioning::{PartitionCleanup, PartitionInfo, Partitioning},
            table::COLUMNS_QUERY,
            upkeep::{self, Bound, Catalog},
        },
        Record, RecordId,
    },
    StoreError,
};
use sqlx::{
    postgres::{PgDatabaseError, PgRow},
    Connection, Executor, PgConnection, Row,
};

/// `sql` with `values`, as a simple query on `connection`; its rows.
async fn simple(
    connection: &mut PgConnection,
    sql: &str,
    values: &[Value<'_>],
    operation: &'static str,
) -> Result<Vec<PgRow>, StoreError> {
    Query::new(sql, values, false)?
        .fetch_all(&mut *connection)
        .await
        .map_err(|e| from_sqlx(operation, e))
}

/// The days of rows of [`MISSING_DAYS`].
fn days_of(rows: &[PgRow]) -> Vec<u64> {
    rows.iter()
        .filter_map(|row| row.try_get::<i64, _>(0).ok())
        .filter_map(|day| u64::try_from(day).ok())
        .collect()
}

/// `days` as a `bigint[]` literal's text, for [`MISSING_DAYS`]'s `$2`.
fn array(days: &[i64]) -> String {
    let days: Vec<String> = days.iter().map(i64::to_string).collect();
    format!("{{{}}}", days.join(","))
}

/// Whether a store error comes from a row with no partition to go to.
pub(super) fn missing_partition(error: &StoreError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(db) = error
            .downcast_ref::<sqlx::Error>()
            .and_then(|error| error.as_database_error())
            .and_then(|db| db.try_downcast_ref::<PgDatabaseError>())
        {
            return is_missing_partition(db.code(), db.message());
        }
        cause = error.source();
    }
    false
}

/// A pooled connection running the upkeep's statements.
impl Catalog for PgConnection {
    async fn batch(&mut self, sql: &str, operation: &'static str) -> Result<(), StoreError> {
        Executor::execute(&mut *self, sqlx::raw_sql(sql))
            .await
            .map_err(|e| from_sqlx(operation, e))?;
        Ok(())
    }

    async fn flag(
        &mut self,
        sql: &str,
        table: &str,
        operation: &'static str,
    ) -> Result<bool, StoreError> {
        Ok(simple(self, sql, &[Text(table)], operation)
            .await?
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or(false))
    }

    async fn newest_expiration(&mut self, name: &str) -> Result<i64, StoreError> {
        Ok(simple(
            self,
            &newest_expiration(name),
            &[],
            "SELECT max(expiration_s)",
        )
        .await?
        .first()
        .and_then(|row| row.try_get(0).ok())
        .unwrap_or(i64::MAX))
    }

    async fn missing_days(&mut self, table: &str, days: &[i64]) -> Result<Vec<u64>, StoreError> {
        let days = array(days);
        let rows = simple(
            self,
            MISSING_DAYS,
            &[Text(table), Text(&days)],
            "SELECT (missing partitions)",
        )
        .await?;
        Ok(days_of(&rows))
    }

    async fn create_missing(
        &mut self,
        table: &str,
        days: &[i64],
    ) -> Result<Vec<String>, StoreError> {
        // sqlx's transaction: dropped unfinished, it rolls back.
        let mut transaction = self.begin().await.map_err(|e| from_sqlx("BEGIN", e))?;
        simple(
            &mut transaction,
            LOCK_UPKEEP,
            &[Text(table)],
            "SELECT pg_advisory_xact_lock",
        )
        .await?;
        // Another process may have made them while this one waited.
        let days = array(days);
        let missing = days_of(
            &simple(
                &mut transaction,
                MISSING_DAYS,
                &[Text(table), Text(&days)],
                "SELECT (missing partitions)",
            )
            .await?,
        );
        let mut created = Vec::new();
        for day in missing {
            Executor::execute(
                &mut *transaction,
                sqlx::raw_sql(&create_partition(table, day)),
            )
            .await
            .map_err(|e| from_sqlx("CREATE TABLE (partition)", e))?;
            created.push(partition_name(table, day));
        }
        transaction
            .commit()
            .await
            .map_err(|e| from_sqlx("COMMIT", e))?;
        Ok(created)
    }

    async fn bounds(&mut self, table: &str) -> Result<Vec<Bound>, StoreError> {
        let rows = simple(self, PARTITIONS, &[Text(table)], "SELECT (partitions)").await?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let until: Option<i64> = row.try_get(1).ok()?;
                Some(Bound {
                    name: row.try_get(0).ok()?,
                    until_s: until.and_then(|s| u64::try_from(s).ok()),
                    pending: row.try_get(2).ok()?,
                })
            })
            .collect())
    }

    async fn sizes(&mut self, name: &str) -> Result<(i64, i64, i64), StoreError> {
        let rows = simple(
            self,
            PARTITION_SIZE,
            &[Text(name)],
            "SELECT (partition size)",
        )
        .await?;
        let get = |i: usize| {
            rows.first()
                .and_then(|row| row.try_get::<i64, _>(i).ok())
                .unwrap_or(0)
        };
        Ok((get(0), get(1), get(2)))
    }

    async fn kind(&mut self, table: &str) -> Result<(String, Option<String>), StoreError> {
        Ok(
            simple(self, TABLE_KIND, &[Text(table)], "read the table's kind")
                .await?
                .first()
                .and_then(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?)))
                .unwrap_or_default(),
        )
    }

    async fn columns(&mut self, table: &str) -> Result<Vec<(String, String, bool)>, StoreError> {
        Ok(simple(
            self,
            COLUMNS_QUERY,
            &[Text(table)],
            "read the table's columns",
        )
        .await?
        .iter()
        .filter_map(|row| {
            Some((
                row.try_get(0).ok()?,
                row.try_get(1).ok()?,
                row.try_get(2).ok()?,
            ))
        })
        .collect())
    }
}

impl SqlxPostgresStore {
    /// The same store over the partitioned layout: records in a table
    /// partitioned by day ([`Partitioning`]), the tokio-postgres store's
    /// layout, table and statements (either store serves a table the other
    /// made). The SQL is another than the plain table's, so a partitioned
    /// store and a plain one never share a table
    /// ([`create_table`](SqlxPostgresStore::create_table) refuses the
    /// other's).
    #[must_use]
    pub fn partitioned(self, partitioning: Partitioning) -> Self {
        let inner = &self.inner;
        Self::build(
            inner.pool.clone(),
            inner.table.clone(),
            inner.prepared,
            Some(partitioning),
        )
    }

    /// The layout's partitioning, when the store is partitioned.
    pub fn partitioning(&self) -> Option<Partitioning> {
        self.inner
            .partitions
            .as_ref()
            .map(|partitions| partitions.partitioning)
    }

    /// Runs `sql` with `values` behind the record's lock, in a transaction
    /// of its own; its rows. A simple query (the default): the lock and
    /// the statement in one message, one round trip, one implicit
    /// transaction. Prepared: `BEGIN` with the lock (one simple query), the
    /// statement, `COMMIT`: three round trips.
    pub(super) async fn locked_rows(
        &self,
        id: &RecordId,
        sql: &str,
        values: &[Value<'_>],
        operation: &'static str,
    ) -> Result<Vec<PgRow>, StoreError> {
        let table = &self.inner.table;
        match self.query(sql, values)? {
            Query::Simple(sql) => {
                let mut connection = self
                    .inner
                    .pool
                    .acquire()
                    .await
                    .map_err(|e| from_sqlx("acquire a connection", e))?;
                Query::Simple(sql)
                    .fetch_all_after(
                        &partitioned::lock_record(table, id.as_str()),
                        &mut connection,
                    )
                    .await
                    .map_err(|e| from_sqlx(operation, e))
            }
            prepared => {
                // sqlx's transaction: dropped unfinished, it rolls back.
                let mut transaction = self
                    .inner
                    .pool
                    .begin_with(partitioned::begin_locked(table, id.as_str()))
                    .await
                    .map_err(|e| from_sqlx("BEGIN (the record's lock)", e))?;
                let rows = prepared
                    .fetch_all(&mut *transaction)
                    .await
                    .map_err(|e| from_sqlx(operation, e))?;
                transaction
                    .commit()
                    .await
                    .map_err(|e| from_sqlx("COMMIT", e))?;
                Ok(rows)
            }
        }
    }

    /// Runs a write that may insert a row of the day of `now_ms`: its
    /// partition is made first when the store has not made it yet, and
    /// made then written again when the row found none (a partition
    /// dropped by hand).
    pub(super) async fn inserting<T, F, Fut>(&self, now_ms: u64, write: F) -> Result<T, StoreError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, StoreError>>,
    {
        match &self.inner.partitions {
            None => write().await,
            Some(partitions) => {
                let ensure = || async { self.ensure_partitions(now_ms / 1000).await.map(drop) };
                partitions
                    .inserting(now_ms, ensure, write, missing_partition)
                    .await
            }
        }
    }

    /// Makes the partition of `now_ms`'s day (and the next ones) unless
    /// this store already made or found it: before a claim inside a
    /// transaction, which cannot write again after a failed statement.
    pub(super) async fn ensure_partition_of(&self, now_ms: u64) -> Result<(), StoreError> {
        match &self.inner.partitions {
            Some(partitions) if partitions.needs_partition_of(now_ms) => {
                self.ensure_partitions(now_ms / 1000).await.map(drop)
            }
            _ => Ok(()),
        }
    }

    async fn connection(&self) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, StoreError> {
        self.inner
            .pool
            .acquire()
            .await
            .map_err(|e| from_sqlx("acquire a connection", e))
    }

    /// Creates the partitions of `now_s`'s day and of the next
    /// [`premake_days`](Partitioning::premake_days) where missing; returns
    /// the names of those it created. Safe to run from several processes
    /// at once, and beside the tokio-postgres store (they take turns on a
    /// lock of the table's). Needs `CREATE` on the schema only when one is
    /// missing. A plain store creates none.
    pub async fn ensure_partitions(&self, now_s: u64) -> Result<Vec<String>, StoreError> {
        let Some(partitions) = &self.inner.partitions else {
            return Ok(Vec::new());
        };
        let mut connection = self.connection().await?;
        partitions
            .ensure(&mut *connection, &self.inner.table, now_s)
            .await
    }

    /// The upkeep of the partitioned layout, to schedule (daily, or more
    /// often: it only acts when there is something to do): creates the
    /// partitions ahead
    /// ([`ensure_partitions`](SqlxPostgresStore::ensure_partitions)), then
    /// detaches and drops each partition whose day ended more than the
    /// audit window before `now_s` and whose records all expired more than
    /// [`CLOCK_SKEW_MARGIN`](Partitioning::CLOCK_SKEW_MARGIN) before it.
    /// Detaches `CONCURRENTLY` where the server allows it (PostgreSQL 14
    /// and later, no DEFAULT partition), else under a `lock_timeout` of
    /// 2 s. The same upkeep as the tokio-postgres store's. A plain store's
    /// answer is a `Misconfigured` error: use
    /// [`purge_expired`](SqlxPostgresStore::purge_expired).
    pub async fn drop_expired_partitions(
        &self,
        now_s: u64,
    ) -> Result<PartitionCleanup, StoreError> {
        let Some(partitions) = &self.inner.partitions else {
            return Err(upkeep::not_partitioned());
        };
        let mut connection = self.connection().await?;
        partitions
            .drop_expired(&mut *connection, &self.inner.table, now_s)
            .await
    }

    /// The partitions of the table, oldest first, with their sizes and
    /// dead tuples (what the operator tool's `partitions` lists). Their
    /// rows and bytes summed are the table-size gauge's figure
    /// ([`Store::table_size`](crate::store::Store::table_size)), which
    /// reads them in one catalog query.
    pub async fn partitions(&self) -> Result<Vec<PartitionInfo>, StoreError> {
        let mut connection = self.connection().await?;
        upkeep::report(&mut *connection, &self.inner.table).await
    }

    /// Every record the table keeps for `id`, newest first, expired ones
    /// included: in the partitioned layout, the record and those it
    /// replaced, until the audit window drops them (what support looks
    /// at); in a plain table, the record until it is purged.
    pub async fn history(&self, id: &RecordId) -> Result<Vec<Record>, StoreError> {
        let sql = match self.inner.partitions {
            Some(_) => partitioned::history(&self.inner.table),
            None => self.inner.sql.get.clone(),
        };
        self.rows(&sql, &[Text(id.as_str())], "SELECT (history)")
            .await?
            .iter()
            .map(decode)
            .collect()
    }

    /// Creates the partitioned table, checks its shape, and makes the
    /// partitions ahead.
    pub(super) async fn create_partitioned_table(&self) -> Result<(), StoreError> {
        let Some(partitions) = &self.inner.partitions else {
            return Ok(());
        };
        let mut connection = self.connection().await?;
        let now_s = crate::clock::Clock::now_ms(&crate::SystemClock) / 1000;
        partitions
            .create_table(&mut *connection, &self.inner.table, now_s)
            .await
    }
}
