//! The guarantees under faults, against DynamoDB Local behind a
//! fault-injecting proxy: throttling, 5xx, writes whose answer is lost (and
//! that the SDK retries), outages, a killed and restarted DynamoDB Local,
//! and invocations that die mid-flight.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

mod support;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use lambda_http::{http, Body, Request, Response};
use lambda_idempotency::{
    http::IdempotencyLayer, Attempt, DynamoDbStore, Engine, Error, ErrorKind, ManualClock,
    OutcomeKind, Status, Store, StoreErrorKind,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use support::{
    proxy::{Fault, FaultProxy},
    scenarios::{charge, payload, Charge, Declined},
    CallCounter,
};
use tower::{Layer, ServiceExt};

struct Setup {
    proxy: FaultProxy,
    engine: Engine<DynamoDbStore>,
    calls: CallCounter,
    clock: ManualClock,
    runs: Arc<AtomicUsize>,
}

async fn setup() -> Setup {
    let direct = support::client();
    let table = support::create_idempotency_table(&direct).await;
    let proxy = FaultProxy::start(&support::endpoint()).await;
    let (client, calls) = support::client_via(&proxy.url());
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(DynamoDbStore::new(client, table))
        .clock(clock.clone())
        .build();
    Setup {
        proxy,
        engine,
        calls,
        clock,
        runs: Arc::default(),
    }
}

fn attempt(key: &str) -> Attempt<'_> {
    Attempt::new("tenant", key, payload(100))
}

#[tokio::test]
async fn a_throttled_claim_is_retried_within_the_deadline() {
    let s = setup().await;
    s.proxy.inject("PutItem", Fault::Throttle, 2);
    let outcome = s
        .engine
        .execute(&attempt("k"), charge(&s.runs, 100))
        .await
        .expect("retried");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    assert_eq!(s.runs.load(Ordering::SeqCst), 1);
    assert_eq!(s.proxy.injected().get("throttle"), Some(&2));
}

