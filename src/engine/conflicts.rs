//! Concurrent writes that conflict (a PostgreSQL serialization failure or
//! deadlock, a DynamoDB transaction conflict) are tried again, a few times
//! with jitter, before anything else decides.

use crate::{StoreError, StoreErrorKind};
use std::{future::Future, time::Duration};
use tracing::debug;

/// How many times a claim is tried when it conflicts with a concurrent
/// write (a PostgreSQL serialization failure or deadlock, a DynamoDB
/// transaction conflict) before a consistent read settles it.
pub(crate) const CONFLICT_TRIES: u32 = 5;

/// How many times a single-write commit is tried when it conflicts with a
/// concurrent one, or finds the record changed.
pub(super) const COMMIT_TRIES: u32 = 4;

/// A random wait before trying a conflicted commit again: up to 10 ms,
/// doubling per try, so that duplicates stop colliding.
pub(super) fn conflict_backoff(try_number: u32) -> Duration {
    let ceiling_ms = 10u64 << try_number.min(6);
    let noise = getrandom::u64().unwrap_or(ceiling_ms / 2);
    Duration::from_millis(noise % ceiling_ms + 1)
}

/// Calls `call` again while it fails with a conflict (a concurrent write
/// won), a few times with jitter: for fenced writes, which a retry cannot
/// apply twice.
pub(super) async fn retry_conflicts<T, F, Fut>(mut call: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut tries = 0;
    loop {
        match call().await {
            Err(error)
                if error.kind() == StoreErrorKind::Conflict && tries + 1 < CONFLICT_TRIES =>
            {
                debug!(tries, %error, "a fenced write conflicted; trying again");
                tokio::time::sleep(conflict_backoff(tries)).await;
                tries += 1;
            }
            result => return result,
        }
    }
}
