//! The engine's branches on the memory store: failures at each step,
//! leases, the cache, fail-open, transactional writes.

use super::{run::START_MARGIN_MS, state::MIN_LEASE_MS, *};
use crate::{
    store::{memory::MemoryWrite, Conditional, RecordId, Status, Store},
    testing::{CountingStore, ManualClock},
    Clock, Error, ErrorKind, Fingerprint, MemoryStore, StoreError, StoreErrorKind,
};
use futures_util::FutureExt;
use serde::Serialize;
use std::{
    future::Future,
    panic::AssertUnwindSafe,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

fn fingerprint(n: u8) -> Fingerprint {
    Fingerprint::of_bytes(&[n])
}

fn setup() -> (Engine<MemoryStore>, MemoryStore, ManualClock) {
    let store = MemoryStore::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(store.clone()).clock(clock.clone()).build();
    (engine, store, clock)
}

/// As [`setup`], with records kept for `retention`.
fn setup_retaining(retention: Duration) -> (Engine<MemoryStore>, MemoryStore, ManualClock) {
    let store = MemoryStore::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .retention(retention)
        .build();
    (engine, store, clock)
}

#[derive(Debug, PartialEq)]
struct Failed;

/// A value that cannot be stored (JSON has no map keyed by tuples): a
/// plain run still returns it, not recorded, its claim kept (its effects
/// happened); a transactional one is an error, its claim released (its
/// writes were never committed).
#[tokio::test]
async fn an_unserialisable_value_is_not_recorded_or_releases_a_transactional_claim() {
    let (engine, store, _) = setup();
    let value = || std::collections::HashMap::from([((1u8, 2u8), 3u8)]);
    let plain = engine
        .run(
            &Attempt::new("s", "plain", fingerprint(1)),
            Mode::Plain,
            &Json,
            |_| async { Ok::<_, Failed>((value(), Vec::new())) },
        )
        .await
        .expect("the value, not recorded");
    assert_eq!(plain.kind(), OutcomeKind::NotRecorded);
    let kept = store.record(&engine.record_id("s", "plain")).expect("kept");
    assert_eq!(kept.status, crate::store::Status::InProgress);

    let transactional = engine
        .run(
            &Attempt::new("s", "writes", fingerprint(1)),
            Mode::Transactional,
            &Json,
            |_| async { Ok::<_, Failed>((value(), Vec::new())) },
        )
        .await;
    match transactional {
        Err(Error::Store(error)) => assert_eq!(error.kind(), StoreErrorKind::Other, "{error}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        store.record(&engine.record_id("s", "writes")),
        None,
        "released"
    );
}

/// A transactional completion that fails (not a refusal) gives its claim
/// back once, with writes or without: the store is not asked twice.
#[tokio::test]
async fn a_failed_transactional_completion_releases_its_claim_once() {
    for writes in [Vec::new(), vec![MemoryWrite::put("charge", "ch_1")]] {
        let memory = MemoryStore::new();
        let store = CountingStore::new(memory.clone());
        let engine = Engine::builder(store.clone()).build();
        let failed = engine
            .run(
                &Attempt::new("s", "k", fingerprint(1)),
                Mode::Transactional,
                &Json,
                |_| async {
                    memory.fail_next(1); // the completion
                    Ok::<_, Failed>((1u8, writes))
                },
            )
            .await;
        assert!(matches!(failed, Err(Error::Store(_))), "{failed:?}");
        assert_eq!(store.calls().release, 1);
        assert_eq!(memory.record(&engine.record_id("s", "k")), None);
        assert_eq!(memory.item("charge"), None);
    }
}

/// Inside a transaction, a deferred write the store refuses at the
/// completion is answered as the adapter's refusal rule says: the answer
/// stored without any of the writes, and committed.
#[tokio::test]
async fn a_refused_write_in_a_transaction_is_answered_and_stored_without_the_writes() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    // The charge's id is taken already.
    engine
        .run(
            &Attempt::new("s", "seed", fingerprint(1)),
            Mode::Plain,
            &Json,
            |_| async { Ok::<_, Failed>((0u8, vec![MemoryWrite::put("charge/1", "earlier")])) },
        )
        .await
        .expect("seeded");
    let answered = engine
        .transaction_run(
            &Attempt::new("s", "k", fingerprint(1)),
            crate::store::TransactionLimits::new(),
            &Json,
            |refusal: &crate::WriteRefusal| {
                assert_eq!(refusal.code, "ConditionalCheckFailed");
                Some(Ok(2u8))
            },
            |_| async {
                Ok::<_, Failed>((
                    1u8,
                    vec![
                        MemoryWrite::put("ledger/1", "booked"),
                        MemoryWrite::put_if_absent("charge/1", "new"),
                    ],
                ))
            },
        )
        .await
        .expect("answered");
    assert_eq!(*answered.value(), 2);
    assert_eq!(answered.kind(), OutcomeKind::Fresh);
    assert_eq!(store.item("ledger/1"), None, "none of the writes");
    assert_eq!(store.item("charge/1").as_deref(), Some(&b"earlier"[..]));
    let replay = engine
        .run(
            &Attempt::new("s", "k", fingerprint(1)),
            Mode::Plain,
            &Json,
            |_| async { Ok::<_, Failed>((9u8, Vec::new())) },
        )
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(*replay.value(), 2);
}

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
    let (engine, store, clock) = setup_retaining(Duration::from_secs(1));
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
    // The claim, and the read that confirms the outage.
    store.fail_next(2);
    let outcome = engine
        .execute(&attempt, || async { Ok::<_, Failed>(1u8) })
        .await
        .expect("fail-open");
    assert_eq!(outcome.kind(), OutcomeKind::Unprotected);

    // The claim, and the read that confirms the outage.
    store.fail_next(2);
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

/// Issue 37: an attempt marked fail-closed never runs without a claim on
/// a fail-open engine, in place or detached.
#[tokio::test]
async fn a_fail_closed_attempt_never_runs_unprotected_on_a_fail_open_engine() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).fail_open(true).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let operation = |runs: Arc<AtomicUsize>| {
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(1u8)
        }
    };
    let attempt = Attempt::new("s", "k", fingerprint(1)).fail_closed();
    // The claim, and the read that confirms the outage.
    store.fail_next(2);
    let result = engine.execute(&attempt, operation(Arc::clone(&runs))).await;
    assert_eq!(
        result.map_err(|e| e.kind()),
        Err(ErrorKind::StoreUnavailable)
    );
    store.fail_next(2);
    let result = engine
        .execute_detached(&attempt, operation(Arc::clone(&runs)))
        .await;
    assert_eq!(
        result.map_err(|e| e.kind()),
        Err(ErrorKind::StoreUnavailable)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran unrecorded");
    assert!(store.records().is_empty());
}

/// A cached value that no longer decodes (the value's type changed across
/// a deployment) is dropped from the cache and left to the store path,
/// which reports it: the cache does not keep answering with it.
#[tokio::test]
async fn a_cached_value_that_no_longer_decodes_is_evicted() {
    let engine = Engine::builder(MemoryStore::new()).cache(8).build();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    engine
        .execute(&attempt, || async { Ok::<_, Failed>("text".to_owned()) })
        .await
        .expect("first");
    let id = engine.record_id("s", "k");
    let now_ms = engine.now_ms();
    assert!(engine.cached(&id, now_ms).is_some());
    let as_number = engine.cached_replay::<u8, Failed>(&id, &attempt, &Json, now_ms);
    assert!(as_number.is_none(), "left to the store path");
    assert!(engine.cached(&id, now_ms).is_none(), "evicted");
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

/// Issue 21: fail-open runs an operation without a claim only through an
/// outage; a store that is misconfigured, refuses a value, or answers
/// something unclassified fails closed, fail-open or not.
#[tokio::test]
async fn fail_open_runs_only_through_an_outage() {
    for (kind, runs_unprotected) in [
        (StoreErrorKind::Unavailable, true),
        (StoreErrorKind::Throttled, true),
        (StoreErrorKind::Misconfigured, false),
        (StoreErrorKind::Rejected, false),
        (StoreErrorKind::CorruptRecord, false),
        (StoreErrorKind::Other, false),
    ] {
        let store = MemoryStore::new();
        let engine = Engine::builder(store.clone()).fail_open(true).build();
        let runs = AtomicUsize::new(0);
        // The claim, and (for an outage) the read that confirms it.
        store.fail_next_with(2, kind);
        let result = engine
            .execute(&Attempt::new("s", "k", fingerprint(1)), || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Failed>(1u8)
            })
            .await;
        assert_eq!(
            runs.load(Ordering::SeqCst) == 1,
            runs_unprotected,
            "{kind:?}: {result:?}"
        );
        match result {
            Ok(outcome) => assert_eq!(outcome.kind(), OutcomeKind::Unprotected, "{kind:?}"),
            Err(Error::Store(error)) => {
                assert_eq!(error.kind(), kind);
                assert_eq!(
                    Error::<Failed>::Store(error).kind(),
                    if kind == StoreErrorKind::CorruptRecord {
                        ErrorKind::CorruptRecord
                    } else {
                        ErrorKind::StoreFailed
                    },
                    "{kind:?} is no outage: no Retry-After"
                );
            }
            Err(other) => panic!("{kind:?}: {other:?}"),
        }
    }
}

