//! The dashboards cannot drift from the code: real requests run through
//! the engine and the HTTP layer under axum with both exporters observing
//! (`observe::Metrics` into a Prometheus recorder, `EmfMetrics` into
//! captured lines), so that every metric either dashboard reads is
//! emitted; then every metric name, label, dimension and filtered value
//! that `dashboards/grafana/idempotency.json` and the CloudWatch dashboard
//! of `template.yaml` name must be among what was emitted, with a
//! histogram's `_bucket`, `_sum` and `_count` where they read one.

use super::readers::{dashboard_body, widget_metrics, EmfEmitted, Exposition, PromQl};
use axum::{body::Body, http::Request, routing::post, Router};
use lambda_idempotency::{
    http::IdempotencyLayer,
    observe::{
        Metrics, CONFLICTS_RETRIED, PENDING_KEY_AGE, REQUESTS, STORE_DURATION, TABLE_BYTES,
        TABLE_IN_PROGRESS, TABLE_RECORDS, TAKEOVERS,
    },
    testing::ManualClock,
    Attempt, EmfMetrics, Engine, EngineBuilder, Fingerprint, MemoryStore, StoreErrorKind,
};
use metrics_exporter_prometheus::PrometheusBuilder;
use std::{
    collections::BTreeSet,
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::sync::Notify;
use tower::ServiceExt;

/// The namespace the template's `MetricsNamespace` is given here.
const NAMESPACE: &str = "LambdaIdempotency";
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// What the two exporters rendered of a workload that meets every event:
/// the Prometheus exposition, and the EMF lines.
fn emitted() -> (String, Vec<String>) {
    // This test's own recorder, for this thread only: the other tests of
    // this binary install theirs globally and count what they send.
    let recorder = PrometheusBuilder::new()
        .set_buckets(&[0.001, 0.01, 0.1, 1.0, 10.0])
        .expect("buckets")
        .build_recorder();
    let prometheus = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let written = Arc::clone(&lines);
    let emf = EmfMetrics::new(NAMESPACE)
        .with_writer(move |line| written.lock().unwrap().push(line.to_owned()));
    // One thread: every task reports to the recorder set above.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(workload(emf));
    let lines = lines.lock().unwrap().clone();
    (prometheus.render(), lines)
}

/// Fresh requests, a replay from the store and one from the cache, a key
/// reused, a duplicate while the first runs (409, its claim's age), a
/// lapsed lease taken over (and the first run's lease lost), a conflict
/// retried (a store call that failed), the table size sampled: through
/// the HTTP layer and the engine.
async fn workload(emf: EmfMetrics) {
    let clock = ManualClock::new(1_700_000_000_000);
    let store = MemoryStore::new();
    let observed = |builder: EngineBuilder<MemoryStore>| {
        builder
            .clock(clock.clone())
            .observer(Metrics)
            .observer(emf.clone())
    };
    let engine = observed(Engine::builder(store.clone())).build();

    // HTTP: fresh, replay, key reused, and a duplicate of a request that
    // is still running.
    let entered = Arc::new(Notify::new());
    let release = Arc::new(Notify::new());
    let (on_entry, on_release) = (Arc::clone(&entered), Arc::clone(&release));
    let app = Router::new()
        .route(
            "/v1/charges",
            post(move |body: String| async move {
                if body == "slow" {
                    on_entry.notify_one();
                    on_release.notified().await;
                }
                "ch_1"
            }),
        )
        .layer(IdempotencyLayer::new(engine.clone()).shared_scope());
    let send = |key: &'static str, body: &'static str| {
        let request = Request::post("/v1/charges")
            .header("idempotency-key", key)
            .body(Body::from(body))
            .unwrap();
        app.clone().oneshot(request)
    };
    let statuses = [
        send("h1", "{}").await.unwrap().status(),
        send("h1", "{}").await.unwrap().status(),
        send("h1", "{\"other\":1}").await.unwrap().status(),
    ];
    assert_eq!(statuses.map(|status| status.as_u16()), [200, 200, 422]);
    let first = tokio::spawn(send("h2", "slow"));
    entered.notified().await;
    clock.advance(Duration::from_secs(3));
    assert_eq!(send("h2", "slow").await.unwrap().status(), 409);
    release.notify_one();
    assert_eq!(first.await.unwrap().unwrap().status(), 200);

    // The engine: a replay from the cache.
    let cached = observed(Engine::builder(store.clone()).cache(16)).build();
    let attempt = Attempt::new("charges", "e1", Fingerprint::of_bytes(b"{}"));
    for _ in 0..3 {
        cached
            .execute(&attempt, || async { Ok::<_, ()>(1u8) })
            .await
            .unwrap();
    }

    // A run that outlives its lease: a retry takes over, and the first
    // run's lease is lost.
    let retry = engine.clone();
    let lapses = clock.clone();
    let lapsed = Attempt::new("charges", "e2", Fingerprint::of_bytes(b"{}"));
    let _ = engine
        .execute(&lapsed, || async move {
            lapses.advance(Duration::from_secs(24 * 3600));
            let again = Attempt::new("charges", "e2", Fingerprint::of_bytes(b"{}"));
            retry
                .execute(&again, || async { Ok::<_, ()>(2u8) })
                .await
                .expect("the retry takes over");
            Ok::<_, ()>(1u8)
        })
        .await;

    // A claim that conflicted in the store, tried again.
    store.fail_next_with(1, StoreErrorKind::Conflict);
    engine
        .execute(
            &Attempt::new("charges", "e3", Fingerprint::of_bytes(b"{}")),
            || async { Ok::<_, ()>(1u8) },
        )
        .await
        .unwrap();

    // The table size, sampled: the memory store knows its records, those
    // in progress and their bytes, so every gauge is set.
    engine.sample_table_size().await.unwrap().expect("counted");
}

/// Every expression of a Grafana dashboard: its panels' targets (rows'
/// panels included) and its query variables'.
fn grafana_expressions(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    fn panels(list: &serde_json::Value, found: &mut Vec<(String, String)>) {
        for panel in list.as_array().into_iter().flatten() {
            let title = panel["title"].as_str().unwrap_or_default();
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    found.push((title.to_owned(), expr.to_owned()));
                }
            }
            panels(&panel["panels"], found);
        }
    }
    let mut found = Vec::new();
    panels(&dashboard["panels"], &mut found);
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] == "query" {
            let query = variable["query"]["query"]
                .as_str()
                .or_else(|| variable["query"].as_str())
                .expect("a variable's query");
            // label_values(metric, label): the metric and the label it reads.
            let query = match query
                .strip_prefix("label_values(")
                .and_then(|args| args.strip_suffix(')'))
                .and_then(|args| args.split_once(','))
            {
                Some((metric, label)) => format!("group by ({}) ({metric})", label.trim()),
                None => query.to_owned(),
            };
            found.push((format!("variable {}", variable["name"]), query));
        }
    }
    found
}

