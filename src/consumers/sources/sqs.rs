//! Amazon SQS, standard and FIFO queues.

use crate::{
    consumers::{Batch, BatchFailed, Delivery, Report, Source},
    Fingerprint,
};
use aws_lambda_events::sqs::{
    BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage, SqsMessageAttribute,
};
use serde::Serialize;
use std::collections::HashMap;

/// Amazon SQS: the [`Source`] of an [`SqsBatch`].
#[derive(Debug, Clone, Copy)]
pub struct Sqs;

/// Processes the records of an SQS batch idempotently, and reports the ones
/// to redeliver in an [`SqsBatchResponse`] (enable `ReportBatchItemFailures`
/// on the event source mapping).
///
/// - **Key**: the record's `messageId` (each redelivery of a message keeps
///   it); a business key from the body also catches a producer's second
///   send. **Fingerprint**: the body and the message attributes the sender
///   set (`messageAttributes`), never the attributes SQS adds to each
///   delivery (`ApproximateReceiveCount`, `SentTimestamp`,
///   `ApproximateFirstReceiveTimestamp`, …), which differ between a
///   producer's two sends and between two receives of one message.
/// - **Standard queues**: records run concurrently, up to
///   [`concurrency`](Batch::concurrency) at once; each record that does not
///   complete is reported, and SQS delivers it again after its visibility
///   timeout (to the dead-letter queue after `maxReceiveCount`). A
///   `MessageGroupId` on a standard queue (fair queues) orders nothing:
///   those records run concurrently too, so one failing message does not
///   hold its tenant's other messages back.
/// - **FIFO queues** (a queue ARN ending in `.fifo`): the records of one
///   message group run in order, and a group stops at its first record that
///   does not complete: that record and the rest of its group are
///   reported, so SQS delivers them again in order. Different groups run
///   side by side.
/// - **Without `ReportBatchItemFailures`** on the event source mapping,
///   Lambda ignores the response: the invocation succeeded, so SQS deletes
///   every message of the batch, the reported ones included, and they are
///   lost. Enable it.
/// - **Retention**: a message can come back for as long as the queue keeps
///   it (`MessageRetentionPeriod`, up to 14 days), longer than the engine's
///   default retention of 24 hours: keep
///   [`retention`](crate::EngineBuilder::retention) above the queue's
///   retention (or the message's `maxReceiveCount` times its visibility
///   timeout, whichever is shorter), or a late redelivery runs again.
///
/// ```no_run
/// use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
/// use lambda_idempotency::{consumers::SqsBatch, DynamoDbStore, Engine};
/// use lambda_runtime::{service_fn, Error, LambdaEvent};
///
/// async fn send_receipt(message: SqsMessage) -> Result<(), Error> {
///     Ok(())
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), Error> {
///     let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
///     let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency");
///     let batch = SqsBatch::new(Engine::builder(store).build(), "receipts");
///     lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
///         let batch = batch.clone();
///         async move { Ok::<SqsBatchResponse, Error>(batch.process(event, send_receipt).await?) }
///     }))
///     .await
/// }
/// ```
pub type SqsBatch<St> = Batch<Sqs, St>;

impl Source for Sqs {
    type Event = SqsEvent;
    type Record = SqsMessage;
    type Output = SqsBatchResponse;
    const NAME: &'static str = "SQS";
    const DEFAULT_KEY: &'static str = "the messageId";

    fn deliveries(event: SqsEvent) -> Vec<Delivery<SqsMessage>> {
        event
            .records
            .into_iter()
            .map(|message| {
                // Standard queues carry a MessageGroupId too (fair queues):
                // only a FIFO queue orders its groups.
                let fifo = message
                    .event_source_arn
                    .as_deref()
                    .is_some_and(|arn| arn.ends_with(".fifo"));
                if !fifo {
                    return Delivery::unordered(message);
                }
                let group = message.attributes.get("MessageGroupId");
                let group = group.cloned().unwrap_or_default();
                Delivery::in_order(group, message)
            })
            .collect()
    }

    fn id(message: &SqsMessage) -> Option<String> {
        message.message_id.clone().filter(|id| !id.is_empty())
    }

    fn default_key(message: &SqsMessage) -> Option<String> {
        Self::id(message)
    }

    fn default_fingerprint(message: &SqsMessage) -> Result<Fingerprint, String> {
        #[derive(Serialize)]
        struct Sent<'a> {
            body: Option<&'a str>,
            attributes: &'a HashMap<String, SqsMessageAttribute>,
        }
        let sent = Sent {
            body: message.body.as_deref(),
            attributes: &message.message_attributes,
        };
        Fingerprint::of_json(&sent).map_err(|error| error.to_string())
    }

    fn respond(report: Report) -> Result<SqsBatchResponse, BatchFailed> {
        let mut response = SqsBatchResponse::default();
        // A FIFO group's held-back records are reported too: SQS redelivers
        // exactly the records named, and they must not be lost.
        response.batch_item_failures = report
            .not_done()
            .map(|id| {
                let mut failure = BatchItemFailure::default();
                failure.item_identifier = id;
                failure
            })
            .collect();
        Ok(response)
    }
}
