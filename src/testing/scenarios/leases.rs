//! Leases: taken over once lapsed, capped, extended by the heartbeat, and
//! measured the same whatever the clock's offset.

use super::*;

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

/// A takeover whose operation fails gives its claim back without
/// forgetting it: the attempt it took over may still be running, or have
/// acted. The retry runs at once, as the next takeover, and is told so,
/// with the attempt count and when the first began.
pub async fn a_failed_takeover_is_not_forgotten<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .default_lease(Duration::from_secs(10))
        .build();
    let first_started_at_ms = clock.now_ms();
    let attempt = Attempt::new("t", "flaky", payload(1));
    let told = |fails: bool| {
        let engine = engine.clone();
        async move {
            let attempt = Attempt::new("t", "flaky", payload(1));
            engine
                .run(&attempt, Mode::Plain, &Json, |claim| async move {
                    if fails {
                        return Err(Declined);
                    }
                    let takeover = claim.takeover().map(|t| (t.attempt, t.first_started_at_ms));
                    Ok::<_, Declined>((takeover, Vec::<St::Write>::new()))
                })
                .await
        }
    };

    // Attempt 1 dies mid-operation (its future dropped): its claim lapses.
    let (started_tx, started_rx) = oneshot::channel();
    let running = {
        let engine = engine.clone();
        tokio::spawn(async move {
            let attempt = Attempt::new("t", "flaky", payload(1));
            engine
                .run(&attempt, Mode::Plain, &Json, |_| async move {
                    let _ = started_tx.send(());
                    std::future::pending::<Result<(Charge, Vec<St::Write>), Declined>>().await
                })
                .await
        })
    };
    started_rx.await.expect("attempt 1 started");
    running.abort();
    let _ = running.await;
    clock.advance(Duration::from_secs(11));

    // Attempt 2 takes over, and fails.
    let failed = told(true).await;
    assert!(
        matches!(failed, Err(Error::Operation(Declined))),
        "{failed:?}"
    );
    let record = engine
        .inspect("t", "flaky")
        .await
        .expect("read")
        .expect("the takeover's record is kept");
    assert_eq!((record.attempt, record.status), (2, Status::InProgress));
    assert!(
        record.is_lapsed(clock.now_ms()),
        "its lease ended, so a retry need not wait: {record:?}"
    );

    // The retry runs at once, told it is attempt 3.
    let outcome = told(false).await.expect("the retry runs");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    assert_eq!(*outcome.value(), Some((3, first_started_at_ms)));
    let replay = engine
        .execute(&attempt, || async { Ok::<_, Declined>(None::<(u32, u64)>) })
        .await
        .expect("replays");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
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
