//! Amazon SQS, standard and FIFO queues.

use crate::{
    consumers::{Batch, Delivery, Report, Source},
    Fingerprint,
};
use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};

/// Amazon SQS: the [`Source`] of an [`SqsBatch`].
#[derive(Debug, Clone, Copy)]
pub struct Sqs;

/// Processes the records of an SQS batch idempotently, and reports the ones
/// to redeliver in an [`SqsBatchResponse`] (enable `ReportBatchItemFailures`
/// on the event source mapping).
///
/// - **Key**: the record's `messageId` (each redelivery of a message keeps
///   it); a business key from the body also catches a producer's second
///   send. **Fingerprint**: the body.
/// - **Standard queues**: records run concurrently, up to
///   [`concurrency`](Batch::concurrency) at once; each record that does not
///   complete is reported, and SQS delivers it again after its visibility
///   timeout (to the dead-letter queue after `maxReceiveCount`).
/// - **FIFO queues**: the records of one message group run in order, and a
///   group stops at its first record that does not complete: that record
///   and the rest of its group are reported, so SQS delivers them again in
///   order. Different groups run side by side.
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
///         async move { Ok::<SqsBatchResponse, Error>(batch.process(event, send_receipt).await) }
///     }))
///     .await
/// }
/// ```
pub type SqsBatch<St> = Batch<Sqs, St>;

impl Source for Sqs {
    type Event = SqsEvent;
    type Record = SqsMessage;
    type Response = SqsBatchResponse;
    const NAME: &'static str = "SQS";
    const DEFAULT_KEY: &'static str = "the messageId";

    fn deliveries(event: SqsEvent) -> Vec<Delivery<SqsMessage>> {
        event
            .records
            .into_iter()
            .map(|message| match message.attributes.get("MessageGroupId") {
                Some(group) => Delivery::in_order(group.clone(), message),
                None => Delivery::unordered(message),
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
        Ok(Fingerprint::of_bytes(
            message.body.as_deref().unwrap_or_default().as_bytes(),
        ))
    }

    fn respond(report: Report) -> SqsBatchResponse {
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
        response
    }
}
