//! The pattern for an operation with an effect outside the store (a call to
//! a payment provider): reconcile when taking over a crashed attempt.
//!
//! The crate cannot undo what an attempt did before it crashed: once its
//! lease passes, a retry runs the operation again. But the retry is told
//! that it took over a lapsed claim (`ClaimHandle::takeover`), so it can
//! look the effect up at the provider, by a key derived from the
//! idempotency key, and act only if it is not there.
//!
//! `cargo run --example reconcile_after_takeover` (about two seconds: the
//! lease is one second of real time).

use lambda_idempotency::{
    derive_key, Attempt, ClaimHandle, Engine, Fingerprint, Json, MemoryStore, Mode,
};
use serde::{Deserialize, Serialize};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};

/// What the provider returns, and the operation stores.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Payment {
    id: String,
    amount: u64,
}

/// A payment provider that files each payment under the caller's reference.
#[derive(Default)]
struct Provider {
    payments: Mutex<HashMap<String, Payment>>,
}

impl Provider {
    fn charge(&self, reference: &str, amount: u64) -> Payment {
        let mut payments = self.payments.lock().unwrap();
        let payment = Payment {
            id: format!("py_{}", payments.len() + 1),
            amount,
        };
        payments.insert(reference.to_owned(), payment.clone());
        payment
    }

    fn find(&self, reference: &str) -> Option<Payment> {
        self.payments.lock().unwrap().get(reference).cloned()
    }

    fn count(&self) -> usize {
        self.payments.lock().unwrap().len()
    }
}

/// The operation: charge once, and on a takeover look first.
async fn pay<W>(
    provider: &Provider,
    key: &str,
    amount: u64,
    claim: ClaimHandle,
    crash_after_charging: bool,
) -> Result<(Payment, Vec<W>), String> {
    // The provider sees a reference derived from the idempotency key: the
    // same for every attempt at this key, never the raw key itself.
    let reference = derive_key(key, "charge-card");
    if let Some(takeover) = claim.takeover() {
        println!(
            "  attempt {}: an earlier attempt may have charged; looking it up",
            takeover.attempt
        );
        if let Some(payment) = provider.find(&reference) {
            println!("  found {}: not charging again", payment.id);
            return Ok((payment, Vec::new()));
        }
    }
    let payment = provider.charge(&reference, amount);
    println!("  charged {} for {}", payment.id, payment.amount);
    if crash_after_charging {
        println!("  ...and the invocation dies before storing the outcome");
        std::future::pending::<()>().await;
    }
    Ok((payment, Vec::new()))
}

#[tokio::main]
async fn main() {
    let engine = Engine::builder(MemoryStore::new())
        .default_lease(Duration::from_secs(1))
        .build();
    let provider = Arc::new(Provider::default());
    let body = serde_json::json!({ "amount": 1250 });
    let fingerprint = Fingerprint::of_json(&body).expect("a JSON object");

    println!("attempt 1");
    let crashed = {
        let (engine, provider, fingerprint) =
            (engine.clone(), Arc::clone(&provider), fingerprint.clone());
        tokio::spawn(async move {
            let attempt = Attempt::new("tenant-1", "order-77", fingerprint);
            engine
                .run(&attempt, Mode::Plain, &Json, |claim| {
                    pay(&provider, "order-77", 1250, claim, true)
                })
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    crashed.abort(); // the Lambda timeout: the future is dropped mid-operation
    let _ = crashed.await;

    tokio::time::sleep(Duration::from_millis(1100)).await; // the lease passes
    println!("attempt 2 (the client's retry)");
    let attempt = Attempt::new("tenant-1", "order-77", fingerprint);
    let outcome = engine
        .run(&attempt, Mode::Plain, &Json, |claim| {
            pay(&provider, "order-77", 1250, claim, false)
        })
        .await
        .expect("the retry completes");
    println!("  -> {:?} ({:?})", outcome.value(), outcome.kind());

    assert_eq!(provider.count(), 1, "charged once across both attempts");
    assert_eq!(outcome.value().id, "py_1");
}
