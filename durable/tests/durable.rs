//! Durable executions on the SDK's `LocalRunner`: real suspensions,
//! replays and re-executed step bodies, in memory, against the memory store
//! and DynamoDB Local.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB` for the DynamoDB test; `make test`
//! provides it.

/// The outside review of the durable module (issue 37): store faults and
/// checkpoint failures at every position, map items, edge outputs.
#[path = "durable/review.rs"]
mod review;
// The integration harness helpers are the library's (tests/support).
#[path = "../../tests/support/mod.rs"]
mod support;

use aws_durable_execution_sdk::{test_util::LocalRunner, BoxError, DurableContext, RetryDecision};
use lambda_idempotency::{
    store::{Record, Status},
    DynamoDbStore, Engine, Fingerprint, MemoryStore, StoreErrorKind,
};
use lambda_idempotency_durable::{DurableIdempotency, CLAIM_STEP, STEP_SCOPE, WAIT_STEP};
use serde::{Deserialize, Serialize};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Order {
    order_id: String,
    amount: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Receipt {
    charge: String,
    invocation_saw: usize,
}

fn order(amount: u64) -> Order {
    Order {
        order_id: "order-77".into(),
        amount,
    }
}

/// Counts of what ran: handler entries (one per invocation of the
/// execution, replays included) and charges (the effect).
#[derive(Clone, Default)]
struct Counts {
    entries: Arc<AtomicUsize>,
    charges: Arc<AtomicUsize>,
}

impl Counts {
    fn entries(&self) -> usize {
        self.entries.load(Ordering::SeqCst)
    }
    fn charges(&self) -> usize {
        self.charges.load(Ordering::SeqCst)
    }
}

/// An order handler that charges in a step, waits an hour (so the
/// execution suspends and replays), and answers a receipt.
fn order_handler<St>(
    idempotency: &DurableIdempotency<St>,
    counts: &Counts,
) -> impl Fn(Order, DurableContext) -> lambda_idempotency_durable::DurableHandlerFuture<Receipt>
       + Send
       + Sync
       + 'static
where
    St: lambda_idempotency::store::Store + Send + Sync + 'static,
{
    let counts = counts.clone();
    idempotency.handler(
        |order: &Order| Some(order.order_id.clone()),
        move |order: Order, ctx: DurableContext| {
            let counts = counts.clone();
            async move {
                let entries = counts.entries.fetch_add(1, Ordering::SeqCst) + 1;
                let charges = Arc::clone(&counts.charges);
                let charge = ctx
                    .step(move |_| async move {
                        let n = charges.fetch_add(1, Ordering::SeqCst) + 1;
                        Ok::<_, BoxError>(format!("ch_{n}_{}", order.amount))
                    })
                    .name("charge")
                    .await?;
                ctx.wait(Duration::from_secs(3600)).name("cool-off").await?;
                Ok::<_, BoxError>(Receipt {
                    charge,
                    invocation_saw: entries,
                })
            }
        },
    )
}

/// One execution of the order handler, on LocalRunner.
async fn run_order<St>(
    idempotency: &DurableIdempotency<St>,
    counts: &Counts,
    amount: u64,
) -> aws_durable_execution_sdk::test_util::TestResult<Receipt>
where
    St: lambda_idempotency::store::Store + Send + Sync + 'static,
{
    LocalRunner::new()
        .run(order_handler(idempotency, counts), order(amount))
        .await
}

fn memory_idempotency() -> (MemoryStore, DurableIdempotency<MemoryStore>) {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).key_prefix("orders").build();
    (store, DurableIdempotency::new(engine))
}

