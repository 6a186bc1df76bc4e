//! What the engine tells its observers, at each entry point, on the
//! memory store: one answer for each attempt, through the port the attempt
//! names, and the takeovers, claims in progress and conflicts it met.

use super::*;
use crate::{
    observe::{Event, Port},
    store::TransactionLimits,
    testing::{ManualClock, RecordingObserver},
    Error, Fingerprint, MemoryStore, StoreErrorKind,
};
use futures_util::FutureExt;
use std::{panic::AssertUnwindSafe, time::Duration};

fn observed() -> (Engine<MemoryStore>, RecordingObserver, ManualClock) {
    let observer = RecordingObserver::default();
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(MemoryStore::new())
        .clock(clock.clone())
        .observer(observer.clone())
        .build();
    (engine, observer, clock)
}

fn attempt(key: &str, payload: u8) -> Attempt<'_> {
    Attempt::new("s", key, Fingerprint::of_bytes(&[payload]))
}

#[tokio::test]
async fn every_answer_of_execute_is_reported_once_through_its_port() {
    let (engine, observer, clock) = observed();
    let ok = || async { Ok::<_, &str>(1u8) };
    engine.execute(&attempt("a", 1), ok).await.unwrap();
    engine.execute(&attempt("a", 1), ok).await.unwrap();
    let _ = engine.execute(&attempt("a", 2), ok).await;
    let _ = engine
        .execute(&attempt("b", 1), || async { Err::<u8, _>("declined") })
        .await;
    // A duplicate of a run in progress finds it, two seconds old.
    let held = engine.clone();
    engine
        .execute(
            &attempt("c", 1).port(Port::Other("custom")),
            || async move {
                clock.advance(Duration::from_secs(2));
                let duplicate = held.execute(&attempt("c", 1), ok).await;
                assert!(matches!(duplicate, Err(Error::InProgress { .. })));
                Ok::<_, &str>(1u8)
            },
        )
        .await
        .unwrap();
    assert_eq!(
        observer.answers(),
        [
            ("engine", "fresh"),
            ("engine", "replay"),
            ("engine", "key_reused"),
            ("engine", "operation_error"),
            ("engine", "in_progress"),
            ("custom", "fresh"),
        ]
    );
    assert!(observer.events().contains(&Event::FoundInProgress {
        age: Duration::from_secs(2)
    }));
}

#[tokio::test]
async fn a_takeover_is_reported_with_its_attempt_number() {
    let (engine, observer, clock) = observed();
    let keeps = attempt("k", 1).keep_claim_on_panic();
    let panicked = AssertUnwindSafe(engine.execute(&keeps, || async {
        panic!("the first attempt dies");
        #[allow(unreachable_code)]
        Ok::<u8, ()>(1)
    }))
    .catch_unwind()
    .await;
    assert!(panicked.is_err());
    clock.advance(Duration::from_secs(24 * 3600));
    engine
        .execute(&attempt("k", 1), || async { Ok::<_, ()>(2u8) })
        .await
        .unwrap();
    assert!(
        observer.events().contains(&Event::TookOver { attempt: 2 }),
        "{:?}",
        observer.events()
    );
    assert_eq!(observer.answers().last(), Some(&("engine", "fresh")));
}

#[tokio::test]
async fn the_single_write_and_the_transactional_run_report_their_answers() {
    let (engine, observer, _) = observed();
    let value = |_| async { Ok::<_, ()>((1u8, Vec::new())) };
    for _ in 0..2 {
        engine
            .run_single_write(&attempt("w", 1), &Json, value)
            .await
            .unwrap();
        engine
            .transaction_run(
                &attempt("t", 1).port(Port::Batch),
                TransactionLimits::default(),
                &Json,
                |_: &crate::WriteRefusal| None,
                value,
            )
            .await
            .unwrap();
    }
    assert_eq!(
        observer.answers(),
        [
            ("engine", "fresh"),
            ("batch", "fresh"),
            ("engine", "replay"),
            ("batch", "replay"),
        ]
    );
}

