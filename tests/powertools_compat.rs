//! Powertools compatibility, against records that Powertools for AWS Lambda
//! (Python 3.37, the version `make bench` pins) writes itself through its own
//! `@idempotent` handlers and `idempotent_function` (tests/powertools/), on
//! DynamoDB Local and on redis-server: the completed ones are replayed
//! byte for byte without running the handler, the in-progress ones are
//! refused, the expired and absent ones run.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`, `IDEMPOTENCY_TEST_REDIS_URL` and
//! `.tools/bench-py` (Powertools); `make test` provides them all.

/// The outside review (issue 37): record ids the real Powertools computed
/// for unusual inputs, beside the ones the mode computes.
#[path = "powertools_compat/review.rs"]
mod review;
mod support;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_http::{request::from_str, Body, Request, Response};
use lambda_idempotency::{
    consumers::SqsBatch,
    http::{IdempotencyLayer, REPLAYED_HEADER},
    powertools::{PowertoolsCompat, PowertoolsLayout, PowertoolsRecords},
    store::{redis::RedisStore, Store},
    testing::ManualClock,
    ClaimHandle, Clock, DynamoDbStore, Engine, Takeover,
};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::Value;
use std::{
    path::Path,
    process::Command,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};
use tower::{service_fn, Layer, Service, ServiceExt};

/// The Lambda function name the Powertools function ran as.
const FUNCTION: &str = "pt-fn";
const PYTHON: &str = ".tools/bench-py/bin/python";

/// Runs tests/powertools/write_records.py against `env` and reads its manifest.
fn powertools_writes(env: &[(&str, String)]) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = root.join(PYTHON);
    assert!(
        python.exists(),
        "{PYTHON} is missing: `make .tools/bench-py/.installed` installs Powertools (make test does)"
    );
    let mut command = Command::new(python);
    command
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("PYTHONWARNINGS", "ignore");
    run_writer(command, "write_records.py", env)
}

/// Runs `command` on tests/powertools/`script` (which writes its manifest to
/// the path it is given) with `env`, and reads the manifest.
fn run_writer(mut command: Command, script: &str, env: &[(&str, String)]) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::env::temp_dir().join(format!(
        "powertools-manifest-{script}-{}-{}.json",
        std::process::id(),
        env.len()
    ));
    let status = command
        .arg(root.join("tests/powertools").join(script))
        .arg(&manifest)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("AWS_LAMBDA_FUNCTION_NAME", FUNCTION)
        .status()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    assert!(status.success(), "{script} failed: {status}");
    let text = std::fs::read_to_string(&manifest).expect("read the manifest");
    let _ = std::fs::remove_file(&manifest);
    serde_json::from_str(&text).expect("the manifest is JSON")
}

#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// The Rust function: a handler that counts its runs and answers 200 "rust".
fn layered<St: Store + Clone>(
    engine: Engine<St>,
    compat: PowertoolsCompat,
    runs: &Runs,
) -> impl Service<Request, Response = Response<Body>, Error = lambda_http::Error> {
    let runs = runs.clone();
    let handler = service_fn(move |_request: Request| {
        let runs = runs.clone();
        async move {
            runs.0.fetch_add(1, Ordering::SeqCst);
            Ok::<_, lambda_http::Error>(Response::new(Body::Text("rust".into())))
        }
    });
    IdempotencyLayer::new(engine)
        .powertools(compat)
        .layer(handler)
}

fn compat_for(reader: impl PowertoolsRecords + 'static, handler: &str) -> PowertoolsCompat {
    let compat = PowertoolsCompat::new(reader, FUNCTION, &format!("app.{handler}_handler"));
    match handler {
        "header" => compat
            .event_key_jmespath("headers.\"Idempotency-Key\"")
            .unwrap()
            .payload_validation_jmespath("powertools_json(body)")
            .unwrap(),
        "raw" => compat.event_key_jmespath("body").unwrap(),
        "query" => compat
            .event_key_jmespath("queryStringParameters.order")
            .unwrap(),
        _ => compat
            .event_key_jmespath("powertools_json(body).order_id")
            .unwrap(),
    }
}