#[tokio::test]
async fn a_handler_that_waits_replays_through_its_own_claim_and_completes_once() {
    let (store, idempotency) = memory_idempotency();
    let counts = Counts::default();
    let result = run_order(&idempotency, &counts, 100).await;

    assert!(
        result.is_success(),
        "{:?} {:?}",
        result.error_type(),
        result.error_message()
    );
    assert!(
        result.invocation_count() >= 2,
        "the wait suspended the execution: {} invocations",
        result.invocation_count()
    );
    assert_eq!(
        counts.entries(),
        result.invocation_count(),
        "every invocation replayed the handler past its own claim"
    );
    assert_eq!(counts.charges(), 1);
    let receipt = result.output().expect("a receipt").clone();
    assert_eq!(receipt.charge, "ch_1_100");

    let claims: Vec<_> = result
        .operations()
        .iter()
        .filter(|op| op.name() == Some(CLAIM_STEP))
        .collect();
    assert_eq!(claims.len(), 1, "one claim, replayed from its checkpoint");
    assert!(claims[0].succeeded());

    let records = store.records();
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].status, Status::Completed);
    assert_eq!(records[0].attempt, 1);
    let stored: Receipt =
        serde_json::from_slice(records[0].response.as_deref().expect("a response"))
            .expect("the receipt");
    assert_eq!(stored, receipt);
}

#[tokio::test]
async fn a_duplicate_execution_replays_the_first_output_without_running() {
    let (store, idempotency) = memory_idempotency();
    let counts = Counts::default();
    let first = run_order(&idempotency, &counts, 100).await;
    let entries = counts.entries();
    let duplicate = run_order(&idempotency, &counts, 100).await;

    assert!(duplicate.is_success(), "{:?}", duplicate.error_message());
    assert_eq!(duplicate.output(), first.output());
    assert_eq!(counts.entries(), entries, "the handler never ran");
    assert_eq!(counts.charges(), 1);
    assert!(
        duplicate
            .operations()
            .iter()
            .all(|op| op.name() != Some("charge")),
        "no step of the handler in the duplicate's history"
    );
    assert_eq!(store.records().len(), 1);

    // The same key with another payload is refused, and runs nothing.
    let reused = run_order(&idempotency, &counts, 999).await;
    assert!(reused.is_failure());
    assert_eq!(reused.error_type(), Some("IdempotencyKeyReused"));
    assert_eq!(counts.charges(), 1);
}

/// Another execution's live claim (LocalRunner gives every execution one
/// ARN, so the other execution's record is written as it would have
/// written it).
fn claimed_by_another_execution(
    store: &MemoryStore,
    idempotency: &DurableIdempotency<MemoryStore>,
) {
    let now = lambda_idempotency::Clock::now_ms(&lambda_idempotency::SystemClock);
    store.insert_record(Record {
        id: idempotency.engine().record_id("durable", "order-77"),
        status: Status::InProgress,
        owner: lambda_idempotency::store::OwnerToken::from_stored("another-execution"),
        fingerprint: Fingerprint::of_json(&order(100)).expect("fingerprint"),
        expiration_s: now / 1000 + 86_400,
        lease_until_ms: Some(now + 3_600_000),
        response: None,
        created_at_ms: Some(now),
        attempt: 1,
        first_started_ms: Some(now),
        completed_at_ms: None,
    });
}

#[tokio::test]
async fn a_duplicate_of_an_execution_in_progress_fails_or_waits_for_it() {
    let (store, idempotency) = memory_idempotency();
    claimed_by_another_execution(&store, &idempotency);
    let counts = Counts::default();
    let result = run_order(&idempotency, &counts, 100).await;
    assert!(result.is_failure());
    assert_eq!(result.error_type(), Some("IdempotencyAlreadyInProgress"));
    assert_eq!(counts.entries(), 0);

    // Waiting: durable waits between checks, then the same answer once
    // the wait allowed has passed (LocalRunner's time does not move).
    let waiting = idempotency
        .clone()
        .wait_while_in_progress(Duration::from_secs(90));
    let result = run_order(&waiting, &counts, 100).await;
    assert_eq!(result.error_type(), Some("IdempotencyAlreadyInProgress"));
    let waits = result
        .operations()
        .iter()
        .filter(|op| op.name() == Some(WAIT_STEP))
        .count();
    assert_eq!(waits, 6, "polls of 1, 2, 4, 8, 16 and 32 s within 90 s");
    assert_eq!(counts.entries(), 0);
}

