//! The consumers against Powertools for AWS Lambda's own test events
//! (`tests/data/upstream/powertools/`, see its README), on DynamoDB Local:
//! every event runs once and replays; a redelivery whose delivery metadata
//! changed is still the same record under a business key, and another
//! payload under it is refused; SQS FIFO is the queue, not the message
//! group; a stream batch is one shard; Kafka's partial batch response.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

mod support;

use aws_lambda_events::{
    activemq::ActiveMqEvent, dynamodb::Event as DynamoDbEvent, kafka::KafkaEvent,
    kinesis::KinesisEvent, sqs::SqsEvent,
};
use lambda_idempotency::{
    consumers::{
        ActiveMqBatch, Batch, BatchFailed, DynamoDbStreamBatch, EventBridgeBatch, KafkaBatch,
        KafkaPartialBatch, KinesisBatch, RabbitMqBatch, RecordStatus, SnsBatch, Source, SqsBatch,
    },
    DynamoDbStore, Engine,
};
use lambda_runtime::{Context, LambdaEvent};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::{
    collections::HashSet,
    sync::{Arc, Mutex},
};

/// Every Powertools fixture, by file name.
const FIXTURES: &[(&str, &str)] = &[
    (
        "py_activeMQEvent.json",
        include_str!("data/upstream/powertools/py_activeMQEvent.json"),
    ),
    (
        "py_dynamoStreamEvent.json",
        include_str!("data/upstream/powertools/py_dynamoStreamEvent.json"),
    ),
    (
        "py_eventBridgeEvent.json",
        include_str!("data/upstream/powertools/py_eventBridgeEvent.json"),
    ),
    (
        "py_kafkaEventMsk.json",
        include_str!("data/upstream/powertools/py_kafkaEventMsk.json"),
    ),
    (
        "py_kafkaEventSelfManaged.json",
        include_str!("data/upstream/powertools/py_kafkaEventSelfManaged.json"),
    ),
    (
        "py_kinesisStreamEvent.json",
        include_str!("data/upstream/powertools/py_kinesisStreamEvent.json"),
    ),
    (
        "py_rabbitMQEvent.json",
        include_str!("data/upstream/powertools/py_rabbitMQEvent.json"),
    ),
    (
        "py_snsEvent.json",
        include_str!("data/upstream/powertools/py_snsEvent.json"),
    ),
    (
        "py_snsSqsFifoEvent.json",
        include_str!("data/upstream/powertools/py_snsSqsFifoEvent.json"),
    ),
    (
        "py_sqsEvent.json",
        include_str!("data/upstream/powertools/py_sqsEvent.json"),
    ),
    (
        "ts_kafka_default.json",
        include_str!("data/upstream/powertools/ts_kafka_default.json"),
    ),
];

fn fixture(name: &str) -> Value {
    let (_, text) = FIXTURES
        .iter()
        .find(|(file, _)| *file == name)
        .unwrap_or_else(|| panic!("{name} is not a fixture"));
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"))
}

fn event<E: DeserializeOwned>(value: Value) -> LambdaEvent<E> {
    let event = serde_json::from_value(value).expect("an event of this source");
    LambdaEvent::new(event, Context::default())
}

async fn engine() -> Engine<DynamoDbStore> {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    Engine::builder(DynamoDbStore::new(client, table)).build()
}

/// Whether a partial batch response (or a failed invocation) asks for a
/// redelivery.
fn reports<T, E>(result: &Result<T, E>, failures: impl Fn(&T) -> bool) -> bool {
    result.as_ref().map_or(true, failures)
}

/// What one delivery did: handler runs, and whether it asked for a
/// redelivery.
struct Delivered {
    runs: usize,
    failed: bool,
}

/// Delivers each event in turn to `batch`, with a handler that succeeds;
/// what each delivery did.
async fn deliver<Src: Source>(
    batch: &Batch<Src, DynamoDbStore>,
    events: Vec<Value>,
    failed: impl Fn(&Result<Src::Output, BatchFailed>) -> bool,
) -> Vec<Delivered>
where
    Src::Event: DeserializeOwned,
{
    let mut delivered = Vec::new();
    for value in events {
        let runs = Arc::new(Mutex::new(0usize));
        let handler = |_record: Src::Record| {
            let runs = Arc::clone(&runs);
            async move {
                *runs.lock().expect("not poisoned") += 1;
                Ok::<_, String>(())
            }
        };
        let result = batch.process(event(value), handler).await;
        let runs = *runs.lock().expect("not poisoned");
        delivered.push(Delivered {
            runs,
            failed: failed(&result),
        });
    }
    delivered
}

