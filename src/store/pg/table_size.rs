//! The table's size from PostgreSQL's catalog, for every PostgreSQL store
//! (either driver, either layout): estimates the server keeps anyway, read
//! without a scan.

use crate::{
    store::{Accuracy, SizeSource, TableSize},
    StoreError, StoreErrorKind,
};

/// Over the table `$1`, or the leaf partitions of a partitioned one (a
/// partitioned parent holds no rows of its own, and `ANALYZE` gives it the
/// sum of its partitions': counted once, from the leaves): whether the
/// table exists, the rows `reltuples` estimates (as of the last `VACUUM` or
/// `ANALYZE`), and the bytes of the tables, their indexes and TOAST
/// (`pg_total_relation_size`). A leaf never analyzed (`reltuples` `-1`:
/// a new table, or the partitioned layout's new day before autovacuum
/// reaches it) counts the live rows the statistics system has seen
/// (`n_live_tup`) instead, so that the figure does not drop to nothing
/// each midnight.
pub(crate) const TABLE_SIZE: &str = "WITH leaves AS ( \
       SELECT c.oid FROM pg_class c WHERE c.oid = to_regclass($1) AND c.relkind <> 'p' \
       UNION ALL \
       SELECT relid FROM pg_partition_tree(to_regclass($1)) WHERE isleaf) \
     SELECT to_regclass($1) IS NOT NULL, \
       coalesce(sum(CASE WHEN c.reltuples < 0 THEN pg_stat_get_live_tuples(c.oid) \
                         ELSE c.reltuples::bigint END), 0)::bigint, \
       coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint \
     FROM leaves l JOIN pg_class c ON c.oid = l.oid";

/// The answer to [`TABLE_SIZE`] as a [`TableSize`]; a table that is not
/// there is misconfiguration.
pub(crate) fn table_size(
    table: &str,
    exists: bool,
    rows: i64,
    bytes: i64,
) -> Result<TableSize, StoreError> {
    if !exists {
        return Err(StoreError::new(
            StoreErrorKind::Misconfigured,
            format!("the PostgreSQL table {table} does not exist (create_table makes it)"),
        ));
    }
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(TableSize::new(count(rows), Accuracy::Estimated, SizeSource::PgClass).bytes(count(bytes)))
}