#[tokio::test]
async fn an_invocation_lost_after_its_claim_is_recovered_by_the_same_execution() {
    let (store, idempotency) = memory_idempotency();
    let counts = Counts::default();
    // Checkpoint writes: the claim's START, then its SUCCEED, which fails
    // (retryably): the invocation ends with the claim written and not
    // checkpointed, and the next one runs the claim step again.
    let result = LocalRunner::new()
        .fail_checkpoints_after_retryable(1, 1)
        .run(order_handler(&idempotency, &counts), order(100))
        .await;
    assert!(
        result.is_success(),
        "the execution's own claim is its own: {:?} {:?}",
        result.error_type(),
        result.error_message()
    );
    assert_eq!(counts.charges(), 1);
    let records = store.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, Status::Completed);
}

#[tokio::test]
async fn a_failed_execution_releases_its_claim() {
    let (store, idempotency) = memory_idempotency();
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = Arc::clone(&runs);
        idempotency.handler(
            |order: &Order| Some(order.order_id.clone()),
            move |_order: Order, _ctx: DurableContext| {
                let runs = Arc::clone(&runs);
                async move {
                    if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                        return Err::<String, BoxError>("card declined".into());
                    }
                    Ok("ch_2".to_owned())
                }
            },
        )
    };
    let failed = LocalRunner::new().run(handler, order(100)).await;
    assert!(failed.is_failure());
    assert!(
        store.records().is_empty(),
        "released: {:?}",
        store.records()
    );

    let handler = {
        let runs = Arc::clone(&runs);
        idempotency.handler(
            |order: &Order| Some(order.order_id.clone()),
            move |_order: Order, _ctx: DurableContext| {
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>("ch_2".to_owned())
                }
            },
        )
    };
    let retried = LocalRunner::new().run(handler, order(100)).await;
    assert_eq!(retried.output().map(String::as_str), Some("ch_2"));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// The release of a failed execution's claim is tried again through a
/// store outage (four failed tries, the fifth lands: the key is free), and
/// not when the store refuses it for good (a missing permission: the claim
/// stays until it expires).
#[tokio::test]
async fn a_release_is_tried_again_through_an_outage_only() {
    for (failures, kind, released) in [
        (4, StoreErrorKind::Unavailable, true),
        (1, StoreErrorKind::Misconfigured, false),
    ] {
        let (store, idempotency) = memory_idempotency();
        let handler = {
            let store = store.clone();
            idempotency.handler(
                |order: &Order| Some(order.order_id.clone()),
                move |_order: Order, _ctx: DurableContext| {
                    let store = store.clone();
                    async move {
                        store.fail_next_with(failures, kind); // the releases
                        Err::<String, BoxError>("card declined".into())
                    }
                },
            )
        };
        let failed = LocalRunner::new().run(handler, order(100)).await;
        assert!(failed.is_failure());
        assert_eq!(
            store.records().is_empty(),
            released,
            "{failures} × {kind:?}: {:?}",
            store.records()
        );
    }
}

/// An execution's claim is leased for `DEFAULT_EXECUTION_TIMEOUT`, a day,
/// unless told otherwise.
#[tokio::test]
async fn an_execution_claims_its_key_for_a_day_by_default() {
    let (store, idempotency) = memory_idempotency();
    let leased = Arc::new(std::sync::Mutex::new(None));
    let handler = {
        let (store, leased) = (store.clone(), Arc::clone(&leased));
        idempotency.handler(
            |order: &Order| Some(order.order_id.clone()),
            move |_order: Order, _ctx: DurableContext| {
                let (store, leased) = (store.clone(), Arc::clone(&leased));
                async move {
                    let now_ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .expect("after 1970")
                        .as_millis() as u64;
                    let record = store.records().pop().expect("claimed");
                    *leased.lock().expect("leased") =
                        Some(record.lease_until_ms.expect("a lease") - now_ms);
                    Ok::<_, BoxError>("ch_1".to_owned())
                }
            },
        )
    };
    let ran = LocalRunner::new().run(handler, order(100)).await;
    assert!(ran.is_success(), "{:?}", ran.error_message());
    let leased = leased.lock().expect("leased").expect("ran");
    let day_ms = 24 * 3600 * 1000;
    assert!(
        leased <= day_ms && leased > day_ms - 60_000,
        "leased for {leased} ms"
    );
}

