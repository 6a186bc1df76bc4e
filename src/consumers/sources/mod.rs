//! The [`Source`](super::Source) of each at-least-once Lambda event, and
//! its [`Batch`](super::Batch) name.

mod kafka;
mod mq;
mod notifications;
mod sqs;
mod streams;

pub use kafka::{Kafka, KafkaBatch};
pub use mq::{ActiveMq, ActiveMqBatch, RabbitMq, RabbitMqBatch};
pub use notifications::{EventBridge, EventBridgeBatch, Sns, SnsBatch};
pub use sqs::{Sqs, SqsBatch};
pub use streams::{DynamoDbStream, DynamoDbStreamBatch, Kinesis, KinesisBatch};
