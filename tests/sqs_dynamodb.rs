//! SQS batches on DynamoDB Local: each receipt is "sent" (an increment
//! committed with its idempotency record) exactly once, however often it
//! is delivered.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

mod support;

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use aws_sdk_dynamodb::{
    types::{AttributeValue, TransactWriteItem, Update},
    Client,
};
use lambda_idempotency::{
    consumers::SqsBatch,
    store::{Claim, OwnerToken, Store},
    Clock, DynamoDbStore, Engine, Fingerprint, SystemClock,
};
use lambda_runtime::{Context, LambdaEvent};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

fn message(id: &str, charge: &str) -> SqsMessage {
    let mut message = SqsMessage::default();
    message.message_id = Some(id.into());
    message.body = Some(charge.into());
    message
}

fn fifo(id: &str, charge: &str, group: &str) -> SqsMessage {
    let mut message = message(id, charge);
    message.event_source_arn = Some("arn:aws:sqs:eu-west-1:123456789012:charges.fifo".into());
    message
        .attributes
        .insert("MessageGroupId".into(), group.into());
    message
}

fn batch(messages: Vec<SqsMessage>) -> LambdaEvent<SqsEvent> {
    let mut event = SqsEvent::default();
    event.records = messages;
    LambdaEvent::new(event, Context::default())
}

fn failed(response: &SqsBatchResponse) -> Vec<String> {
    let mut ids: Vec<String> = response
        .batch_item_failures
        .iter()
        .map(|f| f.item_identifier.clone())
        .collect();
    ids.sort();
    ids
}

