//! One handler's steps, written once, under both `step`s: the durable
//! crate's `DurableIdempotency::step` in a durable execution (the SDK's
//! `LocalRunner`) and the library's `ClaimHandle::step` (recovery points)
//! in a plain function. The step bodies and the closures that call them
//! are the same text; only the receiver changes (`steps.step(&ctx, name,
//! body)` for `claim.step(name, body)`), and with it the error type the
//! handler's `?` converts from.

use aws_durable_execution_sdk::{test_util::LocalRunner, BoxError, DurableContext};
use lambda_idempotency::{Attempt, Engine, Error, Fingerprint, Json, MemoryStore, Mode};
use lambda_idempotency_durable::DurableIdempotency;
use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

/// The effects, counted.
#[derive(Clone, Default)]
struct Services {
    charges: Arc<AtomicUsize>,
    entries: Arc<AtomicUsize>,
}

/// The payment's first step: what both `step`s take is a closure calling
/// it (`move || charge_card(...)`: `FnOnce() -> Future<Output =
/// Result<O, BoxError>>`, `Send + 'static`, `O` serde).
async fn charge_card(services: Services, amount: u64) -> Result<String, BoxError> {
    let n = services.charges.fetch_add(1, Ordering::SeqCst) + 1;
    Ok(format!("ch_{n}_{amount}"))
}

/// The second step, on the first one's output.
async fn book_ledger(services: Services, charge: String) -> Result<u64, BoxError> {
    assert!(charge.starts_with("ch_"));
    Ok(services.entries.fetch_add(1, Ordering::SeqCst) as u64 + 1)
}

#[tokio::test]
async fn the_same_steps_run_in_a_durable_execution_and_under_a_plain_claim() {
    // A durable function.
    let durable = Services::default();
    let steps = DurableIdempotency::new(Engine::builder(MemoryStore::new()).build());
    let handler = {
        let services = durable.clone();
        move |_event: serde_json::Value, ctx: DurableContext| {
            let (services, steps) = (services.clone(), steps.clone());
            async move {
                let s = services.clone();
                let charge = steps
                    .step(&ctx, "charge-card", move || charge_card(s, 1250))
                    .await?;
                let (s, c) = (services.clone(), charge.clone());
                let entry = steps
                    .step(&ctx, "book-ledger", move || book_ledger(s, c))
                    .await?;
                Ok::<_, BoxError>(format!("{charge}/{entry}"))
            }
        }
    };
    let result = LocalRunner::new()
        .run(handler, serde_json::Value::Null)
        .await;
    assert!(result.is_success(), "{:?}", result.error_message());
    assert_eq!(result.output().map(String::as_str), Some("ch_1_1250/1"));

    // A plain function: the same bodies, the same closures.
    let plain = Services::default();
    let engine = Engine::builder(MemoryStore::new()).build();
    let attempt = Attempt::new("payments", "order-77", Fingerprint::of_bytes(b"1250"));
    let services = plain.clone();
    let outcome = engine
        .run(&attempt, Mode::Plain, &Json, |claim| async move {
            let s = services.clone();
            let charge = claim
                .step("charge-card", move || charge_card(s, 1250))
                .await?;
            let (s, c) = (services.clone(), charge.clone());
            let entry = claim.step("book-ledger", move || book_ledger(s, c)).await?;
            Ok::<_, Error<BoxError>>((format!("{charge}/{entry}"), Vec::new()))
        })
        .await
        .expect("completed");
    assert_eq!(outcome.into_value(), "ch_1_1250/1");

    for services in [durable, plain] {
        assert_eq!(services.charges.load(Ordering::SeqCst), 1, "charged once");
        assert_eq!(services.entries.load(Ordering::SeqCst), 1, "booked once");
    }
}