/// Issue 21, item 1: a claim that loses a race (a serialization failure)
/// is claimed again, and ends as whatever the winner left: never a store
/// error, never a run without a claim.
#[tokio::test]
async fn a_conflicted_claim_is_claimed_again_never_run_unprotected() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).fail_open(true).build();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let first = engine
        .execute(&attempt, || async { Ok::<_, Failed>(1u8) })
        .await
        .expect("first run");
    assert_eq!(first.kind(), OutcomeKind::Fresh);

    let runs = AtomicUsize::new(0);
    store.fail_next_with(2, StoreErrorKind::Conflict);
    let retried = engine
        .execute(&attempt, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(2u8)
        })
        .await
        .expect("settled by the winner's record");
    assert_eq!(retried.kind(), OutcomeKind::Replay);
    assert_eq!(*retried.value(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // A race that never settles answers in progress, never a 5xx.
    store.fail_next_with(usize::MAX, StoreErrorKind::Conflict);
    let contended = engine
        .execute(&Attempt::new("s", "other", fingerprint(1)), || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(3u8)
        })
        .await;
    store.fail_next(0);
    assert!(
        matches!(
            contended,
            Err(Error::InProgress { .. }) | Err(Error::Store(_))
        ),
        "{contended:?}"
    );
    if let Err(Error::Store(error)) = &contended {
        // The settling read failed too (the memory store injects on every
        // call): a conflict still never runs the operation.
        assert_eq!(error.kind(), StoreErrorKind::Conflict);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "never ran unprotected");
}

/// Issue 37 (outside review): an attempt marked keep-claim-on-panic keeps
/// its claim when its operation panics (it may have acted): the retry is
/// told the key is in progress.
#[tokio::test]
async fn a_panicking_operation_marked_so_keeps_its_claim() {
    let (engine, store, _) = setup();
    let panicked = tokio::spawn({
        let engine = engine.clone();
        async move {
            let attempt = Attempt::new("s", "k", fingerprint(1)).keep_claim_on_panic();
            engine
                .execute(&attempt, || async {
                    panic!("after the effect");
                    #[allow(unreachable_code)]
                    Ok::<u8, Failed>(0)
                })
                .await
        }
    })
    .await;
    assert!(panicked.expect_err("the panic goes on").is_panic());
    let records = store.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, crate::store::Status::InProgress);
    let retry = engine
        .execute(&Attempt::new("s", "k", fingerprint(1)), || async {
            Ok::<_, Failed>(7u8)
        })
        .await;
    assert!(matches!(retry, Err(Error::InProgress { .. })), "{retry:?}");
}

/// Issue 21, item 9: an operation that panics leaves no claim behind: the
/// panic goes on to the caller, and the next attempt runs at once.
#[tokio::test]
async fn a_panicking_operation_releases_its_claim() {
    let (engine, store, _) = setup();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let panicked = tokio::spawn({
        let engine = engine.clone();
        async move {
            engine
                .execute(&Attempt::new("s", "k", fingerprint(1)), || async {
                    panic!("the handler's bug");
                    #[allow(unreachable_code)]
                    Ok::<u8, Failed>(0)
                })
                .await
        }
    })
    .await;
    let panic = panicked.expect_err("the panic reaches the caller");
    assert!(panic.is_panic());
    assert_eq!(
        super::panic_message(&*panic.into_panic()),
        "the handler's bug"
    );
    assert!(
        store.records().is_empty(),
        "the claim is released: {:?}",
        store.records()
    );
    let retry = engine
        .execute(&attempt, || async { Ok::<_, Failed>(7u8) })
        .await
        .expect("the retry runs at once, not after the lease");
    assert_eq!(retry.kind(), OutcomeKind::Fresh);

    // A closure that panics before it returns its future is caught too.
    let early = tokio::spawn({
        let engine = engine.clone();
        async move {
            engine
                .execute::<u8, Failed, _, std::future::Ready<Result<u8, Failed>>>(
                    &Attempt::new("s", "early", fingerprint(1)),
                    || panic!("before the future"),
                )
                .await
        }
    })
    .await;
    assert!(early.expect_err("panicked").is_panic());
    assert!(store.record(&engine.record_id("s", "early")).is_none());
}

/// Issue 21, item 2: durations the stores cannot hold are refused once, at
/// build time, with a message that names them.
#[test]
fn durations_beyond_the_stores_are_refused_at_build_time() {
    for (builder, named) in [
        (
            Engine::builder(MemoryStore::new()).retention(Duration::MAX),
            "retention",
        ),
        (
            Engine::builder(MemoryStore::new()).retention(Duration::ZERO),
            "retention",
        ),
        (
            Engine::builder(MemoryStore::new()).max_lease(Duration::MAX),
            "max_lease",
        ),
        (
            Engine::builder(MemoryStore::new())
                .default_lease(crate::MAX_DURATION + Duration::from_secs(1)),
            "default_lease",
        ),
    ] {
        let error = builder.try_build().expect_err(named);
        assert!(error.to_string().contains(named), "{error}");
    }
    assert!(Engine::builder(MemoryStore::new())
        .retention(crate::MAX_DURATION)
        .max_lease(crate::MAX_DURATION)
        .try_build()
        .is_ok());
    let panic = std::panic::catch_unwind(|| {
        Engine::builder(MemoryStore::new())
            .retention(Duration::MAX)
            .build()
    })
    .expect_err("build panics with the same message");
    assert!(super::panic_message(&*panic).contains("retention"));
}

/// Review of issue 21: a claim that fails as an outage while the store
/// still answers reads (a statement timed out on a duplicate's lock, a
/// read-only writer) is decided by the record the read finds, and never
/// runs the operation without a claim, even failing open.
#[tokio::test]
async fn an_outage_that_reads_contradict_never_runs_unprotected() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).fail_open(true).build();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let runs = AtomicUsize::new(0);

    // Nothing there: fail closed (a 503), not unprotected.
    store.fail_next(1);
    let refused = engine
        .execute(&attempt, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(1u8)
        })
        .await;
    assert_eq!(
        refused.map_err(|e| e.kind()).map(|o| o.kind()),
        Err(ErrorKind::StoreUnavailable)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0, "never ran unprotected");

    // A completed record: replayed. One held by a duplicate: in progress.
    engine
        .execute(&attempt, || async { Ok::<_, Failed>(7u8) })
        .await
        .expect("first run");
    store.fail_next(1);
    let replay = engine
        .execute(&attempt, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(8u8)
        })
        .await
        .expect("replayed");
    assert_eq!((replay.kind(), *replay.value()), (OutcomeKind::Replay, 7));
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// A value whose `Serialize` panics was made by an operation that ran and
/// acted: it is returned as not recorded, and its claim is held until the
/// record would have expired, so that no retry runs it again (it was
/// released as a panicking operation's, and a retry ran the operation
/// again at once: the outside review of issue 57, with a redaction's
/// function that panics).
#[tokio::test]
async fn a_value_that_panics_while_encoded_is_not_recorded_and_holds_its_claim() {
    #[derive(Debug)]
    struct Explosive;
    impl Serialize for Explosive {
        fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
            panic!("Serialize panicked")
        }
    }
    impl<'de> serde::Deserialize<'de> for Explosive {
        fn deserialize<D: serde::Deserializer<'de>>(_: D) -> Result<Self, D::Error> {
            Ok(Explosive)
        }
    }
    let (engine, store, clock) = setup();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let outcome = engine
        .execute(&attempt, || async { Ok::<_, Failed>(Explosive) })
        .await
        .expect("the value, not the panic");
    assert_eq!(outcome.kind(), OutcomeKind::NotRecorded);
    let [held] = &store.records()[..] else {
        panic!("{:?}", store.records());
    };
    assert_eq!(held.status, Status::InProgress);
    assert_eq!(held.lease_until_ms, Some(held.expiration_s * 1000));
    // Long after its lease would have passed, a retry is told it is in
    // progress, and runs nothing.
    clock.advance(Duration::from_secs(3600));
    let retry = engine
        .execute(&attempt, || async { Ok::<_, Failed>(Explosive) })
        .await;
    assert!(matches!(retry, Err(Error::InProgress { .. })), "{retry:?}");
    // A hold that landed says nothing; only one that did not is a WARN.
    let other = Attempt::new("s", "k2", fingerprint(1));
    let (held, logs) =
        logged(engine.execute(&other, || async { Ok::<_, Failed>(Explosive) })).await;
    assert_eq!(held.expect("the value").kind(), OutcomeKind::NotRecorded);
    assert!(
        !logs.contains("was not held until its expiry"),
        "a hold that landed is not a warning: {logs}"
    );
}

/// Issue 21, item 1: at SERIALIZABLE a completion can lose a race with a
/// duplicate's claim (40001); it is fenced, so it is tried again, and the
/// outcome is stored (it was `NotRecorded`, and the key ran again after
/// the lease).
#[tokio::test]
async fn a_conflicted_completion_is_tried_again() {
    let (engine, store, _) = setup();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let outcome = engine
        .execute(&attempt, || async {
            store.fail_next_with(2, StoreErrorKind::Conflict); // the completion, twice
            Ok::<_, Failed>(3u8)
        })
        .await
        .expect("ran");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    let replay = engine
        .execute(&attempt, || async { Ok::<_, Failed>(4u8) })
        .await
        .expect("replayed");
    assert_eq!((replay.kind(), *replay.value()), (OutcomeKind::Replay, 3));
}

