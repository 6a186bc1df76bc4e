//! [`Idempotency`]: the service the layer wraps around a handler.

use super::stored_body::StoredBody;
use super::{
    body::{buffer_request, into_response, rebuild_request, BodyError},
    commit::CommitWith,
    config::{Config, ScopeRule},
    fingerprint::request_fingerprint,
    future::ResponseFuture,
    key::{parse_key, KeyError, Source},
    lambda_context,
    metrics::HttpOutcome,
    problem::{KeyPlace, Problem},
    scope::{default_scope, scope_of},
    stored::{StoredResponse, BODY_HEADERS, MAX_BODY},
    streaming::{read_bounded, streams, Read},
};
use crate::{
    clock::epoch_ms, engine::detached, error::BoxError, store::Store, Attempt, ClaimHandle, Error,
    Fingerprint, Outcome, OutcomeKind, StoreErrorKind,
};
use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Body as HttpBody;
use std::{
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, SystemTime},
};
use tower::Service;
use tracing::{field, Instrument};

/// The header that marks a replayed response, by default
/// ([`replayed_header`](super::IdempotencyLayer::replayed_header)).
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Waiting for another request's result stops this long before the
/// invocation's deadline, to leave time to answer.
const DEADLINE_MARGIN: Duration = Duration::from_millis(500);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait, whatever the budget: a `Duration::MAX` budget must not
/// overflow the clock.
const LONGEST_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// An HTTP service made idempotent by an
/// [`IdempotencyLayer`](super::IdempotencyLayer).
///
/// It serves `http::Request<B>` for any body `B` that can be rebuilt from
/// bytes (`lambda_http`'s `Body`, axum's `Body`, `http_body_util::Full`),
/// and answers with the inner service's own response body type, so it
/// composes where the inner service does (`lambda_http::run`, axum's
/// `Router::layer`, hyper).
pub struct Idempotency<S, St> {
    inner: S,
    config: Arc<Config<St>>,
}

// Not derived: the store need not be `Clone` (the configuration is shared).
impl<S: Clone, St> Clone for Idempotency<S, St> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            config: Arc::clone(&self.config),
        }
    }
}

impl<S, St> Idempotency<S, St> {
    pub(crate) fn new(inner: S, config: Arc<Config<St>>) -> Self {
        Self { inner, config }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: std::fmt::Debug, St> std::fmt::Debug for Idempotency<S, St> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Idempotency")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, St, B, ResBody> Service<Request<B>> for Idempotency<S, St>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    St: Store,
    B: HttpBody + From<Vec<u8>> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: HttpBody + From<Vec<u8>> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<ResBody, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // Use the service that was polled ready; leave a fresh clone behind.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let config = Arc::clone(&self.config);
        ResponseFuture::new(async move {
            let span =
                tracing::info_span!("idempotency", outcome = field::Empty, status = field::Empty);
            let (outcome, result) = handle(&config, inner, request)
                .instrument(span.clone())
                .await;
            span.record("outcome", outcome.as_str());
            let status = result
                .as_ref()
                .ok()
                .map(|response| response.status().as_u16());
            if let Some(status) = status {
                span.record("status", status);
            }
            tracing::debug!(parent: &span, outcome = outcome.as_str(), status, "idempotent request handled");
            if let Some(metrics) = &config.metrics {
                metrics.record(outcome);
            }
            result
        })
    }
}

/// Why the operation did not produce a response to store.
enum Failure<E, R> {
    /// The handler failed: release the claim, return its error.
    Handler(E),
    /// The outcome policy says not to store this response: release the
    /// claim, return the response, its body untouched.
    Released(Response<R>),
    /// The handler's response body failed while it was read to be stored:
    /// release the claim, answer a 500 problem.
    ResponseUnreadable(BoxError),
    /// The engine asked for the operation a second time, after it had run.
    /// It never does (it asks at most once per call, and a call that finds
    /// the key in progress runs nothing); answered as an internal error.
    AlreadyRun,
    /// The runtime cancelled the request's task: it is shutting down.
    Cancelled,
}

/// A response that goes to the client as the handler made it, its body
/// unread or read only in part (a stream, or a body longer than can be
/// stored): the record holds its head only.
type Live<R> = Option<Response<R>>;

type Attempted<E, R> = Result<Outcome<StoredResponse>, Error<Failure<E, R>>>;

