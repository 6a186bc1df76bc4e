//! [`InFlight`]: the detached work of claimed requests, to wait for at
//! graceful shutdown.

use std::{fmt, time::Duration};
use tokio_util::task::TaskTracker;

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
}

impl InFlight {
    pub(crate) fn new(tracker: TaskTracker) -> Self {
        Self { tracker }
    }

    /// How many claimed requests are running now.
    pub fn len(&self) -> usize {
        self.tracker.len()
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
            .finish()
    }
}
