//! Apache Kafka: Amazon MSK and self-managed clusters.

use crate::{
    consumers::{Batch, BatchFailed, Delivery, RecordStatus, Report, Source},
    Fingerprint,
};
use aws_lambda_events::kafka::{KafkaEvent, KafkaRecord};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Apache Kafka (Amazon MSK and self-managed): the [`Source`] of a
/// [`KafkaBatch`], whose failures fail the invocation.
#[derive(Debug, Clone, Copy)]
pub struct Kafka;

/// Apache Kafka with `ReportBatchItemFailures` on the event source
/// mapping: the [`Source`] of a [`KafkaPartialBatch`], whose failures are
/// named in a [`KafkaBatchResponse`].
#[derive(Debug, Clone, Copy)]
pub struct KafkaPartial;

/// Processes a Kafka batch (Amazon MSK or self-managed) idempotently and in
/// order per partition.
///
/// - **Order**: the records of a partition run one after another in offset
///   order, and a partition stops at its first record that does not
///   complete. Partitions run side by side, up to
///   [`concurrency`](Batch::concurrency).
/// - **Retries**: when a record does not complete
///   [`process`](Batch::process) returns a [`BatchFailed`]: return it from
///   the handler, the invocation fails, and Lambda delivers the same batch
///   again. There the records that completed (in every partition) replay
///   instead of running again, and processing resumes at the failed one.
///   This works with every Kafka event source mapping. A mapping in
///   provisioned mode can take a partial batch response instead
///   (`ReportBatchItemFailures`): use [`KafkaPartialBatch`] there. Set the
///   mapping's retry limit and an on-failure destination so a poison
///   record cannot stall its partition.
/// - **Key**: `topic/partition/offset`, the record's place in the log, the
///   same on every redelivery; a business key (an order id from the value,
///   or the record key) also catches a producer's second send, which lands
///   at another offset. **Fingerprint**: what the producer sent: the
///   record's key, value and headers; never its offset or `timestamp`,
///   which differ between a producer's two sends.
///
/// ```no_run
/// use aws_lambda_events::kafka::{KafkaEvent, KafkaRecord};
/// use lambda_idempotency::{consumers::KafkaBatch, DynamoDbStore, Engine};
/// use lambda_runtime::{service_fn, Error, LambdaEvent};
///
/// async fn ship(record: KafkaRecord) -> Result<(), Error> {
///     Ok(())
/// }
///
/// #[tokio::main(flavor = "current_thread")]
/// async fn main() -> Result<(), Error> {
///     let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
///     let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency");
///     // The producer puts the order id in the record key: a second send is caught too.
///     let batch = KafkaBatch::new(Engine::builder(store).build(), "orders-topic/shipper")
///         .key(|record: &KafkaRecord| record.key.clone());
///     lambda_runtime::run(service_fn(|event: LambdaEvent<KafkaEvent>| {
///         let batch = batch.clone();
///         async move { Ok::<(), Error>(batch.process(event, ship).await?) }
///     }))
///     .await
/// }
/// ```
pub type KafkaBatch<St> = Batch<Kafka, St>;

/// Processes a Kafka batch like [`KafkaBatch`], and names the records to
/// deliver again in a partial batch response, for an event source mapping
/// with `FunctionResponseTypes: [ReportBatchItemFailures]` (provisioned
/// mode, Amazon MSK and self-managed).
///
/// **Only with that setting**: without it Lambda ignores the response, the
/// invocation succeeded, and the mapping commits past the records the
/// response names: they are skipped. Where the mapping cannot have it, use
/// [`KafkaBatch`], which fails the invocation instead.
///
/// - **Order**: as [`KafkaBatch`]: a partition stops at its first record
///   that does not complete.
/// - **Response**: a [`KafkaBatchResponse`] naming, for each partition that
///   stopped, its first record that did not complete by its
///   `topic-partition` (the key of the event's `records` map) and offset;
///   Lambda resumes that partition from that offset, and the partitions not
///   named are done. This is the shape AWS documents for Kafka's partial
///   batch response ("Configuring error handling controls for Kafka event
///   sources"), and that Powertools' batch processor returns (its
///   `KafkaItemIdentifier`: `partition` and `offset`); `aws_lambda_events`
///   1.2 has no type for it. A failed record the response cannot name
///   (an event without records) fails the invocation instead.
pub type KafkaPartialBatch<St> = Batch<KafkaPartial, St>;