/// What one dashboard reads that the code did not emit.
fn prometheus_drift(exposition: &Exposition, dashboard: &serde_json::Value) -> Vec<String> {
    let mut drift = Vec::new();
    let expressions = grafana_expressions(dashboard);
    assert!(
        expressions.len() >= 6,
        "the dashboard's queries: {expressions:?}"
    );
    for (panel, expr) in &expressions {
        let read = PromQl::parse(expr);
        if read.selectors.is_empty() {
            drift.push(format!("{panel}: reads no idempotency_ metric: {expr}"));
        }
        let mut labels = BTreeSet::new();
        for (name, matchers) in &read.selectors {
            let Some(series) = exposition.series.get(name) else {
                drift.push(format!("{panel}: {name} was not emitted"));
                continue;
            };
            let (family, kind) = exposition.family(name).expect("a declared family");
            if name.ends_with("_bucket") && kind != "histogram" {
                drift.push(format!("{panel}: {name} is of a {kind}, not a histogram"));
            }
            if expr.contains("histogram_quantile") && kind == "histogram" && family == name {
                drift.push(format!(
                    "{panel}: histogram_quantile of {name}, not its _bucket"
                ));
            }
            labels.extend(series.iter().flat_map(|labels| labels.keys().cloned()));
            for matcher in matchers {
                let values = exposition.values(name, &matcher.label);
                if values.is_empty() {
                    drift.push(format!("{panel}: {name} has no label {}", matcher.label));
                    continue;
                }
                // A literal value, or a literal alternation, must be one
                // emitted; a dashboard variable ($port) is the user's.
                let literal = !matcher.value.contains('$')
                    && matcher
                        .value
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '|' || c == '+');
                if literal && (matcher.op == "=" || matcher.op == "=~") {
                    for value in matcher.value.split('|') {
                        if !values.contains(value) {
                            drift.push(format!(
                                "{panel}: {name}{{{}=\"{value}\"}} was not emitted (only {values:?})",
                                matcher.label
                            ));
                        }
                    }
                }
            }
        }
        for label in &read.grouping {
            if !labels.contains(label) {
                drift.push(format!(
                    "{panel}: groups by {label}, which no series it reads has"
                ));
            }
        }
    }
    drift
}

