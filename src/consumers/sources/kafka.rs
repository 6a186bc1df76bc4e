//! Apache Kafka: Amazon MSK and self-managed clusters.

use crate::{
    consumers::{Batch, BatchFailed, Delivery, Report, Source},
    Fingerprint,
};
use aws_lambda_events::kafka::{KafkaEvent, KafkaRecord};

/// Apache Kafka (Amazon MSK and self-managed): the [`Source`] of a
/// [`KafkaBatch`].
#[derive(Debug, Clone, Copy)]
pub struct Kafka;

/// Processes a Kafka batch (Amazon MSK or self-managed) idempotently and in
/// order per partition.
///
/// - **Order**: the records of a partition run one after another in offset
///   order, and a partition stops at its first record that does not
///   complete. Partitions run side by side, up to
///   [`concurrency`](Batch::concurrency).
/// - **Retries**: a Kafka event source mapping takes no partial batch
///   response, so when a record does not complete
///   [`process`](Batch::process) returns a [`BatchFailed`]: return it from
///   the handler, the invocation fails, and Lambda delivers the same batch
///   again. There the records that completed (in every partition) replay
///   instead of running again, and processing resumes at the failed one.
///   Set the mapping's retry limit and an on-failure destination so a
///   poison record cannot stall its partition.
/// - **Key**: `topic/partition/offset`, the record's place in the log, the
///   same on every redelivery; a business key (an order id from the value,
///   or the record key) also catches a producer's second send, which lands
///   at another offset. **Fingerprint**: the record's key and value.
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

fn place(record: &KafkaRecord) -> Option<String> {
    let topic = record.topic.as_deref().filter(|topic| !topic.is_empty())?;
    Some(format!("{topic}/{}/{}", record.partition, record.offset))
}

impl Source for Kafka {
    type Event = KafkaEvent;
    type Record = KafkaRecord;
    type Response = Result<(), BatchFailed>;
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
        let part = |value: &Option<String>| match value {
            Some(value) => [&[1u8][..], value.as_bytes()].concat(),
            None => vec![0u8],
        };
        Ok(Fingerprint::of_parts([
            part(&record.key).as_slice(),
            part(&record.value).as_slice(),
        ]))
    }

    fn respond(report: Report) -> Result<(), BatchFailed> {
        report.into_result()
    }
}
