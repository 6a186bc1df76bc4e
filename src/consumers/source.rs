//! [`Source`]: what a [`Batch`](super::Batch) needs to know about one kind
//! of Lambda event: its records, their identities, their order, and how
//! the function tells Lambda which ones to deliver again.

use super::BatchFailed;
use crate::Fingerprint;

/// One kind of at-least-once Lambda event, as a [`Batch`](super::Batch)
/// processes it.
///
/// The crate implements it for every such source Lambda has: [`Sqs`](super::Sqs),
/// [`Kinesis`](super::Kinesis), [`DynamoDbStream`](super::DynamoDbStream),
/// [`Kafka`](super::Kafka), [`RabbitMq`](super::RabbitMq),
/// [`ActiveMq`](super::ActiveMq), [`Sns`](super::Sns) and
/// [`EventBridge`](super::EventBridge). Implement it for another event
/// type (a custom queue poller, a test harness) to get the same
/// processing: per-record idempotency, order within a group, and a report
/// of what must be delivered again.
pub trait Source: 'static {
    /// The event Lambda delivers (`SqsEvent`, `KinesisEvent`, …).
    type Event;
    /// One record of it, as the handler receives it.
    type Record: Send;
    /// What the function returns to Lambda when the invocation succeeds: a
    /// partial batch response, or `()` for a source that takes none (there
    /// a record that did not complete fails the invocation instead).
    type Output;

    /// The source's name in log lines and errors.
    const NAME: &'static str;

    /// What [`default_key`](Source::default_key) is made of, named in the
    /// log line of a record that lacks it.
    const DEFAULT_KEY: &'static str;

    /// The event's records in delivery order, each with the ordered group
    /// it belongs to, if any.
    fn deliveries(event: Self::Event) -> Vec<Delivery<Self::Record>>;

    /// What the response names the record by (a message id, a sequence
    /// number, `topic/partition/offset`); `None` when the record lacks it.
    fn id(record: &Self::Record) -> Option<String>;

    /// The record's idempotency key when no key closure is set: a stable
    /// identity of the delivery, the same on every redelivery of it.
    /// `None` when the record lacks the fields it needs.
    fn default_key(record: &Self::Record) -> Option<String>;

    /// The record's fingerprint when no fingerprint closure is set: the
    /// payload that must match for a duplicate to be a replay. It must be
    /// what a business key identifies (the body, the data, the image, the
    /// attributes the sender set), never what the source adds to each
    /// delivery (receive counts, arrival times, sequence numbers, offsets):
    /// with a business key a second delivery carries other metadata, and a
    /// fingerprint that covered it would refuse the duplicate as "key
    /// reused with another payload" on every retry.
    fn default_fingerprint(record: &Self::Record) -> Result<Fingerprint, String>;

    /// The response that tells Lambda what to deliver again, or the error
    /// that fails the invocation so that Lambda delivers the batch again.
    fn respond(report: Report) -> Result<Self::Output, BatchFailed>;
}

/// One record of an event, and the ordered group it belongs to.
#[derive(Debug, Clone)]
pub struct Delivery<R> {
    pub(crate) record: R,
    pub(crate) group: Option<String>,
}

impl<R> Delivery<R> {
    /// A record that may run beside the batch's other records (a standard
    /// SQS queue, SNS).
    pub fn unordered(record: R) -> Self {
        Self {
            record,
            group: None,
        }
    }

    /// A record of an ordered group (a shard, a partition, a queue, a FIFO
    /// message group): the group's records run one after another in
    /// delivery order, and the group stops at its first record that does
    /// not complete; the ones after it are held back.
    pub fn in_order(group: impl Into<String>, record: R) -> Self {
        Self {
            record,
            group: Some(group.into()),
        }
    }
}

