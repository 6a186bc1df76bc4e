//! sqlx errors translated into the crate's [`StoreError`]s: nothing above
//! the store sees the driver. A server's SQLSTATE goes through the table
//! both PostgreSQL stores share (`kind_of_sqlstate`).

use crate::{
    store::pg::sqlstate::{is_write_refusal, kind_of_sqlstate, missing_steps_hint},
    StoreError, StoreErrorKind, WriteRefusal,
};
use sqlx::postgres::PgDatabaseError;

/// The server's error, when the server refused the statement.
fn server_error(error: &sqlx::Error) -> Option<&PgDatabaseError> {
    error
        .as_database_error()?
        .try_downcast_ref::<PgDatabaseError>()
}

/// The kind of a driver error.
fn kind_of(error: &sqlx::Error) -> StoreErrorKind {
    use sqlx::Error;
    match error {
        Error::Database(_) => match server_error(error) {
            Some(db) => kind_of_sqlstate(db.code()),
            // A database error of another driver's: cannot be told.
            None => StoreErrorKind::Other,
        },
        // The connection failed or closed, or the pool had none to give
        // within its acquire timeout: an outage.
        Error::Io(_) | Error::PoolTimedOut | Error::WorkerCrashed => StoreErrorKind::Unavailable,
        // A TLS handshake that failed (an untrusted certificate, a server
        // without TLS), bad options, a closed pool (the application shut it
        // down: no retry reopens it), a type the server does not have: no
        // retry will change any of them.
        Error::Tls(_)
        | Error::Configuration(_)
        | Error::PoolClosed
        | Error::TypeNotFound { .. }
        | Error::InvalidArgument(_) => StoreErrorKind::Misconfigured,
        // A value the driver could not encode: refused before the server
        // saw it.
        Error::Encode(_) => StoreErrorKind::Rejected,
        // A column that does not decode as the store's.
        Error::ColumnDecode { .. }
        | Error::Decode(_)
        | Error::ColumnNotFound(_)
        | Error::ColumnIndexOutOfBounds { .. } => StoreErrorKind::CorruptRecord,
        // A protocol error (a message out of order, through a pooler that
        // mixed two clients' statements) and anything sqlx adds later:
        // fails closed, never an outage that fail-open would run through.
        _ => StoreErrorKind::Other,
    }
}

/// What went wrong, in the server's words where it gave some.
fn describe(error: &sqlx::Error) -> String {
    match server_error(error) {
        Some(db) => {
            let mut text = format!("{}: {}", db.code(), db.message());
            if let Some(detail) = db.detail() {
                text.push_str(&format!(" ({detail})"));
            }
            if let Some(hint) = db.hint() {
                text.push_str(&format!("; hint: {hint}"));
            }
            text
        }
        None => error.to_string(),
    }
}

/// The SQLSTATE of a server's refusal, if the server refused.
pub(super) fn sqlstate(error: &sqlx::Error) -> Option<&str> {
    server_error(error).map(PgDatabaseError::code)
}

/// Maps a failed statement of the protocol's.
pub(super) fn from_sqlx(operation: &'static str, error: sqlx::Error) -> StoreError {
    StoreError::new(
        kind_of(&error),
        format!(
            "PostgreSQL {operation} failed: {}{}",
            describe(&error),
            // A statement of the store's on a table made before its
            // `steps` column: say which migration adds it.
            server_error(&error)
                .and_then(|db| missing_steps_hint(db.code(), db.message()))
                .unwrap_or_default()
        ),
    )
    .with_source(error)
}

/// Maps a failed statement of the handler's own (its `index`-th write): a
/// constraint, a malformed statement or a value the driver could not
/// encode is rejected, not retryable.
pub(super) fn from_write(index: usize, error: sqlx::Error) -> StoreError {
    let db = server_error(&error);
    let kind = match db {
        Some(db) if is_write_refusal(db.code()) => StoreErrorKind::WriteRejected,
        None if matches!(error, sqlx::Error::Encode(_)) => StoreErrorKind::WriteRejected,
        _ => kind_of(&error),
    };
    let refusal = db
        .filter(|_| kind == StoreErrorKind::WriteRejected)
        .map(|db| {
            let refusal = WriteRefusal::new(index, db.code(), db.message());
            match db.constraint() {
                Some(constraint) => refusal.with_constraint(constraint),
                None => refusal,
            }
        });
    let error = StoreError::new(
        kind,
        format!(
            "PostgreSQL transaction rolled back: the operation's write {index} failed: {}",
            describe(&error)
        ),
    )
    .with_source(error);
    match refusal {
        Some(refusal) => error.with_write_refusal(refusal),
        None => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_without_a_server_land_in_the_taxonomy() {
        let io = || std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        for (error, kind) in [
            (sqlx::Error::Io(io()), StoreErrorKind::Unavailable),
            (sqlx::Error::PoolTimedOut, StoreErrorKind::Unavailable),
            (sqlx::Error::PoolClosed, StoreErrorKind::Misconfigured),
            (
                sqlx::Error::Tls("untrusted".into()),
                StoreErrorKind::Misconfigured,
            ),
            (
                sqlx::Error::Encode("too long".into()),
                StoreErrorKind::Rejected,
            ),
            (
                sqlx::Error::Decode("bad".into()),
                StoreErrorKind::CorruptRecord,
            ),
            (
                sqlx::Error::Protocol("out of order".into()),
                StoreErrorKind::Other,
            ),
        ] {
            let text = error.to_string();
            assert_eq!(from_sqlx("SELECT", error).kind(), kind, "{text}");
        }
        let encode = from_write(2, sqlx::Error::Encode("too long".into()));
        assert_eq!(encode.kind(), StoreErrorKind::WriteRejected);
    }
}