fn request(event: &Value) -> Request {
    from_str(&event.to_string()).expect("lambda_http reads the event")
}

/// Every HTTP case of the manifest through the Rust function in
/// compatibility mode.
async fn check_http<St: Store + Clone>(
    store: St,
    reader: impl PowertoolsRecords + Clone + 'static,
    manifest: &Value,
) {
    // Every answer the compatibility mode gives is reported, as the
    // engine's own are (it answers without the engine's run).
    let observer = lambda_idempotency::testing::RecordingObserver::default();
    let engine = Engine::builder(store).observer(observer.clone()).build();
    for case in manifest["http"].as_array().expect("http cases") {
        let reported = observer.answers().len();
        let handler = case["handler"].as_str().unwrap();
        let state = case["state"].as_str().unwrap();
        let what = format!("{handler} handler, {state}");
        let runs = Runs::default();
        let mut service = layered(engine.clone(), compat_for(reader.clone(), handler), &runs);
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request(&case["event"]))
            .await
            .unwrap();
        let body = response.body().as_ref().to_vec();
        match state {
            "completed" if case["powertools_retry"] == "validation_error" => {
                // Powertools itself refuses the retry (its Redis layer drops
                // the validation hash on completion): so does the mode.
                assert_eq!(runs.count(), 0, "{what}: the handler must not run");
                assert_eq!(response.status(), 422, "{what}: as Powertools refuses it");
            }
            "completed" => {
                assert_eq!(case["powertools_retry"], "replayed", "{what}");
                let stored = &case["response"];
                assert_eq!(runs.count(), 0, "{what}: the handler must not run");
                assert_eq!(
                    response.status().as_u16() as u64,
                    stored["statusCode"],
                    "{what}"
                );
                assert_eq!(
                    body,
                    stored["body"].as_str().unwrap().as_bytes(),
                    "{what}: the body Powertools stored, byte for byte"
                );
                for (name, value) in stored["headers"].as_object().unwrap() {
                    assert_eq!(
                        response.headers()[name.as_str()],
                        value.as_str().unwrap(),
                        "{what}: {name}"
                    );
                }
                assert_eq!(response.headers()[REPLAYED_HEADER], "true", "{what}");
                assert_eq!(
                    observer.answers()[reported..],
                    [("http", "replay")],
                    "{what}"
                );
            }
            "in_progress" => {
                assert_eq!(
                    observer.answers()[reported..],
                    [("http", "in_progress")],
                    "{what}"
                );
                assert_eq!(runs.count(), 0, "{what}: the handler must not run");
                assert_eq!(
                    response.status(),
                    409,
                    "{what}: {}",
                    String::from_utf8_lossy(&body)
                );
                let retry_after: u64 = response.headers()["retry-after"]
                    .to_str()
                    .unwrap()
                    .parse()
                    .unwrap();
                assert!(
                    (1..=600).contains(&retry_after),
                    "{what}: Retry-After {retry_after}"
                );
            }
            "expired" | "absent" => {
                assert_eq!(runs.count(), 1, "{what}: the handler runs");
                assert_eq!(response.status(), 200, "{what}");
                assert_eq!(body, b"rust", "{what}");
                assert!(response.headers().get(REPLAYED_HEADER).is_none(), "{what}");
            }
            other => panic!("unknown state {other}"),
        }

        if handler == "header" && state == "completed" {
            // The same key with another body: Powertools' payload validation
            // was on, so this is a reused key, never the stored response.
            let mut other = case["event"].clone();
            other["body"] = Value::String("{\"order_id\": \"x\", \"amount\": 1}".into());
            let response = service
                .ready()
                .await
                .unwrap()
                .call(request(&other))
                .await
                .unwrap();
            assert_eq!(response.status(), 422, "{what}, another body");
            assert_eq!(runs.count(), 0, "{what}, another body");
        }
    }
}

