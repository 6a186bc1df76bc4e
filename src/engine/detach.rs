//! Work that goes on when the future that started it is dropped.

use futures_util::task::AtomicWaker;
use std::{
    future::Future,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll, Wake, Waker},
};
use tokio::{runtime::Handle, task::JoinHandle};

/// Runs `work` so that dropping this future leaves it running, and waits
/// for it.
///
/// The work is polled once in place first: work that needs no I/O (a
/// replay or a whole request on an in-process store) is done by then, and
/// costs no task and no hop between threads. Work still pending after that
/// poll is handed, in the same poll of this future, to a task of its own
/// on the current runtime: there is no moment at which dropping this future
/// could cut it short. A panic in the work, in place or on its task, is
/// raised here, so the caller's panic handling (a `CatchPanicLayer`) sees
/// it. `None` when the runtime cancelled the task (it is shutting down).
/// Without a tokio runtime (a caller on another executor) the work runs in
/// place.
///
/// The work comes boxed: a future of the request's whole pipeline (some
/// kilobytes) held by value here would be held twice in the caller's.
pub(crate) fn detached<F>(work: Pin<Box<F>>) -> Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    Detached::NotPolled(work)
}

/// The future [`detached`] returns. Written out rather than an `async`
/// block: the work's output (some hundreds of bytes for a request) goes
/// straight from the work's poll to this one's, where an `async` block's
/// matches and returns moved it three times, and the future is the size of
/// a box, not of its states' union.
pub(crate) enum Detached<F: Future> {
    /// Not polled yet.
    NotPolled(Pin<Box<F>>),
    /// Running in place, without a runtime to hand it to.
    InPlace(Pin<Box<F>>),
    /// On a task of its own.
    OnItsTask(JoinHandle<F::Output>),
    /// Its output given.
    Done,
}

impl<F> Future for Detached<F>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // Every variant is `Unpin` (boxes and a handle).
        let this = &mut *self;
        loop {
            match std::mem::replace(this, Detached::Done) {
                Detached::NotPolled(work) => {
                    let Ok(runtime) = Handle::try_current() else {
                        *this = Detached::InPlace(work);
                        continue;
                    };
                    match first_poll(work, cx) {
                        Ok(output) => return Poll::Ready(Some(output)),
                        Err(owned) => *this = Detached::OnItsTask(runtime.spawn(owned)),
                    }
                }
                Detached::InPlace(mut work) => {
                    let Poll::Ready(output) = work.as_mut().poll(cx) else {
                        *this = Detached::InPlace(work);
                        return Poll::Pending;
                    };
                    return Poll::Ready(Some(output));
                }
                Detached::OnItsTask(mut task) => {
                    let Poll::Ready(joined) = Pin::new(&mut task).poll(cx) else {
                        *this = Detached::OnItsTask(task);
                        return Poll::Pending;
                    };
                    return Poll::Ready(match joined {
                        Ok(output) => Some(output),
                        Err(error) => match error.try_into_panic() {
                            Ok(panic) => std::panic::resume_unwind(panic),
                            Err(_) => None,
                        },
                    });
                }
                Detached::Done => panic!("`detached` polled after it completed"),
            }
        }
    }
}

/// The work's first poll, in place, with a waker that wakes whoever polls
/// it now: a future that keeps the first waker it was given (a
/// hand-written one often does) still wakes the work's task after the
/// move. Its output, or the work as its task will own it.
fn first_poll<F: Future>(mut work: Pin<Box<F>>, cx: &Context<'_>) -> Result<F::Output, Owned<F>> {
    let owner = Arc::new(Owner(AtomicWaker::new()));
    owner.0.register(cx.waker());
    let forwarding = Waker::from(Arc::clone(&owner));
    match work.as_mut().poll(&mut Context::from_waker(&forwarding)) {
        Poll::Ready(output) => Ok(output),
        Poll::Pending => Err(Owned { work, owner }),
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

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        self.owner.0.register(cx.waker());
        self.work.as_mut().poll(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::FutureExt;

    /// Without a tokio runtime, the work runs in place, to its end.
    #[test]
    fn without_a_runtime_the_work_runs_in_place() {
        let done = detached(Box::pin(async { 7 })).now_or_never();
        assert_eq!(done, Some(Some(7)));
    }

    /// Work still pending after its first poll goes to a task; a runtime
    /// that shuts down cancels that task, and the caller, polled after,
    /// gets `None` rather than a panic or a wait for ever.
    #[test]
    fn a_runtime_that_shuts_down_gives_none() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let mut waiting = detached(Box::pin(std::future::pending::<u8>()));
        runtime.block_on(async {
            assert!(futures_util::poll!(&mut waiting).is_pending());
            assert!(matches!(waiting, Detached::OnItsTask(_)), "on its task");
        });
        runtime.shutdown_background();
        assert_eq!(waiting.now_or_never(), Some(None));
    }

    /// Work that panics on its task has its panic raised in the caller,
    /// where a `CatchPanicLayer` sees it.
    #[test]
    fn a_panic_on_the_task_is_raised_in_the_caller() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let caught = runtime.block_on(
            std::panic::AssertUnwindSafe(detached(Box::pin(async {
                tokio::task::yield_now().await;
                panic!("the work's own panic");
            })))
            .catch_unwind(),
        );
        let panic = caught.expect_err("raised in the caller");
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"the work's own panic"));
    }
}