/// A caller that gives up (a client that disconnects, a timeout) drops the
/// future: `execute` stops with its claim in progress, `execute_detached`
/// runs on and completes, so the retry replays instead of waiting out the
/// lease and running again.
#[tokio::test]
async fn a_dropped_detached_execution_completes_and_its_retry_replays() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let slow = |runs: &Arc<AtomicUsize>| {
        let runs = Arc::clone(runs);
        move || async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(7u32)
        }
    };
    let attempt = Attempt::new("s", "detached", fingerprint(1));
    let given_up = tokio::time::timeout(
        Duration::from_millis(50),
        engine.execute_detached(&attempt, slow(&runs)),
    )
    .await;
    assert!(given_up.is_err(), "the caller gave up first");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the operation ran to its end"
    );
    let retry = engine
        .execute(&attempt, || async { Err::<u32, _>(Failed) })
        .await
        .expect("replayed");
    assert_eq!((retry.kind(), *retry.value()), (OutcomeKind::Replay, 7));

    // The same with `execute`: cut short, its claim left in progress.
    let attempt = Attempt::new("s", "in-place", fingerprint(1));
    let given_up = tokio::time::timeout(
        Duration::from_millis(50),
        engine.execute(&attempt, slow(&runs)),
    )
    .await;
    assert!(given_up.is_err());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "cut short");
    let retry = engine
        .execute(&attempt, || async { Err::<u32, _>(Failed) })
        .await;
    assert!(matches!(retry, Err(Error::InProgress { .. })));
}

/// In place (before the work first waits) and on the work's own task
/// (after), alike.
#[tokio::test]
async fn a_detached_panic_releases_the_claim_and_reaches_the_caller() {
    let engine = Engine::builder(MemoryStore::new()).build();
    for (key, waits) in [("panics", false), ("panics-on-its-task", true)] {
        let attempt = Attempt::new("s", key, fingerprint(1));
        let caught = AssertUnwindSafe(engine.execute_detached(&attempt, move || async move {
            if waits {
                tokio::task::yield_now().await;
            }
            if true {
                panic!("the provider's client panicked");
            }
            Ok::<u32, Failed>(1)
        }))
        .catch_unwind()
        .await;
        assert!(caught.is_err(), "{key}: the panic is raised in the caller");
        let retry = engine
            .execute(&attempt, || async { Ok::<_, Failed>(2u32) })
            .await
            .expect("runs again");
        assert_eq!(
            (retry.kind(), *retry.value()),
            (OutcomeKind::Fresh, 2),
            "{key}"
        );
    }
}

/// Detached work that needs no waiting is done in place, on the caller's
/// task (a replay, a request on the memory store: no task to spawn); work
/// that waits goes on on a task of its own.
#[tokio::test]
async fn detached_work_moves_to_a_task_of_its_own_only_when_it_waits() {
    // As a server runs a request: on a task (a test's body is not one).
    tokio::spawn(work_moves_only_when_it_waits())
        .await
        .expect("the test's task");
}

async fn work_moves_only_when_it_waits() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let caller = tokio::task::id();
    let ran_on = |waits: bool| async move {
        if waits {
            tokio::task::yield_now().await;
        }
        Ok::<_, Failed>(format!("{}", tokio::task::id()))
    };
    let attempt = Attempt::new("s", "in-place", fingerprint(1));
    let task = engine
        .execute_detached(&attempt, move || ran_on(false))
        .await
        .expect("ran");
    assert_eq!(
        task.value(),
        &caller.to_string(),
        "ran on the caller's task"
    );
    let replay = engine
        .execute_detached(&attempt, move || ran_on(false))
        .await
        .expect("replayed");
    assert_eq!(replay.kind(), OutcomeKind::Replay);

    let attempt = Attempt::new("s", "waits", fingerprint(1));
    let task = engine
        .execute_detached(&attempt, move || ran_on(true))
        .await
        .expect("ran");
    assert_ne!(
        task.value(),
        &caller.to_string(),
        "went on on a task of its own"
    );
}

/// Woken once, from another thread, through the first waker it was polled
/// with only: against the `Future` contract, but common in hand-written
/// bridges (a callback, a thread). Detached work polled first in place and
/// then on its own task must still be woken.
struct FirstWakerOnly(Arc<std::sync::Mutex<(bool, Option<std::task::Waker>)>>);

impl Future for FirstWakerOnly {
    type Output = ();

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let mut state = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if state.0 {
            return std::task::Poll::Ready(());
        }
        if state.1.is_none() {
            state.1 = Some(cx.waker().clone());
            let shared = Arc::clone(&self.0);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let mut state = shared
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                state.0 = true;
                if let Some(waker) = state.1.take() {
                    waker.wake();
                }
            });
        }
        std::task::Poll::Pending
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detached_work_that_keeps_its_first_waker_is_still_woken_on_its_task() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let attempt = Attempt::new("s", "first-waker", fingerprint(1));
    let done = tokio::time::timeout(
        Duration::from_secs(5),
        engine.execute_detached(&attempt, || async {
            FirstWakerOnly(Arc::default()).await;
            Ok::<_, Failed>(1u32)
        }),
    )
    .await
    .expect("woken, not hung")
    .expect("ran");
    assert_eq!(done.kind(), OutcomeKind::Fresh);
}

/// A store whose answers the simulator showed going wrong: a write that
/// lands and whose answer is lost for good (the SDK gives up with a
/// timeout), and a claim answered late (the clock moves while it is out).
#[derive(Clone)]
struct Unlucky {
    store: MemoryStore,
    clock: ManualClock,
    /// The next so many takeovers land and then time out.
    takeovers_time_out: Arc<AtomicUsize>,
    /// The next so many extensions land and then time out.
    extensions_time_out: Arc<AtomicUsize>,
    /// The next claim (or takeover) is answered this much later.
    claim_answered_after: Arc<std::sync::Mutex<Option<Duration>>>,
}

impl Unlucky {
    fn new(store: MemoryStore, clock: ManualClock) -> Self {
        Self {
            store,
            clock,
            takeovers_time_out: Arc::default(),
            extensions_time_out: Arc::default(),
            claim_answered_after: Arc::default(),
        }
    }

    fn timed_out(counter: &AtomicUsize) -> bool {
        counter
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    /// The answer arrives late: both the engine's clock and tokio's (paused
    /// in the tests that use it) move on meanwhile.
    async fn late(&self) {
        let late = self
            .claim_answered_after
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(by) = late {
            self.clock.advance(by);
            tokio::time::sleep(by).await;
        }
    }
}

fn timeout() -> StoreError {
    StoreError::new(StoreErrorKind::Unavailable, "timed out (the write landed)")
}

impl Store for Unlucky {
    type Write = MemoryWrite;

    async fn claim(&self, claim: &crate::store::Claim) -> Result<Conditional, StoreError> {
        let answer = self.store.claim(claim).await;
        self.late().await;
        answer
    }

    async fn take_over(
        &self,
        claim: &crate::store::Claim,
        lapsed: &crate::store::OwnerToken,
    ) -> Result<Conditional, StoreError> {
        let answer = self.store.take_over(claim, lapsed).await?;
        self.late().await;
        if Self::timed_out(&self.takeovers_time_out) {
            return Err(timeout());
        }
        Ok(answer)
    }

    async fn extend(&self, extension: &crate::store::Extension) -> Result<Conditional, StoreError> {
        let answer = self.store.extend(extension).await?;
        if Self::timed_out(&self.extensions_time_out) {
            return Err(timeout());
        }
        Ok(answer)
    }

    async fn complete(
        &self,
        completion: crate::store::Completion<MemoryWrite>,
    ) -> Result<Conditional, StoreError> {
        self.store.complete(completion).await
    }

    async fn release(
        &self,
        id: &RecordId,
        owner: &crate::store::OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.store.release(id, owner).await
    }

