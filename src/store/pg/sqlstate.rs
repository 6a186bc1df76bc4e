//! What each SQLSTATE means, for every PostgreSQL store: one table, read
//! by the tokio-postgres and the sqlx stores alike (both see the server's
//! codes as they are).

use crate::StoreErrorKind;

/// Where each SQLSTATE goes, most specific first: an exact code, else its
/// class (the first two characters). The table in the module docs is this
/// one.
const KINDS: &[(&str, StoreErrorKind)] = &[
    // A concurrent transaction won; the engine claims again and reads
    // the winner's record.
    ("40001", StoreErrorKind::Conflict), // serialization_failure
    ("40P01", StoreErrorKind::Conflict), // deadlock_detected
    ("55P03", StoreErrorKind::Conflict), // lock_not_available (lock_timeout)
    // A writer demoted by a failover, a server going down or starting up,
    // a statement timeout, a server out of resources: outages.
    ("25006", StoreErrorKind::Unavailable), // read_only_sql_transaction
    ("57014", StoreErrorKind::Unavailable), // query_canceled (statement_timeout)
    ("57P01", StoreErrorKind::Unavailable), // admin_shutdown
    ("57P02", StoreErrorKind::Unavailable), // crash_shutdown
    ("57P03", StoreErrorKind::Unavailable), // cannot_connect_now
    ("57P05", StoreErrorKind::Unavailable), // idle_session_timeout
    ("57P04", StoreErrorKind::Misconfigured), // database_dropped
    ("53400", StoreErrorKind::Misconfigured), // configuration_limit_exceeded
    ("53", StoreErrorKind::Unavailable),    // insufficient resources: disk, memory, connections
    ("08", StoreErrorKind::Unavailable),    // connection exceptions (PgBouncer's included)
    ("58", StoreErrorKind::Unavailable),    // system errors (I/O)
    // The table, the database, the role or the SQL cannot work here.
    ("42", StoreErrorKind::Misconfigured), // syntax, undefined table or column, privilege
    ("28", StoreErrorKind::Misconfigured), // invalid authorization
    ("3D", StoreErrorKind::Misconfigured), // invalid catalog (database) name
    ("3F", StoreErrorKind::Misconfigured), // invalid schema name
    ("0A", StoreErrorKind::Misconfigured), // feature not supported
    ("23", StoreErrorKind::Misconfigured), // a constraint of the table's own
    ("22", StoreErrorKind::Rejected),      // data exception: a value out of range
];

/// The kind of a SQLSTATE (see [`KINDS`]); an unknown one is
/// [`Other`](StoreErrorKind::Other): it fails closed.
pub(crate) fn kind_of_sqlstate(code: &str) -> StoreErrorKind {
    KINDS
        .iter()
        .find(|(key, _)| *key == code)
        .or_else(|| {
            KINDS
                .iter()
                .find(|(key, _)| key.len() == 2 && code.starts_with(key))
        })
        .map_or(StoreErrorKind::Other, |(_, kind)| *kind)
}

/// What to add to the server's words when a statement failed for a
/// column the table lacks (`42703`) and that column is `steps`: the table
/// predates recovery points, and the migration adds it.
pub(crate) fn missing_steps_hint(code: &str, message: &str) -> Option<String> {
    (code == "42703" && message.contains("\"steps\"")).then(|| {
        format!(
            "; the table predates recovery points (its `steps` column): add it with `{}` \
             (the store's docs, \"Migrations\")",
            super::table::ADD_STEPS
        )
    })
}

/// Whether a failed statement of the operation's own (a write committed
/// with the completion) is a refusal of that write, not retryable: a
/// constraint, a malformed statement, a value out of range, a function's
/// `RAISE EXCEPTION`.
pub(crate) fn is_write_refusal(code: &str) -> bool {
    ["23", "42", "22", "P0"]
        .iter()
        .any(|class| code.starts_with(class))
}

#[cfg(test)]
mod tests {
    use super::{is_write_refusal, kind_of_sqlstate};
    use crate::StoreErrorKind::*;

    #[test]
    fn every_sqlstate_lands_in_the_taxonomy() {
        for (code, kind) in [
            ("40001", Conflict),
            ("40P01", Conflict),
            ("55P03", Conflict),
            ("25006", Unavailable),
            ("57014", Unavailable),
            ("57P01", Unavailable),
            ("57P03", Unavailable),
            ("53300", Unavailable),
            ("53200", Unavailable),
            ("53100", Unavailable),
            ("08006", Unavailable),
            ("08P01", Unavailable),
            ("53400", Misconfigured),
            ("57P04", Misconfigured),
            ("42601", Misconfigured),
            ("42P01", Misconfigured),
            ("42703", Misconfigured),
            ("42501", Misconfigured),
            ("28P01", Misconfigured),
            ("3D000", Misconfigured),
            ("3F000", Misconfigured),
            ("23502", Misconfigured),
            ("22003", Rejected),
            ("XX000", Other),
            ("25P02", Other),
        ] {
            assert_eq!(kind_of_sqlstate(code), kind, "{code}");
        }
    }

    #[test]
    fn the_operations_own_statements_are_refused_by_class() {
        for code in ["23505", "23514", "42P01", "22003", "P0001"] {
            assert!(is_write_refusal(code), "{code}");
        }
        for code in ["40001", "55P03", "08006", "57014", "XX000", "25P02"] {
            assert!(!is_write_refusal(code), "{code}");
        }
    }

    #[test]
    fn only_outages_may_run_without_a_claim() {
        for code in ["40001", "40P01", "42601", "22003", "XX000", "23505"] {
            assert!(!kind_of_sqlstate(code).is_outage(), "{code}");
        }
    }
}
