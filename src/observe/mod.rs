//! One place every port reports to: the engine's observers.
//!
//! Every entry point of the engine reports how it answered each attempt
//! ([`Event::Answered`], with the [`Port`] the attempt came through), and
//! the engine reports what it met on the way: a lapsed claim it took over,
//! a claim it found in progress and how old it was, a conflict it retried,
//! and each call it made to its store, timed ([`Event::StoreCalled`]); and,
//! when asked, how many records its store holds ([`Event::TableSized`]). A
//! fail-open run is an answer of its own
//! ([`OutcomeKind::Unprotected`]).
//! The ports (the HTTP layer, gRPC, actix-web, the consumers, the durable
//! crate) call the engine, so they report through it: a new port cannot
//! forget an outcome. An exporter (CloudWatch's Embedded Metric Format, the
//! `metrics` facade, OpenTelemetry) is an [`Observer`].
//!
//! ```
//! use lambda_idempotency::{observe::{Event, Observer}, Engine, MemoryStore};
//! use std::sync::atomic::{AtomicU64, Ordering};
//!
//! /// Counts replays.
//! #[derive(Debug, Default)]
//! struct Replays(AtomicU64);
//!
//! impl Observer for Replays {
//!     fn observe(&self, event: &Event) {
//!         if let Event::Answered { answer, .. } = event {
//!             if answer.is_replay() {
//!                 self.0.fetch_add(1, Ordering::Relaxed);
//!             }
//!         }
//!     }
//! }
//!
//! let engine = Engine::builder(MemoryStore::new()).observer(Replays::default()).build();
//! # let _ = engine;
//! ```
//!
//! # OpenTelemetry
//!
//! Traces go through `tracing`: with `tracing-opentelemetry` as a layer of
//! the application's subscriber, the OpenTelemetry SDK exports the crate's
//! spans (`examples/opentelemetry.rs`, over OTLP). Each store call is a
//! database client span, `idempotency <operation>` (`idempotency claim`,
//! `idempotency complete`, …), with the semantic conventions'
//! `db.system.name` ([`Store::DB_SYSTEM`](crate::store::Store::DB_SYSTEM):
//! `aws.dynamodb`, `postgresql`, `mysql`, `redis`), `db.operation.name`,
//! and `error.type` with an error status when it fails. The HTTP layer's
//! request span, `idempotency`, carries `http.response.status_code` (the
//! conventions' name), `idempotency.outcome` and `idempotency.in_flight`
//! (the crate's own), and on a replay of a record that kept the trace of
//! its work ([`keep_trace_context`]), `idempotency.replay_of` (that trace's
//! `traceparent`) and, with the `opentelemetry` feature, a link to that
//! span; its store calls are its children. No key, record id or stored
//! value is an attribute.
//!
//! [`keep_trace_context`]: https://docs.rs/lambda-idempotency/latest/lambda_idempotency/http/struct.IdempotencyLayer.html#method.keep_trace_context
//!
//! An observer is called on the request's task, as the event happens: keep
//! it cheap (count, record a histogram sample), never block or await. One
//! that panics is logged (ERROR) and passed over; the request goes on. The
//! events carry no key and no record id, so that what an exporter makes of
//! them has a bounded set of label values.

#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
mod metrics;
#[cfg(feature = "metrics")]
pub use metrics::{
    Metrics, CONFLICTS_RETRIED, PENDING_KEY_AGE, REQUESTS, REQUEST_DURATION, STORE_DURATION,
    TABLE_BYTES, TABLE_IN_PROGRESS, TABLE_RECORDS, TAKEOVERS,
};

use crate::{store::TableSize, ErrorKind, OutcomeKind, StoreErrorKind};
use std::{fmt, sync::Arc, time::Duration};

