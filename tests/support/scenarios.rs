//! The engine's guarantees as scenarios over any store: each integration
//! test runs one against DynamoDB Local, and against the memory store.

use futures::future::join_all;
use lambda_idempotency::{
    Attempt, Claim, ClaimOutcome, Clock, Completion, Engine, Error, Fenced, Fingerprint,
    ManualClock, OutcomeKind, OwnerToken, Status, Store,
};
use serde::{Deserialize, Serialize};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tokio::sync::oneshot;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    pub id: String,
    pub amount: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("declined")
    }
}

pub fn payload(amount: u64) -> Fingerprint {
    Fingerprint::of_json(&serde_json::json!({ "amount": amount, "currency": "eur" }))
        .expect("fingerprint")
}

/// An operation that counts its executions and returns a charge.
pub fn charge(
    runs: &Arc<AtomicUsize>,
    amount: u64,
) -> impl FnOnce() -> std::future::Ready<Result<Charge, Declined>> {
    let runs = Arc::clone(runs);
    move || {
        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
        std::future::ready(Ok(Charge {
            id: format!("ch_{n}"),
            amount,
        }))
    }
}

pub fn engine<S: Store>(store: S, clock: &ManualClock) -> Engine<S> {
    Engine::builder(store).clock(clock.clone()).build()
}

