//! Lambda Managed Instances, against a Runtime API that serves eight
//! `/next` long-polls at once ([`runtime_api`]): `lambda_http::run_concurrent`
//! and `lambda_runtime::run_concurrent` run the layer and a batch consumer in
//! eight workers of one process, as Lambda runs them, and the invocations
//! that pass their deadline run on (Lambda reports them timed out, and does
//! not stop them). The engines here are built as the README builds them:
//! nothing is set for Managed Instances but what Lambda sets
//! (`AWS_LAMBDA_MAX_CONCURRENCY`).
//!
//! The in-transaction form's tests need the PostgreSQL server `make test`
//! starts (`IDEMPOTENCY_TEST_POSTGRES_URL`).

mod heartbeat_faults;
mod runtime_api;
mod streams;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_http::{service_fn, Body, Request, Response};
use lambda_idempotency::{
    consumers::SqsBatch, http::IdempotencyLayer, Engine, MemoryStore, MAX_CONCURRENCY_VARIABLE,
};
use lambda_runtime::LambdaEvent;
use runtime_api::{Reported, RuntimeApi};
use serde_json::{json, Value};
use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, Mutex, Once},
    task::{Context, Poll},
    time::{Duration, Instant},
};

/// How many invocations one execution environment serves at once.
const WORKERS: usize = 8;

/// The variables Lambda sets in every execution environment, and the one it
/// sets in a Managed Instance; the same for every test of this binary.
fn lambda_environment() {
    static SET: Once = Once::new();
    SET.call_once(|| {
        std::env::set_var("AWS_LAMBDA_FUNCTION_NAME", "managed");
        std::env::set_var("AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "2048");
        std::env::set_var("AWS_LAMBDA_FUNCTION_VERSION", "$LATEST");
        std::env::set_var(MAX_CONCURRENCY_VARIABLE, WORKERS.to_string());
    });
}

/// A runtime started by [`start`]: its workers are tasks of their own; this
/// is what awaits them, kept for as long as the test runs.
type Running = std::pin::Pin<Box<dyn Future<Output = Result<(), lambda_runtime::Error>>>>;

/// Starts a runtime (`run_concurrent`) against `api`. The runtime reads
/// `AWS_LAMBDA_RUNTIME_API` from the environment on its first poll, in which
/// it also spawns its workers: that poll is made here, under a lock, so that
/// tests starting side by side each reach their own stub. Returns once
/// every worker polls.
async fn start<F>(api: &RuntimeApi, run: impl FnOnce() -> F) -> Running
where
    F: Future<Output = Result<(), lambda_runtime::Error>> + 'static,
{
    static STARTING: Mutex<()> = Mutex::new(());
    let running: Running = {
        let _one_at_a_time = STARTING.lock().unwrap_or_else(|e| e.into_inner());
        std::env::set_var("AWS_LAMBDA_RUNTIME_API", api.endpoint());
        let mut running: Running = Box::pin(run());
        let mut context = Context::from_waker(futures::task::noop_waker_ref());
        if let Poll::Ready(ended) = running.as_mut().poll(&mut context) {
            panic!("the runtime ended at once: {ended:?}");
        }
        running
    };
    api.wait_for_workers(WORKERS).await;
    running
}

/// What the handlers did: how many times each key's work ran, and the most
/// runs of one key at the same time.
#[derive(Default)]
struct Runs {
    started: HashMap<String, usize>,
    running: HashMap<String, usize>,
    most_at_once: HashMap<String, usize>,
}

#[derive(Clone, Default)]
struct Ledger(Arc<Mutex<Runs>>);

impl Ledger {
    fn begin(&self, key: &str) {
        let mut runs = self.0.lock().expect("not poisoned");
        *runs.started.entry(key.to_owned()).or_default() += 1;
        let running = runs.running.entry(key.to_owned()).or_default();
        *running += 1;
        let now = *running;
        let most = runs.most_at_once.entry(key.to_owned()).or_default();
        *most = (*most).max(now);
    }

    fn end(&self, key: &str) {
        let mut runs = self.0.lock().expect("not poisoned");
        *runs.running.get_mut(key).expect("began") -= 1;
    }

    fn started(&self, key: &str) -> usize {
        let runs = self.0.lock().expect("not poisoned");
        runs.started.get(key).copied().unwrap_or(0)
    }

    fn most_at_once(&self, key: &str) -> usize {
        let runs = self.0.lock().expect("not poisoned");
        runs.most_at_once.get(key).copied().unwrap_or(0)
    }
}

/// An API Gateway HTTP API event: `POST /v1/charges` with `key`, whose
/// handler works for `work`.
fn charge_event(key: &str, work: Duration) -> Value {
    json!({
        "version": "2.0",
        "routeKey": "POST /v1/charges",
        "rawPath": "/v1/charges",
        "rawQueryString": "",
        "headers": {
            "content-type": "application/json",
            "host": "abc123.execute-api.eu-west-1.amazonaws.com",
            "idempotency-key": key,
        },
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abc123",
            "domainName": "abc123.execute-api.eu-west-1.amazonaws.com",
            "domainPrefix": "abc123",
            "http": {
                "method": "POST",
                "path": "/v1/charges",
                "protocol": "HTTP/1.1",
                "sourceIp": "203.0.113.7",
                "userAgent": "test"
            },
            "requestId": format!("request-{key}"),
            "routeKey": "POST /v1/charges",
            "stage": "$default",
            "time": "29/Nov/2026:09:30:00 +0000",
            "timeEpoch": 1795167000000u64
        },
        "isBase64Encoded": false,
        "body": json!({ "amount": 1250, "work_ms": work.as_millis() as u64 }).to_string(),
    })
}

