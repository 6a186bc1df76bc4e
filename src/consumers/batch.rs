//! [`Batch`]: idempotent processing of the records of any at-least-once
//! event source, with each source's own retry semantics.

use super::{
    source::Reported, unprocessable::Reason, BatchFailed, Delivery, RecordStatus, Report, Source,
    Unprocessable,
};
use crate::{
    engine::panic_message, store::Store, Attempt, EmfMetrics, Engine, Error, Fingerprint,
    JsonRedaction, Mode, Outcome, OutcomeKind, RedactedJson,
};
use futures_util::{stream, FutureExt, StreamExt};
use lambda_runtime::LambdaEvent;
use serde::{de::DeserializeOwned, Serialize};
use std::{
    collections::HashMap,
    fmt::{self, Display},
    future::Future,
    marker::PhantomData,
    panic::AssertUnwindSafe,
    sync::Arc,
};

type KeyFn<R> = Arc<dyn Fn(&R) -> Option<String> + Send + Sync>;
type FingerprintFn<R> = Arc<dyn Fn(&R) -> Result<Fingerprint, String> + Send + Sync>;
#[cfg(feature = "powertools")]
type ViewFn<R> = Arc<dyn Fn(&R) -> Option<serde_json::Value> + Send + Sync>;

/// The default number of records (or ordered groups) processed at once.
pub const DEFAULT_CONCURRENCY: usize = 8;

/// Processes the records of a batch from source `Src` idempotently, and
/// tells Lambda which ones to deliver again in the way `Src` understands.
///
/// Use it through its per-source names: [`SqsBatch`](super::SqsBatch),
/// [`KinesisBatch`](super::KinesisBatch),
/// [`DynamoDbStreamBatch`](super::DynamoDbStreamBatch),
/// [`KafkaBatch`](super::KafkaBatch), [`RabbitMqBatch`](super::RabbitMqBatch),
/// [`ActiveMqBatch`](super::ActiveMqBatch), [`SnsBatch`](super::SnsBatch) and
/// [`EventBridgeBatch`](super::EventBridgeBatch); each one's docs say how
/// that source orders and retries.
///
/// Each record runs at most once per key: a duplicate inside the batch, a
/// redelivery, or (with a business key) a producer's second send replays
/// instead. A record does not complete when its handler fails, when its key
/// is in progress in another invocation or was used with another payload,
/// when it has no key, or when the store is unavailable.
///
/// Records of an ordered group (a shard, a partition, a broker queue, a
/// FIFO message group) run one after another in delivery order, and the
/// group stops at its first record that does not complete: the ones after
/// it are held back, to be delivered again after it. Ordered groups run
/// side by side, up to [`concurrency`](Batch::concurrency) at once.
/// Unordered records (standard SQS queues, SNS) run concurrently, except
/// that records sharing a key run one after another, so that a duplicate
/// inside the batch replays its twin's result.
///
/// Bad records never panic and are never dropped silently: a record
/// without the fields its key needs, whose fingerprint cannot be computed,
/// or whose key was used with another payload, fails with a log line that
/// names it (or, with [`Unprocessable::Final`], is given up with an ERROR
/// line and a metric, and not delivered again), and a handler that cannot parse the
/// record's body returns an error, which fails that record. A handler (or
/// key or fingerprint closure) that panics fails only its own record, as an
/// error would, with the panic's message logged: the records running beside
/// it finish, and the batch still answers.
///
/// **Never wrap a batch handler in an
/// [`IdempotentEventLayer`](super::IdempotentEventLayer)**: the layer would
/// store the batch's response, and replay a partial-failure response to the
/// retry of that batch, so the failed records would never run again.
pub struct Batch<Src: Source, St> {
    engine: Engine<St>,
    scope: Arc<str>,
    key: KeyFn<Src::Record>,
    /// Whether [`key`](Batch::key) replaced the source's default key.
    key_set: bool,
    fingerprint: FingerprintFn<Src::Record>,
    concurrency: usize,
    single_write: bool,
    fail_on_entire_batch_failure: bool,
    unprocessable: Unprocessable,
    metrics: Option<EmfMetrics>,
    /// How each record's result is stored: as JSON, with what the user's
    /// redaction takes out.
    codec: RedactedJson,
    /// Set only on a batch whose store has transactions
    /// ([`Batch::in_transaction`]).
    in_transaction: Option<crate::store::TransactionLimits>,
    /// Whether the store was told the transactions this batch may hold
    /// open (once, at the first batch, with its settings final).
    store_told: Arc<std::sync::Once>,
    #[cfg(feature = "powertools")]
    powertools: Option<(
        Arc<crate::powertools::PowertoolsCompat>,
        ViewFn<Src::Record>,
    )>,
    source: PhantomData<fn() -> Src>,
}