/// How one record of a batch went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordStatus {
    /// The handler ran and completed.
    Ran,
    /// A duplicate: the stored result of an earlier run answered it.
    Replayed,
    /// Not completed: the handler failed, the key is in progress elsewhere
    /// or was used with another payload, the record has no key, or the
    /// store is unavailable. Deliver it again.
    Failed,
    /// Not attempted: an earlier record of its ordered group did not
    /// complete. Deliver it again, after that one.
    HeldBack,
    /// Not processed, and never will be as it is (its key was used with
    /// another payload, it has no key, it cannot be fingerprinted), and the
    /// batch gives it up ([`Unprocessable::Final`](super::Unprocessable::Final)):
    /// done, not delivered again.
    GivenUp,
}

impl RecordStatus {
    /// Whether the record is done: ran, replayed, or given up as final.
    pub fn is_done(self) -> bool {
        matches!(
            self,
            RecordStatus::Ran | RecordStatus::Replayed | RecordStatus::GivenUp
        )
    }
}

/// What became of each record of a batch, in delivery order: what
/// [`Source::respond`] builds the response from.
#[derive(Debug, Clone)]
pub struct Report {
    pub(crate) source: &'static str,
    pub(crate) records: Vec<Reported>,
}

/// One record of a [`Report`].
#[derive(Debug, Clone)]
pub(crate) struct Reported {
    pub(crate) id: Option<String>,
    /// The ordered group it was delivered in (a Kafka `topic-partition`).
    pub(crate) group: Option<String>,
    pub(crate) status: RecordStatus,
}

impl Report {
    /// Each record's id (see [`Source::id`]) and status, in delivery
    /// order.
    pub fn records(&self) -> impl Iterator<Item = (Option<&str>, RecordStatus)> {
        self.records
            .iter()
            .map(|record| (record.id.as_deref(), record.status))
    }

    /// The ids of the records that did not complete, failed or held back,
    /// in delivery order; `""` for a record without an id, which makes
    /// Lambda deliver the whole batch again.
    pub fn not_done(&self) -> impl Iterator<Item = String> + '_ {
        self.records
            .iter()
            .filter(|record| !record.status.is_done())
            .map(|record| record.id.clone().unwrap_or_default())
    }

    /// The ids of the records that failed, without the ones held back
    /// behind them: for stream sources, where Lambda resumes a shard from
    /// the lowest reported sequence number. `""` for a record without an
    /// id, which makes Lambda deliver the whole batch again.
    pub fn failed(&self) -> impl Iterator<Item = String> + '_ {
        self.records
            .iter()
            .filter(|record| record.status == RecordStatus::Failed)
            .map(|record| record.id.clone().unwrap_or_default())
    }

    /// Logs what became of the batch's `total` records, by status.
    pub(crate) fn log(&self, total: usize) {
        tracing::info!(
            source = self.source,
            records = total,
            ran = self.count(RecordStatus::Ran),
            replayed = self.count(RecordStatus::Replayed),
            failed = self.count(RecordStatus::Failed),
            held_back = self.count(RecordStatus::HeldBack),
            given_up = self.count(RecordStatus::GivenUp),
            "batch processed"
        );
    }

    /// Whether every record ran, replayed, or was given up as final.
    pub fn is_complete(&self) -> bool {
        self.records.iter().all(|record| record.status.is_done())
    }

    /// Whether no record is done: each failed or was held back.
    pub fn is_entire_failure(&self) -> bool {
        self.records.iter().all(|record| !record.status.is_done())
    }

    /// How many records had `status`.
    pub fn count(&self, status: RecordStatus) -> usize {
        self.records
            .iter()
            .filter(|record| record.status == status)
            .count()
    }

    /// The report as the error that fails the invocation, when a record
    /// did not complete: for sources whose event source mapping does not take
    /// a partial batch response.
    pub fn into_result(self) -> Result<(), BatchFailed> {
        if self.is_complete() {
            Ok(())
        } else {
            Err(BatchFailed::new(self))
        }
    }
}