pub async fn first_call_runs_then_replays<S: Store>(store: S) {
    let clock = ManualClock::starting_now();
    let engine = engine(store, &clock);
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("tenant-a", "key-1", payload(100));

    let first = engine
        .execute(&attempt, charge(&runs, 100))
        .await
        .expect("first call");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    assert_eq!(first.value().id, "ch_1");

    clock.advance(Duration::from_secs(5));
    let second = engine
        .execute(&attempt, charge(&runs, 100))
        .await
        .expect("replay");
    assert_eq!(second.kind(), OutcomeKind::Replay);
    assert!(second.is_replay());
    assert_eq!(
        second.value(),
        first.value(),
        "the replay is the original response"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the replay ran nothing");

    let record = engine
        .store()
        .get(&engine.record_id("tenant-a", "key-1"), clock.now_ms())
        .await
        .expect("read record")
        .expect("record exists");
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.lease_until_ms, None, "completion removes the lease");
    assert!(record.completed_at_ms.is_some());

    // The same key in another scope is another record.
    let other_scope = Attempt::new("tenant-b", "key-1", payload(100));
    let other = engine
        .execute(&other_scope, charge(&runs, 100))
        .await
        .expect("other scope");
    assert_eq!(other.kind(), OutcomeKind::Fresh);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

pub async fn concurrent_duplicates_run_once<S: Store>(store: S, callers: usize) {
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let calls = (0..callers).map(|_| {
        let engine = engine.clone();
        let runs = Arc::clone(&runs);
        tokio::spawn(async move {
            let attempt = Attempt::new("tenant-a", "burst", payload(100));
            engine
                .execute(&attempt, || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Long enough for every duplicate to arrive while it runs.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok::<_, Declined>(Charge {
                        id: "ch_burst".into(),
                        amount: 100,
                    })
                })
                .await
        })
    });
    let results = join_all(calls).await;
    let (mut fresh, mut replays, mut in_progress) = (0, 0, 0);
    for result in results {
        match result.expect("task") {
            Ok(outcome) if outcome.kind() == OutcomeKind::Fresh => fresh += 1,
            Ok(outcome) if outcome.is_replay() => {
                assert_eq!(outcome.value().id, "ch_burst");
                replays += 1
            }
            Err(Error::InProgress { retry_after }) => {
                assert!(retry_after >= Duration::from_secs(1));
                in_progress += 1
            }
            other => panic!("unexpected result: {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the operation ran exactly once"
    );
    assert_eq!(fresh, 1);
    assert_eq!(fresh + replays + in_progress, callers);
    assert!(
        in_progress > 0,
        "some duplicates arrived while the first ran"
    );
}

pub async fn mismatch_is_rejected_without_running<S: Store>(store: S) {
    let clock = ManualClock::starting_now();
    let engine = engine(store, &clock);
    let runs = Arc::new(AtomicUsize::new(0));
    engine
        .execute(&Attempt::new("t", "k", payload(100)), charge(&runs, 100))
        .await
        .expect("first");
    let result = engine
        .execute(&Attempt::new("t", "k", payload(999)), charge(&runs, 999))
        .await;
    assert!(matches!(result, Err(Error::PayloadMismatch)), "{result:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A mismatch while the first is still in progress is a mismatch too,
    // never an "in progress" that would invite the wrong payload to wait.
    let id = engine.record_id("t", "k2");
    let claim = claim_at(&id, &clock, "owner-a", 100, Duration::from_secs(30));
    assert_eq!(
        engine.store().claim(&claim).await.expect("claim"),
        ClaimOutcome::Claimed
    );
    let result = engine
        .execute(&Attempt::new("t", "k2", payload(999)), charge(&runs, 999))
        .await;
    assert!(matches!(result, Err(Error::PayloadMismatch)), "{result:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

pub async fn failed_operation_releases_its_claim<S: Store>(store: S) {
    let clock = ManualClock::starting_now();
    let engine = engine(store, &clock);
    let attempt = Attempt::new("t", "k", payload(100));
    let result = engine
        .execute(&attempt, || async { Err::<Charge, _>(Declined) })
        .await;
    assert!(
        matches!(result, Err(Error::Operation(Declined))),
        "{result:?}"
    );
    let id = engine.record_id("t", "k");
    assert_eq!(
        engine.store().get(&id, clock.now_ms()).await.expect("read"),
        None,
        "the claim was released"
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let retry = engine
        .execute(&attempt, charge(&runs, 100))
        .await
        .expect("retry");
    assert_eq!(retry.kind(), OutcomeKind::Fresh, "the next call runs");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

pub async fn expired_lease_is_taken_over<S: Store>(store: S) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .max_lease(Duration::from_secs(30))
        .build();
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();

    // A claims with a deadline 20 s away and hangs.
    let deadline = clock.now_ms() + 20_000;
    let a = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let attempt = Attempt::new("t", "k", payload(100)).deadline_ms(deadline);
            engine
                .execute(&attempt, || async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, Declined>(Charge {
                        id: "ch_a".into(),
                        amount: 100,
                    })
                })
                .await
        })
    };
    started_rx.await.expect("A started");
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "k", payload(100));

    // Before the lease passes: in progress, retry after the time left.
    let result = engine.execute(&attempt, charge(&runs, 100)).await;
    assert!(
        matches!(result, Err(Error::InProgress { retry_after }) if retry_after == Duration::from_secs(20)),
        "{result:?}"
    );
    clock.advance(Duration::from_millis(12_500));
    let result = engine.execute(&attempt, charge(&runs, 100)).await;
    assert!(
        matches!(result, Err(Error::InProgress { retry_after }) if retry_after == Duration::from_secs(8)),
        "rounded up: {result:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 0);

    // After it: B takes over and runs.
    clock.advance(Duration::from_millis(7_501));
    let b = engine
        .execute(&attempt, charge(&runs, 100))
        .await
        .expect("takeover");
    assert_eq!(b.kind(), OutcomeKind::Fresh);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A, now a zombie, finishes: its outcome is returned to it, not stored.
    finish_tx.send(()).expect("A waits");
    let a = a.await.expect("task").expect("A's result");
    assert_eq!(a.kind(), OutcomeKind::LostLease);
    let replay = engine
        .execute(&attempt, charge(&runs, 100))
        .await
        .expect("replay");
    assert_eq!(replay.value(), b.value(), "B's record stands");
}

pub async fn lease_is_capped_by_max_lease<S: Store>(store: S) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .max_lease(Duration::from_secs(10))
        .build();
    let id = engine.record_id("t", "k");
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let deadline = clock.now_ms() + 15 * 60 * 1000;
    let running = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let attempt = Attempt::new("t", "k", payload(1)).deadline_ms(deadline);
            engine
                .execute(&attempt, || async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, Declined>(1u32)
                })
                .await
        })
    };
    started_rx.await.expect("started");
    let record = engine
        .store()
        .get(&id, clock.now_ms())
        .await
        .expect("read")
        .expect("claimed");
    assert_eq!(record.lease_until_ms, Some(clock.now_ms() + 10_000));
    assert!(
        record.expiration_s * 1000 > clock.now_ms() + 10_000,
        "the record outlives its lease"
    );
    finish_tx.send(()).expect("finish");
    running.await.expect("task").expect("result");
}

fn claim_at(
    id: &lambda_idempotency::RecordId,
    clock: &ManualClock,
    owner: &str,
    amount: u64,
    lease: Duration,
) -> Claim {
    let now_ms = clock.now_ms();
    Claim {
        id: id.clone(),
        owner: OwnerToken::from_stored(owner),
        fingerprint: payload(amount),
        now_ms,
        lease_until_ms: now_ms + lease.as_millis() as u64,
        expiration_s: now_ms / 1000 + 3600,
    }
}

fn completion<W>(
    claim: &Claim,
    clock: &ManualClock,
    response: &[u8],
    writes: Vec<W>,
) -> Completion<W> {
    Completion {
        id: claim.id.clone(),
        owner: claim.owner.clone(),
        response: response.to_vec(),
        now_ms: clock.now_ms(),
        expiration_s: clock.now_ms() / 1000 + 3600,
        writes,
    }
}