/// The edge cases of the manifest, each completed by Powertools: the Rust
/// function (its key header optional, as during a migration) replays each
/// without running its handler. Each missed before the mode read payloads
/// as Python does, bodies as the event carried them, plain HTTP API
/// responses, and keyless requests.
async fn check_edge<St: Store + Clone>(
    engine: Engine<St>,
    reader: impl PowertoolsRecords + Clone + 'static,
    manifest: &Value,
) {
    let cases = manifest["edge"].as_array().expect("edge cases");
    assert_eq!(cases.len(), 11, "every edge case was written");
    let mut missed = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let handler = case["handler"].as_str().unwrap();
        let runs = Runs::default();
        let layer = IdempotencyLayer::new(engine.clone())
            .require_key(false)
            .powertools(compat_for(reader.clone(), handler));
        let counted = runs.clone();
        let mut service = layer.layer(service_fn(move |_request: Request| {
            let runs = counted.clone();
            async move {
                runs.0.fetch_add(1, Ordering::SeqCst);
                Ok::<_, lambda_http::Error>(Response::new(Body::Text("rust".into())))
            }
        }));
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request(&case["event"]))
            .await
            .unwrap();
        let body = response.body().as_ref().to_vec();
        let stored = &case["response"];
        if case["powertools_retry"] == "validation_error" {
            if runs.count() != 0 || response.status() != 422 {
                missed.push(format!(
                    "{name}: ran {} time(s), answered {} where Powertools refused the retry",
                    runs.count(),
                    response.status()
                ));
            }
            continue;
        }
        let replayed = if handler == "plain" {
            // No statusCode: API Gateway's payload format 2.0 served the
            // dict as 200 JSON, and so does the replay.
            response.status() == 200
                && response.headers()["content-type"] == "application/json"
                && serde_json::from_slice::<Value>(&body).ok().as_ref() == Some(stored)
        } else if handler == "text" {
            // A string: served as its text (not its JSON), 200 JSON.
            response.status() == 200
                && response.headers()["content-type"] == "application/json"
                && body == stored.as_str().unwrap().as_bytes()
        } else {
            response.status().as_u16() as u64 == stored["statusCode"]
                && body == stored["body"].as_str().unwrap().as_bytes()
        };
        if runs.count() != 0 || !replayed || response.headers().get(REPLAYED_HEADER).is_none() {
            missed.push(format!(
                "{name}: ran {} time(s), answered {} {:?}",
                runs.count(),
                response.status(),
                String::from_utf8_lossy(&body)
            ));
        }
    }
    assert!(
        missed.is_empty(),
        "answered otherwise than Powertools: {missed:#?}"
    );
}

