//! tokio-postgres and pool errors translated into the crate's
//! [`StoreError`]s: nothing above the store sees the driver.

use crate::{
    store::pg::sqlstate::{is_write_refusal, kind_of_sqlstate, missing_steps_hint},
    StoreError, StoreErrorKind,
};

/// The kind of a driver error.
fn kind_of(error: &tokio_postgres::Error) -> StoreErrorKind {
    match error.code() {
        Some(code) => kind_of_sqlstate(code.code()),
        // A certificate the connector does not trust, or a server without
        // the TLS the store requires: no retry will change either.
        None if is_untrusted_certificate(error) || lacks_tls(error) => {
            StoreErrorKind::Misconfigured
        }
        // No SQLSTATE: the connection failed or closed.
        None => StoreErrorKind::Unavailable,
    }
}

/// Whether `error` or any error it was caused by satisfies `test`.
fn any_cause(
    error: &(dyn std::error::Error + 'static),
    test: impl Fn(&(dyn std::error::Error + 'static)) -> bool,
) -> bool {
    std::iter::successors(Some(error), |error| error.source()).any(test)
}

/// Whether `error` is tokio-postgres's answer to a server that declined
/// TLS when the store requires it (it has no error kind of its own).
fn lacks_tls(error: &(dyn std::error::Error + 'static)) -> bool {
    any_cause(error, |cause| {
        cause.to_string() == "server does not support TLS"
    })
}

/// Whether `error` comes from a TLS certificate that failed verification.
fn is_untrusted_certificate(error: &(dyn std::error::Error + 'static)) -> bool {
    any_cause(error, |cause| {
        let rustls = cause.downcast_ref::<rustls::Error>().or_else(|| {
            cause
                .downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        matches!(
            rustls,
            Some(
                rustls::Error::InvalidCertificate(_)
                    | rustls::Error::NoCertificatesPresented
                    | rustls::Error::UnsupportedNameType
            )
        )
    })
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
        format!(
            "PostgreSQL {operation} failed: {}{}",
            describe(&error),
            // A statement of the store's on a table made before its
            // `steps` column: say which migration adds it.
            error
                .as_db_error()
                .and_then(|db| missing_steps_hint(db.code().code(), db.message()))
                .unwrap_or_default()
        ),
    )
    .with_source(error)
}

/// Maps a failed statement of the handler's own (its `index`-th write):
/// a constraint or a malformed statement is rejected, not retryable.
pub(super) fn from_write(index: usize, error: tokio_postgres::Error) -> StoreError {
    let kind = match error.code() {
        Some(code) if is_write_refusal(code.code()) => StoreErrorKind::WriteRejected,
        _ => kind_of(&error),
    };
    let refusal = error
        .as_db_error()
        .filter(|_| kind == StoreErrorKind::WriteRejected)
        .map(|db| {
            let refusal = crate::WriteRefusal::new(index, db.code().code(), db.message());
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

/// Maps a failure to get a connection from the pool.
pub(super) fn from_pool(error: deadpool_postgres::PoolError) -> StoreError {
    let kind = match &error {
        deadpool_postgres::PoolError::Backend(error) => kind_of(error),
        _ => StoreErrorKind::Unavailable,
    };
    StoreError::new(kind, format!("PostgreSQL connection unavailable: {error}")).with_source(error)
}
