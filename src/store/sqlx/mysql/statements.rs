//! Every SQL statement the MySQL store sends, built once per table name.
//! MySQL returns nothing from a write (no `RETURNING`): a write answers by
//! the rows it changed, and a refused one is followed by a read of the
//! record it found.

/// The record's columns, in the order every query returns them.
pub(super) const COLUMNS: &str =
    "id, status, owner, fingerprint, expiration_s, lease_until_ms, response, \
     created_at_ms, completed_at_ms, attempt, first_started_ms";

/// The longest record id the table holds (a key prefix of up to some 440
/// characters with its hash): a `VARCHAR` primary key within InnoDB's 3,072
/// bytes of index in `utf8mb4`.
pub(super) const ID_CHARS: usize = 512;

/// Every statement, with the table name in it, built once.
pub(super) struct Statements {
    pub(super) create: String,
    /// A fresh claim where there is no record.
    pub(super) claim: String,
    /// A fresh claim in place of an expired record.
    pub(super) reclaim: String,
    pub(super) take_over: String,
    pub(super) extend: String,
    pub(super) complete: String,
    pub(super) release: String,
    pub(super) remove_any: String,
    pub(super) remove_unless_in_progress: String,
    pub(super) get: String,
    pub(super) list_in_progress: String,
    pub(super) purge: String,
    /// InnoDB's estimates of the table's rows and bytes (data and
    /// indexes), from `information_schema`: no row when there is no table.
    /// The name goes in as a literal: it is letters, digits and `_`.
    pub(super) table_size: String,
    /// A step's fenced write: name, output, id, owner, and how many steps
    /// the record holds before it.
    pub(super) step: String,
    /// The steps of the `IN_PROGRESS` record not expired at a time (epoch
    /// seconds), in order: `name` and `output` each.
    pub(super) steps: String,
    /// Whether the table has its `steps` column: `create_table`'s check of
    /// a table made before recovery points.
    pub(super) has_steps: String,
}

/// The migration that adds `steps` to a table made before recovery
/// points. MySQL 8 has no `ADD COLUMN IF NOT EXISTS` (MariaDB has): run
/// once, and a second run fails with `1060` (duplicate column) and changes
/// nothing. `ALGORITHM=INSTANT` makes it a change to the table's metadata
/// only, or an error rather than a copy of the table.
pub(super) const ADD_STEPS: &str =
    "ALTER TABLE <table> ADD COLUMN steps JSON NULL, ALGORITHM=INSTANT";

impl Statements {
    pub(super) fn new(t: &str) -> Self {
        let fence = "id = ? AND status = 'IN_PROGRESS' AND owner = ?";
        Self {
            create: format!(
                "CREATE TABLE IF NOT EXISTS `{t}` (\
                   id VARCHAR({ID_CHARS}) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
                   status VARCHAR(16) NOT NULL, \
                   owner VARCHAR(1024) NOT NULL, \
                   fingerprint VARCHAR(1024) NOT NULL, \
                   expiration_s BIGINT NOT NULL, \
                   lease_until_ms BIGINT NULL, \
                   response LONGBLOB NULL, \
                   created_at_ms BIGINT NULL, \
                   completed_at_ms BIGINT NULL, \
                   attempt INT NOT NULL DEFAULT 1, \
                   first_started_ms BIGINT NULL, \
                   steps JSON NULL, \
                   PRIMARY KEY (id), \
                   KEY `{t}_expiration_s` (expiration_s), \
                   CONSTRAINT `{t}_status` CHECK (status IN ('IN_PROGRESS', 'COMPLETED'))\
                 ) ENGINE=InnoDB"
            ),
            // `steps` named, though NULL: on a table made before the
            // column, the claim fails (with the migration's name) before
            // the operation runs, not its completion after.
            claim: format!(
                "INSERT INTO `{t}` ({COLUMNS}, steps) \
                 VALUES (?, 'IN_PROGRESS', ?, ?, ?, ?, NULL, ?, NULL, ?, ?, NULL)"
            ),
            reclaim: format!(
                "UPDATE `{t}` SET status = 'IN_PROGRESS', owner = ?, fingerprint = ?, \
                 expiration_s = ?, lease_until_ms = ?, response = NULL, created_at_ms = ?, \
                 completed_at_ms = NULL, attempt = ?, first_started_ms = ?, steps = NULL \
                 WHERE id = ? AND expiration_s < ?"
            ),
            take_over: format!(
                "UPDATE `{t}` SET owner = ?, fingerprint = ?, expiration_s = ?, \
                 lease_until_ms = ?, created_at_ms = ?, attempt = ?, first_started_ms = ? \
                 WHERE id = ? AND status = 'IN_PROGRESS' AND owner = ? AND lease_until_ms < ?"
            ),
            extend: format!("UPDATE `{t}` SET lease_until_ms = ?, expiration_s = ? WHERE {fence}"),
            complete: format!(
                "UPDATE `{t}` SET status = 'COMPLETED', response = ?, expiration_s = ?, \
                 completed_at_ms = ?, lease_until_ms = NULL, steps = NULL WHERE {fence}"
            ),
            release: format!("DELETE FROM `{t}` WHERE {fence}"),
            remove_any: format!("DELETE FROM `{t}` WHERE id = ?"),
            remove_unless_in_progress: format!(
                "DELETE FROM `{t}` WHERE id = ? AND status <> 'IN_PROGRESS'"
            ),
            get: format!("SELECT {COLUMNS} FROM `{t}` WHERE id = ?"),
            list_in_progress: format!(
                "SELECT {COLUMNS} FROM `{t}` WHERE status = 'IN_PROGRESS' \
                 AND LEFT(id, CHAR_LENGTH(?)) = ? ORDER BY id LIMIT ?"
            ),
            purge: format!("DELETE FROM `{t}` WHERE expiration_s < ? LIMIT ?"),
            table_size: format!(
                "SELECT CAST(COALESCE(TABLE_ROWS, 0) AS UNSIGNED), \
                   CAST(COALESCE(DATA_LENGTH, 0) + COALESCE(INDEX_LENGTH, 0) AS UNSIGNED) \
                 FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{t}'"
            ),
            // Each step an object of its name and its output in base64, on
            // one line (`TO_BASE64` breaks lines every 76 characters). The
            // base64 in `utf8mb4_bin` whatever the connection's collation
            // (a newline literal of another one is an illegal mix), and
            // the newline as a hex literal whatever the SQL mode.
            step: format!(
                "UPDATE `{t}` SET steps = JSON_ARRAY_APPEND(COALESCE(steps, JSON_ARRAY()), '$', \
                   JSON_OBJECT('name', ?, 'output', REPLACE(\
                     CONVERT(TO_BASE64(?) USING utf8mb4) COLLATE utf8mb4_bin, _utf8mb4 X'0A', ''))) \
                 WHERE {fence} AND COALESCE(JSON_LENGTH(steps), 0) = ?"
            ),
            steps: format!(
                "SELECT j.name, FROM_BASE64(j.output) AS output FROM `{t}` r, \
                   JSON_TABLE(r.steps, '$[*]' COLUMNS (n FOR ORDINALITY, \
                     name LONGTEXT PATH '$.name', output LONGTEXT PATH '$.output')) j \
                 WHERE r.id = ? AND r.status = 'IN_PROGRESS' AND r.expiration_s >= ? \
                 ORDER BY j.n"
            ),
            has_steps: format!(
                "SELECT COUNT(*) FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{t}' AND COLUMN_NAME = 'steps'"
            ),
        }
    }
}