/// A problem in the handler's body type.
fn problem_response<St, R: From<Vec<u8>> + 'static>(
    config: &Config<St>,
    problem: &Problem,
) -> Response<R> {
    into_response(problem.to_response(&config.problem_base))
}

async fn handle<S, St, B, ResBody>(
    config: &Arc<Config<St>>,
    mut inner: S,
    request: Request<B>,
) -> (HttpOutcome, Result<Response<ResBody>, S::Error>)
where
    S: Service<Request<B>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    St: Store,
    B: HttpBody + From<Vec<u8>> + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: HttpBody + From<Vec<u8>> + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    if !config.methods.contains(request.method()) {
        return (HttpOutcome::PassThrough, inner.call(request).await);
    }
    // A key in a header is read before the body: a request without one is
    // answered, or passed through, unread.
    let header_key = match read_header_key(config, &request) {
        Ok(Some(key)) => Some(key),
        Ok(None) if matches!(config.key.0, Source::Header(_)) => {
            return (HttpOutcome::PassThrough, inner.call(request).await)
        }
        Ok(None) => None,
        Err(problem) => return (HttpOutcome::BadKey, Ok(problem_response(config, &problem))),
    };
    let (request, kind) = match buffer_request(request, config.body_limit).await {
        Ok(buffered) => buffered,
        Err(error) => {
            let problem = match error {
                BodyError::TooLarge => Problem::BodyTooLarge {
                    limit: config.body_limit,
                },
                BodyError::Unreadable(error) => {
                    tracing::warn!(%error, "request body unreadable; the handler did not run");
                    Problem::BodyUnreadable
                }
            };
            return (HttpOutcome::BadBody, Ok(problem_response(config, &problem)));
        }
    };
    let key = match header_key {
        Some(key) => key,
        None => match config.key.read(&request) {
            Ok(Some(key)) => key,
            Ok(None) if config.require_key => {
                let problem = Problem::KeyMissing {
                    place: config.key.place(),
                };
                return (HttpOutcome::BadKey, Ok(problem_response(config, &problem)));
            }
            Ok(None) => {
                let request = rebuild_request(request, kind);
                return (HttpOutcome::PassThrough, inner.call(request).await);
            }
            Err(error) => {
                let problem = Problem::KeyInvalid {
                    place: KeyPlace::Other(config.key.place()),
                    error,
                };
                return (HttpOutcome::BadKey, Ok(problem_response(config, &problem)));
            }
        },
    };
    let Some(scope) = scope(config, &request) else {
        return (
            HttpOutcome::ScopeUnset,
            Ok(problem_response(config, &Problem::ScopeUnset)),
        );
    };
    #[cfg(feature = "powertools")]
    if let Some(answer) = powertools_answer(config, &request, &scope, &key).await {
        return answer;
    }
    let deadline_ms = lambda_context::deadline_ms(&request);
    let fingerprint = request_fingerprint(&request);
    let request = rebuild_request(request, kind);
    let claimed = Claimed {
        scope,
        key,
        fingerprint,
        deadline_ms,
    };
    let (result, live) = run_detached(Arc::clone(config), claimed, inner, request).await;
    respond(config, result, live)
}

/// What a request claims its key with, owned by the task that runs it.
struct Claimed {
    scope: String,
    key: String,
    fingerprint: Fingerprint,
    deadline_ms: Option<u64>,
}

/// Runs the attempt on a task of its own, from the claim on, so that the
/// work goes on when the request's future is dropped (hyper drops it when
/// the client disconnects, tower's `TimeoutLayer` at its deadline): the
/// handler is not cut short between its effect and the completion, and
/// the record is completed or released rather than left in progress until
/// its lease lapses, after which a retry would run it again. A panic in the
/// handler is raised again here, in the request's own future, so an outer
/// `CatchPanicLayer` still answers it.
///
/// Without a tokio runtime (a caller on another executor) it runs in place.
async fn run_detached<S, St, B, ResBody>(
    config: Arc<Config<St>>,
    claimed: Claimed,
    inner: S,
    request: Request<B>,
) -> (Attempted<S::Error, ResBody>, Live<ResBody>)
where
    S: Service<Request<B>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send,
    S::Error: Send + 'static,
    St: Store,
    B: Send + 'static,
    ResBody: HttpBody + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let tracker = config.in_flight.clone();
    let work = async move {
        let mut attempt = Attempt::new(&claimed.scope, &claimed.key, claimed.fingerprint);
        if let Some(deadline_ms) = claimed.deadline_ms {
            attempt = attempt.deadline_ms(deadline_ms);
        }
        let mut live = None;
        let result = run_waiting(
            &config,
            &attempt,
            claimed.deadline_ms,
            inner,
            request,
            &mut live,
        )
        .await;
        (result, live)
    }
    .in_current_span();
    detached(work, |work, runtime| tracker.spawn_on(work, runtime))
        .await
        .unwrap_or_else(|| {
            // Only a runtime that shuts down cancels the task, and this
            // future goes with it: answered, should it be polled.
            (Err(Error::Operation(Failure::Cancelled)), None)
        })
}

