//! The protocol's guarantees as scenarios over any store.
//!
//! Each takes a fresh store and panics, like an assertion, when the store
//! (with the engine over it) breaks a guarantee.
//! [`store_conformance!`](crate::store_conformance) runs them all; call
//! one directly to run it with your own test attributes.

use super::{LostAnswers, ManualClock};
use crate::{
    clock::Clock,
    store::{Claim, Completion, Conditional, Extension, OwnerToken, RecordId, Status, Store},
    Attempt, Engine, Error, ErrorKind, Fingerprint, Forgotten, Json, Mode, OutcomeKind,
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

/// The value the scenarios' operations return.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Charge {
    /// Which run made it: `ch_<n>` for the n-th run.
    pub id: String,
    /// The amount asked.
    pub amount: u64,
}

/// The error the scenarios' failing operations return.
#[derive(Debug, PartialEq, Eq)]
pub struct Declined;

impl std::fmt::Display for Declined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("declined")
    }
}

/// The fingerprint of a charge request for `amount`.
pub fn payload(amount: u64) -> Fingerprint {
    Fingerprint::of_json(&serde_json::json!({ "amount": amount, "currency": "eur" }))
        .expect("a JSON object always serialises")
}

/// An operation that counts its runs in `runs` and returns a charge.
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

fn engine<St: Store>(store: St, clock: &ManualClock) -> Engine<St> {
    Engine::builder(store).clock(clock.clone()).build()
}

