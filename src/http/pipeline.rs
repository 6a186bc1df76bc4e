//! The request pipeline: the key and the body read, the scope, then the
//! attempt, claimed detached from the request's future, waiting for a
//! duplicate's result where configured.
//!
//! # Plain functions that return futures
//!
//! Every request allocates and moves the futures made here, so their size
//! is a cost of every request (BENCHMARKS.md, "A sharper instrument").
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
//! BENCHMARKS.md, "Fewer levels, fewer allocations").

#[cfg(feature = "powertools")]
use super::respond;
use super::{
    body::{buffer_request, rebuild_request, BodyError},
    commit::CommitWith,
    config::{Config, Settings},
    grpc, grpc_wire,
    key::{parse_key, KeyError, Source},
    lambda_context,
    metrics::HttpOutcome,
    problem::{KeyPlace, Problem},
    rebuild_body::RebuildBody,
    respond::{problem_response, respond, Attempted, Failure, Live},
    scope::{route_key, scope_for},
    stored::{StoredResponse, WhyNotStored, MAX_BODY},
    stored_body::StoredBody,
    streaming::{read_bounded, streams, Copied, Ending, Read, Recorded},
};
use crate::{
    clock::epoch_ms,
    engine::{detached, OwnedAttempt},
    error::BoxError,
    store::Store,
    Attempt, ClaimHandle, Error, OutcomeKind,
};
use futures_util::{future::Either, FutureExt};
use http::{Request, Response};
use std::{
    future::Future,
    sync::Arc,
    time::{Duration, SystemTime},
};
use tokio::sync::oneshot;
use tokio_util::task::task_tracker::TaskTrackerToken;
use tower::Service;
use tracing::{field, Instrument};

/// Waiting for another request's result stops this long before the
/// invocation's deadline, to leave time to answer.
const DEADLINE_MARGIN: Duration = Duration::from_millis(500);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait, whatever the budget: a `Duration::MAX` budget must not
/// overflow the clock.
const LONGEST_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

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
    let span = tracing::info_span!(
        "idempotency",
        outcome = field::Empty,
        status = field::Empty,
        in_flight = field::Empty
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
        span.record("outcome", outcome.as_str());
        let status = result
            .as_ref()
            .ok()
            .map(|response| response.status().as_u16());
        if let Some(status) = status {
            span.record("status", status);
        }
        tracing::debug!(parent: &span, outcome = outcome.as_str(), status, "idempotent request handled");
        if let Some(metrics) = &config.settings.metrics {
            metrics.record(outcome);
        }
        result
    })
}

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
        if header_key.is_none()
            && matches!(config.settings.key.0, Source::Header(_))
            && !reads_powertools(&config.settings)
        {
            return keyless(&config.settings, inner, request, grpc).await;
        }
        // The attempt's future, made in a block of its own: the buffered
        // request is gone by the time it is awaited, so this future keeps
        // no room for it beside the attempt's (nor beside the body's read).
        let ran = {
            let (request, kind) = match buffer_request(request, config.settings.body_limit).await {
                Ok(buffered) => buffered,
                Err(error) => {
                    return refused(
                        &config.settings,
                        grpc,
                        HttpOutcome::BadBody,
                        body_problem(&config.settings, error),
                    )
                }
            };
            let key = match key_of(&config.settings, header_key, &request) {
                Ok(key) => key,
                Err(problem) => {
                    return refused(&config.settings, grpc, HttpOutcome::BadKey, problem)
                }
            };
            let Some(key) = key else {
                // Powertools keyed its records on the request itself (a field of
                // the body, say), with or without this crate's key: a retry of a
                // request the old function ran must find its record first.
                #[cfg(feature = "powertools")]
                let takeover = match powertools_first(&config, &request, kind, None, grpc).await {
                    Ok(takeover) => takeover,
                    Err(answered) => return answered,
                };
                #[cfg(not(feature = "powertools"))]
                let takeover = None;
                let mut request = rebuild_request(request, kind);
                // Unclaimed, but the handler is told all the same.
                if let Some(takeover) = takeover {
                    request.extensions_mut().insert::<crate::Takeover>(takeover);
                }
                // Boxed: only a key read from the body reaches this await, and
                // held here it would set this future's size (the request twice
                // and the handler's future) for every request.
                return Box::pin(keyless(&config.settings, inner, request, grpc)).await;
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
            // The bound on running work, checked last, just before the claim: a
            // slow client that sends its body byte by byte holds no slot, and a
            // request refused here has claimed nothing.
            let Some(slot) = config.settings.in_flight.take() else {
                return refused(
                    &config.settings,
                    grpc,
                    HttpOutcome::Overloaded,
                    Problem::Overloaded,
                );
            };
            tracing::Span::current().record("in_flight", config.settings.in_flight.running());
            let (attempt, route_key) =
                attempt_for(&config.settings, &request, scope, key, takeover);
            run_detached(
                Arc::clone(&config),
                attempt,
                route_key,
                inner,
                rebuild_request(request, kind),
                slot,
            )
        };
        match ran.await {
            Ran::Answered(result, live) => respond(&config.settings, result, live, grpc),
            // Its record completes when its body ends.
            Ran::Streaming(response) => (HttpOutcome::Fresh, Ok(response)),
        }
    }
}

