//! [`SqsBatch`]: idempotent processing of SQS batches with partial batch
//! responses.

use crate::{store::Store, Attempt, Engine, Error, Fingerprint, Json, Mode, OutcomeKind};
use aws_lambda_events::sqs::{BatchItemFailure, SqsBatchResponse, SqsEvent, SqsMessage};
use futures_util::{stream, StreamExt};
use lambda_runtime::LambdaEvent;
use serde::{de::DeserializeOwned, Serialize};
use std::{
    collections::HashMap,
    fmt::{self, Display},
    future::Future,
    sync::Arc,
};

type KeyFn = Arc<dyn Fn(&SqsMessage) -> Option<String> + Send + Sync>;
type FingerprintFn = Arc<dyn Fn(&SqsMessage) -> Fingerprint + Send + Sync>;

/// The default number of records processed at once.
pub const DEFAULT_CONCURRENCY: usize = 8;

/// Processes the records of an SQS batch idempotently, and reports the ones
/// to redeliver in an [`SqsBatchResponse`] (enable `ReportBatchItemFailures`
/// on the event source mapping).
///
/// Each record runs at most once per key: a duplicate inside the batch, a
/// redelivery, or (with a business key) a producer's second send is
/// replayed instead. Reported for redelivery: records whose handler failed,
/// records still in progress in another invocation, records whose key was
/// used with another payload, and every record when the store is
/// unavailable. Standard queues are processed concurrently (up to
/// [`concurrency`](SqsBatch::concurrency) records at once); on FIFO queues
/// the records of one message group run in order, and a group stops at its
/// first failure (that record and the rest of its group are reported), while
/// different groups run concurrently.
///
/// ```no_run
/// use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
/// use lambda_idempotency::{consumers::SqsBatch, DynamoDbStore, Engine};
/// use lambda_runtime::{service_fn, Error, LambdaEvent};
///
/// async fn send_receipt(message: SqsMessage) -> Result<(), Error> {
///     Ok(())
/// }
///
/// #[tokio::main]
/// async fn main() -> Result<(), Error> {
///     let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
///     let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency");
///     let batch = SqsBatch::new(Engine::builder(store).build(), "receipts");
///     lambda_runtime::run(service_fn(|event: LambdaEvent<SqsEvent>| {
///         let batch = batch.clone();
///         async move { Ok::<SqsBatchResponse, Error>(batch.process(event, send_receipt).await) }
///     }))
///     .await
/// }
/// ```
pub struct SqsBatch<St> {
    engine: Engine<St>,
    scope: Arc<str>,
    key: KeyFn,
    fingerprint: FingerprintFn,
    concurrency: usize,
    single_write: bool,
}

impl<St> Clone for SqsBatch<St> {
    fn clone(&self) -> Self {
        Self {
            engine: self.engine.clone(),
            scope: Arc::clone(&self.scope),
            key: Arc::clone(&self.key),
            fingerprint: Arc::clone(&self.fingerprint),
            concurrency: self.concurrency,
            single_write: self.single_write,
        }
    }
}

impl<St: fmt::Debug> fmt::Debug for SqsBatch<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqsBatch")
            .field("engine", &self.engine)
            .field("scope", &self.scope)
            .field("concurrency", &self.concurrency)
            .field("single_write", &self.single_write)
            .finish_non_exhaustive()
    }
}

/// How one record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RecordOutcome {
    Ran,
    Replayed,
    Failed,
}

impl<St: Store> SqsBatch<St> {
    /// A batch processor over `engine`, whose keys live in `scope` (name the
    /// queue or the consumer). By default a record's key is its SQS
    /// `messageId` and its fingerprint is its body.
    pub fn new(engine: Engine<St>, scope: impl Into<Arc<str>>) -> Self {
        Self {
            engine,
            scope: scope.into(),
            key: Arc::new(|message: &SqsMessage| message.message_id.clone()),
            fingerprint: Arc::new(|message: &SqsMessage| {
                Fingerprint::of_bytes(message.body.as_deref().unwrap_or_default().as_bytes())
            }),
            concurrency: DEFAULT_CONCURRENCY,
            single_write: false,
        }
    }

