//! Work that goes on when the future that started it is dropped.

use std::{
    future::{poll_fn, Future},
    pin::Pin,
    task::Poll,
};
use tokio::{runtime::Handle, task::JoinHandle};

/// Runs `work` so that dropping this future leaves it running, and waits
/// for it.
///
/// The work is polled once in place first: work that needs no I/O (a
/// replay or a whole request on an in-process store) is done by then, and
/// costs no task and no hop between threads. Work still pending after that
/// poll is handed, in the same poll of this future, to a task of its own,
/// which `spawn` starts on the current runtime: there is no moment at which
/// dropping this future could cut it short. A panic in the work, in place
/// or on its task, is raised here, so the caller's panic handling (a
/// `CatchPanicLayer`) sees it. `None` when the runtime cancelled the task
/// (it is shutting down). Without a tokio runtime (a caller on another
/// executor) the work runs in place.
///
/// The work comes boxed: a future of the request's whole pipeline (some
/// kilobytes) held by value here would be held twice in the caller's.
pub(crate) async fn detached<F, S>(mut work: Pin<Box<F>>, spawn: S) -> Option<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
    S: FnOnce(Pin<Box<F>>, &Handle) -> JoinHandle<F::Output>,
{
    let Ok(runtime) = Handle::try_current() else {
        return Some(work.await);
    };
    // A future may be polled under one waker and then another: the task
    // polls it again at once, and registers its own.
    if let Poll::Ready(output) = poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await {
        return Some(output);
    }
    match spawn(work, &runtime).await {
        Ok(output) => Some(output),
        Err(error) => match error.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => None,
        },
    }
}
