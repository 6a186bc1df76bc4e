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

/// A server that propagates: its request span takes its parent from the
/// request's `traceparent` (OpenTelemetry's own W3C propagator), as a
/// tower-http or actix tracing middleware does, and the layer runs inside.
/// Returns the response and the exporter's spans so far.
mod propagated {
    use super::*;
    use opentelemetry::{
        propagation::TextMapPropagator,
        trace::{SpanContext, TraceContextExt},
    };
    use opentelemetry_sdk::{propagation::TraceContextPropagator, trace::Sampler};
    use std::collections::HashMap;
    use tracing::Instrument;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    pub const HEADER: &str = "idempotency-replay-of";

    pub struct Traced {
        pub exporter: InMemorySpanExporter,
        pub provider: SdkTracerProvider,
        pub app: Router,
    }

    pub fn traced(sampler: Sampler) -> (Traced, tracing::subscriber::DefaultGuard) {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_sampler(sampler)
            .with_simple_exporter(exporter.clone())
            .build();
        let subscriber = tracing_subscriber::registry()
            .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("server")));
        let guard = tracing::subscriber::set_default(subscriber);
        let app = Router::new()
            .route("/v1/charges", post(|| async { "ch_1" }))
            .layer(
                IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build())
                    .shared_scope()
                    .replay_trace_header(axum::http::HeaderName::from_static(HEADER)),
            );
        (
            Traced {
                exporter,
                provider,
                app,
            },
            guard,
        )
    }

    /// The request as a propagating server serves it: under a `server`
    /// span whose parent is the request's `traceparent`.
    pub async fn serve(app: &Router, traceparent: &str) -> axum::response::Response {
        let carrier = HashMap::from([("traceparent".to_owned(), traceparent.to_owned())]);
        let parent = TraceContextPropagator::new().extract(&carrier);
        assert!(parent.span().span_context().is_valid(), "{traceparent}");
        let span = tracing::info_span!("server");
        span.set_parent(parent)
            .expect("a parent before the span starts");
        let request = Request::post("/v1/charges")
            .header("idempotency-key", "k")
            .header("traceparent", traceparent)
            .body(Body::from("{}"))
            .unwrap();
        app.clone().oneshot(request).instrument(span).await.unwrap()
    }

    pub fn links(span: &SpanData) -> Vec<SpanContext> {
        span.links
            .iter()
            .map(|link| link.span_context.clone())
            .collect()
    }
}

const CALLER_1: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const CALLER_2: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

/// Behind a propagating server, the work's span is in the first caller's
/// trace, under the server's span; the replay (in the second caller's
/// trace) links to that span, and the header names it, sampled.
#[tokio::test]
async fn behind_a_propagating_server_the_replay_links_to_the_work_in_the_callers_trace() {
    use opentelemetry_sdk::trace::Sampler;
    let (traced, _guard) = propagated::traced(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
    propagated::serve(&traced.app, CALLER_1).await;
    let replay = propagated::serve(&traced.app, CALLER_2).await;
    traced.provider.force_flush().unwrap();
    let spans = traced.exporter.get_finished_spans().unwrap();
    let named =
        |name: &str| -> Vec<&SpanData> { spans.iter().filter(|s| s.name == name).collect() };
    let (servers, layers) = (named("server"), named("idempotency"));
    assert_eq!((servers.len(), layers.len()), (2, 2), "{spans:#?}");
    let (work, replayed) = (layers[0], layers[1]);
    assert_eq!(
        work.span_context.trace_id().to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736",
        "the caller's trace"
    );
    assert_eq!(work.parent_span_id, servers[0].span_context.span_id());
    assert_eq!(
        replayed.span_context.trace_id().to_string(),
        "0af7651916cd43dd8448eb211c80319c"
    );
    let links = propagated::links(replayed);
    assert_eq!(links.len(), 1);
    assert_eq!(links[0].trace_id(), work.span_context.trace_id());
    assert_eq!(links[0].span_id(), work.span_context.span_id());
    assert!(links[0].is_sampled() && links[0].is_remote());
    assert_eq!(
        replay.headers()[propagated::HEADER],
        format!(
            "00-{}-{}-01",
            work.span_context.trace_id(),
            work.span_context.span_id()
        )
        .as_str()
    );
}

/// The first caller's trace is not sampled (its `traceparent` flags 00,
/// a parent-based sampler): nothing of the work is exported. The kept
/// context says so (flags 00), and the replay's link is marked unsampled:
/// a reader of the replay's trace knows the link leads to nothing stored.
#[tokio::test]
async fn a_link_to_work_whose_trace_was_not_sampled_says_so() {
    use opentelemetry_sdk::trace::Sampler;
    let (traced, _guard) = propagated::traced(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
    let unsampled = CALLER_1.replace("-01", "-00");
    propagated::serve(&traced.app, &unsampled).await;
    let replay = propagated::serve(&traced.app, CALLER_2).await;
    traced.provider.force_flush().unwrap();
    let spans = traced.exporter.get_finished_spans().unwrap();
    assert!(
        spans
            .iter()
            .all(|span| span.span_context.trace_id().to_string()
                != "4bf92f3577b34da6a3ce929d0e0e4736"),
        "nothing of the unsampled trace exported: {spans:#?}"
    );
    let replayed = spans
        .iter()
        .find(|span| span.name == "idempotency")
        .expect("the replay's span");
    let links = propagated::links(replayed);
    assert_eq!(links.len(), 1, "{replayed:#?}");
    assert_eq!(
        links[0].trace_id().to_string(),
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    assert!(!links[0].is_sampled());
    let header = replay.headers()[propagated::HEADER].to_str().unwrap();
    assert!(
        header.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && header.ends_with("-00"),
        "{header}"
    );
    // The work's own span, not the caller's.
    assert!(!header.contains("00f067aa0ba902b7"), "{header}");
}

/// With every trace dropped (`Sampler::AlwaysOff`), the work's span is
/// still the one kept, unsampled, and nothing is exported.
#[tokio::test]
async fn with_every_trace_dropped_the_kept_context_is_unsampled() {
    use opentelemetry_sdk::trace::Sampler;
    let (traced, _guard) = propagated::traced(Sampler::AlwaysOff);
    propagated::serve(&traced.app, CALLER_1).await;
    let replay = propagated::serve(&traced.app, CALLER_2).await;
    traced.provider.force_flush().unwrap();
    assert!(traced.exporter.get_finished_spans().unwrap().is_empty());
    let header = replay.headers()[propagated::HEADER].to_str().unwrap();
    assert!(
        header.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-") && header.ends_with("-00"),
        "{header}"
    );
}
