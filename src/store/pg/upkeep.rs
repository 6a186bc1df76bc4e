//! The partitioned layout's upkeep, written once for both PostgreSQL
//! stores: which days get a partition and when, which partitions go and
//! how they are detached, what the partitions report says, and what the
//! table must look like. A driver lends a [`Catalog`] (one of its
//! connections, running the shared statements of `pg::partitioned`); the
//! decisions are here. Why it is built this way: the tokio-postgres
//! store's docs ("A table that never bloats").

use super::{
    partitioned::{table_ddl, CAN_DETACH_CONCURRENTLY, DAY_S, ID_DAY_IS_UNIQUE},
    partitioning::{PartitionCleanup, PartitionInfo, Partitioning},
    table::{shape_error, table_differences},
};
use crate::{StoreError, StoreErrorKind};
use std::{
    future::Future,
    sync::atomic::{AtomicU64, Ordering},
};

/// A partition as the catalog has it ([`super::partitioned::PARTITIONS`]).
pub(crate) struct Bound {
    /// Its name, as `regclass` prints it.
    pub(crate) name: String,
    /// The end of its range, epoch seconds; `None` for a DEFAULT partition.
    pub(crate) until_s: Option<u64>,
    /// Whether a detach of it is pending (an interrupted `CONCURRENTLY`).
    pub(crate) pending: bool,
}

/// One connection of a driver's, running the upkeep's statements (each the
/// shared SQL of `pg::partitioned`, its parameters as the statement says).
pub(crate) trait Catalog {
    /// Runs statements without parameters, as one simple query.
    async fn batch(&mut self, sql: &str, operation: &'static str) -> Result<(), StoreError>;

    /// The first column of the first row of `sql` over `$1 = table`, a
    /// `bool`; `false` without a row.
    async fn flag(
        &mut self,
        sql: &str,
        table: &str,
        operation: &'static str,
    ) -> Result<bool, StoreError>;

    /// The newest `expiration_s` in the partition `name` (0 when empty).
    async fn newest_expiration(&mut self, name: &str) -> Result<i64, StoreError>;

    /// The `days` (days since 1970-01-01) no partition of `table` covers
    /// ([`MISSING_DAYS`](super::partitioned::MISSING_DAYS)).
    async fn missing_days(&mut self, table: &str, days: &[i64]) -> Result<Vec<u64>, StoreError>;

    /// In one transaction of the driver's (rolled back when it fails or
    /// is dropped): the table's upkeep lock
    /// ([`LOCK_UPKEEP`](super::partitioned::LOCK_UPKEEP)), then
    /// [`create_partition`](super::partitioned::create_partition) of each
    /// of `days` still missing; the names of those created.
    async fn create_missing(
        &mut self,
        table: &str,
        days: &[i64],
    ) -> Result<Vec<String>, StoreError>;

    /// The partitions of `table`
    /// ([`PARTITIONS`](super::partitioned::PARTITIONS)).
    async fn bounds(&mut self, table: &str) -> Result<Vec<Bound>, StoreError>;

    /// The partition's total size in bytes, estimated rows and dead
    /// tuples ([`PARTITION_SIZE`](super::partitioned::PARTITION_SIZE)).
    async fn sizes(&mut self, name: &str) -> Result<(i64, i64, i64), StoreError>;

    /// The table's kind and partition key
    /// ([`TABLE_KIND`](super::partitioned::TABLE_KIND)).
    async fn kind(&mut self, table: &str) -> Result<(String, Option<String>), StoreError>;

    /// The table's columns: name, type, nullable
    /// ([`COLUMNS_QUERY`](super::table::COLUMNS_QUERY)).
    async fn columns(&mut self, table: &str) -> Result<Vec<(String, String, bool)>, StoreError>;
}

/// A partitioned store's layout: its option, and the days it has made or
/// found partitions for.
#[derive(Debug)]
pub(crate) struct Partitions {
    pub(crate) partitioning: Partitioning,
    /// The day after the last one whose partition this store made or found
    /// (days since 1970-01-01, UTC): claims before it need no catalog
    /// query.
    ensured_through: AtomicU64,
}

impl Partitions {
    pub(crate) fn new(partitioning: Partitioning) -> Self {
        Self {
            partitioning,
            ensured_through: AtomicU64::new(0),
        }
    }

