//! The partitioned layout over tokio-postgres (`Partitioning`): each
//! write behind the record's lock, pipelined; the partitions' upkeep
//! (shared with the sqlx store, `pg::upkeep`) over a pooled connection; a
//! record's history. The SQL is the PostgreSQL stores' shared one
//! (`pg::partitioned`); the reasons are in the module docs ("A table that
//! never bloats").

use super::{codec::decode, errors, table::columns_of, PostgresStore};
use crate::{
    store::{
        pg::{
            partitioned::{
                self, create_partition, is_missing_partition, newest_expiration, partition_name,
                LOCK_UPKEEP, MISSING_DAYS, PARTITIONS, PARTITION_SIZE, TABLE_KIND,
            },
            partitioning::{PartitionCleanup, PartitionInfo, Partitioning},
            upkeep::{self, Bound, Catalog, Partitions},
        },
        Record, RecordId,
    },
    StoreError,
};
use deadpool_postgres::Object;
use tokio_postgres::{
    types::{ToSql, Type},
    Row,
};

/// The days a query of [`MISSING_DAYS`] found no partition for.
fn missing(rows: Result<Vec<Row>, tokio_postgres::Error>) -> Result<Vec<u64>, StoreError> {
    Ok(rows
        .map_err(|e| errors::from_pg("SELECT (missing partitions)", e))?
        .iter()
        .filter_map(|row| row.try_get::<_, i64>(0).ok())
        .filter_map(|day| u64::try_from(day).ok())
        .collect())
}

/// Whether a store error comes from a row with no partition to go to.
fn missing_partition(error: &StoreError) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if let Some(db) = error
            .downcast_ref::<tokio_postgres::Error>()
            .and_then(|error| error.as_db_error())
        {
            return is_missing_partition(db.code().code(), db.message());
        }
        cause = error.source();
    }
    false
}

/// A pooled connection running the upkeep's statements.
impl Catalog for Object {
    async fn batch(&mut self, sql: &str, operation: &'static str) -> Result<(), StoreError> {
        self.batch_execute(sql)
            .await
            .map_err(|e| errors::from_pg(operation, e))
    }