fn is_err<T, E>(result: &Result<T, E>) -> bool {
    result.is_err()
}

#[test]
fn every_powertools_fixture_is_listed() {
    let listed: HashSet<&str> = FIXTURES.iter().map(|(file, _)| *file).collect();
    let dir = format!(
        "{}/tests/data/upstream/powertools",
        env!("CARGO_MANIFEST_DIR")
    );
    for entry in std::fs::read_dir(dir).expect("the fixtures") {
        let file = entry.expect("an entry").file_name();
        let file = file.to_string_lossy();
        if file.ends_with(".json") {
            assert!(listed.contains(file.as_ref()), "{file} is not tested");
        }
    }
}

#[tokio::test]
async fn every_powertools_event_runs_once_and_replays_on_redelivery() {
    let engine = engine().await;
    let twice = |name: &str| vec![fixture(name), fixture(name)];
    let sqs = |r: &Result<aws_lambda_events::sqs::SqsBatchResponse, BatchFailed>| {
        reports(r, |r| !r.batch_item_failures.is_empty())
    };
    let kinesis = |r: &Result<aws_lambda_events::streams::KinesisEventResponse, BatchFailed>| {
        reports(r, |r| !r.batch_item_failures.is_empty())
    };
    let dynamodb = |r: &Result<aws_lambda_events::streams::DynamoDbEventResponse, BatchFailed>| {
        reports(r, |r| !r.batch_item_failures.is_empty())
    };
    // (file, what the two deliveries did)
    let mut seen: Vec<(&str, Vec<Delivered>)> = Vec::new();
    for name in ["py_sqsEvent.json", "py_snsSqsFifoEvent.json"] {
        let batch = SqsBatch::new(engine.clone(), name);
        seen.push((name, deliver(&batch, twice(name), sqs).await));
    }
    let name = "py_kinesisStreamEvent.json";
    let batch = KinesisBatch::new(engine.clone(), name);
    seen.push((name, deliver(&batch, twice(name), kinesis).await));
    let name = "py_dynamoStreamEvent.json";
    let batch = DynamoDbStreamBatch::new(engine.clone(), name);
    seen.push((name, deliver(&batch, twice(name), dynamodb).await));
    for name in [
        "py_kafkaEventMsk.json",
        "py_kafkaEventSelfManaged.json",
        "ts_kafka_default.json",
    ] {
        let batch = KafkaBatch::new(engine.clone(), name);
        seen.push((name, deliver(&batch, twice(name), is_err).await));
        let partial = KafkaPartialBatch::new(engine.clone(), format!("partial/{name}"));
        let failed = |r: &Result<_, BatchFailed>| {
            reports(
                r,
                |r: &lambda_idempotency::consumers::KafkaBatchResponse| {
                    !r.batch_item_failures.is_empty()
                },
            )
        };
        seen.push((name, deliver(&partial, twice(name), failed).await));
    }
    let name = "py_snsEvent.json";
    let batch = SnsBatch::new(engine.clone(), name);
    seen.push((name, deliver(&batch, twice(name), is_err).await));
    let name = "py_eventBridgeEvent.json";
    let batch: EventBridgeBatch<_> = EventBridgeBatch::new(engine.clone(), name);
    seen.push((name, deliver(&batch, twice(name), is_err).await));

    let expected = |name: &str| -> usize {
        let value = fixture(name);
        match &value["records"] {
            Value::Object(partitions) => partitions
                .values()
                .map(|records| records.as_array().map_or(0, Vec::len))
                .sum(),
            _ => value["Records"].as_array().map_or(1, Vec::len),
        }
    };
    for (name, delivered) in &seen {
        let records = expected(name);
        assert!(!delivered[0].failed && !delivered[1].failed, "{name}");
        assert_eq!(delivered[0].runs, records, "{name}: each record ran");
        assert_eq!(delivered[1].runs, 0, "{name}: the redelivery replayed");
    }

    // RabbitMQ sets no messageId and this publisher set none: the default
    // key is missing, and the queue fails rather than run without a claim.
    let name = "py_rabbitMQEvent.json";
    let batch = RabbitMqBatch::new(engine.clone(), name);
    let delivered = deliver(&batch, twice(name), is_err).await;
    assert!(delivered.iter().all(|d| d.failed && d.runs == 0), "{name}");

    // Powertools' ActiveMQ event gives its three messages one messageID
    // with three payloads: the first runs, the second is a key reused with
    // another payload, and the third waits behind it on its destination.
    let name = "py_activeMQEvent.json";
    let batch = ActiveMqBatch::new(engine.clone(), name);
    let runs = Arc::new(Mutex::new(0usize));
    let handler = |_message| {
        let runs = Arc::clone(&runs);
        async move {
            *runs.lock().expect("not poisoned") += 1;
            Ok::<_, String>(())
        }
    };
    let failure = batch
        .process(event::<ActiveMqEvent>(fixture(name)), handler)
        .await
        .expect_err("the reused messageID fails the invocation");
    let statuses: Vec<RecordStatus> = failure.report().records().map(|(_, s)| s).collect();
    assert_eq!(
        statuses,
        [
            RecordStatus::Ran,
            RecordStatus::Failed,
            RecordStatus::HeldBack
        ]
    );
    assert_eq!(*runs.lock().expect("not poisoned"), 1);
}

