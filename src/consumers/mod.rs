//! Idempotent event consumers: `lambda_runtime` handlers of any event type,
//! and SQS batches with partial batch responses.
//!
//! SQS, SNS, EventBridge and Kafka deliver at least once, and producers send
//! twice. Two tools, on the same [`Engine`](crate::Engine) as the HTTP
//! layer:
//!
//! - [`IdempotentEventLayer`]: a tower layer for a handler of events `E`,
//!   with the key and the fingerprinted part of the event chosen by closures;
//!   the handler's result is stored with serde and replayed to redeliveries.
//! - [`SqsBatch`]: each record of an SQS batch processed idempotently,
//!   concurrently (in order per message group on FIFO queues), with the
//!   records to redeliver reported in `batchItemFailures`.
//!
//! Inside any handler, [`Engine::execute`](crate::Engine::execute) makes one
//! async function idempotent, and [`derive_key`](crate::derive_key) gives each
//! downstream call of a fan-out its own stable key from the parent's.

mod config;
mod future;
mod layer;
mod service;
mod sqs;

pub use future::ResponseFuture;
pub use layer::IdempotentEventLayer;
pub use service::IdempotentEvent;
pub use sqs::{SqsBatch, DEFAULT_CONCURRENCY};

#[cfg(test)]
mod tests;