    async fn remove(
        &self,
        id: &RecordId,
        removal: crate::store::Removal,
    ) -> Result<Conditional, StoreError> {
        self.store.remove(id, removal).await
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<crate::store::Record>, StoreError> {
        self.store.list_in_progress(prefix, limit).await
    }

    async fn get(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> Result<Option<crate::store::Record>, StoreError> {
        self.store.get(id, now_ms).await
    }
}

fn unlucky() -> (Engine<Unlucky>, Unlucky, ManualClock) {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = Unlucky::new(MemoryStore::new(), clock.clone());
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .default_lease(Duration::from_secs(10))
        .build();
    (engine, store, clock)
}

/// Leaves attempt 1's claim on `key` behind (its completion fails), and
/// moves the clock past its lease.
async fn abandon(engine: &Engine<Unlucky>, store: &Unlucky, clock: &ManualClock, key: &str) {
    let first = engine
        .execute(&Attempt::new("s", key, fingerprint(1)), || async {
            store.store.fail_next(1); // the completion
            Ok::<_, Failed>(0u8)
        })
        .await
        .expect("ran");
    assert_eq!(first.kind(), OutcomeKind::NotRecorded);
    clock.advance(Duration::from_secs(11));
}

/// What the operation was told: its takeover, if any.
async fn told(
    engine: &Engine<Unlucky>,
    key: &str,
    fails: bool,
) -> Result<Outcome<Option<u32>>, Error<Failed>> {
    engine
        .run(
            &Attempt::new("s", key, fingerprint(1)),
            Mode::Plain,
            &Json,
            |handle| async move {
                if fails {
                    return Err(Failed);
                }
                Ok((handle.takeover().map(|t| t.attempt), Vec::new()))
            },
        )
        .await
}

/// Simulator, engine bug 1 (seed 100): a takeover that landed and whose
/// answer was lost for good is recognised by the read after it as this
/// attempt's own record, and as the takeover it is: the operation is told.
#[tokio::test]
async fn a_takeover_whose_answer_was_lost_is_told_it_took_over() {
    let (engine, store, clock) = unlucky();
    abandon(&engine, &store, &clock, "k").await;
    store.takeovers_time_out.store(1, Ordering::SeqCst);
    let outcome = told(&engine, "k", false).await.expect("ran");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    assert_eq!(*outcome.value(), Some(2), "told it took over attempt 1");
    let record = store
        .store
        .record(&engine.record_id("s", "k"))
        .expect("record");
    assert_eq!(record.attempt, 2);
}

/// The log lines written while `body` runs on this thread.
async fn logged<F: Future>(body: F) -> (F::Output, String) {
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log").extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let output = {
        let _guard = tracing::subscriber::set_default(subscriber);
        body.await
    };
    let logs = String::from_utf8_lossy(&captured.0.lock().expect("log")).into_owned();
    (output, logs)
}

/// A takeover is said in the log (`outcome="takeover"`, a warning: the
/// attempt it took over may have acted), and a first claim is not.
#[tokio::test(flavor = "current_thread")]
async fn a_takeover_is_logged_and_a_first_claim_is_not() {
    let (engine, store, clock) = unlucky();
    let (_, first) = logged(abandon(&engine, &store, &clock, "k")).await;
    assert!(!first.contains("takeover"), "a first claim: {first}");
    let (outcome, logs) = logged(told(&engine, "k", false)).await;
    assert_eq!(
        *outcome.expect("ran").value(),
        Some(2),
        "told it is attempt 2, a takeover"
    );
    let line = logs
        .lines()
        .find(|line| line.contains(r#"outcome="takeover""#))
        .unwrap_or_else(|| panic!("no takeover logged: {logs}"));
    assert!(
        line.contains("WARN") && line.contains("attempt=2"),
        "{line}"
    );
}

/// With `read_before_claim`, a completed record read more than
/// `READ_EXPIRY_MARGIN_S` (5 s) before its expiry answers without the
/// claim; one read at the margin is left to the claim.
#[tokio::test]
async fn a_completed_record_read_at_the_expiry_margin_is_left_to_the_claim() {
    let store = CountingStore::new(MemoryStore::new());
    let clock = ManualClock::new(1_700_000_000_500);
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .read_before_claim(true)
        .build();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let run = || async { Ok::<_, Failed>(1u8) };
    engine.execute(&attempt, run).await.expect("ran");
    let expiration_s = store
        .inner()
        .record(&engine.record_id("s", "k"))
        .expect("completed")
        .expiration_s;
    // Half a second into a second: the margin is counted from its start.
    for (seconds_before, claims) in [(5, 1), (6, 0)] {
        clock.set((expiration_s - seconds_before) * 1_000 + 500);
        let before = store.calls().claim;
        let replay = engine.execute(&attempt, run).await.expect("replayed");
        assert_eq!(replay.kind(), OutcomeKind::Replay);
        assert_eq!(
            store.calls().claim - before,
            claims,
            "read {seconds_before} s before its expiry"
        );
    }
}

/// A read before the claim refused for a missing permission is a warning:
/// every request pays its round trip for nothing. Another failed read is
/// not (the claim decides, as without the read).
#[tokio::test(flavor = "current_thread")]
async fn a_read_before_the_claim_refused_for_a_permission_is_a_warning() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone())
        .read_before_claim(true)
        .build();
    for (key, kind, warned) in [
        ("a", StoreErrorKind::Misconfigured, true),
        ("b", StoreErrorKind::Unavailable, false),
    ] {
        store.fail_next_with(1, kind); // the read
        let attempt = Attempt::new("s", key, fingerprint(1));
        let (ran, logs) = logged(engine.execute(&attempt, || async { Ok::<_, Failed>(1u8) })).await;
        assert_eq!(ran.expect("the claim decides").kind(), OutcomeKind::Fresh);
        let warning = logs
            .lines()
            .any(|line| line.contains("WARN") && line.contains("read_before_claim"));
        assert_eq!(warning, warned, "{kind:?}: {logs}");
    }
}

/// A claim's record outlives its lease, by a second at least, however
/// short the retention: a record that expired first would count as absent,
/// and be claimed again while its owner still runs.
#[tokio::test]
async fn a_claim_outlives_its_lease_when_the_retention_is_shorter() {
    let (engine, store, clock) = setup_retaining(Duration::from_secs(10));
    let attempt = Attempt::new("s", "k", fingerprint(1));
    engine
        .execute(&attempt, || async {
            store.fail_next(1); // the completion: the claim stays
            Ok::<_, Failed>(1u8)
        })
        .await
        .expect("ran");
    let record = store
        .record(&engine.record_id("s", "k"))
        .expect("claim left behind");
    let lease_until_ms = clock.now_ms() + 60_000; // DEFAULT_LEASE
    assert_eq!(record.lease_until_ms, Some(lease_until_ms));
    assert_eq!(record.expiration_s, lease_until_ms / 1000 + 1);
}

/// A release that finds the key taken over by another owner says so (a
/// `lease_lost` warning): the operation outlived its lease.
#[tokio::test(flavor = "current_thread")]
async fn a_release_that_finds_the_key_taken_over_says_so() {
    let (engine, store, _) = setup();
    let id = engine.record_id("s", "k");
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let (failed, logs) = logged(engine.execute(&attempt, || async {
        let mut record = store.record(&id).expect("claimed");
        record.owner = crate::store::OwnerToken::from_stored("another");
        store.insert_record(record);
        Err::<u8, _>(Failed)
    }))
    .await;
    assert!(
        matches!(failed, Err(Error::Operation(Failed))),
        "{failed:?}"
    );
    assert!(
        logs.lines().any(|line| line.contains("WARN")
            && line.contains(r#"outcome="lease_lost""#)
            && line.contains("taken over before it could be released")),
        "{logs}"
    );
}

/// Simulator, engine bug 3 (seed 12): a claim answered after its lease has
/// passed does not run its operation: the caller is told to retry
/// (`LeaseLost`), and the claim is given back, so the retry runs at once.
#[tokio::test(start_paused = true)]
async fn a_claim_answered_after_its_lease_does_not_run() {
    let (engine, store, _) = unlucky();
    let runs = AtomicUsize::new(0);
    let run = || async {
        runs.fetch_add(1, Ordering::SeqCst);
        Ok::<_, Failed>(1u8)
    };
    let attempt = Attempt::new("s", "late", fingerprint(1));
    *store.claim_answered_after.lock().expect("lock") = Some(Duration::from_secs(11));
    let late = engine.execute(&attempt, run).await;
    assert!(matches!(late, Err(Error::LeaseLost)), "{late:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a zombie from its first instant"
    );
    assert_eq!(
        store.store.record(&engine.record_id("s", "late")),
        None,
        "an attempt 1 that never ran gives its claim back"
    );

    // With too little of the lease left, too: under 100 ms (as
    // `Error::LeaseLost` documents).
    assert_eq!(START_MARGIN_MS, 100);
    *store.claim_answered_after.lock().expect("lock") =
        Some(Duration::from_millis(10_000 - START_MARGIN_MS + 1));
    let late = engine.execute(&attempt, run).await;
    assert!(matches!(late, Err(Error::LeaseLost)), "{late:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // Answered in time, it runs.
    *store.claim_answered_after.lock().expect("lock") =
        Some(Duration::from_millis(10_000 - START_MARGIN_MS));
    let retry = engine.execute(&attempt, run).await.expect("ran");
    assert_eq!(retry.kind(), OutcomeKind::Fresh);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Simulator (durable executions, seed 5): a durable execution's claim
/// answered after its lease passed is given back and answered `LeaseLost`,
/// as a run's is; the execution's next claim, under the same token, is its.
#[tokio::test(start_paused = true)]
async fn a_split_claim_answered_after_its_lease_is_given_back() {
    use crate::split::{self, SplitAttempt, SplitClaim};
    let (engine, store, _) = unlucky();
    let execution = SplitAttempt::new(
        "s",
        "late",
        fingerprint(1),
        crate::store::OwnerToken::from_stored("execution-1"),
        Duration::from_secs(10),
    );
    *store.claim_answered_after.lock().expect("lock") = Some(Duration::from_secs(11));
    let late = split::claim::<_, u8>(&engine, &execution, &Json).await;
    assert!(matches!(late, Err(Error::LeaseLost)), "{late:?}");
    assert_eq!(
        store.store.record(&engine.record_id("s", "late")),
        None,
        "given back"
    );
    let again = split::claim::<_, u8>(&engine, &execution, &Json).await;
    assert!(matches!(again, Ok(SplitClaim::Ours)), "{again:?}");
}

/// Simulator, engine bug 2 (seed 362): a takeover whose operation fails
/// gives its claim back without forgetting it: the attempt it took over
/// may still run, so the retry (at once) is the next takeover, and told.
#[tokio::test]
async fn a_failed_takeover_gives_its_claim_back_and_the_retry_is_told() {
    let (engine, store, _) = unlucky();
    let clock = store.clock.clone();
    abandon(&engine, &store, &clock, "k").await;
    let failed = told(&engine, "k", true).await;
    assert!(
        matches!(failed, Err(Error::Operation(Failed))),
        "{failed:?}"
    );
    let record = store
        .store
        .record(&engine.record_id("s", "k"))
        .expect("kept");
    assert_eq!(record.status, Status::InProgress);
    assert_eq!(record.attempt, 2);
    assert!(record.is_lapsed(clock.now_ms()), "given back: {record:?}");

    let retry = told(&engine, "k", false).await.expect("runs at once");
    assert_eq!(retry.kind(), OutcomeKind::Fresh);
    assert_eq!(
        *retry.value(),
        Some(3),
        "told that earlier attempts may have acted"
    );
}

/// Simulator (seed 100, `#13` after `#12`): an extension whose answer was
/// lost after it landed may hold the lease further out than the attempt
/// knows; a later, shorter extension never pulls it back.
#[tokio::test]
async fn an_extension_never_shortens_a_lease_it_could_not_confirm() {
    let (engine, store, clock) = unlucky();
    let id = engine.record_id("s", "long");
    let lease = |store: &Unlucky| {
        store
            .store
            .record(&id)
            .and_then(|record| record.lease_until_ms)
            .expect("in progress")
    };
    let start_ms = clock.now_ms();
    engine
        .run(
            &Attempt::new("s", "long", fingerprint(1)),
            Mode::Plain,
            &Json,
            |handle| async move {
                store.extensions_time_out.store(1, Ordering::SeqCst);
                let lost = handle.extend(Duration::from_secs(30)).await;
                assert!(matches!(lost, Err(Error::Store(_))), "{lost:?}");
                assert_eq!(lease(&store), start_ms + 30_000, "it landed");
                clock.advance(Duration::from_secs(1));
                handle
                    .extend(Duration::from_secs(5))
                    .await
                    .expect("extended");
                assert_eq!(lease(&store), start_ms + 30_000, "never pulled back");
                assert_eq!(handle.lease_until_ms(), Some(start_ms + 30_000));
                Ok::<_, Failed>(((), Vec::new()))
            },
        )
        .await
        .expect("ran");
}

/// A durable execution that took a key over and then failed gives its claim
/// back without forgetting it, as a claimed run's takeover does: the record
/// stays, lapsed, and the next execution runs at once, told that it is the
/// third attempt (a delete made it attempt 1, not told).
#[tokio::test]
async fn a_released_durable_takeover_is_not_forgotten() {
    use crate::{
        split::{self, SplitAttempt, SplitClaim},
        store::OwnerToken,
    };
    let store = MemoryStore::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(store.clone()).clock(clock.clone()).build();
    let attempt = |owner: &str| {
        SplitAttempt::new(
            "s",
            "k",
            fingerprint(1),
            OwnerToken::from_stored(owner),
            Duration::from_secs(10),
        )
    };
    let id = engine.record_id("s", "k");
    let claimed = split::claim::<_, u8>(&engine, &attempt("a"), &Json).await;
    assert_eq!(claimed.expect("claimed"), SplitClaim::Ours);
    clock.advance(Duration::from_secs(11));
    let taken = split::claim::<_, u8>(&engine, &attempt("b"), &Json).await;
    assert_eq!(taken.expect("taken over"), SplitClaim::Ours);
    assert_eq!(store.record(&id).expect("record").attempt, 2);

    split::release(&engine, &attempt("b"))
        .await
        .expect("released");
    let kept = store.record(&id).expect("the takeover's record stays");
    assert_eq!(kept.attempt, 2);
    assert!(
        kept.lease_until_ms.expect("lease") < clock.now_ms(),
        "lapsed"
    );

    let next = split::claim::<_, u8>(&engine, &attempt("c"), &Json).await;
    assert_eq!(next.expect("runs at once"), SplitClaim::Ours);
    assert_eq!(store.record(&id).expect("record").attempt, 3);

    // A first attempt's release still deletes its record.
    let first = |owner: &str| {
        SplitAttempt::new(
            "s",
            "first",
            fingerprint(1),
            OwnerToken::from_stored(owner),
            Duration::from_secs(10),
        )
    };
    let claimed = split::claim::<_, u8>(&engine, &first("d"), &Json).await;
    assert_eq!(claimed.expect("claimed"), SplitClaim::Ours);
    split::release(&engine, &first("d"))
        .await
        .expect("released");
    assert!(store.record(&engine.record_id("s", "first")).is_none());
}

/// With `read_before_claim`, a completed record answers from the read (a
/// replay, a 422) without a claim; a new key and a key in progress are
/// decided by the claim, as without the read; a read that fails is passed
/// over.
#[tokio::test]
async fn a_read_before_the_claim_answers_only_from_a_completed_record() {
    let store = CountingStore::new(MemoryStore::new());
    let engine = Engine::builder(store.clone())
        .read_before_claim(true)
        .build();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let first = engine
        .execute(&attempt, || async { Ok::<_, Failed>(1u8) })
        .await
        .expect("first");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    let calls = store.calls();
    assert_eq!((calls.peek, calls.claim, calls.complete), (1, 1, 1));

    let replay = engine
        .execute(&attempt, || async { Ok::<_, Failed>(2u8) })
        .await
        .expect("replay");
    assert_eq!((replay.kind(), *replay.value()), (OutcomeKind::Replay, 1));
    let after = store.calls();
    assert_eq!(
        (after.peek, after.claim),
        (2, 1),
        "answered by the read alone"
    );

    let reused = engine
        .execute(&Attempt::new("s", "k", fingerprint(2)), || async {
            Ok::<_, Failed>(3u8)
        })
        .await;
    assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
    assert_eq!(store.calls().claim, 1, "a 422 from the read too");

    // A claim in progress is not answered from the read: the claim decides.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let held = Attempt::new("s", "held", fingerprint(1));
    let running = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let held = Attempt::new("s", "held", fingerprint(1));
            engine
                .execute(&held, || async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, Failed>(4u8)
                })
                .await
        })
    };
    started_rx.await.expect("started");
    let claims = store.calls().claim;
    // A duplicate in another process (an engine of its own).
    let elsewhere = Engine::builder(store.clone())
        .read_before_claim(true)
        .build();
    let duplicate = elsewhere
        .execute(&held, || async { Ok::<_, Failed>(5u8) })
        .await;
    assert!(
        matches!(duplicate, Err(Error::InProgress { .. })),
        "{duplicate:?}"
    );
    assert_eq!(store.calls().claim, claims + 1, "the claim was made");
    // One in this process is answered by the run itself: neither read nor
    // claim.
    let calls = store.calls();
    let here = engine
        .execute(&held, || async { Ok::<_, Failed>(5u8) })
        .await;
    assert!(matches!(here, Err(Error::InProgress { .. })), "{here:?}");
    assert_eq!(store.calls(), calls, "no store call");
    let _ = finish_tx.send(());
    running.await.expect("joined").expect("ran");