#[tokio::test]
async fn a_key_missing_fails_and_a_store_outage_is_retried_by_the_claim_step() {
    let (store, idempotency) = memory_idempotency();
    let handler = idempotency.handler(
        |_: &Order| None,
        |_order: Order, _ctx: DurableContext| async { Ok::<_, BoxError>(1u32) },
    );
    let result = LocalRunner::new().run(handler, order(1)).await;
    assert_eq!(result.error_type(), Some("IdempotencyKeyMissing"));
    let handler = idempotency.handler(
        |_: &Order| Some(String::new()),
        |_order: Order, _ctx: DurableContext| async { Ok::<_, BoxError>(1u32) },
    );
    let result = LocalRunner::new().run(handler, order(1)).await;
    assert_eq!(
        result.error_type(),
        Some("IdempotencyKeyMissing"),
        "an empty key"
    );

    store.fail_next_with(2, StoreErrorKind::Unavailable);
    let counts = Counts::default();
    let result = run_order(&idempotency, &counts, 100).await;
    assert!(result.is_success(), "{:?}", result.error_message());
    assert_eq!(counts.charges(), 1);
}

/// Review of issue 28: a store outage when the record is completed is
/// tried again (in a later invocation), not left as a claim that blocks
/// the key for a day.
#[tokio::test]
async fn a_store_outage_at_the_completion_is_retried() {
    let (store, idempotency) = memory_idempotency();
    let failed_once = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let handler = {
        let (store, failed_once) = (store.clone(), Arc::clone(&failed_once));
        idempotency.handler(
            |order: &Order| Some(order.order_id.clone()),
            move |_order: Order, _ctx: DurableContext| {
                let (store, failed_once) = (store.clone(), Arc::clone(&failed_once));
                async move {
                    if !failed_once.swap(true, Ordering::SeqCst) {
                        store.fail_next_with(1, StoreErrorKind::Unavailable);
                    }
                    Ok::<_, BoxError>("ch_1".to_owned())
                }
            },
        )
    };
    let result = LocalRunner::new().run(handler, order(100)).await;
    assert!(result.is_success(), "{:?}", result.error_message());
    assert!(
        result.invocation_count() >= 2,
        "the completion tried again later"
    );
    let records = store.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, Status::Completed, "{records:?}");
}

/// Review of issue 28: an execution the SDK ends without returning to the
/// handler (here its claim's checkpoint refused for good, after the claim
/// landed) cannot release its claim: the key stays claimed until
/// `execution_timeout`, and duplicates are told so; an operator's
/// `forget_even_in_progress` (the tool's `forget --force`) frees it.
#[tokio::test]
async fn an_execution_ended_by_the_sdk_keeps_its_claim_until_an_operator_frees_it() {
    let (store, idempotency) = memory_idempotency();
    let counts = Counts::default();
    let result = LocalRunner::new()
        .fail_checkpoints_after(1, 1)
        .run(order_handler(&idempotency, &counts), order(100))
        .await;
    assert!(result.is_failure());
    assert_eq!(counts.charges(), 0);
    let records = store.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].status, Status::InProgress);

    // Another execution (another ARN: the claim's owner differs).
    let mut held = records[0].clone();
    held.owner = lambda_idempotency::store::OwnerToken::from_stored("the-failed-execution");
    store.insert_record(held);
    let duplicate = run_order(&idempotency, &counts, 100).await;
    assert_eq!(duplicate.error_type(), Some("IdempotencyAlreadyInProgress"));

    idempotency
        .engine()
        .forget_even_in_progress("durable", "order-77")
        .await
        .expect("forgotten");
    let after = run_order(&idempotency, &counts, 100).await;
    assert!(after.is_success(), "{:?}", after.error_message());
    assert_eq!(counts.charges(), 1);
}

