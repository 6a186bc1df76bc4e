//! This workspace's server end: `axum::serve` on a free loopback port, the
//! `lambda-idempotency` HTTP layer on the memory store in front of two
//! routes whose runs are counted, and every request that reaches the
//! server recorded with its key and arrival time.

use axum::{
    extract::{Request, State},
    http::StatusCode,
    middleware::{self, Next},
    response::Response,
    routing::post,
    Json, Router,
};
use lambda_idempotency::{
    http::{IdempotencyLayer, RetryAfter},
    Engine, MemoryStore,
};
use serde_json::{json, Value};
use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

/// How long `/slow` runs: long enough for a duplicate to be told 409.
pub const SLOW: Duration = Duration::from_millis(1_500);

/// What the layer tells a duplicate of a request in progress to wait
/// (the smallest `Retry-After` it sends: whole seconds, at least 1).
pub const IN_PROGRESS_RETRY_AFTER: Duration = Duration::from_secs(1);

/// A request as it reached the server, before the layer.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub path: String,
    pub key: Option<String>,
    pub at: Instant,
}

#[derive(Clone, Default)]
struct Shared {
    runs: Arc<AtomicUsize>,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
}

/// The server, until the test's runtime ends.
pub struct Server {
    pub addr: SocketAddr,
    /// The layer's store: `fail_next` is the store's outage.
    pub store: MemoryStore,
    shared: Shared,
}

impl Server {
    pub async fn start() -> Self {
        Self::start_with(|layer| layer).await
    }

    /// The server with its layer set further by `configure` (a
    /// `wait_for_result`, another replay header, …): the tests' own
    /// settings (shared scope, a fixed 1 s `Retry-After`) come first.
    pub async fn start_with(
        configure: impl FnOnce(IdempotencyLayer<MemoryStore>) -> IdempotencyLayer<MemoryStore>,
    ) -> Self {
        let store = MemoryStore::new();
        let shared = Shared::default();
        let layer = IdempotencyLayer::new(Engine::builder(store.clone()).build())
            // One caller: no authentication in front of it.
            .shared_scope()
            .in_progress_retry_after(RetryAfter::fixed(IN_PROGRESS_RETRY_AFTER));
        let layer = configure(layer);
        let app = Router::new()
            .route("/charges", post(charge))
            .route("/slow", post(slow_charge))
            .route("/sleep", post(sleep_charge))
            .route("/see-other", post(see_other))
            .route("/receipt", axum::routing::get(|| async { "receipt" }))
            .with_state(shared.clone())
            .layer(layer)
            // Outside the layer: sees every attempt, answered or not.
            .layer(middleware::from_fn_with_state(shared.clone(), record));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a loopback port");
        let addr = listener.local_addr().expect("its address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self {
            addr,
            store,
            shared,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// How many times a handler ran.
    pub fn runs(&self) -> usize {
        self.shared.runs.load(Ordering::SeqCst)
    }

    /// Every request that reached the server, in order.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.shared.arrivals.lock().unwrap().clone()
    }

    /// The keys of the requests that reached the server, in order.
    pub fn keys(&self) -> Vec<String> {
        self.arrivals()
            .into_iter()
            .map(|arrival| arrival.key.unwrap_or_default())
            .collect()
    }
}

async fn record(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let key = request
        .headers()
        .get("idempotency-key")
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    shared.arrivals.lock().unwrap().push(Arrival {
        path: request.uri().path().to_owned(),
        key,
        at: Instant::now(),
    });
    next.run(request).await
}

async fn charge(
    State(shared): State<Shared>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let run = shared.runs.fetch_add(1, Ordering::SeqCst) + 1;
    (
        StatusCode::CREATED,
        Json(json!({ "amount": body["amount"], "run": run })),
    )
}

async fn slow_charge(
    State(shared): State<Shared>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let run = shared.runs.fetch_add(1, Ordering::SeqCst) + 1;
    tokio::time::sleep(SLOW).await;
    (
        StatusCode::CREATED,
        Json(json!({ "amount": body["amount"], "run": run })),
    )
}

/// Runs as long as the body's `sleep_ms` says.
async fn sleep_charge(
    State(shared): State<Shared>,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let run = shared.runs.fetch_add(1, Ordering::SeqCst) + 1;
    let sleep = body["sleep_ms"].as_u64().unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(sleep)).await;
    (StatusCode::CREATED, Json(json!({ "run": run })))
}

/// Post/Redirect/Get: the charge made, its answer a `303 See Other` to
/// its receipt.
async fn see_other(State(shared): State<Shared>) -> Response {
    shared.runs.fetch_add(1, Ordering::SeqCst);
    Response::builder()
        .status(StatusCode::SEE_OTHER)
        .header("location", "/receipt")
        .body(axum::body::Body::empty())
        .expect("a response")
}
