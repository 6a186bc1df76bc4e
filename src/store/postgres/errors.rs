//! tokio-postgres and pool errors translated into the crate's
//! [`StoreError`]s: nothing above the store sees the driver.

use crate::{StoreError, StoreErrorKind};
use tokio_postgres::error::SqlState;

/// The kind of a driver error: connection trouble is transient, a missing
/// table or permission is misconfiguration.
fn kind_of(error: &tokio_postgres::Error) -> StoreErrorKind {
    let Some(code) = error.code() else {
        // No SQLSTATE: the connection failed or closed.
        return StoreErrorKind::Unavailable;
    };
    match code {
        c if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED => {
            StoreErrorKind::Conflict
        }
        c if *c == SqlState::UNDEFINED_TABLE
            || *c == SqlState::UNDEFINED_COLUMN
            || *c == SqlState::INSUFFICIENT_PRIVILEGE
            || *c == SqlState::INVALID_PASSWORD
            || *c == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            || *c == SqlState::INVALID_CATALOG_NAME =>
        {
            StoreErrorKind::Misconfigured
        }
        c if *c == SqlState::TOO_MANY_CONNECTIONS
            || *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::CRASH_SHUTDOWN
            || *c == SqlState::CANNOT_CONNECT_NOW
            || *c == SqlState::CONNECTION_FAILURE
            || *c == SqlState::QUERY_CANCELED =>
        {
            StoreErrorKind::Unavailable
        }
        _ => StoreErrorKind::Other,
    }
}

/// What went wrong, in the server's words where it gave some: the
/// driver's own `Display` says only "db error".
fn describe(error: &tokio_postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => {
            let mut text = format!("{}: {}", db.code().code(), db.message());
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

/// Maps a failed statement of the protocol's.
pub(super) fn from_pg(operation: &'static str, error: tokio_postgres::Error) -> StoreError {
    StoreError::new(
        kind_of(&error),
        format!("PostgreSQL {operation} failed: {}", describe(&error)),
    )
    .with_source(error)
}

/// Maps a failed statement of the handler's own (its `index`-th write):
/// a constraint or a malformed statement is rejected, not retryable.
pub(super) fn from_write(index: usize, error: tokio_postgres::Error) -> StoreError {
    let kind = match error.code() {
        Some(code)
            if code.code().starts_with("23") // integrity constraint violation
                || code.code().starts_with("42") // syntax error or access rule violation
                || code.code().starts_with("22") =>
        // data exception
        {
            StoreErrorKind::WriteRejected
        }
        _ => kind_of(&error),
    };
    StoreError::new(
        kind,
        format!(
            "PostgreSQL transaction rolled back: the operation's write {index} failed: {}",
            describe(&error)
        ),
    )
    .with_source(error)
}

/// Maps a failure to get a connection from the pool.
pub(super) fn from_pool(error: deadpool_postgres::PoolError) -> StoreError {
    let kind = match &error {
        deadpool_postgres::PoolError::Backend(error) => kind_of(error),
        _ => StoreErrorKind::Unavailable,
    };
    StoreError::new(kind, format!("PostgreSQL connection unavailable: {error}")).with_source(error)
}
