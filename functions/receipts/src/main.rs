//! `receipts`: the reference SQS consumer.
//!
//! For each message `{"charge_id": "...", "email": "..."}` it "sends a
//! receipt": it adds 1 to `sent` on the item `charge_id` of the receipts
//! table. That business logic is deliberately not idempotent, so a duplicate
//! delivery (a redelivery of one message, or a producer's second send of the
//! same receipt) would show as `sent > 1` if the crate failed.
//!
//! Records are keyed by `charge_id`, processed concurrently, and the
//! increment commits in one transaction with each record's idempotency
//! record. Failed records go back to the queue through `batchItemFailures`.
//!
//! Environment: `IDEMPOTENCY_TABLE`, `RECEIPTS_TABLE`, and the standard AWS
//! variables. `IDEMPOTENCY_STORE_URL` (`postgres://…`, `redis://…`; built
//! with `--features postgres,redis`) keeps the idempotency records in
//! another store; the increment is then made by the handler between the
//! claim and the completion, not in one transaction with the record.
#![forbid(unsafe_code)]

#[path = "../../../cli/src/store_url.rs"]
mod store_url;
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis")),
    allow(unused_imports)
)]
use store_url::OtherStore;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_dynamodb::types::{AttributeValue, TransactWriteItem, Update};
use lambda_idempotency::{
    consumers::SqsBatch, store::Store, DynamoDbStore, EmfMetrics, Engine, Fingerprint,
};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde::Deserialize;
use std::sync::Arc;

#[derive(Debug, Deserialize, serde::Serialize)]
struct ReceiptRequest {
    charge_id: String,
    email: String,
}

fn parse(message: &SqsMessage) -> Option<ReceiptRequest> {
    let request: ReceiptRequest = serde_json::from_str(message.body.as_deref()?).ok()?;
    (!request.charge_id.is_empty()).then_some(request)
}

/// The receipt: an increment of `sent` on the charge's item.
fn receipt(table: &str, message: &SqsMessage) -> Result<(String, Update), Error> {
    let request = parse(message).ok_or("the message body is not {\"charge_id\", \"email\"}")?;
    let update = Update::builder()
        .table_name(table)
        .key("charge_id", AttributeValue::S(request.charge_id.clone()))
        .update_expression("ADD sent :one SET email = :email, last_message_id = :message_id")
        .expression_attribute_values(":one", AttributeValue::N("1".into()))
        .expression_attribute_values(":email", AttributeValue::S(request.email))
        .expression_attribute_values(
            ":message_id",
            AttributeValue::S(message.message_id.clone().unwrap_or_default()),
        )
        .build()?;
    Ok((request.charge_id, update))
}

/// The receipt, as a write that commits with the record's completion.
fn send_receipt(table: &str, message: &SqsMessage) -> Result<((), Vec<TransactWriteItem>), Error> {
    let (charge, update) = receipt(table, message)?;
    // Committed with the idempotency record, or not at all (a duplicate's
    // commit is refused and it gets the replay).
    tracing::debug!(%charge, "receipt write prepared");
    Ok((
        (),
        vec![TransactWriteItem::builder().update(update).build()],
    ))
}