/// What the template's dashboard reads that the code did not emit.
fn cloudwatch_drift(emitted: &EmfEmitted, template: &str) -> Vec<String> {
    let body = dashboard_body(
        template,
        &[
            ("MetricsNamespace", NAMESPACE),
            ("AWS::Region", "eu-west-1"),
        ],
    );
    let read = widget_metrics(&body);
    assert!(read.len() >= 8, "the widgets' metrics: {read:?}");
    let mut drift = Vec::new();
    for (widget, metric) in read {
        if !emitted.metrics.contains(&metric.metric) {
            drift.push(format!(
                "{widget}: {:?} was not emitted (emitted: {:?})",
                metric.metric, emitted.metrics
            ));
        }
        for (dimension, values) in &metric.filters {
            for value in values {
                let known = emitted.values.get(dimension);
                if !known.is_some_and(|known| known.contains(value)) {
                    drift.push(format!(
                        "{widget}: {dimension}={value} was not emitted (only {known:?})"
                    ));
                }
            }
        }
    }
    drift
}

#[test]
fn the_dashboards_read_only_what_the_code_emits() {
    let (rendered, lines) = emitted();
    let exposition = Exposition::parse(&rendered);
    // The workload met every event (under the names the code gives them:
    // what the dashboards read is checked below).
    for outcome in [
        "fresh",
        "replay",
        "cached_replay",
        "key_reused",
        "in_progress",
        "lease_lost",
    ] {
        assert!(
            exposition.values(REQUESTS, "outcome").contains(outcome),
            "{outcome}: {rendered}"
        );
    }
    for name in [
        format!("{PENDING_KEY_AGE}_bucket"),
        TAKEOVERS.to_owned(),
        CONFLICTS_RETRIED.to_owned(),
        format!("{STORE_DURATION}_bucket"),
        TABLE_RECORDS.to_owned(),
        TABLE_IN_PROGRESS.to_owned(),
        TABLE_BYTES.to_owned(),
    ] {
        assert!(exposition.series.contains_key(&name), "{name}: {rendered}");
    }

    let grafana = std::fs::read_to_string(format!("{ROOT}/dashboards/grafana/idempotency.json"))
        .expect("the Grafana dashboard");
    let grafana: serde_json::Value = serde_json::from_str(&grafana).expect("JSON");
    let drift = prometheus_drift(&exposition, &grafana);
    assert!(drift.is_empty(), "Grafana: {drift:#?}");

    let emf = EmfEmitted::parse(lines.iter().map(String::as_str));
    let template = std::fs::read_to_string(format!("{ROOT}/template.yaml")).expect("template");
    let drift = cloudwatch_drift(&emf, &template);
    assert!(drift.is_empty(), "CloudWatch: {drift:#?}");
    // The functions write the namespace the dashboard reads.
    assert!(template.contains("IDEMPOTENCY_METRICS_NAMESPACE: !Ref MetricsNamespace"));
    for function in ["charges", "receipts", "ledger"] {
        let code = std::fs::read_to_string(format!("{ROOT}/functions/{function}/src/main.rs"))
            .expect("the function's code");
        assert!(
            code.contains("\"IDEMPOTENCY_METRICS_NAMESPACE\""),
            "{function} reads the namespace"
        );
    }
}