    // A read that fails is passed over; the claim answers.
    store.inner().fail_next(1);
    let replay = engine
        .execute(&attempt, || async { Ok::<_, Failed>(6u8) })
        .await
        .expect("replay through the claim");
    assert_eq!((replay.kind(), *replay.value()), (OutcomeKind::Replay, 1));
}

/// With `read_before_claim`, a single write's retry of a completed request
/// is answered from the read without running the operation (without it,
/// the operation runs before the commit learns that it is a replay).
#[tokio::test]
async fn a_read_before_a_single_write_replays_without_running_the_operation() {
    let store = CountingStore::new(MemoryStore::new());
    let engine = Engine::builder(store.clone())
        .read_before_claim(true)
        .build();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let runs = Arc::new(AtomicUsize::new(0));
    let operation = || {
        let runs = Arc::clone(&runs);
        move |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>((1u8, Vec::<MemoryWrite>::new()))
        }
    };
    let first = engine
        .run_single_write(&attempt, &Json, operation())
        .await
        .expect("first");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    let replay = engine
        .run_single_write(&attempt, &Json, operation())
        .await
        .expect("replay");
    assert_eq!((replay.kind(), *replay.value()), (OutcomeKind::Replay, 1));
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the retry ran nothing");
    let calls = store.calls();
    assert_eq!((calls.peek, calls.commit), (2, 1));
}

