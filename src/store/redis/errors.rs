//! Redis errors translated into the crate's [`StoreError`]s: the one place
//! that decides a Redis failure's [`StoreErrorKind`]. The table is in the
//! module docs of [`super`]; [`kind_of`] is that table.

use crate::{StoreError, StoreErrorKind};
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// The code the store's scripts answer with when the key holds a hash that
/// is not a record (or a field a script reads is not what a record holds).
pub(super) const NOT_A_RECORD: &str = "NOTRECORD";

/// The code the store's scripts answer with when an argument is not a
/// number they can represent exactly; checked before any write.
pub(super) const REJECTED: &str = "REJECTED";

/// Maps a failed command or script.
pub(super) fn from_redis(operation: &'static str, error: RedisError) -> StoreError {
    let kind = kind_of(&error);
    let message = match error.code() {
        Some("WRONGTYPE" | NOT_A_RECORD) => format!(
            "Redis {operation} failed: the record's key holds something that is not an \
             idempotency record (does another application write under this namespace? see \
             RedisStore::namespace): {error}"
        ),
        Some("OOM") => format!(
            "Redis {operation} failed: the server is out of memory (maxmemory reached under \
             maxmemory-policy noeviction): {error}"
        ),
        _ if is_script_failure(&error) => format!(
            "Redis {operation} failed: the store's script raised an error (a field of the \
             record or an argument it could not use): {error}"
        ),
        _ => format!("Redis {operation} failed: {error}"),
    };
    StoreError::new(kind, message).with_source(error)
}

/// The kind of a Redis failure.
///
/// Outages (the only kinds fail-open may run through) are failures that a
/// later retry of the same call can get past without anyone acting: the
/// network, a node that is loading, failing over or demoted, a cluster
/// that is resharding or lost a slot's primary, a server busy with a long
/// script, a full server. Everything that says the setup or the data is
/// wrong is `Misconfigured`, never retried and never run unprotected.
pub(super) fn kind_of(error: &RedisError) -> StoreErrorKind {
    if error.is_io_error()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || error.is_timeout()
    {
        return StoreErrorKind::Unavailable;
    }
    match error.kind() {
        ErrorKind::Server(
            // A node restarting from its dump, a demoted primary (failover),
            // a replica that lost its primary, a cluster with an uncovered
            // slot, a multi-key retry during a migration; a redirection that
            // is still there once the cluster client's retries are spent (a
            // MOVED or ASK storm while slots move).
            ServerErrorKind::BusyLoading
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask,
        )
        | ErrorKind::ClusterConnectionNotFound => StoreErrorKind::Unavailable,
        // The script cache is refilled by the client (EVALSHA, then the
        // script's text): a NOSCRIPT that still reaches us is a setup
        // where scripts cannot be loaded. One key per script, so a
        // CROSSSLOT is not a state of the cluster either.
        ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Server(
            ServerErrorKind::NoScript | ServerErrorKind::NoPerm | ServerErrorKind::CrossSlot,
        ) => StoreErrorKind::Misconfigured,
        _ => match error.code() {
            // Another script runs past lua-time-limit: the server answers
            // nothing else until it ends or is killed.
            Some("BUSY") => StoreErrorKind::Unavailable,
            // maxmemory reached under noeviction: a capacity outage that
            // refuses writes before they happen.
            Some("OOM") => StoreErrorKind::Throttled,
            Some("NOAUTH" | "WRONGPASS" | "NOPERM") => StoreErrorKind::Misconfigured,
            Some("WRONGTYPE" | NOT_A_RECORD) => StoreErrorKind::Misconfigured,
            Some(REJECTED) => StoreErrorKind::Rejected,
            // A runtime error in the store's own scripts comes from what
            // they were handed or found, never from an outage: retrying
            // cannot help, and running the operation unprotected must not.
            _ if is_script_failure(error) => StoreErrorKind::Misconfigured,
            _ => StoreErrorKind::Other,
        },
    }
}

