//! The partitioned layout's SQL, for every PostgreSQL store: its DDL, the
//! protocol's statements rewritten to find a record across partitions,
//! the lock that serialises the writes of one record id, and the
//! catalog queries of the partitions' upkeep. Why it is built this way:
//! the postgres store's docs ("A table that never bloats").

use super::statements::{Statements, COLUMNS, STEP_COUNT, STEP_ELEMENT, STEP_ROWS, WRITE_CTE};

/// The lock every write of a record takes first, in its own statement
/// (so that the write's snapshot follows it): transaction-scoped, so it
/// holds behind PgBouncer in transaction mode and goes with `COMMIT`. Its
/// key is [`lock_key`].
pub(crate) const LOCK_RECORD: &str = "SELECT pg_advisory_xact_lock($1)";

/// The 64-bit key of a record's lock: the first 8 bytes of the SHA-256 of
/// its table's name and its id (the same id in two tables is two records,
/// and must not wait on each other). Computed here rather than by the
/// server, so that `BEGIN` and the lock go in one simple query (which
/// takes no parameters).
pub(crate) fn lock_key(table: &str, id: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(table.as_bytes());
    hasher.update([0u8]);
    hasher.update(id.as_bytes());
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// The record's lock as a statement without parameters ([`LOCK_RECORD`]
/// with its key written in), for a simple query: one row.
pub(crate) fn lock_record(table: &str, id: &str) -> String {
    format!("SELECT pg_advisory_xact_lock({})", lock_key(table, id))
}

/// `BEGIN` and the record's lock, in one simple query.
pub(crate) fn begin_locked(table: &str, id: &str) -> String {
    format!("BEGIN; {}", lock_record(table, id))
}

/// The lock of the partitions' upkeep (creation), per table: the
/// two-key form, a lock space of its own apart from the records' keys.
/// `1818846563` is `lidm` in ASCII.
pub(crate) const LOCK_UPKEEP: &str = "SELECT pg_advisory_xact_lock(1818846563, hashtext($1))";

/// Seconds in a partition's day.
pub(crate) const DAY_S: u64 = 86_400;

/// The claim's day as a partition value: the engine's `now`, never the
/// server's clock.
const CLAIMED_AT: &str = "to_timestamp($6::float8 / 1000)";

/// The record: the newest row of the id `$1`, with its `claimed_at`. Every
/// statement reads it once (each mention of the table is planned over
/// every partition, and planning is most of a statement's cost here).
fn current(t: &str) -> String {
    format!(
        "cur AS (SELECT {COLUMNS}, claimed_at FROM {t} WHERE id = $1 \
         ORDER BY claimed_at DESC LIMIT 1)"
    )
}

/// Wraps a conditional write like [`super::statements::answered`], with
/// the record found being the newest row of the id (`cur`, which the write
/// may use), shown only where `found` holds of it (`true`, or "not expired
/// at the writer's now").
fn answered(write: &str, t: &str, found: &str) -> String {
    format!(
        "WITH {cur}, {WRITE_CTE} AS ({write} RETURNING 1) \
         SELECT EXISTS (SELECT 1 FROM {WRITE_CTE}) AS applied, {r} \
         FROM (SELECT 1) one LEFT JOIN cur r ON {found}",
        cur = current(t),
        r = COLUMNS
            .split(", ")
            .map(|column| format!("r.{column}"))
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Every statement of the partitioned layout over table `t`. Each runs
/// after [`LOCK_RECORD`] in its transaction; the parameters are the plain
/// table's, in the same order, but for `extend` and `step`, which also
/// take the writer's `now_ms` (`$5` and `$6`).
pub(crate) fn statements(t: &str) -> Statements {
    // The fenced writes apply to the record (the newest row) only.
    let fence = "r.id = $1 AND r.claimed_at = (SELECT claimed_at FROM cur) \
                 AND r.status = 'IN_PROGRESS' AND r.owner = $2";
    let replace = "status = excluded.status, owner = excluded.owner, \
         fingerprint = excluded.fingerprint, expiration_s = excluded.expiration_s, \
         lease_until_ms = excluded.lease_until_ms, response = excluded.response, \
         created_at_ms = excluded.created_at_ms, completed_at_ms = excluded.completed_at_ms, \
         attempt = excluded.attempt, first_started_ms = excluded.first_started_ms, \
         steps = NULL";
    // At most one row of an id is live, and it is the newest: a row is
    // only inserted where the newest is not live (under the lock), and
    // its `now` is past the expiration of every row before it.
    let none_live =
        |now_s: &str| format!("NOT EXISTS (SELECT 1 FROM cur WHERE cur.expiration_s >= {now_s})");
    let completion = format!(
        "UPDATE {t} r SET status = 'COMPLETED', response = $3, expiration_s = $4, \
         completed_at_ms = $5, lease_until_ms = NULL, steps = NULL \
         WHERE {fence} AND r.expiration_s >= $5 / 1000"
    );
    Statements {
        claim: answered(
            &format!(
                "INSERT INTO {t} AS r ({COLUMNS}, claimed_at) \
                 SELECT $1, 'IN_PROGRESS', $2, $3, $4, $5, NULL, $6, NULL, $7, $8, {CLAIMED_AT} \
                 WHERE {none} \
                 ON CONFLICT (id, claimed_at) DO UPDATE SET {replace} WHERE r.expiration_s < $9",
                none = none_live("$9")
            ),
            t,
            "r.expiration_s >= $9",
        ),
        take_over: answered(
            &format!(
                "UPDATE {t} r SET owner = $3, fingerprint = $4, expiration_s = $5, \
                 lease_until_ms = $6, created_at_ms = $7, attempt = $8, first_started_ms = $9 \
                 WHERE {fence} AND r.lease_until_ms < $10 AND r.expiration_s >= $10 / 1000"
            ),
            t,
            "r.expiration_s >= $10 / 1000",
        ),
        extend: answered(
            &format!(
                "UPDATE {t} r SET lease_until_ms = $3, expiration_s = $4 \
                 WHERE {fence} AND r.expiration_s >= $5 / 1000"
            ),
            t,
            "r.expiration_s >= $5 / 1000",
        ),
        complete: answered(&completion, t, "r.expiration_s >= $5 / 1000"),
        fenced_complete: format!("WITH {} {completion} RETURNING 1", current(t)),
        release: answered(&format!("DELETE FROM {t} r WHERE {fence}"), t, "true"),
        // Over a lapsed claim (the record, not expired, holding no
        // response: one that does was tampered with) in its own row; else,
        // where nothing is live, a new row.
        commit: format!(
            "WITH {cur}, over AS (UPDATE {t} r SET status = 'COMPLETED', owner = $2, \
                 fingerprint = $3, expiration_s = $4, lease_until_ms = NULL, response = $5, \
                 created_at_ms = $6, completed_at_ms = $6, attempt = 1, first_started_ms = $6, \
                 steps = NULL \
               WHERE r.id = $1 AND r.claimed_at = (SELECT claimed_at FROM cur) \
                 AND r.status = 'IN_PROGRESS' AND r.lease_until_ms < $6 \
                 AND r.response IS NULL AND r.expiration_s >= $7 RETURNING 1), \
             fresh AS (INSERT INTO {t} AS r ({COLUMNS}, claimed_at) \
               SELECT $1, 'COMPLETED', $2, $3, $4, NULL, $5, $6, $6, 1, $6, {CLAIMED_AT} \
               WHERE {none} \
               ON CONFLICT (id, claimed_at) DO UPDATE SET {replace} WHERE r.expiration_s < $7 \
               RETURNING 1) \
             SELECT 1 FROM over UNION ALL SELECT 1 FROM fresh",
            cur = current(t),
            none = none_live("$7")
        ),
        // Forgetting a key forgets its history too.
        remove_any: answered(&format!("DELETE FROM {t} r WHERE r.id = $1"), t, "true"),
        remove_unless_in_progress: answered(
            &format!(
                "DELETE FROM {t} r WHERE r.id = $1 \
                 AND NOT EXISTS (SELECT 1 FROM cur WHERE cur.status = 'IN_PROGRESS')"
            ),
            t,
            "true",
        ),
        get: format!("SELECT {COLUMNS} FROM {t} WHERE id = $1 ORDER BY claimed_at DESC LIMIT 1"),
        list_in_progress: format!(
            "SELECT {COLUMNS} FROM (SELECT DISTINCT ON (id) * FROM {t} WHERE starts_with(id, $1) \
             ORDER BY id, claimed_at DESC) r WHERE status = 'IN_PROGRESS' ORDER BY id LIMIT $2"
        ),
        // Never sent: the partitioned layout drops partitions instead.
        purge: String::new(),
        step: answered(
            &format!(
                "UPDATE {t} r SET steps = coalesce(r.steps, '[]'::jsonb) || {STEP_ELEMENT} \
                 WHERE {fence} AND r.expiration_s >= $6 / 1000 AND {STEP_COUNT} = $5"
            ),
            t,
            "r.expiration_s >= $6 / 1000",
        ),
        // The record's row only: an older row of the id is another claim's.
        steps: format!(
            "{STEP_ROWS} FROM (SELECT status, expiration_s, steps FROM {t} WHERE id = $1 \
               ORDER BY claimed_at DESC LIMIT 1) r \
             CROSS JOIN LATERAL jsonb_array_elements(r.steps) WITH ORDINALITY AS s(step, n) \
             WHERE r.status = 'IN_PROGRESS' AND r.expiration_s >= $2 \
             ORDER BY s.n"
        ),
    }
}

/// Every row of an id, newest first, expired ones included: a record's
/// history, for support.
pub(crate) fn history(t: &str) -> String {
    format!("SELECT {COLUMNS}, claimed_at FROM {t} WHERE id = $1 ORDER BY claimed_at DESC")
}

/// The DDL of the partitioned table named `table` (the partitions are
/// created apart, ahead of time).
pub(crate) fn table_ddl(table: &str) -> String {
    include_str!("table_partitioned.sql")
        .replace("EXISTS idempotency (", &format!("EXISTS {table} ("))
}

/// The partition of `table` for the day `day` (days since 1970-01-01,
/// UTC): pg_partman 5's daily name, `<table>_pYYYYMMDD`.
pub(crate) fn partition_name(table: &str, day: u64) -> String {
    let (y, m, d) = civil(day);
    format!("{table}_p{y:04}{m:02}{d:02}")
}

/// The statements that create `day`'s partition of `table`: a table of
/// its own, then attached (`SHARE UPDATE EXCLUSIVE` on the parent, where
/// `CREATE TABLE … PARTITION OF` takes `ACCESS EXCLUSIVE`). Room on each
/// page (`fillfactor`) lets the completion's update stay on its page
/// (HOT): no index entry, and no vacuum to reclaim the old version.
pub(crate) fn create_partition(table: &str, day: u64) -> String {
    let name = partition_name(table, day);
    format!(
        "CREATE TABLE IF NOT EXISTS {name} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) \
         WITH (fillfactor = 80); \
         ALTER TABLE {table} ATTACH PARTITION {name} FOR VALUES FROM ('{from}') TO ('{to}')",
        from = midnight(day),
        to = midnight(day + 1),
    )
}

/// `day`'s midnight as a UTC `timestamptz` literal.
fn midnight(day: u64) -> String {
    let (y, m, d) = civil(day);
    format!("{y:04}-{m:02}-{d:02} 00:00:00+00")
}

// The bounds are read with regular expressions whose parentheses are
// bracket expressions, `[(]`, not `\(`: under `standard_conforming_strings
// = off` a backslash in a plain string literal is an escape, and the
// pattern would lose it.

/// Which of the days `$2` (days since 1970-01-01, UTC) no partition of
/// `$1` covers, whatever its name (pg_partman's, or this store's). Read
/// from the catalog with the statement's snapshot, so a partition another
/// transaction committed is seen.
pub(crate) const MISSING_DAYS: &str = "WITH bounds AS (SELECT \
       extract(epoch FROM (regexp_match(pg_get_expr(c.relpartbound, c.oid), \
         'FROM [(]''([^'']*)''[)]'))[1]::timestamptz)::bigint AS lo, \
       extract(epoch FROM (regexp_match(pg_get_expr(c.relpartbound, c.oid), \
         'TO [(]''([^'']*)''[)]'))[1]::timestamptz)::bigint AS hi \
     FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
     WHERE i.inhparent = to_regclass($1)) \
     SELECT d FROM unnest($2::bigint[]) d \
     WHERE NOT EXISTS (SELECT 1 FROM bounds WHERE lo <= d * 86400 AND hi >= (d + 1) * 86400) \
     ORDER BY d";

/// The partitions of `$1`: name (as `regclass` prints it, quoted where
/// needed), the end of its range in epoch seconds (`NULL` for a DEFAULT
/// partition), and whether a detach of it is pending. The bound is
/// printed and read back in one session, so its time zone cancels out.
pub(crate) const PARTITIONS: &str = "SELECT c.oid::regclass::text, \
       extract(epoch FROM (regexp_match(pg_get_expr(c.relpartbound, c.oid), \
         'TO [(]''([^'']*)''[)]'))[1]::timestamptz)::bigint, \
       i.inhdetachpending \
     FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid \
     WHERE i.inhparent = to_regclass($1) ORDER BY 2";

/// The size of the partition `$1` (its name) with its indexes and TOAST,
/// the planner's estimate of its rows, and its dead tuples.
pub(crate) const PARTITION_SIZE: &str = "SELECT pg_total_relation_size($1::regclass), \
       (SELECT reltuples::bigint FROM pg_class WHERE oid = $1::regclass), \
       coalesce((SELECT n_dead_tup FROM pg_stat_all_tables WHERE relid = $1::regclass), 0)";

/// The newest `expiration_s` in the partition `name` (0 when empty): the
/// cleanup's check that every record in it expired.
pub(crate) fn newest_expiration(name: &str) -> String {
    format!("SELECT coalesce(max(expiration_s), 0) FROM {name}")
}

/// Whether `DETACH … CONCURRENTLY` is allowed on `$1`: PostgreSQL 14 or
/// later, and no DEFAULT partition.
pub(crate) const CAN_DETACH_CONCURRENTLY: &str =
    "SELECT current_setting('server_version_num')::int >= 140000 \
       AND NOT EXISTS (SELECT 1 FROM pg_partitioned_table \
                       WHERE partrelid = to_regclass($1) AND partdefid <> 0)";

/// The table's kind and partition key: `p` and `RANGE (claimed_at)` for
/// this layout.
pub(crate) const TABLE_KIND: &str =
    "SELECT c.relkind::text, CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END \
     FROM pg_class c WHERE c.oid = to_regclass($1)";

/// Whether `$1` has a unique index on `(id, claimed_at)`.
pub(crate) const ID_DAY_IS_UNIQUE: &str = "SELECT EXISTS (SELECT 1 FROM pg_index i \
       JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] \
       JOIN pg_attribute b ON b.attrelid = i.indrelid AND b.attnum = i.indkey[1] \
       WHERE i.indrelid = to_regclass($1) AND i.indisunique AND i.indnkeyatts = 2 \
         AND a.attname = 'id' AND b.attname = 'claimed_at')";

/// The year, month and day of `day` days after 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
pub(crate) fn civil(day: u64) -> (u64, u64, u64) {
    let z = day + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// Whether a driver's error message is PostgreSQL's for a row with no
/// partition to go to (`23514`, which is also a failed `CHECK`).
pub(crate) fn is_missing_partition(code: &str, message: &str) -> bool {
    code == "23514" && message.starts_with("no partition of relation")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_named_as_pg_partman_names_them() {
        assert_eq!(civil(0), (1970, 1, 1));
        assert_eq!(civil(59), (1970, 3, 1));
        assert_eq!(civil(11_016), (2000, 2, 29));
        assert_eq!(civil(20_786), (2026, 11, 29));
        assert_eq!(partition_name("app.idem", 20_786), "app.idem_p20261129");
        let ddl = create_partition("idem", 20_786);
        assert!(
            ddl.contains("FROM ('2026-11-29 00:00:00+00') TO ('2026-11-30 00:00:00+00')"),
            "{ddl}"
        );
    }

    #[test]
    fn a_records_lock_is_64_bits_of_its_ids_hash() {
        assert_eq!(lock_key("t", "p#a"), lock_key("t", "p#a"));
        assert_ne!(lock_key("t", "p#a"), lock_key("t", "p#b"));
        assert_ne!(
            lock_key("t", "p#a"),
            lock_key("u", "p#a"),
            "a table of its own"
        );
        assert_eq!(
            begin_locked("t", "x"),
            format!(
                "BEGIN; SELECT pg_advisory_xact_lock({})",
                lock_key("t", "x")
            )
        );
        // SHA-256("t\0x") begins 6fca3fcf.
        assert_eq!(lock_key("t", "x") as u64 >> 32, 0x6fca_3fcf);
    }

    #[test]
    fn the_ddl_names_the_table() {
        let ddl = table_ddl("app.records");
        assert!(
            ddl.contains("CREATE TABLE IF NOT EXISTS app.records ("),
            "{ddl}"
        );
        assert!(ddl.contains("PRIMARY KEY (id, claimed_at)"), "{ddl}");
        assert!(!ddl.contains("idempotency"), "{ddl}");
    }
}