/// A step body the SDK runs twice (the invocation ends after its effect
/// and before its checkpoint): through the helper, the effect happens
/// once and the second run gets the first one's result; as a plain step,
/// twice.
#[tokio::test]
async fn a_step_body_run_again_does_its_effect_once() {
    for idempotent in [true, false] {
        let (_store, idempotency) = memory_idempotency();
        let effects = Arc::new(AtomicUsize::new(0));
        let handler = {
            let effects = Arc::clone(&effects);
            move |_event: serde_json::Value, ctx: DurableContext| {
                let effects = Arc::clone(&effects);
                let idempotency = idempotency.clone();
                async move {
                    let effect = move || async move {
                        let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
                        Ok::<_, BoxError>(format!("ch_{n}"))
                    };
                    let charge = if idempotent {
                        idempotency.step(&ctx, "charge-card", effect).await?
                    } else {
                        ctx.step(move |_| effect()).name("charge-card").await?
                    };
                    Ok::<_, BoxError>(charge)
                }
            }
        };
        // Checkpoints: the step's START, then its SUCCEED, which fails
        // (retryably): the next invocation runs the body again.
        let result = LocalRunner::new()
            .fail_checkpoints_after_retryable(1, 1)
            .run(handler, serde_json::Value::Null)
            .await;
        assert!(result.is_success(), "{:?}", result.error_message());
        assert_eq!(result.invocation_count(), 2, "the body's second run");
        if idempotent {
            assert_eq!(effects.load(Ordering::SeqCst), 1, "the effect once");
            assert_eq!(result.output().map(String::as_str), Some("ch_1"));
        } else {
            assert_eq!(effects.load(Ordering::SeqCst), 2, "a plain step: twice");
            assert_eq!(result.output().map(String::as_str), Some("ch_2"));
        }
    }
}

/// A clock that moves a second each time it is read: LocalRunner never
/// sleeps, so time has to pass between invocations some other way.
#[derive(Debug, Default)]
struct Ticking(std::sync::atomic::AtomicU64);

impl lambda_idempotency::Clock for Ticking {
    fn now_ms(&self) -> u64 {
        1_700_000_000_000 + self.0.fetch_add(1_000, Ordering::SeqCst)
    }
}

