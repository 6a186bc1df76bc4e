//! The observer's metrics rendered by Prometheus's own exporter
//! (`metrics-exporter-prometheus`'s recorder, installed for this process):
//! the names and labels `observe::Metrics` documents, with the counts of
//! what happened, through the engine and through the HTTP layer under axum;
//! and the dashboards (`dashboards/grafana/`, `template.yaml`) checked
//! against the names the code emits.

#[path = "prometheus/dashboards.rs"]
mod dashboards;
#[path = "prometheus/readers.rs"]
mod readers;

/// OpenTelemetry through tracing, in the same binary (CI's disk).
#[path = "prometheus/opentelemetry.rs"]
mod spans;

use axum::{body::Body, http::Request, routing::post, Router};
use lambda_idempotency::{
    http::IdempotencyLayer, observe::Metrics, Attempt, Engine, Fingerprint, MemoryStore,
};
use metrics_exporter_prometheus::PrometheusBuilder;
use tower::ServiceExt;

/// The value of the sample named `name` with exactly these `labels`, in
/// `rendered` (Prometheus's text format), if there is one.
fn sample(rendered: &str, name: &str, labels: &str) -> Option<f64> {
    let series = format!("{name}{{{labels}}} ");
    rendered
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse().ok())
}

#[tokio::test]
async fn prometheus_renders_what_each_port_answered() {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .expect("the only recorder of this test binary");
    let engine = Engine::builder(MemoryStore::new())
        .observer(Metrics)
        .build();

    let attempt = Attempt::new("charges", "k1", Fingerprint::of_bytes(b"{}"));
    for _ in 0..3 {
        engine
            .execute(&attempt, || async { Ok::<_, ()>(1) })
            .await
            .unwrap();
    }
    let reused = Attempt::new("charges", "k1", Fingerprint::of_bytes(b"other"));
    let _ = engine.execute(&reused, || async { Ok::<_, ()>(1) }).await;

    let app = Router::new()
        .route("/v1/charges", post(|| async { "ch_1" }))
        .layer(IdempotencyLayer::new(engine.clone()).shared_scope());
    for _ in 0..2 {
        let request = Request::post("/v1/charges")
            .header("idempotency-key", "h1")
            .body(Body::from("{}"))
            .unwrap();
        app.clone().oneshot(request).await.unwrap();
    }

    let rendered = handle.render();
    let requests = |port: &str, outcome: &str| {
        sample(
            &rendered,
            "idempotency_requests_total",
            &format!("port=\"{port}\",outcome=\"{outcome}\""),
        )
    };
    assert_eq!(requests("engine", "fresh"), Some(1.0), "{rendered}");
    assert_eq!(requests("engine", "replay"), Some(2.0), "{rendered}");
    assert_eq!(requests("engine", "key_reused"), Some(1.0), "{rendered}");
    assert_eq!(requests("http", "fresh"), Some(1.0), "{rendered}");
    assert_eq!(requests("http", "replay"), Some(1.0), "{rendered}");
    // The durations: a summary (the recorder's default for histograms),
    // counted per series.
    assert_eq!(
        sample(
            &rendered,
            "idempotency_request_duration_seconds_count",
            "port=\"engine\",outcome=\"replay\""
        ),
        Some(2.0),
        "{rendered}"
    );
    // Every store call, by operation and result: six claims (a fresh
    // run's, each replay's, the reused key's, through both ports) and two
    // completions.
    let store_calls = |operation: &str| {
        sample(
            &rendered,
            "idempotency_store_duration_seconds_count",
            &format!("operation=\"{operation}\",result=\"ok\""),
        )
    };
    assert_eq!(store_calls("claim"), Some(6.0), "{rendered}");
    assert_eq!(store_calls("complete"), Some(2.0), "{rendered}");
    assert!(
        !rendered.contains("k1") && !rendered.contains("h1"),
        "no key is a label: {rendered}"
    );
}
