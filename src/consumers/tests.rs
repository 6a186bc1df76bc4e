//! Event consumers on the memory store.

use super::*;
use crate::{
    store::{memory::MemoryWrite, Claim, OwnerToken, Store},
    ClaimHandle, Engine, Fingerprint, MemoryStore,
};
use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use lambda_runtime::{service_fn, Context, LambdaEvent};
use serde::{Deserialize, Serialize};
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tower::{Layer, ServiceExt};

type BoxError = lambda_runtime::Error;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Order {
    order_id: String,
    total: u64,
}

fn order(id: &str, total: u64) -> LambdaEvent<Order> {
    LambdaEvent::new(
        Order {
            order_id: id.into(),
            total,
        },
        Context::default(),
    )
}

fn counting_handler(
    runs: &Arc<AtomicUsize>,
) -> impl tower::Service<LambdaEvent<Order>, Response = String, Error = BoxError, Future = impl Send>
       + Clone {
    let runs = Arc::clone(runs);
    service_fn(move |event: LambdaEvent<Order>| {
        let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
        async move {
            if event.payload.total == 0 {
                return Err::<String, BoxError>("empty order".into());
            }
            Ok(format!("invoice {run} for {}", event.payload.order_id))
        }
    })
}

fn layer() -> IdempotentEventLayer<MemoryStore, Order> {
    IdempotentEventLayer::new(Engine::builder(MemoryStore::new()).build(), "orders")
        .key(|order: &Order| Some(order.order_id.clone()))
}

#[tokio::test]
async fn a_redelivered_event_replays_the_result() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer().layer(counting_handler(&runs));
    let first = service.clone().oneshot(order("o-1", 10)).await.unwrap();
    let again = service.clone().oneshot(order("o-1", 10)).await.unwrap();
    assert_eq!(first, "invoice 1 for o-1");
    assert_eq!(again, first);
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let mismatch = service
        .clone()
        .oneshot(order("o-1", 11))
        .await
        .expect_err("other payload");
    assert!(
        mismatch.to_string().contains("different payload"),
        "{mismatch}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_event_is_released_and_runs_again() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer().layer(counting_handler(&runs));
    let error = service
        .clone()
        .oneshot(order("o-2", 0))
        .await
        .expect_err("handler error");
    assert_eq!(error.to_string(), "empty order");
    let _ = service.clone().oneshot(order("o-2", 0)).await;
    assert_eq!(runs.load(Ordering::SeqCst), 2, "released, so it ran again");
}

/// Issue 21, item 9: an event whose handler panics releases its claim; the
/// panic goes on to the runtime (which fails the invocation), and Lambda's
/// async retry runs the event again at once instead of being told "in
/// progress" until the dead invocation's lease passes.
#[tokio::test]
async fn a_panicking_event_releases_its_claim() {
    use futures_util::FutureExt;
    let runs = Arc::new(AtomicUsize::new(0));
    let handler = {
        let runs = Arc::clone(&runs);
        service_fn(move |event: LambdaEvent<Order>| {
            let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
            async move {
                assert!(run > 1, "the handler panicked on its first run");
                Ok::<_, BoxError>(format!("invoice {run} for {}", event.payload.order_id))
            }
        })
    };
    let service = layer().layer(handler);
    let panic = std::panic::AssertUnwindSafe(service.clone().oneshot(order("o-9", 10)))
        .catch_unwind()
        .await
        .expect_err("the panic reaches the runtime");
    assert!(crate::engine::panic_message(&*panic).contains("panicked on its first run"));
    let retried = service
        .clone()
        .oneshot(order("o-9", 10))
        .await
        .expect("the retry runs at once");
    assert_eq!(retried, "invoice 2 for o-9");
}

