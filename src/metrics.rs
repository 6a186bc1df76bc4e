//! Counts in CloudWatch Embedded Metric Format: one JSON line per event on
//! standard output, which Lambda sends to CloudWatch Logs and CloudWatch
//! turns into metrics, with no API call and no agent.

use std::{fmt, sync::Arc, time::SystemTime};

type Writer = Arc<dyn Fn(&str) + Send + Sync>;

/// Writes CloudWatch Embedded Metric Format lines to standard output (which
/// Lambda sends to CloudWatch Logs): the HTTP layer one a request, a count
/// named `IdempotentRequests` with the dimension `Outcome`
/// ([`IdempotencyLayer::metrics`]);
/// a batch one for each record it gives up on as final, a count named
/// `UnprocessableRecords` with the dimension `Reason`
/// ([`Batch::metrics`]).
#[cfg_attr(
    feature = "http",
    doc = "",
    doc = "[`IdempotencyLayer::metrics`]: crate::http::IdempotencyLayer::metrics"
)]
#[cfg_attr(
    not(feature = "http"),
    doc = "",
    doc = "[`IdempotencyLayer::metrics`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/struct.IdempotencyLayer.html#method.metrics"
)]
#[cfg_attr(
    feature = "consumers",
    doc = "",
    doc = "[`Batch::metrics`]: crate::consumers::Batch::metrics"
)]
#[cfg_attr(
    not(feature = "consumers"),
    doc = "",
    doc = "[`Batch::metrics`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/consumers/struct.Batch.html#method.metrics"
)]
#[derive(Clone)]
pub struct EmfMetrics {
    namespace: String,
    writer: Writer,
    store_calls: bool,
}

impl EmfMetrics {
    /// Metrics in the CloudWatch namespace `namespace`.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            writer: Arc::new(|line| println!("{line}")),
            store_calls: false,
        }
    }

    /// Also a line for each store call the engine makes, `StoreCallTime`
    /// (milliseconds) by `Operation` and `Result` (`ok`, or the error's
    /// kind). Off by default: it adds two or three lines a request to the
    /// function's logs.
    #[must_use]
    pub fn store_calls(mut self) -> Self {
        self.store_calls = true;
        self
    }

    /// Sends the lines somewhere else than standard output (for tests, or a
    /// logger of your own).
    pub fn with_writer(mut self, writer: impl Fn(&str) + Send + Sync + 'static) -> Self {
        self.writer = Arc::new(writer);
        self
    }

    /// One count of `metric` with `dimension` = `value`.
    #[cfg_attr(not(any(feature = "http", feature = "consumers")), allow(dead_code))]
    pub(crate) fn count(&self, metric: &str, dimension: &str, value: &str) {
        self.emit(&[(dimension, value)], &[(metric, "Count", 1.into())]);
    }

    /// One line: each metric (name, unit, value) under one dimension set.
    fn emit(&self, dimensions: &[(&str, &str)], metrics: &[(&str, &str, serde_json::Value)]) {
        let timestamp = crate::clock::epoch_ms(SystemTime::now());
        let names: Vec<&str> = dimensions.iter().map(|(name, _)| *name).collect();
        let declared: Vec<serde_json::Value> = metrics
            .iter()
            .map(|(name, unit, _)| serde_json::json!({ "Name": name, "Unit": unit }))
            .collect();
        let mut line = serde_json::json!({
            "_aws": {
                "Timestamp": timestamp,
                "CloudWatchMetrics": [{
                    "Namespace": self.namespace,
                    "Dimensions": [names],
                    "Metrics": declared,
                }],
            },
        });
        for (name, value) in dimensions {
            line[*name] = serde_json::Value::from(*value);
        }
        for (name, _, value) in metrics {
            line[*name] = value.clone();
        }
        (self.writer)(&line.to_string());
    }
}