struct Fixture {
    client: Client,
    receipts: String,
    sqs: SqsBatch<DynamoDbStore>,
    engine: Engine<DynamoDbStore>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Fixture {
    async fn new() -> Self {
        Self::with(support::client(), false).await
    }

    /// Each new record committed in one write, without a claim.
    async fn single_write(client: Client) -> Self {
        Self::with(client, true).await
    }

    async fn with(client: Client, single_write: bool) -> Self {
        let table = support::create_idempotency_table(&client).await;
        let receipts = support::create_table_with(&client, "receipts", "charge_id", None).await;
        let engine = Engine::builder(DynamoDbStore::new(client.clone(), table)).build();
        // Keyed by the charge (the body), so a producer's resend is caught.
        let sqs = SqsBatch::new(engine.clone(), "receipts").key(|m: &SqsMessage| m.body.clone());
        let sqs = if single_write {
            sqs.single_write()
        } else {
            sqs
        };
        Self {
            client,
            receipts,
            sqs,
            engine,
            log: Arc::default(),
        }
    }

    /// Sends the receipt of each message's charge: `sent += 1`, committed
    /// with the record. Charges named `fail…` fail.
    async fn deliver(&self, event: LambdaEvent<SqsEvent>) -> SqsBatchResponse {
        let handler = |message: SqsMessage| {
            let charge = message.body.unwrap_or_default();
            self.log.lock().unwrap().push(charge.clone());
            let table = self.receipts.clone();
            async move {
                if charge.starts_with("fail") {
                    return Err(format!("cannot send the receipt of {charge}"));
                }
                let update = Update::builder()
                    .table_name(table)
                    .key("charge_id", AttributeValue::S(charge))
                    .update_expression("ADD sent :one")
                    .expression_attribute_values(":one", AttributeValue::N("1".into()))
                    .build()
                    .map_err(|e| e.to_string())?;
                Ok((
                    (),
                    vec![TransactWriteItem::builder().update(update).build()],
                ))
            }
        };
        self.sqs
            .process_transactional(event, handler)
            .await
            .expect("SQS answers with a partial batch response")
    }

    async fn sent(&self) -> HashMap<String, u64> {
        let items = self
            .client
            .scan()
            .table_name(&self.receipts)
            .consistent_read(true)
            .send()
            .await
            .expect("scan")
            .items
            .unwrap_or_default();
        items
            .into_iter()
            .map(|item| {
                let charge = item["charge_id"].as_s().expect("S").clone();
                let sent = item["sent"].as_n().expect("N").parse().expect("number");
                (charge, sent)
            })
            .collect()
    }

    fn runs(&self, charge: &str) -> usize {
        self.log
            .lock()
            .unwrap()
            .iter()
            .filter(|c| *c == charge)
            .count()
    }
}

#[tokio::test]
async fn duplicates_inside_one_batch_and_across_batches_send_once() {
    let f = Fixture::new().await;
    let response = f
        .deliver(batch(vec![
            message("m1", "ch_a"),
            message("m2", "ch_b"),
            message("m3", "ch_a"),
            message("m4", "ch_c"),
            message("m5", "ch_a"),
        ]))
        .await;
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    // A redelivery of m2, and a producer's fourth send of ch_a.
    let response = f
        .deliver(batch(vec![message("m2", "ch_b"), message("m6", "ch_a")]))
        .await;
    assert!(response.batch_item_failures.is_empty(), "{response:?}");

    let sent = f.sent().await;
    assert_eq!(sent.len(), 3);
    assert!(
        sent.values().all(|n| *n == 1),
        "every receipt sent once: {sent:?}"
    );
    assert_eq!((f.runs("ch_a"), f.runs("ch_b"), f.runs("ch_c")), (1, 1, 1));
}

#[tokio::test]
async fn a_failing_record_is_reported_and_the_others_are_not() {
    let f = Fixture::new().await;
    let response = f
        .deliver(batch(vec![
            message("m1", "ch_a"),
            message("m2", "fail_x"),
            message("m3", "ch_b"),
        ]))
        .await;
    assert_eq!(failed(&response), ["m2"]);
    let sent = f.sent().await;
    assert_eq!(
        (sent.get("ch_a"), sent.get("ch_b"), sent.get("fail_x")),
        (Some(&1), Some(&1), None)
    );

    // Its redelivery runs it again (the claim was released); the rest replay.
    let response = f
        .deliver(batch(vec![message("m2", "fail_x"), message("m1", "ch_a")]))
        .await;
    assert_eq!(failed(&response), ["m2"]);
    assert_eq!(f.runs("fail_x"), 2);
    assert_eq!(f.runs("ch_a"), 1);
}

#[tokio::test]
async fn a_record_in_progress_elsewhere_is_reported_for_redelivery() {
    let f = Fixture::new().await;
    let now = SystemClock.now_ms();
    let claim = Claim {
        id: f.engine.record_id("receipts", "ch_busy"),
        owner: OwnerToken::generate().expect("the OS random source"),
        fingerprint: Fingerprint::of_bytes(b"ch_busy"),
        now_ms: now,
        lease_until_ms: now + 60_000,
        expiration_s: now / 1000 + 3600,
        attempt: 1,
        first_started_ms: now,
    };
    f.engine
        .store()
        .claim(&claim)
        .await
        .expect("another invocation claims ch_busy");
    let response = f
        .deliver(batch(vec![message("m1", "ch_busy"), message("m2", "ch_a")]))
        .await;
    assert_eq!(failed(&response), ["m1"]);
    assert_eq!(
        f.runs("ch_busy"),
        0,
        "not run while another invocation holds it"
    );
    assert_eq!(f.sent().await.get("ch_a"), Some(&1));
}

#[tokio::test]
async fn fifo_groups_keep_their_order_and_stop_at_the_first_failure() {
    let f = Fixture::new().await;
    let response = f
        .deliver(batch(vec![
            fifo("a1", "ch_a1", "A"),
            fifo("b1", "ch_b1", "B"),
            fifo("a2", "ch_a2", "A"),
            fifo("b2", "fail_b2", "B"),
            fifo("a3", "ch_a3", "A"),
            fifo("b3", "ch_b3", "B"),
        ]))
        .await;
    assert_eq!(failed(&response), ["b2", "b3"]);
    let log = f.log.lock().unwrap().clone();
    let group_a: Vec<_> = log.iter().filter(|c| c.starts_with("ch_a")).collect();
    let group_b: Vec<_> = log.iter().filter(|c| c.contains("_b")).collect();
    assert_eq!(group_a, ["ch_a1", "ch_a2", "ch_a3"]);
    assert_eq!(
        group_b,
        ["ch_b1", "fail_b2"],
        "b3 never ran ahead of the failed b2"
    );
    let sent = f.sent().await;
    assert_eq!(sent.get("ch_b3"), None);
    assert_eq!(sent.len(), 4);
}

#[tokio::test]
async fn single_write_sends_every_receipt_once_in_one_call_each() {
    let (client, calls) = support::counted_client();
    let f = Fixture::single_write(client).await;
    calls.reset();
    let response = f
        .deliver(batch(vec![
            message("m1", "ch_a"),
            message("m2", "ch_b"),
            message("m4", "ch_c"),
        ]))
        .await;
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    assert_eq!(
        calls.by_operation().get("TransactWriteItems"),
        Some(&3),
        "one call per new record: {:?}",
        calls.by_operation()
    );
    assert_eq!(calls.total(), 3, "{:?}", calls.by_operation());

    // Duplicates inside one batch, a redelivery and a producer's resend.
    let response = f
        .deliver(batch(vec![
            message("m3", "ch_a"),
            message("m5", "ch_a"),
            message("m2", "ch_b"),
        ]))
        .await;
    assert!(response.batch_item_failures.is_empty(), "{response:?}");
    let sent = f.sent().await;
    assert_eq!(sent.len(), 3);
    assert!(
        sent.values().all(|n| *n == 1),
        "every receipt sent once: {sent:?}"
    );
}

#[tokio::test]
async fn single_write_reports_failures_and_records_in_progress_elsewhere() {
    let f = Fixture::single_write(support::client()).await;
    let now = SystemClock.now_ms();
    let claim = Claim {
        id: f.engine.record_id("receipts", "ch_busy"),
        owner: OwnerToken::generate().expect("the OS random source"),
        fingerprint: Fingerprint::of_bytes(b"ch_busy"),
        now_ms: now,
        lease_until_ms: now + 60_000,
        expiration_s: now / 1000 + 3600,
        attempt: 1,
        first_started_ms: now,
    };
    f.engine
        .store()
        .claim(&claim)
        .await
        .expect("another invocation claims ch_busy");
    let response = f
        .deliver(batch(vec![
            message("m1", "ch_busy"),
            message("m2", "fail_x"),
            message("m3", "ch_a"),
        ]))
        .await;
    assert_eq!(failed(&response), ["m1", "m2"]);
    let sent = f.sent().await;
    assert_eq!(
        (sent.get("ch_busy"), sent.get("fail_x"), sent.get("ch_a")),
        (None, None, Some(&1)),
        "nothing committed for the record held elsewhere nor the failure"
    );
}
