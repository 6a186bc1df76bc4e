//! A clock tests move by hand.

use crate::{
    clock::{duration_ms, Clock},
    SystemClock,
};
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

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