/// The README's function, under `lambda_http::run_concurrent`: the layer
/// over a handler that works as long as its request says, recording its
/// runs in `ledger`.
async fn start_http(api: &RuntimeApi, engine: Engine<MemoryStore>, ledger: &Ledger) -> Running {
    start_layer(api, IdempotencyLayer::new(engine), ledger).await
}

/// [`start_http`] with any layer, on any store.
async fn start_layer<St: lambda_idempotency::store::Store>(
    api: &RuntimeApi,
    layer: IdempotencyLayer<St>,
    ledger: &Ledger,
) -> Running {
    let ledger = ledger.clone();
    let handler = service_fn(move |request: Request| {
        let ledger = ledger.clone();
        async move {
            let key = request
                .headers()
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let body: Value = serde_json::from_slice(request.body().as_ref()).unwrap_or_default();
            let work = Duration::from_millis(body["work_ms"].as_u64().unwrap_or(0));
            ledger.begin(&key);
            tokio::time::sleep(work).await;
            ledger.end(&key);
            let run = ledger.started(&key);
            Ok::<_, lambda_http::Error>(
                Response::builder()
                    .status(201)
                    .header("content-type", "application/json")
                    .body(Body::from(json!({ "key": key, "run": run }).to_string()))
                    .expect("a response"),
            )
        }
    });
    let service = tower::ServiceBuilder::new().layer(layer).service(handler);
    start(api, move || lambda_http::run_concurrent(service)).await
}

/// The status of an HTTP API response Lambda reported, and whether it was a
/// replay; `None` for a time-out.
fn status_of(reported: &Reported) -> Option<(u64, bool)> {
    match reported {
        Reported::Response(response) => Some((
            response["statusCode"].as_u64().expect("a status"),
            response["headers"]["idempotent-replayed"] == "true",
        )),
        Reported::Error(error) => panic!("the function failed: {error}"),
        Reported::TimedOut => None,
        Reported::Streamed(_) => panic!("a streamed response where none streams"),
    }
}

