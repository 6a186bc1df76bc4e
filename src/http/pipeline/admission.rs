//! What a request must bring before it claims anything: a key (in its
//! header, or read from its body), a body that reads within the limit, a
//! scope, and a place in the bound on running work; and the layer's own
//! answers to one that does not.

#[cfg(feature = "powertools")]
use super::powertools_lookup::powertools_first;
use super::{powertools_lookup::reads_powertools, Inner, LayerBody};
use crate::{
    engine::OwnedAttempt,
    http::{
        body::{rebuild_request, BodyError, Kind},
        config::{Config, Settings},
        idempotency_key::{parse_key, KeyError, Source},
        lambda_context,
        metrics::HttpOutcome,
        problem::{KeyPlace, Problem},
        rebuild_body::RebuildBody,
        respond::problem_response,
        scope::route_key,
    },
    store::Store,
};
use futures_util::{future::Either, FutureExt};
use http::{Request, Response};
use std::future::Future;
use tokio_util::task::task_tracker::TaskTrackerToken;

/// The layer's own answer to a request it refuses.
pub(super) fn refused<E, R: RebuildBody>(
    settings: &Settings,
    grpc: bool,
    outcome: HttpOutcome,
    problem: Problem,
) -> (HttpOutcome, Result<Response<R>, E>) {
    (outcome, Ok(problem_response(settings, &problem, grpc)))
}

/// A request without a key: refused when one is required, otherwise
/// passed to the handler as it is.
///
/// A plain function (see the pipeline's note): the handler's future is all
/// the returned future holds.
pub(super) fn keyless<S, B, ResBody>(
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

/// A request read whole that has no key (none in its header, none where
/// the key source looks in the request): [`keyless`], once Powertools'
/// records, which may be keyed on the request itself (a field of the body,
/// say), had their say.
///
/// A plain function that returns an `async` block (see the pipeline's
/// note); its future is boxed where it is awaited, as only a key read from
/// the body reaches it.
#[allow(clippy::manual_async_fn)]
pub(super) fn unkeyed_after_body<'a, S, St, B, ResBody>(
    config: &'a Config<St>,
    inner: S,
    request: Request<bytes::Bytes>,
    kind: Kind,
    grpc: bool,
) -> impl Future<Output = (HttpOutcome, Result<Response<ResBody>, S::Error>)> + 'a
where
    S: Inner<B, ResBody>,
    St: Store,
    B: LayerBody,
    ResBody: LayerBody,
{
    async move {
        // A retry of a request the old function ran must find its record
        // first.
        #[cfg(feature = "powertools")]
        let takeover = match powertools_first(config, &request, kind, None, grpc).await {
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
        keyless(&config.settings, inner, request, grpc).await
    }
}

/// Whether a request without a key in its header has none anywhere: the
/// key is read from the header only, and Powertools' records (which may be
/// keyed on the body) are not read. Such a request is answered, or passed
/// through, with its body unread.
pub(super) fn key_only_in_header(settings: &Settings) -> bool {
    matches!(settings.key.0, Source::Header(_)) && !reads_powertools(settings)
}

/// The key in the configured header: `Ok(None)` when there is none (or the
/// key comes from elsewhere); a problem when it is repeated or malformed.
pub(super) fn read_header_key<B>(
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
pub(super) fn key_of(
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
pub(super) fn body_problem(settings: &Settings, error: BodyError) -> Problem {
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

/// The request's place in the bound on running work (none: it is
/// refused), recorded in its span. Checked last, just before the claim: a
/// slow client that sends its body byte by byte holds no slot, and a
/// request refused here has claimed nothing.
pub(super) fn take_slot(settings: &Settings) -> Option<TaskTrackerToken> {
    let slot = settings.in_flight.take()?;
    let running = i64::try_from(settings.in_flight.running()).unwrap_or(i64::MAX);
    tracing::Span::current().record("idempotency.in_flight", running);
    Some(slot)
}

/// The attempt a keyed request makes: its scoped key, the fingerprint of
/// the request, its deadline, the takeover of an abandoned Powertools
/// record if there was one, and how long its duplicates are told to wait,
/// from the durations of its route (returned too: the route this request
/// is measured on).
pub(super) fn attempt_for(
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
    let port = if crate::http::grpc_wire::is_grpc(request.headers()) {
        crate::observe::Port::Grpc
    } else {
        crate::observe::Port::Http
    };
    let attempt = OwnedAttempt::new(scope, key, fingerprint, deadline_ms)
        .taking_over(takeover)
        .retry_hint(hint)
        .port(port);
    (attempt, route_key)
}