// ------------------------------------------------ item 11: fingerprints

/// A one-record event of a `Records` source, from a fixture's record.
fn records(record: Value) -> Value {
    json!({ "Records": [record] })
}

/// Delivers `first`, then `redelivery` (the same record with other
/// delivery metadata), then `other` (another payload), all under one
/// business key: the first runs, the redelivery replays, the other is
/// refused.
async fn same_record_other_payload<Src: Source>(
    name: &str,
    batch: Batch<Src, DynamoDbStore>,
    [first, redelivery, other]: [Value; 3],
    failed: impl Fn(&Result<Src::Output, BatchFailed>) -> bool,
) where
    Src::Event: DeserializeOwned,
{
    let batch = batch.key(|_| Some("order-42".to_owned()));
    let delivered = deliver(&batch, vec![first, redelivery, other], failed).await;
    assert!(
        !delivered[0].failed && delivered[0].runs == 1,
        "{name}: ran"
    );
    assert!(
        !delivered[1].failed && delivered[1].runs == 0,
        "{name}: a redelivery with other delivery metadata must replay"
    );
    assert!(
        delivered[2].failed && delivered[2].runs == 0,
        "{name}: another payload under the key must be refused"
    );
}

#[tokio::test]
async fn dynamodb_streams_a_second_record_of_the_same_change_replays() {
    let engine = engine().await;
    let first = fixture("py_dynamoStreamEvent.json")["Records"][0].clone();
    let mut redelivery = first.clone();
    redelivery["eventID"] = json!("9");
    redelivery["dynamodb"]["SequenceNumber"] = json!("999");
    redelivery["dynamodb"]["ApproximateCreationDateTime"] = json!(1_693_997_999.0);
    redelivery["dynamodb"]["SizeBytes"] = json!(27);
    let mut other = first.clone();
    other["dynamodb"]["NewImage"]["Message"]["S"] = json!("Another item!");
    let batch = DynamoDbStreamBatch::new(engine, "fingerprint/dynamodb");
    let events = [records(first), records(redelivery), records(other)];
    same_record_other_payload("DynamoDB Streams", batch, events, |r| {
        reports(r, |r| !r.batch_item_failures.is_empty())
    })
    .await;
}

#[tokio::test]
async fn sqs_a_second_send_replays_and_other_message_attributes_are_refused() {
    let engine = engine().await;
    let first = fixture("py_sqsEvent.json")["Records"][0].clone();
    let mut redelivery = first.clone();
    redelivery["messageId"] = json!("4f1b8e6e-0000-4000-8000-000000000002");
    redelivery["receiptHandle"] = json!("AQEB-another-receive");
    redelivery["attributes"]["ApproximateReceiveCount"] = json!("2");
    redelivery["attributes"]["SentTimestamp"] = json!("1545082659183");
    redelivery["attributes"]["ApproximateFirstReceiveTimestamp"] = json!("1545082659185");
    let mut other = first.clone();
    other["messageAttributes"]["testAttr"]["stringValue"] = json!("200");
    let batch = SqsBatch::new(engine, "fingerprint/sqs");
    let events = [records(first), records(redelivery), records(other)];
    same_record_other_payload("SQS", batch, events, |r| {
        reports(r, |r| !r.batch_item_failures.is_empty())
    })
    .await;
}

#[tokio::test]
async fn kinesis_a_second_put_replays_and_another_partition_key_is_refused() {
    let engine = engine().await;
    let first = fixture("py_kinesisStreamEvent.json")["Records"][0].clone();
    let mut redelivery = first.clone();
    let sequence = "49590338271490256608559692540925702759324208523137515999";
    redelivery["kinesis"]["sequenceNumber"] = json!(sequence);
    redelivery["kinesis"]["approximateArrivalTimestamp"] = json!(1_545_084_799.5);
    redelivery["eventID"] = json!(format!("shardId-000000000006:{sequence}"));
    let mut other = first.clone();
    other["kinesis"]["partitionKey"] = json!("2");
    let batch = KinesisBatch::new(engine, "fingerprint/kinesis");
    let events = [records(first), records(redelivery), records(other)];
    same_record_other_payload("Kinesis", batch, events, |r| {
        reports(r, |r| !r.batch_item_failures.is_empty())
    })
    .await;
}