/// The first call runs and stores its value; a retry replays it without
/// running; the same key in another scope is another record.
pub async fn first_call_runs_then_replays<St: Store>(store: St) {
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
        .inspect("tenant-a", "key-1")
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

/// `callers` concurrent duplicates: the operation runs once; the others
/// get a replay or "in progress".
pub async fn concurrent_duplicates_run_once<St: Store>(store: St, callers: usize) {
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..callers)
        .map(|_| {
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
        })
        .collect();
    let (mut fresh, mut replays, mut in_progress) = (0, 0, 0);
    for call in calls {
        match call.await.expect("task") {
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

/// A key reused with another payload is rejected and runs nothing, also
/// while the first request is still in progress.
pub async fn reused_key_is_rejected_without_running<St: Store>(store: St) {
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
    assert!(matches!(result, Err(Error::KeyReused)), "{result:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // A mismatch while the first is still in progress is a mismatch too,
    // never an "in progress" that would invite the wrong payload to wait.
    let id = engine.record_id("t", "k2");
    let claim = claim_at(&id, &clock, "owner-a", 100, Duration::from_secs(30));
    assert_eq!(
        engine.store().claim(&claim).await.expect("claim"),
        Conditional::Applied
    );
    let result = engine
        .execute(&Attempt::new("t", "k2", payload(999)), charge(&runs, 999))
        .await;
    assert!(matches!(result, Err(Error::KeyReused)), "{result:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A failed operation releases its claim: the next call runs.
pub async fn failed_operation_releases_its_claim<St: Store>(store: St) {
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
    assert_eq!(
        engine.inspect("t", "k").await.expect("read"),
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

/// Before its lease passes, a claim answers "in progress, retry after the
/// time left"; after it, a retry takes the key over, and the first
/// attempt's late outcome is not stored.
pub async fn expired_lease_is_taken_over<St: Store>(store: St) {
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
    assert_eq!(a.kind(), OutcomeKind::LeaseLost);
    let replay = engine
        .execute(&attempt, charge(&runs, 100))
        .await
        .expect("replay");
    assert_eq!(replay.value(), b.value(), "B's record stands");
}

/// A deadline far away is capped by the engine's maximum lease, and the
/// record outlives its lease.
pub async fn lease_is_capped_by_max_lease<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .max_lease(Duration::from_secs(10))
        .build();
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
        .inspect("t", "k")
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
    id: &RecordId,
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
        attempt: 1,
        first_started_ms: now_ms,
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
/// A's release are both refused, and B's record is intact.
pub async fn zombie_cannot_touch_its_successor<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let id = RecordId::new("p", "t", "zombie");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&a).await.expect("A claims"),
        Conditional::Applied
    );

    clock.advance(Duration::from_secs(6));
    let b = claim_at(&id, &clock, "owner-b", 1, Duration::from_secs(5));
    assert_eq!(
        store.take_over(&b, &a.owner).await.expect("B takes over"),
        Conditional::Applied
    );

    // While B is in progress, A can neither complete nor release.
    let refused_by_b = |written: Conditional, status: Status| match written {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.owner, b.owner, "refused by B's record");
            assert_eq!(record.status, status);
        }
        other => panic!("A's write was not refused by B's record: {other:?}"),
    };
    refused_by_b(
        store
            .complete(completion(&a, &clock, b"A", Vec::new()))
            .await
            .expect("A completes"),
        Status::InProgress,
    );
    refused_by_b(
        store.release(&a.id, &a.owner).await.expect("A releases"),
        Status::InProgress,
    );

    assert_eq!(
        store
            .complete(completion(&b, &clock, b"B", Vec::new()))
            .await
            .expect("B completes"),
        Conditional::Applied
    );
    // Nor once B has completed.
    refused_by_b(
        store
            .complete(completion(&a, &clock, b"A", Vec::new()))
            .await
            .expect("A completes"),
        Status::Completed,
    );
    refused_by_b(
        store.release(&a.id, &a.owner).await.expect("A releases"),
        Status::Completed,
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

/// A write retried after it landed (its answer lost) is refused by its own
/// effect; the store reports it, and the engine recognises it.
pub async fn own_landed_writes_are_recognised<St: Store>(store: St) {
    let clock = ManualClock::starting_now();

    // What the store reports.
    let id = RecordId::new("p", "t", "retried");
    let claim = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(30));
    assert_eq!(
        store.claim(&claim).await.expect("claim"),
        Conditional::Applied
    );
    match store.claim(&claim).await.expect("the same claim again") {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.owner, claim.owner, "refused by its own record");
            assert_eq!(record.status, Status::InProgress);
        }
        other => panic!("a claim colliding with itself must report its record: {other:?}"),
    }
    let done = || completion(&claim, &clock, b"r", Vec::new());
    assert_eq!(
        store.complete(done()).await.expect("complete"),
        Conditional::Applied
    );
    match store.complete(done()).await.expect("complete again") {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.owner, claim.owner, "refused by its own completion");
            assert_eq!(record.status, Status::Completed);
        }
        other => panic!("a completion finding its own completion must report it: {other:?}"),
    }
    let id = RecordId::new("p", "t", "released");
    let claim = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(30));
    assert_eq!(
        store.claim(&claim).await.expect("claim"),
        Conditional::Applied
    );
    assert_eq!(
        store.release(&id, &claim.owner).await.expect("release"),
        Conditional::Applied
    );
    assert_eq!(
        store
            .release(&id, &claim.owner)
            .await
            .expect("release again"),
        Conditional::Refused(None),
        "a release finding no record reports none"
    );

    // What the engine decides, every write sent twice.
    let engine = engine(LostAnswers(store), &clock);
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "lost-answers", payload(1));
    let first = engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("a retried claim and completion are this attempt's");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    let replay = engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("replay");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value(), first.value());
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let failing = Attempt::new("t", "lost-release", payload(1));
    let result = engine
        .execute(&failing, || async { Err::<Charge, _>(Declined) })
        .await;
    assert!(
        matches!(result, Err(Error::Operation(Declined))),
        "{result:?}"
    );
    let retry = engine
        .execute(&failing, charge(&runs, 1))
        .await
        .expect("a retried release released");
    assert_eq!(retry.kind(), OutcomeKind::Fresh);
}

