//! The handler's run under its claim: the request told of the claim, the
//! handler called, and its response handed to its record.

use super::{
    recording::{record_response, Recording},
    Inner, LayerBody,
};
use crate::{
    http::{
        commit::CommitWith,
        config::Config,
        respond::{Failure, Live},
        streaming::Recorded,
        TraceContext,
    },
    store::Store,
    ClaimHandle,
};
use http::{Request, Response};
use tokio::sync::oneshot;

/// The handler's run under its claim: the request told of the claim (and
/// of a takeover, and given the transaction in the in-transaction form),
/// then its response read for its record, stored whole, teed to the client
/// as it streams, or passed through not stored, as the outcome policy and
/// the body say.
pub(super) async fn run_handler<S, St, B, ResBody>(
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
        // The trace this work runs in, for its record: read before the
        // handler takes the request.
        let trace = config
            .settings
            .keep_trace_context
            .then(|| TraceContext::of_work(&request))
            .flatten();
        let mut response = inner.call(request).await.map_err(Failure::Handler)?;
        if let Some(trace) = trace {
            response.extensions_mut().insert(trace);
        }
        response
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
