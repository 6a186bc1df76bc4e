//! `completer`: the reference completer, run on a schedule (EventBridge,
//! `template.yaml`).
//!
//! Each run walks the idempotency table for claims of the charges function
//! that were abandoned (`IN_PROGRESS`, their lease ended more than
//! `IDEMPOTENCY_COMPLETER_OLDER_THAN_SECONDS` ago, default 900, nobody took
//! them over) and settles up to `IDEMPOTENCY_COMPLETER_LIMIT` of them
//! (default 100) by `IDEMPOTENCY_COMPLETER_POLICY`:
//!
//! - `report` (the default): lists them, writes nothing;
//! - `release`: deletes each, so the next request with its key runs as a
//!   first attempt; a record holding steps is left, lapsed, for the retry
//!   to resume;
//! - `fail`: completes each with the HTTP layer's `idempotency-abandoned`
//!   answer (a `500` problem+json every retry gets; nothing runs again).
//!
//! Every write is a takeover, fenced as a retry's: a claim a retry takes
//! over meanwhile is left to it. The run returns its counts, logs each
//! claim, and writes the counts as CloudWatch metrics (Embedded Metric
//! Format: `AbandonedFound`, `AbandonedReleased`, `AbandonedFailed`, …, by
//! `Policy`) when `IDEMPOTENCY_METRICS_NAMESPACE` names a namespace.
//!
//! Environment: `IDEMPOTENCY_TABLE`, `IDEMPOTENCY_KEY_PREFIX` (the charges
//! function's prefix, `idempotency:<its name>`), and the standard AWS
//! variables. A scan of the table costs 128 read units per MB each run
//! (`docs/recovery-points.md`, "The completer").
#![forbid(unsafe_code)]

use lambda_idempotency::{
    default_key_prefix, http::DEFAULT_PROBLEM_BASE, store::Store, AbandonedPolicy, Completer,
    DynamoDbStore, Engine,
};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::{json, Value};
use std::time::Duration;

/// What a run does, from the environment.
struct Settings {
    completer: Completer,
    metrics_namespace: Option<String>,
}

impl Settings {
    fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let number = |name: &str, default: u64| -> Result<u64, Error> {
            match var(name).filter(|value| !value.is_empty()) {
                None => Ok(default),
                Some(value) => value
                    .parse()
                    .map_err(|_| format!("{name}={value:?} is not a whole number").into()),
            }
        };
        let policy = match var("IDEMPOTENCY_COMPLETER_POLICY").as_deref() {
            None | Some("") | Some("report") => AbandonedPolicy::Report,
            Some("release") => AbandonedPolicy::Release,
            Some("fail") => AbandonedPolicy::Fail {
                answer: lambda_idempotency::http::abandoned_answer(DEFAULT_PROBLEM_BASE)?,
            },
            Some(other) => {
                return Err(format!(
                    "IDEMPOTENCY_COMPLETER_POLICY={other:?}: report, release or fail"
                )
                .into())
            }
        };
        Ok(Self {
            completer: Completer::new(policy)
                .older_than(Duration::from_secs(number(
                    "IDEMPOTENCY_COMPLETER_OLDER_THAN_SECONDS",
                    900,
                )?))
                .limit(usize::try_from(number(
                    "IDEMPOTENCY_COMPLETER_LIMIT",
                    100,
                )?)?)
                // Items a Scan request evaluates: fewer requests a walk
                // (each reads 1 MB at most, whatever its limit).
                .page_size(1000),
            metrics_namespace: var("IDEMPOTENCY_METRICS_NAMESPACE").filter(|n| !n.is_empty()),
        })
    }
}

/// The settlements counted, and the metric each is.
const COUNTED: [(&str, &str); 6] = [
    ("reported", "AbandonedReported"),
    ("released", "AbandonedReleased"),
    ("kept_for_steps", "AbandonedKeptForSteps"),
    ("failed", "AbandonedFailed"),
    ("lost", "AbandonedLost"),
    ("error", "AbandonedErrors"),
];

/// One run: the completer over `engine`'s records, its counts returned
/// (and written as metrics).
async fn run<St: Store>(engine: &Engine<St>, settings: &Settings) -> Result<Value, Error> {
    let report = engine.complete_abandoned(&settings.completer).await?;
    let policy = settings.completer.policy().as_str();
    let mut counts = serde_json::Map::new();
    for (settlement, _) in COUNTED {
        counts.insert(settlement.into(), json!(report.count(settlement)));
    }
    for settled in &report.settled {
        tracing::info!(record = %settled.record.id, settlement = settled.settlement.as_str(),
            steps = settled.steps.len(), attempt = settled.record.attempt, "abandoned claim");
    }
    if let Some(namespace) = &settings.metrics_namespace {
        println!("{}", metrics_line(namespace, policy, &report));
    }
    Ok(json!({
        "policy": policy,
        "found": report.settled.len(),
        "counts": counts,
        "walked_all": report.walked_all,
    }))
}