/// Writes refused by a record that is no longer live (expired, or its lease
/// passed) report it, so that the engine can decide; a claim over such a
/// record applies.
pub async fn a_refused_write_reports_what_it_found<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let id = RecordId::new("p", "t", "found");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&a).await.expect("A claims"),
        Conditional::Applied
    );
    let b = claim_at(&id, &clock, "owner-b", 2, Duration::from_secs(5));
    match store.claim(&b).await.expect("B claims") {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.id, id);
            assert_eq!(record.owner, a.owner);
            assert_eq!(record.fingerprint, payload(1));
            assert_eq!(record.status, Status::InProgress);
            assert_eq!(record.lease_until_ms, Some(a.lease_until_ms));
            assert_eq!(record.expiration_s, a.expiration_s);
            assert_eq!(record.response, None);
        }
        other => panic!("B's claim must report A's live record: {other:?}"),
    }
    assert_eq!(
        store.get(&id, clock.now_ms()).await.expect("read"),
        store.get(&id, clock.now_ms()).await.expect("read again"),
        "a read changes nothing"
    );
    assert_eq!(
        store
            .complete(completion(&b, &clock, b"B", Vec::new()))
            .await
            .expect("B completes without a claim"),
        match store.get(&id, clock.now_ms()).await.expect("read") {
            Some(record) => Conditional::Refused(Some(record)),
            None => panic!("A's record is there"),
        },
        "a completion without a claim is refused by the record there"
    );
    let nothing = RecordId::new("p", "t", "nothing");
    let c = claim_at(&nothing, &clock, "owner-c", 1, Duration::from_secs(5));
    assert_eq!(
        store
            .complete(completion(&c, &clock, b"C", Vec::new()))
            .await
            .expect("complete nothing"),
        Conditional::Refused(None),
        "a completion without a record reports none"
    );
    assert_eq!(
        store.get(&nothing, clock.now_ms()).await.expect("read"),
        None,
        "a refused completion writes nothing"
    );
    clock.advance(Duration::from_secs(6));
    let b = claim_at(&id, &clock, "owner-b", 2, Duration::from_secs(5));
    match store.claim(&b).await.expect("B claims after A's lease") {
        Conditional::Refused(Some(record)) => {
            assert_eq!(
                record.owner, a.owner,
                "a lapsed claim still refuses a claim"
            );
            assert!(record.is_lapsed(clock.now_ms()));
        }
        other => panic!("B's claim must report A's lapsed record: {other:?}"),
    }
    let stranger = OwnerToken::from_stored("owner-x");
    assert!(
        matches!(
            store.take_over(&b, &stranger).await.expect("take over the wrong claim"),
            Conditional::Refused(Some(ref record)) if record.owner == a.owner
        ),
        "a takeover is fenced on the lapsed claim's owner"
    );
    assert_eq!(
        store.take_over(&b, &a.owner).await.expect("B takes over"),
        Conditional::Applied
    );
    let c = claim_at(&id, &clock, "owner-c", 2, Duration::from_secs(5));
    match store
        .take_over(&c, &a.owner)
        .await
        .expect("C takes over too")
    {
        Conditional::Refused(Some(record)) => assert_eq!(record.owner, b.owner),
        other => panic!("of two takeovers, one applies: {other:?}"),
    }
}

/// An operation's lease can be extended while the claim is its own, and
/// only then.
pub async fn extensions_are_fenced<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let id = RecordId::new("p", "t", "extended");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&a).await.expect("A claims"),
        Conditional::Applied
    );
    let extension = |claim: &Claim, lease_until_ms: u64| Extension {
        id: claim.id.clone(),
        owner: claim.owner.clone(),
        lease_until_ms,
        expiration_s: claim.expiration_s + 60,
        now_ms: clock.now_ms(),
    };
    let later = a.lease_until_ms + 30_000;
    assert_eq!(
        store
            .extend(&extension(&a, later))
            .await
            .expect("A extends"),
        Conditional::Applied
    );
    let record = store
        .get(&id, clock.now_ms())
        .await
        .expect("read")
        .expect("A's record");
    assert_eq!(record.lease_until_ms, Some(later));
    assert_eq!(record.expiration_s, a.expiration_s + 60);
    assert_eq!(record.status, Status::InProgress);

    // Past the old lease, A's claim is live: nobody takes it over.
    clock.advance(Duration::from_secs(6));
    let b = claim_at(&id, &clock, "owner-b", 1, Duration::from_secs(5));
    assert!(matches!(
        store.take_over(&b, &a.owner).await.expect("B tries"),
        Conditional::Refused(Some(ref record)) if record.owner == a.owner
    ));

    // Past the extended one, B takes over, and A can no longer extend.
    clock.advance(Duration::from_secs(30));
    let b = claim_at(&id, &clock, "owner-b", 1, Duration::from_secs(5));
    assert_eq!(
        store.take_over(&b, &a.owner).await.expect("B takes over"),
        Conditional::Applied
    );
    match store
        .extend(&extension(&a, later + 60_000))
        .await
        .expect("A extends")
    {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.owner, b.owner);
            assert_eq!(
                record.lease_until_ms,
                Some(b.lease_until_ms),
                "B's lease untouched"
            );
        }
        other => panic!("an extension of a lost claim must be refused: {other:?}"),
    }
}

