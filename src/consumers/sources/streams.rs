//! Kinesis Data Streams and DynamoDB Streams: shards read in order, with
//! checkpointing.

use crate::{
    consumers::{Batch, Delivery, Report, Source},
    Fingerprint,
};
use aws_lambda_events::{
    dynamodb::{Event as DynamoDbEvent, EventRecord as DynamoDbRecord},
    kinesis::{KinesisEvent, KinesisEventRecord},
    streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse, KinesisEventResponse},
};

/// Kinesis Data Streams: the [`Source`] of a [`KinesisBatch`].
#[derive(Debug, Clone, Copy)]
pub struct Kinesis;

/// DynamoDB Streams: the [`Source`] of a [`DynamoDbStreamBatch`].
#[derive(Debug, Clone, Copy)]
pub struct DynamoDbStream;

/// Processes a Kinesis Data Streams batch idempotently and in order, and
/// returns the checkpoint in a [`KinesisEventResponse`] (enable
/// `ReportBatchItemFailures` on the event source mapping).
///
/// - **Order**: the records of a shard run one after another in sequence
///   order. At the first record that does not complete (its handler failed,
///   or it is in progress in another invocation) the shard stops, and the
///   response names that record's sequence number: Lambda resumes the shard
///   from it, so the records after it are not skipped and never run ahead
///   of it. On that retry the records before it that completed replay
///   instead of running again, and so do the ones after it that a
///   concurrent delivery completed. Shards (a batch holds one; shard ids
///   come from the `eventID`) may run side by side, up to
///   [`concurrency`](Batch::concurrency).
/// - **Key**: the record's `eventID` (`shardId-…:sequenceNumber`, the same
///   on every retry); a business key from the data catches a producer's
///   second `PutRecord`, which gets a new sequence number. **Fingerprint**:
///   the record's data.
/// - **A record that keeps failing** stops its shard until the mapping's
///   `MaximumRetryAttempts` or `MaximumRecordAgeInSeconds` is reached; then
///   Lambda sends it to the on-failure destination and moves on. Set both,
///   with `BisectBatchOnFunctionError`, so one poison record cannot stall a
///   shard for the stream's whole retention.
///
/// ```no_run
/// use aws_lambda_events::{kinesis::{KinesisEvent, KinesisEventRecord}, streams::KinesisEventResponse};
/// use lambda_idempotency::{consumers::KinesisBatch, DynamoDbStore, Engine};
/// use lambda_runtime::{service_fn, Error, LambdaEvent};
///
/// async fn record_click(record: KinesisEventRecord) -> Result<(), Error> {
///     let click: serde_json::Value = serde_json::from_slice(&record.kinesis.data)?;
///     Ok(())
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), Error> {
///     let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
///     let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency");
///     let batch = KinesisBatch::new(Engine::builder(store).build(), "clicks-stream/counter");
///     lambda_runtime::run(service_fn(|event: LambdaEvent<KinesisEvent>| {
///         let batch = batch.clone();
///         async move { Ok::<KinesisEventResponse, Error>(batch.process(event, record_click).await) }
///     }))
///     .await
/// }
/// ```
pub type KinesisBatch<St> = Batch<Kinesis, St>;

/// Processes a DynamoDB Streams batch idempotently and in order, and returns
/// the checkpoint in a [`DynamoDbEventResponse`] (enable
/// `ReportBatchItemFailures` on the event source mapping).
///
/// - **Order**: the records run one after another in stream order (Lambda
///   delivers one shard per batch). At the first record that does not
///   complete the batch stops, and the response names that record's
///   `SequenceNumber`: Lambda resumes the shard from it; on that retry the
///   records that completed replay instead of running again.
/// - **Key**: the record's `eventID`, unique per stream record and the same
///   on every retry; a business key from the image (an order id) also
///   catches the same change written twice. **Fingerprint**: the record's
///   change (`dynamodb`: keys, images, sequence number).
/// - **A record that keeps failing** stops the shard until the mapping's
///   `MaximumRetryAttempts` or `MaximumRecordAgeInSeconds` (a stream keeps
///   records 24 hours); set them with `BisectBatchOnFunctionError` and an
///   on-failure destination. The `ledger` reference function
///   (`src/bin/ledger.rs`) is a complete example, with its SAM template.
///
/// ```no_run
/// use aws_lambda_events::{dynamodb::{Event, EventRecord}, streams::DynamoDbEventResponse};
/// use lambda_idempotency::{consumers::DynamoDbStreamBatch, DynamoDbStore, Engine};
/// use lambda_runtime::{service_fn, Error, LambdaEvent};
///
/// async fn index_order(record: EventRecord) -> Result<(), Error> {
///     if record.event_name != "INSERT" {
///         return Ok(());
///     }
///     Ok(())
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), Error> {
///     let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
///     let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency");
///     let batch = DynamoDbStreamBatch::new(Engine::builder(store).build(), "orders-stream/indexer");
///     lambda_runtime::run(service_fn(|event: LambdaEvent<Event>| {
///         let batch = batch.clone();
///         async move { Ok::<DynamoDbEventResponse, Error>(batch.process(event, index_order).await) }
///     }))
///     .await
/// }
/// ```
pub type DynamoDbStreamBatch<St> = Batch<DynamoDbStream, St>;

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

impl Source for Kinesis {
    type Event = KinesisEvent;
    type Record = KinesisEventRecord;
    type Response = KinesisEventResponse;
    const NAME: &'static str = "Kinesis";
    const DEFAULT_KEY: &'static str = "the eventID";

    fn deliveries(event: KinesisEvent) -> Vec<Delivery<KinesisEventRecord>> {
        event
            .records
            .into_iter()
            .map(|record| {
                let stream = record.event_source_arn.clone().unwrap_or_default();
                let shard = record
                    .event_id
                    .as_deref()
                    .and_then(|id| id.split_once(':'))
                    .map(|(shard, _)| shard.to_owned())
                    .unwrap_or_default();
                Delivery::in_order(format!("{stream}/{shard}"), record)
            })
            .collect()
    }

    fn id(record: &KinesisEventRecord) -> Option<String> {
        non_empty(&record.kinesis.sequence_number)
    }

    fn default_key(record: &KinesisEventRecord) -> Option<String> {
        record.event_id.as_deref().and_then(non_empty)
    }

    fn default_fingerprint(record: &KinesisEventRecord) -> Result<Fingerprint, String> {
        Ok(Fingerprint::of_bytes(&record.kinesis.data))
    }

    fn respond(report: Report) -> KinesisEventResponse {
        // The first failure of each shard only: Lambda resumes from the
        // lowest sequence number reported, and an empty one makes it retry
        // the whole batch, the only safe answer for a record it cannot name.
        let mut response = KinesisEventResponse::default();
        response.set_failures(report.failed());
        response
    }
}

impl Source for DynamoDbStream {
    type Event = DynamoDbEvent;
    type Record = DynamoDbRecord;
    type Response = DynamoDbEventResponse;
    const NAME: &'static str = "DynamoDB Streams";
    const DEFAULT_KEY: &'static str = "the eventID";

    fn deliveries(event: DynamoDbEvent) -> Vec<Delivery<DynamoDbRecord>> {
        event
            .records
            .into_iter()
            .map(|record| {
                let stream = record.event_source_arn.clone().unwrap_or_default();
                Delivery::in_order(stream, record)
            })
            .collect()
    }

    fn id(record: &DynamoDbRecord) -> Option<String> {
        record.change.sequence_number.as_deref().and_then(non_empty)
    }

    fn default_key(record: &DynamoDbRecord) -> Option<String> {
        non_empty(&record.event_id)
    }

    fn default_fingerprint(record: &DynamoDbRecord) -> Result<Fingerprint, String> {
        Fingerprint::of_json(&record.change).map_err(|error| error.to_string())
    }

    fn respond(report: Report) -> DynamoDbEventResponse {
        let mut response = DynamoDbEventResponse::default();
        response.batch_item_failures = report
            .failed()
            .map(|id| {
                let mut failure = DynamoDbBatchItemFailure::default();
                failure.item_identifier = Some(id);
                failure
            })
            .collect();
        response
    }
}