    /// Commits each record of
    /// [`process_transactional`](SqsBatch::process_transactional) in **one**
    /// store write, without a claim before it (see
    /// [`Engine::run_single_write`](crate::Engine::run_single_write)): one
    /// DynamoDB call per new record instead of two.
    ///
    /// **Only for handlers whose sole effect is the writes they return.** A
    /// duplicate record (a redelivery, a producer's second send) runs the
    /// handler again before it is answered with the replay, and duplicates
    /// processed at once may each run it; one commits. A record still in
    /// progress under a claim elsewhere is reported for redelivery, as
    /// without it.
    ///
    /// Only stores whose [`Store::SINGLE_WRITE`] is `true` have it: with
    /// another store this does not compile.
    pub fn single_write(mut self) -> Self {
        const {
            assert!(
                St::SINGLE_WRITE,
                "this store cannot commit in a single write: leave SqsBatch::single_write out"
            )
        };
        self.single_write = true;
        self
    }

    /// The idempotency key of a record. The default, its `messageId`,
    /// catches redeliveries of one message; a business key taken from the
    /// body (an order id) also catches a producer that sends twice. `None`
    /// reports the record as failed.
    pub fn key(
        mut self,
        key: impl Fn(&SqsMessage) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.key = Arc::new(key);
        self
    }

    /// The part of a record that must match for a duplicate to be a replay
    /// (default: its body).
    pub fn fingerprint(
        mut self,
        fingerprint: impl Fn(&SqsMessage) -> Fingerprint + Send + Sync + 'static,
    ) -> Self {
        self.fingerprint = Arc::new(fingerprint);
        self
    }

