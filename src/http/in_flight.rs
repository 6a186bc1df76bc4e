//! [`InFlight`]: the detached work of claimed requests, to wait for at
//! graceful shutdown, and the bound on how much of it runs at once.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio_util::task::{task_tracker::TaskTrackerToken, TaskTracker};

/// How many requests may run from their claim to their answer at once, by
/// default ([`max_in_flight`](super::IdempotencyLayer::max_in_flight)).
pub const DEFAULT_MAX_IN_FLIGHT: usize = 1024;

/// The requests that have claimed their key and are still running,
/// detached from their clients' connections (see
/// [`IdempotencyLayer::in_flight`](super::IdempotencyLayer::in_flight)):
/// in place until they first wait, then on tasks of their own.
///
/// A claimed request runs to its end even when its client leaves, so that
/// its record is completed (or released) rather than left in progress until
/// its lease lapses. At graceful shutdown, wait for that work after the
/// server has stopped accepting requests: a process that exits first leaves
/// those records in progress, and their retries wait out the lease, then
/// run again.
///
/// ```no_run
/// # async fn serve(app: axum::Router, listener: tokio::net::TcpListener,
/// #     layer: lambda_idempotency::http::IdempotencyLayer<lambda_idempotency::MemoryStore>,
/// #     shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> std::io::Result<()> {
/// use std::time::Duration;
///
/// let in_flight = layer.in_flight();
/// axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
/// // Within the orchestrator's grace period (ECS: 30 s by default).
/// if !in_flight.wait(Duration::from_secs(25)).await {
///     eprintln!("{} idempotent requests still running at exit", in_flight.len());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct InFlight {
    tracker: TaskTracker,
    limit: usize,
}

impl InFlight {
    pub(crate) fn new(slots: &Slots) -> Self {
        Self {
            tracker: slots.tracker.clone(),
            limit: slots.max,
        }
    }

    /// How many requests are running now, from their claim to their answer
    /// (a replay for the short time it takes too), their clients connected
    /// or gone: the count the [bound](super::IdempotencyLayer::max_in_flight)
    /// applies to. One atomic load: cheap enough to export as a gauge on
    /// every request or on a timer.
    pub fn len(&self) -> usize {
        self.tracker.len()
    }

    /// The most that may run at once
    /// ([`max_in_flight`](super::IdempotencyLayer::max_in_flight)): a
    /// request that finds [`len`](Self::len) there is answered `503`.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }

    /// Waits until no claimed request is running, at most `timeout`:
    /// `true` when none is left. Requests that claim their key meanwhile
    /// are waited for too.
    pub async fn wait(&self, timeout: Duration) -> bool {
        // Closing only lets `wait` finish once the tracker is empty; work
        // can still be added, and is still tracked.
        self.tracker.close();
        tokio::time::timeout(timeout, self.tracker.wait())
            .await
            .is_ok()
    }
}

impl fmt::Debug for InFlight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InFlight")
            .field("running", &self.tracker.len())
            .field("limit", &self.limit)
            .finish()
    }
}

/// The layer's count of running work and its bound, shared by every clone
/// of the layer and every service it makes.
#[derive(Clone)]
pub(crate) struct Slots {
    tracker: TaskTracker,
    pub(crate) max: usize,
    /// Whether the last request was refused: the first refusal after an
    /// admission is logged as a warning, the others not (a flood would
    /// otherwise log a line per request).
    refusing: Arc<AtomicBool>,
}

impl Default for Slots {
    fn default() -> Self {
        Self {
            tracker: TaskTracker::new(),
            max: DEFAULT_MAX_IN_FLIGHT,
            refusing: Arc::default(),
        }
    }
}

impl Slots {
    /// How many requests hold a slot now.
    pub(crate) fn running(&self) -> usize {
        self.tracker.len()
    }

    /// A slot for one request's work, held until the work ends (its token
    /// is dropped with the work's future: when it returns, panics, or is
    /// cancelled with its runtime), or `None` when `max` are taken.
    ///
    /// The token is taken first and the count read after it, so two
    /// requests racing for the last slot can both be refused, never both
    /// admitted: the count never passes `max`. One atomic add and one load
    /// on the hot path, as the tracker already cost.
    pub(crate) fn take(&self) -> Option<TaskTrackerToken> {
        let token = self.tracker.token();
        let running = self.tracker.len();
        if running > self.max {
            drop(token);
            if !self.refusing.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    limit = self.max,
                    "max_in_flight requests are running: further idempotent requests are answered 503 (idempotency-overloaded) until some finish"
                );
            }
            return None;
        }
        if self.refusing.load(Ordering::Relaxed) {
            self.refusing.store(false, Ordering::Relaxed);
        }
        Some(token)
    }
}
