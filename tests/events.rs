//! Every sample event under `events/` parses as lambda_http parses it in
//! Lambda, and means what its name says when it goes through the layer.

use lambda_http::{request::from_str, Body, Request, Response};
use lambda_idempotency::{
    http::{IdempotencyLayer, REPLAYED_HEADER},
    Engine, MemoryStore,
};
use std::{fs, path::Path};
use tower::{service_fn, Layer, ServiceExt};

fn load(name: &str) -> Request {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("events")
        .join(name);
    let json = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    from_str(&json)
        .unwrap_or_else(|e| panic!("{name} is not an API Gateway event lambda_http accepts: {e}"))
}

#[test]
fn every_event_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("events");
    let mut count = 0;
    for entry in fs::read_dir(&dir).expect("events/") {
        let name = entry
            .expect("entry")
            .file_name()
            .into_string()
            .expect("utf-8 name");
        if !name.ends_with(".json") {
            continue;
        }
        if name.starts_with("sqs-") {
            let path = dir.join(&name);
            let json = fs::read_to_string(&path).expect("read");
            let event: aws_lambda_events::sqs::SqsEvent = serde_json::from_str(&json)
                .unwrap_or_else(|e| panic!("{name} is not an SQS event: {e}"));
            assert!(!event.records.is_empty(), "{name}");
            assert!(
                event
                    .records
                    .iter()
                    .all(|r| r.message_id.is_some() && r.body.is_some()),
                "{name}"
            );
            count += 1;
            continue;
        }
        // The completer's schedule: an EventBridge event, read as such by
        // `functions/completer`'s own test; here, that it is one.
        if name.starts_with("eventbridge-") {
            let path = dir.join(&name);
            let json = fs::read_to_string(&path).expect("read");
            let event: serde_json::Value =
                serde_json::from_str(&json).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
            assert_eq!(event["source"], "aws.events", "{name}");
            assert_eq!(event["detail-type"], "Scheduled Event", "{name}");
            count += 1;
            continue;
        }
        if name.starts_with("dynamodb-stream-") {
            let records = stream_records(&name);
            assert!(!records.is_empty(), "{name}");
            assert!(
                records.iter().all(|r| !r.event_id.is_empty()
                    && r.change.sequence_number.is_some()
                    && r.event_name == "INSERT"),
                "{name}: every record an INSERT with an eventID and a sequence number"
            );
            let without_id = records
                .iter()
                .filter(|r| !r.change.new_image.contains_key("id"))
                .count();
            assert_eq!(
                without_id,
                usize::from(name.contains("half-failed")),
                "{name}: only the half-failed batch has a record without a charge id"
            );
            count += 1;
            continue;
        }
        let request = load(&name);
        assert!(
            request.uri().path().contains("/v1/charges"),
            "{name}: {}",
            request.uri()
        );
        let has_key = request.headers().contains_key("idempotency-key");
        let is_get = name.contains("get-charge");
        assert_eq!(has_key, !name.contains("missing-key") && !is_get, "{name}");
        count += 1;
    }
    assert!(count >= 20, "found {count} events");
}

fn stream_records(name: &str) -> Vec<aws_lambda_events::dynamodb::EventRecord> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("events")
        .join(name);
    let json = fs::read_to_string(&path).expect("read");
    let event: aws_lambda_events::dynamodb::Event = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("{name} is not a DynamoDB Streams event: {e}"));
    event.records
}

#[test]
fn the_stream_redelivery_repeats_records_of_the_first_batch() {
    let ids = |name: &str| -> Vec<String> {
        stream_records(name)
            .into_iter()
            .map(|r| r.event_id)
            .collect()
    };
    let first = ids("dynamodb-stream-charges-batch.json");
    let again = ids("dynamodb-stream-charges-redelivery.json");
    let repeated = again.iter().filter(|id| first.contains(id)).count();
    assert_eq!(repeated, 2, "two redelivered records");
    assert_eq!(again.len(), 3, "and a new one");
}

async fn outcomes(prefix: &str) -> Vec<(u16, bool)> {
    let handler = service_fn(|request: Request| async move {
        let body = format!(
            "{{\"echo\":{}}}",
            String::from_utf8_lossy(request.body().as_ref()).len()
        );
        Ok::<_, lambda_http::Error>(Response::builder().status(201).body(Body::from(body))?)
    });
    let service = IdempotencyLayer::new(Engine::builder(MemoryStore::new()).build()).layer(handler);
    let mut results = Vec::new();
    for suffix in [
        "create-charge",
        "create-charge-replay",
        "create-charge-different-body",
        "create-charge-tenant-b",
        "create-charge-missing-key",
        "create-charge-invalid-key",
    ] {
        let response = service
            .clone()
            .oneshot(load(&format!("{prefix}-{suffix}.json")))
            .await
            .unwrap();
        results.push((
            response.status().as_u16(),
            response.headers().contains_key(REPLAYED_HEADER),
        ));
    }
    results
}

#[tokio::test]
async fn events_mean_what_their_names_say() {
    let expected = vec![
        (201, false), // first request
        (201, true),  // its replay
        (422, false), // same key, different body
        (201, false), // same key, another tenant
        (400, false), // missing key
        (400, false), // invalid key
    ];
    assert_eq!(outcomes("http-api").await, expected, "HTTP API (v2) events");
    assert_eq!(outcomes("rest-api").await, expected, "REST API (v1) events");
}