#[tokio::test]
async fn a_claim_that_keeps_failing_is_store_unavailable_and_nothing_runs() {
    let s = setup().await;
    for (fault, kind) in [
        (Fault::Throttle, StoreErrorKind::Throttled),
        (Fault::ServerError, StoreErrorKind::Unavailable),
    ] {
        s.proxy.always("PutItem", fault);
        let result = s.engine.execute(&attempt("k"), charge(&s.runs, 100)).await;
        match result {
            Err(Error::Store(error)) => assert_eq!(error.kind(), kind, "{error}"),
            other => panic!("expected a store error, got {other:?}"),
        }
        s.proxy.heal();
    }
    assert_eq!(s.runs.load(Ordering::SeqCst), 0, "never without a claim");

    // Through the HTTP layer: 503 with Retry-After, the handler not run.
    s.proxy.always("PutItem", Fault::Throttle);
    let handled = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&handled);
    let service =
        IdempotencyLayer::new(s.engine.clone()).layer(tower::service_fn(move |_: Request| {
            counter.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, lambda_http::Error>(Response::new(Body::from("ran"))) }
        }));
    let request = http::Request::post("/v1/charges")
        .header("idempotency-key", "h")
        .body(Body::from("{}"))
        .unwrap();
    let response = service.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 503);
    assert!(response.headers().contains_key("retry-after"));
    assert_eq!(handled.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_claim_that_landed_but_whose_answer_was_lost_is_ours() {
    let s = setup().await;
    s.proxy.inject("PutItem", Fault::LoseAnswer, 1);
    let outcome = s
        .engine
        .execute(&attempt("k"), charge(&s.runs, 100))
        .await
        .expect("the SDK's retry finds our own claim, not someone else's in-progress record");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    assert_eq!(s.runs.load(Ordering::SeqCst), 1);
    assert_eq!(s.proxy.injected().get("lose_answer"), Some(&1));
    assert_eq!(
        s.calls.by_operation().get("PutItem"),
        Some(&1),
        "one logical call, retried inside the SDK"
    );
}

#[tokio::test]
async fn a_completion_that_landed_but_whose_answer_was_lost_is_ours() {
    let s = setup().await;
    s.proxy.inject("UpdateItem", Fault::LoseAnswer, 1);
    let first = s
        .engine
        .execute(&attempt("k"), charge(&s.runs, 100))
        .await
        .expect("completed");
    assert_eq!(
        first.kind(),
        OutcomeKind::Fresh,
        "not reported as a lost lease"
    );
    let replay = s
        .engine
        .execute(&attempt("k"), charge(&s.runs, 100))
        .await
        .expect("replay");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value(), first.value());
    assert_eq!(s.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_release_that_landed_but_whose_answer_was_lost_leaves_the_key_free() {
    let s = setup().await;
    s.proxy.inject("DeleteItem", Fault::LoseAnswer, 1);
    let failed = s
        .engine
        .execute(&attempt("k"), || async { Err::<Charge, _>(Declined) })
        .await;
    assert!(
        matches!(failed, Err(Error::Operation(Declined))),
        "{failed:?}"
    );
    assert_eq!(s.proxy.injected().get("lose_answer"), Some(&1));
    let retry = s
        .engine
        .execute(&attempt("k"), charge(&s.runs, 100))
        .await
        .expect("free to run");
    assert_eq!(retry.kind(), OutcomeKind::Fresh);
}

#[tokio::test]
async fn a_transaction_that_landed_but_whose_answer_was_lost_commits_once() {
    let direct = support::client();
    let charges = support::create_table_with(&direct, "charges", "id", None).await;
    let s = setup().await;
    s.proxy.inject("TransactWriteItems", Fault::LoseAnswer, 1);
    let write = TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name(&charges)
                .item("id", AttributeValue::S("ch_1".into()))
                .condition_expression("attribute_not_exists(id)")
                .build()
                .unwrap(),
        )
        .build();
    let outcome = s
        .engine
        .execute_transactional(&attempt("k"), || async move {
            Ok::<_, Declined>((
                Charge {
                    id: "ch_1".into(),
                    amount: 100,
                },
                vec![write],
            ))
        })
        .await
        .expect("the retried transaction (same client request token) succeeds");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    let items = direct
        .scan()
        .table_name(&charges)
        .send()
        .await
        .unwrap()
        .count;
    assert_eq!(items, 1);
}

#[tokio::test]
async fn a_completion_failing_transiently_is_retried() {
    let s = setup().await;
    s.proxy.inject("UpdateItem", Fault::ServerError, 1);
    s.proxy.inject("UpdateItem", Fault::Throttle, 1);
    let outcome = s
        .engine
        .execute(&attempt("k"), charge(&s.runs, 100))
        .await
        .expect("retried");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
}

#[tokio::test]
async fn a_completion_failing_for_good_still_returns_the_value_and_the_lease_expires() {
    let s = setup().await;
    s.proxy.always("UpdateItem", Fault::Throttle);
    let outcome = s
        .engine
        .execute(
            &attempt("k").deadline_ms(s.clock_now() + 30_000),
            charge(&s.runs, 100),
        )
        .await
        .expect("the caller gets its value");
    assert_eq!(outcome.kind(), OutcomeKind::NotRecorded);
    assert_eq!(outcome.value().id, "ch_1");
    s.proxy.heal();

    let busy = s.engine.execute(&attempt("k"), charge(&s.runs, 100)).await;
    assert!(
        matches!(busy, Err(Error::InProgress { .. })),
        "the claim stands until its lease passes: {busy:?}"
    );
    s.clock.advance(Duration::from_secs(31));
    let after = s
        .engine
        .execute(&attempt("k"), charge(&s.runs, 100))
        .await
        .expect("after the lease");
    assert_eq!(after.kind(), OutcomeKind::Fresh);
    assert_eq!(s.runs.load(Ordering::SeqCst), 2);
}

impl Setup {
    fn clock_now(&self) -> u64 {
        lambda_idempotency::Clock::now_ms(&self.clock)
    }
}

#[tokio::test]
async fn an_outage_is_a_clear_error_and_the_store_recovers() {
    let s = setup().await;
    s.proxy.go_down();
    let started = std::time::Instant::now();
    let result = s.engine.execute(&attempt("k"), charge(&s.runs, 100)).await;
    assert_eq!(
        result.map(|o| o.kind()).map_err(|e| e.kind()),
        Err(ErrorKind::StoreUnavailable)
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by the SDK timeouts: {:?}",
        started.elapsed()
    );
    assert_eq!(s.runs.load(Ordering::SeqCst), 0);
    s.proxy.heal();
    let outcome = s
        .engine
        .execute(&attempt("k"), charge(&s.runs, 100))
        .await
        .expect("recovered");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
}

#[tokio::test]
async fn a_dropped_invocation_blocks_duplicates_until_its_lease_passes() {
    let s = setup().await;
    let started = Arc::new(tokio::sync::Notify::new());
    let signal = Arc::clone(&started);
    let engine = s.engine.clone();
    let deadline = s.clock_now() + 20_000;
    // The Lambda timeout: the invocation's future is dropped mid-operation.
    let crashed = tokio::spawn(async move {
        engine
            .execute(
                &Attempt::new("tenant", "k", payload(100)).deadline_ms(deadline),
                || async move {
                    signal.notify_one();
                    std::future::pending::<Result<Charge, Declined>>().await
                },
            )
            .await
    });
    started.notified().await;
    crashed.abort();
    let _ = crashed.await;

    let record = s
        .engine
        .store()
        .get(&s.engine.record_id("tenant", "k"), s.clock_now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        record.status,
        Status::InProgress,
        "the dead invocation's claim stands"
    );
    let busy = s.engine.execute(&attempt("k"), charge(&s.runs, 100)).await;
    assert!(
        matches!(busy, Err(Error::InProgress { retry_after }) if retry_after == Duration::from_secs(20)),
        "{busy:?}"
    );
    s.clock.advance(Duration::from_secs(21));
    let taken_over = s
        .engine
        .execute(&attempt("k"), charge(&s.runs, 100))
        .await
        .expect("taken over");
    assert_eq!(taken_over.kind(), OutcomeKind::Fresh);
    assert_eq!(s.runs.load(Ordering::SeqCst), 1);
}