/// Receives the engine's events. See the [module docs](self).
pub trait Observer: Send + Sync + fmt::Debug + 'static {
    /// Called once for each event, on the task that met it.
    fn observe(&self, event: &Event);
}

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// An attempt was answered: by its outcome, or by an error.
    Answered {
        /// The port the attempt came through.
        port: Port,
        /// How it was answered.
        answer: Answer,
        /// From the attempt's start to its answer, the operation's run
        /// included.
        elapsed: Duration,
    },
    /// A claim whose lease had passed was taken over: the attempt before it
    /// may have acted. `attempt` is the new claim's number (2 for the first
    /// takeover).
    TookOver {
        /// The new claim's attempt number.
        attempt: u32,
    },
    /// An attempt found its key claimed by a run in progress (elsewhere, or
    /// in this process).
    FoundInProgress {
        /// How long ago the claim it found was first made.
        age: Duration,
    },
    /// Concurrent claims of one key conflicted in the store, and the claim
    /// was tried again.
    ConflictRetried,
    /// The engine called its store: which call, how long it took (the
    /// store's own retries included), and the kind of error it failed
    /// with, if it did (a refused condition is not a failure: the call
    /// answered). The calls a run inside a store transaction makes
    /// through the transaction are not among them.
    StoreCalled {
        /// Which call.
        operation: StoreOperation,
        /// From the call to its answer.
        elapsed: Duration,
        /// The error's kind, when the call failed.
        failed: Option<StoreErrorKind>,
    },
    /// The store said how many records it holds, when asked
    /// ([`Engine::sample_table_size`](crate::Engine::sample_table_size)):
    /// a gauge's sample. A store with no cheap count reports nothing.
    TableSized {
        /// The store, as its [`Store::DB_SYSTEM`](crate::store::Store::DB_SYSTEM)
        /// names it (`aws.dynamodb`, `postgresql`, `mysql`, `redis`,
        /// `memory`).
        store: &'static str,
        /// What it answered.
        size: TableSize,
    },
}

/// A call the engine makes to its store ([`Store`](crate::store::Store)'s
/// methods).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreOperation {
    /// A claim of a new key.
    Claim,
    /// The takeover of a lapsed claim.
    TakeOver,
    /// A lease extended (the heartbeat), or shortened.
    Extend,
    /// A completion.
    Complete,
    /// A claim released.
    Release,
    /// A single write's commit.
    Commit,
    /// A consistent read.
    Get,
    /// A read before the claim, possibly eventually consistent.
    Peek,
    /// An operator's removal.
    Remove,
    /// An operator's listing of claims in progress.
    ListInProgress,
    /// A page of abandoned claims listed, for the completer.
    ListAbandoned,
    /// The store's count of what it holds (the table-size gauge).
    TableSize,
    /// A step's output recorded (recovery points,
    /// [`ClaimHandle::step`](crate::ClaimHandle::step)).
    RecordStep,
    /// The recorded steps read, by a takeover's first step.
    Steps,
}

impl StoreOperation {
    /// The name of the call's span: `idempotency` and the operation's.
    pub(crate) fn span_name(self) -> &'static str {
        match self {
            StoreOperation::Claim => "idempotency claim",
            StoreOperation::TakeOver => "idempotency take_over",
            StoreOperation::Extend => "idempotency extend",
            StoreOperation::Complete => "idempotency complete",
            StoreOperation::Release => "idempotency release",
            StoreOperation::Commit => "idempotency commit",
            StoreOperation::Get => "idempotency get",
            StoreOperation::Peek => "idempotency peek",
            StoreOperation::Remove => "idempotency remove",
            StoreOperation::ListInProgress => "idempotency list_in_progress",
            StoreOperation::ListAbandoned => "idempotency list_abandoned",
            StoreOperation::TableSize => "idempotency table_size",
            StoreOperation::RecordStep => "idempotency record_step",
            StoreOperation::Steps => "idempotency steps",
        }
    }

    /// A stable snake_case name, for a metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreOperation::Claim => "claim",
            StoreOperation::TakeOver => "take_over",
            StoreOperation::Extend => "extend",
            StoreOperation::Complete => "complete",
            StoreOperation::Release => "release",
            StoreOperation::Commit => "commit",
            StoreOperation::Get => "get",
            StoreOperation::Peek => "peek",
            StoreOperation::Remove => "remove",
            StoreOperation::ListInProgress => "list_in_progress",
            StoreOperation::ListAbandoned => "list_abandoned",
            StoreOperation::TableSize => "table_size",
            StoreOperation::RecordStep => "record_step",
            StoreOperation::Steps => "steps",
        }
    }
}