/// An attempt that crashes mid-operation (its future dropped, as at a
/// Lambda timeout) leaves a claim that lapses; the next attempt takes it
/// over and is told so, with the attempt count and when the first began.
pub async fn a_takeover_is_told_it_may_follow_an_attempt_that_acted<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .default_lease(Duration::from_secs(10))
        .build();
    let first_started_at_ms = clock.now_ms();
    let attempt = Attempt::new("t", "crashy", payload(1));
    let acted = Arc::new(AtomicUsize::new(0));

    for crash in 1..=2 {
        let (started_tx, started_rx) = oneshot::channel();
        let running = {
            let engine = engine.clone();
            let acted = Arc::clone(&acted);
            tokio::spawn(async move {
                let attempt = Attempt::new("t", "crashy", payload(1));
                engine
                    .run(&attempt, Mode::Plain, &Json, |claim| async move {
                        let _ = started_tx.send(claim.takeover());
                        acted.fetch_add(1, Ordering::SeqCst); // the external effect
                        std::future::pending::<Result<(Charge, Vec<St::Write>), Declined>>().await
                    })
                    .await
            })
        };
        let takeover = started_rx.await.expect("the attempt started");
        assert_eq!(
            takeover.map(|t| t.attempt),
            (crash > 1).then_some(crash),
            "attempt {crash}"
        );
        running.abort(); // the invocation dies mid-operation
        let _ = running.await;
        let busy = engine
            .execute(&attempt, || async { Ok::<_, Declined>(0u8) })
            .await;
        assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
        clock.advance(Duration::from_secs(11));
    }

    let outcome = engine
        .run(&attempt, Mode::Plain, &Json, |claim| async move {
            let takeover = claim.takeover().expect("told it is a takeover");
            Ok::<_, Declined>(((takeover.attempt, takeover.first_started_at_ms), Vec::new()))
        })
        .await
        .expect("the third attempt runs");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    assert_eq!(*outcome.value(), (3, first_started_at_ms));
    assert_eq!(
        acted.load(Ordering::SeqCst),
        2,
        "both crashed attempts acted"
    );
    let record = engine
        .inspect("t", "crashy")
        .await
        .expect("read")
        .expect("stored");
    assert_eq!((record.attempt, record.status), (3, Status::Completed));
    assert_eq!(record.first_started_ms, Some(first_started_at_ms));

    // A key that never crashed is a first attempt, and is not told anything.
    let fresh = engine
        .run(
            &Attempt::new("t", "calm", payload(1)),
            Mode::Plain,
            &Json,
            |claim| async move { Ok::<_, Declined>((claim.takeover().is_none(), Vec::new())) },
        )
        .await
        .expect("runs");
    assert!(*fresh.value());
}

/// With the heartbeat, an operation running three times its lease is never
/// taken over. Runs in real time (about 3.5 s).
pub async fn heartbeat_keeps_a_long_operation_claimed<St: Store>(store: St) {
    long_operation(store, true).await;
}

/// Without the heartbeat, an operation running three times its lease is
/// taken over, and its late outcome is not stored. Runs in real time
/// (about 3.5 s).
pub async fn without_a_heartbeat_a_long_operation_is_taken_over<St: Store>(store: St) {
    long_operation(store, false).await;
}

