//! The engine's one policy for contention: how often, and after what wait,
//! a step tries again when a concurrent write won (a PostgreSQL
//! serialization failure or deadlock, a DynamoDB transaction conflict) or
//! when the record that refused it was gone by the time it was read. Every
//! limit is named here, and every loop that retries a store write counts
//! against them.

use crate::{StoreError, StoreErrorKind};
use rand::TryRng;
use std::{future::Future, time::Duration};
use tracing::debug;

/// How many times a write is tried when it conflicts with a concurrent one,
/// before a consistent read settles it (a claim, a single write's commit)
/// or the conflict is returned (a completion, a release, an extension).
pub(crate) const CONFLICT_TRIES: u32 = 5;

/// How many times a claim or a single write is tried when the record that
/// refused it turns out not to be live (it expired, was released or lapsed
/// between the condition and the read).
pub(crate) const CLAIM_TRIES: usize = 3;

/// The wait before try `try_number + 1` after a conflict: random, up to
/// 10 ms doubling per try (at most 640 ms), so that duplicates stop
/// colliding.
fn conflict_backoff(try_number: u32) -> Duration {
    let ceiling_ms = 10u64 << try_number.min(6);
    let noise = rand::rngs::SysRng.try_next_u64().unwrap_or(ceiling_ms / 2);
    Duration::from_millis(noise % ceiling_ms + 1)
}

/// The tries of one contended step (a claim, a single write), counted
/// against [`CONFLICT_TRIES`] and [`CLAIM_TRIES`].
#[derive(Debug, Default)]
pub(super) struct Contention {
    conflicts: u32,
    refusals: usize,
}

impl Contention {
    /// Whether the step may try again.
    pub(super) fn may_try(&self) -> bool {
        self.conflicts < CONFLICT_TRIES && self.refusals < CLAIM_TRIES
    }

    /// A concurrent write won: counts it, and says how long to wait
    /// before the next try.
    pub(super) fn conflicted(&mut self, error: &StoreError) -> Duration {
        debug!(conflicts = self.conflicts, %error, "a write conflicted; trying again");
        self.conflicts += 1;
        conflict_backoff(self.conflicts - 1)
    }

    /// The record that refused the write was no longer there to decide.
    pub(super) fn refused(&mut self) {
        self.refusals += 1;
    }

    /// How many tries were made.
    pub(super) fn tries(&self) -> usize {
        self.refusals + self.conflicts as usize
    }
}

/// Calls `call` again while it fails with a conflict, within
/// [`CONFLICT_TRIES`] and with [`Contention`]'s backoff: for fenced writes,
/// which a retry cannot apply twice.
pub(super) async fn retry_conflicts<T, F, Fut>(mut call: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, StoreError>>,
{
    let mut contention = Contention::default();
    loop {
        match call().await {
            Err(error)
                if error.kind() == StoreErrorKind::Conflict
                    && contention.conflicts + 1 < CONFLICT_TRIES =>
            {
                tokio::time::sleep(contention.conflicted(&error)).await;
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wait after a conflict is random, at least 1 ms (never a busy
    /// loop against the store) and under 10 ms doubling per try, at most
    /// 640 ms.
    #[test]
    fn the_wait_after_a_conflict_is_random_and_bounded() {
        for try_number in 0..10u32 {
            let ceiling = Duration::from_millis(10 << try_number.min(6));
            let waits: Vec<Duration> = (0..200).map(|_| conflict_backoff(try_number)).collect();
            assert!(
                waits
                    .iter()
                    .all(|wait| *wait >= Duration::from_millis(1) && *wait <= ceiling),
                "try {try_number}: {waits:?}"
            );
            // Random: 200 draws from 10 or more values are not all one.
            assert!(
                waits.iter().any(|wait| *wait != waits[0]),
                "try {try_number}"
            );
        }
    }

    fn conflict() -> StoreError {
        StoreError::new(StoreErrorKind::Conflict, "a concurrent write won")
    }

    /// The step's first conflict waits within the first step's ceiling
    /// (10 ms), its second within the second's (20 ms): the backoff starts
    /// at its first step, not one further on.
    #[test]
    fn the_first_conflict_waits_within_the_first_step() {
        for _ in 0..200 {
            let mut contention = Contention::default();
            let first = contention.conflicted(&conflict());
            assert!(first <= Duration::from_millis(10), "first wait {first:?}");
            let second = contention.conflicted(&conflict());
            assert!(
                second <= Duration::from_millis(20),
                "second wait {second:?}"
            );
        }
    }

    /// The tries a contended step reports (in its error) count both the
    /// conflicts and the refusals by a record no longer live.
    #[test]
    fn the_tries_count_conflicts_and_refusals() {
        let mut contention = Contention::default();
        assert_eq!(contention.tries(), 0);
        contention.refused();
        contention.refused();
        let _ = contention.conflicted(&conflict());
        assert_eq!(contention.tries(), 3);
        assert!(contention.may_try());
        contention.refused();
        assert!(!contention.may_try(), "{} refusals", CLAIM_TRIES);
    }

    /// A fenced write that always conflicts is tried exactly
    /// [`CONFLICT_TRIES`] times, and its last conflict is returned; one
    /// that conflicts once is tried twice and its success returned.
    #[tokio::test(start_paused = true)]
    async fn a_write_that_always_conflicts_is_tried_conflict_tries_times() {
        let calls = std::sync::atomic::AtomicU32::new(0);
        let result: Result<(), StoreError> = retry_conflicts(|| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async { Err(conflict()) }
        })
        .await;
        assert_eq!(result.unwrap_err().kind(), StoreErrorKind::Conflict);
        assert_eq!(calls.into_inner(), CONFLICT_TRIES);

        let calls = std::sync::atomic::AtomicU32::new(0);
        let result = retry_conflicts(|| {
            let call = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if call == 0 {
                    Err(conflict())
                } else {
                    Ok(call)
                }
            }
        })
        .await;
        assert_eq!(result.unwrap(), 1);
        assert_eq!(calls.into_inner(), 2);
    }
}