/// Issue 37, item 3: a record Powertools left in progress without
/// `in_progress_expiration` (no Lambda context registered; the process
/// killed inside the handler) is held while the old invocation may live,
/// then taken over, and the handler is told: an HTTP request through the
/// layer (`Takeover` in its extensions) and an SQS record through the
/// batch (`ClaimHandle::current`). The compat's clock is moved past 15
/// minutes instead of waiting for them.
async fn check_unleased<St: Store + Clone>(
    engine: Engine<St>,
    reader: impl PowertoolsRecords,
    case: &Value,
    compat: impl Fn(Arc<dyn Clock>) -> PowertoolsCompat,
) {
    let what = format!(
        "{} in progress without in_progress_expiration",
        case["surface"]
    );
    let id = case["powertools_id"].as_str().expect("an id");
    let written = reader
        .read_powertools_record(id, &PowertoolsLayout::default())
        .await
        .unwrap()
        .expect("the record Powertools wrote");
    assert_eq!(
        (written.status.as_str(), written.in_progress_expiration_ms),
        ("INPROGRESS", None),
        "{what}"
    );
    // The first of each pair at the time of the write, the second 16
    // minutes later.
    let now = ManualClock::starting_now();
    let later = ManualClock::starting_now();
    later.advance(Duration::from_secs(16 * 60));
    if case["surface"] == "sqs" {
        let event: SqsEvent = serde_json::from_value(case["event"].clone()).expect("an SQS event");
        let view = serde_json::to_value(&event.records[0]).unwrap();
        assert_eq!(
            compat(Arc::new(now.clone())).record_id(&view).as_deref(),
            case["powertools_id"].as_str(),
            "{what}: the id Powertools computed"
        );
        for (clock, failed, told) in [(&now, 1, None), (&later, 0, Some(true))] {
            let told_in = Arc::new(Mutex::new(None));
            let batch = SqsBatch::new(engine.clone(), "receipts-unleased")
                .powertools(compat(Arc::new(clock.clone())));
            let response = batch
                .process(
                    LambdaEvent::new(event.clone(), Context::default()),
                    |_: SqsMessage| {
                        let told_in = Arc::clone(&told_in);
                        async move {
                            let takeover =
                                ClaimHandle::current().and_then(|claim| claim.takeover());
                            *told_in.lock().unwrap() = Some(takeover.is_some());
                            Ok::<_, String>(())
                        }
                    },
                )
                .await
                .unwrap();
            assert_eq!(response.batch_item_failures.len(), failed, "{what}");
            assert_eq!(*told_in.lock().unwrap(), told, "{what}");
        }
        return;
    }
    let event = &case["event"];
    assert_eq!(
        compat(Arc::new(now.clone()))
            .record_id(&serde_json::json!({ "body": event["body"] }))
            .as_deref(),
        case["powertools_id"].as_str(),
        "{what}: the id Powertools computed"
    );
    for (clock, status, told) in [(&now, 409, None), (&later, 200, Some(true))] {
        let told_in = Arc::new(Mutex::new(None));
        let seen = Arc::clone(&told_in);
        let service = IdempotencyLayer::new(engine.clone())
            .powertools(compat(Arc::new(clock.clone())))
            .layer(service_fn(move |request: Request| {
                *seen.lock().unwrap() = Some(request.extensions().get::<Takeover>().is_some());
                async { Ok::<_, lambda_http::Error>(Response::new(Body::Text("rust".into()))) }
            }));
        let response = service.oneshot(request(event)).await.unwrap();
        assert_eq!(response.status(), status, "{what}");
        assert_eq!(*told_in.lock().unwrap(), told, "{what}: told it takes over");
    }
}

/// Issue 37, item 4: records Powertools keyed on
/// `queryStringParameters.order`, for a REST API event (a repeated name:
/// API Gateway kept its last value) and an HTTP API one (values joined
/// with commas), replayed through the layer without running the handler.
async fn check_query<St: Store + Clone>(
    engine: Engine<St>,
    reader: impl PowertoolsRecords + Clone + 'static,
    manifest: &Value,
) {
    let cases = manifest["query"].as_array().expect("query cases");
    assert_eq!(cases.len(), 2);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let runs = Runs::default();
        let mut service = layered(engine.clone(), compat_for(reader.clone(), "query"), &runs);
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request(&case["event"]))
            .await
            .unwrap();
        let stored = &case["response"];
        assert_eq!(runs.count(), 0, "{name}: the handler must not run");
        assert_eq!(
            response.status().as_u16() as u64,
            stored["statusCode"],
            "{name}"
        );
        assert_eq!(
            response.body().as_ref(),
            stored["body"].as_str().unwrap().as_bytes(),
            "{name}"
        );
        assert_eq!(response.headers()[REPLAYED_HEADER], "true", "{name}");
    }
}