/// The receipt, sent now, under the record's claim (another store).
#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
async fn send_receipt_now(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    message: &SqsMessage,
) -> Result<(), Error> {
    let (charge, update) = receipt(table, message)?;
    client
        .update_item()
        .table_name(update.table_name())
        .set_key(Some(update.key().clone()))
        .update_expression(update.update_expression())
        .set_expression_attribute_values(update.expression_attribute_values().cloned())
        .send()
        .await?;
    tracing::info!(%charge, "receipt sent");
    Ok(())
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

/// Keyed by the charge, so a producer's second send is caught, not only
/// SQS's redeliveries; fingerprinted by the parsed body, so whitespace or key
/// order in the JSON does not matter.
fn batch<St: Store>(engine: Engine<St>) -> SqsBatch<St> {
    SqsBatch::new(engine, "receipts")
        .key(|message: &SqsMessage| parse(message).map(|request| request.charge_id))
        .fingerprint(|message: &SqsMessage| match parse(message) {
            Some(request) => Fingerprint::of_json(&request)
                .unwrap_or_else(|_| Fingerprint::of_bytes(request.charge_id.as_bytes())),
            None => Fingerprint::of_bytes(message.body.as_deref().unwrap_or_default().as_bytes()),
        })
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
    let table: Arc<str> = required_env("RECEIPTS_TABLE")?.into();
    if let Some(url) = std::env::var("IDEMPOTENCY_STORE_URL")
        .ok()
        .filter(|url| !url.is_empty())
    {
        return serve_other(&url, client, table).await;
    }
    let store = DynamoDbStore::new(client, required_env("IDEMPOTENCY_TABLE")?);
    // The handler's only effect is the write it returns, so each new record
    // costs one DynamoDB call.
    let batch = batch(engine(store)).single_write();
    lambda_runtime::run_concurrent(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let batch = batch.clone();
        let table = Arc::clone(&table);
        async move {
            let handler = |message: SqsMessage| {
                let result = send_receipt(&table, &message);
                async move { result }
            };
            Ok::<SqsBatchResponse, Error>(batch.process_transactional(event, handler).await?)
        }
    }))
    .await
}

/// The store named by `IDEMPOTENCY_STORE_URL`, where this build has it.
#[cfg_attr(
    not(any(feature = "postgres", feature = "redis")),
    allow(unused_variables)
)]
async fn serve_other(
    url: &str,
    client: aws_sdk_dynamodb::Client,
    table: Arc<str>,
) -> Result<(), Error> {
    match store_url::open(url, store_url::POSTGRES_TABLE, true).await? {
        #[cfg(feature = "postgres")]
        OtherStore::Postgres(store) => serve(batch(engine(store)), client, table).await,
        #[cfg(feature = "redis")]
        OtherStore::Redis(store) => serve(batch(engine(store)), client, table).await,
    }
}

/// Each record's receipt sent under its claim.
#[cfg_attr(not(any(feature = "postgres", feature = "redis")), allow(dead_code))]
async fn serve<St: Store>(
    batch: SqsBatch<St>,
    client: aws_sdk_dynamodb::Client,
    table: Arc<str>,
) -> Result<(), Error> {
    lambda_runtime::run_concurrent(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let (batch, client, table) = (batch.clone(), client.clone(), Arc::clone(&table));
        async move {
            let handler = |message: SqsMessage| {
                let (client, table) = (client.clone(), Arc::clone(&table));
                async move { send_receipt_now(&client, &table, &message).await }
            };
            Ok::<SqsBatchResponse, Error>(batch.process(event, handler).await?)
        }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(body: &str) -> SqsMessage {
        let mut message = SqsMessage::default();
        message.message_id = Some("m1".into());
        message.body = Some(body.into());
        message
    }

    #[test]
    fn receipts_are_an_increment_on_the_charge() {
        let (_, writes) = send_receipt(
            "receipts",
            &message(r#"{"charge_id":"ch_1","email":"a@example.com"}"#),
        )
        .unwrap();
        let update = writes[0].update().expect("an update");
        assert_eq!(update.table_name(), "receipts");
        assert_eq!(
            update.key().get("charge_id"),
            Some(&AttributeValue::S("ch_1".into()))
        );
        assert!(update.update_expression().starts_with("ADD sent :one"));
    }

    #[test]
    fn malformed_bodies_are_errors_without_a_key() {
        for body in [
            "",
            "not json",
            r#"{"charge_id":""}"#,
            r#"{"charge_id":"","email":"e"}"#,
            r#"{"email":"e"}"#,
        ] {
            assert!(parse(&message(body)).is_none(), "{body}");
            assert!(send_receipt("receipts", &message(body)).is_err(), "{body}");
        }
    }
}
