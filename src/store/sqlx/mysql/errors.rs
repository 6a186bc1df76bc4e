//! MySQL's errors as [`StoreError`]s, in one place: the server's error
//! numbers (MySQL 8 and MariaDB share them) and sqlx's own failures.
//!
//! | error | kind |
//! |---|---|
//! | `1205` lock wait timeout, `1213` deadlock, `3572` `NOWAIT` | `Conflict` |
//! | `1040` too many connections, `1203`, `1226` resource limits | `Throttled` |
//! | `1290`, `1836`, `1792` read-only (a failover in progress), `1053` shutdown, `1927` killed, `3024`/`1969` statement time exceeded; a socket that fails, a pool that times out | `Unavailable` |
//! | `1044`, `1045`, `1142`, `1143`, `1227` no permission; `1046`, `1049` no database; `1146` no table; `1054` no column; `1064` bad SQL; a bad URL or TLS setting, a closed pool | `Misconfigured` |
//! | `1406` too long, `1264` out of range, `1366` a bad value | `Rejected` |
//! | a column that does not decode | `CorruptRecord` |
//! | the operation's own write refused: `1062` duplicate, `1451`/`1452` foreign key, `3819`/`4025` check constraint, `1048` null, `1644` `SIGNAL` | `WriteRejected`, with its [`WriteRefusal`] |
//! | anything else | `Other` |

use crate::{StoreError, StoreErrorKind, WriteRefusal};

/// The server's error number, when the server answered with one.
pub(super) fn number(error: &sqlx::Error) -> Option<u16> {
    error
        .as_database_error()?
        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
        .map(|error| error.number())
}

/// What `error` is for the engine.
pub(super) fn kind_of(error: &sqlx::Error) -> StoreErrorKind {
    use StoreErrorKind::*;
    match error {
        sqlx::Error::Database(_) => match number(error) {
            Some(1205 | 1213 | 3572) => Conflict,
            Some(1040 | 1203 | 1226) => Throttled,
            Some(1290 | 1836 | 1792 | 1053 | 1927 | 3024 | 1969) => Unavailable,
            Some(1044 | 1045 | 1142 | 1143 | 1227 | 1046 | 1049 | 1146 | 1054 | 1064) => {
                Misconfigured
            }
            Some(1406 | 1264 | 1366) => Rejected,
            _ => Other,
        },
        sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::WorkerCrashed => Unavailable,
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolClosed => {
            Misconfigured
        }
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::Decode(_) => CorruptRecord,
        sqlx::Error::Encode(_) => Rejected,
        _ => Other,
    }
}

/// `error`, from `operation`, as a [`StoreError`] that says what failed.
pub(super) fn from_sqlx(operation: &'static str, error: sqlx::Error) -> StoreError {
    let kind = kind_of(&error);
    // A statement of the store's on a table made before its `steps`
    // column: say which migration adds it.
    let migration = match error.as_database_error() {
        Some(database)
            if number(&error) == Some(1054) && database.message().contains("'steps'") =>
        {
            format!(
                "; the table predates recovery points (its `steps` column): add it with `{}` \
                 (the store's docs, \"Migrations\")",
                super::statements::ADD_STEPS
            )
        }
        _ => String::new(),
    };
    StoreError::new(
        kind,
        format!("MySQL {operation} failed: {error}{migration}"),
    )
    .with_source(error)
}

/// The error numbers by which the server refuses a write of the
/// operation's for what it holds (a business rule), not for a fault.
const REFUSALS: [u16; 7] = [1062, 1451, 1452, 3819, 4025, 1048, 1644];

/// A failure of the operation's write `index`: a refusal (its
/// [`WriteRefusal`] names the error number, as text, and the constraint
/// or key the message names), or what [`from_sqlx`] says.
pub(super) fn from_write(index: usize, error: sqlx::Error) -> StoreError {
    let refused = number(&error).filter(|number| REFUSALS.contains(number));
    let (Some(number), Some(database)) = (refused, error.as_database_error()) else {
        return from_sqlx("write", error);
    };
    let message = database.message().to_owned();
    let mut refusal = WriteRefusal::new(index, number.to_string(), message.clone());
    if let Some(constraint) = constraint_of(&message) {
        refusal = refusal.with_constraint(constraint);
    }
    StoreError::new(
        StoreErrorKind::WriteRejected,
        format!("MySQL refused write {index} of the operation ({number}): {message}"),
    )
    .with_write_refusal(refusal)
    .with_source(error)
}

/// The constraint or key a refusal's message names: MySQL's
/// "Check constraint 'c' is violated", MariaDB's "CONSTRAINT `c` failed",
/// "Duplicate entry 'v' for key 't.k'".
fn constraint_of(message: &str) -> Option<String> {
    let after = ["onstraint '", "ONSTRAINT `", "for key '", "CONSTRAINT `"]
        .iter()
        .find_map(|marker| message.find(marker).map(|at| &message[at + marker.len()..]))?;
    let name = after.split(['\'', '`']).next()?;
    // A key named with its table (MySQL 8: `charges.PRIMARY`).
    let name = name.rsplit('.').next().unwrap_or(name);
    (!name.is_empty()).then(|| name.to_owned())
}

#[cfg(test)]
mod tests {
    use super::constraint_of;

    #[test]
    fn a_refusal_names_the_constraint_its_message_names() {
        let cases = [
            (
                "Check constraint 'balance_positive' is violated.",
                Some("balance_positive"),
            ),
            (
                "CONSTRAINT `balance_positive` failed for `db`.`accounts`",
                Some("balance_positive"),
            ),
            (
                "Duplicate entry 'ch_1' for key 'charges.PRIMARY'",
                Some("PRIMARY"),
            ),
            ("Duplicate entry 'ch_1' for key 'PRIMARY'", Some("PRIMARY")),
            ("Column 'amount' cannot be null", None),
            ("", None),
            ("Check constraint '", None),
        ];
        for (message, expected) in cases {
            assert_eq!(constraint_of(message).as_deref(), expected, "{message}");
        }
    }
}
