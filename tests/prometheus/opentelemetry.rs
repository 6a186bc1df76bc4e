//! The crate's spans exported by OpenTelemetry's SDK through
//! `tracing-opentelemetry`, into the SDK's in-memory exporter: the HTTP
//! layer's span with its answer, and a database client span for each
//! store call beneath it, with the semantic conventions' attributes and an
//! error status when the call fails.

use axum::{body::Body, http::Request, routing::post, Router};
use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore, StoreErrorKind};
use opentelemetry::{
    trace::{SpanKind, Status, TracerProvider as _},
    KeyValue, Value,
};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use tower::ServiceExt;
use tracing_subscriber::layer::SubscriberExt;

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|KeyValue { key: k, .. }| k.as_str() == key)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> Option<String> {
    attribute(span, key).map(|value| value.as_str().into_owned())
}

#[tokio::test]
async fn spans_reach_opentelemetry_with_the_semantic_conventions_names() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _default = tracing::subscriber::set_default(subscriber);

    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let app = Router::new()
        .route("/v1/charges", post(|| async { "ch_1" }))
        .layer(IdempotencyLayer::new(engine).shared_scope());
    let send = |key: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::post("/v1/charges")
                .header("idempotency-key", key)
                .body(Body::from("{}"))
                .unwrap();
            app.oneshot(request).await.unwrap().status().as_u16()
        }
    };
    assert_eq!(send("k1").await, 200);
    assert_eq!(send("k1").await, 200);
    store.fail_next_with(1, StoreErrorKind::Unavailable);
    assert_eq!(send("k2").await, 503);
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();

    let requests: Vec<&SpanData> = spans.iter().filter(|s| s.name == "idempotency").collect();
    let answers: Vec<(Option<String>, Option<i64>)> = requests
        .iter()
        .map(|span| {
            let status = match attribute(span, "http.response.status_code") {
                Some(Value::I64(status)) => Some(*status),
                _ => None,
            };
            (text(span, "idempotency.outcome"), status)
        })
        .collect();
    assert_eq!(
        answers,
        [
            (Some("fresh".into()), Some(200)),
            (Some("replay".into()), Some(200)),
            (Some("store_error".into()), Some(503)),
        ],
        "{spans:#?}"
    );

    // Each store call: a client span under its request's, named after
    // its operation, with db.system.name and db.operation.name.
    let calls: Vec<(usize, String, Option<String>, Option<String>)> = spans
        .iter()
        .filter(|span| span.name.starts_with("idempotency "))
        .map(|span| {
            assert_eq!(span.span_kind, SpanKind::Client, "{span:#?}");
            assert_eq!(text(span, "db.system.name").as_deref(), Some("memory"));
            let request = requests
                .iter()
                .position(|r| r.span_context.span_id() == span.parent_span_id)
                .unwrap_or_else(|| panic!("not under a request's span: {span:#?}"));
            (
                request,
                span.name.to_string(),
                text(span, "db.operation.name"),
                text(span, "error.type"),
            )
        })
        .collect();
    let call = |request, operation: &str, error: Option<&str>| {
        (
            request,
            format!("idempotency {operation}"),
            Some(operation.to_owned()),
            error.map(str::to_owned),
        )
    };
    assert_eq!(
        calls,
        [
            call(0, "claim", None),
            call(0, "complete", None),
            call(1, "claim", None),
            call(2, "claim", Some("unavailable")),
            // Whether the failed claim landed, read back.
            call(2, "get", None),
        ]
    );
    let failed = spans
        .iter()
        .find(|span| text(span, "error.type").is_some())
        .unwrap();
    assert!(matches!(failed.status, Status::Error { .. }), "{failed:#?}");
    // No key is an attribute of any span.
    for span in &spans {
        for KeyValue { value, .. } in &span.attributes {
            assert!(!value.as_str().contains("k1"), "{span:#?}");
        }
    }
}

/// What an OTLP receiver got: the names of the spans, and each span's
/// `db.system.name` when it has one.
#[derive(Default, Clone)]
struct Received(std::sync::Arc<std::sync::Mutex<Vec<ReceivedSpan>>>);

/// A span's name, and its `db.system.name` if it has one.
type ReceivedSpan = (String, Option<String>);

