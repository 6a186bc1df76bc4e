//! Time, injectable: leases and expirations are compared against the
//! engine's clock, so tests can move time instead of sleeping (and instead
//! of racing DynamoDB Local's TTL sweeper).

use std::{
    fmt,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// A source of wall-clock time in epoch milliseconds.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// The current time, epoch milliseconds.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        epoch_ms(SystemTime::now())
    }
}

/// A clock that only moves when told to; clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock standing at `epoch_ms`.
    pub fn new(epoch_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(epoch_ms)))
    }

    /// A clock standing at the system's current time.
    pub fn starting_now() -> Self {
        Self::new(SystemClock.now_ms())
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.0.fetch_add(duration_ms(by), Ordering::SeqCst);
    }

    /// Sets the clock to `epoch_ms`.
    pub fn set(&self, epoch_ms: u64) {
        self.0.store(epoch_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// Epoch milliseconds of `time`; times before the epoch count as the epoch.
pub(crate) fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(duration_ms)
        .unwrap_or_default()
}

pub(crate) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