/// The compatibility mode's answer, when Powertools' record decides the
/// request; `None` lets the protocol run.
#[cfg(feature = "powertools")]
async fn powertools_answer<St: Store, E, R: From<Vec<u8>> + 'static>(
    config: &Config<St>,
    request: &Request<Bytes>,
    scope: &str,
    key: &str,
) -> Option<(HttpOutcome, Result<Response<R>, E>)> {
    use crate::powertools::{http, PowertoolsFound};
    let compat = config.powertools.as_ref()?;
    // Nothing to read with idempotency off; nor for a key this instance
    // answers from its cache (the cache holds this crate's own outcome).
    if config.engine.skips_powertools(scope, Some(key)) {
        return None;
    }
    let refused = |error: Error| {
        let error = match error {
            Error::InProgress { retry_after } => Error::InProgress { retry_after },
            Error::KeyReused => Error::KeyReused,
            Error::LeaseLost => Error::LeaseLost,
            Error::Store(e) => Error::Store(e),
            Error::WritesNotCommitted(e) => Error::WritesNotCommitted(e),
            Error::Operation(never) => match never {},
        };
        respond(config, Err(error), None)
    };
    match compat.check_in(&http::request_view(request), true).await {
        Ok(None) => None,
        Ok(Some(PowertoolsFound::InProgress { retry_after })) => {
            Some(refused(Error::InProgress { retry_after }))
        }
        Ok(Some(PowertoolsFound::Completed { data })) => {
            match http::proxy_response(data.as_deref()) {
                Ok(response) => {
                    let mut response = into_response(response);
                    response.headers_mut().insert(
                        config.replayed_header.clone(),
                        HeaderValue::from_static("true"),
                    );
                    tracing::debug!("replayed the response Powertools stored");
                    Some((HttpOutcome::Replay, Ok(response)))
                }
                Err(why) => Some(refused(Error::Store(crate::StoreError::new(
                    StoreErrorKind::CorruptRecord,
                    format!("the Powertools record cannot be replayed as an HTTP response: {why}"),
                )))),
            }
        }
        Err(error) => Some(refused(error)),
    }
}

/// The scope of the request's key, as the layer is configured; `None`
/// (logged as an error) for a request that nothing can name the caller of:
/// outside Lambda, with neither a caller, a scope nor a shared scope.
fn scope<St>(config: &Config<St>, request: &Request<Bytes>) -> Option<String> {
    match &config.scope {
        ScopeRule::Custom(scope) => Some(scope(request)),
        ScopeRule::Caller(caller) => Some(match caller(request) {
            // Tagged, so that no name a function returns spells a Lambda
            // authorizer's principal.
            Some(name) => scope_of(
                Some(serde_json::json!(["caller", name]).to_string()),
                request,
            ),
            None => scope_of(None, request),
        }),
        ScopeRule::Shared => Some(default_scope(request)),
        ScopeRule::LambdaContext if lambda_context::has_context(request) => {
            Some(default_scope(request))
        }
        ScopeRule::LambdaContext => {
            tracing::error!(
                method = %request.method(),
                path = request.uri().path(),
                "idempotent request refused (500): it has no Lambda request context to name its \
                 caller, and the layer was given no other way, so two callers that send the same \
                 key would share its record. Name the caller with IdempotencyLayer::caller (from \
                 what your authentication middleware put in the request's extensions), or declare \
                 a single-tenant service with IdempotencyLayer::shared_scope"
            );
            None
        }
    }
}

