//! Amazon SNS and Amazon EventBridge: asynchronous invocations, retried by
//! Lambda and by the sender.

use crate::{
    consumers::{Batch, BatchFailed, Delivery, Report, Source},
    Fingerprint,
};
use aws_lambda_events::{
    eventbridge::EventBridgeEvent,
    sns::{SnsEvent, SnsRecord},
};
use serde::{de::DeserializeOwned, Serialize};
use std::{collections::HashMap, marker::PhantomData};

/// Amazon SNS: the [`Source`] of an [`SnsBatch`].
#[derive(Debug, Clone, Copy)]
pub struct Sns;

/// Amazon EventBridge, with events whose `detail` is a `T`: the [`Source`]
/// of an [`EventBridgeBatch`].
pub struct EventBridge<T = serde_json::Value>(PhantomData<fn() -> T>);

impl<T> std::fmt::Debug for EventBridge<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventBridge")
    }
}

/// Processes an SNS notification idempotently.
///
/// - **Retries**: SNS invokes Lambda asynchronously, so when a record does
///   not complete [`process`](Batch::process) returns a [`BatchFailed`]:
///   return it from the handler, and Lambda retries the invocation (twice
///   by default, then the function's on-failure destination or
///   dead-letter queue). SNS itself may also deliver a message twice.
/// - **Key**: the notification's `MessageId`, the same on each delivery of
///   one publish; a business key from the message also catches a
///   publisher's second `Publish`. **Fingerprint**: what the publisher
///   sent: the `Message`, its `Subject` and `MessageAttributes`; never the
///   envelope SNS adds to each delivery (`MessageId`, `Timestamp`,
///   `Signature`, `UnsubscribeUrl`, …), which differs between two
///   publishes of the same message.
///
/// ```
/// use aws_lambda_events::sns::{SnsEvent, SnsRecord};
/// use lambda_idempotency::{consumers::SnsBatch, Engine, MemoryStore};
/// use lambda_runtime::{Context, Error, LambdaEvent};
///
/// #[derive(serde::Deserialize)]
/// struct PriceChanged { sku: String, version: u64, price: u64 }
///
/// async fn reprice(record: SnsRecord) -> Result<String, Error> {
///     let change: PriceChanged = serde_json::from_str(&record.sns.message)?;
///     Ok(format!("{} now {}", change.sku, change.price))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let engine = Engine::builder(MemoryStore::new()).build();
/// // A business key: the same change published twice runs once.
/// let batch = SnsBatch::new(engine, "price-changes/repricer").key(|record: &SnsRecord| {
///     let change: PriceChanged = serde_json::from_str(&record.sns.message).ok()?;
///     Some(format!("{}@{}", change.sku, change.version))
/// });
/// let event: SnsEvent = serde_json::from_value(serde_json::json!({ "Records": [{
///     "EventSource": "aws:sns", "EventVersion": "1.0", "EventSubscriptionArn": "arn:aws:sns:eu-west-1:123456789012:prices:1",
///     "Sns": { "Type": "Notification", "MessageId": "95df01b4-ee98-5cb9-9903-4c221d41eb5e",
///              "TopicArn": "arn:aws:sns:eu-west-1:123456789012:prices", "Timestamp": "2026-11-22T10:00:00.000Z",
///              "SignatureVersion": "1", "Signature": "", "SigningCertUrl": "", "UnsubscribeUrl": "",
///              "Message": "{\"sku\":\"A-1\",\"version\":7,\"price\":1250}", "MessageAttributes": {} } }] }))?;
/// // lambda_runtime::run(service_fn(|event| async { Ok::<(), Error>(batch.process(event, reprice).await?) }))
/// batch.process(LambdaEvent::new(event, Context::default()), reprice).await?;
/// # Ok(())
/// # }
/// ```
pub type SnsBatch<St> = Batch<Sns, St>;

