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

/// The table size reaches Prometheus as gauges, labelled by store and
/// accuracy only: set by each sample (not added to), and only when
/// something samples it.
#[test]
fn the_table_size_is_a_gauge_prometheus_renders() {
    // A recorder of this test's own, for this thread (the test above
    // installs the binary's global one).
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let engine = Engine::builder(MemoryStore::new())
        .observer(Metrics)
        .build();
    runtime.block_on(async {
        for key in ["t1", "t2", "t3", "t4"] {
            let attempt = Attempt::new("charges", key, Fingerprint::of_bytes(b"{}"));
            engine
                .execute(&attempt, || async { Ok::<_, ()>(1) })
                .await
                .unwrap();
        }
    });
    assert!(
        !handle.render().contains("idempotency_table_"),
        "no sample, no gauge"
    );
    let labels = "store=\"memory\",accuracy=\"exact\"";
    let size = runtime
        .block_on(engine.sample_table_size())
        .unwrap()
        .unwrap();
    let rendered = handle.render();
    assert!(
        rendered.contains("# TYPE idempotency_table_records gauge"),
        "{rendered}"
    );
    assert_eq!(
        sample(&rendered, "idempotency_table_records", labels),
        Some(4.0),
        "{rendered}"
    );
    assert_eq!(
        sample(&rendered, "idempotency_table_in_progress", labels),
        Some(0.0)
    );
    let bytes = size.bytes.expect("the memory store's bytes") as f64;
    assert_eq!(
        sample(&rendered, "idempotency_table_bytes", labels),
        Some(bytes)
    );
    runtime
        .block_on(engine.forget("charges", "t1"))
        .expect("forgotten");
    runtime.block_on(engine.sample_table_size()).unwrap();
    let rendered = handle.render();
    assert_eq!(
        sample(&rendered, "idempotency_table_records", labels),
        Some(3.0),
        "set, not added: {rendered}"
    );
}