impl<Src: Source, St> Clone for Batch<Src, St> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            scope: Arc::clone(&self.scope),
            key: Arc::clone(&self.key),
            key_set: self.key_set,
            fingerprint: Arc::clone(&self.fingerprint),
            concurrency: self.concurrency,
            single_write: self.single_write,
            fail_on_entire_batch_failure: self.fail_on_entire_batch_failure,
            unprocessable: self.unprocessable,
            metrics: self.metrics.clone(),
            codec: self.codec.clone(),
            in_transaction: self.in_transaction,
            store_told: Arc::clone(&self.store_told),
            #[cfg(feature = "powertools")]
            powertools: self.powertools.clone(),
            source: PhantomData,
        }
    }
}

impl<Src: Source, St: fmt::Debug> fmt::Debug for Batch<Src, St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Batch")
            .field("source", &Src::NAME)
            .field("engine", &self.engine)
            .field("scope", &self.scope)
            .field("concurrency", &self.concurrency)
            .field("single_write", &self.single_write)
            .field(
                "fail_on_entire_batch_failure",
                &self.fail_on_entire_batch_failure,
            )
            .field("unprocessable", &self.unprocessable)
            .finish_non_exhaustive()
    }
}

impl<Src: Source, St: crate::store::TransactionalStore> Batch<Src, St> {
    /// Runs each record's handler inside the store transaction that claims
    /// its key and completes its record ([`Engine::run_in_transaction`];
    /// PostgreSQL's): the handler takes the transaction from its store's
    /// `current()` (PostgreSQL's
    /// [`PgTransaction::current`](https://docs.rs/lambda-idempotency/latest/lambda_idempotency/store/postgres/struct.PgTransaction.html#method.current))
    /// and reads, locks and writes in it; its result completes the record in
    /// that same transaction. A handler error, a panic or a crash rolls back
    /// its writes and its claim: the record fails and is delivered again, as
    /// a first attempt. A duplicate being handled elsewhere waits at most
    /// `limits`' claim wait, then counts as in progress (failed, delivered
    /// again); a handler past the time limit is rolled back and fails.
    ///
    /// Each record being handled holds one of the pool's connections until
    /// its commit: up to [`concurrency`](Batch::concurrency) of them per
    /// invocation, times the invocations served at once under Lambda
    /// Managed Instances (`AWS_LAMBDA_MAX_CONCURRENCY`). A warning is
    /// logged, once, at the first batch, when the pool is smaller.
    pub fn in_transaction(mut self, limits: crate::store::TransactionLimits) -> Self {
        self.in_transaction = Some(limits);
        self
    }
}