/// The key in the configured header: `Ok(None)` when there is none (or the
/// key comes from elsewhere) and it is optional; a problem when it is
/// missing, repeated or malformed.
fn read_header_key<St, B>(
    config: &Config<St>,
    request: &Request<B>,
) -> Result<Option<String>, Problem> {
    let Source::Header(name) = &config.key.0 else {
        return Ok(None);
    };
    let invalid = |error| Problem::KeyInvalid {
        place: KeyPlace::Header(name.to_string()),
        error,
    };
    let mut values = request.headers().get_all(name).iter();
    match (values.next(), values.next()) {
        (None, _) if config.require_key => Err(Problem::KeyMissing {
            place: config.key.place(),
        }),
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(invalid(KeyError::Repeated)),
        (Some(value), None) => parse_key(value.as_bytes()).map(Some).map_err(invalid),
    }
}

/// Runs the attempt; while another request holds the key, waits for its
/// result (with backoff, within the configured budget and the invocation's
/// deadline) and asks again.
async fn run_waiting<S, St, B, ResBody>(
    config: &Config<St>,
    attempt: &Attempt<'_>,
    deadline_ms: Option<u64>,
    inner: S,
    request: Request<B>,
    live: &mut Live<ResBody>,
) -> Attempted<S::Error, ResBody>
where
    S: Service<Request<B>, Response = Response<ResBody>>,
    St: Store,
    ResBody: HttpBody + Send + 'static,
    ResBody::Data: Send,
    ResBody::Error: Into<BoxError>,
{
    let wait_until = config.wait.map(|budget| {
        let left = deadline_ms.map_or(budget, |deadline| {
            let left = Duration::from_millis(deadline.saturating_sub(epoch_ms(SystemTime::now())));
            left.saturating_sub(DEADLINE_MARGIN).min(budget)
        });
        tokio::time::Instant::now() + left.min(LONGEST_WAIT)
    });
    let mut pending = Some((inner, request));
    let mut backoff = FIRST_BACKOFF;
    loop {
        let not_run_yet = &mut pending;
        let live = &mut *live;
        let operation = move |claim: ClaimHandle| async move {
            let Some((mut inner, mut request)) = not_run_yet.take() else {
                return Err(Failure::AlreadyRun);
            };
            // The handler can learn that it took over a lapsed claim
            // (and reconcile first), and extend or watch its lease.
            if let Some(takeover) = claim.takeover() {
                request.extensions_mut().insert(takeover);
            }
            request.extensions_mut().insert(claim);
            let response = inner.call(request).await.map_err(Failure::Handler)?;
            let (mut parts, body) = response.into_parts();
            let writes = parts
                .extensions
                .remove::<CommitWith<St::Write>>()
                .map(|commit| commit.0)
                .unwrap_or_default();
            if !(config.store_when)(parts.status) {
                return Err(Failure::Released(Response::from_parts(parts, body)));
            }
            let body = if streams(&parts, config.stream_when.as_ref()) {
                body
            } else {
                // Read to be stored, but never more than can be (a
                // lambda_http body is whole already).
                let limit = usize::try_from(MAX_BODY).unwrap_or(usize::MAX);
                match read_bounded(body, limit).await {
                    Ok(Read::Whole(body)) => {
                        let response = Response::from_parts(parts, body);
                        return Ok((StoredResponse::Full(response), writes));
                    }
                    Ok(Read::Streams(body)) => {
                        tracing::warn!(limit, "response longer than can be stored: streamed on; retries get its status and headers with an explanation, not its body");
                        body
                    }
                    Err(error) => return Err(Failure::ResponseUnreadable(error)),
                }
            };
            let head = StoredResponse::NotStored {
                status: parts.status,
                headers: parts.headers.clone(),
            };
            *live = Some(Response::from_parts(parts, body));
            Ok((head, writes))
        };
        let result = if config.single_write {
            config
                .engine
                .single_write(attempt, &config.codec, operation)
                .await
        } else {
            config
                .engine
                .run(attempt, config.mode, &config.codec, operation)
                .await
        };
        if let (Err(Error::InProgress { retry_after }), Some(until)) = (&result, wait_until) {
            let now = tokio::time::Instant::now();
            if now < until {
                tokio::time::sleep(backoff.min(until - now).min(*retry_after)).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        }
        return result;
    }
}

/// The answer to an attempt, and what it was.
fn respond<St, E, R: From<Vec<u8>> + 'static>(
    config: &Config<St>,
    result: Attempted<E, R>,
    live: Live<R>,
) -> (HttpOutcome, Result<Response<R>, E>) {
    let error = match result {
        Ok(done) => {
            let outcome = http_outcome(done.kind());
            if outcome != HttpOutcome::Replay {
                if let Some(response) = live {
                    return (outcome, Ok(response));
                }
            }
            let replayed = done.replayed().copied();
            let mut response = render_stored(config, done.into_value());
            if outcome == HttpOutcome::Replay {
                response.headers_mut().insert(
                    config.replayed_header.clone(),
                    HeaderValue::from_static("true"),
                );
                if let (Some(hook), Some(replayed)) = (&config.on_replay, &replayed) {
                    hook(&mut response, replayed);
                }
            }
            return (outcome, Ok(into_response(response)));
        }
        Err(Error::Operation(Failure::Handler(error))) => {
            return (HttpOutcome::HandlerError, Err(error))
        }
        Err(Error::Operation(Failure::Released(response))) => {
            return (HttpOutcome::Released, Ok(response))
        }
        Err(Error::Operation(Failure::ResponseUnreadable(error))) => {
            tracing::error!(%error, "the handler's response body failed while it was read to be stored; the claim is released");
            return (
                HttpOutcome::HandlerError,
                Ok(problem_response(config, &Problem::ResponseUnreadable)),
            );
        }
        Err(Error::Operation(Failure::Cancelled)) => {
            tracing::error!("the request's task was cancelled (the runtime is shutting down); its record stays in progress until its lease lapses");
            return (
                HttpOutcome::StoreError,
                Ok(problem_response(config, &Problem::Internal)),
            );
        }
        Err(Error::Operation(Failure::AlreadyRun)) => {
            tracing::error!("the engine asked for the handler after it had run; this is a bug");
            return (
                HttpOutcome::StoreError,
                Ok(problem_response(config, &Problem::Internal)),
            );
        }
        Err(error) => error,
    };
    log_refusal(&error);
    let outcome = match &error {
        Error::InProgress { .. } => HttpOutcome::InProgress,
        Error::KeyReused => HttpOutcome::KeyReused,
        Error::LeaseLost => HttpOutcome::LeaseLost,
        _ => HttpOutcome::StoreError,
    };
    let problem = Problem::from(&error);
    (outcome, Ok(problem_response(config, &problem)))
}