/// The layer's own answer to a request it refuses.
fn refused<E, R: RebuildBody>(
    settings: &Settings,
    grpc: bool,
    outcome: HttpOutcome,
    problem: Problem,
) -> (HttpOutcome, Result<Response<R>, E>) {
    (outcome, Ok(problem_response(settings, &problem, grpc)))
}

/// How the detached work answered the request.
// Returned once a request and matched at once: boxing the common variant
// would cost an allocation a request to save a move.
#[allow(clippy::large_enum_variant)]
enum Ran<E, R> {
    /// With the attempt's result (the response, or why there is none).
    Answered(Attempted<E, R>, Live<R>),
    /// With the handler's response as it streams, before its record is
    /// complete: the work goes on until its body ends.
    Streaming(Response<R>),
}

/// A request without a key: refused when one is required, otherwise
/// passed to the handler as it is.
///
/// A plain function (see the module's note): the handler's future is all
/// the returned future holds.
fn keyless<S, B, ResBody>(
    settings: &Settings,
    mut inner: S,
    request: Request<B>,
    grpc: bool,
) -> impl Future<Output = (HttpOutcome, Result<Response<ResBody>, S::Error>)>
where
    S: Inner<B, ResBody>,
    B: LayerBody,
    ResBody: LayerBody,
{
    if settings.require_key {
        let problem = Problem::KeyMissing {
            place: settings.key.place(),
        };
        return Either::Left(std::future::ready((
            HttpOutcome::BadKey,
            Ok(problem_response(settings, &problem, grpc)),
        )));
    }
    Either::Right(
        inner
            .call(request)
            .map(|result| (HttpOutcome::PassThrough, result)),
    )
}

/// Whether requests are checked against Powertools' records first.
fn reads_powertools(settings: &Settings) -> bool {
    #[cfg(feature = "powertools")]
    return settings.powertools.is_some();
    #[cfg(not(feature = "powertools"))]
    {
        let _ = settings;
        false
    }
}

