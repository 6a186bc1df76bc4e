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
}

impl EmfMetrics {
    /// Metrics in the CloudWatch namespace `namespace`.
    pub fn new(namespace: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            writer: Arc::new(|line| println!("{line}")),
        }
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
        let timestamp = crate::clock::epoch_ms(SystemTime::now());
        let line = serde_json::json!({
            "_aws": {
                "Timestamp": timestamp,
                "CloudWatchMetrics": [{
                    "Namespace": self.namespace,
                    "Dimensions": [[dimension]],
                    "Metrics": [{ "Name": metric, "Unit": "Count" }],
                }],
            },
            dimension: value,
            metric: 1,
        });
        (self.writer)(&line.to_string());
    }
}

impl fmt::Debug for EmfMetrics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmfMetrics")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}
