//! [`RetryAfter`]: what a `409` in progress tells its client to wait, and
//! the durations per route the layer estimates it from.

use crate::engine::RetryHint;
use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

/// What a route's first duplicates are told to wait, before any request on
/// it has completed (default of [`RetryAfter::estimated`]).
pub const DEFAULT_FIRST_RETRY_AFTER: Duration = Duration::from_secs(2);

/// What the `Retry-After` of a `409` (a duplicate of a request still in
/// progress) says: set with
/// [`in_progress_retry_after`](super::IdempotencyLayer::in_progress_retry_after).
///
/// Whichever it is, the header holds whole seconds, at least 1, and never
/// more than the time left on the running request's lease (rounded up to a
/// second): by then the key is completed, or free to be taken over.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter(Choice);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Choice {
    Estimated { first: Duration },
    Fixed(Duration),
    Lease,
}

impl RetryAfter {
    /// The time left of the route's typical duration (the default, with
    /// [`DEFAULT_FIRST_RETRY_AFTER`]): the layer keeps, per route, a moving
    /// average of how long its requests took from their claim to their
    /// completion (each new one counts for a quarter), and tells a
    /// duplicate that average less the running request's age (from its
    /// record's `created_at`). A request that has already run longer than
    /// that gets the average again; a route with no completed request yet,
    /// `first`.
    ///
    /// Routes are the layer's [`route`](super::route) (method and route
    /// template), in a table of 256 entries that never grows: a route that
    /// shares its entry with another (or a concrete path, where no template
    /// names the route) may find its estimate replaced, and then gets
    /// `first` until its next completion. Per process: another instance
    /// learns its own.
    pub fn estimated(first: Duration) -> Self {
        Self(Choice::Estimated { first })
    }

    /// `after`, whatever the running request's age.
    pub fn fixed(after: Duration) -> Self {
        Self(Choice::Fixed(after))
    }

    /// The time left on the running request's lease: the earliest moment
    /// at which a retry is sure to get something else than `409`. Outside
    /// Lambda that is the engine's [default
    /// lease](crate::EngineBuilder::default_lease) (60 s) after the claim,
    /// however quick the handler: a client that obeys it waits a minute for
    /// a request that took a second.
    pub fn lease() -> Self {
        Self(Choice::Lease)
    }

    /// Whether requests' durations are measured, per route.
    pub(crate) fn estimates(&self) -> bool {
        matches!(self.0, Choice::Estimated { .. })
    }

    /// The engine's hint for a request on the route keyed `route`.
    pub(crate) fn hint(&self, durations: &Durations, route: u64) -> RetryHint {
        match self.0 {
            Choice::Estimated { first } => {
                RetryHint::Typical(durations.typical(route).unwrap_or(first))
            }
            Choice::Fixed(after) => RetryHint::Fixed(after),
            Choice::Lease => RetryHint::Lease,
        }
    }
}

impl Default for RetryAfter {
    fn default() -> Self {
        Self::estimated(DEFAULT_FIRST_RETRY_AFTER)
    }
}

impl fmt::Debug for RetryAfter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Choice::Estimated { first } => f
                .debug_struct("RetryAfter::Estimated")
                .field("first", &first)
                .finish(),
            Choice::Fixed(after) => f.debug_tuple("RetryAfter::Fixed").field(&after).finish(),
            Choice::Lease => f.write_str("RetryAfter::Lease"),
        }
    }
}

const SLOTS: usize = 256;

/// The typical duration of each route's requests: a direct-mapped table,
/// each entry one atomic word holding a tag of the route's hash (high 32
/// bits, never 0) and its moving average in milliseconds (low 32 bits).
/// Fixed in size, lock-free; two updates at once may lose one, which an
/// estimate can afford.
#[derive(Clone)]
pub(crate) struct Durations(Arc<[AtomicU64; SLOTS]>);