    /// Whether the partition of `now_s`'s day is known to be there.
    fn covers(&self, now_s: u64) -> bool {
        now_s / DAY_S < self.ensured_through.load(Ordering::SeqCst)
    }

    /// The days from `now_s`'s, as many as are made ahead.
    fn days(&self, now_s: u64) -> Vec<i64> {
        let first = now_s / DAY_S;
        (first..=first + self.partitioning.premake())
            .filter_map(|day| i64::try_from(day).ok())
            .collect()
    }

    /// Makes the partitions of `now_s`'s day and of the next
    /// `premake_days` where missing; the names of those it created. Safe
    /// to run from several processes at once (they take turns on the
    /// table's upkeep lock).
    pub(crate) async fn ensure<C: Catalog>(
        &self,
        catalog: &mut C,
        table: &str,
        now_s: u64,
    ) -> Result<Vec<String>, StoreError> {
        let days = self.days(now_s);
        let mut created = Vec::new();
        if !catalog.missing_days(table, &days).await?.is_empty() {
            match catalog.create_missing(table, &days).await {
                Ok(made) => created = made,
                // Another process made one meanwhile (`42809`, "is already
                // a partition", `42P07`, or an overlap): a fresh look
                // decides.
                Err(error) => {
                    if !catalog.missing_days(table, &days).await?.is_empty() {
                        return Err(error);
                    }
                }
            }
        }
        self.ensured_through.fetch_max(
            now_s / DAY_S + self.partitioning.premake(),
            Ordering::SeqCst,
        );
        Ok(created)
    }

    /// Runs `write`, a write that may insert a row of the day of `now_ms`:
    /// its partition is made first (`ensure`) when the store has not made
    /// it yet, and made then written once more when the row found none
    /// (`missing`: a partition dropped by hand).
    pub(crate) async fn inserting<T, E, EF, W, WF>(
        &self,
        now_ms: u64,
        ensure: E,
        write: W,
        missing: fn(&StoreError) -> bool,
    ) -> Result<T, StoreError>
    where
        E: Fn() -> EF,
        EF: Future<Output = Result<(), StoreError>>,
        W: Fn() -> WF,
        WF: Future<Output = Result<T, StoreError>>,
    {
        if !self.covers(now_ms / 1000) {
            ensure().await?;
        }
        match write().await {
            Err(error) if missing(&error) => {
                self.ensured_through.store(0, Ordering::SeqCst);
                ensure().await?;
                write().await
            }
            result => result,
        }
    }

    /// Whether `ensure` must run before a claim at `now_ms` (inside a
    /// transaction, which cannot write again after a failed statement).
    pub(crate) fn needs_partition_of(&self, now_ms: u64) -> bool {
        !self.covers(now_ms / 1000)
    }