/// A claims, its lease passes, B claims and completes: A's completion and
/// A's release are both fenced out, and B's record is intact.
pub async fn zombie_cannot_touch_its_successor<S: Store>(store: S) {
    let clock = ManualClock::starting_now();
    let id = lambda_idempotency::RecordId::new("p", "t", "zombie");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&a).await.expect("A claims"),
        ClaimOutcome::Claimed
    );

    clock.advance(Duration::from_secs(6));
    let b = claim_at(&id, &clock, "owner-b", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&b).await.expect("B takes over"),
        ClaimOutcome::Claimed
    );

    // While B is in progress, A can neither complete nor release.
    assert_eq!(
        store
            .complete(completion(&a, &clock, b"A", Vec::new()))
            .await
            .expect("A completes"),
        Fenced::Lost
    );
    assert_eq!(
        store.release(&a.id, &a.owner).await.expect("A releases"),
        Fenced::Lost
    );

    assert_eq!(
        store
            .complete(completion(&b, &clock, b"B", Vec::new()))
            .await
            .expect("B completes"),
        Fenced::Applied
    );
    // Nor once B has completed.
    assert_eq!(
        store
            .complete(completion(&a, &clock, b"A", Vec::new()))
            .await
            .expect("A completes"),
        Fenced::Lost
    );
    assert_eq!(
        store.release(&a.id, &a.owner).await.expect("A releases"),
        Fenced::Lost
    );

    let record = store
        .get(&id, clock.now_ms())
        .await
        .expect("read")
        .expect("B's record");
    assert_eq!(record.owner, b.owner);
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.response.as_deref(), Some(&b"B"[..]));
}

/// Writes whose answer was lost and were retried by the SDK: the store must
/// recognise its own landed write.
pub async fn own_landed_writes_are_recognised<S: Store>(store: S) {
    let clock = ManualClock::starting_now();
    let id = lambda_idempotency::RecordId::new("p", "t", "retried");
    let claim = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(30));
    assert_eq!(
        store.claim(&claim).await.expect("claim"),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store.claim(&claim).await.expect("the same claim again"),
        ClaimOutcome::Claimed,
        "a claim colliding with its own owner token is this claim"
    );
    assert_eq!(
        store
            .complete(completion(&claim, &clock, b"r", Vec::new()))
            .await
            .expect("complete"),
        Fenced::Applied
    );
    assert_eq!(
        store
            .complete(completion(&claim, &clock, b"r", Vec::new()))
            .await
            .expect("complete again"),
        Fenced::Applied,
        "a completion finding its own completed record had landed"
    );

    let id = lambda_idempotency::RecordId::new("p", "t", "released");
    let claim = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(30));
    assert_eq!(
        store.claim(&claim).await.expect("claim"),
        ClaimOutcome::Claimed
    );
    assert_eq!(
        store.release(&id, &claim.owner).await.expect("release"),
        Fenced::Applied
    );
    assert_eq!(
        store
            .release(&id, &claim.owner)
            .await
            .expect("release again"),
        Fenced::Applied,
        "a release finding no record had landed"
    );
}

/// A COMPLETED record whose expiration has passed, still in the table
/// because TTL deletion lags, counts as absent: the key runs again.
pub async fn expired_completed_record_is_absent<S: Store>(store: S) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .retention(Duration::from_secs(60))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "k", payload(1));
    engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("first");
    let id = engine.record_id("t", "k");

    clock.advance(Duration::from_secs(61));
    assert_eq!(
        engine.store().get(&id, clock.now_ms()).await.expect("read"),
        None,
        "absent to reads"
    );
    let again = engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("after expiry");
    assert_eq!(again.kind(), OutcomeKind::Fresh, "absent to claims");
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A different payload after expiry is a new request, not a mismatch.
    clock.advance(Duration::from_secs(61));
    let other = engine
        .execute(&Attempt::new("t", "k", payload(2)), charge(&runs, 2))
        .await
        .expect("new payload after expiry");
    assert_eq!(other.kind(), OutcomeKind::Fresh);
}

/// A store failure at claim time: the operation does not run.
pub async fn store_failure_fails_closed<S: Store>(store: S) {
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let result = engine
        .execute(&Attempt::new("t", "k", payload(1)), charge(&runs, 1))
        .await;
    match result {
        Err(error @ Error::Store(_)) => {
            assert_eq!(
                error.kind(),
                lambda_idempotency::ErrorKind::StoreUnavailable
            );
            assert!(error.retry_after().is_some());
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the operation did not run");
}