/// The counts as one Embedded Metric Format line, by `Policy`.
fn metrics_line(
    namespace: &str,
    policy: &str,
    report: &lambda_idempotency::CompleterReport,
) -> Value {
    let timestamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_millis() as u64);
    let mut metrics = vec![json!({ "Name": "AbandonedFound", "Unit": "Count" })];
    let mut line = json!({ "Policy": policy, "AbandonedFound": report.settled.len() });
    for (settlement, metric) in COUNTED {
        metrics.push(json!({ "Name": metric, "Unit": "Count" }));
        line[metric] = json!(report.count(settlement));
    }
    line["_aws"] = json!({
        "Timestamp": timestamp,
        "CloudWatchMetrics": [{
            "Namespace": namespace,
            "Dimensions": [["Policy"]],
            "Metrics": metrics,
        }],
    });
    line
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let settings = Settings::from_env(|name| std::env::var(name).ok())?;
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let table = std::env::var("IDEMPOTENCY_TABLE")
        .map_err(|_| "environment variable IDEMPOTENCY_TABLE is not set")?;
    let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), table);
    let prefix = std::env::var("IDEMPOTENCY_KEY_PREFIX")
        .ok()
        .filter(|prefix| !prefix.is_empty())
        .unwrap_or_else(default_key_prefix);
    let engine = Engine::builder(store).key_prefix(prefix).build();
    let (engine, settings) = (&engine, &settings);
    lambda_runtime::run(service_fn(move |_: LambdaEvent<Value>| async move {
        run(engine, settings).await
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use lambda_idempotency::{
        store::{Claim, OwnerToken},
        Clock, Fingerprint, SystemClock,
    };

    fn settings(vars: &[(&str, &str)]) -> Result<Settings, Error> {
        Settings::from_env(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, value)| value.to_string())
        })
    }

    #[test]
    fn the_policy_is_report_unless_the_environment_says() {
        let report = settings(&[]).unwrap();
        assert_eq!(report.completer.policy().as_str(), "report");
        let fail = settings(&[("IDEMPOTENCY_COMPLETER_POLICY", "fail")]).unwrap();
        assert_eq!(fail.completer.policy().as_str(), "fail");
        assert!(settings(&[("IDEMPOTENCY_COMPLETER_POLICY", "delete")]).is_err());
        assert!(settings(&[("IDEMPOTENCY_COMPLETER_LIMIT", "many")]).is_err());
    }

    /// The handler on DynamoDB Local (`AWS_ENDPOINT_URL_DYNAMODB`, as
    /// `make test` runs it): the schedule's event, a claim abandoned 20
    /// minutes ago and one a minute ago; `fail` closes the first only.
    #[tokio::test]
    async fn a_scheduled_run_fails_the_claims_abandoned_long_enough() {
        let endpoint = std::env::var("AWS_ENDPOINT_URL_DYNAMODB")
            .expect("AWS_ENDPOINT_URL_DYNAMODB: run under scripts/with-dynamodb-local");
        let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
            .endpoint_url(endpoint)
            .region(aws_config::Region::new("us-east-1"))
            .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
                "local", "local", None, None, "test",
            ))
            .load()
            .await;
        let table = format!("completer-{}", std::process::id());
        let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), table);
        store.create_table().await.expect("table");
        let engine = Engine::builder(store)
            .key_prefix("idempotency:charges")
            .build();
        let now = SystemClock.now_ms();
        for (key, lapsed_ms) in [("gone", 1_200_000), ("recent", 60_000)] {
            let claim = Claim {
                id: engine.record_id("tenant", key),
                owner: OwnerToken::from_stored(format!("dead-{key}")),
                fingerprint: Fingerprint::of_bytes(b"body"),
                now_ms: now - lapsed_ms - 10_000,
                lease_until_ms: now - lapsed_ms,
                expiration_s: now / 1000 + 3600,
                attempt: 1,
                first_started_ms: now - lapsed_ms - 10_000,
            };
            engine.store().claim(&claim).await.expect("claim");
        }
        let event: Value = serde_json::from_str(include_str!(
            "../../../events/eventbridge-completer-schedule.json"
        ))
        .expect("the schedule's event");
        assert_eq!(event["detail-type"], "Scheduled Event");

        let reported = run(&engine, &settings(&[]).unwrap()).await.expect("a run");
        assert_eq!(reported["counts"]["reported"], 1, "{reported}");
        let failing = settings(&[
            ("IDEMPOTENCY_COMPLETER_POLICY", "fail"),
            ("IDEMPOTENCY_METRICS_NAMESPACE", "Test"),
        ])
        .unwrap();
        let failed = run(&engine, &failing).await.expect("a run");
        assert_eq!(failed["counts"]["failed"], 1, "{failed}");
        assert_eq!(failed["walked_all"], true, "{failed}");
        let gone = engine.inspect("tenant", "gone").await.unwrap().unwrap();
        assert_eq!(gone.status.as_str(), "COMPLETED");
        let answer =
            lambda_idempotency::http::decode_stored_response(gone.response.as_deref().unwrap())
                .unwrap();
        assert_eq!(answer.status(), 500);
        let recent = engine.inspect("tenant", "recent").await.unwrap().unwrap();
        assert_eq!(recent.status.as_str(), "IN_PROGRESS", "lapsed a minute ago");
        let again = run(&engine, &failing).await.expect("a run");
        assert_eq!(again["found"], 0, "{again}");
    }

    #[test]
    fn the_metrics_line_declares_each_count_by_policy() {
        let line = metrics_line("Test", "fail", &Default::default());
        let declared = &line["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(declared["Namespace"], "Test");
        assert_eq!(declared["Dimensions"], json!([["Policy"]]));
        for metric in declared["Metrics"].as_array().unwrap() {
            let name = metric["Name"].as_str().unwrap();
            assert!(line[name].is_number(), "{name}");
        }
        assert_eq!(line["Policy"], "fail");
    }
}
