//! [`Idempotency`]: the service the layer wraps around a handler.

use super::{
    commit::CommitWith,
    config::Config,
    fingerprint::request_fingerprint,
    future::ResponseFuture,
    key::{parse_key, KeyError},
    metrics::HttpOutcome,
    problem::Problem,
    stored::StoredResponse,
};
use crate::{
    clock::epoch_ms, store::Store, Attempt, ClaimHandle, Error, Outcome, OutcomeKind,
    StoreErrorKind,
};
use lambda_http::{
    http::{HeaderName, HeaderValue},
    Body, IntoResponse, Request, RequestExt, Response,
};
use std::{
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, SystemTime},
};
use tower::Service;
use tracing::{field, Instrument};

/// The header that marks a replayed response.
pub const REPLAYED_HEADER: &str = "idempotent-replayed";

/// Waiting for another request's result stops this long before the
/// invocation's deadline, to leave time to answer.
const DEADLINE_MARGIN: Duration = Duration::from_millis(500);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait, whatever the budget: a `Duration::MAX` budget must not
/// overflow the clock.
const LONGEST_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// A `lambda_http` service made idempotent by an
/// [`IdempotencyLayer`](super::IdempotencyLayer).
#[derive(Clone)]
pub struct Idempotency<S, St> {
    inner: S,
    config: Arc<Config<St>>,
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

impl<S, St> Service<Request> for Idempotency<S, St>
where
    S: Service<Request> + Clone + Send + 'static,
    S::Future: Send,
    S::Response: IntoResponse,
    S::Error: Send + 'static,
    St: Store,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Self::Future {
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
enum Failure<E> {
    /// The handler failed: release the claim, return its error.
    Handler(E),
    /// The outcome policy says not to store this response: release the
    /// claim, return the response.
    Released(Response<Body>),
    /// The engine asked for the operation a second time, after it had run.
    /// It never does (it asks at most once per call, and a call that finds
    /// the key in progress runs nothing); answered as an internal error.
    AlreadyRun,
}

type Attempted<E> = Result<Outcome<StoredResponse>, Error<Failure<E>>>;

async fn call_inner<S>(mut inner: S, request: Request) -> Result<Response<Body>, S::Error>
where
    S: Service<Request>,
    S::Response: IntoResponse,
{
    let response = inner.call(request).await?;
    // Converted before awaiting, so the handler's response type need not be
    // `Send`.
    let response = response.into_response();
    Ok(response.await)
}

async fn handle<S, St>(
    config: &Config<St>,
    inner: S,
    request: Request,
) -> (HttpOutcome, Result<Response<Body>, S::Error>)
where
    S: Service<Request>,
    S::Response: IntoResponse,
    St: Store,
{
    if !config.methods.contains(request.method()) {
        return (HttpOutcome::PassThrough, call_inner(inner, request).await);
    }
    #[cfg(feature = "powertools")]
    if let Some(answer) = powertools_answer(config, &request).await {
        return answer;
    }
    let key = match read_key(config, &request) {
        Ok(Some(key)) => key,
        Ok(None) => return (HttpOutcome::PassThrough, call_inner(inner, request).await),
        Err(problem) => {
            return (
                HttpOutcome::BadKey,
                Ok(problem.to_response(&config.problem_base)),
            )
        }
    };
    let scope = (config.scope)(&request);
    let deadline_ms = request.lambda_context_ref().map(|context| context.deadline);
    let mut attempt = Attempt::new(&scope, &key, request_fingerprint(&request));
    if let Some(deadline_ms) = deadline_ms {
        attempt = attempt.deadline_ms(deadline_ms);
    }
    let result = run_waiting(config, &attempt, deadline_ms, inner, request).await;
    respond(config, result)
}

/// The compatibility mode's answer, when Powertools' record decides the
/// request; `None` lets the protocol run.
#[cfg(feature = "powertools")]
async fn powertools_answer<St: Store, E>(
    config: &Config<St>,
    request: &Request,
) -> Option<(HttpOutcome, Result<Response<Body>, E>)> {
    use crate::powertools::{http, PowertoolsFound};
    let compat = config.powertools.as_ref()?;
    // Nothing to read with idempotency off; nor for a key this instance
    // answers from its cache (the cache holds this crate's own outcome).
    let key = read_key(config, request).ok().flatten();
    let scope = key
        .as_ref()
        .map(|_| (config.scope)(request))
        .unwrap_or_default();
    if config.engine.skips_powertools(&scope, key.as_deref()) {
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
        respond(config, Err(error))
    };
    match compat.check_in(&http::request_view(request), true).await {
        Ok(None) => None,
        Ok(Some(PowertoolsFound::InProgress { retry_after })) => {
            Some(refused(Error::InProgress { retry_after }))
        }
        Ok(Some(PowertoolsFound::Completed { data })) => {
            match http::proxy_response(data.as_deref()) {
                Ok(mut response) => {
                    response.headers_mut().insert(
                        HeaderName::from_static(REPLAYED_HEADER),
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

/// The key the request carries: `Ok(None)` when it carries none and the key
/// is optional; a problem when it is missing, repeated or malformed.
fn read_key<St>(config: &Config<St>, request: &Request) -> Result<Option<String>, Problem> {
    let header = || config.header.to_string();
    let mut values = request.headers().get_all(&config.header).iter();
    match (values.next(), values.next()) {
        (None, _) if config.require_key => Err(Problem::KeyMissing { header: header() }),
        (None, _) => Ok(None),
        (Some(_), Some(_)) => Err(Problem::KeyInvalid {
            header: header(),
            error: KeyError::Repeated,
        }),
        (Some(value), None) => {
            parse_key(value.as_bytes())
                .map(Some)
                .map_err(|error| Problem::KeyInvalid {
                    header: header(),
                    error,
                })
        }
    }
}

/// Runs the attempt; while another request holds the key, waits for its
/// result (with backoff, within the configured budget and the invocation's
/// deadline) and asks again.
async fn run_waiting<S, St>(
    config: &Config<St>,
    attempt: &Attempt<'_>,
    deadline_ms: Option<u64>,
    inner: S,
    request: Request,
) -> Attempted<S::Error>
where
    S: Service<Request>,
    S::Response: IntoResponse,
    St: Store,
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
        let operation = move |claim: ClaimHandle| async move {
            let Some((inner, mut request)) = not_run_yet.take() else {
                return Err(Failure::AlreadyRun);
            };
            // The handler can learn that it took over a lapsed claim
            // (and reconcile first), and extend or watch its lease.
            if let Some(takeover) = claim.takeover() {
                request.extensions_mut().insert(takeover);
            }
            request.extensions_mut().insert(claim);
            let mut response = call_inner(inner, request).await.map_err(Failure::Handler)?;
            let writes = response
                .extensions_mut()
                .remove::<CommitWith<St::Write>>()
                .map(|commit| commit.0)
                .unwrap_or_default();
            if (config.store_when)(response.status()) {
                Ok((StoredResponse::Full(response), writes))
            } else {
                Err(Failure::Released(response))
            }
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
fn respond<St, E>(
    config: &Config<St>,
    result: Attempted<E>,
) -> (HttpOutcome, Result<Response<Body>, E>) {
    let error = match result {
        Ok(outcome) => {
            let kind = outcome.kind();
            let replayed = outcome.replayed().copied();
            let mut response = render_stored(config, outcome.into_value());
            let outcome = match kind {
                OutcomeKind::Replay | OutcomeKind::CachedReplay => {
                    response.headers_mut().insert(
                        HeaderName::from_static(REPLAYED_HEADER),
                        HeaderValue::from_static("true"),
                    );
                    if let (Some(hook), Some(replayed)) = (&config.on_replay, &replayed) {
                        hook(&mut response, replayed);
                    }
                    HttpOutcome::Replay
                }
                OutcomeKind::Disabled => HttpOutcome::Disabled,
                OutcomeKind::LeaseLost => HttpOutcome::LeaseLost,
                OutcomeKind::NotRecorded => HttpOutcome::NotRecorded,
                OutcomeKind::Unprotected => HttpOutcome::Unprotected,
                OutcomeKind::Fresh => HttpOutcome::Fresh,
            };
            return (outcome, Ok(response));
        }
        Err(Error::Operation(Failure::Handler(error))) => {
            return (HttpOutcome::HandlerError, Err(error))
        }
        Err(Error::Operation(Failure::Released(response))) => {
            return (HttpOutcome::Released, Ok(response))
        }
        Err(Error::Operation(Failure::AlreadyRun)) => {
            tracing::error!("the engine asked for the handler after it had run; this is a bug");
            let problem = Problem::Internal;
            return (
                HttpOutcome::StoreError,
                Ok(problem.to_response(&config.problem_base)),
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
    (outcome, Ok(problem.to_response(&config.problem_base)))
}

/// A stored response as the client gets it: whole, or, for one too large to
/// store, its status and stored headers with a problem body that says so.
fn render_stored<St>(config: &Config<St>, stored: StoredResponse) -> Response<Body> {
    match stored {
        StoredResponse::Full(response) => response,
        StoredResponse::NotStored { status, headers } => {
            let mut response =
                Problem::ResponseNotStored { status }.to_response(&config.problem_base);
            for (name, value) in &headers {
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
