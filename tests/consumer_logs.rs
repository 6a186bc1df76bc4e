//! Bad records leave a log line that says which record, from which source,
//! and why: a record without the fields its key needs, a body the handler
//! cannot parse, an event of another shape. Its own test binary: a
//! process-wide subscriber (see `log_hygiene.rs`).

mod support;

use aws_lambda_events::{
    kafka::{KafkaEvent, KafkaRecord},
    kinesis::{KinesisEvent, KinesisEventRecord},
};
use lambda_idempotency::{
    consumers::{KafkaBatch, KinesisBatch},
    Engine, MemoryStore,
};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::json;

fn record(event_id: Option<&str>, sequence: &str, data: &str) -> serde_json::Value {
    use base64::Engine as _;
    json!({
        "eventID": event_id,
        "eventSourceARN": "arn:aws:kinesis:eu-west-1:123456789012:stream/orders",
        "kinesis": {
            "approximateArrivalTimestamp": 1_700_000_000.0,
            "data": base64::engine::general_purpose::STANDARD.encode(data),
            "partitionKey": "pk",
            "sequenceNumber": sequence
        }
    })
}

#[tokio::test]
async fn bad_records_are_logged_with_their_source_id_and_reason() {
    let captured = support::Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
    let engine = Engine::builder(MemoryStore::new()).build();

    // A record without its key (no eventID) is the first failure.
    let kinesis = KinesisBatch::new(engine.clone(), "orders");
    let event: KinesisEvent = serde_json::from_value(json!({ "Records": [
        record(Some("shardId-1:501"), "501", r#"{"order":1}"#),
        record(None, "502", r#"{"order":2}"#),
    ]}))
    .expect("an event");
    let parse = |record: KinesisEventRecord| async move {
        serde_json::from_slice::<serde_json::Value>(&record.kinesis.data)
            .map_err(|error| format!("the body is not JSON: {error}"))
    };
    let response = kinesis
        .process(LambdaEvent::new(event, Context::default()), parse)
        .await
        .expect("a partial batch response");
    assert_eq!(response.batch_item_failures.len(), 1);

    // Keyed by a closure: the line names the closure, not the eventID;
    // given up as final, it says so.
    let by_order = KinesisBatch::new(engine.clone(), "orders-by-id")
        .key(|record: &KinesisEventRecord| {
            let body: serde_json::Value = serde_json::from_slice(&record.kinesis.data).ok()?;
            body.get("order").map(|order| order.to_string())
        })
        .unprocessable(lambda_idempotency::consumers::Unprocessable::Final);
    let event: KinesisEvent = serde_json::from_value(json!({ "Records": [
        record(Some("shardId-1:901"), "901", r#"{"customer":1}"#),
    ]}))
    .expect("an event");
    let response = by_order
        .process(LambdaEvent::new(event, Context::default()), parse)
        .await
        .expect("a partial batch response");
    assert!(
        response.batch_item_failures.is_empty(),
        "given up, not failed"
    );

    // A body the handler cannot parse.
    let event: KinesisEvent = serde_json::from_value(json!({ "Records": [
        record(Some("shardId-1:601"), "601", "not json"),
    ]}))
    .expect("an event");
    kinesis
        .process(LambdaEvent::new(event, Context::default()), parse)
        .await
        .expect("a partial batch response");

    // A handler that panics: its record fails, with the panic's message.
    let event: KinesisEvent = serde_json::from_value(json!({ "Records": [
        record(Some("shardId-1:801"), "801", "{}"),
    ]}))
    .expect("an event");
    let response = kinesis
        .process(
            LambdaEvent::new(event, Context::default()),
            |_: KinesisEventRecord| async {
                if true {
                    panic!("the ledger is closed");
                }
                Ok::<(), String>(())
            },
        )
        .await
        .expect("a partial batch response");
    assert_eq!(response.batch_item_failures.len(), 1);

    // A Kinesis event sent to a Kafka function.
    let kinesis_as_kafka: KafkaEvent =
        serde_json::from_value(json!({ "Records": [record(Some("shardId-1:701"), "701", "{}")] }))
            .expect("it parses, with no Kafka records");
    let failure = KafkaBatch::new(engine, "topic")
        .process(
            LambdaEvent::new(kinesis_as_kafka, Context::default()),
            |_: KafkaRecord| async { Ok::<(), String>(()) },
        )
        .await
        .expect_err("no records");
    assert!(failure.to_string().contains("Kafka"), "{failure}");

    let logs = captured.text();
    let line = |needle: &str| -> &str {
        logs.lines()
            .find(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{logs}"))
    };
    let no_key = line("record has no idempotency key");
    for part in [
        "ERROR",
        "source=\"Kinesis\"",
        "record_id=\"502\"",
        "the eventID",
    ] {
        assert!(no_key.contains(part), "{part:?} missing from {no_key}");
    }
    let closure_key = line("record_id=\"901\"");
    assert!(
        closure_key.contains("the key closure (Batch::key) found none")
            && !closure_key.contains("eventID"),
        "{closure_key}"
    );
    let given_up = line("given up (Unprocessable::Final)");
    for part in ["ERROR", "record_id=\"901\"", "reason=\"key_missing\""] {
        assert!(given_up.contains(part), "{part:?} missing from {given_up}");
    }
    let bad_body = line("record failed; reported for redelivery");
    for part in ["record_id=\"601\"", "the body is not JSON"] {
        assert!(bad_body.contains(part), "{part:?} missing from {bad_body}");
    }
    let panicked = line("record panicked; reported for redelivery");
    for part in ["ERROR", "record_id=\"801\"", "the ledger is closed"] {
        assert!(panicked.contains(part), "{part:?} missing from {panicked}");
    }
    let wrong_shape = line("the event has no Kafka records");
    assert!(wrong_shape.contains("ERROR"), "{wrong_shape}");
    let summary = line("batch processed");
    assert!(
        summary.contains("failed=1") && summary.contains("ran=1"),
        "{summary}"
    );
}
