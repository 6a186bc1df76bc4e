//! tokio-postgres and pool errors translated into the crate's
//! [`StoreError`]s: nothing above the store sees the driver.

use crate::{StoreError, StoreErrorKind};

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
pub(super) fn kind_of_code(code: &str) -> StoreErrorKind {
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

/// The kind of a driver error.
fn kind_of(error: &tokio_postgres::Error) -> StoreErrorKind {
    match error.code() {
        Some(code) => kind_of_code(code.code()),
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
                || code.code().starts_with("22") // data exception
                || code.code().starts_with("P0") =>
        // a function's RAISE EXCEPTION
        {
            StoreErrorKind::WriteRejected
        }
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

#[cfg(test)]
mod tests {
    use super::kind_of_code;
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
            assert_eq!(kind_of_code(code), kind, "{code}");
        }
    }

    #[test]
    fn only_outages_may_run_without_a_claim() {
        for code in ["40001", "40P01", "42601", "22003", "XX000", "23505"] {
            assert!(!kind_of_code(code).is_outage(), "{code}");
        }
    }
}