/// The answer Powertools' record gives `request`, in compatibility mode
/// (`Err`), or that this crate's protocol runs (`Ok`), as the takeover of
/// an abandoned Powertools record if it found one: not read with
/// idempotency off, nor for a key (`scope`, `key`) this instance answers
/// from its cache (that holds this crate's own outcome).
#[cfg(feature = "powertools")]
async fn powertools_first<St, E, ResBody>(
    config: &Config<St>,
    request: &Request<bytes::Bytes>,
    kind: super::body::Kind,
    scoped_key: Option<(&str, &str)>,
    grpc: bool,
) -> Result<Option<crate::Takeover>, (HttpOutcome, Result<Response<ResBody>, E>)>
where
    St: Store,
    ResBody: LayerBody,
{
    use super::powertools::{answer, Answer, Delivery};
    let Some(compat) = config.settings.powertools.as_ref() else {
        return Ok(None);
    };
    let skips = match scoped_key {
        Some((scope, key)) => config.engine.skips_powertools(scope, Some(key)),
        None => config.engine.skips_powertools("", None),
    };
    if skips {
        return Ok(None);
    }
    let delivery = Delivery {
        base64_body: kind.delivered_base64(),
        query: lambda_context::event_query_parameters(request),
        infers_plain_responses: lambda_context::infers_plain_responses(request),
    };
    match answer(compat, request, delivery).await {
        Answer::Run(takeover) => Ok(takeover),
        Answer::Answered(found) => Err(respond::powertools(&config.settings, found, grpc)),
    }
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
/// (`Ran::Streaming`), while the work copies it for the record and
/// completes the record when it ends. Without a tokio runtime (a caller on
/// another executor) it runs in place, and such a body is read whole first.
///
/// `slot` is the request's place in the bound on running work: it moves
/// with the work and is given back when the work's future is dropped (done,
/// panicked, or cancelled with its runtime).
fn run_detached<S, St, B, ResBody>(
    config: Arc<Config<St>>,
    attempt: OwnedAttempt,
    route: Option<u64>,
    inner: S,
    request: Request<B>,
    slot: TaskTrackerToken,
) -> impl Future<Output = Ran<S::Error, ResBody>>
where
    S: Inner<B, ResBody>,
    St: Store,
    B: LayerBody,
    ResBody: LayerBody,
{
    // A plain function (see the module's note): what the work takes moves
    // into it here, and the future returned holds only the work's box and
    // the channel.
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
            Ran::Answered(result, live)
        };
        let Some(streaming) = streaming else {
            return answered(done.await);
        };
        tokio::pin!(done);
        tokio::select! {
            biased;
            done = &mut done => answered(done),
            // Dropping `done` leaves the work running on its task.
            Ok(response) = streaming => Ran::Streaming(response),
        }
    }
}

/// The key in the configured header: `Ok(None)` when there is none (or the
/// key comes from elsewhere); a problem when it is repeated or malformed.
fn read_header_key<B>(
    settings: &Settings,
    request: &Request<B>,
) -> Result<Option<String>, Problem> {
    let Source::Header(name) = &settings.key.0 else {
        return Ok(None);
    };
    let invalid = |error| Problem::KeyInvalid {
        place: KeyPlace::Header(name.to_string()),
        error,
    };
    let mut values = request.headers().get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(invalid(KeyError::Repeated)),
        (Some(value), None) => parse_key(value.as_bytes()).map(Some).map_err(invalid),
    }
}

/// The request's key: the one its header gave, or the one the key source
/// reads from the buffered request (none, or a problem).
fn key_of(
    settings: &Settings,
    header_key: Option<String>,
    request: &Request<bytes::Bytes>,
) -> Result<Option<String>, Problem> {
    match header_key {
        Some(key) => Ok(Some(key)),
        None => settings
            .key
            .read(request)
            .map_err(|error| Problem::KeyInvalid {
                place: KeyPlace::Other(settings.key.place()),
                error,
            }),
    }
}

/// The problem a request body that could not be read answers.
fn body_problem(settings: &Settings, error: BodyError) -> Problem {
    match error {
        BodyError::TooLarge => Problem::BodyTooLarge {
            limit: settings.body_limit,
        },
        BodyError::Unreadable(error) => {
            tracing::warn!(%error, "request body unreadable; the handler did not run");
            Problem::BodyUnreadable
        }
    }
}

/// The attempt a keyed request makes: its scoped key, the fingerprint of
/// the request, its deadline, the takeover of an abandoned Powertools
/// record if there was one, and how long its duplicates are told to wait,
/// from the durations of its route (returned too: the route this request
/// is measured on).
fn attempt_for(
    settings: &Settings,
    request: &Request<bytes::Bytes>,
    scope: String,
    key: String,
    takeover: Option<crate::Takeover>,
) -> (OwnedAttempt, Option<u64>) {
    let deadline_ms = lambda_context::deadline_ms(request);
    let fingerprint = settings.fingerprint.of(request);
    let route_key = settings.retry_after.estimates().then(|| route_key(request));
    let hint = settings
        .retry_after
        .hint(&settings.durations, route_key.unwrap_or_default());
    let attempt = OwnedAttempt::new(scope, key, fingerprint, deadline_ms)
        .taking_over(takeover)
        .retry_hint(hint);
    (attempt, route_key)
}