/// `lost()` resolves once an extension finds the claim taken over, for a
/// waiter that began before the loss and for one after it; not before.
#[tokio::test]
async fn lost_resolves_for_waiters_before_and_after_the_loss() {
    let (engine, store, _clock) = setup();
    let id = engine.record_id("s", "lost");
    engine
        .run(
            &Attempt::new("s", "lost", fingerprint(1)),
            Mode::Plain,
            &Json,
            |handle| async move {
                let early = tokio::spawn({
                    let handle = handle.clone();
                    async move { handle.lost().await }
                });
                tokio::task::yield_now().await;
                assert!(!handle.is_lost());
                assert!(handle.lost().now_or_never().is_none(), "not lost yet");
                let mut record = store.record(&id).expect("claimed");
                record.owner = crate::store::OwnerToken::from_stored("another");
                store.insert_record(record);
                let extended = handle.extend(Duration::from_secs(5)).await;
                assert!(matches!(extended, Err(Error::LeaseLost)), "{extended:?}");
                assert!(handle.is_lost());
                tokio::time::timeout(Duration::from_secs(5), early)
                    .await
                    .expect("the early waiter woke")
                    .expect("joined");
                assert!(
                    handle.lost().now_or_never().is_some(),
                    "a later one at once"
                );
                Ok::<_, Failed>(((), Vec::new()))
            },
        )
        .await
        .expect("ran");
}

/// The clock steps two hours ahead for one request (a wall clock corrected
/// back, or one engine's clock ahead of another's sharing the store), at
/// the moment the memory store's table is full and rebuilt: the keys
/// completed a second before are live for an hour, and replay.
#[tokio::test]
async fn a_clock_ahead_at_the_memory_store_s_rebuild_runs_no_key_again() {
    let (engine, store, clock) = setup_retaining(Duration::from_secs(3600));
    let runs = Arc::new(AtomicUsize::new(0));
    let run = |runs: Arc<AtomicUsize>| {
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(1u32)
        }
    };
    // 1,792 records fill the table exactly: the next claim rebuilds it.
    for n in 0..1792 {
        let key = format!("k{n}");
        let attempt = Attempt::new("s", &key, fingerprint(1));
        engine
            .execute(&attempt, run(runs.clone()))
            .await
            .expect("runs");
    }
    clock.advance(Duration::from_secs(7200));
    let ahead = Attempt::new("s", "ahead", fingerprint(1));
    engine
        .execute(&ahead, run(runs.clone()))
        .await
        .expect("runs");
    clock.set(1_700_000_001_000);
    let again = engine
        .execute(&Attempt::new("s", "k0", fingerprint(1)), run(runs.clone()))
        .await
        .expect("replays");
    assert_eq!(again.kind(), OutcomeKind::Replay);
    assert_eq!(runs.load(Ordering::SeqCst), 1793, "k0 ran once");
    assert_eq!(store.records().len(), 1793, "no record dropped");
}

/// A run of key `k` (payload 1) on `engine`, answering `value` once the
/// returned sender is sent or dropped: its outcome's task, once it runs.
async fn a_run_held_open<St: Store>(
    engine: &Engine<St>,
    value: u8,
) -> (
    tokio::task::JoinHandle<Result<Outcome<u8>, Error<Failed>>>,
    tokio::sync::oneshot::Sender<()>,
) {
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let engine = engine.clone();
    let run = tokio::spawn(async move {
        engine
            .execute(&Attempt::new("s", "k", fingerprint(1)), || async move {
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                Ok::<_, Failed>(value)
            })
            .await
    });
    started_rx.await.expect("the run starts");
    (run, finish_tx)
}

/// A duplicate of key `k` (payload 1) on `engine`, waiting in process up
/// to `budget`, that would answer `value` if it ran: its task.
fn a_waiting_duplicate<St: Store>(
    engine: &Engine<St>,
    budget: Duration,
    value: u8,
) -> tokio::task::JoinHandle<Result<Outcome<u8>, Error<Failed>>> {
    let engine = engine.clone();
    tokio::spawn(async move {
        let attempt = Attempt::new("s", "k", fingerprint(1)).wait_in_process(budget);
        engine
            .execute(&attempt, || async move { Ok::<_, Failed>(value) })
            .await
    })
}

/// The first of twenty concurrent duplicates in one process, and the
/// twenty: each of them waits on the first's run in memory (no store call
/// of theirs while it runs) and replays its value as it completes.
async fn twenty_duplicates_in_one_process(
    finish: impl FnOnce() -> Result<u8, Failed> + Send + 'static,
) -> (
    CountingStore<MemoryStore>,
    Vec<Result<Outcome<u8>, Error<Failed>>>,
    usize,
) {
    let store = CountingStore::new(MemoryStore::new());
    let engine = Engine::builder(store.clone()).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let (engine, runs) = (engine.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            let attempt = Attempt::new("s", "k", fingerprint(1));
            engine
                .execute(&attempt, || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    finish()
                })
                .await
        })
    };
    started_rx.await.expect("the first runs");
    let before = store.calls();
    let duplicates: Vec<_> = (0..20)
        .map(|_| {
            let (engine, runs) = (engine.clone(), Arc::clone(&runs));
            tokio::spawn(async move {
                let attempt =
                    Attempt::new("s", "k", fingerprint(1)).wait_in_process(Duration::from_secs(30));
                engine
                    .execute(&attempt, || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Failed>(2u8)
                    })
                    .await
            })
        })
        .collect();
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(store.calls(), before, "no store call while the first runs");
    let _ = finish_tx.send(());
    let mut outcomes = vec![first.await.expect("joined")];
    for duplicate in duplicates {
        outcomes.push(duplicate.await.expect("joined"));
    }
    (store, outcomes, runs.load(Ordering::SeqCst))
}

#[tokio::test]
async fn duplicates_in_one_process_wait_on_the_run_and_replay_it_without_a_store_call() {
    let (store, outcomes, runs) = twenty_duplicates_in_one_process(|| Ok(1)).await;
    assert_eq!(runs, 1);
    assert_eq!(
        outcomes[0].as_ref().map(Outcome::kind).ok(),
        Some(OutcomeKind::Fresh)
    );
    for outcome in &outcomes[1..] {
        let outcome = outcome.as_ref().expect("answered");
        assert_eq!((outcome.kind(), *outcome.value()), (OutcomeKind::Replay, 1));
    }
    let calls = store.calls();
    assert_eq!(
        (calls.claim, calls.complete, calls.total()),
        (1, 1, 2),
        "one claim in the process, one completion: {calls:?}"
    );
}

#[tokio::test]
async fn when_the_run_releases_its_key_one_waiting_duplicate_runs_and_the_rest_replay_it() {
    let (_, outcomes, runs) = twenty_duplicates_in_one_process(|| Err(Failed)).await;
    assert!(matches!(outcomes[0], Err(Error::Operation(Failed))));
    assert_eq!(runs, 2, "the first, then one duplicate");
    let kinds: Vec<_> = outcomes[1..]
        .iter()
        .map(|o| {
            o.as_ref()
                .map(|o| (o.kind(), *o.value()))
                .map_err(|e| e.kind())
        })
        .collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == Ok((OutcomeKind::Fresh, 2)))
            .count(),
        1,
        "{kinds:?}"
    );
    assert!(
        kinds
            .iter()
            .all(|k| *k == Ok((OutcomeKind::Fresh, 2)) || *k == Ok((OutcomeKind::Replay, 2))),
        "{kinds:?}"
    );
}

