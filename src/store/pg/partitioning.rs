//! The partitioned layout's option and its reports, the same types for
//! both PostgreSQL stores (re-exported by each): `partitioned(Partitioning)`
//! on the tokio-postgres store and on the sqlx one.

use super::partitioned::DAY_S;
use std::time::Duration;

/// The partitioned layout of the PostgreSQL stores (`partitioned` on
/// `PostgresStore` and on `SqlxPostgresStore`): records in a table
/// partitioned by the day of their claim, whole days dropped once every
/// record in them is past its dedup window (the engine's retention) and
/// the audit window. See "A table that never bloats" in the tokio-postgres
/// store's module docs (the same table, SQL and upkeep on both drivers).
///
/// ```
/// use lambda_idempotency::store::postgres::Partitioning;
/// use std::time::Duration;
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
    /// expired record" in the store's docs).
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
    /// table for support (the store's `history`), whatever the engine's
    /// retention (the dedup window) is. Its partition goes once its day
    /// ended this long ago and every record in it expired.
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

    /// How many days of partitions are made ahead of today.
    pub(crate) fn premake(&self) -> u64 {
        u64::from(self.premake_days)
    }
}

impl Default for Partitioning {
    fn default() -> Self {
        Self::daily()
    }
}

/// What the store's `drop_expired_partitions` did.
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

/// One partition, as the store's `partitions` reports it.
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