fn engine() -> Engine<MemoryStore> {
    lambda_environment();
    Engine::builder(MemoryStore::new()).build()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_serve_eight_invocations_at_once_and_twenty_duplicates_run_once() {
    let api = RuntimeApi::start().await;
    let ledger = Ledger::default();
    let engine = engine();
    assert!(
        engine.has_heartbeat(),
        "on by default in a Managed Instance"
    );
    let _runtime = start_http(&api, engine, &ledger).await;

    // Eight one-second handlers of eight keys finish together: eight
    // workers, one process.
    let began = Instant::now();
    let answers = futures::future::join_all((0..WORKERS).map(|n| {
        api.invoke(
            charge_event(&format!("parallel-{n}"), Duration::from_secs(1)),
            Duration::from_secs(10),
        )
    }))
    .await;
    let took = began.elapsed();
    for answer in &answers {
        assert_eq!(status_of(answer), Some((201, false)));
    }
    assert!(
        took < Duration::from_secs(WORKERS as u64),
        "the eight ran side by side, not one after another ({took:?})"
    );

    // Twenty invocations of one key: one run; the others are told it is in
    // progress (409), or get the replay once it completed.
    let answers = futures::future::join_all((0..20).map(|_| {
        api.invoke(
            charge_event("twenty", Duration::from_millis(300)),
            Duration::from_secs(10),
        )
    }))
    .await;
    let statuses: Vec<_> = answers
        .iter()
        .map(|a| status_of(a).expect("answered"))
        .collect();
    assert_eq!(ledger.started("twenty"), 1, "{statuses:?}");
    assert_eq!(
        statuses.iter().filter(|s| **s == (201, false)).count(),
        1,
        "{statuses:?}"
    );
    assert!(
        statuses
            .iter()
            .all(|s| *s == (201, false) || *s == (201, true) || s.0 == 409),
        "{statuses:?}"
    );
}

/// The case: a handler outlives its 1 s deadline (Lambda reports the
/// time-out and lets it run), and the retry comes 0.3 s after the deadline
/// while it still runs: to another worker of the same process, or, given
/// `elsewhere`, to another execution environment (a runtime and an engine
/// of its own, on the same store). The answers to a retry then and to one
/// after the first run has ended.
async fn late_first_run_and_its_retry(
    engine: Engine<MemoryStore>,
    elsewhere: Option<Engine<MemoryStore>>,
) -> (Ledger, Vec<Option<(u64, bool)>>) {
    let here = RuntimeApi::start().await;
    let ledger = Ledger::default();
    let _here = start_http(&here, engine, &ledger).await;
    let there = match elsewhere {
        Some(engine) => {
            let api = RuntimeApi::start().await;
            let running = start_http(&api, engine, &ledger).await;
            Some((api, running))
        }
        None => None,
    };
    let retried = there.as_ref().map_or(&here, |(api, _)| api);
    let key = "outlives-its-deadline";
    let work = Duration::from_millis(2_500);
    let first = here.invoke(charge_event(key, work), Duration::from_secs(1));
    let retries = async {
        tokio::time::sleep(Duration::from_millis(1_300)).await;
        let during = retried
            .invoke(charge_event(key, work), Duration::from_secs(1))
            .await;
        // After the first run has ended (2.5 s) and completed its record.
        tokio::time::sleep(Duration::from_millis(1_700)).await;
        let after = retried
            .invoke(charge_event(key, work), Duration::from_secs(5))
            .await;
        (during, after)
    };
    let (first, (during, after)) = tokio::join!(first, retries);
    assert!(
        matches!(first, Reported::TimedOut),
        "Lambda reports the first invocation timed out: {first:?}"
    );
    // Let a second run, if one started, finish before counting.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        here.late_responses() >= 1,
        "the first run's answer came after its deadline"
    );
    let during = status_of(&during);
    let after = status_of(&after).expect("answered");
    (ledger, vec![during, Some(after)])
}

/// One run: the retry during it is in progress, the one after replays.
fn assert_ran_once(ledger: &Ledger, answers: &[Option<(u64, bool)>]) {
    let key = "outlives-its-deadline";
    assert_eq!(ledger.started(key), 1, "one run: {answers:?}");
    assert_eq!(ledger.most_at_once(key), 1);
    assert_eq!(
        answers[0].map(|a| a.0),
        Some(409),
        "in progress while the first runs on: {answers:?}"
    );
    assert_eq!(
        answers[1],
        Some((201, true)),
        "then the first run's response, replayed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invocation_past_its_deadline_never_runs_beside_its_retry() {
    let (ledger, answers) = late_first_run_and_its_retry(engine(), None).await;
    assert_ran_once(&ledger, &answers);
}

/// The retry reaches another execution environment (another process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_in_another_execution_environment_never_runs_beside_the_late_first_run() {
    let store = MemoryStore::new();
    lambda_environment();
    let (here, elsewhere) = (
        Engine::builder(store.clone()).build(),
        Engine::builder(store).build(),
    );
    let (ledger, answers) = late_first_run_and_its_retry(here, Some(elsewhere)).await;
    assert_ran_once(&ledger, &answers);
}

