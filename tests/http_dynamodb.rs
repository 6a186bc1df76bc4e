//! The HTTP layer on DynamoDB Local.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

#[path = "support/replays.rs"]
mod replays;
mod support;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use lambda_http::{
    http::{self, header, StatusCode},
    Body, Request, Response,
};
use lambda_idempotency::{
    http::{CommitWith, IdempotencyLayer, REPLAYED_HEADER},
    DynamoDbStore, Engine, Mode,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use tower::{Layer, Service, ServiceExt};

type BoxError = lambda_http::Error;
type Respond = Arc<dyn Fn(usize, &Request) -> Body + Send + Sync>;

/// A handler that counts its runs, takes `delay`, and answers with the body
/// given by `respond`.
#[derive(Clone)]
struct Handler {
    runs: Arc<AtomicUsize>,
    delay: Duration,
    respond: Respond,
}

impl Handler {
    fn new(respond: impl Fn(usize, &Request) -> Body + Send + Sync + 'static) -> Self {
        Self {
            runs: Arc::default(),
            delay: Duration::ZERO,
            respond: Arc::new(respond),
        }
    }

    fn slow(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Service<Request> for Handler {
    type Response = Response<Body>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Body>, BoxError>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request) -> Self::Future {
        let run = self.runs.fetch_add(1, Ordering::SeqCst) + 1;
        let body = (self.respond)(run, &request);
        let delay = self.delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            let content_type = match body {
                Body::Binary(_) => "application/octet-stream",
                _ => "application/json",
            };
            Ok(Response::builder()
                .status(201)
                .header(header::CONTENT_TYPE, content_type)
                .header(header::LOCATION, format!("/v1/charges/ch_{run}"))
                .body(body)?)
        })
    }
}

fn charge(run: usize, _: &Request) -> Body {
    Body::Text(format!("{{\"id\":\"ch_{run}\",\"amount\":1250}}"))
}

async fn engine() -> Engine<DynamoDbStore> {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    Engine::builder(DynamoDbStore::new(client, table)).build()
}

fn post(key: &str, body: Body) -> Request {
    http::Request::post("/v1/charges")
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(body)
        .expect("request")
}

fn json(body: &str) -> Body {
    Body::Text(body.to_owned())
}

