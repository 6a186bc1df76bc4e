//! An idempotent durable function (this crate is a preview): an
//! order is charged once per `order_id`, however many executions a client
//! starts for it, then the function waits out a cool-off period (the
//! execution suspends and replays) before it confirms.
//!
//! In Lambda (a durable function: `DurableConfig` on the function), it
//! serves executions, its records in the DynamoDB table `IDEMPOTENCY_TABLE`.
//! Anywhere else, `cargo run -p lambda-idempotency-durable --example
//! durable_orders` drives it with the SDK's in-memory `LocalRunner` on the
//! memory store: two executions for the same order, and one with another
//! amount, and prints what each got.

use aws_durable_execution_sdk::{self as sdk, test_util::LocalRunner, BoxError, DurableContext};
use lambda_idempotency::{store::Store, DynamoDbStore, Engine, MemoryStore};
use lambda_idempotency_durable::DurableIdempotency;
use serde::{Deserialize, Serialize};
use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_id: String,
    amount: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Confirmation {
    order_id: String,
    charge: String,
}

/// Charges made, standing for a payment API's side effect.
static CHARGES: AtomicUsize = AtomicUsize::new(0);

async fn charge_card(order: &Order) -> Result<String, BoxError> {
    let n = CHARGES.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("ch_{n}_{}", order.amount))
}

/// The durable function: the charge is a step whose effect runs once even
/// if the SDK runs the step's body again, and the wait suspends the
/// execution for an hour without billing it.
fn orders<St: Store + Send + Sync + 'static>(
    idempotency: DurableIdempotency<St>,
) -> impl Fn(Order, DurableContext) -> lambda_idempotency_durable::DurableHandlerFuture<Confirmation>
       + Send
       + Sync
       + 'static {
    let steps = idempotency.clone();
    idempotency.handler(
        |order: &Order| Some(order.order_id.clone()),
        move |order: Order, ctx: DurableContext| {
            let steps = steps.clone();
            async move {
                let charged = order.clone();
                let charge = steps
                    .step(&ctx, "charge-card", move || async move {
                        charge_card(&charged).await
                    })
                    .await?;
                ctx.wait(Duration::from_secs(3600)).name("cool-off").await?;
                Ok(Confirmation {
                    order_id: order.order_id,
                    charge,
                })
            }
        },
    )
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    if std::env::var_os("AWS_LAMBDA_RUNTIME_API").is_some() {
        // The client is built once per process, outside the handler.
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        let table = std::env::var("IDEMPOTENCY_TABLE")?;
        let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), table);
        store.verify().await?;
        let idempotency = DurableIdempotency::new(Engine::builder(store).build())
            .execution_timeout(Duration::from_secs(24 * 3600))
            .wait_while_in_progress(Duration::from_secs(300));
        return sdk::run(orders(idempotency)).await;
    }

    let idempotency = DurableIdempotency::new(Engine::builder(MemoryStore::new()).build());
    let order = |amount| Order {
        order_id: "order-77".into(),
        amount,
    };
    let first = LocalRunner::new()
        .run(orders(idempotency.clone()), order(100))
        .await;
    println!(
        "first execution:  {:?} after {} invocations (the wait suspended it)",
        first.output(),
        first.invocation_count()
    );
    let second = LocalRunner::new()
        .run(orders(idempotency.clone()), order(100))
        .await;
    println!(
        "second execution: {:?} (the first one's, replayed)",
        second.output()
    );
    let other = LocalRunner::new()
        .run(orders(idempotency), order(250))
        .await;
    println!(
        "another amount:   {:?} {:?}",
        other.error_type(),
        other.error_message()
    );
    let charges = CHARGES.load(Ordering::SeqCst);
    println!("{charges} charge for 3 executions of order-77");
    if charges != 1 || first.output() != second.output() || other.is_success() {
        return Err("the order was not charged exactly once".into());
    }
    Ok(())
}