impl<Src: Source, St: Store> Batch<Src, St> {
    /// A batch processor over `engine`, whose keys live in `scope` (name the
    /// queue, stream or topic and the consumer: keys of different sources
    /// must not meet). The key and the fingerprint are the source's
    /// defaults (see each source) until set.
    pub fn new(engine: Engine<St>, scope: impl Into<Arc<str>>) -> Self {
        Self {
            engine,
            scope: scope.into(),
            key: Arc::new(Src::default_key),
            key_set: false,
            fingerprint: Arc::new(Src::default_fingerprint),
            concurrency: DEFAULT_CONCURRENCY,
            single_write: false,
            fail_on_entire_batch_failure: false,
            unprocessable: Unprocessable::default(),
            metrics: None,
            codec: RedactedJson::default(),
            in_transaction: None,
            store_told: Arc::new(std::sync::Once::new()),
            #[cfg(feature = "powertools")]
            powertools: None,
            source: PhantomData,
        }
    }

    /// Commits each record of
    /// [`process_transactional`](Batch::process_transactional) in **one**
    /// store write, without a claim before it (see
    /// [`Engine::run_single_write`](crate::Engine::run_single_write)): one
    /// DynamoDB call per new record instead of two.
    ///
    /// **Only for handlers whose sole effect is the writes they return.** A
    /// duplicate record (a redelivery, a producer's second send) runs the
    /// handler again before it is answered with the replay, and duplicates
    /// processed at once may each run it; one commits. A record still in
    /// progress under a claim elsewhere does not complete, as without it.
    ///
    /// Only stores whose [`Store::SINGLE_WRITE`] is `true` have it: with
    /// another store this does not compile.
    pub fn single_write(mut self) -> Self {
        const {
            assert!(
                St::SINGLE_WRITE,
                "this store cannot commit in a single write: leave single_write out"
            )
        };
        self.single_write = true;
        self
    }

    /// The idempotency key of a record. The source's default (a message id,
    /// a sequence number, `topic/partition/offset`) catches redeliveries of
    /// one record; a business key taken from the payload (an order id) also
    /// catches a producer that sends twice. `None` fails the record.
    pub fn key(
        mut self,
        key: impl Fn(&Src::Record) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = Arc::new(key);
        self.key_set = true;
        self
    }

    /// The part of a record that must match for a duplicate to be a replay
    /// (the source's default: its payload).
    pub fn fingerprint(
        mut self,
        fingerprint: impl Fn(&Src::Record) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        self.fingerprint = Arc::new(move |record| Ok(fingerprint(record)));
        self
    }

    /// How many unordered records or ordered groups are processed at once
    /// (default 8, at least 1). Records of one ordered group never run side
    /// by side.
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Fails the invocation ([`BatchFailed`]) when no record of the batch
    /// completed (each failed or was held back), instead of answering with
    /// a partial batch response that names every record; Powertools calls
    /// it `raise_on_entire_batch_failure`. Off by default.
    ///
    /// A partial response that names every record is, to Lambda, a
    /// successful invocation: a downstream outage that fails every record
    /// shows in no `Errors` metric or alarm, and Lambda's handling of
    /// function errors (its retry back-off, the event source mapping's
    /// reaction to a failing function) never starts, while each SQS
    /// message burns a receive towards its dead-letter queue. A failed
    /// invocation is retried the same way (the whole batch comes again, and
    /// the records that completed elsewhere replay).
    pub fn fail_on_entire_batch_failure(mut self) -> Self {
        self.fail_on_entire_batch_failure = true;
        self
    }

    /// What becomes of a record that cannot be processed as it is, however
    /// often it comes (its key used with another payload, no key, no
    /// fingerprint): delivered again ([`Unprocessable::Redeliver`], the
    /// default, as Powertools does) or given up as final
    /// ([`Unprocessable::Final`]: an ERROR line and a metric, not delivered
    /// again, its FIFO group or shard goes on). See [`Unprocessable`] for
    /// which to choose.
    pub fn unprocessable(mut self, unprocessable: Unprocessable) -> Self {
        self.unprocessable = unprocessable;
        self
    }

