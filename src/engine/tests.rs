//! The engine's branches on the memory store: failures at each step,
//! leases, the cache, fail-open, transactional writes.

use super::*;
use crate::{
    store::memory::MemoryWrite,
    testing::{CountingStore, ManualClock},
    ErrorKind, MemoryStore, StoreErrorKind,
};
use std::sync::atomic::{AtomicUsize, Ordering};

fn fingerprint(n: u8) -> Fingerprint {
    Fingerprint::of_bytes(&[n])
}

fn setup() -> (Engine<MemoryStore>, MemoryStore, ManualClock) {
    let store = MemoryStore::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(store.clone()).clock(clock.clone()).build();
    (engine, store, clock)
}

#[derive(Debug, PartialEq)]
struct Failed;

#[tokio::test]
async fn failed_completion_returns_the_value_and_keeps_the_claim() {
    let (engine, store, _) = setup();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let outcome = engine
        .execute(&attempt, || async {
            store.fail_next(1); // the completion
            Ok::<_, Failed>(7u32)
        })
        .await
        .expect("the caller still gets its value");
    assert_eq!(outcome.kind(), OutcomeKind::NotRecorded);
    assert_eq!(*outcome.value(), 7);

    let retry = engine
        .execute(&attempt, || async { Ok::<_, Failed>(8u32) })
        .await;
    assert!(
        matches!(retry, Err(Error::InProgress { .. })),
        "the claim stays until its lease passes, so a retry cannot run at once: {retry:?}"
    );
}

#[tokio::test]
async fn failed_release_still_returns_the_operation_error() {
    let (engine, store, clock) = setup();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let result = engine
        .execute(&attempt, || async {
            store.fail_next(1); // the release
            Err::<u32, _>(Failed)
        })
        .await;
    assert!(
        matches!(result, Err(Error::Operation(Failed))),
        "{result:?}"
    );
    let record = store
        .record(&engine.record_id("s", "k"))
        .expect("claim left behind");
    assert_eq!(record.status, Status::InProgress);
    assert!(
        record.lease_until_ms.expect("lease") > clock.now_ms(),
        "it expires with its lease"
    );
}

#[tokio::test]
async fn lease_defaults_without_deadline_and_has_a_floor_when_the_deadline_passed() {
    let (engine, store, clock) = setup();
    let hold = |store: &MemoryStore| {
        let store = store.clone();
        move || async move {
            store.fail_next(1); // leave the claim in place
            Ok::<_, Failed>(0u8)
        }
    };
    engine
        .execute(
            &Attempt::new("s", "no-deadline", fingerprint(1)),
            hold(&store),
        )
        .await
        .expect("ran");
    let record = store
        .record(&engine.record_id("s", "no-deadline"))
        .expect("claim");
    assert_eq!(
        record.lease_until_ms,
        Some(clock.now_ms() + 60_000),
        "DEFAULT_LEASE"
    );

    let past = Attempt::new("s", "late", fingerprint(1)).deadline_ms(clock.now_ms() - 5_000);
    engine.execute(&past, hold(&store)).await.expect("ran");
    let record = store.record(&engine.record_id("s", "late")).expect("claim");
    assert_eq!(record.lease_until_ms, Some(clock.now_ms() + MIN_LEASE_MS));
}

#[tokio::test]
async fn a_short_retention_never_expires_a_record_before_its_lease() {
    let store = MemoryStore::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .retention(Duration::from_secs(1))
        .build();
    let attempt = Attempt::new("s", "k", fingerprint(1)).deadline_ms(clock.now_ms() + 120_000);
    engine
        .execute(&attempt, || {
            let store = store.clone();
            async move {
                store.fail_next(1);
                Ok::<_, Failed>(())
            }
        })
        .await
        .expect("ran");
    clock.advance(Duration::from_secs(100));
    let retry = engine
        .execute(&attempt, || async { Ok::<_, Failed>(()) })
        .await;
    assert!(
        matches!(retry, Err(Error::InProgress { retry_after }) if retry_after == Duration::from_secs(20)),
        "{retry:?}"
    );
}

