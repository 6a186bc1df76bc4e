//! The work of a keyed request, from the claim on, detached from the
//! request's future, so that a client that leaves cuts nothing short.

use super::{waiting::run_waiting, Inner, LayerBody};
use crate::{
    engine::{detached, OwnedAttempt},
    http::{
        config::Config,
        respond::{Attempted, Failure, Live},
    },
    store::Store,
    Error,
};
use http::{Request, Response};
use std::{future::Future, sync::Arc};
use tokio::sync::oneshot;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tracing::Instrument;

/// How the detached work answered the request.
// Returned once a request and matched at once: boxing the common variant
// would cost an allocation a request to save a move.
#[allow(clippy::large_enum_variant)]
pub(super) enum DetachedAnswer<E, R> {
    /// With the attempt's result (the response, or why there is none).
    Answered(Attempted<E, R>, Live<R>),
    /// With the handler's response as it streams, before its record is
    /// complete: the work goes on until its body ends.
    Streaming(Response<R>),
}

/// Runs the attempt, from the claim on, so that the work goes on when the
/// request's future is dropped (hyper drops it when the client
/// disconnects, tower's `TimeoutLayer` at its deadline): the handler is not
/// cut short between its effect and the completion, and the record is
/// completed or released rather than left in progress until its lease
/// lapses, after which a retry would run it again. The work is polled once
/// in place and, if it waits for anything, moved to a task of its own in
/// that same poll (a replay, or a whole request on the memory store, costs
/// no task). A panic in the handler is raised again here, in the request's
/// own future, so an outer `CatchPanicLayer` still answers it.
///
/// A response body that would wait for more goes to the client at once
/// (`DetachedAnswer::Streaming`), while the work copies it for the record
/// and completes the record when it ends. Without a tokio runtime (a
/// caller on another executor) it runs in place, and such a body is read
/// whole first.
///
/// `slot` is the request's place in the bound on running work: it moves
/// with the work and is given back when the work's future is dropped (done,
/// panicked, or cancelled with its runtime).
pub(super) fn run_detached<S, St, B, ResBody>(
    config: Arc<Config<St>>,
    attempt: OwnedAttempt,
    route: Option<u64>,
    inner: S,
    request: Request<B>,
    slot: TaskTrackerToken,
) -> impl Future<Output = DetachedAnswer<S::Error, ResBody>>
where
    S: Inner<B, ResBody>,
    St: Store,
    B: LayerBody,
    ResBody: LayerBody,
{
    // A plain function (see the pipeline's note): what the work takes
    // moves into it here, and the future returned holds only the work's
    // box and the channel.
    //
    // Where the handler's response goes as soon as its body streams.
    let (early, streaming) = match tokio::runtime::Handle::try_current() {
        Ok(_) => {
            let (early, streaming) = oneshot::channel();
            (Some(early), Some(streaming))
        }
        Err(_) => (None, None),
    };
    // The handler and its request, until the attempt runs them: moved
    // into the work as one value and lent to `run_waiting`, so that no
    // future on the way holds the request twice.
    let mut not_run_yet = Some((inner, request));
    let work = async move {
        let _slot = slot;
        let mut live = None;
        let mut early = early;
        let result = run_waiting(
            &config,
            &attempt.attempt(),
            route,
            &mut not_run_yet,
            &mut live,
            &mut early,
        )
        .await;
        (result, live)
    }
    .in_current_span();
    let done = detached(Box::pin(work));
    async move {
        let answered = |done: Option<_>| {
            let (result, live) = done.unwrap_or_else(|| {
                // Only a runtime that shuts down cancels the task, and this
                // future goes with it: answered, should it be polled.
                (Err(Error::Operation(Failure::Cancelled)), None)
            });
            DetachedAnswer::Answered(result, live)
        };
        let Some(streaming) = streaming else {
            return answered(done.await);
        };
        tokio::pin!(done);
        tokio::select! {
            biased;
            done = &mut done => answered(done),
            // Dropping `done` leaves the work running on its task.
            Ok(response) = streaming => DetachedAnswer::Streaming(response),
        }
    }
}
