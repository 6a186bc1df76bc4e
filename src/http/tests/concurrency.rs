//! Duplicates in flight, waiting for a result, leases and takeovers.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_in_flight_gets_409_with_retry_after() {
    let echo = Echo {
        delay: Duration::from_millis(300),
        ..Echo::new()
    };
    let service = IdempotencyLayer::new(engine())
        .shared_scope()
        .layer(echo.clone());
    let first = tokio::spawn(service.clone().oneshot(post(Some("k"), "{}")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let duplicate = service
        .clone()
        .oneshot(post(Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    let retry_after: u64 = duplicate.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(
        problem(&duplicate)["type"],
        "urn:lambda-idempotency:problem:idempotency-key-in-use"
    );
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(echo.runs(), 1);
}

/// Sends a request and, while its handler (300 ms) runs, a duplicate that
/// waits up to `budget`: the duplicate must get the first one's replay.
async fn a_waiting_duplicate_gets_the_replay(engine: Engine<MemoryStore>, budget: Duration) {
    let echo = Echo {
        delay: Duration::from_millis(300),
        ..Echo::new()
    };
    let service = IdempotencyLayer::new(engine)
        .shared_scope()
        .wait_for_result(budget)
        .layer(echo.clone());
    let first = tokio::spawn(service.clone().oneshot(post(Some("k"), "{}")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let duplicate = service
        .clone()
        .oneshot(post(Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!(duplicate.status(), StatusCode::CREATED);
    assert_eq!(duplicate.headers()[REPLAYED_HEADER], "true");
    let first = first.await.unwrap().unwrap();
    assert_eq!(text(&duplicate), text(&first));
    assert_eq!(echo.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_the_result_replays_it() {
    a_waiting_duplicate_gets_the_replay(engine(), Duration::from_secs(5)).await;

    // A budget shorter than the handler: 409 after waiting.
    let short = IdempotencyLayer::new(engine())
        .shared_scope()
        .wait_for_result(Duration::from_millis(100))
        .layer(Echo {
            delay: Duration::from_millis(500),
            ..Echo::new()
        });
    let first = tokio::spawn(short.clone().oneshot(post(Some("k"), "{}")));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = std::time::Instant::now();
    let duplicate = short.clone().oneshot(post(Some("k"), "{}")).await.unwrap();
    assert_eq!(duplicate.status(), StatusCode::CONFLICT);
    assert!(started.elapsed() >= Duration::from_millis(100));
    first.await.unwrap().unwrap();
}

#[tokio::test]
async fn waiting_never_passes_the_invocation_deadline() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let service = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .wait_for_result(Duration::from_secs(30))
        .layer(Echo::new());
    // Someone else holds the key.
    let mut held = post(Some("k"), "{}");
    let claim_holder = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(service_fn(|_: Request| async {
            std::future::pending::<()>().await;
            Ok::<_, BoxError>(Response::new(Body::Empty))
        }));
    let holder =
        tokio::spawn(claim_holder.oneshot(std::mem::replace(&mut held, post(Some("k"), "{}"))));
    tokio::time::sleep(Duration::from_millis(20)).await;

    let mut context = lambda_http::Context::default();
    context.deadline = crate::clock::epoch_ms(std::time::SystemTime::now()) + 800;
    let started = std::time::Instant::now();
    let response = service
        .oneshot(held.with_lambda_context(context))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    holder.abort();
}

#[tokio::test]
async fn the_lease_runs_until_the_invocation_deadline() {
    let store = MemoryStore::new();
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store.clone()).clock(clock.clone()).build();
    let deadline = crate::Clock::now_ms(&clock) + 12_345;
    let holder = {
        let store = store.clone();
        service_fn(move |_: Request| {
            let store = store.clone();
            async move {
                let record = store.records().pop().expect("claimed");
                assert_eq!(record.status, Status::InProgress);
                Ok::<_, BoxError>(Response::new(Body::from(
                    record.lease_until_ms.unwrap_or_default().to_string(),
                )))
            }
        })
    };
    let mut context = lambda_http::Context::default();
    context.deadline = deadline;
    let response = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(holder)
        .oneshot(post(Some("k"), "{}").with_lambda_context(context))
        .await
        .unwrap();
    assert_eq!(text(&response), deadline.to_string());
}

/// An invocation without a real deadline (a default `Context` reads 0;
/// `cargo lambda watch` sends its timeout, 600000) gets the default lease,
/// not the minimum second a deadline in 1970 would leave it: a response
/// streaming for longer was recorded as not stored.
#[tokio::test]
async fn an_invocation_without_a_deadline_gets_the_default_lease() {
    let store = MemoryStore::new();
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .default_lease(Duration::from_secs(60))
        .build();
    let claimed_at = crate::Clock::now_ms(&clock);
    let holder = {
        let store = store.clone();
        service_fn(move |_: Request| {
            let store = store.clone();
            async move {
                // The one in progress: the first key's is completed by now.
                let record = store
                    .records()
                    .into_iter()
                    .find(|record| record.status == Status::InProgress)
                    .expect("claimed");
                Ok::<_, BoxError>(Response::new(Body::from(
                    record.lease_until_ms.unwrap_or_default().to_string(),
                )))
            }
        })
    };
    let layered = IdempotencyLayer::new(engine).shared_scope().layer(holder);
    for (key, deadline) in [("default", 0), ("cargo-lambda-watch", 600_000)] {
        let mut context = lambda_http::Context::default();
        context.deadline = deadline;
        let response = layered
            .clone()
            .oneshot(post(Some(key), "{}").with_lambda_context(context))
            .await
            .unwrap();
        assert_eq!(text(&response), (claimed_at + 60_000).to_string(), "{key}");
    }
}

/// Issue 10, item 13: `wait_for_result(Duration::MAX)` overflowed the clock
/// and panicked on every keyed request. The engine's own durations go up to
/// `MAX_DURATION` (issue 21, item 2: beyond it, `try_build` refuses them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durations_at_their_maximum_never_panic() {
    let engine = Engine::builder(MemoryStore::new())
        .retention(crate::MAX_DURATION)
        .max_lease(crate::MAX_DURATION)
        .default_lease(crate::MAX_DURATION)
        .build();
    a_waiting_duplicate_gets_the_replay(engine, Duration::MAX).await;
}

#[tokio::test]
async fn a_request_that_takes_over_a_crashed_one_finds_the_takeover_in_its_extensions() {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(MemoryStore::new())
        .clock(clock.clone())
        .default_lease(Duration::from_secs(5))
        .build();
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel();
    let handler = service_fn(move |request: Request| {
        let started = started_tx.clone();
        async move {
            let takeover = request.extensions().get::<crate::Takeover>().copied();
            let claim = request.extensions().get::<crate::ClaimHandle>().cloned();
            let _ = started.send(claim.is_some());
            match takeover {
                // The first attempt hangs until its invocation dies.
                None => std::future::pending().await,
                Some(takeover) => Ok::<_, BoxError>(Response::new(Body::from(format!(
                    "attempt {}",
                    takeover.attempt
                )))),
            }
        }
    });
    let service = IdempotencyLayer::new(engine).shared_scope().layer(handler);
    let crashed = tokio::spawn(service.clone().oneshot(post(Some("k"), "{}")));
    assert_eq!(
        started_rx.recv().await,
        Some(true),
        "the claim is in the extensions"
    );
    crashed.abort();
    let _ = crashed.await;
    clock.advance(Duration::from_secs(6));
    let response = service.oneshot(post(Some("k"), "{}")).await.unwrap();
    assert_eq!(text(&response), "attempt 2");
}
