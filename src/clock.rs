//! Time, injectable: leases and expirations are compared against the
//! engine's clock, so tests can move time instead of sleeping (and instead
//! of racing DynamoDB Local's TTL sweeper).

use std::{
    fmt,
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

/// Epoch milliseconds of `time`; times before the epoch count as the epoch.
pub(crate) fn epoch_ms(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH)
        .map(duration_ms)
        .unwrap_or_default()
}

pub(crate) fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
