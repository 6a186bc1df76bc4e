//! The partitioned layout over tokio-postgres ([`Partitioning`]): each
//! write behind the record's lock, pipelined; the partitions made ahead
//! and on demand; the cleanup that drops whole days; a record's history.
//! The SQL is the PostgreSQL stores' shared one (`pg::partitioned`); the
//! reasons are in the module docs ("A table that never bloats").

use super::{codec::decode, errors, PostgresStore};
use crate::{
    store::{
        pg::{
            partitioned::{
                self, create_partition, is_missing_partition, partition_name, DAY_S, LOCK_UPKEEP,
                MISSING_DAYS,
            },
            table::{shape_error, table_differences},
        },
        Record, RecordId,
    },
    StoreError, StoreErrorKind,
};
use deadpool_postgres::Object;
use std::{sync::atomic::Ordering, time::Duration};
use tokio_postgres::{
    types::{ToSql, Type},
    Row,
};

/// The partitioned layout of the PostgreSQL store
/// ([`PostgresStore::partitioned`]): records in a table partitioned by
/// the day of their claim, whole days dropped once every record in them
/// is past its dedup window (the engine's retention) and the audit
/// window. See "A table that never bloats" in the module docs.
///
/// ```
/// use lambda_idempotency::store::postgres::Partitioning;
/// use std::{sync::atomic::Ordering, time::Duration};
///
/// let partitioning = Partitioning::daily()
///     .audit_window(Duration::from_secs(7 * 86_400))
///     .premake_days(3);
/// # let _ = partitioning;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Partitioning {
    audit_window: Duration,
    premake_days: u32,
}

impl Partitioning {
    /// How much later than a record's expiration its partition may be
    /// dropped, at the least: the premise is that the clocks of the
    /// writers and of the cleanup differ by less (see "Fenced writes on an
    /// expired record" in the module docs).
    pub const CLOCK_SKEW_MARGIN: Duration = Duration::from_secs(300);

    /// One partition a day (midnight to midnight, UTC), an audit window of
    /// 7 days, and 3 days of partitions made ahead.
    pub fn daily() -> Self {
        Self {
            audit_window: Duration::from_secs(7 * DAY_S),
            premake_days: 3,
        }
    }

    /// How long after its claim a record, and its response, stays in the
    /// table for support ([`PostgresStore::history`]), whatever the
    /// engine's retention (the dedup window) is. Its partition goes
    /// once its day ended this long ago and every record in it expired.
    #[must_use]
    pub fn audit_window(mut self, window: Duration) -> Self {
        self.audit_window = window;
        self
    }

    /// How many days of partitions to make ahead of today (at least 1).
    #[must_use]
    pub fn premake_days(mut self, days: u32) -> Self {
        self.premake_days = days.max(1);
        self
    }

    /// The audit window.
    pub fn audit_window_value(&self) -> Duration {
        self.audit_window
    }
}

impl Default for Partitioning {
    fn default() -> Self {
        Self::daily()
    }
}

/// What [`PostgresStore::drop_expired_partitions`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionCleanup {
    /// The partitions created ahead (today and the next days).
    pub created: Vec<String>,
    /// The partitions detached and dropped: every record in them was past
    /// both windows.
    pub dropped: Vec<String>,
    /// The partitions past the audit window kept because a record in them
    /// had not expired (a claim kept alive by its heartbeat).
    pub kept_live: Vec<String>,
}