/// Processes an EventBridge event idempotently: a batch of one.
///
/// - **Retries**: EventBridge invokes Lambda asynchronously, so when the
///   event does not complete [`process`](Batch::process) returns a
///   [`BatchFailed`]: return it from the handler, and Lambda retries the
///   invocation (then the on-failure destination). EventBridge delivers at
///   least once, and its own retry policy may deliver an event again.
/// - **Key**: the event's `id`, the same on every delivery of one event; a
///   business key from the `detail` also catches a second `PutEvents` of
///   the same thing. **Fingerprint**: what the sender put: `source`,
///   `detail-type` and the `detail` (as canonical JSON); never the
///   envelope EventBridge adds (`id`, `time`, `replay-name`, …), which
///   differs between two `PutEvents` of the same event.
///
/// ```
/// use aws_lambda_events::eventbridge::EventBridgeEvent;
/// use lambda_idempotency::{consumers::EventBridgeBatch, Engine, MemoryStore};
/// use lambda_runtime::{Context, Error, LambdaEvent};
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Deserialize, Serialize)]
/// struct OrderPlaced { order_id: String, total: u64 }
///
/// async fn invoice(event: EventBridgeEvent<OrderPlaced>) -> Result<String, Error> {
///     Ok(format!("invoice for {}", event.detail.order_id))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Error> {
/// let engine = Engine::builder(MemoryStore::new()).build();
/// let batch: EventBridgeBatch<_, OrderPlaced> = EventBridgeBatch::new(engine, "orders-bus/invoicer")
///     .key(|event: &EventBridgeEvent<OrderPlaced>| Some(event.detail.order_id.clone()));
/// let event: EventBridgeEvent<OrderPlaced> = serde_json::from_value(serde_json::json!({
///     "version": "0", "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718", "detail-type": "OrderPlaced",
///     "source": "shop.orders", "account": "123456789012", "time": "2026-11-22T10:00:00Z",
///     "region": "eu-west-1", "resources": [], "detail": { "order_id": "o-42", "total": 1250 } }))?;
/// // lambda_runtime::run(service_fn(|event| async { Ok::<(), Error>(batch.process(event, invoice).await?) }))
/// batch.process(LambdaEvent::new(event, Context::default()), invoice).await?;
/// # Ok(())
/// # }
/// ```
pub type EventBridgeBatch<St, T = serde_json::Value> = Batch<EventBridge<T>, St>;

impl Source for Sns {
    type Event = SnsEvent;
    type Record = SnsRecord;
    type Output = ();
    const NAME: &'static str = "SNS";
    const DEFAULT_KEY: &'static str = "the MessageId";

    fn deliveries(event: SnsEvent) -> Vec<Delivery<SnsRecord>> {
        event.records.into_iter().map(Delivery::unordered).collect()
    }

    fn id(record: &SnsRecord) -> Option<String> {
        Some(record.sns.message_id.clone()).filter(|id| !id.is_empty())
    }

    fn default_key(record: &SnsRecord) -> Option<String> {
        Self::id(record)
    }

    fn default_fingerprint(record: &SnsRecord) -> Result<Fingerprint, String> {
        #[derive(Serialize)]
        struct Published<'a, Attribute> {
            message: &'a str,
            subject: Option<&'a str>,
            attributes: &'a HashMap<String, Attribute>,
        }
        let published = Published {
            message: &record.sns.message,
            subject: record.sns.subject.as_deref(),
            attributes: &record.sns.message_attributes,
        };
        Fingerprint::of_json(&published).map_err(|error| error.to_string())
    }

    fn respond(report: Report) -> Result<(), BatchFailed> {
        report.into_result()
    }
}

impl<T: Serialize + DeserializeOwned + Send + 'static> Source for EventBridge<T> {
    type Event = EventBridgeEvent<T>;
    type Record = EventBridgeEvent<T>;
    type Output = ();
    const NAME: &'static str = "EventBridge";
    const DEFAULT_KEY: &'static str = "the event id";

    fn deliveries(event: EventBridgeEvent<T>) -> Vec<Delivery<EventBridgeEvent<T>>> {
        vec![Delivery::unordered(event)]
    }

    fn id(event: &EventBridgeEvent<T>) -> Option<String> {
        event.id.clone().filter(|id| !id.is_empty())
    }

    fn default_key(event: &EventBridgeEvent<T>) -> Option<String> {
        Self::id(event)
    }

    fn default_fingerprint(event: &EventBridgeEvent<T>) -> Result<Fingerprint, String> {
        #[derive(Serialize)]
        struct Put<'a, T> {
            source: &'a str,
            detail_type: &'a str,
            detail: &'a T,
        }
        let put = Put {
            source: &event.source,
            detail_type: &event.detail_type,
            detail: &event.detail,
        };
        Fingerprint::of_json(&put).map_err(|error| error.to_string())
    }

    fn respond(report: Report) -> Result<(), BatchFailed> {
        report.into_result()
    }
}