#[tokio::test]
async fn kafka_a_second_send_replays_and_other_headers_are_refused() {
    let engine = engine().await;
    let first = fixture("py_kafkaEventMsk.json");
    let mut redelivery = first.clone();
    redelivery["records"]["mytopic-0"][0]["offset"] = json!(99);
    redelivery["records"]["mytopic-0"][0]["timestamp"] = json!(1_545_084_659_000_i64);
    let mut other = first.clone();
    other["records"]["mytopic-0"][0]["headers"] =
        json!([{ "headerKey": [111, 116, 104, 101, 114] }]);
    let batch = KafkaBatch::new(engine, "fingerprint/kafka");
    same_record_other_payload("Kafka", batch, [first, redelivery, other], is_err).await;
}

#[tokio::test]
async fn sns_a_second_publish_replays_and_another_subject_is_refused() {
    let engine = engine().await;
    let first = fixture("py_snsEvent.json")["Records"][0].clone();
    let mut redelivery = first.clone();
    redelivery["Sns"]["MessageId"] = json!("a7c9d2fa-77fa-5184-9de9-89391027cc7d");
    redelivery["Sns"]["Timestamp"] = json!("2019-01-02T12:46:07.000Z");
    redelivery["Sns"]["Signature"] = json!("another-signature==");
    let mut other = first.clone();
    other["Sns"]["Subject"] = json!("AnotherSubject");
    let batch = SnsBatch::new(engine, "fingerprint/sns");
    let events = [records(first), records(redelivery), records(other)];
    same_record_other_payload("SNS", batch, events, is_err).await;
}

#[tokio::test]
async fn eventbridge_a_second_put_replays_and_another_detail_type_is_refused() {
    let engine = engine().await;
    let first = fixture("py_eventBridgeEvent.json");
    let mut redelivery = first.clone();
    redelivery["id"] = json!("7b8f9a0c-0000-4000-8000-000000000002");
    redelivery["time"] = json!("2017-12-22T18:44:48Z");
    redelivery["replay-name"] = json!("another_replay");
    let mut other = first.clone();
    other["detail-type"] = json!("EC2 Instance Launch Successful");
    let batch: EventBridgeBatch<_> = EventBridgeBatch::new(engine, "fingerprint/eventbridge");
    same_record_other_payload("EventBridge", batch, [first, redelivery, other], is_err).await;
}

// ------------------------------------------------ item 12: SQS FIFO

/// A two-message SQS event from the fixture's first record, both in
/// message group `G`, the first of which fails.
fn two_in_a_group(name: &str) -> Value {
    let mut first = fixture(name)["Records"][0].clone();
    first["attributes"]["MessageGroupId"] = json!("G");
    first["body"] = json!("fail");
    let mut second = first.clone();
    second["messageId"] = json!("second-message");
    second["body"] = json!("ok");
    json!({ "Records": [first, second] })
}

async fn sqs_failures(engine: &Engine<DynamoDbStore>, name: &str) -> Vec<String> {
    let batch = SqsBatch::new(engine.clone(), format!("fifo/{name}"));
    let handler = |message: aws_lambda_events::sqs::SqsMessage| async move {
        match message.body.as_deref() {
            Some("fail") => Err("this message fails".to_owned()),
            _ => Ok(()),
        }
    };
    let response = batch
        .process(event::<SqsEvent>(two_in_a_group(name)), handler)
        .await
        .expect("a partial batch response");
    let failures = response.batch_item_failures.iter();
    failures.map(|f| f.item_identifier.clone()).collect()
}

#[tokio::test]
async fn sqs_fifo_is_a_fifo_queue_not_a_message_group() {
    let engine = engine().await;
    // A FIFO queue (its ARN ends in .fifo): the group stops at its first
    // failure, and the message after it is reported too.
    let fifo = sqs_failures(&engine, "py_snsSqsFifoEvent.json").await;
    assert_eq!(
        fifo,
        ["69bc4bbd-ed69-4325-a434-85c3b428ceab", "second-message"]
    );
    // A standard queue whose messages carry a MessageGroupId (fair queues):
    // the failure holds nothing back.
    let standard = sqs_failures(&engine, "py_sqsEvent.json").await;
    assert_eq!(standard, ["059f36b4-87a3-44ab-83d2-661975830a7d"]);
}

