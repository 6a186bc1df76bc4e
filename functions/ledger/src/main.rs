//! `ledger`: the reference stream pipeline, a DynamoDB Streams consumer of
//! the charges table.
//!
//! For each `INSERT` of a charge it adds 1 to `entries` on the item
//! `charge_id` of the ledger table, with the charge's amount and currency.
//! That business logic is deliberately not idempotent, so a duplicate
//! delivery (a retried batch, a shard read again after a checkpoint) would
//! show as `entries > 1` if the crate failed.
//!
//! Records run in stream order; the increment commits in one DynamoDB
//! transaction with the record's idempotency record (keyed by the stream
//! record's `eventID`). At the first record that does not complete, the
//! batch stops and `batchItemFailures` names its sequence number: Lambda
//! resumes the shard there, and the records before it replay on the retry.
//! A record that can never complete (an image without a charge id) is
//! retried until the mapping's retry limit, then sent to the on-failure
//! destination (see `template.yaml`).
//!
//! Environment: `IDEMPOTENCY_TABLE`, `LEDGER_TABLE`, and the standard AWS
//! variables.
#![forbid(unsafe_code)]

use aws_lambda_events::{
    dynamodb::{Event, EventRecord},
    streams::DynamoDbEventResponse,
};
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use lambda_idempotency::{
    consumers::DynamoDbStreamBatch, store::Store, DynamoDbStore, EmfMetrics, Engine,
};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use std::sync::Arc;

/// The charge an `INSERT` record carries: its id, amount and currency.
#[derive(Debug, PartialEq)]
struct Charge {
    id: String,
    amount: String,
    currency: String,
}

/// The charge in the record's new image, or why there is none.
fn charge(record: &EventRecord) -> Result<Charge, String> {
    let image = &record.change.new_image;
    let text = |name: &str| {
        match image.get(name) {
        Some(serde_dynamo::AttributeValue::S(value)) if !value.is_empty() => Ok(value.clone()),
        _ => Err(format!(
            "the INSERT record {} has no {name} string in its new image (is the stream's view NEW_IMAGE?)",
            record.event_id
        )),
    }
    };
    let amount = match image.get("amount") {
        Some(serde_dynamo::AttributeValue::N(amount)) => amount.clone(),
        _ => {
            return Err(format!(
                "the INSERT record {} has no amount number in its new image",
                record.event_id
            ))
        }
    };
    Ok(Charge {
        id: text("id")?,
        amount,
        currency: text("currency")?,
    })
}

/// The ledger entry of an `INSERT`, as a write that commits with the
/// record's completion; nothing for other events (the mapping's filter
/// delivers only inserts; anything else is completed without an effect).
fn entry(table: &str, record: &EventRecord) -> Result<((), Vec<TransactWriteItem>), Error> {
    if record.event_name != "INSERT" {
        return Ok(((), Vec::new()));
    }
    let charge = charge(record)?;
    let update = Update::builder()
        .table_name(table)
        .key("charge_id", AttributeValue::S(charge.id.clone()))
        .update_expression("ADD entries :one SET amount = :amount, currency = :currency")
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .expression_attribute_values(":amount", AttributeValue::N(charge.amount))
        .expression_attribute_values(":currency", AttributeValue::S(charge.currency))
        .build()?;
    tracing::debug!(charge = %charge.id, "ledger entry prepared");
    Ok((
        (),
        vec![TransactWriteItem::builder().update(update).build()],
    ))
}

fn required_env(name: &str) -> Result<String, Error> {
    std::env::var(name).map_err(|_| format!("environment variable {name} is not set").into())
}

/// The engine on `store`, reporting to CloudWatch (Embedded Metric Format
/// lines on stdout) when `IDEMPOTENCY_METRICS_NAMESPACE` names a namespace:
/// the template sets it, and its dashboard reads the metrics.
fn engine<St: Store>(store: St) -> Engine<St> {
    let builder = Engine::builder(store);
    match std::env::var("IDEMPOTENCY_METRICS_NAMESPACE") {
        Ok(namespace) if !namespace.is_empty() => {
            builder.observer(EmfMetrics::new(namespace)).build()
        }
        _ => builder.build(),
    }
}

// One invocation at a time per execution environment of a function of the
// default kind: the single-threaded runtime saves a hop between threads on
// every store round trip (about a third of a Redis new key's latency;
// BENCHMARKS.md). run_concurrent serves them one at a time there, and
// AWS_LAMBDA_MAX_CONCURRENCY at once under Lambda Managed Instances (on this
// one thread: I/O-bound work; a CPU-bound handler wants #[tokio::main]).
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    lambda_runtime::tracing::init_default_subscriber();

    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let ledger: Arc<str> = required_env("LEDGER_TABLE")?.into();
    let store = DynamoDbStore::new(client, required_env("IDEMPOTENCY_TABLE")?);
    // The entry is the handler's only effect, and it commits with the
    // record: one DynamoDB call per new record.
    let batch = DynamoDbStreamBatch::new(engine(store), "charges-stream/ledger").single_write();
    lambda_runtime::run_concurrent(service_fn(move |event: LambdaEvent<Event>| {
        let batch = batch.clone();
        let ledger = Arc::clone(&ledger);
        async move {
            let handler = |record: EventRecord| {
                let result = entry(&ledger, &record);
                async move { result }
            };
            Ok::<DynamoDbEventResponse, Error>(batch.process_transactional(event, handler).await?)
        }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(image: serde_json::Value, event_name: &str) -> EventRecord {
        serde_json::from_value(serde_json::json!({
            "awsRegion": "eu-west-1", "eventID": "e-1", "eventName": event_name,
            "dynamodb": { "NewImage": image, "SequenceNumber": "1", "SizeBytes": 1 }
        }))
        .expect("a stream record")
    }

    #[test]
    fn an_insert_becomes_one_entry_and_other_events_none() {
        let insert = record(
            serde_json::json!({ "id": { "S": "ch_1" }, "amount": { "N": "1250" }, "currency": { "S": "eur" } }),
            "INSERT",
        );
        let ((), writes) = entry("ledger", &insert).expect("an entry");
        assert_eq!(writes.len(), 1);
        let update = writes[0].update().expect("an update");
        assert_eq!(update.key()["charge_id"], AttributeValue::S("ch_1".into()));

        let modify = record(serde_json::json!({ "id": { "S": "ch_1" } }), "MODIFY");
        assert!(entry("ledger", &modify).expect("nothing").1.is_empty());
    }

    #[test]
    fn an_insert_without_its_fields_fails_with_the_reason() {
        let error = charge(&record(
            serde_json::json!({ "amount": { "N": "1" } }),
            "INSERT",
        ))
        .expect_err("no id");
        assert!(error.contains("no id string"), "{error}");
        let error = charge(&record(
            serde_json::json!({ "id": { "S": "ch_1" }, "amount": { "S": "12" }, "currency": { "S": "eur" } }),
            "INSERT",
        ))
        .expect_err("amount not a number");
        assert!(error.contains("no amount number"), "{error}");
    }
}
