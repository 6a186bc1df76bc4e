//! What operators call: forgetting a record, listing claims in progress.

use super::*;

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
