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

/// An invocation's deadline as the Lambda runtime API sends it (epoch
/// milliseconds), or `None` when the value cannot be one: `0` (a default
/// `Context`, outside Lambda) or any time before 2001, such as the
/// `600000` that `cargo lambda watch` sends (its timeout, not a time), which
/// read as a deadline would cut every lease to its minimum second.
pub(crate) fn invocation_deadline_ms(epoch_ms: u64) -> Option<u64> {
    /// 2001-09-09T01:46:40Z.
    const EARLIEST: u64 = 1_000_000_000_000;
    (epoch_ms >= EARLIEST).then_some(epoch_ms)
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