/// The partial batch response of a Kafka event source mapping with
/// `ReportBatchItemFailures`: what [`KafkaPartialBatch`] returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KafkaBatchResponse {
    /// The first record of each partition to deliver again; empty when the
    /// batch completed.
    pub batch_item_failures: Vec<KafkaBatchItemFailure>,
}

/// One partition to resume, in a [`KafkaBatchResponse`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KafkaBatchItemFailure {
    /// The record to resume from.
    pub item_identifier: KafkaItemIdentifier,
}

/// A Kafka record as a partial batch response names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaItemIdentifier {
    /// The `topic-partition` key of the event's `records` map.
    pub partition: String,
    /// The record's offset in that partition.
    pub offset: i64,
}

fn place(record: &KafkaRecord) -> Option<String> {
    let topic = record.topic.as_deref().filter(|topic| !topic.is_empty())?;
    Some(format!("{topic}/{}/{}", record.partition, record.offset))
}

fn sent(record: &KafkaRecord) -> Result<Fingerprint, String> {
    #[derive(Serialize)]
    struct Sent<'a> {
        key: Option<&'a str>,
        value: Option<&'a str>,
        // In order: Kafka headers are a list, and may repeat a name.
        headers: &'a [HashMap<String, Vec<i8>>],
    }
    let sent = Sent {
        key: record.key.as_deref(),
        value: record.value.as_deref(),
        headers: &record.headers,
    };
    Fingerprint::of_json(&sent).map_err(|error| error.to_string())
}

impl Source for Kafka {
    type Event = KafkaEvent;
    type Record = KafkaRecord;
    type Output = ();
    const NAME: &'static str = "Kafka";
    const DEFAULT_KEY: &'static str = "topic/partition/offset";

    fn deliveries(event: KafkaEvent) -> Vec<Delivery<KafkaRecord>> {
        // "topic-partition" → that partition's records in offset order.
        super::in_order_by_group(event.records)
    }

    fn id(record: &KafkaRecord) -> Option<String> {
        place(record)
    }

    fn default_key(record: &KafkaRecord) -> Option<String> {
        place(record)
    }

    fn default_fingerprint(record: &KafkaRecord) -> Result<Fingerprint, String> {
        sent(record)
    }

    fn respond(report: Report) -> Result<(), BatchFailed> {
        report.into_result()
    }
}

impl Source for KafkaPartial {
    type Event = KafkaEvent;
    type Record = KafkaRecord;
    type Output = KafkaBatchResponse;
    const NAME: &'static str = "Kafka";
    const DEFAULT_KEY: &'static str = Kafka::DEFAULT_KEY;

    fn deliveries(event: KafkaEvent) -> Vec<Delivery<KafkaRecord>> {
        Kafka::deliveries(event)
    }

    fn id(record: &KafkaRecord) -> Option<String> {
        Kafka::id(record)
    }

    fn default_key(record: &KafkaRecord) -> Option<String> {
        Kafka::default_key(record)
    }

    fn default_fingerprint(record: &KafkaRecord) -> Result<Fingerprint, String> {
        sent(record)
    }

    fn respond(report: Report) -> Result<KafkaBatchResponse, BatchFailed> {
        // A partition stops at its first record that does not complete, so
        // the failed records are exactly one per stopped partition; the
        // ones held back behind it follow from its offset.
        let named: Option<Vec<KafkaBatchItemFailure>> = report
            .records
            .iter()
            .filter(|record| record.status == RecordStatus::Failed)
            .map(|record| {
                let partition = record.group.clone()?;
                let offset = record.id.as_deref()?.rsplit('/').next()?.parse().ok()?;
                let item_identifier = KafkaItemIdentifier { partition, offset };
                Some(KafkaBatchItemFailure { item_identifier })
            })
            .collect();
        match named {
            Some(batch_item_failures) => Ok(KafkaBatchResponse {
                batch_item_failures,
            }),
            None => Err(BatchFailed::new(report)),
        }
    }
}