/// The engine's events in CloudWatch, from every port: `IdempotencyAnswers`
/// (a count) and `IdempotencyAnswerTime` (milliseconds) by `Port` and
/// `Outcome`, `PendingKeyAge` (milliseconds, the age of claims found in
/// progress), `Takeovers` by `Attempt` (`2` to `5`, `6+`),
/// `ConflictsRetried`, and, when something samples the store's size
/// ([`Engine::sample_table_size`](crate::Engine::sample_table_size)),
/// `TableRecords` (and `TableInProgress`, `TableBytes` where the store
/// knows them) by `Store` and `Accuracy`. Add it with
/// [`EngineBuilder::observer`](crate::EngineBuilder::observer); the HTTP
/// layer's own `IdempotentRequests` (its [`metrics`](crate::EmfMetrics)
/// setting) counts its answers besides, with the answers the layer gives
/// without the engine (a missing key, a body too large, overload). The
/// repository's `template.yaml` has a CloudWatch dashboard of these
/// metrics (`IdempotencyDashboard`), checked by a test against the lines
/// written here.
impl crate::observe::Observer for EmfMetrics {
    fn observe(&self, event: &crate::observe::Event) {
        use crate::observe::Event;
        match *event {
            Event::Answered {
                port,
                answer,
                elapsed,
            } => self.emit(
                &[("Port", port.as_str()), ("Outcome", answer.as_str())],
                &[
                    ("IdempotencyAnswers", "Count", 1.into()),
                    (
                        "IdempotencyAnswerTime",
                        "Milliseconds",
                        (elapsed.as_secs_f64() * 1000.0).into(),
                    ),
                ],
            ),
            Event::FoundInProgress { age } => self.emit(
                &[],
                &[(
                    "PendingKeyAge",
                    "Milliseconds",
                    (age.as_secs_f64() * 1000.0).into(),
                )],
            ),
            Event::TookOver { attempt } => {
                let attempt = crate::observe::attempt_label(attempt);
                self.emit(&[("Attempt", attempt)], &[("Takeovers", "Count", 1.into())]);
            }
            Event::ConflictRetried => self.emit(&[], &[("ConflictsRetried", "Count", 1.into())]),
            Event::StoreCalled {
                operation,
                elapsed,
                failed,
            } if self.store_calls => self.emit(
                &[
                    ("Operation", operation.as_str()),
                    ("Result", failed.map_or("ok", crate::StoreErrorKind::as_str)),
                ],
                &[(
                    "StoreCallTime",
                    "Milliseconds",
                    (elapsed.as_secs_f64() * 1000.0).into(),
                )],
            ),
            Event::StoreCalled { .. } => {}
            Event::TableSized { store, size } => {
                let mut metrics = vec![("TableRecords", "Count", size.records.into())];
                if let Some(in_progress) = size.in_progress {
                    metrics.push(("TableInProgress", "Count", in_progress.into()));
                }
                if let Some(bytes) = size.bytes {
                    metrics.push(("TableBytes", "Bytes", bytes.into()));
                }
                self.emit(
                    &[("Store", store), ("Accuracy", size.accuracy.as_str())],
                    &metrics,
                );
            }
        }
    }
}

