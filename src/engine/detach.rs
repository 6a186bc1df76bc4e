//! Work that goes on when the future that started it is dropped.

use futures_util::task::AtomicWaker;
use std::{
    future::{poll_fn, Future},
    pin::Pin,
    sync::Arc,
    task::{Poll, Wake, Waker},
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
    S: FnOnce(Owned<F>, &Handle) -> JoinHandle<F::Output>,
{
    let Ok(runtime) = Handle::try_current() else {
        return Some(work.await);
    };
    // The work is polled in place with a waker that wakes whoever polls it
    // now: a future that keeps the first waker it was given (a hand-written
    // one often does) still wakes the work's task after the move.
    let owner = Arc::new(Owner(AtomicWaker::new()));
    let forwarding = Waker::from(Arc::clone(&owner));
    // Matched by value: the output's room (some hundreds of bytes) is not
    // kept in this future while it waits for the task.
    match poll_fn(|cx| {
        owner.0.register(cx.waker());
        Poll::Ready(
            work.as_mut()
                .poll(&mut std::task::Context::from_waker(&forwarding)),
        )
    })
    .await
    {
        Poll::Ready(output) => return Some(output),
        Poll::Pending => {}
    }
    match spawn(Owned { work, owner }, &runtime).await {
        Ok(output) => Some(output),
        Err(error) => match error.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(_) => None,
        },
    }
}

/// Whoever polls the work now: the caller during its first poll, then
/// its own task.
struct Owner(AtomicWaker);

impl Wake for Owner {
    fn wake(self: Arc<Self>) {
        self.0.wake();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.wake();
    }
}

/// Detached work on its own task, which it names as the work's owner at
/// every poll.
pub(crate) struct Owned<F: Future> {
    work: Pin<Box<F>>,
    owner: Arc<Owner>,
}

impl<F: Future> Future for Owned<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        self.owner.0.register(cx.waker());
        self.work.as_mut().poll(cx)
    }
}