    async fn flag(
        &mut self,
        sql: &str,
        table: &str,
        operation: &'static str,
    ) -> Result<bool, StoreError> {
        Ok(self
            .query_typed(sql, &[(&table, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg(operation, e))?
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or(false))
    }

    async fn newest_expiration(&mut self, name: &str) -> Result<i64, StoreError> {
        Ok(self
            .query_typed(&newest_expiration(name), &[])
            .await
            .map_err(|e| errors::from_pg("SELECT max(expiration_s)", e))?
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or(i64::MAX))
    }

    async fn missing_days(&mut self, table: &str, days: &[i64]) -> Result<Vec<u64>, StoreError> {
        missing(
            self.query_typed(
                MISSING_DAYS,
                &[(&table, Type::TEXT), (&days, Type::INT8_ARRAY)],
            )
            .await,
        )
    }

    async fn create_missing(
        &mut self,
        table: &str,
        days: &[i64],
    ) -> Result<Vec<String>, StoreError> {
        let transaction = self
            .transaction()
            .await
            .map_err(|e| errors::from_pg("BEGIN", e))?;
        transaction
            .query_typed(LOCK_UPKEEP, &[(&table, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("SELECT pg_advisory_xact_lock", e))?;
        // Another process may have made them while this one waited.
        let missing = missing(
            transaction
                .query_typed(
                    MISSING_DAYS,
                    &[(&table, Type::TEXT), (&days, Type::INT8_ARRAY)],
                )
                .await,
        )?;
        let mut created = Vec::new();
        for day in missing {
            transaction
                .batch_execute(&create_partition(table, day))
                .await
                .map_err(|e| errors::from_pg("CREATE TABLE (partition)", e))?;
            created.push(partition_name(table, day));
        }
        transaction
            .commit()
            .await
            .map_err(|e| errors::from_pg("COMMIT", e))?;
        Ok(created)
    }

    async fn bounds(&mut self, table: &str) -> Result<Vec<Bound>, StoreError> {
        let rows = self
            .query_typed(PARTITIONS, &[(&table, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("SELECT (partitions)", e))?;
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
        let rows = self
            .query_typed(PARTITION_SIZE, &[(&name, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("SELECT (partition size)", e))?;
        let get = |i| {
            rows.first()
                .and_then(|row| row.try_get::<_, i64>(i).ok())
                .unwrap_or(0)
        };
        Ok((get(0), get(1), get(2)))
    }

    async fn kind(&mut self, table: &str) -> Result<(String, Option<String>), StoreError> {
        Ok(self
            .query_typed(TABLE_KIND, &[(&table, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("read the table's kind", e))?
            .first()
            .and_then(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?)))
            .unwrap_or_default())
    }

    async fn columns(&mut self, table: &str) -> Result<Vec<(String, String, bool)>, StoreError> {
        columns_of(self, table).await
    }
}

impl PostgresStore {
    /// The same store over the partitioned layout: records in a table
    /// partitioned by day ([`Partitioning`]). The SQL is another, so a
    /// partitioned store and a plain one never share a table
    /// ([`create_table`](PostgresStore::create_table) refuses the other's).
    #[must_use]
    pub fn partitioned(self, partitioning: Partitioning) -> Self {
        let inner = &self.inner;
        Self::build(inner.pool.clone(), inner.table.clone(), Some(partitioning))
    }

    /// The layout's partitioning, when the store is partitioned.
    pub fn partitioning(&self) -> Option<Partitioning> {
        self.inner
            .partitions
            .as_ref()
            .map(|partitions| partitions.partitioning)
    }

    /// Runs `sql` behind the record's lock, in a transaction of its own:
    /// `BEGIN` with the lock (one simple query), the statement and `COMMIT`
    /// sent together (one round trip). Each is sent when first polled, and `join!` polls them
    /// in order, so the server runs them in order; a failed one aborts
    /// the transaction and `COMMIT` then rolls it back.
    pub(super) async fn locked(
        client: &tokio_postgres::Client,
        table: &str,
        id: &str,
        sql: &str,
        params: &[(&(dyn ToSql + Sync), Type)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let begin = partitioned::begin_locked(table, id);
        let (begin, rows, commit) = tokio::join!(
            client.batch_execute(&begin),
            client.query_typed(sql, params),
            client.batch_execute("COMMIT"),
        );
        begin?;
        let rows = rows?;
        commit?;
        Ok(rows)
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

    /// Creates the partitions of `now_s`'s day and of the next
    /// [`premake_days`](Partitioning::premake_days) where missing; returns
    /// the names of those it created. Safe to run from several processes
    /// at once (they take turns on a lock of the table's). Needs `CREATE`
    /// on the schema only when one is missing.
    pub async fn ensure_partitions(&self, now_s: u64) -> Result<Vec<String>, StoreError> {
        let Some(partitions) = &self.inner.partitions else {
            return Ok(Vec::new());
        };
        let mut client = self.client().await?;
        partitions
            .ensure(&mut client, &self.inner.table, now_s)
            .await
    }

    /// The upkeep of the partitioned layout, to schedule (daily, or more
    /// often: it only acts when there is something to do): creates the
    /// partitions ahead ([`ensure_partitions`](PostgresStore::ensure_partitions)),
    /// then detaches and drops each partition whose day ended more than
    /// the audit window before `now_s` and whose records all expired more
    /// than [`CLOCK_SKEW_MARGIN`](Partitioning::CLOCK_SKEW_MARGIN) before
    /// it. Detaches `CONCURRENTLY` where the server allows it (PostgreSQL
    /// 14 and later, no DEFAULT partition), else under a `lock_timeout` of
    /// 2 s. A plain store's answer is a `Misconfigured` error: use
    /// [`purge_expired`](PostgresStore::purge_expired).
    pub async fn drop_expired_partitions(
        &self,
        now_s: u64,
    ) -> Result<PartitionCleanup, StoreError> {
        let Some(partitions) = &self.inner.partitions else {
            return Err(upkeep::not_partitioned());
        };
        let mut client = self.client().await?;
        partitions
            .drop_expired(&mut client, &self.inner.table, now_s)
            .await
    }

    /// The partitions of the table, oldest first, with their sizes and
    /// dead tuples: the operator tool's `partitions`. Their rows and bytes
    /// summed are the table-size gauge's figure
    /// ([`Store::table_size`](crate::store::Store::table_size)), which
    /// reads them in one catalog query.
    pub async fn partitions(&self) -> Result<Vec<PartitionInfo>, StoreError> {
        let mut client = self.client().await?;
        upkeep::report(&mut client, &self.inner.table).await
    }

    /// Every record the table keeps for `id`, newest first, expired ones
    /// included: in the partitioned layout, the record and those it
    /// replaced, until the audit window drops them (what support looks
    /// at); in a plain table, the record until it is purged.
    pub async fn history(&self, id: &RecordId) -> Result<Vec<Record>, StoreError> {
        let client = self.client().await?;
        let sql = match self.inner.partitions {
            Some(_) => partitioned::history(&self.inner.table),
            None => self.inner.sql.get.clone(),
        };
        client
            .query_typed(&sql, &[(&id.as_str(), Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("SELECT (history)", e))?
            .iter()
            .map(decode)
            .collect()
    }

    /// Creates the partitioned table and the partitions ahead, then checks
    /// the table's shape.
    pub(super) async fn create_partitioned_table(
        &self,
        partitions: &Partitions,
    ) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let now_s = crate::clock::Clock::now_ms(&crate::SystemClock) / 1000;
        partitions
            .create_table(&mut client, &self.inner.table, now_s)
            .await
    }
}