/// The control: the lease ending at the deadline (the heartbeat turned off
/// by hand) lets the retry run beside the late first run. This is what the
/// default prevents, and what the test above would see if it did not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_heartbeat_the_retry_runs_beside_the_late_first_run() {
    lambda_environment();
    let engine = Engine::builder(MemoryStore::new()).heartbeat(false).build();
    let (ledger, answers) = late_first_run_and_its_retry(engine, None).await;
    let key = "outlives-its-deadline";
    assert_eq!(ledger.started(key), 2, "{answers:?}");
    assert_eq!(ledger.most_at_once(key), 2, "side by side");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invocations_with_different_deadlines_each_keep_their_own_claim() {
    let api = RuntimeApi::start().await;
    let ledger = Ledger::default();
    let _runtime = start_http(&api, engine(), &ledger).await;
    let work = Duration::from_millis(1_800);
    // One key's invocation has 1 s, the other's 4 s; both work 1.8 s.
    let short = api.invoke(charge_event("short-deadline", work), Duration::from_secs(1));
    let long = api.invoke(charge_event("long-deadline", work), Duration::from_secs(4));
    let retries = async {
        tokio::time::sleep(Duration::from_millis(1_300)).await;
        futures::future::join(
            api.invoke(charge_event("short-deadline", work), Duration::from_secs(1)),
            api.invoke(charge_event("long-deadline", work), Duration::from_secs(1)),
        )
        .await
    };
    let (short, long, (short_retry, long_retry)) = tokio::join!(short, long, retries);
    assert!(matches!(short, Reported::TimedOut), "{short:?}");
    assert_eq!(status_of(&long), Some((201, false)));
    assert_eq!(status_of(&short_retry).map(|s| s.0), Some(409));
    assert_eq!(status_of(&long_retry).map(|s| s.0), Some(409));
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    for key in ["short-deadline", "long-deadline"] {
        assert_eq!(ledger.started(key), 1, "{key}");
        let replay = api
            .invoke(charge_event(key, work), Duration::from_secs(5))
            .await;
        assert_eq!(status_of(&replay), Some((201, true)), "{key}");
    }
}

/// An SQS message as Lambda delivers it.
fn message(id: &str, body: &str) -> SqsMessage {
    let mut message = SqsMessage::default();
    message.message_id = Some(id.to_owned());
    message.receipt_handle = Some(format!("handle-{id}"));
    message.body = Some(body.to_owned());
    message.event_source = Some("aws:sqs".to_owned());
    message.event_source_arn = Some("arn:aws:sqs:eu-west-1:123456789012:receipts".to_owned());
    message.aws_region = Some("eu-west-1".to_owned());
    message
}

fn sqs_event(messages: &[(&str, u64)]) -> Value {
    let mut event = SqsEvent::default();
    event.records = messages
        .iter()
        .map(|(id, work_ms)| message(id, &json!({ "work_ms": work_ms }).to_string()))
        .collect();
    serde_json::to_value(event).expect("an event")
}

