//! The handler's response read for its record: stored whole, teed to the
//! client as it streams (its record completing when it ends), or passed
//! through not stored.

use super::{teed_record::teed, LayerBody};
use crate::{
    http::{
        config::{Config, Settings},
        grpc, grpc_wire,
        rebuild_body::RebuildBody,
        respond::{Failure, Live},
        stored::{StoredResponse, WhyNotStored, MAX_BODY},
        stored_body::StoredBody,
        streaming::{read_bounded, streams, Read, Recorded},
    },
    store::Store,
    ClaimHandle,
};
use http::Response;
use std::future::Future;
use tokio::sync::oneshot;

use super::teed_record::StoredHead;

/// What the handler's run under its claim gives: the response as its
/// record stores it and the writes to commit with it, or why there is no
/// record.
pub(super) type Recording<W, E, R> = Result<(StoredResponse, Vec<W>), Failure<E, R>>;

/// The handler's response read for its record: stored whole, teed to the
/// client as it streams (its record completing when it ends), or passed
/// through not stored, as the response and the settings say.
// An `async` block rather than an `async fn` (see the pipeline's note): its
// arguments are held once, where the `async fn` held them again as locals.
#[allow(clippy::too_many_arguments, clippy::manual_async_fn)]
pub(super) fn record_response<'a, St, E, ResBody>(
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
        Ok((passed_through(parts, body, why, live), writes))
    }
}

/// A response that goes to the client as it is, not stored: it is the
/// request's `live` answer, and its record keeps its head and why.
fn passed_through<R>(
    parts: http::response::Parts,
    body: R,
    why: WhyNotStored,
    live: &mut Live<R>,
) -> StoredResponse {
    log_not_stored(why);
    let head = StoredResponse::NotStored {
        status: parts.status,
        headers: parts.headers.clone(),
        why,
    };
    *live = Some(Response::from_parts(parts, body));
    head
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
/// (a single write, or inside the store's transaction), so that none may
/// reach the client before its commit.
fn commits_with_record(settings: &Settings) -> bool {
    settings.in_transaction.is_some() || settings.single_write
}

/// Whether a body that came to its end holds as many bytes as its head's
/// `content-length` says (when it says). One that ended short (or ran
/// long) had its producer stop part-way or lie (a task dropped, a source
/// gone): the server cuts the client off, and the record must not keep
/// those bytes as the whole response.
pub(super) fn declared_length_holds(
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

/// Says why a response goes to the client unstored.
pub(super) fn log_not_stored(why: WhyNotStored) {
    match why {
        WhyNotStored::Stream => tracing::debug!("streamed response (an event stream, a marked StreamResponse or a gRPC stream of more than one message): sent on as it comes, not stored; retries get its status and headers with an explanation"),
        WhyNotStored::StreamFailed => tracing::warn!("the response stream failed part-way: not stored; retries get its status and headers with an explanation, and the request is not run again"),
        WhyNotStored::StreamOutlivedLease => tracing::warn!("the response was still streaming when its claim's lease was near its end: recorded as not stored so that no retry runs it again; raise the lease or enable the heartbeat to store such responses"),
        _ => tracing::warn!(limit = MAX_BODY, "response longer than can be stored: streamed on; retries get its status and headers with an explanation, not its body"),
    }
}