/// The compat of the Python function's handlers left in progress without a
/// Lambda context, on `clock`.
fn unleased_compat(
    reader: impl PowertoolsRecords + Clone + 'static,
    surface: &str,
) -> impl Fn(Arc<dyn Clock>) -> PowertoolsCompat {
    let surface = surface.to_owned();
    move |clock| {
        let (handler, expression) = match surface.as_str() {
            "sqs" => ("app.process_record", "messageId"),
            _ => ("app.charge_unleased", "powertools_json(body).order_id"),
        };
        PowertoolsCompat::new(reader.clone(), FUNCTION, handler)
            .event_key_jmespath(expression)
            .unwrap()
            .clock(clock)
    }
}

/// Every unleased and query case of the Python manifest.
async fn check_unleased_and_query<St: Store + Clone>(
    engine: Engine<St>,
    reader: impl PowertoolsRecords + Clone + 'static,
    manifest: &Value,
) {
    let cases = manifest["unleased"].as_array().expect("unleased cases");
    assert_eq!(cases.len(), 2);
    for case in cases {
        let surface = case["surface"].as_str().unwrap();
        check_unleased(
            engine.clone(),
            reader.clone(),
            case,
            unleased_compat(reader.clone(), surface),
        )
        .await;
    }
    check_query(engine, reader, manifest).await;
}

