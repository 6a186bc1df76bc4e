//! Redis errors translated into the crate's [`StoreError`]s.

use crate::{StoreError, StoreErrorKind};
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Maps a failed command or script.
pub(super) fn from_redis(operation: &'static str, error: RedisError) -> StoreError {
    if is_not_a_record(&error) {
        return StoreError::new(
            StoreErrorKind::Misconfigured,
            format!(
                "Redis {operation} failed: the record's key holds something that is not an \
                 idempotency record (does another application write under this namespace? see \
                 RedisStore::namespace): {error}"
            ),
        )
        .with_source(error);
    }
    let kind = if error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
    {
        StoreErrorKind::Unavailable
    } else {
        match error.kind() {
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly,
            ) => StoreErrorKind::Unavailable,
            ErrorKind::AuthenticationFailed
            | ErrorKind::InvalidClientConfig
            | ErrorKind::Server(ServerErrorKind::NoScript | ServerErrorKind::NoPerm) => {
                StoreErrorKind::Misconfigured
            }
            _ if error.code() == Some("OOM") => StoreErrorKind::Throttled,
            _ => StoreErrorKind::Other,
        }
    };
    StoreError::new(kind, format!("Redis {operation} failed: {error}")).with_source(error)
}

/// A key of another type (`WRONGTYPE`), or a hash that is not a record
/// (`NOTRECORD`, from the claim script).
fn is_not_a_record(error: &RedisError) -> bool {
    matches!(error.code(), Some("WRONGTYPE" | "NOTRECORD"))
}