/// Two duplicates wait on a run that then gives its key back; one claims
/// it and runs (slowly), and the other, refused by that claim in the store,
/// goes back to waiting on it in memory: it gets its replay, not a 409.
#[tokio::test]
async fn a_waiter_refused_by_another_waiter_s_claim_waits_on_that_run_in_turn() {
    let store = CountingStore::new(MemoryStore::new());
    let engine = Engine::builder(store.clone()).build();
    let (first, finish_first) = {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
        let engine = engine.clone();
        let run = tokio::spawn(async move {
            engine
                .execute(&Attempt::new("s", "k", fingerprint(1)), || async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Err::<u8, _>(Failed)
                })
                .await
        });
        started_rx.await.expect("the first runs");
        (run, finish_tx)
    };
    // Whichever duplicate runs waits for this before it answers.
    let (release, released) = tokio::sync::watch::channel(false);
    let runs = Arc::new(AtomicUsize::new(0));
    let duplicates: Vec<_> = [2u8, 3]
        .into_iter()
        .map(|value| {
            let (engine, runs, mut released) =
                (engine.clone(), Arc::clone(&runs), released.clone());
            tokio::spawn(async move {
                let attempt =
                    Attempt::new("s", "k", fingerprint(1)).wait_in_process(Duration::from_secs(30));
                engine
                    .execute(&attempt, || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let _ = released.wait_for(|go| *go).await;
                        Ok::<_, Failed>(value)
                    })
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _ = finish_first.send(());
    assert!(matches!(
        first.await.expect("joined"),
        Err(Error::Operation(Failed))
    ));
    // One duplicate holds the key now; the other was refused by it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let _ = release.send(true);
    let mut kinds = Vec::new();
    for duplicate in duplicates {
        let outcome = duplicate.await.expect("joined").expect("answered");
        kinds.push(outcome.kind());
    }
    kinds.sort_by_key(|kind| kind.as_str());
    assert_eq!(kinds, [OutcomeKind::Fresh, OutcomeKind::Replay]);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_duplicate_in_this_process_with_another_payload_or_no_wait_is_answered_at_once() {
    let store = CountingStore::new(MemoryStore::new());
    let engine = Engine::builder(store.clone()).build();
    let (first, finish_tx) = a_run_held_open(&engine, 1).await;
    let before = store.calls();
    let other = engine
        .execute(
            &Attempt::new("s", "k", fingerprint(2)).wait_in_process(Duration::from_secs(30)),
            || async { Ok::<_, Failed>(2u8) },
        )
        .await;
    assert!(matches!(other, Err(Error::KeyReused)), "{other:?}");
    let impatient = engine
        .execute(&Attempt::new("s", "k", fingerprint(1)), || async {
            Ok::<_, Failed>(2u8)
        })
        .await;
    match impatient {
        Err(Error::InProgress { retry_after }) => assert!(retry_after >= Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.calls(), before, "answered by the run, not the store");
    let _ = finish_tx.send(());
    first.await.expect("joined").expect("ran");
}

// Found by an outside review: a waiter must never spin on the store, must wait
// its whole budget while the run's lease is extended, and must never replay
// the value of a run whose completion was refused.

/// Extensions land, but their answer is lost (an SDK timeout after the
/// write landed): the store holds the extended lease, the handle the old.
#[derive(Debug, Clone)]
struct ExtensionAnswersLost<St>(St);

impl<St: Store> Store for ExtensionAnswersLost<St> {
    type Write = St::Write;
    const SINGLE_WRITE: bool = St::SINGLE_WRITE;
    async fn commit(&self, c: crate::store::Commit<St::Write>) -> Result<Conditional, StoreError> {
        self.0.commit(c).await
    }
    async fn claim(&self, c: &crate::store::Claim) -> Result<Conditional, StoreError> {
        self.0.claim(c).await
    }
    async fn take_over(
        &self,
        c: &crate::store::Claim,
        l: &crate::store::OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.0.take_over(c, l).await
    }
    async fn extend(&self, e: &crate::store::Extension) -> Result<Conditional, StoreError> {
        self.0.extend(e).await?;
        Err(StoreError::new(StoreErrorKind::Unavailable, "answer lost"))
    }
    async fn remove(
        &self,
        id: &RecordId,
        r: crate::store::Removal,
    ) -> Result<Conditional, StoreError> {
        self.0.remove(id, r).await
    }
    async fn complete(
        &self,
        c: crate::store::Completion<St::Write>,
    ) -> Result<Conditional, StoreError> {
        self.0.complete(c).await
    }
    async fn release(
        &self,
        id: &RecordId,
        o: &crate::store::OwnerToken,
    ) -> Result<Conditional, StoreError> {
        self.0.release(id, o).await
    }
    async fn list_in_progress(
        &self,
        p: &str,
        l: usize,
    ) -> Result<Vec<crate::store::Record>, StoreError> {
        self.0.list_in_progress(p, l).await
    }
    async fn get(&self, id: &RecordId, n: u64) -> Result<Option<crate::store::Record>, StoreError> {
        self.0.get(id, n).await
    }
    async fn peek(
        &self,
        id: &RecordId,
        n: u64,
    ) -> Result<Option<crate::store::Record>, StoreError> {
        self.0.peek(id, n).await
    }
}

#[tokio::test]
async fn a_waiter_does_not_spin_on_the_store_when_the_local_lease_lags_the_stored_one() {
    let store = CountingStore::new(ExtensionAnswersLost(MemoryStore::new()));
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .default_lease(Duration::from_secs(2))
        .build();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let first = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .run(
                    &Attempt::new("s", "k", fingerprint(1)),
                    Mode::default(),
                    &codec::Json,
                    |handle: ClaimHandle| async move {
                        // Lands in the store (lease +60 s), its answer lost.
                        let extended = handle.extend(Duration::from_secs(60)).await;
                        let _ = started_tx.send(extended.is_err());
                        let _ = finish_rx.await;
                        Ok::<_, Failed>((1u8, Vec::new()))
                    },
                )
                .await
        })
    };
    assert!(
        started_rx.await.expect("the first runs"),
        "the extension's answer was lost"
    );
    // Past the lease the handle knows, well within the one stored.
    clock.advance(Duration::from_secs(3));
    let before = store.calls();
    let began = std::time::Instant::now();
    let duplicate = engine
        .execute(
            &Attempt::new("s", "k", fingerprint(1)).wait_in_process(Duration::from_millis(300)),
            || async { Ok::<_, Failed>(2u8) },
        )
        .await;
    let calls = store.calls();
    eprintln!(
        "duplicate: {duplicate:?} after {:?}; claims meanwhile: {}",
        began.elapsed(),
        calls.claim - before.claim
    );
    let _ = finish_tx.send(());
    first.await.expect("joined").expect("ran");
    assert!(
        calls.claim - before.claim <= 10,
        "{} claims in 300 ms",
        calls.claim - before.claim
    );
}

#[tokio::test]
async fn a_waiter_waits_its_budget_while_the_run_extends_its_lease() {
    let engine = Engine::builder(MemoryStore::new())
        .default_lease(Duration::from_secs(1))
        .build();
    let first = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .run(
                    &Attempt::new("s", "k", fingerprint(1)),
                    Mode::default(),
                    &codec::Json,
                    |handle: ClaimHandle| async move {
                        // Extended once the duplicate waits (as a heartbeat does).
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        handle
                            .extend(Duration::from_secs(30))
                            .await
                            .expect("extended");
                        tokio::time::sleep(Duration::from_millis(2200)).await;
                        Ok::<_, Failed>((1u8, Vec::new()))
                    },
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let began = std::time::Instant::now();
    let duplicate = engine
        .execute(
            &Attempt::new("s", "k", fingerprint(1)).wait_in_process(Duration::from_secs(10)),
            || async { Ok::<_, Failed>(2u8) },
        )
        .await;
    eprintln!("duplicate: {duplicate:?} after {:?}", began.elapsed());
    first.await.expect("joined").expect("ran");
    let duplicate = duplicate.expect("the run's replay within the budget");
    assert_eq!(
        (duplicate.kind(), *duplicate.value()),
        (OutcomeKind::Replay, 1)
    );
}

#[tokio::test]
async fn a_lease_lost_run_never_hands_its_value_to_waiters() {
    // Two engines on one store: the second takes the key over while the
    // first (past its lease) still runs with a duplicate waiting on it.
    let store = MemoryStore::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .default_lease(Duration::from_secs(2))
        .build();
    let other = Engine::builder(store.clone()).clock(clock.clone()).build();
    let (first, finish_tx) = a_run_held_open(&engine, 1).await;
    let waiter = a_waiting_duplicate(&engine, Duration::from_secs(30), 3);
    tokio::time::sleep(Duration::from_millis(50)).await;
    clock.advance(Duration::from_secs(3));
    let took = other
        .execute(&Attempt::new("s", "k", fingerprint(1)), || async {
            Ok::<_, Failed>(9u8)
        })
        .await
        .expect("takes over");
    assert_eq!(took.kind(), OutcomeKind::Fresh);
    let _ = finish_tx.send(());
    let first = first.await.expect("joined").expect("answered");
    assert_eq!(first.kind(), OutcomeKind::LeaseLost);
    let waited = waiter.await.expect("joined");
    eprintln!("waiter: {waited:?}");
    let waited = waited.expect("a replay");
    assert_eq!(*waited.value(), 9, "the stored value, never the lost run's");
}

#[tokio::test]
async fn dropped_waiters_and_a_dropped_first_run_leave_nothing_registered() {
    let store = CountingStore::new(MemoryStore::new());
    let engine = Engine::builder(store.clone()).build();
    // Never finished: its future is dropped below.
    let (first, _never) = a_run_held_open(&engine, 1).await;
    // A waiter dropped mid-wait, and one that waits on.
    let dropped = a_waiting_duplicate(&engine, Duration::from_secs(30), 3);
    let waiting = a_waiting_duplicate(&engine, Duration::from_secs(5), 4);
    tokio::time::sleep(Duration::from_millis(50)).await;
    dropped.abort();
    let _ = dropped.await;
    let id = engine.record_id("s", "k");
    assert!(engine.local_runs().get(&id).is_some());
    first.abort();
    let _ = first.await;
    assert!(
        engine.local_runs().get(&id).is_none(),
        "gone with the run's future"
    );
    // The dropped run released nothing (it may have acted): the store
    // holds its claim, and the waiter is told so, at once, not at its
    // budget's end.
    let began = std::time::Instant::now();
    let waited = waiting.await.expect("joined");
    assert!(
        matches!(waited, Err(Error::InProgress { .. })),
        "{waited:?}"
    );
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "{:?}",
        began.elapsed()
    );
}

#[tokio::test]
async fn a_waiter_does_not_spin_when_a_lapsed_local_run_was_taken_over_elsewhere() {
    let store = CountingStore::new(MemoryStore::new());
    let clock = ManualClock::new(1_700_000_000_000);
    let here = Engine::builder(store.clone())
        .clock(clock.clone())
        .default_lease(Duration::from_secs(2))
        .build();
    // Another process on the same table.
    let elsewhere = Engine::builder(store.clone())
        .clock(clock.clone())
        .default_lease(Duration::from_secs(30))
        .build();
    let (first, finish_tx) = a_run_held_open(&here, 1).await;
    clock.advance(Duration::from_secs(3)); // the local run outlives its lease
                                           // Taken over elsewhere, still running there.
    let (takeover, done_tx) = a_run_held_open(&elsewhere, 9).await;
    let before = store.calls();
    let duplicate = here
        .execute(
            &Attempt::new("s", "k", fingerprint(1)).wait_in_process(Duration::from_millis(300)),
            || async { Ok::<_, Failed>(2u8) },
        )
        .await;
    let claims = store.calls().claim - before.claim;
    eprintln!("duplicate: {duplicate:?}; claims in its 300 ms: {claims}");
    let _ = done_tx.send(());
    let _ = finish_tx.send(());
    let _ = takeover.await;
    let _ = first.await;
    assert!(claims <= 10, "{claims} claims in 300 ms");
}

/// A refused write the application answers is answered with its claim
/// still held: the answer is stored and replayed, and the item the write
/// would have replaced is untouched. (Releasing the claim on the refusal,
/// before the answer is stored, leaves the answer no claim to complete.)
#[tokio::test]
async fn a_refused_write_the_application_answers_is_stored_under_its_claim() {
    let (engine, store, _) = setup();
    let taken = MemoryWrite::put("charge/ch_1", "someone else's");
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let first = engine
        .run(&attempt, Mode::Transactional, &Json, |_| async {
            Ok::<_, ()>((0u32, vec![taken.clone()]))
        })
        .await
        .expect("the item is written");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    let other = Attempt::new("s", "k2", fingerprint(1));
    let refusal = |refused: &crate::WriteRefusal| {
        assert_eq!(refused.code, "ConditionalCheckFailed");
        Some(Ok(409u32))
    };
    let answered = engine
        .run_with_refusals(&other, Mode::Transactional, &Json, refusal, |_| async {
            Ok::<_, ()>((
                201u32,
                vec![MemoryWrite::put_if_absent("charge/ch_1", "mine")],
            ))
        })
        .await
        .expect("the refusal's answer is the outcome");
    assert_eq!(
        (answered.kind(), *answered.value()),
        (OutcomeKind::Fresh, 409)
    );
    assert_eq!(
        store.item("charge/ch_1").as_deref(),
        Some(&b"someone else's"[..])
    );
    let replay = engine
        .run(&other, Mode::Transactional, &Json, |_| async {
            Ok::<_, ()>((201u32, Vec::new()))
        })
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(*replay.value(), 409);
}

/// `make mutants` (split.rs: the expiry arithmetic): a durable execution's
/// claim whose lease outlives the retention keeps its record until the
/// second after its lease ends, exactly: not a second less (it would be
/// absent, and taken, while its owner still holds it), nor the retention.
#[tokio::test]
async fn a_split_claim_longer_than_the_retention_outlives_its_lease_by_a_second() {
    use crate::split::{self, SplitAttempt, SplitClaim};
    let (engine, store, clock) = setup_retaining(Duration::from_secs(3600));
    let execution = SplitAttempt::new(
        "s",
        "long",
        fingerprint(1),
        crate::store::OwnerToken::from_stored("execution-1"),
        Duration::from_secs(48 * 3600),
    );
    let claimed = split::claim::<_, u8>(&engine, &execution, &Json).await;
    assert!(matches!(claimed, Ok(SplitClaim::Ours)), "{claimed:?}");
    let record = store
        .record(&engine.record_id("s", "long"))
        .expect("claimed");
    let lease_until_ms = clock.now_ms() + 48 * 3600 * 1000;
    assert_eq!(record.lease_until_ms, Some(lease_until_ms));
    assert_eq!(record.expiration_s, lease_until_ms / 1000 + 1);
}

/// A single write refused by a claim that lapses before the engine reads
/// it (a race: the claim was live at the commit) is committed again, not
/// taken for a completed record changed in the table: a lapsed claim
/// without a response holds nothing a retry must keep.
#[tokio::test]
async fn a_single_write_refused_by_a_claim_that_lapses_is_committed_again() {
    use crate::store::{Claim, Commit, Completion, Extension, OwnerToken, Record, Removal};
    use std::sync::atomic::AtomicBool;

    /// Refuses the first commit as a live claim would, and leaves that
    /// claim in the store lapsed by the time it is read.
    #[derive(Debug, Clone)]
    struct RacedOnce(MemoryStore, Arc<AtomicBool>);

    impl Store for RacedOnce {
        type Write = MemoryWrite;
        const SINGLE_WRITE: bool = true;
        const DB_SYSTEM: &'static str = "memory";

        async fn commit(&self, commit: Commit<MemoryWrite>) -> Result<Conditional, StoreError> {
            if self.1.swap(false, Ordering::SeqCst) {
                let lapsed = Claim {
                    id: commit.id.clone(),
                    owner: OwnerToken::from_stored("another"),
                    fingerprint: commit.fingerprint.clone(),
                    now_ms: commit.now_ms - 10_000,
                    lease_until_ms: commit.now_ms - 1,
                    expiration_s: commit.expiration_s,
                    attempt: 1,
                    first_started_ms: commit.now_ms - 10_000,
                };
                self.0.claim(&lapsed).await?;
                let found = self.0.peek(&commit.id, commit.now_ms).await?;
                assert!(found.is_some(), "the lapsed claim is there to be found");
                return Ok(Conditional::Refused(found));
            }
            self.0.commit(commit).await
        }
        async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
            self.0.claim(claim).await
        }
        async fn take_over(
            &self,
            claim: &Claim,
            lapsed: &OwnerToken,
        ) -> Result<Conditional, StoreError> {
            self.0.take_over(claim, lapsed).await
        }
        async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
            self.0.extend(extension).await
        }
        async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
            self.0.remove(id, removal).await
        }
        async fn complete(
            &self,
            completion: Completion<MemoryWrite>,
        ) -> Result<Conditional, StoreError> {
            self.0.complete(completion).await
        }
        async fn release(
            &self,
            id: &RecordId,
            owner: &OwnerToken,
        ) -> Result<Conditional, StoreError> {
            self.0.release(id, owner).await
        }
        async fn list_in_progress(
            &self,
            prefix: &str,
            limit: usize,
        ) -> Result<Vec<Record>, StoreError> {
            self.0.list_in_progress(prefix, limit).await
        }
        async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
            self.0.get(id, now_ms).await
        }
        async fn peek(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
            self.0.peek(id, now_ms).await
        }
    }

    let memory = MemoryStore::new();
    let store = RacedOnce(memory.clone(), Arc::new(AtomicBool::new(true)));
    let engine = Engine::builder(store).build();
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let ran = engine
        .run_single_write(&attempt, &Json, |_| async {
            Ok::<_, Failed>((7u8, Vec::<MemoryWrite>::new()))
        })
        .await
        .expect("committed again");
    assert_eq!((ran.kind(), *ran.value()), (OutcomeKind::Fresh, 7));
    let [record] = &memory.records()[..] else {
        panic!("{:?}", memory.records());
    };
    assert_eq!(record.status, Status::Completed);
}

