//! An axum server whose idempotency outcomes Prometheus scrapes: the
//! engine's observer reports to the `metrics` facade, whose recorder is
//! `metrics-exporter-prometheus`'s, rendered on `GET /metrics`.
//!
//! In `Cargo.toml`:
//!
//! ```toml
//! [dependencies]
//! lambda-idempotency = { version = "0.1", default-features = false, features = ["dynamodb", "axum", "metrics"] }
//! metrics-exporter-prometheus = { version = "0.18", default-features = false }
//! axum = "0.8"
//! tokio = { version = "1", features = ["macros", "rt-multi-thread"] }
//! ```
//!
//! `cargo run --example prometheus --features axum,metrics`, then
//!
//! ```sh
//! curl -i localhost:3000/v1/charges -H 'idempotency-key: 8e03978e' -d '{"amount":1250}'
//! curl -i localhost:3000/v1/charges -H 'idempotency-key: 8e03978e' -d '{"amount":1250}'
//! curl -s localhost:3000/metrics | grep idempotency_
//! ```
//!
//! It keeps records in memory (one process); a server of several uses
//! DynamoDB, PostgreSQL or Redis (see `axum_server`).

use axum::{routing::get, routing::post, Router};
use lambda_idempotency::{http::IdempotencyLayer, observe::Metrics, Engine, MemoryStore};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let engine = Engine::builder(MemoryStore::new())
        .observer(Metrics)
        .build();
    let charges = Router::new()
        .route("/v1/charges", post(|| async { "{\"id\":\"ch_1\"}" }))
        // A single-tenant service: every caller shares the records.
        .layer(IdempotencyLayer::new(engine).shared_scope());
    // The metrics route outside the layer: scrapes are not idempotent requests.
    let app = charges.route("/metrics", get(move || async move { prometheus.render() }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app).await?;
    Ok(())
}