async fn long_operation<St: Store>(store: St, heartbeat: bool) {
    {
        let engine = Engine::builder(store)
            .max_lease(Duration::from_secs(1))
            .heartbeat(heartbeat)
            .build();
        let key = format!("long-{heartbeat}");
        let (started_tx, started_rx) = oneshot::channel();
        let long = {
            let engine = engine.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let attempt = Attempt::new("t", &key, payload(1));
                engine
                    .run(&attempt, Mode::Plain, &Json, |claim| async move {
                        let _ = started_tx.send(());
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        Ok::<_, Declined>((claim.is_lost(), Vec::new()))
                    })
                    .await
            })
        };
        started_rx.await.expect("started");
        let attempt = Attempt::new("t", &key, payload(1));
        let mut took_over = false;
        for _ in 0..12 {
            tokio::time::sleep(Duration::from_millis(250)).await;
            match engine
                .execute(&attempt, || async { Ok::<_, Declined>(true) })
                .await
            {
                Err(Error::InProgress { .. }) => {}
                Ok(outcome) if outcome.kind() == OutcomeKind::Fresh => {
                    took_over = true;
                    break;
                }
                // The long operation completed.
                Ok(outcome) if outcome.is_replay() => break,
                other => panic!("unexpected: {other:?}"),
            }
        }
        let long = long
            .await
            .expect("task")
            .expect("the long operation's result");
        if heartbeat {
            assert!(!took_over, "with the heartbeat, no duplicate took over");
            assert_eq!(long.kind(), OutcomeKind::Fresh);
            assert!(!*long.value(), "the claim was never lost");
        } else {
            assert!(took_over, "without the heartbeat, a duplicate took over");
            assert_eq!(long.kind(), OutcomeKind::LeaseLost);
        }
    }
}

/// An operator forgets a completed record (the next request runs), and a
/// record in progress only when forced.
pub async fn forget_removes_records_but_keeps_claims_in_progress<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = engine(store, &clock);
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "evict-me", payload(1));
    engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("first");
    assert_eq!(
        engine.forget("t", "evict-me").await.expect("forget"),
        Forgotten::Removed
    );
    assert_eq!(
        engine.forget("t", "evict-me").await.expect("again"),
        Forgotten::Absent
    );
    let again = engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("runs again");
    assert_eq!(again.kind(), OutcomeKind::Fresh);
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    let id = engine.record_id("t", "stuck");
    let claim = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(30));
    assert_eq!(
        engine.store().claim(&claim).await.expect("claim"),
        Conditional::Applied
    );
    match engine.forget("t", "stuck").await.expect("forget") {
        Forgotten::InProgress(record) => assert_eq!(record.owner, claim.owner),
        other => panic!("a claim in progress is kept: {other:?}"),
    }
    assert!(engine.inspect("t", "stuck").await.expect("read").is_some());
    assert_eq!(
        engine
            .forget_even_in_progress("t", "stuck")
            .await
            .expect("forced"),
        Forgotten::Removed
    );
    assert_eq!(engine.inspect("t", "stuck").await.expect("read"), None);
}