// ------------------------------------------------ item 13: one shard

#[tokio::test]
async fn a_dynamodb_streams_batch_stops_at_its_first_failure_whatever_the_arn() {
    // Powertools' event: two records of one batch with different
    // eventSourceARNs. The batch is one shard: the first failure stops it.
    let batch = DynamoDbStreamBatch::new(engine().await, "one-shard/dynamodb");
    let ran = Arc::new(Mutex::new(Vec::new()));
    let handler = |record: aws_lambda_events::dynamodb::EventRecord| {
        let ran = Arc::clone(&ran);
        async move {
            ran.lock()
                .expect("not poisoned")
                .push(record.event_id.clone());
            match record.event_id.as_str() {
                "1" => Err("the first record fails".to_owned()),
                _ => Ok(()),
            }
        }
    };
    let value = fixture("py_dynamoStreamEvent.json");
    let response = batch
        .process(event::<DynamoDbEvent>(value), handler)
        .await
        .expect("a partial batch response");
    let reported: Vec<_> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone().unwrap_or_default())
        .collect();
    assert_eq!(reported, ["111", "222"]);
    assert_eq!(*ran.lock().expect("not poisoned"), ["1"], "222 waited");
}

#[tokio::test]
async fn a_kinesis_batch_stops_at_its_first_failure_whatever_the_shard_id() {
    let mut value = fixture("py_kinesisStreamEvent.json");
    value["Records"][1]["eventID"] = json!("shardId-000000000007:1");
    let batch = KinesisBatch::new(engine().await, "one-shard/kinesis");
    let handler = |record: aws_lambda_events::kinesis::KinesisEventRecord| async move {
        match record.kinesis.partition_key.as_str() {
            "1" if record.kinesis.data.starts_with(b"Hello") => Err("fails".to_owned()),
            _ => Ok(()),
        }
    };
    let response = batch
        .process(event::<KinesisEvent>(value), handler)
        .await
        .expect("a partial batch response");
    assert_eq!(response.batch_item_failures.len(), 2, "{response:?}");
}

// ------------------------------------------------ item 14: Kafka

#[tokio::test]
async fn kafka_partial_batch_names_each_stopped_partition_at_its_offset() {
    let engine = engine().await;
    let mut value = fixture("ts_kafka_default.json");
    // A second partition, which completes.
    let mut other = value["records"]["mytopic-0"][0].clone();
    other["topic"] = json!("othertopic");
    other["partition"] = json!(1);
    other["offset"] = json!(7);
    value["records"]["othertopic-1"] = json!([other]);
    let ran = Arc::new(Mutex::new(Vec::new()));
    let handler = |record: aws_lambda_events::kafka::KafkaRecord| {
        let ran = Arc::clone(&ran);
        async move {
            let place = format!(
                "{}-{}@{}",
                record.topic.unwrap_or_default(),
                record.partition,
                record.offset
            );
            ran.lock().expect("not poisoned").push(place);
            match record.offset {
                16 => Err("offset 16 fails".to_owned()),
                _ => Ok(()),
            }
        }
    };
    let partial = KafkaPartialBatch::new(engine.clone(), "kafka/partial");
    let response = partial
        .process(event::<KafkaEvent>(value.clone()), handler)
        .await
        .expect("a partial batch response");
    assert_eq!(
        serde_json::to_value(&response).expect("serialises"),
        json!({ "batchItemFailures": [
            { "itemIdentifier": { "partition": "mytopic-0", "offset": 16 } }
        ] })
    );
    let mut ran_first = ran.lock().expect("not poisoned").clone();
    ran_first.sort();
    assert_eq!(
        ran_first,
        ["mytopic-0@15", "mytopic-0@16", "othertopic-1@7"]
    );

    // Without ReportBatchItemFailures the same batch fails the invocation.
    let whole = KafkaBatch::new(engine, "kafka/whole");
    let failure = whole
        .process(event::<KafkaEvent>(value), handler)
        .await
        .expect_err("the invocation fails");
    assert_eq!(failure.report().count(RecordStatus::HeldBack), 1);
}

#[tokio::test]
async fn kafka_partial_batch_fails_the_invocation_when_it_cannot_name_a_record() {
    // An event of another source parses as a Kafka event without records:
    // nothing can be named, so the invocation fails instead.
    let value = fixture("py_sqsEvent.json");
    let partial = KafkaPartialBatch::new(engine().await, "kafka/unnamed");
    let handler = |_record| async { Ok::<(), String>(()) };
    let result = partial.process(event::<KafkaEvent>(value), handler).await;
    assert!(result.is_err(), "{result:?}");
}
