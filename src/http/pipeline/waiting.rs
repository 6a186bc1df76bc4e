//! The attempt tried again while another request holds its key, within
//! the configured wait: on the run itself when it is this process's, in
//! memory; otherwise with backoff, asking the store again.

use super::{attempt::run_attempt, handler::run_handler, Inner, LayerBody};
use crate::{
    clock::epoch_ms,
    http::{
        config::{Config, Settings},
        respond::{Attempted, Failure, Live},
        stored::StoredResponse,
        streaming::Recorded,
    },
    store::Store,
    Attempt, ClaimHandle, Error, OutcomeKind,
};
use http::{Request, Response};
use std::time::{Duration, SystemTime};
use tokio::sync::oneshot;

/// Waiting for another request's result stops this long before the
/// invocation's deadline, to leave time to answer.
const DEADLINE_MARGIN: Duration = Duration::from_millis(500);
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait, whatever the budget: a `Duration::MAX` budget must not
/// overflow the clock.
const LONGEST_WAIT: Duration = Duration::from_secs(24 * 60 * 60);

/// Runs the attempt; while another request holds the key, waits for its
/// result (within the configured budget and the invocation's deadline): on
/// the run itself when it is this process's, in memory; otherwise with
/// backoff, asking the store again. A run that completes its record counts, on
/// the engine's clock, for its `route`'s typical duration. `pending` holds
/// the handler and its request until an attempt runs them.
pub(super) async fn run_waiting<S, St, B, ResBody>(
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
    let wait_until = wait_until(&config.settings, attempt);
    // Asked again and again, the engine would report each answer: the
    // request's one answer is reported here, the last.
    let started = wait_until.and_then(|_| config.engine.observed_start());
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
        let refusal = |refused: &crate::WriteRefusal| refusal_answer(&config.settings, refused);
        // The result is gone by the time this waits: a block of its own,
        // so that the future does not keep room for it (some 280 bytes)
        // beside the timer's.
        // With a wait, a duplicate of a run in this process waits on that
        // run, in memory, for what is left of the budget.
        let waiting;
        let this_attempt = match wait_until {
            Some(until) => {
                let left = until.saturating_duration_since(tokio::time::Instant::now());
                waiting = attempt.clone().wait_in_process(left).unreported();
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
            if let (Some(measured), Ok(done)) = (measured, &result) {
                record_duration(config, measured, done.kind());
            }
            let (Err(Error::InProgress { retry_after }), Some(until)) = (&result, wait_until)
            else {
                config.engine.report_answer(attempt, started, &result);
                return result;
            };
            let now = tokio::time::Instant::now();
            if now >= until {
                config.engine.report_answer(attempt, started, &result);
                return result;
            }
            backoff.min(until - now).min(*retry_after)
        };
        tokio::time::sleep(pause).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// When waiting for a duplicate's result stops: the configured budget, cut
/// short to answer before the invocation's deadline; none without a wait.
fn wait_until(settings: &Settings, attempt: &Attempt<'_>) -> Option<tokio::time::Instant> {
    settings.wait.map(|budget| {
        let left = attempt.deadline_ms.map_or(budget, |deadline| {
            let left = Duration::from_millis(deadline.saturating_sub(epoch_ms(SystemTime::now())));
            left.saturating_sub(DEADLINE_MARGIN).min(budget)
        });
        tokio::time::Instant::now() + left.min(LONGEST_WAIT)
    })
}

/// The application's answer to a refused write
/// ([`on_write_refusal`](crate::http::IdempotencyLayer::on_write_refusal)),
/// stored or released by the outcome policy like any response; none when
/// it has none.
fn refusal_answer<E, ResBody: LayerBody>(
    settings: &Settings,
    refused: &crate::WriteRefusal,
) -> Option<Result<StoredResponse, Failure<E, ResBody>>> {
    let answer = (settings.on_write_refusal.as_ref()?)(refused)?;
    if (settings.store_when)(answer.status()) {
        return Some(Ok(StoredResponse::Full(answer, None)));
    }
    let (parts, body) = answer.into_parts();
    let body = ResBody::from_stored(body, None);
    Some(Err(Failure::Released(Response::from_parts(parts, body))))
}

/// A fresh run's time, from `started_ms` on the engine's clock, counted
/// for its route's typical duration (what duplicates are told to wait).
fn record_duration<St: Store>(
    config: &Config<St>,
    (route, started_ms): (u64, u64),
    kind: OutcomeKind,
) {
    if kind == OutcomeKind::Fresh {
        let took_ms = config.engine.now_ms().saturating_sub(started_ms);
        config.settings.durations.record(route, took_ms);
    }
}