    /// Writes a CloudWatch Embedded Metric Format count for every record
    /// given up as final ([`Unprocessable::Final`]): `UnprocessableRecords`,
    /// with the dimension `Reason` (`key_reused`, `key_missing`,
    /// `unreadable`).
    pub fn metrics(mut self, metrics: EmfMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Stores each record's result without the JSON fields `redaction`
    /// names (removed, or replaced): the handler's value is what the batch
    /// sees, the record keeps the redacted one, and it must still read as
    /// the handler's type ([`RedactedJson`]). For what a handler returns
    /// that must never sit in the table (a token, a card number).
    pub fn redact_json(mut self, redaction: JsonRedaction) -> Self {
        self.codec = RedactedJson(redaction);
        self
    }

    /// A record that cannot be processed as it is: failed, or given up.
    fn unprocessable_record(&self, record_id: &str, reason: Reason) -> RecordStatus {
        let source = Src::NAME;
        match self.unprocessable {
            Unprocessable::Redeliver => RecordStatus::Failed,
            Unprocessable::Final => {
                tracing::error!(
                    source,
                    record_id,
                    reason = reason.as_str(),
                    outcome = "unprocessable_final",
                    "record cannot be processed as it is, and never will be: given up \
                     (Unprocessable::Final), reported as done, not delivered again"
                );
                if let Some(metrics) = &self.metrics {
                    metrics.count("UnprocessableRecords", "Reason", reason.as_str());
                }
                RecordStatus::GivenUp
            }
        }
    }

    /// Powertools compatibility, for a migration window: before claiming a
    /// record, read the record Powertools (`idempotent_function` on the
    /// record, keyed by its `event_key_jmespath`, such as `messageId`)
    /// wrote for it. A completed one counts as done and its handler does
    /// not run; one in progress fails the record (delivered again later).
    /// The expression reads the record as `aws_lambda_events` serialises
    /// it. Skipped for a key the local cache answers. See
    /// [`crate::powertools`].
    #[cfg(feature = "powertools")]
    #[cfg_attr(docsrs, doc(cfg(feature = "powertools")))]
    pub fn powertools(mut self, compat: crate::powertools::PowertoolsCompat) -> Self
    where
        Src::Record: Serialize,
    {
        let view: ViewFn<Src::Record> = Arc::new(|record| serde_json::to_value(record).ok());
        self.powertools = Some((Arc::new(compat), view));
        self
    }

    /// The status Powertools' record decides for a record (`Err`), or that
    /// the record runs (`Ok`), as the takeover of an abandoned Powertools
    /// record if it found one.
    #[cfg(feature = "powertools")]
    async fn powertools_status(
        &self,
        record: &Src::Record,
        key: &str,
        record_id: &str,
    ) -> Result<Option<crate::Takeover>, RecordStatus> {
        use crate::powertools::PowertoolsFound;
        let Some((compat, view)) = self.powertools.as_ref() else {
            return Ok(None);
        };
        if self.engine.skips_powertools(&self.scope, Some(key)) {
            return Ok(None);
        }
        let source = Src::NAME;
        let Some(view) = view(record) else {
            tracing::error!(
                source,
                record_id,
                "record cannot be read as JSON for the Powertools check; reported for redelivery"
            );
            return Err(RecordStatus::Failed);
        };
        match compat.check(&view).await {
            Ok(None) => Ok(None),
            Ok(Some(PowertoolsFound::Abandoned { takeover })) => {
                tracing::warn!(
                    source,
                    record_id,
                    outcome = "powertools_abandoned",
                    "abandoned in progress under Powertools: runs as its takeover"
                );
                Ok(Some(takeover))
            }
            Ok(Some(PowertoolsFound::Completed { .. })) => {
                tracing::debug!(source, record_id, "completed by Powertools: not run again");
                Err(RecordStatus::Replayed)
            }
            Ok(Some(PowertoolsFound::InProgress { .. })) => {
                tracing::warn!(
                    source,
                    record_id,
                    outcome = "in_progress",
                    "in progress under Powertools; reported for redelivery"
                );
                Err(RecordStatus::Failed)
            }
            Err(Error::KeyReused) => {
                tracing::warn!(
                    source,
                    record_id,
                    outcome = "key_reused",
                    "Powertools' record of this key has another payload; not processed"
                );
                Err(self.unprocessable_record(record_id, Reason::KeyReused))
            }
            Err(error) => {
                tracing::warn!(source, record_id, outcome = error.kind().as_str(), %error, "Powertools record check failed; reported for redelivery");
                Err(RecordStatus::Failed)
            }
        }
    }

    /// Processes every record with `handler`, and returns what tells Lambda
    /// which records to deliver again: the partial batch response, or a
    /// [`BatchFailed`] to return from the function handler with `?`, so
    /// that the invocation fails and Lambda delivers the batch again.
    ///
    /// The handler's `Ok` value is stored with the record and replayed to
    /// duplicates; an `Err` (or a panic) fails the record (it runs again
    /// when delivered again).
    pub async fn process<T, E, F, Fut>(
        &self,
        event: LambdaEvent<Src::Event>,
        handler: F,
    ) -> Result<Src::Output, BatchFailed>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: Fn(Src::Record) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let handler = |record| {
            let run = handler(record);
            async move { run.await.map(|value| (value, Vec::new())) }
        };
        self.respond(self.run(event, Mode::Plain, handler).await)
    }

