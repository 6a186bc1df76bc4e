//! Abandoned claims on PostgreSQL (either driver), for the completer: a
//! page is two statements on the primary key's index, each bounded by the
//! page's limit, and no other index is needed.
//!
//! The first reads the ids of the next `limit` rows after the cursor (an
//! index range scan of `limit` entries, whatever their status); the second
//! reads the abandoned records among them (`IN_PROGRESS` under the
//! prefix, lease ended, not expired), by the same id range. A page's work
//! is bounded by its limit, never by how many records the table holds or
//! how few are abandoned; a walk reads every row's index entry once, every
//! prefix's (ids under a prefix are not contiguous in every collation). A
//! partial index on `status` would let a walk skip completed rows; it is
//! not added: the walk is an operator's (or a schedule's), not a request's,
//! and an index costs every write.
use super::statements::COLUMNS;

/// The two statements of a page.
pub(crate) struct AbandonedSql {
    /// `$1` the cursor (the last id read, `''` first), `$2` the limit:
    /// the last id of the next `$2` rows, and how many there are.
    pub(crate) read: String,
    /// `$1` the cursor, `$2` the last id read, `$3` the prefix, `$4` the
    /// lease bound (ms), `$5` now (s): the abandoned records in the range.
    pub(crate) rows: String,
}

impl AbandonedSql {
    /// For the table `t`, in the partitioned layout (`partitioned`: every
    /// row of an id, the newest its record) or not.
    pub(crate) fn new(t: &str, partitioned: bool) -> Self {
        const ABANDONED: &str = "starts_with(id, $3) AND status = 'IN_PROGRESS' \
             AND lease_until_ms < $4 AND expiration_s >= $5";
        if partitioned {
            Self {
                read: format!(
                    "SELECT max(id), count(*) FROM (SELECT DISTINCT id FROM {t} WHERE id > $1 \
                     ORDER BY id LIMIT $2) page"
                ),
                rows: format!(
                    "SELECT {COLUMNS} FROM (SELECT DISTINCT ON (id) * FROM {t} \
                     WHERE id > $1 AND id <= $2 ORDER BY id, claimed_at DESC) r \
                     WHERE {ABANDONED} ORDER BY id"
                ),
            }
        } else {
            Self {
                read: format!(
                    "SELECT max(id), count(*) FROM (SELECT id FROM {t} WHERE id > $1 \
                     ORDER BY id LIMIT $2) page"
                ),
                rows: format!(
                    "SELECT {COLUMNS} FROM {t} WHERE id > $1 AND id <= $2 AND {ABANDONED} \
                     ORDER BY id"
                ),
            }
        }
    }
}