/// The check catches what it is for: a dashboard that names a metric, a
/// label or a value the code does not emit (each renamed here in a copy).
#[test]
fn a_renamed_metric_label_or_value_is_drift() {
    let (rendered, lines) = emitted();
    let exposition = Exposition::parse(&rendered);
    let grafana = std::fs::read_to_string(format!("{ROOT}/dashboards/grafana/idempotency.json"))
        .expect("the Grafana dashboard");
    for (from, to) in [
        ("idempotency_takeovers_total", "idempotency_takeover_total"),
        (
            "idempotency_pending_key_age_seconds_bucket",
            "idempotency_pending_key_age_seconds",
        ),
        ("by (attempt)", "by (attempt_number)"),
        ("by (le, operation)", "by (le, store_operation)"),
        ("outcome=\\\"in_progress\\\"", "outcome=\\\"conflict\\\""),
        ("idempotency_table_records", "idempotency_table_rows"),
        (
            "by (store, accuracy) (idempotency_table_bytes)",
            "by (table) (idempotency_table_bytes)",
        ),
    ] {
        assert!(grafana.contains(from), "{from}");
        let renamed: serde_json::Value =
            serde_json::from_str(&grafana.replace(from, to)).expect("JSON");
        assert!(
            !prometheus_drift(&exposition, &renamed).is_empty(),
            "{from} -> {to} went unseen"
        );
    }
    let emf = EmfEmitted::parse(lines.iter().map(String::as_str));
    let template = std::fs::read_to_string(format!("{ROOT}/template.yaml")).expect("template");
    for (from, to) in [
        ("\"PendingKeyAge\"", "\"PendingKeyAgeMs\""),
        (
            "MetricName=\\\"Takeovers\\\"",
            "MetricName=\\\"Takeover\\\"",
        ),
        (
            "{\\\"${MetricsNamespace}\\\",Attempt}",
            "{\\\"${MetricsNamespace}\\\",Attempt,Port}",
        ),
        (
            "Outcome=\\\"cached_replay\\\"",
            "Outcome=\\\"cache_replay\\\"",
        ),
        (
            "MetricName=\\\"TableRecords\\\"",
            "MetricName=\\\"TableRows\\\"",
        ),
        (
            "{\\\"${MetricsNamespace}\\\",Accuracy,Store}",
            "{\\\"${MetricsNamespace}\\\",Store}",
        ),
    ] {
        assert!(template.contains(from), "{from}");
        assert!(
            !cloudwatch_drift(&emf, &template.replace(from, to)).is_empty(),
            "{from} -> {to} went unseen"
        );
    }
}

/// Every panel of the Grafana dashboard queries the data source chosen in
/// its `datasource` variable (a Prometheus one), has a title and a unit,
/// and sits on Grafana's 24-column grid without covering another.
#[test]
fn every_grafana_panel_reads_the_chosen_prometheus_and_fits_the_grid() {
    let grafana = std::fs::read_to_string(format!("{ROOT}/dashboards/grafana/idempotency.json"))
        .expect("the Grafana dashboard");
    let grafana: serde_json::Value = serde_json::from_str(&grafana).expect("JSON");
    let variables = grafana["templating"]["list"].as_array().expect("variables");
    assert!(variables.iter().any(|v| v["name"] == "datasource"
        && v["type"] == "datasource"
        && v["query"] == "prometheus"));
    let mut cells = BTreeSet::new();
    for panel in grafana["panels"].as_array().expect("panels") {
        let title = panel["title"].as_str().expect("a title");
        assert!(
            panel["fieldConfig"]["defaults"]["unit"].is_string(),
            "{title}: a unit"
        );
        let sources = std::iter::once(&panel["datasource"]).chain(
            panel["targets"]
                .as_array()
                .expect("targets")
                .iter()
                .map(|target| &target["datasource"]),
        );
        for source in sources {
            assert_eq!(source["type"], "prometheus", "{title}");
            assert_eq!(source["uid"], "${datasource}", "{title}");
        }
        let at = |field: &str| panel["gridPos"][field].as_u64().expect("gridPos");
        let (x, y, w, h) = (at("x"), at("y"), at("w"), at("h"));
        assert!(x + w <= 24, "{title}: inside the 24 columns");
        for cell in (x..x + w).flat_map(|column| (y..y + h).map(move |row| (column, row))) {
            assert!(
                cells.insert(cell),
                "{title} covers another panel at {cell:?}"
            );
        }
    }
}