#[tonic::async_trait]
impl TraceService for Received {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = self.0.lock().unwrap();
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    let system = span
                        .attributes
                        .iter()
                        .find(|kv| kv.key == "db.system.name")
                        .and_then(|kv| kv.value.as_ref())
                        .and_then(|value| match &value.value {
                            Some(any_value::Value::StringValue(system)) => Some(system.clone()),
                            _ => None,
                        });
                    received.push((span.name, system));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

use opentelemetry_otlp::WithExportConfig;
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        trace_service_server::{TraceService, TraceServiceServer},
        ExportTraceServiceRequest, ExportTraceServiceResponse,
    },
    common::v1::any_value,
};

/// examples/opentelemetry.rs's exporter (OTLP over gRPC, batched) against
/// a receiver built from OpenTelemetry's own service definition on a real
/// HTTP/2 connection: the request's span and its store calls' arrive.
#[tokio::test]
async fn the_otlp_exporter_sends_the_spans_to_a_receiver() {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let receiver = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(received.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(format!("http://{address}"))
        .build()
        .unwrap();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("charges")));
    let _default = tracing::subscriber::set_default(subscriber);

    let app = Router::new()
        .route("/v1/charges", post(|| async { "ch_1" }))
        .layer(IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).shared_scope());
    for _ in 0..2 {
        let request = Request::post("/v1/charges")
            .header("idempotency-key", "otlp-1")
            .body(Body::from("{}"))
            .unwrap();
        app.clone().oneshot(request).await.unwrap();
    }
    // The batch is exported from the SDK's own thread through the gRPC
    // channel this runtime drives: wait for it off the runtime's thread.
    tokio::task::spawn_blocking(move || provider.force_flush())
        .await
        .unwrap()
        .unwrap();
    let mut names = received.0.lock().unwrap().clone();
    names.sort();
    let span = |name: &str, system: Option<&str>| (name.to_owned(), system.map(str::to_owned));
    assert_eq!(
        names,
        [
            span("idempotency", None),
            span("idempotency", None),
            span("idempotency claim", Some("memory")),
            span("idempotency claim", Some("memory")),
            span("idempotency complete", Some("memory")),
        ]
    );
    receiver.abort();
}

/// A replay's span links to the span that did the work it replays (the
/// first request's `idempotency` span, in another trace), and records and
/// names it; without `keep_trace_context`, nothing is kept and nothing
/// links.
#[tokio::test]
async fn a_replay_s_span_links_to_the_span_that_did_its_work() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    let _default = tracing::subscriber::set_default(subscriber);

    let app = |keep: bool| {
        let layer =
            IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).shared_scope();
        let layer = if keep {
            layer.replay_trace_header(axum::http::HeaderName::from_static("idempotency-replay-of"))
        } else {
            layer
        };
        Router::new()
            .route("/v1/charges", post(|| async { "ch_1" }))
            .layer(layer)
    };
    let send = |app: Router| async move {
        let request = Request::post("/v1/charges")
            .header("idempotency-key", "k")
            .body(Body::from("{}"))
            .unwrap();
        app.oneshot(request).await.unwrap()
    };
    let kept = app(true);
    send(kept.clone()).await;
    let replay = send(kept).await;
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    let [work, replayed] = &spans
        .iter()
        .filter(|span| span.name == "idempotency")
        .collect::<Vec<_>>()[..]
    else {
        panic!("two requests' spans: {spans:#?}")
    };
    assert_ne!(
        work.span_context.trace_id(),
        replayed.span_context.trace_id(),
        "each request a trace of its own"
    );
    let links: Vec<_> = replayed
        .links
        .iter()
        .map(|link| link.span_context.clone())
        .collect();
    assert_eq!(links.len(), 1, "{replayed:#?}");
    assert_eq!(links[0].trace_id(), work.span_context.trace_id());
    assert_eq!(links[0].span_id(), work.span_context.span_id());
    assert!(work.links.is_empty(), "the work links to nothing");
    let traceparent = format!(
        "00-{}-{}-01",
        work.span_context.trace_id(),
        work.span_context.span_id()
    );
    assert_eq!(
        text(replayed, "idempotency.replay_of").as_deref(),
        Some(traceparent.as_str())
    );
    assert_eq!(
        replay.headers()["idempotency-replay-of"],
        traceparent.as_str()
    );

    exporter.reset();
    let plain = app(false);
    send(plain.clone()).await;
    let replay = send(plain).await;
    provider.force_flush().unwrap();
    let spans = exporter.get_finished_spans().unwrap();
    assert!(spans.iter().all(|span| span.links.is_empty()), "{spans:#?}");
    assert!(replay.headers().get("idempotency-replay-of").is_none());
}
