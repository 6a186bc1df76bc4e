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
//!
//! # What "the same record" is
//!
//! The default fingerprint is what the sender
//! sent, never what the source adds to each delivery, so that under a business
//! key a second delivery of the same thing replays, and only another payload
//! under the key is refused ("key reused with another payload"):
//!
//! | source | fingerprinted | left out (differs between two deliveries of the same thing) |
//! |---|---|---|
//! | SQS | the body and the `messageAttributes` the sender set | `attributes` (`ApproximateReceiveCount`, `SentTimestamp`, …), `messageId`, receipt handle |
//! | Kinesis | the partition key and the data | sequence number, `approximateArrivalTimestamp`, `eventID` |
//! | DynamoDB Streams | `eventName`, `Keys`, `NewImage`, `OldImage` | `eventID`, `SequenceNumber`, `ApproximateCreationDateTime`, `SizeBytes` |
//! | Kafka | key, value and headers | offset, `timestamp` |
//! | Amazon MQ | the data | headers and properties (the broker adds some on redelivery) |
//! | SNS | `Message`, `Subject`, `MessageAttributes` | `MessageId`, `Timestamp`, `Signature`, the URLs |
//! | EventBridge | `source`, `detail-type`, `detail` | `id`, `time`, `replay-name` |
//!
//! A fingerprint over delivery metadata would refuse the second delivery on
//! every retry and stall a stream's shard until its retries ran out.
//! `.fingerprint(…)` chooses another part.
//!
//! # Configuring the event source mapping, and other rules
//!
//! - **Transactions.** `process_transactional` commits each record's DynamoDB
//!   writes in one transaction with its idempotency record (add
//!   `.single_write()` for one call per record). `functions/receipts` (SQS)
//!   and `functions/ledger` (DynamoDB Streams) keep deliberately
//!   non-idempotent counters (`sent += 1`, `entries += 1`) at 1 however often
//!   they are delivered.
//! - **Configure the mapping for the semantics.** Streams:
//!   `FunctionResponseTypes: [ReportBatchItemFailures]`,
//!   `BisectBatchOnFunctionError`, `MaximumRetryAttempts`,
//!   `MaximumRecordAgeInSeconds` and an on-failure destination, so that a
//!   poison record is given up on instead of stalling its shard (see
//!   `LedgerEventSourceMapping` in `template.yaml`). SQS:
//!   `ReportBatchItemFailures` and a dead-letter queue.
//! - **Without `ReportBatchItemFailures` the response is ignored.** Lambda
//!   reads a successful invocation as a complete batch: SQS deletes every
//!   message, the reported ones included, and a stream checkpoints past them:
//!   the records the response names are lost. `SqsBatch`, `KinesisBatch`,
//!   `DynamoDbStreamBatch` and `KafkaPartialBatch` need it on the mapping;
//!   where a Kafka mapping cannot have it (on-demand mode), use `KafkaBatch`.
//! - **`.fail_on_entire_batch_failure()`** (Powertools'
//!   `raise_on_entire_batch_failure`) fails the invocation when no record
//!   completed. A partial response that names every record is a successful
//!   invocation to Lambda: a downstream outage that fails everything shows in
//!   no `Errors` metric or alarm, Lambda's handling of function errors never
//!   starts, and each SQS message burns a receive towards its dead-letter
//!   queue.
//! - **Records that can never be processed as they are** (a key used before
//!   with another payload, no key, no fingerprint) are delivered again by
//!   default, as Powertools does, until the dead-letter queue takes them;
//!   on a FIFO queue or a stream they hold up their group until then.
//!   `.unprocessable(Unprocessable::Final)` gives them up instead: an ERROR
//!   line with the record's id and the reason, an `UnprocessableRecords`
//!   metric (`.metrics(EmfMetrics::new(…))`), and the group goes on. See
//!   [`Unprocessable`] for which to choose.
//! - **Retention outlasts retries.** A record's idempotency record must still
//!   exist when its batch is retried: keep `Engine::builder(…).retention` (24 h
//!   by default) above the mapping's `MaximumRecordAgeInSeconds` (Kinesis
//!   keeps records up to a year; DynamoDB Streams 24 h) and above how long an
//!   SQS message can come back (the queue keeps it up to 14 days; `maxReceiveCount`
//!   × the visibility timeout bounds it sooner), or a late redelivery runs
//!   again.
//! - **Never wrap a batch handler in `IdempotentEventLayer`.** The layer
//!   stores the handler's response and replays it: the retry of a batch with
//!   a partial failure would get the stored response, and its failed records
//!   would never run again. `Batch` already makes each record idempotent.
//! - **RabbitMQ sets no message id.** Publishers must set the `messageId`
//!   property, or give a business key with `.key(…)`; a message without a key
//!   fails loudly rather than run without a claim.
//! - **Parallelism.** Ordered groups (shards, partitions, queues, FIFO groups)
//!   run side by side, up to `.concurrency(n)` (8 by default); records of one
//!   group never do.
//! - `consumers::Source` lets another event type be processed the same way.

mod batch;
mod config;
mod failed;
mod future;
mod layer;
mod service;
mod source;
mod sources;
mod unprocessable;

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
pub use unprocessable::Unprocessable;

#[cfg(test)]
mod tests;
