//! An axum server whose idempotency spans go to OpenTelemetry over OTLP:
//! the crate's spans are `tracing` spans (the HTTP layer's `idempotency`
//! span with `idempotency.outcome` and `http.response.status_code`, and a
//! database client span for each store call with `db.system.name`,
//! `db.operation.name` and `error.type`), which `tracing-opentelemetry`
//! hands to the OpenTelemetry SDK, whose OTLP exporter sends them to a
//! collector (Jaeger, Grafana Tempo, the OpenTelemetry Collector, AWS
//! X-Ray through the ADOT collector).
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! lambda-idempotency = { version = "0.1", default-features = false, features = ["dynamodb", "axum"] }
//! opentelemetry = { version = "0.33", default-features = false, features = ["trace"] }
//! opentelemetry_sdk = { version = "0.33", default-features = false, features = ["trace"] }
//! opentelemetry-otlp = { version = "0.33", default-features = false, features = ["grpc-tonic", "trace"] }
//! tracing-opentelemetry = { version = "0.34", default-features = false }
//! tracing-subscriber = { version = "0.3", default-features = false, features = ["registry"] }
//! axum = "0.8"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! With a collector listening for OTLP over gRPC (by default on
//! `http://localhost:4317`; `OTEL_EXPORTER_OTLP_ENDPOINT` says otherwise),
//! for example `docker run -p 4317:4317 -p 16686:16686 jaegertracing/jaeger`:
//! `cargo run --example opentelemetry --features axum`, then
//!
//! ```sh
//! curl -i localhost:3000/v1/charges -H 'idempotency-key: 8e03978e' -d '{"amount":1250}'
//! curl -i localhost:3000/v1/charges -H 'idempotency-key: 8e03978e' -d '{"amount":1250}'
//! ```
//!
//! and the two requests' traces show a fresh run (a claim and a completion
//! beneath it) and a replay (one claim, refused). `tests/prometheus.rs`
//! checks the same spans and attributes through the SDK's in-memory
//! exporter, and this exporter against an OTLP receiver.

use axum::{routing::post, Router};
use lambda_idempotency::{http::IdempotencyLayer, Engine, MemoryStore};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Batched, sent from a background task of the runtime.
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("charges")));
    tracing::subscriber::set_global_default(subscriber)?;

    let engine = Engine::builder(MemoryStore::new()).build();
    let app = Router::new()
        .route("/v1/charges", post(|| async { "{\"id\":\"ch_1\"}" }))
        // A single-tenant service: every caller shares the records.
        .layer(IdempotencyLayer::new(engine).shared_scope());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    // The spans still batched, sent before the process ends.
    provider.shutdown()?;
    Ok(())
}
