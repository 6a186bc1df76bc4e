//! The engine's events as metrics, through the
//! [`metrics`](https://docs.rs/metrics) facade: whichever recorder the
//! application installed (`metrics-exporter-prometheus`, StatsD, an
//! OpenTelemetry bridge) exports them.

use super::{Event, Observer};

/// Every answer, by port and outcome: a counter.
pub const REQUESTS: &str = "idempotency_requests_total";
/// How long each answer took, by port and outcome: a histogram, in seconds.
pub const REQUEST_DURATION: &str = "idempotency_request_duration_seconds";
/// How old the claims found in progress were: a histogram, in seconds
/// (the seeds' pending-key age).
pub const PENDING_KEY_AGE: &str = "idempotency_pending_key_age_seconds";
/// Lapsed claims taken over, by the new claim's attempt number (`2` to
/// `5`, then `6+`): a counter (with the answers `in_progress`, the seeds'
/// pending time-outs).
pub const TAKEOVERS: &str = "idempotency_takeovers_total";
/// Conflicting claims tried again: a counter.
pub const CONFLICTS_RETRIED: &str = "idempotency_conflicts_retried_total";
/// How long each store call took, by operation and result (`ok`, or the
/// error's kind): a histogram, in seconds.
pub const STORE_DURATION: &str = "idempotency_store_duration_seconds";
/// The records the store holds, by store and accuracy, as its last sample
/// said: a gauge (the seeds' table size).
pub const TABLE_RECORDS: &str = "idempotency_table_records";
/// Of them, those in progress, where the store counts them: a gauge.
pub const TABLE_IN_PROGRESS: &str = "idempotency_table_in_progress";
/// The bytes the records take on the backend, indexes included, where the
/// store says: a gauge.
pub const TABLE_BYTES: &str = "idempotency_table_bytes";

/// Reports the engine's events to the `metrics` facade (feature
/// `metrics`). Add it with [`EngineBuilder::observer`](crate::EngineBuilder::observer)
/// and install a recorder, such as `metrics-exporter-prometheus`'s:
///
/// | metric | kind | labels |
/// |---|---|---|
/// | `idempotency_requests_total` | counter | `port`, `outcome` |
/// | `idempotency_request_duration_seconds` | histogram | `port`, `outcome` |
/// | `idempotency_pending_key_age_seconds` | histogram | none |
/// | `idempotency_takeovers_total` | counter | `attempt` (`2` to `5`, `6+`) |
/// | `idempotency_conflicts_retried_total` | counter | none |
/// | `idempotency_store_duration_seconds` | histogram | `operation`, `result` |
/// | `idempotency_table_records` | gauge | `store`, `accuracy` |
/// | `idempotency_table_in_progress` | gauge | `store`, `accuracy` |
/// | `idempotency_table_bytes` | gauge | `store`, `accuracy` |
///
/// `port` is one of [`Port`](super::Port)'s names (`engine`, `http`,
/// `grpc`, `event`, `batch`, `durable`, or your adapter's own), `outcome`
/// one of [`OutcomeKind`](crate::OutcomeKind)'s or
/// [`ErrorKind`](crate::ErrorKind)'s (`fresh`, `replay`, `cached_replay`,
/// `in_progress`, `key_reused`, `store_unavailable`, `operation_error`,
/// …), `operation` one of [`StoreOperation`](super::StoreOperation)'s
/// (`claim`, `complete`, `get`, …), `result` `ok` or one of
/// [`StoreErrorKind`](crate::StoreErrorKind)'s (`unavailable`,
/// `conflict`, …), `store` the store's
/// [`DB_SYSTEM`](crate::store::Store::DB_SYSTEM) (`aws.dynamodb`,
/// `postgresql`, `mysql`, `redis`, `memory`), `accuracy` `exact` or
/// `estimated`: a few values each, never a key or a record id. The table
/// gauges are set only when something samples the size
/// ([`Engine::sample_table_size`](crate::Engine::sample_table_size), or
/// its scheduled `sample_table_size_every`), and carry no table name: the
/// table is configuration, one per deployment, which the scrape target's
/// own labels (`job`, `instance`) already tell apart; two engines over two
/// tables in one process would set the same series. `in_progress` and
/// `bytes` are set only by stores that know them. A run
/// answered `unprotected` is a fail-open run (the store was down and
/// [`fail_open`](crate::EngineBuilder::fail_open) let it run). The dedup rate is
/// `sum(rate(idempotency_requests_total{outcome=~"replay|cached_replay"}[5m]))
/// / sum(rate(idempotency_requests_total[5m]))`.
///
/// The repository's `dashboards/grafana/idempotency.json` is a Grafana
/// dashboard of these names (the dedup rate, pending-key age p95 and p99,
/// takeovers and 409s, the table size, answers by outcome, latency by
/// port, store call time by operation); a test checks
/// it against what this exporter renders. Its quantiles need histogram
/// buckets: `metrics-exporter-prometheus` renders summaries unless it is
/// given some (`set_buckets_for_metric`, as `examples/prometheus.rs` does).
///
/// ```
/// use lambda_idempotency::{observe::Metrics, Engine, MemoryStore};
///
/// let engine = Engine::builder(MemoryStore::new()).observer(Metrics).build();
/// # let _ = engine;
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct Metrics;

impl Observer for Metrics {
    fn observe(&self, event: &Event) {
        match *event {
            Event::Answered {
                port,
                answer,
                elapsed,
            } => {
                let labels = [("port", port.as_str()), ("outcome", answer.as_str())];
                ::metrics::counter!(REQUESTS, &labels).increment(1);
                ::metrics::histogram!(REQUEST_DURATION, &labels).record(elapsed.as_secs_f64());
            }
            Event::FoundInProgress { age } => {
                ::metrics::histogram!(PENDING_KEY_AGE).record(age.as_secs_f64());
            }
            Event::TookOver { attempt } => {
                let attempt = super::attempt_label(attempt);
                ::metrics::counter!(TAKEOVERS, "attempt" => attempt).increment(1);
            }
            Event::ConflictRetried => {
                ::metrics::counter!(CONFLICTS_RETRIED).increment(1);
            }
            Event::StoreCalled {
                operation,
                elapsed,
                failed,
            } => {
                let result = failed.map_or("ok", crate::StoreErrorKind::as_str);
                ::metrics::histogram!(STORE_DURATION, "operation" => operation.as_str(), "result" => result)
                    .record(elapsed.as_secs_f64());
            }
            Event::TableSized { store, size } => {
                let labels = [("store", store), ("accuracy", size.accuracy.as_str())];
                // A gauge is an f64: exact below 2^53 records, far past any table.
                ::metrics::gauge!(TABLE_RECORDS, &labels).set(size.records as f64);
                if let Some(in_progress) = size.in_progress {
                    ::metrics::gauge!(TABLE_IN_PROGRESS, &labels).set(in_progress as f64);
                }
                if let Some(bytes) = size.bytes {
                    ::metrics::gauge!(TABLE_BYTES, &labels).set(bytes as f64);
                }
            }
        }
    }
}