/// A completion in a transaction that fails with the store (not a refusal
/// of the operation's writes) is a store error, said as a warning that
/// names the record, and the transaction is rolled back: the key is free
/// and the retry runs.
#[tokio::test]
async fn a_completion_in_a_transaction_that_fails_is_a_store_error_and_frees_the_key() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let runs = AtomicUsize::new(0);
    let limits = crate::store::TransactionLimits::new().claim_wait(Duration::from_millis(100));
    let attempt = Attempt::new("s", "k", fingerprint(1));
    let (failed, logs) = logged(engine.run_in_transaction(&attempt, limits, |tx| {
        runs.fetch_add(1, Ordering::SeqCst);
        let failing = store.clone();
        async move {
            tx.write(MemoryWrite::put("charge", "ch_1"))
                .map_err(|error| error.to_string())?;
            // The completion's statement is the next call the store sees.
            failing.fail_next(1);
            Ok::<_, String>("paid".to_owned())
        }
    }))
    .await;
    match failed {
        Err(Error::Store(error)) => assert_eq!(error.kind(), StoreErrorKind::Unavailable),
        other => panic!("a failed completion: {other:?}"),
    }
    let warning = logs
        .lines()
        .find(|line| line.contains("could not complete its record"))
        .unwrap_or_else(|| panic!("no warning: {logs}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(
        warning.contains("outcome=\"store_unavailable\""),
        "{warning}"
    );
    assert!(
        warning.contains(&format!("record={}", engine.record_id("s", "k"))),
        "{warning}"
    );
    assert!(store.item("charge").is_none(), "the writes rolled back");
    let retry = engine
        .run_in_transaction(&attempt, limits, |_tx| async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>("paid".to_owned())
        })
        .await
        .expect("the key is free");
    assert_eq!(retry.kind(), OutcomeKind::Fresh);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}