#[tokio::test]
async fn events_without_a_key_are_refused_unless_optional() {
    let runs = Arc::new(AtomicUsize::new(0));
    let keyless = IdempotentEventLayer::new(Engine::builder(MemoryStore::new()).build(), "orders")
        .key(|_: &Order| None);
    let error = keyless
        .clone()
        .layer(counting_handler(&runs))
        .oneshot(order("o", 1))
        .await
        .expect_err("no key");
    assert!(error.to_string().contains("no idempotency key"), "{error}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    let optional = keyless.require_key(false).layer(counting_handler(&runs));
    optional.clone().oneshot(order("o", 1)).await.unwrap();
    optional.clone().oneshot(order("o", 1)).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn the_fingerprint_closure_decides_what_counts_as_the_same_event() {
    let runs = Arc::new(AtomicUsize::new(0));
    let service = layer()
        .fingerprint(|order: &Order| Fingerprint::of_bytes(order.order_id.as_bytes()))
        .layer(counting_handler(&runs));
    service.clone().oneshot(order("o-3", 10)).await.unwrap();
    // Only the id is fingerprinted: another total is the same event.
    service.clone().oneshot(order("o-3", 99)).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// Issue 10, item 8: the default fingerprint of an event beyond 64 bits
/// was the hash of a serialisation error message, shared by every such event,
/// so a second transfer with another amount was served the first's result.
#[tokio::test]
async fn wide_numbers_are_fingerprinted_and_unserialisable_events_refused() {
    #[derive(Serialize)]
    struct Transfer {
        id: &'static str,
        amount: u128,
        labels: HashMap<Vec<u8>, u8>,
    }
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let service = IdempotentEventLayer::new(Engine::builder(MemoryStore::new()).build(), "t")
        .key(|transfer: &Transfer| Some(transfer.id.to_owned()))
        .layer(service_fn(move |event: LambdaEvent<Transfer>| {
            counter.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok::<_, BoxError>(event.payload.amount.to_string()))
        }));
    let transfer = |id, amount, labels: &[(&[u8], u8)]| {
        LambdaEvent::new(
            Transfer {
                id,
                amount,
                labels: labels.iter().map(|(k, v)| (k.to_vec(), *v)).collect(),
            },
            Context::default(),
        )
    };
    let first = service
        .clone()
        .oneshot(transfer("t-1", u128::MAX, &[]))
        .await
        .unwrap();
    assert_eq!(first, u128::MAX.to_string());
    let other = service
        .clone()
        .oneshot(transfer("t-1", u128::MAX - 1, &[]))
        .await
        .unwrap_err()
        .to_string();
    assert!(other.contains("different payload"), "{other}");
    // A map keyed by bytes has no JSON form: refused, and nothing ran.
    let refused = service
        .clone()
        .oneshot(transfer("t-2", 1, &[(b"k", 1)]))
        .await
        .unwrap_err()
        .to_string();
    assert!(refused.contains("cannot be serialised"), "{refused}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

fn message(id: &str, body: &str, group: Option<&str>) -> SqsMessage {
    let mut message = SqsMessage::default();
    message.message_id = Some(id.into());
    message.body = Some(body.into());
    if let Some(group) = group {
        message.event_source_arn = Some("arn:aws:sqs:eu-west-1:123456789012:orders.fifo".into());
        message
            .attributes
            .insert("MessageGroupId".into(), group.into());
    }
    message
}

fn batch(messages: Vec<SqsMessage>) -> LambdaEvent<SqsEvent> {
    let mut event = SqsEvent::default();
    event.records = messages;
    LambdaEvent::new(event, Context::default())
}

fn failed_ids(response: &SqsBatchResponse) -> Vec<&str> {
    response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.as_str())
        .collect()
}

/// A handler recording the bodies it ran, failing bodies that start with
/// "fail".
type Seen = Arc<Mutex<Vec<String>>>;

fn recorder() -> (
    Seen,
    impl Fn(SqsMessage) -> std::future::Ready<Result<String, String>>,
) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let handler = move |message: SqsMessage| {
        let body = message.body.unwrap_or_default();
        log.lock().unwrap().push(body.clone());
        std::future::ready(if body.starts_with("fail") {
            Err(format!("cannot process {body}"))
        } else {
            Ok(body)
        })
    };
    (seen, handler)
}

#[tokio::test]
async fn duplicates_in_and_across_batches_run_once() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "queue")
        .key(|m: &SqsMessage| m.body.clone());
    let (seen, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![
                message("m1", "a", None),
                message("m2", "b", None),
                message("m3", "a", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    let response = sqs
        .process(
            batch(vec![message("m4", "b", None), message("m5", "c", None)]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    assert!(response.batch_item_failures.is_empty());
    let mut ran = seen.lock().unwrap().clone();
    ran.sort();
    assert_eq!(ran, ["a", "b", "c"]);
}

#[tokio::test]
async fn only_failed_and_in_progress_records_are_reported() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let sqs = SqsBatch::new(engine.clone(), "queue");
    // Another invocation holds m3's key right now.
    let now = crate::Clock::now_ms(&crate::SystemClock);
    let claim = Claim {
        id: engine.record_id("queue", "m3"),
        owner: OwnerToken::generate().expect("the OS random source"),
        fingerprint: Fingerprint::of_bytes(b"busy"),
        now_ms: now,
        lease_until_ms: now + 30_000,
        expiration_s: now / 1000 + 3600,
        attempt: 1,
        first_started_ms: now,
    };
    store.claim(&claim).await.unwrap();
    let (seen, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![
                message("m1", "ok-1", None),
                message("m2", "fail-2", None),
                message("m3", "busy", None),
                message("m4", "ok-4", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    let mut failed = failed_ids(&response);
    failed.sort();
    assert_eq!(failed, ["m2", "m3"]);
    assert!(
        !seen.lock().unwrap().contains(&"busy".to_string()),
        "m3 did not run here"
    );

    // The redelivery of the failed record runs again; the others replay.
    let response = sqs
        .process(
            batch(vec![
                message("m1", "ok-1", None),
                message("m2", "fail-2", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    assert_eq!(failed_ids(&response), ["m2"]);
    assert_eq!(
        seen.lock().unwrap().iter().filter(|b| *b == "ok-1").count(),
        1
    );
    assert_eq!(
        seen.lock()
            .unwrap()
            .iter()
            .filter(|b| *b == "fail-2")
            .count(),
        2
    );
}

#[tokio::test]
async fn fifo_groups_run_in_order_and_stop_at_their_first_failure() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "fifo").concurrency(4);
    let order = Arc::new(Mutex::new(HashMap::<String, Vec<String>>::new()));
    let log = Arc::clone(&order);
    let handler = move |message: SqsMessage| {
        let log = Arc::clone(&log);
        async move {
            let group = message.attributes["MessageGroupId"].clone();
            let body = message.body.unwrap_or_default();
            // Yield, so groups interleave if they can.
            tokio::time::sleep(Duration::from_millis(5)).await;
            log.lock()
                .unwrap()
                .entry(group)
                .or_default()
                .push(body.clone());
            if body.starts_with("fail") {
                Err(body)
            } else {
                Ok(())
            }
        }
    };
    let response = sqs
        .process(
            batch(vec![
                message("a1", "a-1", Some("A")),
                message("b1", "b-1", Some("B")),
                message("a2", "a-2", Some("A")),
                message("b2", "fail-b-2", Some("B")),
                message("a3", "a-3", Some("A")),
                message("b3", "b-3", Some("B")),
            ]),
            handler,
        )
        .await
        .expect("a partial batch response");
    let order = order.lock().unwrap();
    assert_eq!(order["A"], ["a-1", "a-2", "a-3"]);
    assert_eq!(
        order["B"],
        ["b-1", "fail-b-2"],
        "b-3 must not run after b-2 failed"
    );
    let mut failed = failed_ids(&response);
    failed.sort();
    assert_eq!(failed, ["b2", "b3"]);
}

#[tokio::test]
async fn an_unavailable_store_reports_every_record() {
    let store = MemoryStore::new();
    let sqs = SqsBatch::new(Engine::builder(store.clone()).build(), "queue");
    // Each record's claim, and the read that confirms the outage.
    store.fail_next(6);
    let (seen, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![
                message("m1", "a", None),
                message("m2", "b", None),
                message("m3", "c", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial batch response");
    assert_eq!(response.batch_item_failures.len(), 3);
    assert!(
        seen.lock().unwrap().is_empty(),
        "nothing ran without a claim"
    );
}

#[tokio::test]
async fn transactional_records_commit_their_writes_once() {
    let store = MemoryStore::new();
    let sqs = SqsBatch::new(Engine::builder(store.clone()).build(), "queue")
        .key(|m: &SqsMessage| m.body.clone());
    let handler = |message: SqsMessage| {
        let body = message.body.unwrap_or_default();
        std::future::ready(Ok::<_, String>((
            (),
            vec![MemoryWrite::put_if_absent(format!("sent#{body}"), "1")],
        )))
    };
    let response = sqs
        .process_transactional(
            batch(vec![message("m1", "x", None), message("m2", "x", None)]),
            handler,
        )
        .await
        .expect("a partial batch response");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    assert_eq!(store.item("sent#x").as_deref(), Some(&b"1"[..]));
}

#[tokio::test]
async fn a_record_that_takes_over_a_crashed_delivery_is_told_so() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let sqs = SqsBatch::new(engine.clone(), "queue");
    // An earlier delivery of m1 claimed it and died; its lease has passed.
    let now = crate::Clock::now_ms(&crate::SystemClock);
    let crashed = Claim {
        id: engine.record_id("queue", "m1"),
        owner: OwnerToken::generate().expect("the OS random source"),
        fingerprint: Fingerprint::of_bytes(b"pay"),
        now_ms: now - 60_000,
        lease_until_ms: now - 30_000,
        expiration_s: now / 1000 + 3600,
        attempt: 1,
        first_started_ms: now - 60_000,
    };
    store.claim(&crashed).await.unwrap();
    let told = Arc::new(Mutex::new(Vec::new()));
    let handler = |message: SqsMessage| {
        let told = Arc::clone(&told);
        async move {
            let takeover = ClaimHandle::current().and_then(|claim| claim.takeover());
            told.lock()
                .unwrap()
                .push((message.message_id.unwrap_or_default(), takeover));
            Ok::<_, String>(())
        }
    };
    let response = sqs
        .process(
            batch(vec![
                message("m1", "pay", None),
                message("m2", "other", None),
            ]),
            handler,
        )
        .await
        .expect("a partial batch response");
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    let mut told = told.lock().unwrap().clone();
    told.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        told,
        [
            (
                "m1".to_string(),
                Some(crate::Takeover {
                    attempt: 2,
                    first_started_at_ms: now - 60_000
                })
            ),
            ("m2".to_string(), None),
        ]
    );
}

#[tokio::test]
async fn an_event_without_records_fails_on_every_source_instead_of_succeeding() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let never = |_record| async { Err::<(), _>("must not run") };

    let sqs = SqsBatch::new(engine.clone(), "q")
        .process(batch(Vec::new()), |m: SqsMessage| never(m.message_id))
        .await
        .expect("a partial batch response");
    let ids: Vec<&str> = failed_ids(&sqs);
    assert_eq!(
        ids,
        [""],
        "an empty identifier: Lambda retries the whole batch"
    );

    let kinesis = KinesisBatch::new(engine.clone(), "k")
        .process(
            LambdaEvent::new(Default::default(), Context::default()),
            |r: aws_lambda_events::kinesis::KinesisEventRecord| never(r.event_id),
        )
        .await
        .expect("a partial batch response");
    assert_eq!(kinesis.batch_item_failures.len(), 1);
    assert_eq!(
        kinesis.batch_item_failures[0].item_identifier.as_deref(),
        Some("")
    );

    let kafka = KafkaBatch::new(engine, "t")
        .process(
            LambdaEvent::new(Default::default(), Context::default()),
            |r: aws_lambda_events::kafka::KafkaRecord| never(r.topic),
        )
        .await
        .expect_err("no records");
    assert!(
        kafka
            .to_string()
            .starts_with("1 of 1 Kafka records failed ((no id))"),
        "{kafka}"
    );
}

#[tokio::test]
async fn batch_failed_names_the_first_failures_and_counts_the_rest() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let event: aws_lambda_events::activemq::ActiveMqEvent =
        serde_json::from_value(serde_json::json!({
            "eventSource": "aws:amq",
            "messages": (0..9).map(|i| serde_json::json!({
                "messageID": format!("ID:{i}"), "messageType": "jms/text-message",
                "timestamp": 1_763_800_000_000_i64, "deliveryMode": 2, "redelivered": false,
                "expiration": 0, "priority": 4, "brokerInTime": 0, "brokerOutTime": 0,
                "properties": {},
                "destination": { "physicalName": if i % 2 == 0 { "even" } else { "odd" } },
                "data": "e30="
            })).collect::<Vec<_>>()
        }))
        .expect("an ActiveMQ event");
    let runs = Arc::new(Mutex::new(Vec::new()));
    let error = ActiveMqBatch::new(engine, "mq")
        .process(
            LambdaEvent::new(event, Context::default()),
            |message: aws_lambda_events::activemq::ActiveMqMessage| {
                let runs = Arc::clone(&runs);
                async move {
                    let id = message.message_id.unwrap_or_default();
                    runs.lock().unwrap().push(id.clone());
                    if id == "ID:2" {
                        return Err(format!("{id} failed"));
                    }
                    Ok(())
                }
            },
        )
        .await
        .expect_err("ID:2 failed");
    assert_eq!(
        error.to_string(),
        "1 of 9 ActiveMQ records failed (ID:2) and 3 were held back behind them; \
         the invocation fails so that Lambda delivers the batch again, where the \
         records that completed replay"
    );
    let mut runs = runs.lock().unwrap().clone();
    runs.sort();
    // The "even" destination stopped at ID:2; "odd" ran to its end.
    assert_eq!(error.report().count(RecordStatus::HeldBack), 3);
    assert_eq!(runs, ["ID:0", "ID:1", "ID:2", "ID:3", "ID:5", "ID:7"]);
}

/// Runs `body`'s record: sleeps, then panics for bodies that start with
/// "panic", fails those that start with "fail", and succeeds otherwise.
async fn slow_or_panicking(runs: Arc<Mutex<Vec<String>>>, body: String) -> Result<String, String> {
    runs.lock().unwrap().push(body.clone());
    if body.starts_with("panic") {
        panic!("the handler panicked on {body}");
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    if body.starts_with("fail") {
        return Err(format!("cannot process {body}"));
    }
    Ok(body)
}

#[tokio::test]
async fn a_panicking_record_fails_alone_and_the_records_beside_it_finish() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "queue");
    let runs = Arc::new(Mutex::new(Vec::new()));
    let handler = |message: SqsMessage| {
        slow_or_panicking(Arc::clone(&runs), message.body.unwrap_or_default())
    };
    let event = || {
        batch(vec![
            message("m1", "ok-1", None),
            message("m2", "panic-2", None),
            message("m3", "ok-3", None),
        ])
    };
    let response = sqs.process(event(), handler).await.expect("a response");
    assert_eq!(failed_ids(&response), ["m2"]);
    // The records beside it ran to the end and stored their results: the
    // redelivery replays them. The panicking one released its claim (item
    // 9), so the redelivery runs it again at once, not "in progress" until
    // the dead attempt's lease passes.
    runs.lock().unwrap().clear();
    let again = sqs.process(event(), handler).await.expect("a response");
    assert_eq!(failed_ids(&again), ["m2"]);
    let ran_again = runs.lock().unwrap().clone();
    assert_eq!(
        ran_again,
        ["panic-2"],
        "only the panicking record runs again"
    );
}

#[tokio::test]
async fn a_panicking_record_stops_its_ordered_group_like_an_error() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "fifo");
    let runs = Arc::new(Mutex::new(Vec::new()));
    let handler = |message: SqsMessage| {
        slow_or_panicking(Arc::clone(&runs), message.body.unwrap_or_default())
    };
    let response = sqs
        .process(
            batch(vec![
                message("a1", "ok-a1", Some("A")),
                message("a2", "panic-a2", Some("A")),
                message("a3", "ok-a3", Some("A")),
                message("b1", "ok-b1", Some("B")),
            ]),
            handler,
        )
        .await
        .expect("a response");
    assert_eq!(failed_ids(&response), ["a2", "a3"]);
    let mut ran = runs.lock().unwrap().clone();
    ran.sort();
    assert_eq!(ran, ["ok-a1", "ok-b1", "panic-a2"]);
}

#[tokio::test]
async fn a_panicking_key_closure_fails_only_its_record() {
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "queue").key(
        |message: &SqsMessage| {
            let body = message.body.clone()?;
            assert!(!body.starts_with("panic"), "the key closure panicked");
            Some(body)
        },
    );
    let (_, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![
                message("m1", "ok", None),
                message("m2", "panic", None),
            ]),
            &handler,
        )
        .await
        .expect("a response");
    assert_eq!(failed_ids(&response), ["m2"]);
}

#[tokio::test]
async fn a_standard_queue_with_message_groups_does_not_hold_a_group_back() {
    // Fair queues: a standard queue's messages carry a MessageGroupId too.
    let grouped = |id: &str, body: &str| {
        let mut message = message(id, body, None);
        message.event_source_arn = Some("arn:aws:sqs:eu-west-1:123456789012:orders".into());
        message
            .attributes
            .insert("MessageGroupId".into(), "tenant-1".into());
        message
    };
    let sqs = SqsBatch::new(Engine::builder(MemoryStore::new()).build(), "fair");
    let (seen, handler) = recorder();
    let response = sqs
        .process(
            batch(vec![grouped("m1", "fail-1"), grouped("m2", "ok-2")]),
            &handler,
        )
        .await
        .expect("a response");
    assert_eq!(failed_ids(&response), ["m1"], "m2 is not held back");
    assert!(seen.lock().unwrap().contains(&"ok-2".to_string()));
}

#[tokio::test]
async fn fail_on_entire_batch_failure_fails_the_invocation_only_when_nothing_completed() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let (_, handler) = recorder();
    let all_fail = || {
        batch(vec![
            message("m1", "fail-1", None),
            message("m2", "fail-2", None),
        ])
    };

    // Off by default: every record named in a partial response.
    let default = SqsBatch::new(engine.clone(), "default");
    let response = default.process(all_fail(), &handler).await;
    let response = response.expect("a partial response by default");
    assert_eq!(failed_ids(&response), ["m1", "m2"]);

    let strict = SqsBatch::new(engine.clone(), "strict").fail_on_entire_batch_failure();
    let failure = strict
        .process(all_fail(), &handler)
        .await
        .expect_err("nothing completed: the invocation fails");
    assert_eq!(failure.report().count(RecordStatus::Failed), 2);

    // One record completed: the partial response, as without the option.
    let response = strict
        .process(
            batch(vec![
                message("m3", "ok-3", None),
                message("m4", "fail-4", None),
            ]),
            &handler,
        )
        .await
        .expect("a partial response");
    assert_eq!(failed_ids(&response), ["m4"]);

    // A FIFO group held back behind its first failure completed nothing
    // either.
    let held = strict
        .process(
            batch(vec![
                message("f1", "fail-f1", Some("G")),
                message("f2", "ok-f2", Some("G")),
            ]),
            &handler,
        )
        .await
        .expect_err("nothing completed");
    assert_eq!(held.report().count(RecordStatus::HeldBack), 1);
}