    /// Like [`process`](Batch::process), but each record's handler also
    /// returns writes (for DynamoDB, `TransactWriteItem`s)
    /// committed in one transaction with the record's completion: the effect
    /// and the idempotency record appear together or not at all, so a crash
    /// between them cannot make a redelivery repeat the effect.
    pub async fn process_transactional<T, E, F, Fut>(
        &self,
        event: LambdaEvent<Src::Event>,
        handler: F,
    ) -> Result<Src::Output, BatchFailed>
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: Fn(Src::Record) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        self.respond(self.run(event, Mode::Transactional, handler).await)
    }

    fn respond(&self, report: Report) -> Result<Src::Output, BatchFailed> {
        if self.fail_on_entire_batch_failure && report.is_entire_failure() {
            tracing::error!(
                source = Src::NAME,
                records = report.records.len(),
                "no record of the batch completed: the invocation fails"
            );
            return Err(BatchFailed::new(report));
        }
        Src::respond(report)
    }

    async fn run<T, E, F, Fut>(
        &self,
        event: LambdaEvent<Src::Event>,
        mode: Mode,
        handler: F,
    ) -> Report
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: Fn(Src::Record) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        if self.in_transaction.is_some() {
            self.store_told.call_once(|| {
                if let Some(transactions) = self.engine.store().transactions() {
                    let at_once = crate::engine::transactions_at_once(self.concurrency);
                    transactions.expect_open_at_once(at_once);
                }
            });
        }
        let deadline_ms = event.context.deadline;
        let deliveries = Src::deliveries(event.payload);
        let total = deliveries.len();
        if total == 0 {
            return not_of_this_source::<Src>();
        }
        let prepared: Vec<Prepared<Src::Record>> = deliveries
            .into_iter()
            .enumerate()
            .map(|(position, delivery)| self.prepare(position, delivery))
            .collect();
        let groups = group(prepared);
        let handler = &handler;
        let mut statuses: Vec<(usize, Reported)> = stream::iter(groups)
            .map(|group| async move {
                let ordered = group.ordered;
                let mut statuses = Vec::with_capacity(group.records.len());
                let mut records = group.records.into_iter();
                for record in records.by_ref() {
                    let position = record.position;
                    let (id, group) = (record.id.clone(), record.group.clone());
                    // Around the whole record, claim included: the engine has
                    // released the claim before the unwind gets here, and the
                    // records beside this one must finish, not be dropped
                    // mid-run with their claims held.
                    let status = AssertUnwindSafe(self.record(record, deadline_ms, mode, handler))
                        .catch_unwind()
                        .await
                        .unwrap_or_else(|panic| {
                            tracing::error!(
                                source = Src::NAME,
                                record_id = id.as_deref().unwrap_or("(no id)"),
                                panic = panic_message(&*panic),
                                "record panicked; reported for redelivery"
                            );
                            RecordStatus::Failed
                        });
                    statuses.push((position, Reported { id, group, status }));
                    if ordered && !status.is_done() {
                        break;
                    }
                }
                statuses.extend(records.map(|held| {
                    let status = RecordStatus::HeldBack;
                    let (id, group) = (held.id, held.group);
                    (held.position, Reported { id, group, status })
                }));
                statuses
            })
            .buffer_unordered(self.concurrency)
            .flat_map(stream::iter)
            .collect()
            .await;
        statuses.sort_by_key(|(position, _)| *position);
        let report = Report {
            source: Src::NAME,
            records: statuses.into_iter().map(|(_, record)| record).collect(),
        };
        report.log(total);
        report
    }

    fn prepare(&self, position: usize, delivery: Delivery<Src::Record>) -> Prepared<Src::Record> {
        let record = delivery.record;
        let id = Src::id(&record);
        let key = std::panic::catch_unwind(AssertUnwindSafe(|| (self.key)(&record)))
            .unwrap_or_else(|panic| {
                tracing::error!(
                    source = Src::NAME,
                    record_id = id.as_deref().unwrap_or("(no id)"),
                    panic = panic_message(&*panic),
                    "the key closure panicked on this record"
                );
                None
            })
            .filter(|key| !key.is_empty());
        Prepared {
            position,
            id,
            key,
            group: delivery.group,
            record,
        }
    }

    async fn record<T, E, F, Fut>(
        &self,
        prepared: Prepared<Src::Record>,
        deadline_ms: u64,
        mode: Mode,
        handler: &F,
    ) -> RecordStatus
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: Fn(Src::Record) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let record_id = prepared.id.as_deref().unwrap_or("(no id)");
        let found = self.key_and_fingerprint(prepared.key, &prepared.record, record_id);
        let (key, fingerprint) = match found {
            Ok(found) => found,
            Err(status) => return status,
        };
        #[cfg(feature = "powertools")]
        let takeover = match self
            .powertools_status(&prepared.record, &key, record_id)
            .await
        {
            Ok(takeover) => takeover,
            Err(status) => return status,
        };
        let attempt = Attempt::new(&self.scope, &key, fingerprint)
            .deadline_ms(deadline_ms)
            .port(crate::observe::Port::Batch);
        #[cfg(feature = "powertools")]
        let attempt = match takeover {
            Some(takeover) => attempt.taking_over(takeover),
            None => attempt,
        };
        let record = prepared.record;
        let operation = |_| handler(record);
        // Awaited here, not in a helper, so that the handler's future
        // nests no deeper under the batch's.
        if let Some(limits) = self.in_transaction {
            let no_refusals = |_: &crate::WriteRefusal| None;
            let result = self
                .engine
                .transaction_run(&attempt, limits, &self.codec, no_refusals, operation)
                .await;
            return self.status_of(result, record_id);
        }
        let result = if mode == Mode::Transactional && self.single_write {
            self.engine
                .single_write(&attempt, &self.codec, operation)
                .await
        } else {
            self.engine
                .run(&attempt, mode, &self.codec, operation)
                .await
        };
        self.status_of(result, record_id)
    }

    /// The record's key and payload fingerprint, or why it is not processed
    /// (logged): no key, or a payload that cannot be fingerprinted.
    fn key_and_fingerprint(
        &self,
        key: Option<String>,
        record: &Src::Record,
        record_id: &str,
    ) -> Result<(String, Fingerprint), RecordStatus> {
        let source = Src::NAME;
        let Some(key) = key else {
            // The key the record lacks: the closure's, when one was given.
            let key_from = if self.key_set {
                "the key closure (Batch::key)"
            } else {
                Src::DEFAULT_KEY
            };
            tracing::error!(
                source,
                record_id,
                key_from,
                "record has no idempotency key: {key_from} found none in it; not processed"
            );
            return Err(self.unprocessable_record(record_id, Reason::KeyMissing));
        };
        match (self.fingerprint)(record) {
            Ok(fingerprint) => Ok((key, fingerprint)),
            Err(error) => {
                tracing::error!(
                    source,
                    record_id,
                    %error,
                    "record cannot be fingerprinted; not processed"
                );
                Err(self.unprocessable_record(record_id, Reason::Unreadable))
            }
        }
    }

    /// What the record's run came to, logged.
    fn status_of<T, E: Display>(
        &self,
        result: Result<Outcome<T>, Error<E>>,
        record_id: &str,
    ) -> RecordStatus {
        let source = Src::NAME;
        match result {
            Ok(outcome) if outcome.is_replay() => RecordStatus::Replayed,
            Ok(outcome) => {
                if outcome.kind() != OutcomeKind::Fresh {
                    tracing::warn!(
                        source,
                        record_id,
                        outcome = outcome.kind().as_str(),
                        "record ran but its outcome is not stored"
                    );
                }
                RecordStatus::Ran
            }
            Err(Error::Operation(error)) => {
                tracing::warn!(
                    source,
                    record_id,
                    %error,
                    "record failed; reported for redelivery"
                );
                RecordStatus::Failed
            }
            Err(Error::KeyReused) => {
                tracing::warn!(
                    source,
                    record_id,
                    outcome = "key_reused",
                    "record's key was used before with another payload; not processed"
                );
                self.unprocessable_record(record_id, Reason::KeyReused)
            }
            Err(error) => {
                tracing::warn!(
                    source,
                    record_id,
                    outcome = error.kind().as_str(),
                    "record not processed; reported for redelivery"
                );
                RecordStatus::Failed
            }
        }
    }
}

