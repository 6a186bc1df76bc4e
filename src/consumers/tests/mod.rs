//! Event consumers on the memory store.

use super::*;
use crate::{
    store::{memory::MemoryWrite, Claim, OwnerToken, Store},
    ClaimHandle, EmfMetrics, Engine, Fingerprint, MemoryStore,
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

mod batches;
mod events;