    /// How many records (standard queues) or message groups (FIFO queues)
    /// are processed at once (default 8, at least 1).
    pub fn concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// Processes every record with `handler`, and returns the records to
    /// redeliver.
    pub async fn process<T, E, F, Fut>(
        &self,
        event: LambdaEvent<SqsEvent>,
        handler: F,
    ) -> SqsBatchResponse
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: Fn(SqsMessage) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let handler = |message| {
            let run = handler(message);
            async move { run.await.map(|value| (value, Vec::new())) }
        };
        self.run(event, Mode::Plain, handler).await
    }

    /// Like [`process`](SqsBatch::process), but each record's handler also
    /// returns writes (for DynamoDB,
    /// [`TransactWriteItem`](aws_sdk_dynamodb::types::TransactWriteItem)s)
    /// committed in one transaction with the record's completion: the effect
    /// and the idempotency record appear together or not at all, so a crash
    /// between them cannot make a redelivery repeat the effect.
    pub async fn process_transactional<T, E, F, Fut>(
        &self,
        event: LambdaEvent<SqsEvent>,
        handler: F,
    ) -> SqsBatchResponse
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: Fn(SqsMessage) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        self.run(event, Mode::Transactional, handler).await
    }

    async fn run<T, E, F, Fut>(
        &self,
        event: LambdaEvent<SqsEvent>,
        mode: Mode,
        handler: F,
    ) -> SqsBatchResponse
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: Fn(SqsMessage) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let deadline_ms = event.context.deadline;
        let records = event.payload.records;
        let total = records.len();
        let fifo = records.iter().any(is_fifo);
        let keyed: Vec<(SqsMessage, Option<String>)> = records
            .into_iter()
            .map(|message| {
                let key = (self.key)(&message);
                (message, key)
            })
            .collect();
        // Records that must not run side by side go through one group, in
        // order: on FIFO queues a message group (which stops at its first
        // failure); on standard queues the records sharing a key, so a
        // duplicate inside the batch replays its twin's result instead of
        // finding it in progress.
        let groups = if fifo {
            group_by(keyed, |message, _| {
                message
                    .attributes
                    .get("MessageGroupId")
                    .cloned()
                    .unwrap_or_default()
            })
        } else {
            group_by(keyed, |message, key| match key {
                Some(key) => format!("key:{key}"),
                None => format!(
                    "unkeyed:{}",
                    message.message_id.as_deref().unwrap_or_default()
                ),
            })
        };
        let handler = &handler;
        let results: Vec<(String, RecordOutcome)> =
            stream::iter(groups)
                .map(|group| async move {
                    let mut results = Vec::with_capacity(group.len());
                    let mut group = group.into_iter();
                    for (message, key) in group.by_ref() {
                        let id = message.message_id.clone().unwrap_or_default();
                        let outcome = self.record(message, key, deadline_ms, mode, handler).await;
                        results.push((id, outcome));
                        if fifo && outcome == RecordOutcome::Failed {
                            break;
                        }
                    }
                    // FIFO: after a failure the rest of the group must not run
                    // ahead of it; SQS redelivers them, in order.
                    results.extend(group.map(|(rest, _)| {
                        (rest.message_id.unwrap_or_default(), RecordOutcome::Failed)
                    }));
                    results
                })
                .buffer_unordered(self.concurrency)
                .flat_map(stream::iter)
                .collect()
                .await;

        let mut response = SqsBatchResponse::default();
        let (mut ran, mut replayed) = (0, 0);
        for (id, outcome) in results {
            match outcome {
                RecordOutcome::Ran => ran += 1,
                RecordOutcome::Replayed => replayed += 1,
                RecordOutcome::Failed => {
                    // An empty identifier makes Lambda retry the whole batch:
                    // the only safe answer for a record SQS cannot name.
                    let mut failure = BatchItemFailure::default();
                    failure.item_identifier = id;
                    response.batch_item_failures.push(failure);
                }
            }
        }
        tracing::info!(
            records = total,
            ran,
            replayed,
            failed = response.batch_item_failures.len(),
            "SQS batch processed"
        );
        response
    }

    async fn record<T, E, F, Fut>(
        &self,
        message: SqsMessage,
        key: Option<String>,
        deadline_ms: u64,
        mode: Mode,
        handler: &F,
    ) -> RecordOutcome
    where
        T: Serialize + DeserializeOwned,
        E: Display,
        F: Fn(SqsMessage) -> Fut,
        Fut: Future<Output = Result<(T, Vec<St::Write>), E>>,
    {
        let message_id = message.message_id.clone().unwrap_or_default();
        let Some(key) = key else {
            tracing::error!(
                message_id,
                "SQS record has no idempotency key; reported as failed"
            );
            return RecordOutcome::Failed;
        };
        let fingerprint = (self.fingerprint)(&message);
        let attempt = Attempt::new(&self.scope, &key, fingerprint).deadline_ms(deadline_ms);
        let operation = |_| handler(message);
        let result = if mode == Mode::Transactional && self.single_write {
            self.engine.single_write(&attempt, &Json, operation).await
        } else {
            self.engine.run(&attempt, mode, &Json, operation).await
        };
        match result {
            Ok(outcome) if outcome.is_replay() => RecordOutcome::Replayed,
            Ok(outcome) => {
                if outcome.kind() != OutcomeKind::Fresh {
                    tracing::warn!(
                        message_id,
                        outcome = outcome.kind().as_str(),
                        "SQS record ran but its outcome is not stored"
                    );
                }
                RecordOutcome::Ran
            }
            Err(Error::Operation(error)) => {
                tracing::warn!(message_id, %error, "SQS record failed; reported for redelivery");
                RecordOutcome::Failed
            }
            Err(error) => {
                let kind = error.kind();
                tracing::warn!(
                    message_id,
                    outcome = kind.as_str(),
                    "SQS record not processed; reported for redelivery"
                );
                RecordOutcome::Failed
            }
        }
    }
}

fn is_fifo(message: &SqsMessage) -> bool {
    message.attributes.contains_key("MessageGroupId")
}

/// The records grouped by `group_of`, each group in delivery order, groups
/// in order of first appearance.
fn group_by<T>(
    records: Vec<(SqsMessage, T)>,
    group_of: impl Fn(&SqsMessage, &T) -> String,
) -> Vec<Vec<(SqsMessage, T)>> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut groups: Vec<Vec<(SqsMessage, T)>> = Vec::new();
    for (message, extra) in records {
        let slot = *index.entry(group_of(&message, &extra)).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[slot].push((message, extra));
    }
    groups
}