/// A COMPLETED record whose expiration has passed, still stored because
/// deletion lags (DynamoDB's TTL), counts as absent: the key runs again,
/// under a claim that keeps none of the old record's fields.
pub async fn expired_completed_record_is_absent<St: Store>(store: St) {
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
    clock.advance(Duration::from_secs(61));
    assert_eq!(
        engine.inspect("t", "k").await.expect("read"),
        None,
        "absent to reads"
    );
    // The new claim is a new record: nothing of the expired one (its
    // response, its completion time) may show through while it runs.
    let again = engine
        .execute(&attempt, || async {
            runs.fetch_add(1, Ordering::SeqCst);
            let record = engine.inspect("t", "k").await.map_err(|_| Declined)?;
            let record = record.ok_or(Declined)?;
            Ok::<_, Declined>((
                record.status.as_str().to_owned(),
                record.response.is_some(),
                record.completed_at_ms,
            ))
        })
        .await
        .expect("after expiry");
    assert_eq!(again.kind(), OutcomeKind::Fresh, "absent to claims");
    assert_eq!(
        again.value(),
        &("IN_PROGRESS".to_owned(), false, None),
        "the claim over an expired record keeps none of its fields"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // A different payload after expiry is a new request, not a mismatch.
    clock.advance(Duration::from_secs(61));
    let other = engine
        .execute(&Attempt::new("t", "k", payload(2)), charge(&runs, 2))
        .await
        .expect("new payload after expiry");
    assert_eq!(other.kind(), OutcomeKind::Fresh);
}

/// The engine's clock far from the store's: two days behind it, then two
/// days ahead, with a retention of one hour. A claim, its completion, a
/// replay, and a duplicate that finds the claim in progress all behave as
/// with clocks in step, and the records are still stored and replay
/// afterwards: a store counts its own expiry from the `now` it is handed,
/// never from its clock (an absolute expiry on the store's clock would
/// delete a record at once when the engine is behind).
pub async fn clock_offsets_change_nothing<St: Store>(store: St) {
    let day_ms = 24 * 3600 * 1000;
    let real_now = crate::SystemClock.now_ms();
    let clock = ManualClock::new(real_now);
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .retention(Duration::from_secs(3600))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    for (what, now_ms) in [
        ("two days behind", real_now - 2 * day_ms),
        ("two days ahead", real_now + 2 * day_ms),
    ] {
        clock.set(now_ms);
        let before = runs.load(Ordering::SeqCst);
        let attempt = Attempt::new("offset", what, payload(1));
        let first = engine
            .execute(&attempt, charge(&runs, 1))
            .await
            .unwrap_or_else(|e| panic!("{what}: first call: {e}"));
        assert_eq!(first.kind(), OutcomeKind::Fresh, "{what}");
        let replay = engine
            .execute(&attempt, charge(&runs, 1))
            .await
            .unwrap_or_else(|e| panic!("{what}: replay: {e}"));
        assert_eq!(replay.kind(), OutcomeKind::Replay, "{what}: a replay");
        assert_eq!(replay.value(), first.value(), "{what}");

        // A duplicate while the first call runs: in progress.
        let running_key = format!("{what}, running");
        let running = Attempt::new("offset", &running_key, payload(2));
        let (started_tx, started_rx) = oneshot::channel::<()>();
        let (finish_tx, finish_rx) = oneshot::channel::<()>();
        let (long, duplicate) = tokio::join!(
            engine.execute(&running, || async {
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                Ok::<_, Declined>(Charge {
                    id: "ch_running".into(),
                    amount: 2,
                })
            }),
            async {
                let _ = started_rx.await;
                let duplicate = engine.execute(&running, charge(&runs, 2)).await;
                let _ = finish_tx.send(());
                duplicate
            },
        );
        assert!(
            matches!(duplicate, Err(Error::InProgress { .. })),
            "{what}: the duplicate finds the claim in progress: {duplicate:?}"
        );
        let long = long.unwrap_or_else(|e| panic!("{what}: the running call: {e}"));
        assert_eq!(long.kind(), OutcomeKind::Fresh, "{what}");
        assert_eq!(
            runs.load(Ordering::SeqCst),
            before + 1,
            "{what}: one run of the first key, none of the duplicate"
        );

        // Both records are still there, and replay.
        for (key, amount) in [(what, 1), (running_key.as_str(), 2)] {
            let record = engine
                .inspect("offset", key)
                .await
                .unwrap_or_else(|e| panic!("{what}: read {key}: {e}"))
                .unwrap_or_else(|| panic!("{what}: the record of {key:?} is gone"));
            assert_eq!(record.status, Status::Completed, "{what}: {key}");
            let again = engine
                .execute(
                    &Attempt::new("offset", key, payload(amount)),
                    charge(&runs, amount),
                )
                .await
                .unwrap_or_else(|e| panic!("{what}: replay {key}: {e}"));
            assert_eq!(again.kind(), OutcomeKind::Replay, "{what}: {key} replays");
        }
        assert_eq!(runs.load(Ordering::SeqCst), before + 1, "{what}");
    }
}

/// A store failure at claim time: the operation does not run. `store`
/// must fail its first call as unavailable.
pub async fn store_failure_fails_closed<St: Store>(store: St) {
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let result = engine
        .execute(&Attempt::new("t", "k", payload(1)), charge(&runs, 1))
        .await;
    match result {
        Err(error @ Error::Store(_)) => {
            assert_eq!(error.kind(), ErrorKind::StoreUnavailable);
            assert!(error.retry_after().is_some());
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the operation did not run");
}

/// Single write: concurrent duplicates may each run the operation; exactly
/// one commits, and every other gets its value as a replay, never "in
/// progress".
pub async fn single_write_commits_one_of_concurrent_duplicates<St: Store>(store: St) {
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..32)
        .map(|_| {
            let engine = engine.clone();
            let runs = Arc::clone(&runs);
            tokio::spawn(async move {
                let attempt = Attempt::new("t", "single-burst", payload(100));
                engine
                    .run_single_write(&attempt, &Json, |_| async move {
                        let n = runs.fetch_add(1, Ordering::SeqCst) + 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        let charge = Charge {
                            id: format!("ch_{n}"),
                            amount: 100,
                        };
                        Ok::<_, Declined>((charge, Vec::new()))
                    })
                    .await
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for call in calls {
        outcomes.push(call.await.expect("task").expect("committed or replayed"));
    }
    let fresh: Vec<_> = outcomes
        .iter()
        .filter(|outcome| outcome.kind() == OutcomeKind::Fresh)
        .collect();
    assert_eq!(fresh.len(), 1, "exactly one commit");
    for outcome in &outcomes {
        assert_eq!(
            outcome.value(),
            fresh[0].value(),
            "everyone got the committed value"
        );
    }
    assert!(runs.load(Ordering::SeqCst) >= 1);
}

/// Single write follows the claim's rules: a retry replays, another
/// payload is rejected, a claim in progress answers "in progress", a
/// lapsed claim or an expired record is replaced; and a commit retried
/// after it landed (every write sent twice here) is recognised.
pub async fn single_write_follows_the_claim_rules<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(LostAnswers(store))
        .clock(clock.clone())
        .retention(Duration::from_secs(600))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let single = |key: &'static str, amount: u64| {
        let engine = engine.clone();
        let operation = charge(&runs, amount);
        async move {
            engine
                .run_single_write(&Attempt::new("t", key, payload(amount)), &Json, |_| async {
                    operation().await.map(|charge| (charge, Vec::new()))
                })
                .await
        }
    };

    let first = single("k", 1).await.expect("first");
    assert_eq!(first.kind(), OutcomeKind::Fresh, "its own landed commit");
    let retry = single("k", 1).await.expect("retry");
    assert_eq!(retry.kind(), OutcomeKind::Replay);
    assert_eq!(retry.value(), first.value(), "the committed value");
    assert!(matches!(single("k", 2).await, Err(Error::KeyReused)));

    let id = engine.record_id("t", "claimed");
    let claim = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(30));
    assert_eq!(
        engine.store().0.claim(&claim).await.expect("claim"),
        Conditional::Applied
    );
    let busy = single("claimed", 1).await;
    assert!(
        matches!(busy, Err(Error::InProgress { retry_after }) if retry_after == Duration::from_secs(30)),
        "{busy:?}"
    );
    clock.advance(Duration::from_secs(31));
    let replaced = single("claimed", 1)
        .await
        .expect("a lapsed claim is replaced");
    assert_eq!(replaced.kind(), OutcomeKind::Fresh);
    let record = engine
        .inspect("t", "claimed")
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(record.status, Status::Completed);
    assert_ne!(record.owner, claim.owner);

    clock.advance(Duration::from_secs(601));
    let again = single("k", 2).await.expect("an expired record is absent");
    assert_eq!(again.kind(), OutcomeKind::Fresh);
}

/// An operator lists the claims in progress under the engine's prefix:
/// live ones and stuck ones, never completed records or another prefix's.
pub async fn list_in_progress_finds_live_and_stuck_claims<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .key_prefix("listed")
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    engine
        .execute(&Attempt::new("t", "done", payload(1)), charge(&runs, 1))
        .await
        .expect("completed");
    let stuck = claim_at(
        &engine.record_id("t", "stuck"),
        &clock,
        "owner-s",
        1,
        Duration::from_secs(5),
    );
    let live = claim_at(
        &engine.record_id("t", "live"),
        &clock,
        "owner-l",
        1,
        Duration::from_secs(60),
    );
    let elsewhere = claim_at(
        &RecordId::new("other", "t", "x"),
        &clock,
        "owner-o",
        1,
        Duration::from_secs(60),
    );
    for claim in [&stuck, &live, &elsewhere] {
        assert_eq!(
            engine.store().claim(claim).await.expect("claim"),
            Conditional::Applied
        );
    }
    clock.advance(Duration::from_secs(6));
    let mut listed = engine.list_in_progress(100).await.expect("list");
    listed.sort_by_key(|record| record.owner.as_str().to_owned());
    let owners: Vec<_> = listed.iter().map(|r| r.owner.as_str()).collect();
    assert_eq!(owners, ["owner-l", "owner-s"], "this prefix's claims only");
    let now_ms = engine.now_ms();
    assert!(!listed[0].is_lapsed(now_ms), "the live one");
    assert!(listed[1].is_lapsed(now_ms), "the stuck one");
    assert_eq!(
        engine.list_in_progress(1).await.expect("list").len(),
        1,
        "limited"
    );
}
