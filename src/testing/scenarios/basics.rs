//! One key, one run: replays, concurrent duplicates, a reused key, a
//! failed operation, a store that fails, a record that expired.

use super::*;

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
