//! The guarantees under faults, against DynamoDB Local behind a
//! fault-injecting proxy: throttling, 5xx, writes whose answer is lost (and
//! that the SDK retries), outages, a killed and restarted DynamoDB Local,
//! and invocations that die mid-flight.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

#[path = "support/replays.rs"]
mod replays;
mod support;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use lambda_http::{http, Body, Request, Response};
use lambda_idempotency::{
    http::IdempotencyLayer,
    store::{Status, Store},
    testing::{
        scenarios::{charge, payload, Charge, Declined},
        ManualClock,
    },
    Attempt, DynamoDbStore, Engine, Error, ErrorKind, OutcomeKind, StoreErrorKind,
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
    let service = IdempotencyLayer::new(s.engine.clone())
        .shared_scope()
        .layer(tower::service_fn(move |_: Request| {
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
    let key = attempt("k");
    let (first, replay) =
        replays::sent_twice(|| s.engine.execute(&key, charge(&s.runs, 100))).await;
    assert_eq!(
        first.kind(),
        OutcomeKind::Fresh,
        "not reported as a lost lease"
    );
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

/// A DynamoDB Local of this test's own, to kill and restart.
struct OwnDynamoDbLocal {
    dir: String,
    port: u16,
    child: Option<std::process::Child>,
}

impl OwnDynamoDbLocal {
    async fn start() -> Self {
        let dir = std::env::var("DYNAMODB_LOCAL_DIR")
            .expect("DYNAMODB_LOCAL_DIR is not set: run the tests with `make test` or scripts/with-dynamodb-local");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut own = Self {
            dir,
            port,
            child: None,
        };
        own.spawn().await;
        own
    }

    async fn spawn(&mut self) {
        let child = std::process::Command::new("java")
            .arg(format!(
                "-Djava.library.path={}/DynamoDBLocal_lib",
                self.dir
            ))
            .args([
                "-Xmx256m",
                "-jar",
                &format!("{}/DynamoDBLocal.jar", self.dir),
            ])
            .args([
                "-inMemory",
                "-sharedDb",
                "-disableTelemetry",
                "-port",
                &self.port.to_string(),
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start java");
        self.child = Some(child);
        for _ in 0..300 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("DynamoDB Local did not start on port {}", self.port);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for OwnDynamoDbLocal {
    fn drop(&mut self) {
        self.kill();
    }
}

async fn create_table_at(url: &str) -> String {
    let (client, _) = support::client_via(url);
    support::create_idempotency_table(&client).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamodb_local_killed_and_restarted_mid_run() {
    let mut local = OwnDynamoDbLocal::start().await;
    let table = create_table_at(&local.url()).await;
    let (client, _) = support::client_via(&local.url());
    let engine = Engine::builder(DynamoDbStore::new(client.clone(), table.clone())).build();
    let runs = Arc::new(AtomicUsize::new(0));
    engine
        .execute(&attempt("warm-up"), charge(&runs, 1))
        .await
        .expect("up");

    // Eight clients keep charging while DynamoDB Local dies under them and
    // comes back.
    let phase = Arc::new(AtomicUsize::new(0)); // 0 up, 1 down, 2 restarted
    let ok_by_phase = Arc::new([
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    ]);
    let errors = Arc::new(AtomicUsize::new(0));
    let load: Vec<_> = (0..8)
        .map(|client_id| {
            let (engine, runs, phase, ok_by_phase, errors) = (
                engine.clone(),
                Arc::clone(&runs),
                Arc::clone(&phase),
                Arc::clone(&ok_by_phase),
                Arc::clone(&errors),
            );
            tokio::spawn(async move {
                for i in 0..400u64 {
                    let key = format!("c{client_id}-{i}");
                    let seen = phase.load(Ordering::SeqCst);
                    match engine
                        .execute(&Attempt::new("tenant", &key, payload(i)), charge(&runs, i))
                        .await
                    {
                        Ok(_) => {
                            ok_by_phase[seen].fetch_add(1, Ordering::SeqCst);
                        }
                        Err(Error::Store(_)) => {
                            errors.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(other) => panic!("unexpected error: {other:?}"),
                    }
                    if seen == 2 && ok_by_phase[2].load(Ordering::SeqCst) >= 16 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    while ok_by_phase[0].load(Ordering::SeqCst) < 16 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    phase.store(1, Ordering::SeqCst);
    local.kill();
    match engine
        .execute(&attempt("while-down"), charge(&runs, 1))
        .await
    {
        Err(Error::Store(error)) => {
            assert_eq!(error.kind(), StoreErrorKind::Unavailable);
            assert!(
                error.to_string().contains("DynamoDB PutItem"),
                "a clear error: {error}"
            );
        }
        other => panic!("expected the store to be unavailable, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // In memory: the restarted DynamoDB Local starts empty; recreate the table.
    local.spawn().await;
    support::create_named_table(&client, &table, "id", Some("expiration")).await;
    phase.store(2, Ordering::SeqCst);
    for task in load {
        task.await.expect("no panic in any client");
    }
    let [before, during, after] = &*ok_by_phase;
    let (before, during, after) = (
        before.load(Ordering::SeqCst),
        during.load(Ordering::SeqCst),
        after.load(Ordering::SeqCst),
    );
    let errors = errors.load(Ordering::SeqCst);
    println!("kill/restart: {before} ok before, {during} ok while down, {errors} store errors, {after} ok after");
    assert!(errors > 0, "the outage was seen");
    assert!(after >= 16, "recovered after the restart: {after}");
}