/// A claim that conflicted in the store is retried, and the observers
/// are told.
#[tokio::test]
async fn a_conflict_retried_is_reported() {
    let (engine, observer, _) = observed();
    engine.store().fail_next_with(1, StoreErrorKind::Conflict);
    engine
        .execute(&attempt("c", 1), || async { Ok::<_, ()>(1u8) })
        .await
        .unwrap();
    let events = observer.events();
    let retried = events.iter().position(|e| *e == Event::ConflictRetried);
    assert_eq!(retried, Some(1), "after the conflicting claim: {events:?}");
    assert_eq!(observer.answers(), [("engine", "fresh")]);
    assert_eq!(
        observer.store_calls(),
        [("claim", "conflict"), ("claim", "ok"), ("complete", "ok")]
    );
}

/// Every store call is reported, with its result: a fresh run's claim
/// and completion, a replay's refused claim (a refusal answers: it is not
/// a failure), an outage's failed claim, and the operators' calls; each
/// timed.
#[tokio::test]
async fn every_store_call_is_reported_with_its_result() {
    let (engine, observer, _) = observed();
    let ok = || async { Ok::<_, ()>(1u8) };
    engine.execute(&attempt("a", 1), ok).await.unwrap();
    assert_eq!(
        observer.store_calls(),
        [("claim", "ok"), ("complete", "ok")]
    );
    let fresh = observer.events().len();
    engine.execute(&attempt("a", 1), ok).await.unwrap();
    engine
        .store()
        .fail_next_with(1, StoreErrorKind::Unavailable);
    let _ = engine.execute(&attempt("b", 1), ok).await;
    engine.inspect("s", "a").await.unwrap();
    assert_eq!(
        observer.store_calls()[2..],
        [
            ("claim", "ok"),
            ("claim", "unavailable"),
            // Whether the failed claim landed, read back.
            ("get", "ok"),
            ("get", "ok"),
        ]
    );
    assert!(observer.events()[fresh..].iter().all(|event| match event {
        Event::StoreCalled { elapsed, .. } => *elapsed < Duration::from_secs(60),
        _ => true,
    }));
}

/// A step's write is a store call like the others; a takeover's first
/// step reads the steps.
#[tokio::test]
async fn each_step_write_and_read_is_reported() {
    let (engine, observer, clock) = observed();
    let failed = engine
        .run(&attempt("a", 1), Mode::Plain, &Json, |claim| async move {
            claim.step("charge", || async { Ok::<_, ()>(1u8) }).await?;
            Err::<(u8, Vec<_>), _>(Error::Operation(()))
        })
        .await;
    assert!(failed.is_err());
    clock.advance(Duration::from_secs(1));
    engine
        .run(&attempt("a", 1), Mode::Plain, &Json, |claim| async move {
            let charge = claim.step("charge", || async { Ok::<_, ()>(2u8) }).await?;
            Ok::<_, Error<()>>((charge, Vec::new()))
        })
        .await
        .expect("resumed");
    assert_eq!(
        observer.store_calls(),
        [
            ("claim", "ok"),
            ("record_step", "ok"),
            // The failure gives the key back, keeping the step.
            ("extend", "ok"),
            ("claim", "ok"),
            ("take_over", "ok"),
            ("steps", "ok"),
            ("complete", "ok"),
        ]
    );
}

#[tokio::test]
async fn an_engine_without_observers_reports_nothing_and_one_with_two_tells_both() {
    let first = RecordingObserver::default();
    let second = RecordingObserver::default();
    let engine = Engine::builder(MemoryStore::new())
        .observer(first.clone())
        .observer(second.clone())
        .build();
    engine
        .execute(&attempt("a", 1), || async { Ok::<_, ()>(1u8) })
        .await
        .unwrap();
    assert_eq!(first.events(), second.events());
    assert_eq!(first.answers(), [("engine", "fresh")]);
    let Some(Event::Answered { elapsed, .. }) = first
        .events()
        .into_iter()
        .find(|event| matches!(event, Event::Answered { .. }))
    else {
        panic!("an answer");
    };
    assert!(elapsed < Duration::from_secs(60));
}

