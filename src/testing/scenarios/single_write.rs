//! The single write, for stores whose `Store::SINGLE_WRITE` is true.

use super::*;

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