fn problem_type(response: &Response<Body>) -> String {
    let Body::Text(text) = response.body() else {
        panic!("problem body")
    };
    let value: serde_json::Value = serde_json::from_str(text).expect("json");
    value["type"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn replays_and_rejects_a_reused_key() {
    let handler = Handler::new(charge);
    let service = IdempotencyLayer::new(engine().await)
        .shared_scope()
        .layer(handler.clone());
    let first = service
        .clone()
        .oneshot(post("k", json(r#"{"amount":1250}"#)))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let replay = service
        .clone()
        .oneshot(post("k", json(r#"{ "amount": 1250 }"#)))
        .await
        .unwrap();
    assert_eq!(replay.status(), StatusCode::CREATED);
    assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
    assert_eq!(replay.body(), first.body());
    assert_eq!(replay.headers()[header::LOCATION], "/v1/charges/ch_1");

    let reused = service
        .clone()
        .oneshot(post("k", json(r#"{"amount":9999}"#)))
        .await
        .unwrap();
    assert_eq!(reused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(problem_type(&reused).ends_with("idempotency-key-reused"));
    assert_eq!(handler.runs(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_duplicates_get_409_with_retry_after_and_run_once() {
    let handler = Handler::new(charge).slow(Duration::from_millis(400));
    let service = IdempotencyLayer::new(engine().await)
        .shared_scope()
        .layer(handler.clone());
    let calls = (0..24).map(|_| {
        let service = service.clone();
        tokio::spawn(async move { service.oneshot(post("burst", json("{}"))).await.unwrap() })
    });
    let responses = futures::future::join_all(calls).await;
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    for response in responses {
        let response = response.unwrap();
        *statuses.entry(response.status().as_u16()).or_default() += 1;
        if response.status() == StatusCode::CONFLICT {
            let retry_after: u64 = response.headers()[header::RETRY_AFTER]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!(retry_after >= 1);
            assert!(problem_type(&response).ends_with("idempotency-key-in-use"));
        }
    }
    assert_eq!(handler.runs(), 1, "{statuses:?}");
    assert!(statuses.get(&409).copied().unwrap_or(0) > 0, "{statuses:?}");
    assert_eq!(statuses.values().sum::<usize>(), 24);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_for_the_result_returns_the_replay() {
    let handler = Handler::new(charge).slow(Duration::from_millis(400));
    let service = IdempotencyLayer::new(engine().await)
        .shared_scope()
        .wait_for_result(Duration::from_secs(5))
        .layer(handler.clone());
    let calls = (0..8).map(|_| {
        let service = service.clone();
        tokio::spawn(async move { service.oneshot(post("wait", json("{}"))).await.unwrap() })
    });
    let responses = futures::future::join_all(calls).await;
    let mut replays = 0;
    for response in responses {
        let response = response.unwrap();
        assert_eq!(response.status(), StatusCode::CREATED);
        assert_eq!(response.headers()[header::LOCATION], "/v1/charges/ch_1");
        replays += usize::from(response.headers().contains_key(REPLAYED_HEADER));
    }
    assert_eq!(replays, 7);
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn unreachable_store_is_a_503_and_nothing_runs() {
    let engine = Engine::builder(DynamoDbStore::new(
        support::unreachable_client(),
        "idempotency",
    ))
    .build();
    let handler = Handler::new(charge);
    let response = IdempotencyLayer::new(engine)
        .shared_scope()
        .layer(handler.clone())
        .oneshot(post("k", json("{}")))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key(header::RETRY_AFTER));
    assert!(problem_type(&response).ends_with("idempotency-store-unavailable"));
    assert_eq!(handler.runs(), 0);
}

#[tokio::test]
async fn binary_bodies_round_trip_exactly() {
    let handler = Handler::new(|_, request| Body::Binary(request.body().to_vec()));
    let service = IdempotencyLayer::new(engine().await)
        .shared_scope()
        .layer(handler.clone());
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 256) as u8).collect();
    let request = || {
        http::Request::post("/v1/files")
            .header("idempotency-key", "bin")
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(Body::Binary(bytes.clone()))
            .unwrap()
    };
    let (_, replay) = replays::sent_twice(|| service.clone().oneshot(request())).await;
    assert!(
        replay.body() == &Body::Binary(bytes),
        "binary body differs after the round trip"
    );
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn large_bodies_are_compressed_or_explained_never_run_twice() {
    // 1 MB of JSON, far over DynamoDB's 400 KB item limit, compresses to fit.
    let big_json = format!(
        "[{}]",
        vec![r#"{"sku":"widget","qty":1}"#; 40_000].join(",")
    );
    assert!(big_json.len() > 1_000_000);
    let expected = big_json.clone();
    let handler = Handler::new(move |_, _| Body::Text(big_json.clone()));
    let service = IdempotencyLayer::new(engine().await)
        .shared_scope()
        .layer(handler.clone());
    let (_, replay) =
        replays::sent_twice(|| service.clone().oneshot(post("big", json("{}")))).await;
    assert!(
        replay.body() == &Body::Text(expected),
        "the large body replays exactly"
    );

    // 600 KB of incompressible bytes cannot be stored: retries learn the
    // original status and location, with an explanation, and nothing reruns.
    let noise = support::incompressible(600 * 1024);
    let handler = Handler::new(move |_, _| Body::Binary(noise.clone()));
    let service = IdempotencyLayer::new(engine().await)
        .shared_scope()
        .layer(handler.clone());
    let (first, retry) =
        replays::sent_twice(|| service.clone().oneshot(post("huge", json("{}")))).await;
    assert!(
        matches!(first.body(), Body::Binary(b) if b.len() == 600 * 1024),
        "the caller gets it all"
    );
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(retry.headers()[header::LOCATION], "/v1/charges/ch_1");
    assert!(problem_type(&retry).ends_with("idempotency-response-not-stored"));
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn bodies_at_the_item_limit_are_stored_and_over_it_are_explained() {
    use lambda_idempotency::http::MAX_STORED_RESPONSE;
    let noise = support::incompressible;
    // Incompressible, and just under the stored-response limit once framed
    // with its status and headers: DynamoDB Local must accept the item.
    let at_limit = noise(MAX_STORED_RESPONSE - 256);
    let expected = at_limit.clone();
    let handler = Handler::new(move |_, _| Body::Binary(at_limit.clone()));
    let service = IdempotencyLayer::new(engine().await)
        .shared_scope()
        .layer(handler.clone());
    let (_, replay) =
        replays::sent_twice(|| service.clone().oneshot(post("at-limit", json("{}")))).await;
    assert!(
        replay.body() == &Body::Binary(expected),
        "a body at the limit replays exactly"
    );

    let over = noise(MAX_STORED_RESPONSE + 1);
    let handler = Handler::new(move |_, _| Body::Binary(over.clone()));
    let service = IdempotencyLayer::new(engine().await)
        .shared_scope()
        .layer(handler.clone());
    service
        .clone()
        .oneshot(post("over", json("{}")))
        .await
        .unwrap();
    let retry = service
        .clone()
        .oneshot(post("over", json("{}")))
        .await
        .unwrap();
    assert!(problem_type(&retry).ends_with("idempotency-response-not-stored"));
    assert_eq!(handler.runs(), 1);
}

#[tokio::test]
async fn neither_raw_keys_nor_principals_are_stored() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let engine = Engine::builder(DynamoDbStore::new(client.clone(), table.clone())).build();
    let service = IdempotencyLayer::new(engine)
        .shared_scope()
        .scope(|_: &http::Request<_>| "principal-alice@example.com POST /v1/charges".to_owned())
        .layer(Handler::new(charge));
    let key = "raw-secret-key-0f3c9a77";
    service
        .clone()
        .oneshot(post(key, json(r#"{"card":"4242"}"#)))
        .await
        .unwrap();
    let items = client
        .scan()
        .table_name(&table)
        .send()
        .await
        .unwrap()
        .items
        .unwrap_or_default();
    assert_eq!(items.len(), 1);
    let dump = format!("{items:?}");
    for secret in [key, "principal-alice", "4242"] {
        assert!(
            !dump.contains(secret),
            "{secret} found in the table: {dump}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_tenant_in_flight_never_blocks_another_with_the_same_key() {
    let engine = engine().await;
    let handler = Handler::new(charge).slow(Duration::from_millis(500));
    let tenant = |name: &'static str| {
        IdempotencyLayer::new(engine.clone())
            .shared_scope()
            .scope(move |_: &http::Request<_>| format!("tenant-{name} POST /v1/charges"))
            .layer(handler.clone())
    };
    let a = tokio::spawn(tenant("a").oneshot(post("shared-key", json("{}"))));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let b = tenant("b")
        .oneshot(post("shared-key", json("{}")))
        .await
        .unwrap();
    assert_eq!(
        b.status(),
        StatusCode::CREATED,
        "B is not told A's request is in progress"
    );
    assert!(
        b.headers().get(REPLAYED_HEADER).is_none(),
        "nor given A's response"
    );
    assert_eq!(a.await.unwrap().unwrap().status(), StatusCode::CREATED);
    assert_eq!(handler.runs(), 2);
}

/// Issue 10, item 14: a handler's transactional write that DynamoDB rejects
/// as invalid (here a business item without its key) is a 500 that does not
/// invite retries, not a 503 with `Retry-After`; nothing is committed and
/// the claim is released.
#[tokio::test]
async fn an_invalid_transactional_write_is_a_500_without_retry_after() {
    let client = support::client();
    let charges = support::create_table_with(&client, "charges", "charge_id", None).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let handler = lambda_http::service_fn(move |_: Request| {
        counter.fetch_add(1, Ordering::SeqCst);
        let charges = charges.clone();
        async move {
            let put = Put::builder()
                .table_name(charges)
                .item("amount", AttributeValue::N("1250".into()))
                .build()?;
            let mut response = Response::builder()
                .status(201)
                .body(Body::from(r#"{"id":"ch_1"}"#))?;
            response
                .extensions_mut()
                .insert(CommitWith(vec![TransactWriteItem::builder()
                    .put(put)
                    .build()]));
            Ok::<_, BoxError>(response)
        }
    });
    let service = IdempotencyLayer::new(engine().await)
        .shared_scope()
        .mode(Mode::Transactional)
        .layer(handler);
    for attempt in 1..=2 {
        let response = service
            .clone()
            .oneshot(post("invalid-write", json("{}")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            problem_type(&response),
            "urn:lambda-idempotency:problem:idempotency-write-rejected"
        );
        assert!(response.headers().get(header::RETRY_AFTER).is_none());
        assert_eq!(
            runs.load(Ordering::SeqCst),
            attempt,
            "released: the retry runs again"
        );
    }
}

/// A charge handler whose only effect is the charge item it commits with
/// its response, counting its runs.
fn committing_handler(
    charges: String,
    runs: Arc<AtomicUsize>,
) -> impl tower::Service<Request, Response = Response<Body>, Error = BoxError, Future = impl Send> + Clone
{
    lambda_http::service_fn(move |_: Request| {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        let charges = charges.clone();
        async move {
            let id = format!("ch_{run}");
            let put = Put::builder()
                .table_name(charges)
                .item("charge_id", AttributeValue::S(id.clone()))
                .condition_expression("attribute_not_exists(charge_id)")
                .build()?;
            let mut response = Response::builder()
                .status(201)
                .body(Body::Text(format!(r#"{{"id":"{id}"}}"#)))?;
            response
                .extensions_mut()
                .insert(CommitWith(vec![TransactWriteItem::builder()
                    .put(put)
                    .build()]));
            Ok::<_, BoxError>(response)
        }
    })
}

async fn charge_items(client: &aws_sdk_dynamodb::Client, table: &str) -> usize {
    client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .expect("scan")
        .items
        .unwrap_or_default()
        .len()
}

#[tokio::test]
async fn single_write_costs_one_call_per_request() {
    let (client, calls) = support::counted_client();
    let table = support::create_idempotency_table(&client).await;
    let charges = support::create_table_with(&client, "charges", "charge_id", None).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let store = DynamoDbStore::new(client.clone(), table);
    let uncached = IdempotencyLayer::new(Engine::builder(store.clone()).build())
        .shared_scope()
        .single_write()
        .layer(committing_handler(charges.clone(), Arc::clone(&runs)));
    let cached = IdempotencyLayer::new(Engine::builder(store).cache(16).build())
        .shared_scope()
        .single_write()
        .layer(committing_handler(charges.clone(), Arc::clone(&runs)));

    calls.reset();
    let first = uncached
        .clone()
        .oneshot(post("one-call", json("{}")))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    assert_eq!(
        calls.by_operation(),
        [("TransactWriteItems", 1)].into(),
        "a new request: one transaction, no claim"
    );

    calls.reset();
    let replay = uncached
        .clone()
        .oneshot(post("one-call", json("{}")))
        .await
        .unwrap();
    assert_eq!(replay.headers().get(REPLAYED_HEADER).unwrap(), "true");
    assert_eq!(
        replay.body(),
        first.body(),
        "the first charge, not the retry's"
    );
    assert_eq!(
        calls.by_operation(),
        [("TransactWriteItems", 1)].into(),
        "a replay: the refused transaction returns the record"
    );

    // The cached engine learns the record from its first replay, then
    // replays without a call.
    cached
        .clone()
        .oneshot(post("one-call", json("{}")))
        .await
        .unwrap();
    calls.reset();
    let from_cache = cached
        .clone()
        .oneshot(post("one-call", json("{}")))
        .await
        .unwrap();
    assert_eq!(from_cache.body(), first.body());
    assert_eq!(calls.total(), 0, "a cached replay: no call");
    assert_eq!(
        charge_items(&client, &charges).await,
        1,
        "one charge written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn single_write_concurrent_duplicates_commit_one_charge_and_replay_it() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let charges = support::create_table_with(&client, "charges", "charge_id", None).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let service =
        IdempotencyLayer::new(Engine::builder(DynamoDbStore::new(client.clone(), table)).build())
            .shared_scope()
            .single_write()
            .layer(committing_handler(charges.clone(), Arc::clone(&runs)));
    let calls: Vec<_> = (0..40)
        .map(|_| {
            let service = service.clone();
            tokio::spawn(async move { service.oneshot(post("burst", json("{}"))).await })
        })
        .collect();
    let mut bodies = std::collections::HashSet::new();
    for call in calls {
        let response = call.await.expect("task").expect("response");
        assert_eq!(
            response.status(),
            StatusCode::CREATED,
            "a replay, never a 409"
        );
        let Body::Text(text) = response.body() else {
            panic!("text body")
        };
        bodies.insert(text.clone());
    }
    assert_eq!(
        bodies.len(),
        1,
        "every duplicate got the one committed charge: {bodies:?}"
    );
    assert_eq!(
        charge_items(&client, &charges).await,
        1,
        "one charge written"
    );
}

/// Issue 41, item 2: a condition on a business item that the application
/// expects (an order number already taken) is the answer it chooses, a 422
/// stored and replayed like any response, not a 500; a refusal it does not
/// name stays a 500 that releases the key.
#[tokio::test]
async fn a_refused_business_condition_is_the_applications_answer() {
    use lambda_idempotency::http::StoredBody;
    let client = support::client();
    let orders = support::create_table_with(&client, "orders", "order_id", None).await;
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    // The order number comes from the body: a second key for the same
    // order number fails the condition on the business item.
    let handler = lambda_http::service_fn(move |request: Request| {
        counter.fetch_add(1, Ordering::SeqCst);
        let orders = orders.clone();
        let order = String::from_utf8_lossy(request.body()).into_owned();
        async move {
            let put = Put::builder()
                .table_name(orders)
                .item("order_id", AttributeValue::S(order.clone()))
                .condition_expression("attribute_not_exists(order_id)")
                .build()?;
            let mut response = Response::builder()
                .status(201)
                .body(Body::Text(format!(r#"{{"order":{order}}}"#)))?;
            response
                .extensions_mut()
                .insert(CommitWith(vec![TransactWriteItem::builder()
                    .put(put)
                    .build()]));
            Ok::<_, BoxError>(response)
        }
    });
    let engine = engine().await;
    let answering = IdempotencyLayer::new(engine.clone())
        .shared_scope()
        .mode(Mode::Transactional)
        .on_write_refusal(|refusal| {
            (refusal.code == "ConditionalCheckFailed" && refusal.index == 0)
                .then(|| {
                    http::Response::builder()
                        .status(StatusCode::UNPROCESSABLE_ENTITY)
                        .header(header::CONTENT_TYPE, "application/problem+json")
                        .body(StoredBody::from(r#"{"type":"order-exists","status":422}"#))
                        .ok()
                })
                .flatten()
        })
        .layer(handler.clone());
    let first = answering
        .clone()
        .oneshot(post("o-1", json("\"42\"")))
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::CREATED);
    let (refused, replay) =
        replays::sent_twice(|| answering.clone().oneshot(post("o-2", json("\"42\"")))).await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(problem_type(&refused), "order-exists");
    assert_eq!(replay.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the stored refusal ran nothing"
    );

    // Not named by the application: a fault, the key released.
    let unanswered = IdempotencyLayer::new(engine)
        .shared_scope()
        .mode(Mode::Transactional)
        .layer(handler);
    for attempt in 1..=2 {
        let response = unanswered
            .clone()
            .oneshot(post("o-3", json("\"42\"")))
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            problem_type(&response),
            "urn:lambda-idempotency:problem:idempotency-write-rejected"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2 + attempt);
    }
}