/// A durable execution's answers ([`crate::split`]): none at its own
/// claim, its completion's when it completes (a later invocation), and a
/// replay's or a refusal's at a claim that finds the record.
#[tokio::test]
async fn a_split_execution_is_answered_through_the_durable_port_when_it_completes() {
    use crate::split::{self, SplitAttempt, SplitClaim};
    let (engine, observer, _) = observed();
    let execution = |owner: &str, payload: u8| {
        SplitAttempt::new(
            "s",
            "x",
            Fingerprint::of_bytes(&[payload]),
            crate::store::OwnerToken::from_stored(owner),
            Duration::from_secs(60),
        )
    };
    let first = execution("execution-1", 1);
    let claimed = split::claim::<_, u8>(&engine, &first, &Json).await;
    assert!(matches!(claimed, Ok(SplitClaim::Ours)), "{claimed:?}");
    assert!(
        observer.answers().is_empty(),
        "its own claim is no answer yet"
    );
    let completed = split::complete(&engine, &first, b"7".to_vec()).await;
    assert!(
        matches!(completed, Ok(crate::OutcomeKind::Fresh)),
        "{completed:?}"
    );
    let replayed = split::claim::<_, u8>(&engine, &execution("execution-2", 1), &Json).await;
    assert!(
        matches!(replayed, Ok(SplitClaim::Replay(7))),
        "{replayed:?}"
    );
    let reused = split::claim::<_, u8>(&engine, &execution("execution-3", 2), &Json).await;
    assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
    assert_eq!(
        observer.answers(),
        [
            ("durable", "fresh"),
            ("durable", "replay"),
            ("durable", "key_reused")
        ]
    );
}

/// Outside review: an observer is user code called on the request's task,
/// in the middle of the protocol (`TookOver` fires after the new claim is
/// written, before the operation runs). The redaction hook is run under
/// `catch_unwind` ("a hook that panics is a hook that failed"); an
/// observer is not. One that panics (a metrics exporter's poisoned lock, a
/// label it refuses) fails the request, and on `TookOver` it leaves the key
/// claimed by a run that never ran: every retry is `in_progress` until that
/// lease lapses too.
#[tokio::test]
async fn a_panicking_observer_neither_fails_the_request_nor_holds_the_key() {
    #[derive(Debug)]
    struct PanicsOnTakeover;
    impl crate::observe::Observer for PanicsOnTakeover {
        fn observe(&self, event: &Event) {
            if matches!(event, Event::TookOver { .. }) {
                panic!("the exporter panicked");
            }
        }
    }
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(MemoryStore::new())
        .clock(clock.clone())
        .observer(PanicsOnTakeover)
        .build();
    let keeps = attempt("k", 1).keep_claim_on_panic();
    let _ = AssertUnwindSafe(engine.execute(&keeps, || async {
        panic!("the first attempt dies");
        #[allow(unreachable_code)]
        Ok::<u8, ()>(1)
    }))
    .catch_unwind()
    .await;
    clock.advance(Duration::from_secs(24 * 3600));
    let takeover =
        AssertUnwindSafe(engine.execute(&attempt("k", 1), || async { Ok::<_, ()>(2u8) }))
            .catch_unwind()
            .await;
    let retry = engine
        .execute(&attempt("k", 1), || async { Ok::<_, ()>(3u8) })
        .await;
    assert!(
        !matches!(retry, Err(Error::InProgress { .. })),
        "the key is held by a takeover whose operation never ran"
    );
    assert!(takeover.is_ok(), "the observer's panic failed the request");
}