/// How an attempt was answered: an outcome, or an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Answer {
    /// The operation's value: run now, replayed, or run unprotected.
    Outcome(OutcomeKind),
    /// An error: in progress, a key reused, a store error, the operation's
    /// own failure (its claim released).
    Error(ErrorKind),
}

impl Answer {
    /// A stable snake_case name, for a metric's label: the outcome's or the
    /// error's own ([`OutcomeKind::as_str`], [`ErrorKind::as_str`]).
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Outcome(kind) => kind.as_str(),
            Answer::Error(kind) => kind.as_str(),
        }
    }

    /// Whether a stored outcome answered it (from the store or the cache):
    /// a deduplicated request.
    pub fn is_replay(self) -> bool {
        matches!(
            self,
            Answer::Outcome(OutcomeKind::Replay | OutcomeKind::CachedReplay)
        )
    }
}

/// The port an attempt came through, as its [`Attempt::port`](crate::Attempt::port)
/// says ([`Port::Engine`] unless an adapter set it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Port {
    /// The engine called directly ([`Engine::execute`](crate::Engine::execute) and its kin).
    Engine,
    /// The HTTP layer (lambda_http, axum, hyper, actix-web), for a request
    /// that is not gRPC.
    Http,
    /// The HTTP layer, for a gRPC call.
    Grpc,
    /// The consumers' event layer: one event a Lambda invocation.
    Event,
    /// The consumers' batches: one record of a queue's, stream's or
    /// broker's batch.
    Batch,
    /// A durable execution ([`split`](crate::split)), claimed in one
    /// invocation and answered when it completes in a later one (its
    /// `elapsed`: the answering call's own time).
    Durable,
    /// A durable function's step (the durable crate's `idempotent_step`).
    DurableStep,
    /// An adapter of your own, by a name of its own (keep it one of a few).
    Other(&'static str),
}

impl Port {
    /// A stable snake_case name, for a metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            Port::Engine => "engine",
            Port::Http => "http",
            Port::Grpc => "grpc",
            Port::Event => "event",
            Port::Batch => "batch",
            Port::Durable => "durable",
            Port::DurableStep => "durable_step",
            Port::Other(name) => name,
        }
    }
}

/// The label of a takeover's attempt number: `2` to `5`, then `6+`, so
/// that a key taken over again and again adds no label value.
pub(crate) fn attempt_label(attempt: u32) -> &'static str {
    match attempt {
        0..=2 => "2",
        3 => "3",
        4 => "4",
        5 => "5",
        _ => "6+",
    }
}

/// The engine's observers: none (the default) costs a branch an event.
#[derive(Debug, Clone, Default)]
pub(crate) struct Observers(Vec<Arc<dyn Observer>>);

impl Observers {
    pub(crate) fn add(&mut self, observer: Arc<dyn Observer>) {
        self.0.push(observer);
    }

    /// Whether any observer listens: an event nobody observes is never
    /// made (nor its time measured).
    pub(crate) fn any(&self) -> bool {
        !self.0.is_empty()
    }

    /// Tells every observer, in the order they were added. One that
    /// panics is logged and passed over: an exporter's bug must not fail
    /// the request it observes, nor stop the protocol halfway (a takeover
    /// is told between its claim and its run).
    pub(crate) fn tell(&self, event: Event) {
        for observer in &self.0 {
            let told =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| observer.observe(&event)));
            if let Err(panic) = told {
                tracing::error!(
                    observer = ?observer,
                    panic = crate::engine::panic_message(panic.as_ref()),
                    "an observer panicked; the request goes on without it"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_outcomes_and_errors_own() {
        assert_eq!(
            Answer::Outcome(OutcomeKind::CachedReplay).as_str(),
            "cached_replay"
        );
        assert_eq!(Answer::Error(ErrorKind::KeyReused).as_str(), "key_reused");
        assert!(Answer::Outcome(OutcomeKind::CachedReplay).is_replay());
        assert!(!Answer::Outcome(OutcomeKind::Fresh).is_replay());
        assert_eq!(Port::Other("sns_fanout").as_str(), "sns_fanout");
    }
}
