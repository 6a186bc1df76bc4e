//! [`Idempotency`]: the service the layer wraps around a handler.

use super::{
    commit::CommitWith,
    fingerprint::request_fingerprint,
    future::ResponseFuture,
    key::{parse_key, KeyError},
    layer::Config,
    metrics::HttpOutcome,
    problem::Problem,
};
use crate::{clock::epoch_ms, Attempt, Error, OutcomeKind, Store, StoreErrorKind};
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
}

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
    let problem = |problem: Problem| Ok(problem.to_response(&config.codec.problem_base));
    if !config.methods.contains(request.method()) {
        return (HttpOutcome::PassThrough, call_inner(inner, request).await);
    }
    let mut values = request.headers().get_all(&config.header).iter();
    let key = match (values.next(), values.next()) {
        (None, _) if config.require_key => {
            let header = config.header.to_string();
            return (HttpOutcome::BadKey, problem(Problem::KeyMissing { header }));
        }
        (None, _) => return (HttpOutcome::PassThrough, call_inner(inner, request).await),
        (Some(_), Some(_)) => {
            let (header, error) = (config.header.to_string(), KeyError::Repeated);
            return (
                HttpOutcome::BadKey,
                problem(Problem::KeyInvalid { header, error }),
            );
        }
        (Some(value), None) => match parse_key(value.as_bytes()) {
            Ok(key) => key,
            Err(error) => {
                let header = config.header.to_string();
                return (
                    HttpOutcome::BadKey,
                    problem(Problem::KeyInvalid { header, error }),
                );
            }
        },
    };

    let scope = (config.scope)(&request);
    let mut attempt = Attempt::new(&scope, &key, request_fingerprint(&request));
    let deadline_ms = request.lambda_context_ref().map(|context| context.deadline);
    if let Some(deadline_ms) = deadline_ms {
        attempt = attempt.deadline_ms(deadline_ms);
    }
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
        let result = config
            .engine
            .run(&attempt, &config.codec, config.transactional, || async {
                // The engine calls this at most once per execution, and the
                // loop only goes round again when it did not.
                let Some((inner, request)) = pending.take() else {
                    return Err(Failure::Released(
                        Problem::CorruptRecord.to_response(&config.codec.problem_base),
                    ));
                };
                let mut response = call_inner(inner, request).await.map_err(Failure::Handler)?;
                let writes = response
                    .extensions_mut()
                    .remove::<CommitWith<St::Write>>()
                    .map(|commit| commit.0)
                    .unwrap_or_default();
                if (config.store_when)(response.status()) {
                    Ok((response, writes))
                } else {
                    Err(Failure::Released(response))
                }
            })
            .await;
        return match result {
            Ok(outcome) => {
                let kind = outcome.kind();
                let mut response = outcome.into_value();
                let outcome = match kind {
                    OutcomeKind::Replay | OutcomeKind::CachedReplay => {
                        response.headers_mut().insert(
                            HeaderName::from_static(REPLAYED_HEADER),
                            HeaderValue::from_static("true"),
                        );
                        HttpOutcome::Replay
                    }
                    OutcomeKind::LostLease => HttpOutcome::LostLease,
                    OutcomeKind::NotRecorded => HttpOutcome::NotRecorded,
                    OutcomeKind::Unprotected => HttpOutcome::Unprotected,
                    OutcomeKind::Fresh => HttpOutcome::Fresh,
                };
                (outcome, Ok(response))
            }
            Err(Error::InProgress { retry_after }) => {
                let now = tokio::time::Instant::now();
                match wait_until {
                    Some(until) if now < until => {
                        tokio::time::sleep(backoff.min(until - now).min(retry_after)).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                    _ => (
                        HttpOutcome::InProgress,
                        problem(Problem::InProgress { retry_after }),
                    ),
                }
            }
            Err(Error::PayloadMismatch) => {
                (HttpOutcome::Mismatch, problem(Problem::PayloadMismatch))
            }
            Err(Error::Store(error)) if error.kind() == StoreErrorKind::CorruptRecord => {
                tracing::error!(%error, "idempotency record unreadable");
                (HttpOutcome::StoreError, problem(Problem::CorruptRecord))
            }
            Err(Error::LostOwnership) => (HttpOutcome::LostLease, problem(Problem::LeaseLost)),
            Err(Error::WritesNotCommitted(error)) => {
                tracing::error!(%error, "the handler ran during a store outage (fail-open) but its CommitWith writes were not committed; declare the layer transactional");
                let retry_after = Duration::from_secs(1);
                (
                    HttpOutcome::StoreError,
                    problem(Problem::WritesNotCommitted { retry_after }),
                )
            }
            Err(Error::Store(error)) if error.kind() == StoreErrorKind::WriteRejected => {
                tracing::error!(%error, "the handler's transactional writes were rejected; nothing was committed");
                (HttpOutcome::StoreError, problem(Problem::WriteRejected))
            }
            Err(error @ Error::Store(_)) => {
                let retry_after = error.retry_after().unwrap_or(Duration::from_secs(1));
                tracing::error!(error = %DisplayStoreError(&error), "idempotency store unavailable; the handler did not run");
                (
                    HttpOutcome::StoreError,
                    problem(Problem::StoreUnavailable { retry_after }),
                )
            }
            Err(Error::Operation(Failure::Handler(error))) => {
                (HttpOutcome::HandlerError, Err(error))
            }
            Err(Error::Operation(Failure::Released(response))) => {
                (HttpOutcome::Released, Ok(response))
            }
        };
    }
}

/// Displays the store side of an engine error (the operation's error type
/// need not be displayable).
struct DisplayStoreError<'a, E>(&'a Error<E>);

impl<E> std::fmt::Display for DisplayStoreError<'_, E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Error::Store(error) => write!(f, "{error}"),
            other => f.write_str(other.kind().as_str()),
        }
    }
}