/// Runs the attempt; while another request holds the key, waits for its
/// result (within the configured budget and the invocation's deadline): on
/// the run itself when it is this process's, in memory; otherwise with
/// backoff, asking the store again. A run that completes its record counts, on
/// the engine's clock, for its `route`'s typical duration. `pending` holds
/// the handler and its request until an attempt runs them.
async fn run_waiting<S, St, B, ResBody>(
    config: &Config<St>,
    attempt: &Attempt<'_>,
    route: Option<u64>,
    pending: &mut Option<(S, Request<B>)>,
    live: &mut Live<ResBody>,
    early: &mut Option<oneshot::Sender<Response<ResBody>>>,
) -> Attempted<S::Error, ResBody>
where
    S: Inner<B, ResBody>,
    St: Store,
    B: LayerBody,
    ResBody: LayerBody,
{
    let wait_until = config.settings.wait.map(|budget| {
        let left = attempt.deadline_ms.map_or(budget, |deadline| {
            let left = Duration::from_millis(deadline.saturating_sub(epoch_ms(SystemTime::now())));
            left.saturating_sub(DEADLINE_MARGIN).min(budget)
        });
        tokio::time::Instant::now() + left.min(LONGEST_WAIT)
    });
    let mut backoff = FIRST_BACKOFF;
    // A streamed body's last frame waits for its record: told when the
    // engine is done with it, or when this future is dropped.
    let mut recorded: Option<Recorded> = None;
    loop {
        let not_run_yet = &mut *pending;
        let live = &mut *live;
        let early = &mut *early;
        let recorded_slot = &mut recorded;
        // A function of its own, whose future the closure returns as it
        // is: no level deeper than an `async` block here. The references
        // are moved out of the closure (which makes it FnOnce), so that the
        // future may keep them.
        let slots = (not_run_yet, live, early, recorded_slot);
        let operation = move |claim: ClaimHandle| {
            let (not_run_yet, live, early, recorded) = slots;
            run_handler(config, claim, not_run_yet, live, early, recorded)
        };
        // The clock is read only for a route measured (a read is some tens
        // of ns).
        let measured = route.map(|route| (route, config.engine.now_ms()));
        // The application's answer to a refused write, stored or not by
        // the outcome policy like any response.
        let refusal = |refused: &crate::WriteRefusal| {
            let answer = (config.settings.on_write_refusal.as_ref()?)(refused)?;
            if (config.settings.store_when)(answer.status()) {
                return Some(Ok(StoredResponse::Full(answer, None)));
            }
            let (parts, body) = answer.into_parts();
            let body = ResBody::from_stored(body, None);
            Some(Err(Failure::Released(Response::from_parts(parts, body))))
        };
        // The result is gone by the time this waits: a block of its own,
        // so that the future does not keep room for it (some 280 bytes)
        // beside the timer's.
        // With a wait, a duplicate of a run in this process waits on that
        // run, in memory, for what is left of the budget.
        let waiting;
        let this_attempt = match wait_until {
            Some(until) => {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                waiting = attempt.clone().wait_in_process(left);
                &waiting
            }
            None => attempt,
        };
        let pause = {
            let result = run_attempt(
                config,
                this_attempt,
                &config.settings.codec,
                refusal,
                operation,
            )
            .await;
            if let Some(recorded) = recorded.take() {
                recorded.done();
            }
            if let (Some((route, started_ms)), Ok(done)) = (measured, &result) {
                if done.kind() == OutcomeKind::Fresh {
                    let took_ms = config.engine.now_ms().saturating_sub(started_ms);
                    config.settings.durations.record(route, took_ms);
                }
            }
            let (Err(Error::InProgress { retry_after }), Some(until)) = (&result, wait_until)
            else {
                return result;
            };
            let now = tokio::time::Instant::now();
            if now >= until {
                return result;
            }
            backoff.min(until - now).min(*retry_after)
        };
        tokio::time::sleep(pause).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The handler's run under its claim: the request told of the claim (and
/// of a takeover, and given the transaction in the in-transaction form),
/// then its response read for its record, stored whole, teed to the client
/// as it streams, or passed through not stored, as the outcome policy and
/// the body say.
async fn run_handler<S, St, B, ResBody>(
    config: &Config<St>,
    claim: ClaimHandle,
    not_run_yet: &mut Option<(S, Request<B>)>,
    live: &mut Live<ResBody>,
    early: &mut Option<oneshot::Sender<Response<ResBody>>>,
    recorded_slot: &mut Option<Recorded>,
) -> Recording<St::Write, S::Error, ResBody>
where
    S: Inner<B, ResBody>,
    St: Store,
    B: LayerBody,
    ResBody: LayerBody,
{
    let handle = claim.clone();
    // The handler and its request in a block of their own, gone once it
    // answers: this future keeps no room for them (some 260 bytes) while
    // the response is read.
    let response = {
        let Some((mut inner, mut request)) = not_run_yet.take() else {
            return Err(Failure::AlreadyRun);
        };
        // The handler can learn that it took over a lapsed claim
        // (and reconcile first), and extend or watch its lease.
        if let Some(takeover) = claim.takeover() {
            request.extensions_mut().insert(takeover);
        }
        if let Some(in_transaction) = &config.settings.in_transaction {
            (in_transaction.hand_over)(&claim, request.extensions_mut());
        }
        request.extensions_mut().insert(claim);
        inner.call(request).await.map_err(Failure::Handler)?
    };
    // The response's head in a block of its own too: gone once the
    // reading of its body (which takes it) begins.
    let recording = {
        let (mut parts, body) = response.into_parts();
        // Inside the transaction, a refusal is stored without the
        // handler's writes (a released response rolls back whole).
        if let Some(transaction) = handle.open_transaction() {
            if parts.status.is_client_error() && (config.settings.store_when)(parts.status) {
                parts.extensions.remove::<CommitWith<St::Write>>();
                if let Err(error) = transaction.roll_back_writes().await {
                    tracing::warn!(%error, "the refused request's writes could not be rolled back");
                    return Err(Failure::Released(Response::from_parts(parts, body)));
                }
            }
        }
        let writes = parts
            .extensions
            .remove::<CommitWith<St::Write>>()
            .map(|commit| commit.0)
            .unwrap_or_default();
        if !(config.settings.store_when)(parts.status) {
            return Err(Failure::Released(Response::from_parts(parts, body)));
        }
        record_response(
            config,
            &handle,
            parts,
            body,
            writes,
            live,
            early,
            recorded_slot,
        )
    };
    recording.await
}

/// What the handler's run under its claim gives: the response as its
/// record stores it and the writes to commit with it, or why there is no
/// record.
type Recording<W, E, R> = Result<(StoredResponse, Vec<W>), Failure<E, R>>;

/// The handler's response read for its record: stored whole, teed to the
/// client as it streams (its record completing when it ends), or passed
/// through not stored, as the response and the settings say.
// An `async` block rather than an `async fn` (see the module's note): its
// arguments are held once, where the `async fn` held them again as locals.
#[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
fn record_response<'a, St, E, ResBody>(
    config: &'a Config<St>,
    handle: &'a ClaimHandle,
    parts: http::response::Parts,
    body: ResBody,
    writes: Vec<St::Write>,
    live: &'a mut Live<ResBody>,
    early: &'a mut Option<oneshot::Sender<Response<ResBody>>>,
    recorded_slot: &'a mut Option<Recorded>,
) -> impl Future<Output = Recording<St::Write, E, ResBody>> + 'a
where
    St: Store,
    E: 'a,
    ResBody: LayerBody,
{
    async move {
        let grpc = grpc_wire::is_grpc(&parts.headers);
        let (body, why) = if streams(&parts, config.settings.stream_when.as_ref()) {
            (body, WhyNotStored::Stream)
        } else {
            // Read to be stored, but never more than can be (a
            // lambda_http body is whole already), nor a gRPC stream,
            // and never waited for: a body that would wait goes on to
            // the client as it comes, copied as it passes. Unless
            // writes commit with the record: the client must not see
            // an answer whose writes may still fail.
            let limit = usize::try_from(MAX_BODY).unwrap_or(usize::MAX);
            let tee =
                early.is_some() && writes.is_empty() && !commits_with_record(&config.settings);
            match read_bounded(body, limit, grpc, tee).await {
                Ok(Read::Whole(body, trailers))
                    if declared_length_holds(parts.status, &parts.headers, body.as_ref().len()) =>
                {
                    let stored = whole(&config.settings, parts, body, trailers, grpc)?;
                    return Ok((stored, writes));
                }
                // Whole, but not the length it declares (its producer
                // stopped, or lied): nothing reached the client, and it is
                // not stored, as any body that fails while read whole.
                Ok(Read::Whole(..)) => {
                    return Err(Failure::ResponseUnreadable(
                        "the response body does not hold the length its content-length declares"
                            .into(),
                    ))
                }
                Ok(Read::Teed(body, copied)) => {
                    let head = StoredHead::of(&parts);
                    if let Some(early) = early.take() {
                        // A client that left already drops the body,
                        // which is then read here to its end.
                        let _ = early.send(Response::from_parts(parts, body));
                    }
                    // Boxed: a response read whole (most) never waits here, and
                    // this future, which every stored response's read holds,
                    // then keeps no room for it.
                    let stored = Box::pin(teed(
                        &config.settings,
                        &config.engine,
                        handle,
                        head,
                        copied,
                        grpc,
                        recorded_slot,
                    ))
                    .await?;
                    return Ok((stored, writes));
                }
                Ok(Read::Streams(body, why)) => (body, why),
                Err(error) => return Err(Failure::ResponseUnreadable(error)),
            }
        };
        log_not_stored(why);
        let head = StoredResponse::NotStored {
            status: parts.status,
            headers: parts.headers.clone(),
            why,
        };
        *live = Some(Response::from_parts(parts, body));
        Ok((head, writes))
    }
}

/// The stored response of a body read whole: the gRPC status decides, for
/// a gRPC response, as the HTTP status already did (a gRPC error travels on
/// an HTTP 200).
fn whole<E, R: RebuildBody>(
    settings: &Settings,
    parts: http::response::Parts,
    body: StoredBody,
    trailers: Option<http::HeaderMap>,
    grpc: bool,
) -> Result<StoredResponse, Failure<E, R>> {
    if grpc {
        let status = grpc::status_of(&parts.headers, trailers.as_ref());
        if !(settings.grpc_store_when)(status) {
            let body = R::from_stored(body, trailers);
            return Err(Failure::Released(Response::from_parts(parts, body)));
        }
    }
    Ok(StoredResponse::Full(
        Response::from_parts(parts, body),
        trailers,
    ))
}

/// Whether every response's record commits with writes of the handler's
/// (a single write, or inside the PostgreSQL transaction), so that none
/// may reach the client before its commit.
fn commits_with_record(settings: &Settings) -> bool {
    settings.in_transaction.is_some() || settings.single_write
}

/// A response's head, kept for its record while its body streams.
struct StoredHead {
    status: http::StatusCode,
    headers: http::HeaderMap,
}

impl StoredHead {
    fn of(parts: &http::response::Parts) -> Self {
        Self {
            status: parts.status,
            headers: parts.headers.clone(),
        }
    }
}

/// The record of a response that went to the client as it came: whole if
/// its body ended within what a record holds, otherwise its head and why
/// not. A body still going when the claim's lease is near its end is
/// recorded then (not stored), so that no retry runs the request again.
async fn teed<St: Store, E, R>(
    settings: &Settings,
    engine: &crate::Engine<St>,
    claim: &ClaimHandle,
    head: StoredHead,
    copied: Copied,
    grpc: bool,
    recorded_slot: &mut Option<Recorded>,
) -> Result<StoredResponse, Failure<E, R>> {
    let (recorded, ending) = copied.split();
    *recorded_slot = Some(recorded);
    let ending = tokio::select! {
        ending = ending => ending,
        () = lease_near_end(engine, claim) => Ending::NotStored(WhyNotStored::StreamOutlivedLease),
    };
    let ending = match ending {
        Ending::Whole(body, _)
            if !declared_length_holds(head.status, &head.headers, body.as_ref().len()) =>
        {
            Ending::NotStored(WhyNotStored::StreamFailed)
        }
        ending => ending,
    };
    match ending {
        Ending::Whole(body, trailers) => {
            if grpc
                && !(settings.grpc_store_when)(grpc::status_of(&head.headers, trailers.as_ref()))
            {
                return Err(Failure::ReleasedAfterStreaming);
            }
            let mut response = Response::new(body);
            *response.status_mut() = head.status;
            *response.headers_mut() = head.headers;
            Ok(StoredResponse::Full(response, trailers))
        }
        Ending::NotStored(why) => {
            log_not_stored(why);
            Ok(StoredResponse::NotStored {
                status: head.status,
                headers: head.headers,
                why,
            })
        }
    }
}

/// Whether a body that came to its end holds as many bytes as its head's
/// `content-length` says (when it says). One that ended short (or ran
/// long) had its producer stop part-way or lie (a task dropped, a source
/// gone): the server cuts the client off, and the record must not keep
/// those bytes as the whole response.
fn declared_length_holds(
    status: http::StatusCode,
    headers: &http::HeaderMap,
    length: usize,
) -> bool {
    let declared = headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.trim().parse::<u64>().ok());
    let bodiless = matches!(
        status,
        http::StatusCode::NO_CONTENT | http::StatusCode::NOT_MODIFIED
    );
    bodiless || declared.is_none_or(|declared| declared == length as u64)
}

