//! Work that goes on when the future that started it is dropped.

use std::future::Future;
use tokio::{runtime::Handle, task::JoinHandle};

/// Runs `work` on a task of its own, which `spawn` starts on the current
/// runtime, and waits for it: dropping this future leaves the work
/// running. A panic in the work is raised again here, so the caller's
/// panic handling (a `CatchPanicLayer`) sees it. `None` when the runtime
/// cancelled the task (it is shutting down). Without a tokio runtime (a
/// caller on another executor) the work runs in place.
pub(crate) async fn detached<F, S>(work: F, spawn: S) -> Option<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
    S: FnOnce(F, &Handle) -> JoinHandle<F::Output>,
{
    let Ok(runtime) = Handle::try_current() else {
        return Some(work.await);
    };
    match spawn(work, &runtime).await {
        Ok(output) => Some(output),
        Err(error) => match error.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => None,
        },
    }
}
