//! The layer's behaviours, one by one, on the memory store, with a counting
//! echo service underneath.

use super::*;
use crate::{store::Status, testing::ManualClock, Engine, MemoryStore};
use lambda_http::{
    http::{self, header, HeaderName, HeaderValue, Method, StatusCode},
    service_fn, Body, Request, RequestExt, Response,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tower::{Layer, Service, ServiceExt};

type BoxError = lambda_http::Error;

/// Echoes the request body with a run counter, answering `status` (or the
/// status named in an `x-status` request header).
#[derive(Clone)]
struct Echo {
    runs: Arc<AtomicUsize>,
    delay: Duration,
}

impl Echo {
    fn new() -> Self {
        Self {
            runs: Arc::default(),
            delay: Duration::ZERO,
        }
    }

    fn runs(&self) -> usize {
        self.runs.load(Ordering::SeqCst)
    }
}

impl Service<Request> for Echo {
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
        let runs = Arc::clone(&self.runs);
        let delay = self.delay;
        Box::pin(async move {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::time::sleep(delay).await;
            if request.headers().contains_key("x-fail") {
                return Err("handler failed".into());
            }
            if request.headers().contains_key("x-panic") {
                panic!("the handler panicked");
            }
            let status = request
                .headers()
                .get("x-status")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(201);
            let (body, content_type) = match request.into_body() {
                Body::Binary(bytes) => (Body::Binary(bytes), "application/octet-stream"),
                Body::Text(text) => (Body::Text(format!("run {run}: {text}")), "application/json"),
                _ => (Body::Text(format!("run {run}")), "application/json"),
            };
            Ok(Response::builder()
                .status(status)
                .header(header::CONTENT_TYPE, content_type)
                .header(header::LOCATION, format!("/v1/charges/ch_{run}"))
                .header(header::SET_COOKIE, "session=secret")
                .body(body)?)
        })
    }
}

fn engine() -> Engine<MemoryStore> {
    Engine::builder(MemoryStore::new()).build()
}

fn post(key: Option<&str>, body: &str) -> Request {
    let mut builder =
        http::Request::post("/v1/charges").header(header::CONTENT_TYPE, "application/json");
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::from(body)).expect("request")
}

async fn send<S>(service: &mut S, request: Request) -> Response<Body>
where
    S: Service<Request, Response = Response<Body>, Error = BoxError>,
{
    service
        .ready()
        .await
        .expect("ready")
        .call(request)
        .await
        .expect("response")
}

fn text(response: &Response<Body>) -> &str {
    match response.body() {
        Body::Text(text) => text,
        other => panic!("expected a text body, got {other:?}"),
    }
}

fn problem(response: &Response<Body>) -> serde_json::Value {
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "application/problem+json"
    );
    serde_json::from_str(text(response)).expect("problem json")
}

mod bound;
mod concurrency;
mod fingerprints;
mod keys;
mod observed;
mod outcomes;
mod redaction;
mod replays;
mod retry_after;
mod trace_links;
mod transactions;
