//! How long an attempt that finds its key in progress is told to wait.

use crate::{clock::duration_ms, store::Record};
use std::time::Duration;

/// What the wait of an attempt that finds its key in progress is measured
/// from ([`Error::InProgress`](crate::Error::InProgress)'s `retry_after`).
/// Whichever it is, the wait is whole seconds, at least one, and never
/// more than the time left on the other claim's lease rounded up to a
/// second: after that the key can be taken over, and a later retry would
/// only wait longer than it must.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(not(feature = "http"), allow(dead_code))]
pub(crate) enum RetryHint {
    /// The time left on the other claim's lease: when the key is sure to
    /// be free or completed (the default, and what the engine's own
    /// callers get).
    #[default]
    Lease,
    /// The other claim is expected to take this long in all: what is left
    /// of it since the claim was written; once the claim has run longer,
    /// that long again.
    Typical(Duration),
    /// This long, whatever the claim's age.
    Fixed(Duration),
}

/// The wait `hint` gives an attempt that found `record` in progress at
/// `now_ms`.
pub(crate) fn in_progress_retry_after(record: &Record, now_ms: u64, hint: RetryHint) -> Duration {
    let lease_left_ms = record
        .lease_until_ms
        .unwrap_or(record.expiration_s.saturating_mul(1000))
        .saturating_sub(now_ms);
    let wanted_ms = match hint {
        RetryHint::Lease => lease_left_ms,
        RetryHint::Fixed(after) => duration_ms(after),
        RetryHint::Typical(typical) => {
            let typical = duration_ms(typical);
            // A claim written by a clock ahead of this one has age 0.
            let age = record
                .created_at_ms
                .map_or(0, |created| now_ms.saturating_sub(created));
            if age < typical {
                typical - age
            } else {
                typical
            }
        }
    };
    // Whole seconds, rounded up (Retry-After has no fractions), and at
    // least one: a retry at once is wasted.
    let lease_s = lease_left_ms.div_ceil(1000).max(1);
    Duration::from_secs(wanted_ms.div_ceil(1000).clamp(1, lease_s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        store::{OwnerToken, RecordId, Status},
        Fingerprint,
    };

    /// A claim written at 1,000 s (epoch ms 1,000,000) with a 60 s lease.
    fn held() -> Record {
        Record {
            id: RecordId::new("p", "s", "k"),
            status: Status::InProgress,
            owner: OwnerToken::generate().expect("a token"),
            fingerprint: Fingerprint::of_bytes(b""),
            expiration_s: 5_000,
            lease_until_ms: Some(1_060_000),
            response: None,
            created_at_ms: Some(1_000_000),
            attempt: 1,
            first_started_ms: Some(1_000_000),
            completed_at_ms: None,
        }
    }

    #[test]
    fn each_hint_within_one_second_and_the_lease() {
        let record = held();
        let secs = Duration::from_secs;
        let ms = Duration::from_millis;
        for (hint, now_ms, expected) in [
            // The lease: what is left of it, rounded up.
            (RetryHint::Lease, 1_000_000, 60),
            (RetryHint::Lease, 1_002_500, 58),
            // A 3 s handler, 1 s in: 2 s left; 300 ms in: 2.7 s, so 3.
            (RetryHint::Typical(secs(3)), 1_001_000, 2),
            (RetryHint::Typical(secs(3)), 1_000_300, 3),
            // Past its typical duration: as long again.
            (RetryHint::Typical(secs(3)), 1_005_000, 3),
            // Short ones: one second.
            (RetryHint::Typical(ms(200)), 1_000_100, 1),
            (RetryHint::Typical(Duration::ZERO), 1_000_000, 1),
            (RetryHint::Fixed(ms(0)), 1_000_000, 1),
            (RetryHint::Fixed(secs(7)), 1_030_000, 7),
            // Never past the lease, rounded up: 59.5 s left.
            (RetryHint::Typical(secs(600)), 1_000_500, 60),
            (RetryHint::Fixed(secs(600)), 1_058_200, 2),
            // A lease about to lapse: at least a second.
            (RetryHint::Fixed(secs(5)), 1_059_900, 1),
            (RetryHint::Lease, 1_059_900, 1),
        ] {
            assert_eq!(
                in_progress_retry_after(&record, now_ms, hint),
                secs(expected),
                "{hint:?} at {now_ms}"
            );
        }
    }

    #[test]
    fn a_claim_without_its_time_is_as_young_as_can_be() {
        let record = Record {
            created_at_ms: None,
            ..held()
        };
        let hint = RetryHint::Typical(Duration::from_secs(4));
        assert_eq!(
            in_progress_retry_after(&record, 1_003_000, hint),
            Duration::from_secs(4)
        );
        // Written by a clock ahead of this one.
        assert_eq!(
            in_progress_retry_after(&held(), 999_000, hint),
            Duration::from_secs(4)
        );
    }
}
