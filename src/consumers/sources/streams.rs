//! Kinesis Data Streams and DynamoDB Streams: shards read in order, with
//! checkpointing.

use crate::{
    consumers::{Batch, BatchFailed, Delivery, Report, Source},
    Fingerprint,
};
use aws_lambda_events::{
    dynamodb::{Event as DynamoDbEvent, EventRecord as DynamoDbRecord},
    kinesis::{KinesisEvent, KinesisEventRecord},
    streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse, KinesisEventResponse},
};
use serde::Serialize;

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
/// - **Order**: a batch is one shard, and its records run one after another
///   in sequence order. At the first record that does not complete (its
///   handler failed, or it is in progress in another invocation) the batch
///   stops, and the response names that record and every one after it:
///   Lambda resumes the shard from the lowest sequence number named, so the
///   records after it are not skipped and never run ahead of it. On that
///   retry the records before it that completed replay instead of running
///   again, and so do the ones after it that a concurrent delivery
///   completed.
/// - **Key**: the record's `eventID` (`shardId-…:sequenceNumber`, the same
///   on every retry); a business key from the data catches a producer's
///   second `PutRecord`, which gets a new sequence number. **Fingerprint**:
///   the record's partition key and data, never its sequence number or
///   `approximateArrivalTimestamp`, which a second `PutRecord` changes.
/// - **Without `ReportBatchItemFailures`** on the event source mapping,
///   Lambda ignores the response and checkpoints past the whole batch: the
///   records named in it are skipped. Enable it.
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
///         async move { Ok::<KinesisEventResponse, Error>(batch.process(event, record_click).await?) }
///     }))
///     .await
/// }
/// ```
pub type KinesisBatch<St> = Batch<Kinesis, St>;

/// Processes a DynamoDB Streams batch idempotently and in order, and returns
/// the checkpoint in a [`DynamoDbEventResponse`] (enable
/// `ReportBatchItemFailures` on the event source mapping).
///
/// - **Order**: a batch is one shard (whatever `eventSourceARN` its records
///   carry), and its records run one after another in stream order. At the
///   first record that does not complete the batch stops, and the response
///   names its `SequenceNumber` and every one after it: Lambda resumes the
///   shard from the lowest; on that retry the records that completed replay
///   instead of running again.
/// - **Key**: the record's `eventID`, unique per stream record and the same
///   on every retry; a business key from the image (an order id) also
///   catches the same change delivered twice. **Fingerprint**: the change
///   itself: `eventName`, `Keys`, `NewImage` and `OldImage`. Never the
///   delivery's metadata (`eventID`, `SequenceNumber`,
///   `ApproximateCreationDateTime`, `SizeBytes`), which differ between two
///   stream records of the same change: a fingerprint over them would make
///   the second one "key reused with another payload" on every retry, and
///   stall the shard. Another change under the same business key (another
///   image, or a `MODIFY` after the `INSERT`) is still refused as such.
/// - **Without `ReportBatchItemFailures`** on the event source mapping,
///   Lambda ignores the response and checkpoints past the whole batch.
/// - **A record that keeps failing** stops the shard until the mapping's
///   `MaximumRetryAttempts` or `MaximumRecordAgeInSeconds` (a stream keeps
///   records 24 hours); set them with `BisectBatchOnFunctionError` and an
///   on-failure destination. The `ledger` reference function
///   (`functions/ledger` in the repository) is a complete example, with its SAM template.
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
///         async move { Ok::<DynamoDbEventResponse, Error>(batch.process(event, index_order).await?) }
///     }))
///     .await
/// }
/// ```
pub type DynamoDbStreamBatch<St> = Batch<DynamoDbStream, St>;

fn non_empty(value: &str) -> Option<String> {
    (!value.is_empty()).then(|| value.to_owned())
}

/// Lambda reads a stream batch from one shard: its records are one ordered
/// group, whatever stream or shard each says it comes from (Powertools'
/// DynamoDB Streams example holds records with two ARNs).
const SHARD: &str = "shard";

impl Source for Kinesis {
    type Event = KinesisEvent;
    type Record = KinesisEventRecord;
    type Output = KinesisEventResponse;
    const NAME: &'static str = "Kinesis";
    const DEFAULT_KEY: &'static str = "the eventID";

    fn deliveries(event: KinesisEvent) -> Vec<Delivery<KinesisEventRecord>> {
        let records = event.records.into_iter();
        records
            .map(|record| Delivery::in_order(SHARD, record))
            .collect()
    }

    fn id(record: &KinesisEventRecord) -> Option<String> {
        non_empty(&record.kinesis.sequence_number)
    }

    fn default_key(record: &KinesisEventRecord) -> Option<String> {
        record.event_id.as_deref().and_then(non_empty)
    }

    fn default_fingerprint(record: &KinesisEventRecord) -> Result<Fingerprint, String> {
        let partition_key = record.kinesis.partition_key.as_bytes();
        Ok(Fingerprint::of_parts([partition_key, &record.kinesis.data]))
    }

    fn respond(report: Report) -> Result<KinesisEventResponse, BatchFailed> {
        // Every record not done, the held-back ones too: Lambda resumes
        // from the lowest sequence number named, and an empty one makes it
        // retry the whole batch, the only safe answer for a record it
        // cannot name.
        let mut response = KinesisEventResponse::default();
        response.set_failures(report.not_done());
        Ok(response)
    }
}

impl Source for DynamoDbStream {
    type Event = DynamoDbEvent;
    type Record = DynamoDbRecord;
    type Output = DynamoDbEventResponse;
    const NAME: &'static str = "DynamoDB Streams";
    const DEFAULT_KEY: &'static str = "the eventID";

    fn deliveries(event: DynamoDbEvent) -> Vec<Delivery<DynamoDbRecord>> {
        let records = event.records.into_iter();
        records
            .map(|record| Delivery::in_order(SHARD, record))
            .collect()
    }

    fn id(record: &DynamoDbRecord) -> Option<String> {
        record.change.sequence_number.as_deref().and_then(non_empty)
    }

    fn default_key(record: &DynamoDbRecord) -> Option<String> {
        non_empty(&record.event_id)
    }

    fn default_fingerprint(record: &DynamoDbRecord) -> Result<Fingerprint, String> {
        #[derive(Serialize)]
        struct Change<'a, Item> {
            event_name: &'a str,
            keys: &'a Item,
            new_image: &'a Item,
            old_image: &'a Item,
        }
        let change = Change {
            event_name: &record.event_name,
            keys: &record.change.keys,
            new_image: &record.change.new_image,
            old_image: &record.change.old_image,
        };
        Fingerprint::of_json(&change).map_err(|error| error.to_string())
    }

    fn respond(report: Report) -> Result<DynamoDbEventResponse, BatchFailed> {
        let mut response = DynamoDbEventResponse::default();
        response.batch_item_failures = report
            .not_done()
            .map(|id| {
                let mut failure = DynamoDbBatchItemFailure::default();
                failure.item_identifier = Some(id);
                failure
            })
            .collect();
        Ok(response)
    }
}