/// The SQS batch of the manifest through `SqsBatch` in compatibility mode.
async fn check_sqs<St: Store + Clone>(
    engine: Engine<St>,
    reader: impl PowertoolsRecords + Clone + 'static,
    manifest: &Value,
) {
    let sqs = &manifest["sqs"];
    let event: SqsEvent = serde_json::from_value(sqs["event"].clone()).expect("an SQS event");
    let compat = PowertoolsCompat::new(reader, FUNCTION, "app.process_record")
        .event_key_jmespath("messageId")
        .unwrap();
    for message in &event.records {
        let id = message.message_id.clone().unwrap();
        let view = serde_json::to_value(message).unwrap();
        assert_eq!(
            compat.record_id(&view).as_deref(),
            sqs["powertools_ids"][&id].as_str(),
            "the record id Powertools computed for {id}"
        );
    }
    let ran = Arc::new(Mutex::new(Vec::new()));
    let batch = SqsBatch::new(engine, "receipts").powertools(compat);
    let response: SqsBatchResponse = batch
        .process(
            LambdaEvent::new(event, Context::default()),
            |message: SqsMessage| {
                let ran = Arc::clone(&ran);
                async move {
                    ran.lock()
                        .unwrap()
                        .push(message.message_id.unwrap_or_default());
                    Ok::<_, String>(())
                }
            },
        )
        .await
        .unwrap();
    let failed: Vec<String> = response
        .batch_item_failures
        .iter()
        .map(|failure| failure.item_identifier.clone())
        .collect();
    let mut ran = ran.lock().unwrap().clone();
    ran.sort();
    let states = sqs["states"].as_object().unwrap();
    let with = |wanted: &[&str]| {
        let mut ids: Vec<String> = states
            .iter()
            .filter(|(_, state)| wanted.contains(&state.as_str().unwrap()))
            .map(|(id, _)| id.clone())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(
        failed,
        with(&["in_progress"]),
        "only the record in progress fails"
    );
    assert_eq!(
        ran,
        with(&["expired", "absent"]),
        "the completed one does not run again"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn powertools_records_on_dynamodb_are_honoured() {
    let client = support::client();
    // No TTL on the table: DynamoDB Local would delete the expired records
    // before they are read, and the expired branch would go untested.
    let table = support::create_table_with(&client, "powertools", "id", None).await;
    let manifest = powertools_writes(&[
        ("PT_TABLE", table.clone()),
        ("AWS_ENDPOINT_URL_DYNAMODB", support::endpoint()),
    ]);
    let store = DynamoDbStore::new(client, &table);
    check_http(store.clone(), store.clone(), &manifest).await;
    check_edge(
        Engine::builder(store.clone()).build(),
        store.clone(),
        &manifest,
    )
    .await;
    check_sqs(
        Engine::builder(store.clone()).build(),
        store.clone(),
        &manifest,
    )
    .await;
    check_unleased_and_query(Engine::builder(store.clone()).build(), store, &manifest).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn powertools_records_on_redis_are_honoured() {
    let url = support::variable("IDEMPOTENCY_TEST_REDIS_URL");
    let manifest = powertools_writes(&[("PT_REDIS_URL", url.clone())]);
    let store = RedisStore::open(&url).unwrap();
    check_http(store.clone(), store.clone(), &manifest).await;
    check_edge(
        Engine::builder(store.clone()).build(),
        store.clone(),
        &manifest,
    )
    .await;
    check_sqs(
        Engine::builder(store.clone()).build(),
        store.clone(),
        &manifest,
    )
    .await;
    check_unleased_and_query(Engine::builder(store.clone()).build(), store, &manifest).await;
}

/// Runs tests/powertools/write_records_ts.mjs (Powertools TypeScript, on
/// Node) against `env` (a DynamoDB table or a Redis URL) and reads its
/// manifest.
fn powertools_typescript_writes(env: &[(&str, String)]) -> Value {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(
        root.join("comparison/node_modules/@aws-lambda-powertools/idempotency").exists(),
        "Powertools TypeScript is missing: `make comparison/node_modules/.installed` installs it (make test does)"
    );
    let mut command = Command::new("node");
    command.env("NODE_NO_WARNINGS", "1");
    run_writer(command, "write_records_ts.mjs", env)
}

/// Records Powertools TypeScript wrote itself (its DynamoDB layer stores
/// the response as a map, its ids are base64 digests of
/// `JSON.stringify(deepSort(...))`) for payloads whose serialisation
/// JavaScript rewrites (`__proto__` members it leaves out, keys it
/// lowercases beyond ASCII, nesting past Python's limit), a keyPrefix it
/// trims, and HTTP API handlers returning a plain string and null: the mode
/// computes the same ids and replays each response without running the
/// handler (a retry Powertools answered as the same request too); a reused
/// key with another body is refused, as Powertools' payload validation
/// refuses it.
async fn check_typescript<St: Store + Clone>(
    engine: Engine<St>,
    store: impl PowertoolsRecords + Clone + 'static,
    manifest: &Value,
) {
    let cases = manifest["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 29, "every case was written");
    let mut missed = Vec::new();
    for case in cases {
        let handler = case["handler"].as_str().unwrap();
        let event = &case["event"];
        let body = event["body"].as_str().unwrap();
        let what = format!("{handler} {}", body.chars().take(120).collect::<String>());
        let prefix = case["key_prefix"].as_str().unwrap_or(FUNCTION);
        let compat = PowertoolsCompat::typescript(store.clone(), prefix);
        let compat = match handler {
            "body" => compat.event_key_jmespath("powertools_json(body)").unwrap(),
            "field" => compat
                .event_key_jmespath("powertools_json(body).order_id")
                .unwrap()
                .payload_validation_jmespath("powertools_json(body)")
                .unwrap(),
            _ => compat
                .event_key_jmespath("powertools_json(body).order_id")
                .unwrap(),
        };
        let id = compat.record_id(&serde_json::json!({ "body": body }));
        if id.as_deref() != case["powertools_id"].as_str() {
            missed.push(format!(
                "{what}: id {id:?}, Powertools {}",
                case["powertools_id"]
            ));
            continue;
        }
        let runs = Runs::default();
        let mut service = layered(engine.clone(), compat, &runs);
        let retries = [Some(event), case.get("retry_event")];
        for event in retries.into_iter().flatten() {
            let response = service
                .ready()
                .await
                .unwrap()
                .call(request(event))
                .await
                .unwrap();
            let what = format!("{what}, sent {}", event["body"]);
            if case["powertools_retry"] == "validation_error" {
                // Powertools' cache layer drops the validation hash when it
                // completes a record, and then refuses every retry: so does
                // the mode.
                if runs.count() != 0 || response.status() != 422 {
                    missed.push(format!(
                        "{what}: {} where Powertools refused",
                        response.status()
                    ));
                }
                continue;
            }
            let stored = &case["response"];
            let served = response.body().as_ref();
            let as_served = match stored {
                // API Gateway's payload format 2.0 serves what is not a
                // proxy response as 200 application/json: a string as its
                // text, null as `null`.
                Value::String(text) => {
                    response.status() == 200
                        && response.headers()["content-type"] == "application/json"
                        && served == text.as_bytes()
                }
                Value::Null => {
                    response.status() == 200
                        && response.headers()["content-type"] == "application/json"
                        && served == b"null"
                }
                _ => {
                    response.status().as_u16() as u64 == stored["statusCode"]
                        && served == stored["body"].as_str().unwrap().as_bytes()
                        && response.headers()["x-served-by"] == "powertools-ts"
                }
            };
            if runs.count() != 0 || !as_served || response.headers().get(REPLAYED_HEADER).is_none()
            {
                missed.push(format!(
                    "{what}: ran {} time(s), answered {} {:?}",
                    runs.count(),
                    response.status(),
                    String::from_utf8_lossy(served)
                ));
            }
        }
        if handler == "field" && case["powertools_retry"] == "replayed" {
            // The payloads all start with their order_id.
            let order_id = body
                .split_once("\"order_id\": ")
                .and_then(|(_, rest)| rest.split([',', '}']).next())
                .unwrap();
            let mut other = event.clone();
            other["body"] = Value::String(format!("{{\"order_id\": {order_id}, \"amount\": 1}}"));
            let response = service
                .ready()
                .await
                .unwrap()
                .call(request(&other))
                .await
                .unwrap();
            if response.status() != 422 || runs.count() != 0 {
                missed.push(format!("{what}, another body: {}", response.status()));
            }
        }
    }
    assert!(
        missed.is_empty(),
        "answered otherwise than Powertools TypeScript: {missed:#?}"
    );
    let mut unleased = manifest["unleased"].clone();
    unleased["surface"] = "http".into();
    let reader = store.clone();
    check_unleased(engine, store.clone(), &unleased, move |clock| {
        PowertoolsCompat::typescript(reader.clone(), FUNCTION)
            .event_key_jmespath("powertools_json(body).order_id")
            .unwrap()
            .clock(clock)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn powertools_typescript_records_on_dynamodb_are_honoured() {
    let client = support::client();
    let table = support::create_table_with(&client, "powertools-ts", "id", None).await;
    let manifest = powertools_typescript_writes(&[
        ("PT_TABLE", table.clone()),
        ("AWS_ENDPOINT_URL_DYNAMODB", support::endpoint()),
    ]);
    let store = DynamoDbStore::new(client, &table);
    check_typescript(Engine::builder(store.clone()).build(), store, &manifest).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn powertools_typescript_records_on_redis_are_honoured() {
    let url = support::variable("IDEMPOTENCY_TEST_REDIS_URL");
    let manifest = powertools_typescript_writes(&[("PT_REDIS_URL", url)]);
    let store = RedisStore::open(&support::variable("IDEMPOTENCY_TEST_REDIS_URL")).unwrap();
    check_typescript(Engine::builder(store.clone()).build(), store, &manifest).await;
}

/// What the mode costs in calls: one `GetItem` more on a first request,
/// and nothing on a replay from the local cache.
#[tokio::test(flavor = "multi_thread")]
async fn the_mode_costs_one_read_and_none_on_a_cached_replay() {
    let (client, calls) = support::counted_client();
    let table = support::create_idempotency_table(&client).await;
    let store = DynamoDbStore::new(client, &table);
    let runs = Runs::default();
    let engine = Engine::builder(store.clone()).cache(16).build();
    let mut service = layered(engine, compat_for(store.clone(), "header"), &runs);
    let template: Value =
        serde_json::from_str(include_str!("../events/rest-api-create-charge.json")).unwrap();
    let mut call = async |event: &Value| {
        calls.reset();
        let response = service
            .ready()
            .await
            .unwrap()
            .call(request(event))
            .await
            .unwrap();
        (response.status().as_u16(), calls.by_operation())
    };
    let (status, first) = call(&template).await;
    assert_eq!(status, 200);
    assert_eq!(
        first,
        [("GetItem", 1), ("PutItem", 1), ("UpdateItem", 1)]
            .into_iter()
            .collect(),
        "the Powertools read, then the claim and the completion"
    );
    let (status, replay) = call(&template).await;
    assert_eq!(status, 200);
    assert!(
        replay.is_empty(),
        "a cached replay calls nothing: {replay:?}"
    );
    assert_eq!(runs.count(), 1);
}

/// The mode's cost on a first request, against DynamoDB Local: the same
/// new requests with the mode off and on, interleaved. Run by
/// `make bench-powertools` (in release), not by `make test`.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "a measurement: make bench-powertools"]
async fn powertools_mode_latency() {
    let rounds: usize = support::env_or("BENCH_REQUESTS", 2000) as usize;
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let store = DynamoDbStore::new(client, &table);
    let runs = Runs::default();
    let handler = |runs: &Runs| {
        let runs = runs.clone();
        service_fn(move |_request: Request| {
            let runs = runs.clone();
            async move {
                runs.0.fetch_add(1, Ordering::SeqCst);
                Ok::<_, lambda_http::Error>(Response::new(Body::Text("rust".into())))
            }
        })
    };
    let mut off =
        IdempotencyLayer::new(Engine::builder(store.clone()).build()).layer(handler(&runs));
    let mut on = layered(
        Engine::builder(store.clone()).build(),
        compat_for(store.clone(), "header"),
        &runs,
    );
    let template: Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("events/rest-api-create-charge.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let event = |i: usize, mode: &str| {
        let mut event = template.clone();
        event["headers"]["Idempotency-Key"] = Value::String(format!("bench-{mode}-{i}"));
        event["multiValueHeaders"]["Idempotency-Key"] =
            serde_json::json!([format!("bench-{mode}-{i}")]);
        request(&event)
    };
    let (mut times_off, mut times_on, mut times_replay_on) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..rounds + 100 {
        let (response, elapsed_off) = timed(&mut off, event(i, "off")).await;
        assert_eq!(response.status(), 200);
        let (response, elapsed_on) = timed(&mut on, event(i, "on")).await;
        assert_eq!(response.status(), 200);
        let (response, elapsed_replay) = timed(&mut on, event(i, "on")).await;
        assert_eq!(response.headers()[REPLAYED_HEADER], "true");
        if i >= 100 {
            times_off.push(elapsed_off);
            times_on.push(elapsed_on);
            times_replay_on.push(elapsed_replay);
        }
    }
    let report = |name: &str, times: &mut Vec<Duration>| {
        times.sort();
        let at = |q: f64| times[((times.len() as f64 - 1.0) * q) as usize].as_secs_f64() * 1000.0;
        println!(
            "{name:<32} median {:.3} ms  p90 {:.3} ms  p99 {:.3} ms",
            at(0.5),
            at(0.9),
            at(0.99)
        );
    };
    println!("{rounds} requests each, interleaved, DynamoDB Local:");
    report("first request, mode off", &mut times_off);
    report("first request, mode on", &mut times_on);
    report("replay (store), mode on", &mut times_replay_on);
}

/// One request through `service`, and how long it took.
async fn timed<S>(service: &mut S, request: Request) -> (S::Response, Duration)
where
    S: Service<Request>,
    S::Error: std::fmt::Debug,
{
    let started = Instant::now();
    let response = service.ready().await.unwrap().call(request).await.unwrap();
    (response, started.elapsed())
}
