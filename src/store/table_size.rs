//! How many records a store holds, read the cheapest way its backend
//! offers: [`Store::table_size`](super::Store::table_size), reported as a
//! gauge by [`Engine::sample_table_size`](crate::Engine::sample_table_size).
//!
//! Each store answers from what its backend already keeps (never a scan),
//! so the figure is cheap enough to scrape or schedule, and says how far to
//! trust it:
//!
//! | store | records | bytes | [`Accuracy`] | [`SizeSource`] |
//! |---|---|---|---|---|
//! | DynamoDB | `ItemCount` | `TableSizeBytes` | estimated: AWS refreshes both about every six hours (DynamoDB Local: live) | `describe_table` |
//! | PostgreSQL (both drivers, plain or partitioned) | `pg_class.reltuples`, summed over the partitions | `pg_total_relation_size`, summed likewise | estimated: as of the last `VACUUM` or `ANALYZE` (autovacuum's); a table or partition never analyzed yet counts the statistics' live rows (`n_live_tup`) | `pg_class` |
//! | MySQL, MariaDB | `information_schema.TABLES.TABLE_ROWS` | `DATA_LENGTH + INDEX_LENGTH` | estimated: InnoDB samples; MySQL 8 caches it for `information_schema_stats_expiry` (a day by default) | `information_schema` |
//! | Redis | `DBSIZE`, only when the store owns its database (`RedisStore::owns_database`) | – | exact | `dbsize` |
//! | memory | the records not expired | their packed size | exact | `memory` |
//!
//! Every figure but the memory store's counts what the table or database
//! holds: records of every key prefix (a table shared by several
//! functions), and expired records that the backend has not deleted yet
//! (DynamoDB's TTL deletes within days; PostgreSQL and MySQL keep them
//! until purged or their partition is dropped). A store with no cheap
//! count (Redis without a database of its own, a store of yours that does
//! not say) answers `None`.

/// How far a [`TableSize`]'s figures can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Accuracy {
    /// Counted: what the store held when asked.
    Exact,
    /// The backend's own estimate, refreshed on its schedule (the
    /// [module docs](self) say which).
    Estimated,
}

impl Accuracy {
    /// A stable snake_case name, for a metric's label: `exact` or
    /// `estimated`.
    pub fn as_str(self) -> &'static str {
        match self {
            Accuracy::Exact => "exact",
            Accuracy::Estimated => "estimated",
        }
    }
}

/// Where a [`TableSize`]'s figures come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SizeSource {
    /// DynamoDB's `DescribeTable` (`ItemCount`, `TableSizeBytes`).
    DescribeTable,
    /// PostgreSQL's catalog: `pg_class.reltuples` and
    /// `pg_total_relation_size`, over the table or its partitions.
    PgClass,
    /// MySQL's `information_schema.TABLES` (`TABLE_ROWS`, `DATA_LENGTH`,
    /// `INDEX_LENGTH`).
    InformationSchema,
    /// Redis's `DBSIZE`, on the server or summed over a cluster's
    /// primaries.
    DbSize,
    /// Counted in process memory.
    Memory,
    /// A store of your own, by a name of its own (keep it one of a few).
    Other(&'static str),
}

impl SizeSource {
    /// A stable snake_case name.
    pub fn as_str(self) -> &'static str {
        match self {
            SizeSource::DescribeTable => "describe_table",
            SizeSource::PgClass => "pg_class",
            SizeSource::InformationSchema => "information_schema",
            SizeSource::DbSize => "dbsize",
            SizeSource::Memory => "memory",
            SizeSource::Other(name) => name,
        }
    }
}

/// How many records a store holds, and how it knows
/// ([`Store::table_size`](super::Store::table_size)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct TableSize {
    /// The records held (see the [module docs](self) for what each store
    /// counts).
    pub records: u64,
    /// Of them, those `IN_PROGRESS`, where the store counts them cheaply
    /// (the memory store); `None` elsewhere.
    pub in_progress: Option<u64>,
    /// What they take on the backend, indexes included, where it says.
    pub bytes: Option<u64>,
    /// Counted or estimated.
    pub accuracy: Accuracy,
    /// Where the figures come from.
    pub source: SizeSource,
}

impl TableSize {
    /// `records`, by `accuracy`, from `source`; neither in progress nor
    /// bytes known (add them with [`in_progress`](Self::in_progress) and
    /// [`bytes`](Self::bytes)).
    pub fn new(records: u64, accuracy: Accuracy, source: SizeSource) -> Self {
        Self {
            records,
            in_progress: None,
            bytes: None,
            accuracy,
            source,
        }
    }

    /// With the count of records in progress.
    #[must_use]
    pub fn in_progress(mut self, in_progress: u64) -> Self {
        self.in_progress = Some(in_progress);
        self
    }

    /// With the bytes the records take.
    #[must_use]
    pub fn bytes(mut self, bytes: u64) -> Self {
        self.bytes = Some(bytes);
        self
    }
}
