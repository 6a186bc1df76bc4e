//! The answer to an attempt: the handler's response, a replay, or the
//! layer's own problem, and what the layer did.

use super::{
    body::into_response,
    config::Settings,
    grpc,
    metrics::HttpOutcome,
    problem::Problem,
    rebuild_body::RebuildBody,
    stored::{StoredResponse, WhyNotStored, BODY_HEADERS},
    stored_body::StoredBody,
    trace_context::TraceContext,
};
use crate::{error::BoxError, Error, Outcome, OutcomeKind, StoreErrorKind};
use http::{HeaderMap, HeaderValue, Response, StatusCode};

/// Why the operation did not produce a response to store.
pub(super) enum Failure<E, R> {
    /// The handler failed: release the claim, return its error.
    Handler(E),
    /// The outcome policy says not to store this response: release the
    /// claim, return the response, its body untouched.
    Released(Response<R>),
    /// The outcome policy says not to store a response that already went
    /// to the client as it streamed (a gRPC error in its trailers):
    /// release the claim. No one waits for this answer.
    ReleasedAfterStreaming,
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
pub(super) type Live<R> = Option<Response<R>>;

pub(super) type Attempted<E, R> = Result<Outcome<StoredResponse>, Error<Failure<E, R>>>;

/// A problem in the handler's body type: `application/problem+json`, or
/// for a gRPC request (`grpc`) a trailers-only gRPC answer.
pub(super) fn problem_response<R: RebuildBody>(
    settings: &Settings,
    problem: &Problem,
    grpc: bool,
) -> Response<R> {
    into_response(problem_stored(settings, problem, grpc), None)
}

fn problem_stored(settings: &Settings, problem: &Problem, grpc: bool) -> Response<StoredBody> {
    if grpc {
        grpc::problem_response(problem, &settings.problem_base)
    } else {
        problem.to_response(&settings.problem_base)
    }
}

/// The answer to an attempt, and what it was; `grpc` for a gRPC request.
pub(super) fn respond<E, R: RebuildBody>(
    settings: &Settings,
    result: Attempted<E, R>,
    live: Live<R>,
    grpc: bool,
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
            let (mut response, trailers) = render_stored(settings, done.into_value(), grpc);
            if outcome == HttpOutcome::Replay {
                response.headers_mut().insert(
                    settings.replayed_header.clone(),
                    HeaderValue::from_static("true"),
                );
                if let Some(work) = response.extensions().get::<TraceContext>().copied() {
                    point_to_work(settings, &mut response, &work);
                }
                if let (Some(hook), Some(replayed)) = (&settings.on_replay, &replayed) {
                    hook(&mut response, replayed);
                }
            }
            return (outcome, Ok(into_response(response, trailers)));
        }
        Err(Error::Operation(Failure::Handler(error))) => {
            return (HttpOutcome::HandlerError, Err(error))
        }
        Err(Error::Operation(Failure::Released(response))) => {
            return (HttpOutcome::Released, Ok(response))
        }
        Err(Error::Operation(Failure::ReleasedAfterStreaming)) => {
            // The client has the response already; this answer goes nowhere.
            return (
                HttpOutcome::Released,
                Ok(problem_response(settings, &Problem::Internal, grpc)),
            );
        }
        Err(Error::Operation(Failure::ResponseUnreadable(error))) => {
            tracing::error!(%error, "the handler's response body failed while it was read to be stored; the claim is released");
            return (
                HttpOutcome::HandlerError,
                Ok(problem_response(
                    settings,
                    &Problem::ResponseUnreadable,
                    grpc,
                )),
            );
        }
        Err(Error::Operation(Failure::Cancelled)) => {
            tracing::error!("the request's task was cancelled (the runtime is shutting down); its record stays in progress until its lease lapses");
            return (
                HttpOutcome::StoreError,
                Ok(problem_response(settings, &Problem::Internal, grpc)),
            );
        }
        Err(Error::Operation(Failure::AlreadyRun)) => {
            tracing::error!("the engine asked for the handler after it had run; this is a bug");
            return (
                HttpOutcome::StoreError,
                Ok(problem_response(settings, &Problem::Internal, grpc)),
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
    (outcome, Ok(problem_response(settings, &problem, grpc)))
}

/// A replay pointed to the work it replays: its span records that work's
/// trace context (and links to it, with the `opentelemetry` feature), and
/// the header named for it carries it.
fn point_to_work(settings: &Settings, response: &mut Response<StoredBody>, work: &TraceContext) {
    let current = tracing::Span::current();
    current.record("idempotency.replay_of", tracing::field::display(work));
    #[cfg(feature = "opentelemetry")]
    super::trace_link::link_current_span(work);
    if let Some(name) = &settings.replay_trace_header {
        if let Ok(value) = HeaderValue::from_str(&work.to_string()) {
            response.headers_mut().insert(name.clone(), value);
        }
    }
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

/// A stored response as the client gets it: whole, with its trailers, or,
/// for one not stored (a stream, or too large), its status and stored
/// headers with a problem body that says so (for gRPC, the problem's
/// trailers-only answer with the stored metadata).
fn render_stored(
    settings: &Settings,
    stored: StoredResponse,
    grpc: bool,
) -> (Response<StoredBody>, Option<HeaderMap>) {
    match stored {
        StoredResponse::Full(response, trailers) => (response, trailers),
        StoredResponse::NotStored {
            status,
            headers,
            why,
        } => head_only(settings, status, headers, why, None, grpc),
        StoredResponse::Withheld {
            status,
            headers,
            digest,
        } => head_only(
            settings,
            status,
            headers,
            WhyNotStored::Withheld,
            Some(digest),
            grpc,
        ),
    }
}

/// The replay of a record that keeps a response's head only: its status
/// and stored headers, with a problem body that says why.
fn head_only(
    settings: &Settings,
    status: StatusCode,
    headers: HeaderMap,
    why: WhyNotStored,
    digest: Option<[u8; 32]>,
    grpc: bool,
) -> (Response<StoredBody>, Option<HeaderMap>) {
    let problem = Problem::ResponseNotStored {
        status,
        why,
        digest,
    };
    let mut response = problem_stored(settings, &problem, grpc);
    for (name, value) in &headers {
        // The headers that describe the original body (a
        // `Content-Encoding: gzip`) or measure it (a `Content-Length` that
        // hyper cannot frame the problem by, a digest, its `ETag`) would
        // misdescribe the problem, and a gRPC status would contradict it.
        if BODY_HEADERS.contains(name)
            || super::stored::BODY_MEASURES.contains(&name.as_str())
            || name.as_str().starts_with("grpc-")
        {
            continue;
        }
        if !response.headers().contains_key(name) {
            response.headers_mut().append(name, value.clone());
        }
    }
    (response, None)
}

/// Logs why the layer answered for the handler, where an operator must act.
fn log_refusal<E>(error: &Error<E>) {
    match error {
        Error::Store(error) if error.kind() == StoreErrorKind::CorruptRecord => {
            tracing::error!(%error, "idempotency record unreadable");
        }
        Error::Store(error) if error.kind() == StoreErrorKind::Unauthentic => {
            tracing::error!(%error, "idempotency record failed authentication; not replayed, not run again");
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

/// The compatibility mode's answer, when Powertools' record decided the
/// request: its stored response replayed, or a refusal (in progress, a
/// record that cannot be replayed, the store's error).
#[cfg(feature = "powertools")]
pub(super) fn powertools<E, R: RebuildBody>(
    settings: &Settings,
    found: Result<Response<StoredBody>, Error>,
    grpc: bool,
) -> (HttpOutcome, Result<Response<R>, E>) {
    match found {
        Ok(response) => {
            let mut response = into_response(response, None);
            response.headers_mut().insert(
                settings.replayed_header.clone(),
                HeaderValue::from_static("true"),
            );
            tracing::debug!("replayed the response Powertools stored");
            (HttpOutcome::Replay, Ok(response))
        }
        Err(error) => {
            let error = match error {
                Error::InProgress { retry_after } => Error::InProgress { retry_after },
                Error::KeyReused => Error::KeyReused,
                Error::LeaseLost => Error::LeaseLost,
                Error::Store(e) => Error::Store(e),
                Error::WritesNotCommitted(e) => Error::WritesNotCommitted(e),
                Error::TimeLimitExceeded { limit } => Error::TimeLimitExceeded { limit },
                Error::Operation(never) => match never {},
            };
            respond(settings, Err(error), None, grpc)
        }
    }
}
