//! A handler's own writes committed with its response (`CommitWith`).

use super::*;

/// A handler that writes `charge#<run>` with its response through
/// `CommitWith`, answering `status`.
fn committing(
    runs: Arc<AtomicUsize>,
    status: u16,
) -> impl Service<Request, Response = Response<Body>, Error = BoxError, Future = impl Send> + Clone
{
    service_fn(move |_: Request| {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            let mut response = Response::builder()
                .status(status)
                .body(Body::from(format!("ch_{run}")))?;
            response.extensions_mut().insert(CommitWith(vec![
                crate::store::memory::MemoryWrite::put(format!("charge#{run}"), "1"),
            ]));
            Ok::<_, BoxError>(response)
        }
    })
}

#[tokio::test]
async fn commit_with_writes_only_with_a_stored_response() {
    let store = MemoryStore::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut service = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .layer(committing(Arc::clone(&runs), 201));
    send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(store.item("charge#1").as_deref(), Some(&b"1"[..]));
    let replay = send(&mut service, post(Some("k"), "{}")).await;
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(store.item("charge#2"), None);

    let runs = Arc::new(AtomicUsize::new(0));
    let mut failing = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .layer(committing(Arc::clone(&runs), 503));
    let response = send(&mut failing, post(Some("other"), "{}")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(store.records().len(), 1, "released");
    assert!(store.item("charge#1").is_some() && store.item("charge#2").is_none());
}

#[tokio::test]
async fn a_request_fenced_out_of_its_transaction_commits_nothing_and_says_so() {
    let store = MemoryStore::new();
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store.clone()).clock(clock.clone()).build();
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let gate = Arc::new(Mutex::new(Some((started_tx, finish_rx))));
    let slow = service_fn(move |_: Request| {
        let gate = gate.lock().unwrap().take();
        async move {
            if let Some((started, finish)) = gate {
                let _ = started.send(());
                let _ = finish.await;
            }
            let mut response = Response::builder().status(201).body(Body::from("zombie"))?;
            response.extensions_mut().insert(CommitWith(vec![
                crate::store::memory::MemoryWrite::put("charge#zombie", "1"),
            ]));
            Ok::<_, BoxError>(response)
        }
    });
    let zombie = tokio::spawn(
        IdempotencyLayer::new(engine.clone())
            .shared_scope()
            .layer(slow)
            .oneshot(post(Some("k"), "{}")),
    );
    started_rx.await.unwrap();
    clock.advance(Duration::from_secs(61));
    let runs = Arc::new(AtomicUsize::new(0));
    let successor = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .layer(committing(runs, 201))
        .oneshot(post(Some("k"), "{}"))
        .await
        .unwrap();
    assert_eq!(successor.status(), StatusCode::CREATED);
    finish_tx.send(()).unwrap();
    let zombie = zombie.await.unwrap().unwrap();
    assert_eq!(zombie.status(), StatusCode::CONFLICT);
    assert_eq!(
        problem(&zombie)["type"],
        "urn:lambda-idempotency:problem:idempotency-lease-lost"
    );
    assert_eq!(zombie.headers()[header::RETRY_AFTER], "1");
    assert_eq!(
        store.item("charge#zombie"),
        None,
        "the zombie's write was not committed"
    );
    assert!(store.item("charge#1").is_some());
}

/// Issue 10, item 11: with fail-open, a handler whose writes need the store
/// never runs without it when declared transactional; undeclared, it has
/// run, and the answer says that its writes were not saved (never "not
/// processed").
#[tokio::test]
async fn fail_open_never_runs_a_declared_transactional_handler() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).fail_open(true).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let mut declared = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .mode(crate::Mode::Transactional)
        .layer(committing(Arc::clone(&runs), 201));
    // The claim, and the read that confirms the outage.
    store.fail_next(2);
    let response = send(&mut declared, post(Some("k"), "{}")).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        problem(&response)["type"],
        "urn:lambda-idempotency:problem:idempotency-store-unavailable"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "never ran without the store"
    );

    let mut undeclared = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(committing(Arc::clone(&runs), 201));
    // The claim, and the read that confirms the outage.
    store.fail_next(2);
    let response = send(&mut undeclared, post(Some("k2"), "{}")).await;
    assert_eq!(runs.load(Ordering::SeqCst), 1, "it ran");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key(header::RETRY_AFTER));
    let body = problem(&response);
    assert_eq!(
        body["type"],
        "urn:lambda-idempotency:problem:idempotency-writes-not-committed"
    );
    let detail = body["detail"].as_str().unwrap();
    assert!(!detail.contains("not processed"), "{detail}");
    assert!(
        detail.contains("none of its changes were saved"),
        "{detail}"
    );
    assert_eq!(store.item("charge#1"), None, "nothing committed");

    // A plain handler still runs unprotected during the outage.
    let echo = Echo::new();
    let mut plain = IdempotencyLayer::new(Engine::builder(store.clone()).fail_open(true).build())
        .shared_scope()
        .layer(echo.clone());
    // The claim, and the read that confirms the outage.
    store.fail_next(2);
    assert_eq!(
        send(&mut plain, post(Some("k3"), "{}")).await.status(),
        StatusCode::CREATED
    );
    assert_eq!(echo.runs(), 1);
}
