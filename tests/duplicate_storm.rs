//! Twenty duplicates of one request in one process, through the HTTP layer
//! with `wait_for_result`, on DynamoDB Local: they wait on the first run in
//! memory (no DynamoDB call of theirs) and replay it as it completes. Beside
//! them, the same storm spread over twenty processes (an engine each, as
//! every duplicate was before the engine kept its runs), which polls the
//! store. Prints the calls and the time from the first's answer to the
//! last replay of each (BENCHMARKS.md, "Counted, not timed").
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

mod support;

use axum::{body::Body, routing::post, Router};
use http_body_util::BodyExt;
use lambda_idempotency::{
    http::{IdempotencyLayer, REPLAYED_HEADER},
    DynamoDbStore, Engine,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};
use tower::ServiceExt;

const DUPLICATES: usize = 20;
const WORK: Duration = Duration::from_millis(1_000);

/// `POST /v1/charges`, a second of work, behind the layer of `engine`.
fn app(engine: Engine<DynamoDbStore>, runs: &Arc<AtomicUsize>) -> Router {
    let runs = Arc::clone(runs);
    Router::new()
        .route(
            "/v1/charges",
            post(move || {
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(WORK).await;
                    (axum::http::StatusCode::CREATED, "{\"id\":\"ch_1\"}")
                }
            }),
        )
        .layer(
            IdempotencyLayer::new(engine)
                .shared_scope()
                .wait_for_result(Duration::from_secs(10)),
        )
}

async fn charge(app: Router, key: &str) -> (u16, bool, Instant) {
    let request = axum::http::Request::post("/v1/charges")
        .header("idempotency-key", key)
        .header("content-type", "application/json")
        .body(Body::from("{\"amount\":1250}"))
        .expect("request");
    let response = app.oneshot(request).await.expect("infallible");
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key(REPLAYED_HEADER);
    let _ = response.into_body().collect().await.expect("body");
    (status, replayed, Instant::now())
}

/// What a storm came to: DynamoDB calls (the first's included), the runs
/// of the handler, and when the first answered and the last replay came.
struct Storm {
    calls: u64,
    runs: usize,
    first_done: Instant,
    last_replay: Instant,
}

/// The first request, then, once it runs, twenty duplicates: through one
/// engine (`apps.len() == 1`) or one engine each.
async fn storm(apps: Vec<Router>, runs: Arc<AtomicUsize>, key: &str) -> Storm {
    let first = {
        let (app, key) = (apps[0].clone(), key.to_owned());
        tokio::spawn(async move { charge(app, &key).await })
    };
    while runs.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let duplicates: Vec<_> = (0..DUPLICATES)
        .map(|n| {
            let app = apps[n % apps.len()].clone();
            let key = key.to_owned();
            tokio::spawn(async move { charge(app, &key).await })
        })
        .collect();
    let (status, replayed, first_done) = first.await.expect("joined");
    assert_eq!((status, replayed), (201, false));
    let mut last_replay = first_done;
    for duplicate in duplicates {
        let (status, replayed, at) = duplicate.await.expect("joined");
        assert_eq!((status, replayed), (201, true), "every duplicate replays");
        last_replay = last_replay.max(at);
    }
    Storm {
        calls: 0,
        runs: runs.load(Ordering::SeqCst),
        first_done,
        last_replay,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_duplicates_in_one_process_wait_in_memory_and_replay_as_the_first_completes() {
    let (client, counter) = support::counted_client();
    let table = support::create_idempotency_table(&client).await;

    // One process.
    let runs = Arc::new(AtomicUsize::new(0));
    let engine = Engine::builder(DynamoDbStore::new(client.clone(), &table)).build();
    counter.reset();
    let one = storm(vec![app(engine, &runs)], runs, "storm-one-process").await;
    let one = Storm {
        calls: counter.total(),
        ..one
    };
    let one_by_operation = counter.by_operation();

    // Twenty processes: the duplicates find the claim in the store and
    // poll it, as every duplicate did before.
    let runs = Arc::new(AtomicUsize::new(0));
    let apps = (0..DUPLICATES)
        .map(|_| {
            let engine = Engine::builder(DynamoDbStore::new(client.clone(), &table)).build();
            app(engine, &runs)
        })
        .collect();
    counter.reset();
    let many = storm(apps, runs, "storm-many-processes").await;
    let many = Storm {
        calls: counter.total(),
        ..many
    };

    let ms = |storm: &Storm| (storm.last_replay - storm.first_done).as_millis();
    println!(
        "20 duplicates, one process: {} DynamoDB calls in all ({one_by_operation:?}), the last replay {} ms after the first's answer",
        one.calls,
        ms(&one)
    );
    println!(
        "20 duplicates, twenty processes: {} DynamoDB calls in all, the last replay {} ms after the first's answer",
        many.calls,
        ms(&many)
    );
    assert_eq!((one.runs, many.runs), (1, 1));
    assert_eq!(
        one.calls, 2,
        "one claim and one completion, nothing for the duplicates: {one_by_operation:?}"
    );
    assert!(
        many.calls > one.calls + DUPLICATES as u64,
        "in other processes each duplicate claims, and polls"
    );
}