/// A step body whose earlier run died during its effect: its claim is
/// waited out (retried after the time left on it), then taken over.
#[tokio::test]
async fn a_step_claimed_by_a_dead_run_is_waited_out_then_taken_over() {
    let store = MemoryStore::new();
    let clock = Arc::new(Ticking::default());
    let engine = Engine::builder(store.clone())
        .clock(SharedClock(Arc::clone(&clock)))
        .build();
    let idempotency = DurableIdempotency::new(engine);
    let takeovers = Arc::new(AtomicUsize::new(0));
    let handler = {
        let takeovers = Arc::clone(&takeovers);
        move |_event: serde_json::Value, ctx: DurableContext| {
            let (idempotency, store, clock) =
                (idempotency.clone(), store.clone(), Arc::clone(&clock));
            let takeovers = Arc::clone(&takeovers);
            async move {
                let id = idempotency.engine().record_id(
                    STEP_SCOPE,
                    &lambda_idempotency::derive_key(ctx.execution_arn(), "charge-card"),
                );
                if store.record(&id).is_none() {
                    // The run that died: claimed for 3 more seconds.
                    let now = lambda_idempotency::Clock::now_ms(&*clock);
                    store.insert_record(Record {
                        id,
                        status: Status::InProgress,
                        owner: lambda_idempotency::store::OwnerToken::from_stored("dead-run"),
                        fingerprint: Fingerprint::of_bytes(b"charge-card"),
                        expiration_s: now / 1000 + 86_400,
                        lease_until_ms: Some(now + 3_000),
                        response: None,
                        created_at_ms: Some(now),
                        attempt: 1,
                        first_started_ms: Some(now),
                        completed_at_ms: None,
                    });
                }
                let charge = idempotency
                    .step(&ctx, "charge-card", move || async move {
                        if lambda_idempotency::ClaimHandle::current()
                            .and_then(|claim| claim.takeover())
                            .is_some()
                        {
                            takeovers.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok::<_, BoxError>("ch_1".to_owned())
                    })
                    .await?;
                Ok::<_, BoxError>(charge)
            }
        }
    };
    let result = LocalRunner::new()
        .run(handler, serde_json::Value::Null)
        .await;
    assert!(result.is_success(), "{:?}", result.error_message());
    assert!(
        result.invocation_count() >= 2,
        "retried in a later invocation"
    );
    assert_eq!(
        takeovers.load(Ordering::SeqCst),
        1,
        "run once, as a takeover"
    );
}

#[derive(Debug)]
struct SharedClock(Arc<Ticking>);

impl lambda_idempotency::Clock for SharedClock {
    fn now_ms(&self) -> u64 {
        self.0.now_ms()
    }
}

/// The helper's step keeps the SDK's retries: a body that fails is run
/// again by the retry strategy, as a plain step's would be.
#[tokio::test]
async fn a_failing_step_body_is_retried_by_the_step_strategy() {
    let (_store, idempotency) = memory_idempotency();
    let attempts = Arc::new(AtomicUsize::new(0));
    let handler = {
        let attempts = Arc::clone(&attempts);
        move |_event: serde_json::Value, ctx: DurableContext| {
            let attempts = Arc::clone(&attempts);
            let idempotency = idempotency.clone();
            async move {
                let value = idempotency
                    .step(&ctx, "flaky", move || async move {
                        if attempts.fetch_add(1, Ordering::SeqCst) == 0 {
                            return Err::<u32, BoxError>("timeout".into());
                        }
                        Ok(7)
                    })
                    .retry_strategy(|_, attempt| {
                        if attempt < 3 {
                            RetryDecision::Retry {
                                delay: Duration::from_secs(1),
                            }
                        } else {
                            RetryDecision::Stop
                        }
                    })
                    .await?;
                Ok::<_, BoxError>(value)
            }
        }
    };
    let result = LocalRunner::new()
        .run(handler, serde_json::Value::Null)
        .await;
    assert_eq!(result.output(), Some(&7));
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
}

/// The same, on DynamoDB Local: one record, completed, in the table.
#[tokio::test]
async fn on_dynamodb_the_execution_completes_once_and_a_duplicate_replays() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let store = DynamoDbStore::new(client, table);
    let idempotency =
        DurableIdempotency::new(Engine::builder(store.clone()).key_prefix("orders").build());
    let counts = Counts::default();
    let first = run_order(&idempotency, &counts, 100).await;
    assert!(first.is_success(), "{:?}", first.error_message());
    let duplicate = run_order(&idempotency, &counts, 100).await;
    assert_eq!(duplicate.output(), first.output());
    assert_eq!(counts.charges(), 1);
    let record = idempotency
        .engine()
        .inspect("durable", "order-77")
        .await
        .expect("inspect")
        .expect("a record");
    assert_eq!(record.status, Status::Completed);
}

/// Issue 37: the first execution's record, as another execution would find
/// it (LocalRunner gives every execution one ARN, so the claim's owner is
/// changed to another execution's).
fn as_another_executions(
    store: &MemoryStore,
    idempotency: &DurableIdempotency<MemoryStore>,
) -> Record {
    let id = idempotency.engine().record_id("durable", "order-77");
    let mut record = store
        .records()
        .into_iter()
        .find(|record| record.id == id)
        .expect("the execution's record");
    record.owner = lambda_idempotency::store::OwnerToken::from_stored("the-first-execution");
    store.insert_record(record.clone());
    record
}