/// Resolves when the claim's lease (as last extended) is within a quarter
/// of what was left of it when the body began to stream; never, without a
/// claim.
async fn lease_near_end<St: Store>(engine: &crate::Engine<St>, claim: &ClaimHandle) {
    let Some(first_until) = claim.lease_until_ms() else {
        return std::future::pending().await;
    };
    let margin = first_until.saturating_sub(engine.now_ms()) / 4;
    loop {
        let until = claim.lease_until_ms().unwrap_or(first_until);
        let record_at = until.saturating_sub(margin);
        let now = engine.now_ms();
        if now >= record_at {
            return;
        }
        tokio::time::sleep(Duration::from_millis(record_at - now)).await;
    }
}

/// Says why a response goes to the client unstored.
fn log_not_stored(why: WhyNotStored) {
    match why {
        WhyNotStored::Stream => tracing::debug!("streamed response (an event stream, a marked StreamResponse or a gRPC stream of more than one message): sent on as it comes, not stored; retries get its status and headers with an explanation"),
        WhyNotStored::StreamFailed => tracing::warn!("the response stream failed part-way: not stored; retries get its status and headers with an explanation, and the request is not run again"),
        WhyNotStored::StreamOutlivedLease => tracing::warn!("the response was still streaming when its claim's lease was near its end: recorded as not stored so that no retry runs it again; raise the lease or enable the heartbeat to store such responses"),
        _ => tracing::warn!(limit = MAX_BODY, "response longer than can be stored: streamed on; retries get its status and headers with an explanation, not its body"),
    }
}

