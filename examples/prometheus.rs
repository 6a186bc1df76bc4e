//! An axum server whose idempotency outcomes Prometheus scrapes: the
//! engine's observer reports to the `metrics` facade, whose recorder is
//! `metrics-exporter-prometheus`'s, rendered on `GET /metrics`. The
//! Grafana dashboard in `dashboards/grafana/idempotency.json` reads them.
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
//! `cargo run --example prometheus --features axum,metrics` (or with an
//! address: `-- 127.0.0.1:8080`), then
//!
//! ```sh
//! curl -i localhost:3000/v1/charges -H 'idempotency-key: 8e03978e' -d '{"amount":1250}'
//! curl -i localhost:3000/v1/charges -H 'idempotency-key: 8e03978e' -d '{"amount":1250}'
//! curl -s localhost:3000/metrics | grep idempotency_
//! ```
//!
//! A charge takes as long as its `work_ms` says (`{"amount":1250,"work_ms":300}`),
//! as a slow payment provider would: a duplicate sent meanwhile waits for
//! it (up to 200 ms, then `409`), and one that outlives its lease (2 s) is
//! taken over by the next retry. `make dashboard-screenshot` drives it so.
//!
//! It keeps records in memory (one process); a server of several uses
//! DynamoDB, PostgreSQL or Redis (see `axum_server`).

use axum::{routing::get, routing::post, Json, Router};
use lambda_idempotency::{http::IdempotencyLayer, observe::Metrics, Engine, MemoryStore};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use std::time::Duration;

/// The histograms' buckets, in seconds (`idempotency_request_duration_seconds`,
/// `idempotency_pending_key_age_seconds`, `idempotency_store_duration_seconds`:
/// from a store call on a local Redis to a claim stuck for a minute).
/// Without buckets the exporter renders summaries, which
/// `histogram_quantile` cannot read nor Prometheus add up across servers.
const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// A charge: waits `work_ms` (at most 10 s), as the provider's call would.
async fn charge(Json(body): Json<serde_json::Value>) -> &'static str {
    let work_ms = body["work_ms"].as_u64().unwrap_or(0).min(10_000);
    tokio::time::sleep(Duration::from_millis(work_ms)).await;
    "{\"id\":\"ch_1\"}"
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Prefix("idempotency_".into()), SECONDS_BUCKETS)?
        .install_recorder()?;
    let engine = Engine::builder(MemoryStore::new())
        .observer(Metrics)
        // Longer than a charge takes (a handler that outlives its lease may
        // run twice): short here, so that the example shows a takeover.
        .default_lease(Duration::from_secs(2))
        .build();
    // The table size is a gauge sampled on a schedule, not per request:
    // every 15 seconds here, a minute or more against a real database.
    tokio::spawn(
        engine
            .clone()
            .sample_table_size_every(Duration::from_secs(15)),
    );
    let charges = Router::new()
        .route("/v1/charges", post(charge))
        // A single-tenant service: every caller shares the records.
        .layer(
            IdempotencyLayer::new(engine)
                .shared_scope()
                .wait_for_result(Duration::from_millis(200)),
        );
    // The metrics route outside the layer: scrapes are not idempotent requests.
    let app = charges.route("/metrics", get(move || async move { prometheus.render() }));
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".into());
    let listener = tokio::net::TcpListener::bind(&address).await?;
    axum::serve(listener, app).await?;
    Ok(())
}
