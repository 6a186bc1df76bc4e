//! The [`Source`](super::Source) of each at-least-once Lambda event, and
//! its [`Batch`](super::Batch) name.

mod kafka;
mod mq;
mod notifications;
mod sqs;
mod streams;

pub use kafka::{
    Kafka, KafkaBatch, KafkaBatchItemFailure, KafkaBatchResponse, KafkaItemIdentifier,
    KafkaPartial, KafkaPartialBatch,
};

use super::Delivery;
use std::collections::HashMap;

/// The records of an event that maps each ordered group (a partition, a
/// queue) to its records in order. The map's own order means nothing, so
/// groups are taken in name order, for reports that read the same each
/// time.
fn in_order_by_group<R>(groups: HashMap<String, Vec<R>>) -> Vec<Delivery<R>> {
    let mut groups: Vec<(String, Vec<R>)> = groups.into_iter().collect();
    groups.sort_by(|(a, _), (b, _)| a.cmp(b));
    groups
        .into_iter()
        .flat_map(|(group, records)| {
            records
                .into_iter()
                .map(move |record| Delivery::in_order(group.clone(), record))
        })
        .collect()
}
pub use mq::{ActiveMq, ActiveMqBatch, RabbitMq, RabbitMqBatch};
pub use notifications::{EventBridge, EventBridgeBatch, Sns, SnsBatch};
pub use sqs::{Sqs, SqsBatch};
pub use streams::{DynamoDbStream, DynamoDbStreamBatch, Kinesis, KinesisBatch};