/// A record with what was read from it before it runs.
/// The report on an event with no records of this source. Lambda never
/// delivers an empty batch: this is an event of another shape that happened
/// to parse (a Kinesis event sent to a Kafka function), and succeeding
/// would drop its records, so it fails as a whole.
fn not_of_this_source<Src: Source>() -> Report {
    tracing::error!(
        source = Src::NAME,
        "the event has no {} records: it is not an event of this source; \
         reported as failed so that nothing it carries is lost",
        Src::NAME
    );
    Report {
        source: Src::NAME,
        records: vec![Reported {
            id: None,
            group: None,
            status: RecordStatus::Failed,
        }],
    }
}

struct Prepared<R> {
    position: usize,
    id: Option<String>,
    key: Option<String>,
    group: Option<String>,
    record: R,
}

/// Records that run one after another.
struct Group<R> {
    /// An ordered group stops at its first record that does not complete.
    ordered: bool,
    records: Vec<Prepared<R>>,
}

/// Ordered records by their group; unordered ones by key, so that a
/// duplicate inside the batch replays its twin's result instead of finding
/// it in progress. Groups in order of first appearance, records in
/// delivery order.
fn group<R>(records: Vec<Prepared<R>>) -> Vec<Group<R>> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut groups: Vec<Group<R>> = Vec::new();
    for record in records {
        let (name, ordered) = match (&record.group, &record.key) {
            (Some(group), _) => (format!("group:{group}"), true),
            (None, Some(key)) => (format!("key:{key}"), false),
            (None, None) => (format!("unkeyed:{}", record.position), false),
        };
        let slot = *index.entry(name).or_insert_with(|| {
            groups.push(Group {
                ordered,
                records: Vec::new(),
            });
            groups.len() - 1
        });
        groups[slot].records.push(record);
    }
    groups
}
