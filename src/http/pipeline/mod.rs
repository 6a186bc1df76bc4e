//! The request pipeline: the key and the body read, the scope, then the
//! attempt, claimed detached from the request's future, waiting for a
//! duplicate's result where configured.
//!
//! One request's way, a file for each step:
//!
//! - [`admission`]: what a request must bring before it claims anything (a
//!   key, a body that reads, a scope, a place in the bound on running
//!   work), and the layer's answers when it does not;
//! - [`powertools_lookup`]: the answer Powertools' records give first,
//!   during a migration;
//! - [`detach`]: the work, from the claim on, moved off the request's
//!   future;
//! - [`waiting`]: the attempt tried again while a duplicate holds the key,
//!   each try made through the engine as configured ([`attempt`]);
//! - [`handler`]: the handler's run under its claim;
//! - [`recording`]: its response read for its record, and
//!   [`teed_record`]: the record of one teed to the client as it streams.
//!
//! # Plain functions that return futures
//!
//! Every request allocates and moves the futures made here, so their size
//! is a cost of every request (BENCHMARKS.md, "Counted, not timed").
//! rustc keeps an `async fn`'s arguments for the whole of its future, beside
//! the locals and callee futures they are moved into: the request (some 240
//! bytes) would be held twice. So the levels on a request's way (`answer`,
//! `handle`, `keyless`, `run_detached`, `run_attempt`, `record_response`,
//! and `buffer_request` in `body`) are plain functions that take their
//! arguments apart, or move them into an `async` block, before returning a
//! future. Awaits that only rare requests reach (a body that streams, a
//! request keyed in its body that has no key) are boxed, so that the
//! futures every request allocates keep no room for them, and the
//! request's and the operation's fit the allocator's per-thread cache
//! (glibc's holds chunks up to 1,032 bytes; the sizes, measured, are in
//! CHANGELOG.md, "A new request through the HTTP layer costs 0.6 to 0.9 us
//! less").

mod admission;
mod attempt;
mod detach;
mod handler;
mod powertools_lookup;
mod recording;
mod teed_record;
mod waiting;

#[cfg(feature = "powertools")]
use self::powertools_lookup::powertools_first;
use self::{
    admission::{
        attempt_for, body_problem, key_of, key_only_in_header, keyless, read_header_key, refused,
        take_slot, unkeyed_after_body,
    },
    detach::{run_detached, DetachedAnswer},
};
use super::{
    body::{buffer_request, rebuild_request, Kind},
    config::Config,
    grpc_wire,
    metrics::HttpOutcome,
    problem::Problem,
    rebuild_body::RebuildBody,
    respond::respond,
    scope::scope_for,
};
use crate::{error::BoxError, store::Store};
use futures_util::{future::Either, FutureExt};
use http::{Request, Response};
use std::{future::Future, sync::Arc};
use tower::Service;
use tracing::{field, Instrument};

/// The service the layer wraps, as the pipeline runs it: on a task of its
/// own, its future and error sent across.
pub(super) trait Inner<B, R>:
    Service<Request<B>, Response = Response<R>, Future: Send, Error: Send + 'static> + Send + 'static
{
}

impl<S, B, R> Inner<B, R> for S
where
    S: Service<Request<B>, Response = Response<R>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
{
}

/// A request or response body as the layer handles it: read, rebuilt from
/// its bytes, and moved between tasks.
pub(super) trait LayerBody: RebuildBody<Data: Send, Error: Into<BoxError>> {}

impl<T> LayerBody for T
where
    T: RebuildBody,
    T::Data: Send,
    T::Error: Into<BoxError>,
{
}

/// One request through the layer, in a span that records what the layer
/// did and the status, counted in the metrics.
///
/// The span wraps the request's whole future, made here, rather than a
/// future inside it: the handle future is not copied once more into a
/// wrapper of its own. When the subscriber set does not want the span
/// (every event inside would be dropped anyway), the request is not
/// instrumented at all. With no subscriber set, tracing's `log` feature
/// (which `lambda_runtime` turns on) still reports a disabled span's
/// entries to a `log` logger: instrumented then, as always
/// (tests/layer_span_log.rs).
pub(super) fn serve<S, St, B, ResBody>(
    config: Arc<Config<St>>,
    inner: S,
    request: Request<B>,
) -> impl Future<Output = Result<Response<ResBody>, S::Error>> + Send + 'static
where
    S: Inner<B, ResBody>,
    St: Store,
    B: LayerBody,
    ResBody: LayerBody,
{
    // Named as OpenTelemetry's semantic conventions name them where they
    // do (`http.response.status_code`), the crate's own names otherwise.
    let span = tracing::info_span!(
        "idempotency",
        idempotency.outcome = field::Empty,
        http.response.status_code = field::Empty,
        idempotency.in_flight = field::Empty,
        idempotency.replay_of = field::Empty
    );
    if span.is_disabled() && tracing::dispatcher::has_been_set() {
        Either::Left(answer(config, inner, request, span))
    } else {
        Either::Right(answer(config, inner, request, span.clone()).instrument(span))
    }
}