fn failed_ids(reported: &Reported) -> Vec<String> {
    let Reported::Response(response) = reported else {
        panic!("the batch answered: {reported:?}");
    };
    let response: SqsBatchResponse = serde_json::from_value(response.clone()).expect("a response");
    let mut ids: Vec<_> = response
        .batch_item_failures
        .into_iter()
        .map(|failure| failure.item_identifier)
        .collect();
    ids.sort();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sqs_batch_past_its_deadline_is_not_run_again_by_its_redelivery() {
    let api = RuntimeApi::start().await;
    let ledger = Ledger::default();
    let batch = SqsBatch::new(engine(), "receipts/managed");
    let handled = ledger.clone();
    let function = lambda_runtime::service_fn(move |event: LambdaEvent<SqsEvent>| {
        let (batch, ledger) = (batch.clone(), handled.clone());
        async move {
            let handler = |message: SqsMessage| {
                let ledger = ledger.clone();
                async move {
                    let id = message.message_id.clone().unwrap_or_default();
                    let body: Value =
                        serde_json::from_str(message.body.as_deref().unwrap_or("{}"))?;
                    ledger.begin(&id);
                    tokio::time::sleep(Duration::from_millis(
                        body["work_ms"].as_u64().unwrap_or(0),
                    ))
                    .await;
                    ledger.end(&id);
                    Ok::<_, serde_json::Error>(id)
                }
            };
            Ok::<SqsBatchResponse, lambda_runtime::Error>(batch.process(event, handler).await?)
        }
    });
    let _runtime = start(&api, move || lambda_runtime::run_concurrent(function)).await;

    // A quick message and a slow one; the batch's deadline is 1 s, the
    // slow message works 2.5 s. SQS delivers the batch again at 1.3 s (its
    // visibility timeout set too short), to another worker.
    let batch = [("quick", 100), ("slow", 2_500)];
    let first = api.invoke(sqs_event(&batch), Duration::from_secs(1));
    let redelivered = async {
        tokio::time::sleep(Duration::from_millis(1_300)).await;
        api.invoke(sqs_event(&batch), Duration::from_secs(1)).await
    };
    let (first, redelivered) = tokio::join!(first, redelivered);
    assert!(matches!(first, Reported::TimedOut), "{first:?}");
    assert_eq!(
        failed_ids(&redelivered),
        ["slow"],
        "the quick one replays; the slow one is in progress and comes again"
    );
    tokio::time::sleep(Duration::from_millis(1_700)).await;
    let again = api.invoke(sqs_event(&batch), Duration::from_secs(5)).await;
    assert!(failed_ids(&again).is_empty(), "both replay once done");
    for id in ["quick", "slow"] {
        assert_eq!(ledger.started(id), 1, "{id}");
    }
    assert_eq!(ledger.most_at_once("slow"), 1);
}

/// The in-transaction form under `lambda_http::run_concurrent`: eight
/// invocations of eight keys, each handler two seconds inside its
/// transaction, with a pool of `pool` connections. Their statuses.
async fn eight_in_transaction(pool: usize) -> Vec<u64> {
    use lambda_idempotency::store::postgres::{PgTransaction, PostgresStore, TransactionLimits};
    lambda_environment();
    let url = std::env::var("IDEMPOTENCY_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "IDEMPOTENCY_TEST_POSTGRES_URL is not set: run with `make test`, or \
             `scripts/with-postgres cargo test --test managed_instances`"
        )
    });
    let table = format!("managed_{}_{pool}", std::process::id());
    let store = PostgresStore::connect(&url, table, pool).expect("pool");
    store.create_table().await.expect("create table");
    let layer = IdempotencyLayer::new(Engine::builder(store).build())
        .in_transaction(TransactionLimits::new().time_limit(Duration::from_secs(8)));
    let handler = service_fn(|request: Request| async move {
        let transaction = request
            .extensions()
            .get::<PgTransaction>()
            .cloned()
            .expect("the layer hands the handler its transaction");
        transaction.batch_execute("SELECT pg_sleep(2)").await?;
        Ok::<_, lambda_http::Error>(
            Response::builder()
                .status(201)
                .body(Body::from("{}"))
                .expect("a response"),
        )
    });
    let service = tower::ServiceBuilder::new().layer(layer).service(handler);
    let api = RuntimeApi::start().await;
    let _runtime = start(&api, move || lambda_http::run_concurrent(service)).await;
    let answers = futures::future::join_all((0..WORKERS).map(|n| {
        api.invoke(
            charge_event(&format!("pool-{pool}-{n}"), Duration::ZERO),
            Duration::from_secs(12),
        )
    }))
    .await;
    answers
        .iter()
        .map(|answer| status_of(answer).expect("answered").0)
        .collect()
}

/// With the pool the docs ask for (one connection per invocation served at
/// once), the eight handlers run side by side and all answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_transaction_form_with_the_documented_pool_serves_every_invocation() {
    let statuses = eight_in_transaction(WORKERS).await;
    assert_eq!(statuses, [201; WORKERS]);
}

/// The control: with a pool of two (the advice for a Lambda function of
/// the default kind), they run two at a time, and those still waiting for
/// a connection after the pool's 5 s wait answer 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_transaction_form_with_a_pool_of_two_turns_invocations_away() {
    let statuses = eight_in_transaction(2).await;
    assert!(statuses.contains(&503), "{statuses:?}");
    assert!(statuses.contains(&201), "{statuses:?}");
}