impl fmt::Debug for EmfMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmfMetrics")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Attempt, Engine, Fingerprint, MemoryStore};
    use std::sync::Mutex;

    /// Each answer is one EMF line whose declared dimensions and metrics
    /// are all there, in the namespace given: what CloudWatch needs to
    /// make metrics of it.
    #[tokio::test]
    async fn the_engine_s_answers_are_emf_lines_cloudwatch_can_read() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::clone(&lines);
        let emf = EmfMetrics::new("Payments")
            .with_writer(move |line| written.lock().unwrap().push(line.to_owned()));
        let engine = Engine::builder(MemoryStore::new()).observer(emf).build();
        let attempt = Attempt::new("charges", "k1", Fingerprint::of_bytes(b"{}"));
        for _ in 0..2 {
            engine
                .execute(&attempt, || async { Ok::<_, ()>(1) })
                .await
                .unwrap();
        }
        let lines = lines.lock().unwrap();
        assert_eq!(lines.len(), 2);
        let outcomes: Vec<String> = lines
            .iter()
            .map(|line| {
                let line: serde_json::Value = serde_json::from_str(line).unwrap();
                let declared = &line["_aws"]["CloudWatchMetrics"][0];
                assert_eq!(declared["Namespace"], "Payments");
                for dimension in declared["Dimensions"][0].as_array().unwrap() {
                    assert!(line[dimension.as_str().unwrap()].is_string(), "{line}");
                }
                for metric in declared["Metrics"].as_array().unwrap() {
                    assert!(line[metric["Name"].as_str().unwrap()].is_number(), "{line}");
                }
                assert_eq!(line["Port"], "engine");
                assert_eq!(line["IdempotencyAnswers"], 1);
                line["Outcome"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(outcomes, ["fresh", "replay"]);
    }

    /// With `store_calls`, each store call is a line too: `StoreCallTime`
    /// by `Operation` and `Result`.
    #[tokio::test]
    async fn store_calls_are_lines_when_asked_for() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::clone(&lines);
        let emf = EmfMetrics::new("Payments")
            .store_calls()
            .with_writer(move |line| written.lock().unwrap().push(line.to_owned()));
        let engine = Engine::builder(MemoryStore::new()).observer(emf).build();
        let attempt = Attempt::new("charges", "k1", Fingerprint::of_bytes(b"{}"));
        engine
            .execute(&attempt, || async { Ok::<_, ()>(1) })
            .await
            .unwrap();
        let calls: Vec<(String, String)> = lines
            .lock()
            .unwrap()
            .iter()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .filter(|line| line["StoreCallTime"].is_number())
            .map(|line| {
                let declared = &line["_aws"]["CloudWatchMetrics"][0];
                assert_eq!(
                    declared["Dimensions"][0],
                    serde_json::json!(["Operation", "Result"])
                );
                (
                    line["Operation"].as_str().unwrap().to_owned(),
                    line["Result"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(
            calls,
            [
                ("claim".into(), "ok".into()),
                ("complete".into(), "ok".into())
            ]
        );
    }

    /// A table-size sample is one line: `TableRecords` and
    /// `TableInProgress` (counts) and `TableBytes` (bytes) by `Store` and
    /// `Accuracy`; none without a sample.
    #[tokio::test]
    async fn a_table_size_sample_is_one_line_of_counts_and_bytes() {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let written = Arc::clone(&lines);
        let emf = EmfMetrics::new("Payments")
            .with_writer(move |line| written.lock().unwrap().push(line.to_owned()));
        let engine = Engine::builder(MemoryStore::new()).observer(emf).build();
        let attempt = Attempt::new("charges", "k1", Fingerprint::of_bytes(b"{}"));
        engine
            .execute(&attempt, || async { Ok::<_, ()>(1) })
            .await
            .unwrap();
        let sized = |lines: &Mutex<Vec<String>>| -> Vec<serde_json::Value> {
            lines
                .lock()
                .unwrap()
                .iter()
                .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
                .filter(|line| line.get("TableRecords").is_some())
                .collect()
        };
        assert!(sized(&lines).is_empty());
        let size = engine.sample_table_size().await.unwrap().unwrap();
        let sized = sized(&lines);
        let [line] = &sized[..] else {
            panic!("one line: {sized:?}")
        };
        let declared = &line["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(
            declared["Dimensions"][0],
            serde_json::json!(["Store", "Accuracy"])
        );
        assert_eq!(
            declared["Metrics"],
            serde_json::json!([
                { "Name": "TableRecords", "Unit": "Count" },
                { "Name": "TableInProgress", "Unit": "Count" },
                { "Name": "TableBytes", "Unit": "Bytes" },
            ])
        );
        assert_eq!(
            (&line["Store"], &line["Accuracy"]),
            (&"memory".into(), &"exact".into())
        );
        assert_eq!(line["TableRecords"], 1);
        assert_eq!(line["TableInProgress"], 0);
        assert_eq!(line["TableBytes"], size.bytes.unwrap());
    }
}
