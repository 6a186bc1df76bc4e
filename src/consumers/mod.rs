//! Idempotent event consumers: every Lambda event source that delivers at
//! least once, and `lambda_runtime` handlers of any event type.
//!
//! Queues, streams, brokers and buses deliver at least once, Lambda retries
//! failed batches, and producers send twice. Two tools, on the same
//! [`Engine`](crate::Engine) as the HTTP layer:
//!
//! - [`Batch`]: each record of a batch processed idempotently, with the
//!   source's own order and retry semantics, through one API for every
//!   source:
//!
//!   | source | type | order | what a record that does not complete does |
//!   |---|---|---|---|
//!   | SQS standard | [`SqsBatch`] | none (concurrent, `MessageGroupId` or not) | reported in `batchItemFailures`; redelivered after the visibility timeout |
//!   | SQS FIFO (queue ARN ending in `.fifo`) | [`SqsBatch`] | per message group | it and the rest of its group reported |
//!   | Kinesis Data Streams | [`KinesisBatch`] | the batch (one shard) | it and the records after it reported: the shard resumes from it |
//!   | DynamoDB Streams | [`DynamoDbStreamBatch`] | the batch (one shard) | it and the records after it reported |
//!   | Kafka (MSK, self-managed) | [`KafkaBatch`] | per partition | the invocation fails ([`BatchFailed`]): the batch comes again |
//!   | Kafka with `ReportBatchItemFailures` | [`KafkaPartialBatch`] | per partition | its `topic-partition` and offset reported: the partition resumes there |
//!   | Amazon MQ (RabbitMQ) | [`RabbitMqBatch`] | per queue | the invocation fails |
//!   | Amazon MQ (ActiveMQ) | [`ActiveMqBatch`] | per destination | the invocation fails |
//!   | SNS | [`SnsBatch`] | none | the invocation fails: Lambda retries it |
//!   | EventBridge | [`EventBridgeBatch`] | one event | the invocation fails: Lambda retries it |
//!
//!   On every redelivery the records that completed replay (their handler
//!   does not run again), so a retried batch resumes where it stopped. The
//!   key of a record defaults to the source's identity of the delivery (a
//!   message id, `eventID`, `topic/partition/offset`), and a closure can
//!   give a business key instead, which also catches a producer's second
//!   send; the default fingerprint is what the sender sent (a body and its
//!   attributes, data and partition key, an image), never the metadata of
//!   a delivery, so a second delivery under a business key replays (each
//!   source's docs say what it covers). `process` returns the response, or
//!   a [`BatchFailed`] to return with `?`; a record that panics fails alone.
//!   The partial responses are read only with `ReportBatchItemFailures` on
//!   the event source mapping (without it Lambda deletes or skips every
//!   record they name); [`Batch::fail_on_entire_batch_failure`] fails the
//!   invocation when nothing completed. Never wrap a `Batch` handler in an
//!   [`IdempotentEventLayer`]: it would replay a partial-failure response
//!   to the batch's retry. [`Source`] lets another event type be processed
//!   the same way.
//! - [`IdempotentEventLayer`]: a tower layer for a handler of events `E`,
//!   with the key and the fingerprinted part of the event chosen by
//!   closures; the handler's result is stored with serde and replayed to
//!   redeliveries.
//!
//! Inside any handler, [`Engine::execute`](crate::Engine::execute) makes one
//! async function idempotent, and [`derive_key`](crate::derive_key) gives each
//! downstream call of a fan-out its own stable key from the parent's.

mod batch;
mod config;
mod failed;
mod future;
mod layer;
mod service;
mod source;
mod sources;

pub use batch::{Batch, DEFAULT_CONCURRENCY};
pub use failed::BatchFailed;
pub use future::ResponseFuture;
pub use layer::IdempotentEventLayer;
pub use service::IdempotentEvent;
pub use source::{Delivery, RecordStatus, Report, Source};
pub use sources::{
    ActiveMq, ActiveMqBatch, DynamoDbStream, DynamoDbStreamBatch, EventBridge, EventBridgeBatch,
    Kafka, KafkaBatch, KafkaBatchItemFailure, KafkaBatchResponse, KafkaItemIdentifier,
    KafkaPartial, KafkaPartialBatch, Kinesis, KinesisBatch, RabbitMq, RabbitMqBatch, Sns, SnsBatch,
    Sqs, SqsBatch,
};

#[cfg(test)]
mod tests;