/// Issue 37: a handler that charged and returns an output serde_json
/// cannot write (a map keyed by tuples) keeps its claim: a duplicate
/// execution is told it is in progress and charges nothing. Releasing the
/// key let the duplicate charge again.
#[tokio::test]
async fn an_output_that_does_not_serialise_keeps_the_claim() {
    type Allocation = std::collections::HashMap<(u32, u32), u64>;
    let (store, idempotency) = memory_idempotency();
    let charges = Arc::new(AtomicUsize::new(0));
    let handler = || {
        let charges = Arc::clone(&charges);
        let steps = idempotency.clone();
        idempotency.handler(
            |order: &Order| Some(order.order_id.clone()),
            move |order: Order, ctx: DurableContext| {
                let (charges, steps) = (Arc::clone(&charges), steps.clone());
                async move {
                    steps
                        .step(&ctx, "charge-card", move || async move {
                            charges.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, BoxError>(order.amount)
                        })
                        .await?;
                    Ok::<_, BoxError>(Allocation::from([((1, 2), order.amount)]))
                }
            },
        )
    };
    let _first = LocalRunner::new().run(handler(), order(100)).await;
    assert_eq!(charges.load(Ordering::SeqCst), 1);
    let record = as_another_executions(&store, &idempotency);
    assert_eq!(record.status, Status::InProgress, "the claim is kept");

    let duplicate = LocalRunner::new().run(handler(), order(100)).await;
    assert_eq!(
        duplicate.error_type(),
        Some("IdempotencyAlreadyInProgress"),
        "{:?}",
        duplicate.error_message()
    );
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
struct Quote {
    charge: String,
    rate: f64,
}

/// Issue 37: an output that serde_json writes and cannot read back (a NaN,
/// written as `null`) is not stored: its claim is kept, and a duplicate is
/// told it is in progress. Stored, every duplicate failed with a corrupt
/// record for the whole retention.
#[tokio::test]
async fn an_output_that_does_not_decode_back_is_not_stored() {
    let (store, idempotency) = memory_idempotency();
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = || {
        let runs = Arc::clone(&runs);
        idempotency.handler(
            |order: &Order| Some(order.order_id.clone()),
            move |_order: Order, _ctx: DurableContext| {
                let runs = Arc::clone(&runs);
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, BoxError>(Quote {
                        charge: "ch_1".into(),
                        rate: f64::NAN,
                    })
                }
            },
        )
    };
    let _first = LocalRunner::new().run(handler(), order(100)).await;
    let record = as_another_executions(&store, &idempotency);
    assert_eq!(record.status, Status::InProgress, "{record:?}");
    assert_eq!(record.response, None, "nothing stored");

    let duplicate = LocalRunner::new().run(handler(), order(100)).await;
    assert_eq!(
        duplicate.error_type(),
        Some("IdempotencyAlreadyInProgress"),
        "{:?}",
        duplicate.error_message()
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Issue 37: on an engine that fails open, a store outage at a step's
/// claim does not run its body unrecorded: the step retries the outage,
/// then runs the body with its claim, so a body the SDK runs again (its
/// checkpoint lost) is answered from the record, and charges once.
#[tokio::test]
async fn a_step_never_runs_unrecorded_on_a_fail_open_engine() {
    for lose_checkpoint in [false, true] {
        let store = MemoryStore::new();
        let engine = Engine::builder(store.clone())
            .key_prefix("orders")
            .fail_open(true)
            .build();
        let idempotency = DurableIdempotency::new(engine);
        let effects = Arc::new(AtomicUsize::new(0));
        let handler = {
            let effects = Arc::clone(&effects);
            move |_event: serde_json::Value, ctx: DurableContext| {
                let effects = Arc::clone(&effects);
                let idempotency = idempotency.clone();
                async move {
                    let charge = idempotency
                        .step(&ctx, "charge-card", move || async move {
                            let n = effects.fetch_add(1, Ordering::SeqCst) + 1;
                            Ok::<_, BoxError>(format!("ch_{n}"))
                        })
                        .await?;
                    Ok::<_, BoxError>(charge)
                }
            }
        };
        // The step's claim, and the read that confirms the outage.
        store.fail_next_with(2, StoreErrorKind::Unavailable);
        let runner = LocalRunner::new();
        // Checkpoints: the step's START, its RETRY (the outage), its
        // second START, then its SUCCEED, which fails (retryably): the
        // next invocation runs the body again.
        let runner = if lose_checkpoint {
            runner.fail_checkpoints_after_retryable(3, 1)
        } else {
            runner
        };
        let result = runner.run(handler, serde_json::Value::Null).await;
        assert!(
            result.is_success(),
            "{lose_checkpoint}: {:?}",
            result.error_message()
        );
        assert_eq!(result.output().map(String::as_str), Some("ch_1"));
        assert_eq!(effects.load(Ordering::SeqCst), 1, "{lose_checkpoint}");
        let records = store.records();
        assert_eq!(records.len(), 1, "the step's record: {records:?}");
        assert_eq!(records[0].status, Status::Completed);
    }
}

/// Issue 37, on DynamoDB Local: outputs that cannot be stored (one serde_json
/// cannot write, one it cannot read back) leave the execution's claim in
/// place, with no response, rather than releasing it or storing a record
/// no duplicate can replay.
#[tokio::test]
async fn on_dynamodb_an_output_that_cannot_be_stored_keeps_its_claim() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let store = DynamoDbStore::new(client, table);
    let idempotency =
        DurableIdempotency::new(Engine::builder(store.clone()).key_prefix("orders").build());
    let nan = idempotency.handler(
        |order: &Order| Some(order.order_id.clone()),
        |_order: Order, _ctx: DurableContext| async {
            Ok::<_, BoxError>(Quote {
                charge: "ch_1".into(),
                rate: f64::NAN,
            })
        },
    );
    let tuples = idempotency.handler(
        |order: &Order| Some(order.order_id.clone()),
        |order: Order, _ctx: DurableContext| async move {
            Ok::<_, BoxError>(std::collections::HashMap::from([(
                (1u8, 2u8),
                order.amount,
            )]))
        },
    );
    let _ = LocalRunner::new().run(nan, order(100)).await;
    let _ = LocalRunner::new()
        .run(
            tuples,
            Order {
                order_id: "order-78".into(),
                amount: 100,
            },
        )
        .await;
    for key in ["order-77", "order-78"] {
        let record = idempotency
            .engine()
            .inspect("durable", key)
            .await
            .expect("inspect")
            .expect("a record");
        assert_eq!(record.status, Status::InProgress, "{key}: {record:?}");
        assert_eq!(record.response, None, "{key}");
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Payment {
    charge: String,
    client_secret: Option<String>,
    card: String,
}

/// Issue 57: with `redact_json`, the execution that ran gets its whole
/// output, the record keeps it without the secret and with the card
/// masked, and a duplicate execution replays the redacted output without
/// running. A redaction whose JSON no longer reads as the output's type
/// (a required field removed) stores nothing and keeps the claim.
#[tokio::test]
async fn a_redacted_output_is_stored_and_replayed_without_its_secret() {
    use lambda_idempotency::{JsonPointer, JsonRedaction};
    let whole = Payment {
        charge: "ch_1".into(),
        client_secret: Some("pi_1_secret_x".into()),
        card: "4242424242424242".into(),
    };
    for (redaction, stores) in [
        (
            JsonRedaction::new()
                .remove(JsonPointer::new("/client_secret").unwrap())
                .replace(JsonPointer::new("/card").unwrap(), "************4242"),
            true,
        ),
        (
            JsonRedaction::new().remove(JsonPointer::new("/card").unwrap()),
            false,
        ),
    ] {
        let store = MemoryStore::new();
        let engine = Engine::builder(store.clone()).key_prefix("orders").build();
        let idempotency = DurableIdempotency::new(engine).redact_json(redaction);
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = || {
            let runs = Arc::clone(&runs);
            let whole = whole.clone();
            idempotency.handler(
                |order: &Order| Some(order.order_id.clone()),
                move |_order: Order, _ctx: DurableContext| {
                    let runs = Arc::clone(&runs);
                    let whole = whole.clone();
                    async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, BoxError>(whole)
                    }
                },
            )
        };
        let first = LocalRunner::new().run(handler(), order(100)).await;
        assert_eq!(first.output(), Some(&whole), "the first caller gets it all");
        let record = as_another_executions(&store, &idempotency);
        let duplicate = LocalRunner::new().run(handler(), order(100)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1, "ran once");
        if stores {
            let stored = String::from_utf8(record.response.expect("stored")).unwrap();
            assert!(
                !stored.contains("secret") && !stored.contains("4242424242424242"),
                "{stored}"
            );
            assert_eq!(
                duplicate.output(),
                Some(&Payment {
                    client_secret: None,
                    card: "************4242".into(),
                    ..whole.clone()
                })
            );
        } else {
            assert_eq!(record.status, Status::InProgress, "{record:?}");
            assert_eq!(record.response, None, "nothing stored");
            assert_eq!(
                duplicate.error_type(),
                Some("IdempotencyAlreadyInProgress"),
                "{:?}",
                duplicate.error_message()
            );
        }
    }
}