/// A value written into a statement as a literal.
#[derive(Clone, Copy)]
pub(super) enum Literal<'a> {
    /// Text, written as a `utf8mb4` hex literal: any character, in any SQL
    /// mode, with nothing to escape.
    Text(&'a str),
    /// Bytes, as a hex literal.
    Bytes(&'a [u8]),
    Int(i64),
    UInt(u64),
}

/// `template` with each `?` replaced by the next of `values`, written as
/// a literal: the store's statements go as one text query each (MySQL's
/// `COM_QUERY`), one round trip, with no statement prepared on the
/// connection (a prepare is a round trip of its own, and RDS Proxy pins a
/// session that prepares one). The templates hold no `?` but their
/// parameters: table names are letters, digits and `_`.
pub(super) fn fill(template: &str, values: &[Literal<'_>]) -> String {
    let mut filled = String::with_capacity(template.len() + 64 * values.len());
    let mut values = values.iter();
    for (index, part) in template.split('?').enumerate() {
        if index > 0 {
            match values.next() {
                Some(Literal::Text(text)) => {
                    filled.push_str("_utf8mb4 X'");
                    filled.push_str(&crate::lower_hex::lower_hex(text.as_bytes()));
                    filled.push('\'');
                }
                Some(Literal::Bytes(bytes)) => {
                    filled.push_str("X'");
                    filled.push_str(&crate::lower_hex::lower_hex(bytes));
                    filled.push('\'');
                }
                Some(Literal::Int(value)) => filled.push_str(&value.to_string()),
                Some(Literal::UInt(value)) => filled.push_str(&value.to_string()),
                // Fewer values than parameters: a mistake of this module's,
                // which the server refuses as a syntax error.
                None => filled.push('?'),
            }
        }
        filled.push_str(part);
    }
    filled
}

#[cfg(test)]
mod tests {
    use super::{fill, Literal::*};

    #[test]
    fn values_are_written_as_literals_that_need_no_escaping() {
        assert_eq!(
            fill(
                "UPDATE t SET a = ?, b = ? WHERE id = ? AND n < ?",
                &[Bytes(b"\x00'\\"), Int(-5), Text("k'; DROP TABLE t; --"), UInt(u64::MAX)]
            ),
            "UPDATE t SET a = X'00275c', b = -5 WHERE id = _utf8mb4 X'6b273b2044524f50205441424c4520743b202d2d' AND n < 18446744073709551615"
        );
        assert_eq!(fill("SELECT ?", &[Bytes(b"")]), "SELECT X''");
    }
}