/// An error raised while one of the store's scripts ran: Redis appends
/// where (`script: <sha>, on @user_script:<line>.`), and Redis 6 says
/// `Error running script … @user_script`.
fn is_script_failure(error: &RedisError) -> bool {
    error.code() == Some("ERR") && error.detail().is_some_and(|d| d.contains("user_script"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error a server answers with `line` (RESP, without `-` and CRLF).
    fn server(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .and_then(redis::Value::extract_error)
        {
            Err(error) => error,
            Ok(value) => panic!("{line} parsed as {value:?}"),
        }
    }

    #[test]
    fn every_redis_error_has_its_kind() {
        use StoreErrorKind::*;
        let table = [
            ("LOADING Redis is loading the dataset in memory", Unavailable),
            (
                "READONLY You can't write against a read only replica.",
                Unavailable,
            ),
            ("MASTERDOWN Link with MASTER is down", Unavailable),
            ("CLUSTERDOWN The cluster is down", Unavailable),
            (
                "TRYAGAIN Multiple keys request during rehashing of slot",
                Unavailable,
            ),
            ("MOVED 3999 127.0.0.1:6381", Unavailable),
            ("ASK 3999 127.0.0.1:6381", Unavailable),
            (
                "BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.",
                Unavailable,
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'.",
                Throttled,
            ),
            (
                "OOM command not allowed when used memory > 'maxmemory'. script: 6049387058fe13062993fcc83a6403cf2946459d, on @user_script:1.",
                Throttled,
            ),
            ("NOSCRIPT No matching script.", Misconfigured),
            (
                "NOPERM User default has no permissions to run the 'evalsha' command",
                Misconfigured,
            ),
            ("NOAUTH Authentication required.", Misconfigured),
            (
                "WRONGPASS invalid username-password pair or user is disabled.",
                Misconfigured,
            ),
            (
                "CROSSSLOT Keys in request don't hash to the same slot",
                Misconfigured,
            ),
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                Misconfigured,
            ),
            (
                "NOTRECORD the key holds a hash that is not an idempotency record",
                Misconfigured,
            ),
            (
                "REJECTED argument expiration_s is not an integer below 2^53 script: 9c48, on @user_script:3.",
                Rejected,
            ),
            (
                "ERR user_script:1: attempt to compare number with nil script: 15ef, on @user_script:1.",
                Misconfigured,
            ),
            (
                "ERR value is not an integer or out of range script: 5590, on @user_script:1.",
                Misconfigured,
            ),
            (
                "ERR Error running script (call to f_15ef): @user_script:1: attempt to compare number with nil",
                Misconfigured,
            ),
            ("ERR unknown command 'FOO'", Other),
            ("EXECABORT Transaction discarded", Other),
            ("SOMETHINGNEW that nobody knows", Other),
        ];
        for (line, kind) in table {
            assert_eq!(kind_of(&server(line)), kind, "{line}");
        }
    }

    #[test]
    fn network_failures_and_timeouts_are_outages() {
        for io in [
            std::io::ErrorKind::TimedOut,
            std::io::ErrorKind::ConnectionRefused,
            std::io::ErrorKind::ConnectionReset,
            std::io::ErrorKind::BrokenPipe,
            std::io::ErrorKind::UnexpectedEof,
        ] {
            let error = RedisError::from(std::io::Error::new(io, "test"));
            assert_eq!(kind_of(&error), StoreErrorKind::Unavailable, "{io:?}");
        }
    }

    #[test]
    fn client_side_failures_have_their_kind() {
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "auth"));
        assert_eq!(kind_of(&auth), StoreErrorKind::Misconfigured);
        let config = RedisError::from((ErrorKind::InvalidClientConfig, "config"));
        assert_eq!(kind_of(&config), StoreErrorKind::Misconfigured);
        let no_node = RedisError::from((ErrorKind::ClusterConnectionNotFound, "no node"));
        assert_eq!(kind_of(&no_node), StoreErrorKind::Unavailable);
        let shape = RedisError::from((ErrorKind::UnexpectedReturnType, "shape"));
        assert_eq!(kind_of(&shape), StoreErrorKind::Other);
    }

    #[test]
    fn the_message_says_what_to_do() {
        let error = from_redis("claim", server("NOTRECORD status is \"FOO\""));
        assert!(
            error.to_string().contains("RedisStore::namespace"),
            "{error}"
        );
        let error = from_redis(
            "claim",
            server("OOM command not allowed when used memory > 'maxmemory'."),
        );
        assert!(error.to_string().contains("noeviction"), "{error}");
    }
}