/// The request's answer, and what the layer did recorded in `span` and
/// the metrics: `handle`'s future, mapped (see the module's note on plain
/// functions).
fn answer<S, St, B, ResBody>(
    config: Arc<Config<St>>,
    inner: S,
    request: Request<B>,
    span: tracing::Span,
) -> impl Future<Output = Result<Response<ResBody>, S::Error>> + Send + 'static
where
    S: Inner<B, ResBody>,
    St: Store,
    B: LayerBody,
    ResBody: LayerBody,
{
    handle(Arc::clone(&config), inner, request).map(move |(outcome, result)| {
        span.record("idempotency.outcome", outcome.as_str());
        let status = result
            .as_ref()
            .ok()
            .map(|response| response.status().as_u16());
        if let Some(status) = status {
            // An integer, as the conventions type it (tracing-opentelemetry
            // writes unsigned values as strings).
            span.record("http.response.status_code", i64::from(status));
        }
        tracing::debug!(parent: &span, outcome = outcome.as_str(), status, "idempotent request handled");
        if let Some(metrics) = &config.settings.metrics {
            metrics.record(outcome);
        }
        result
    })
}

/// The request admitted (or answered by the layer), its attempt run
/// detached, and the attempt's result answered.
// An `async` block rather than an `async fn`: see the module's note.
#[allow(clippy::manual_async_fn)]
fn handle<S, St, B, ResBody>(
    config: Arc<Config<St>>,
    mut inner: S,
    request: Request<B>,
) -> impl Future<Output = (HttpOutcome, Result<Response<ResBody>, S::Error>)>
where
    S: Inner<B, ResBody>,
    St: Store,
    B: LayerBody,
    ResBody: LayerBody,
{
    async move {
        if !config.settings.methods.contains(request.method()) {
            return (HttpOutcome::PassThrough, inner.call(request).await);
        }
        // A gRPC client reads the layer's own answers as gRPC statuses.
        let grpc = grpc_wire::is_grpc(request.headers());
        // A key in a header is read before the body: a request without one is
        // answered, or passed through, unread (unless Powertools' key may be
        // in the body).
        let header_key = match read_header_key(&config.settings, &request) {
            Ok(key) => key,
            Err(problem) => return refused(&config.settings, grpc, HttpOutcome::BadKey, problem),
        };
        if header_key.is_none() && key_only_in_header(&config.settings) {
            return keyless(&config.settings, inner, request, grpc).await;
        }
        // The attempt's future, made in a block of its own: the buffered
        // request is gone by the time it is awaited, so this future keeps
        // no room for it beside the attempt's (nor beside the body's read).
        let ran = {
            let (request, kind) = match buffer_request(request, config.settings.body_limit).await {
                Ok(buffered) => buffered,
                Err(error) => {
                    let problem = body_problem(&config.settings, error);
                    return refused(&config.settings, grpc, HttpOutcome::BadBody, problem);
                }
            };
            let key = match key_of(&config.settings, header_key, &request) {
                Ok(Some(key)) => key,
                // Boxed: only a key read from the body reaches this await, and
                // held here it would set this future's size (the request twice
                // and the handler's future) for every request.
                Ok(None) => {
                    return Box::pin(unkeyed_after_body(&config, inner, request, kind, grpc)).await
                }
                Err(problem) => {
                    return refused(&config.settings, grpc, HttpOutcome::BadKey, problem)
                }
            };
            let Some(scope) = scope_for(&config.settings.scope, &request) else {
                return refused(
                    &config.settings,
                    grpc,
                    HttpOutcome::ScopeUnset,
                    Problem::ScopeUnset,
                );
            };
            #[cfg(feature = "powertools")]
            let takeover =
                match powertools_first(&config, &request, kind, Some((&scope, &key)), grpc).await {
                    Ok(takeover) => takeover,
                    Err(answered) => return answered,
                };
            #[cfg(not(feature = "powertools"))]
            let takeover = None;
            // The bound on running work, checked last, just before the
            // claim (see `take_slot`).
            let started = start_detached(&config, inner, request, kind, scope, key, takeover);
            let Some(ran) = started else {
                return refused(
                    &config.settings,
                    grpc,
                    HttpOutcome::Overloaded,
                    Problem::Overloaded,
                );
            };
            ran
        };
        match ran.await {
            DetachedAnswer::Answered(result, live) => respond(&config.settings, result, live, grpc),
            // Its record completes when its body ends.
            DetachedAnswer::Streaming(response) => (HttpOutcome::Fresh, Ok(response)),
        }
    }
}

/// A keyed request's attempt, started detached in the request's place in
/// the bound on running work; none when the bound is reached (nothing is
/// claimed, and the request is refused).
fn start_detached<S, St, B, ResBody>(
    config: &Arc<Config<St>>,
    inner: S,
    request: Request<bytes::Bytes>,
    kind: Kind,
    scope: String,
    key: String,
    takeover: Option<crate::Takeover>,
) -> Option<impl Future<Output = DetachedAnswer<S::Error, ResBody>>>
where
    S: Inner<B, ResBody>,
    St: Store,
    B: LayerBody,
    ResBody: LayerBody,
{
    let slot = take_slot(&config.settings)?;
    let (attempt, route_key) = attempt_for(&config.settings, &request, scope, key, takeover);
    let request = rebuild_request(request, kind);
    Some(run_detached(
        Arc::clone(config),
        attempt,
        route_key,
        inner,
        request,
        slot,
    ))
}