impl Default for Durations {
    fn default() -> Self {
        Self(Arc::new(std::array::from_fn(|_| AtomicU64::new(0))))
    }
}

impl Durations {
    fn slot(&self, key: u64) -> (&AtomicU64, u64) {
        let index = usize::try_from(key % SLOTS as u64).unwrap_or(0);
        (&self.0[index], (key >> 32 | 1) << 32)
    }

    /// The route's moving average, if one of its requests has completed
    /// (and no other route has taken its entry since).
    pub(crate) fn typical(&self, key: u64) -> Option<Duration> {
        let (slot, tag) = self.slot(key);
        let word = slot.load(Ordering::Relaxed);
        (word & !u64::from(u32::MAX) == tag)
            .then(|| Duration::from_millis(word & u64::from(u32::MAX)))
    }

    /// Counts a request on the route that took `took_ms` from its claim to
    /// its completion: a quarter of the new average.
    pub(crate) fn record(&self, key: u64, took_ms: u64) {
        let took_ms = took_ms.min(u64::from(u32::MAX));
        let (slot, tag) = self.slot(key);
        let word = slot.load(Ordering::Relaxed);
        let average = if word & !u64::from(u32::MAX) == tag {
            let old = word & u64::from(u32::MAX);
            // (3 old + new) / 4, in u64: no overflow from two u32s.
            (3 * old + took_ms) / 4
        } else {
            took_ms
        };
        slot.store(tag | average, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{Hash, Hasher};

    /// A key for a route, as `scope::route_key` makes them.
    fn key(route: &str) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        route.hash(&mut hasher);
        hasher.finish()
    }

    #[test]
    fn a_moving_average_per_route_in_a_table_that_never_grows() {
        let durations = Durations::default();
        let charges = key("POST /v1/charges");
        let refunds = key("POST /v1/refunds");
        assert_eq!(durations.typical(charges), None);
        durations.record(charges, 1_000);
        assert_eq!(
            durations.typical(charges),
            Some(Duration::from_millis(1_000))
        );
        durations.record(charges, 3_000);
        assert_eq!(
            durations.typical(charges),
            Some(Duration::from_millis(1_500))
        );
        durations.record(refunds, 200);
        assert_eq!(durations.typical(refunds), Some(Duration::from_millis(200)));
        assert_eq!(
            durations.typical(charges),
            Some(Duration::from_millis(1_500))
        );
        // Another route in the same entry replaces it: the first loses its
        // estimate rather than sharing a wrong one.
        let rival = (1..)
            .map(|n| key(&format!("POST /v1/orders/{n}")))
            .find(|key| {
                key % SLOTS as u64 == charges % SLOTS as u64
                    && (key >> 32 | 1) != (charges >> 32 | 1)
            })
            .expect("a key in the same entry");
        durations.record(rival, 50);
        assert_eq!(durations.typical(charges), None);
        assert_eq!(durations.typical(rival), Some(Duration::from_millis(50)));
        // Longer than a u32 of milliseconds: held at its largest.
        durations.record(refunds, u64::MAX);
        assert!(durations.typical(refunds) > Some(Duration::from_secs(1_000_000)));
    }

    #[test]
    fn each_choice_gives_its_hint() {
        let durations = Durations::default();
        let route = key("POST /v1/charges");
        let secs = Duration::from_secs;
        assert_eq!(
            RetryAfter::default().hint(&durations, route),
            RetryHint::Typical(DEFAULT_FIRST_RETRY_AFTER)
        );
        durations.record(route, 4_000);
        assert_eq!(
            RetryAfter::estimated(secs(9)).hint(&durations, route),
            RetryHint::Typical(secs(4))
        );
        assert_eq!(
            RetryAfter::fixed(secs(5)).hint(&durations, route),
            RetryHint::Fixed(secs(5))
        );
        assert_eq!(
            RetryAfter::lease().hint(&durations, route),
            RetryHint::Lease
        );
    }
}