#[tokio::test]
async fn fail_open_runs_unprotected_but_never_for_transactions() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).fail_open(true).build();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    store.fail_next(1);
    let outcome = engine
        .execute(&attempt, || async { Ok::<_, Failed>(1u8) })
        .await
        .expect("fail-open");
    assert_eq!(outcome.kind(), OutcomeKind::Unprotected);

    store.fail_next(1);
    let runs = AtomicUsize::new(0);
    let result = engine
        .execute_transactional(&attempt, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>((1u8, vec![MemoryWrite::put("x", "1")]))
        })
        .await;
    assert_eq!(
        result.map_err(|e| e.kind()),
        Err(ErrorKind::StoreUnavailable)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn cache_serves_replays_without_store_calls_and_never_in_progress() {
    let store = CountingStore::new(MemoryStore::new());
    let engine = Engine::builder(store.clone()).cache(8).build();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    engine
        .execute(&attempt, || async { Ok::<_, Failed>(1u8) })
        .await
        .expect("first");
    let calls = store.calls();
    assert_eq!((calls.claim, calls.complete, calls.total()), (1, 1, 2));
    let replay = engine
        .execute(&attempt, || async { Ok::<_, Failed>(2u8) })
        .await
        .expect("replay");
    assert_eq!(
        (replay.kind(), *replay.value()),
        (OutcomeKind::CachedReplay, 1)
    );
    assert_eq!(store.calls(), calls);

    // An in-progress record seen by a duplicate is not cached: once it
    // completes, the next call sees the completion.
    let other = Attempt::new("s", "other", fingerprint(1));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let other = Attempt::new("s", "other", fingerprint(1));
            engine
                .execute(&other, || async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, Failed>(3u8)
                })
                .await
        })
    };
    started_rx.await.expect("started");
    let busy = engine
        .execute(&other, || async { Ok::<_, Failed>(4u8) })
        .await;
    assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
    finish_tx.send(()).expect("finish");
    running.await.expect("task").expect("completed");
    let replay = engine
        .execute(&other, || async { Ok::<_, Failed>(4u8) })
        .await
        .expect("replay");
    assert_eq!(*replay.value(), 3);
}

#[tokio::test]
async fn replay_of_an_undecodable_response_is_a_corrupt_record() {
    let (engine, store, _) = setup();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    engine
        .execute(&attempt, || async { Ok::<_, Failed>(String::from("text")) })
        .await
        .expect("first");
    let result = engine
        .execute(&attempt, || async { Ok::<_, Failed>(1u32) })
        .await;
    assert_eq!(result.map_err(|e| e.kind()), Err(ErrorKind::CorruptRecord));
    let record = store
        .record(&engine.record_id("s", "k"))
        .expect("still stored");
    assert_eq!(record.status, Status::Completed, "and left as it was");
}

#[tokio::test]
async fn transactional_writes_commit_with_the_completion_or_not_at_all() {
    let (engine, store, clock) = setup();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    engine
        .execute_transactional(&attempt, || async {
            Ok::<_, Failed>((
                String::from("ch_1"),
                vec![MemoryWrite::put_if_absent("charge#1", "100")],
            ))
        })
        .await
        .expect("committed");
    assert_eq!(store.item("charge#1").as_deref(), Some(&b"100"[..]));

    // A write whose condition fails: nothing is written, the claim is released.
    let other = Attempt::new("s", "k2", fingerprint(1));
    let result = engine
        .execute_transactional(&other, || async {
            Ok::<_, Failed>((
                String::from("ch_2"),
                vec![
                    MemoryWrite::put("charge#2", "1"),
                    MemoryWrite::put_if_absent("charge#1", "200"),
                ],
            ))
        })
        .await;
    match result {
        Err(Error::Store(error)) => assert_eq!(error.kind(), StoreErrorKind::WriteRejected),
        other => panic!("expected a rejected write, got {other:?}"),
    }
    assert_eq!(store.item("charge#2"), None, "all or nothing");
    assert_eq!(store.item("charge#1").as_deref(), Some(&b"100"[..]));
    assert_eq!(store.record(&engine.record_id("s", "k2")), None, "released");
    assert!(clock.now_ms() > 0);
}