    /// The upkeep to schedule: creates the partitions ahead
    /// ([`ensure`](Partitions::ensure)), then detaches and drops each
    /// partition whose day ended more than the audit window before `now_s`
    /// and whose records all expired more than
    /// [`CLOCK_SKEW_MARGIN`](Partitioning::CLOCK_SKEW_MARGIN) before it.
    /// Detaches `CONCURRENTLY` where the server allows it (PostgreSQL 14
    /// and later, no DEFAULT partition), else under a `lock_timeout` of
    /// 2 s; a detach left pending is finished.
    pub(crate) async fn drop_expired<C: Catalog>(
        &self,
        catalog: &mut C,
        table: &str,
        now_s: u64,
    ) -> Result<PartitionCleanup, StoreError> {
        let created = self.ensure(catalog, table, now_s).await?;
        let concurrently = catalog
            .flag(CAN_DETACH_CONCURRENTLY, table, "SELECT (server version)")
            .await?;
        let audit_s = self.partitioning.audit_window_value().as_secs();
        let margin_s = Partitioning::CLOCK_SKEW_MARGIN.as_secs();
        let mut cleanup = PartitionCleanup {
            created,
            ..PartitionCleanup::default()
        };
        for Bound {
            name,
            until_s,
            pending,
        } in catalog.bounds(table).await?
        {
            let Some(until_s) = until_s else { continue };
            if until_s.saturating_add(audit_s) > now_s {
                continue;
            }
            let newest_expiration = catalog.newest_expiration(&name).await?;
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
            if let Err(error) = catalog
                .batch(&detach, "ALTER TABLE … DETACH PARTITION")
                .await
            {
                // A detach that failed inside its `BEGIN` (the lock
                // timeout) leaves the session in the aborted transaction:
                // ended here, not handed to the pool's next user.
                let _ = catalog.batch("ROLLBACK", "ROLLBACK").await;
                return Err(error);
            }
            catalog
                .batch(&format!("DROP TABLE {name}"), "DROP TABLE (partition)")
                .await?;
            cleanup.dropped.push(name);
        }
        Ok(cleanup)
    }

    /// Creates the partitioned table (`IF NOT EXISTS`), checks its shape
    /// (a plain table of the name is refused), then makes the partitions
    /// of `now_s`'s day and the days ahead.
    pub(crate) async fn create_table<C: Catalog>(
        &self,
        catalog: &mut C,
        table: &str,
        now_s: u64,
    ) -> Result<(), StoreError> {
        catalog
            .batch(&table_ddl(table), "CREATE TABLE (partitioned)")
            .await?;
        let (relkind, key) = catalog.kind(table).await?;
        let mut differences = Vec::new();
        if relkind != "p" || key.as_deref() != Some("RANGE (claimed_at)") {
            differences.push(format!(
                "it is not partitioned by RANGE (claimed_at) (the partitioned layout's table; a \
                 plain table is the plain store's: relkind {relkind:?}, key {key:?})"
            ));
        } else {
            let found: Vec<(String, String, bool)> = catalog
                .columns(table)
                .await?
                .into_iter()
                .filter(|(name, _, _)| name != "claimed_at")
                .collect();
            let unique = catalog
                .flag(ID_DAY_IS_UNIQUE, table, "read the table's indexes")
                .await?;
            differences = table_differences(&found, true);
            if !unique {
                differences.push("`(id, claimed_at)` is not the primary key".to_owned());
            }
        }
        if let Some(error) = shape_error(table, &differences) {
            return Err(error);
        }
        self.ensure(catalog, table, now_s).await.map(drop)
    }
}

/// The partitions of `table`, oldest first, with their sizes and dead
/// tuples.
pub(crate) async fn report<C: Catalog>(
    catalog: &mut C,
    table: &str,
) -> Result<Vec<PartitionInfo>, StoreError> {
    let mut report = Vec::new();
    for Bound { name, until_s, .. } in catalog.bounds(table).await? {
        let (total_bytes, estimated_rows, dead_tuples) = catalog.sizes(&name).await?;
        report.push(PartitionInfo {
            name,
            until_s,
            total_bytes: u64::try_from(total_bytes).unwrap_or(0),
            estimated_rows,
            dead_tuples,
        });
    }
    Ok(report)
}

/// A plain store's answer to `drop_expired_partitions`.
pub(crate) fn not_partitioned() -> StoreError {
    StoreError::new(
        StoreErrorKind::Misconfigured,
        "drop_expired_partitions is for the partitioned layout (the store's `partitioned`); a \
         plain table is purged with purge_expired",
    )
}

/// A partitioned store's answer to `purge_expired`.
pub(crate) fn purge_refused() -> StoreError {
    StoreError::new(
        StoreErrorKind::Misconfigured,
        "purge_expired deletes rows, which the partitioned layout never does: use \
         drop_expired_partitions",
    )
}