/// What the layer did, for an attempt the engine answered.
fn http_outcome(kind: OutcomeKind) -> HttpOutcome {
    match kind {
        OutcomeKind::Replay | OutcomeKind::CachedReplay => HttpOutcome::Replay,
        OutcomeKind::Disabled => HttpOutcome::Disabled,
        OutcomeKind::LeaseLost => HttpOutcome::LeaseLost,
        OutcomeKind::NotRecorded => HttpOutcome::NotRecorded,
        OutcomeKind::Unprotected => HttpOutcome::Unprotected,
        OutcomeKind::Fresh => HttpOutcome::Fresh,
    }
}

/// A stored response as the client gets it: whole, or, for one too large to
/// store, its status and stored headers with a problem body that says so.
fn render_stored<St>(config: &Config<St>, stored: StoredResponse) -> Response<StoredBody> {
    match stored {
        StoredResponse::Full(response) => response,
        StoredResponse::NotStored { status, headers } => {
            let mut response =
                Problem::ResponseNotStored { status }.to_response(&config.problem_base);
            for (name, value) in &headers {
                // The headers that describe the original body (a
                // `Content-Encoding: gzip`) would misdescribe the problem.
                if BODY_HEADERS.contains(name) {
                    continue;
                }
                if !response.headers().contains_key(name) {
                    response.headers_mut().append(name, value.clone());
                }
            }
            response
        }
    }
}

/// Logs why the layer answered for the handler, where an operator must act.
fn log_refusal<E>(error: &Error<E>) {
    match error {
        Error::Store(error) if error.kind() == StoreErrorKind::CorruptRecord => {
            tracing::error!(%error, "idempotency record unreadable");
        }
        Error::Store(error) if error.kind() == StoreErrorKind::WriteRejected => {
            tracing::error!(%error, "the handler's transactional writes were rejected; nothing was committed");
        }
        Error::Store(error) if !error.kind().is_transient() => {
            tracing::error!(%error, kind = error.kind().as_str(), "idempotency store refused the request (an operator must act); the handler did not run");
        }
        Error::Store(error) => {
            tracing::error!(%error, "idempotency store unavailable; the handler did not run");
        }
        Error::WritesNotCommitted(error) => {
            tracing::error!(%error, "the handler ran during a store outage (fail-open) but its CommitWith writes were not committed; declare the layer Mode::Transactional");
        }
        _ => {}
    }
}