/// One attempt through the engine, as the layer is configured: inside the
/// PostgreSQL transaction, in a single write, or claimed in its mode.
///
/// A plain function (see the module's note): the engine's future is what
/// it returns, not a level that would hold it (and copy it whole into its
/// own as it awaits it).
fn run_attempt<'a, St, T, E, C, R, F, Fut>(
    config: &'a Config<St>,
    attempt: &'a Attempt<'a>,
    codec: &'a C,
    refusal: R,
    operation: F,
) -> impl Future<Output = Result<crate::Outcome<T>, Error<E>>> + 'a
where
    St: Store,
    T: 'a,
    E: 'a,
    C: crate::Codec<T>,
    R: FnOnce(&crate::WriteRefusal) -> Option<Result<T, E>> + 'a,
    F: FnOnce(ClaimHandle) -> Fut + 'a,
    Fut: std::future::Future<Output = Result<(T, Vec<St::Write>), E>> + 'a,
{
    // Set only on a store with transactions (`TransactionalStore`).
    if let Some(in_transaction) = &config.settings.in_transaction {
        return Either::Left(config.engine.transaction_run(
            attempt,
            in_transaction.limits,
            codec,
            refusal,
            operation,
        ));
    }
    let claimed = if config.settings.single_write {
        Either::Left(config.engine.single_write(attempt, codec, operation))
    } else {
        Either::Right(config.engine.run_with_refusals(
            attempt,
            config.settings.mode,
            codec,
            refusal,
            operation,
        ))
    };
    Either::Right(claimed)
}