/// One partition, as [`PostgresStore::partitions`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PartitionInfo {
    /// Its name.
    pub name: String,
    /// The end of its day, epoch seconds (`None` for a DEFAULT partition,
    /// which this layout never makes).
    pub until_s: Option<u64>,
    /// Its size on disk, with its indexes and TOAST, in bytes.
    pub total_bytes: u64,
    /// The planner's estimate of its rows (`reltuples`; -1 before its first
    /// `ANALYZE`).
    pub estimated_rows: i64,
    /// Its dead tuples, as the statistics collector counts them.
    pub dead_tuples: i64,
}

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
        self.inner.partitioning
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
        if self.inner.partitioning.is_none() {
            return write().await;
        }
        self.ensure_day(now_ms / 1000).await?;
        match write().await {
            Err(error) if missing_partition(&error) => {
                self.inner.ensured_through.store(0, Ordering::SeqCst);
                self.ensure_day(now_ms / 1000).await?;
                write().await
            }
            result => result,
        }
    }

    /// Makes the partition of `now_ms`'s day (and the next ones) unless
    /// this store already made or found it: before a claim inside a
    /// transaction, which cannot write again after a failed statement.
    pub(super) async fn ensure_partition_of(&self, now_ms: u64) -> Result<(), StoreError> {
        self.ensure_day(now_ms / 1000).await
    }

    /// Makes the partitions of `now_s`'s day and the next ones, unless
    /// this store already made (or found) them.
    async fn ensure_day(&self, now_s: u64) -> Result<(), StoreError> {
        let day = now_s / DAY_S;
        if day < self.inner.ensured_through.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.ensure_partitions(now_s).await.map(drop)
    }

    /// Creates the partitions of `now_s`'s day and of the next
    /// [`premake_days`](Partitioning::premake_days) where missing; returns
    /// the names of those it created. Safe to run from several processes
    /// at once (they take turns on a lock of the table's). Needs `CREATE`
    /// on the schema only when one is missing.
    pub async fn ensure_partitions(&self, now_s: u64) -> Result<Vec<String>, StoreError> {
        let Some(partitioning) = self.inner.partitioning else {
            return Ok(Vec::new());
        };
        let table = &self.inner.table;
        let first = now_s / DAY_S;
        let days: Vec<i64> = (first..=first + u64::from(partitioning.premake_days))
            .filter_map(|day| i64::try_from(day).ok())
            .collect();
        let mut client = self.client().await?;
        let absent = Self::missing_days(&client, table, &days).await?;
        let mut created = Vec::new();
        if !absent.is_empty() {
            match Self::create_partitions(&mut client, table, &days).await {
                Ok(made) => created = made,
                // Another process made one meanwhile (`42809`, "is already
                // a partition", `42P07`, or an overlap): a fresh look
                // decides.
                Err(error) => {
                    if !Self::missing_days(&client, table, &days).await?.is_empty() {
                        return Err(error);
                    }
                }
            }
        }
        self.inner.ensured_through.fetch_max(
            first + u64::from(partitioning.premake_days),
            Ordering::SeqCst,
        );
        Ok(created)
    }

    /// The `days` no partition of `table` covers.
    async fn missing_days(
        client: &tokio_postgres::Client,
        table: &str,
        days: &[i64],
    ) -> Result<Vec<u64>, StoreError> {
        missing(
            client
                .query_typed(
                    MISSING_DAYS,
                    &[(&table, Type::TEXT), (&days, Type::INT8_ARRAY)],
                )
                .await,
        )
    }

    /// Creates the partitions of the `days` no partition covers, in one
    /// transaction behind the table's upkeep lock.
    async fn create_partitions(
        client: &mut Object,
        table: &str,
        days: &[i64],
    ) -> Result<Vec<String>, StoreError> {
        let transaction = client
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
        let Some(partitioning) = self.inner.partitioning else {
            return Err(StoreError::new(
                StoreErrorKind::Misconfigured,
                "drop_expired_partitions is for the partitioned layout \
                 (PostgresStore::partitioned); a plain table is purged with purge_expired",
            ));
        };
        let created = self.ensure_partitions(now_s).await?;
        let table = &self.inner.table;
        let client = self.client().await?;
        let concurrently: bool = client
            .query_typed(partitioned::CAN_DETACH_CONCURRENTLY, &[(table, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("SELECT (server version)", e))?
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or(false);
        let audit_s = partitioning.audit_window.as_secs();
        let margin_s = Partitioning::CLOCK_SKEW_MARGIN.as_secs();
        let mut cleanup = PartitionCleanup {
            created,
            ..PartitionCleanup::default()
        };
        for (name, until_s, pending) in Self::partition_bounds(&client, table).await? {
            let Some(until_s) = until_s else { continue };
            if until_s.saturating_add(audit_s) > now_s {
                continue;
            }
            let newest_expiration: i64 = client
                .query_typed(
                    &format!("SELECT coalesce(max(expiration_s), 0) FROM {name}"),
                    &[],
                )
                .await
                .map_err(|e| errors::from_pg("SELECT max(expiration_s)", e))?
                .first()
                .and_then(|row| row.try_get(0).ok())
                .unwrap_or(i64::MAX);
            if newest_expiration.saturating_add(margin_s as i64) >= now_s as i64 {
                cleanup.kept_live.push(name);
                continue;
            }
            let detach = if pending {
                format!("ALTER TABLE {table} DETACH PARTITION {name} FINALIZE")
            } else if concurrently {
                format!("ALTER TABLE {table} DETACH PARTITION {name} CONCURRENTLY")
            } else {
                format!(
                    "BEGIN; SET LOCAL lock_timeout = 2000; \
                     ALTER TABLE {table} DETACH PARTITION {name}; COMMIT"
                )
            };
            client
                .batch_execute(&detach)
                .await
                .map_err(|e| errors::from_pg("ALTER TABLE … DETACH PARTITION", e))?;
            client
                .batch_execute(&format!("DROP TABLE {name}"))
                .await
                .map_err(|e| errors::from_pg("DROP TABLE (partition)", e))?;
            cleanup.dropped.push(name);
        }
        Ok(cleanup)
    }

    async fn partition_bounds(
        client: &Object,
        table: &str,
    ) -> Result<Vec<(String, Option<u64>, bool)>, StoreError> {
        let rows = client
            .query_typed(partitioned::PARTITIONS, &[(&table, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("SELECT (partitions)", e))?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let name: String = row.try_get(0).ok()?;
                let until: Option<i64> = row.try_get(1).ok()?;
                let pending: bool = row.try_get(2).ok()?;
                Some((name, until.and_then(|s| u64::try_from(s).ok()), pending))
            })
            .collect())
    }

    /// The partitions of the table, oldest first, with their sizes and
    /// dead tuples: the operator tool's `partitions`, and a gauge of the
    /// table's size.
    pub async fn partitions(&self) -> Result<Vec<PartitionInfo>, StoreError> {
        let client = self.client().await?;
        let mut report = Vec::new();
        for (name, until_s, _) in Self::partition_bounds(&client, &self.inner.table).await? {
            let row = client
                .query_typed(
                    "SELECT pg_total_relation_size($1::regclass), \
                            (SELECT reltuples::bigint FROM pg_class WHERE oid = $1::regclass), \
                            coalesce((SELECT n_dead_tup FROM pg_stat_all_tables \
                                      WHERE relid = $1::regclass), 0)",
                    &[(&name, Type::TEXT)],
                )
                .await
                .map_err(|e| errors::from_pg("SELECT (partition size)", e))?;
            let row = row.first();
            let get = |i| {
                row.and_then(|row| row.try_get::<_, i64>(i).ok())
                    .unwrap_or(0)
            };
            report.push(PartitionInfo {
                name,
                until_s,
                total_bytes: u64::try_from(get(0)).unwrap_or(0),
                estimated_rows: get(1),
                dead_tuples: get(2),
            });
        }
        Ok(report)
    }

    /// Every record the table keeps for `id`, newest first, expired ones
    /// included: in the partitioned layout, the record and those it
    /// replaced, until the audit window drops them (what support looks
    /// at); in a plain table, the record until it is purged.
    pub async fn history(&self, id: &RecordId) -> Result<Vec<Record>, StoreError> {
        let client = self.client().await?;
        let sql = match self.inner.partitioning {
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
    pub(super) async fn create_partitioned_table(&self) -> Result<(), StoreError> {
        let table = &self.inner.table;
        let client = self.client().await?;
        client
            .batch_execute(&partitioned::table_ddl(table))
            .await
            .map_err(|e| errors::from_pg("CREATE TABLE (partitioned)", e))?;
        let kind = client
            .query_typed(partitioned::TABLE_KIND, &[(table, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("read the table's kind", e))?;
        let (relkind, key): (String, Option<String>) = kind
            .first()
            .and_then(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?)))
            .unwrap_or_default();
        let mut differences = Vec::new();
        if relkind != "p" || key.as_deref() != Some("RANGE (claimed_at)") {
            differences.push(format!(
                "it is not partitioned by RANGE (claimed_at) (the partitioned layout's table; a \
                 plain table is the plain store's: relkind {relkind:?}, key {key:?})"
            ));
        } else {
            let found: Vec<(String, String, bool)> = super::table::columns_of(&client, table)
                .await?
                .into_iter()
                .filter(|(name, _, _)| name != "claimed_at")
                .collect();
            let unique: bool = client
                .query_typed(partitioned::ID_DAY_IS_UNIQUE, &[(table, Type::TEXT)])
                .await
                .map_err(|e| errors::from_pg("read the table's indexes", e))?
                .first()
                .and_then(|row| row.try_get(0).ok())
                .unwrap_or(false);
            differences = table_differences(&found, true);
            if !unique {
                differences.push("`(id, claimed_at)` is not the primary key".to_owned());
            }
        }
        if let Some(error) = shape_error(table, &differences) {
            return Err(error);
        }
        drop(client);
        self.ensure_partitions(crate::clock::Clock::now_ms(&crate::SystemClock) / 1000)
            .await
            .map(drop)
    }
}
