//! The record of a response teed to the client as it streams: completed
//! when its body ends, or recorded as not stored before its claim's lease
//! runs out.

use super::recording::{declared_length_holds, log_not_stored};
use crate::http::TraceContext;
use crate::{
    http::{
        config::Settings,
        grpc,
        respond::Failure,
        stored::{StoredResponse, WhyNotStored},
        streaming::{Copied, Ending, Recorded},
    },
    store::Store,
    ClaimHandle,
};
use http::Response;
use std::time::Duration;

/// A response's head, kept for its record while its body streams.
pub(super) struct StoredHead {
    status: http::StatusCode,
    headers: http::HeaderMap,
    /// The trace of the work, when the record keeps it.
    trace: Option<TraceContext>,
}

impl StoredHead {
    pub(super) fn of(parts: &http::response::Parts) -> Self {
        Self {
            status: parts.status,
            headers: parts.headers.clone(),
            trace: parts.extensions.get::<TraceContext>().copied(),
        }
    }
}

/// The record of a response that went to the client as it came: whole if
/// its body ended within what a record holds, otherwise its head and why
/// not. A body still going when the claim's lease is near its end is
/// recorded then (not stored), so that no retry runs the request again.
pub(super) async fn teed<St: Store, E, R>(
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
            if let Some(trace) = head.trace {
                response.extensions_mut().insert(trace);
            }
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
