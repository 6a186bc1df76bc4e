//! A payment in three steps (charge the card, book the ledger, send the
//! receipt), each recorded on the idempotency record as it finishes
//! (`ClaimHandle::step`, recovery points): an attempt that dies at any
//! point is taken over once its lease passes, and the takeover resumes
//! after the steps that finished. After a crash at each point, the card
//! is charged once, the ledger booked once, the receipt sent once.
//!
//! The one window a record cannot close, a crash inside a step after its
//! effect and before its output is recorded, is closed by the provider:
//! the step passes it a key of its own (`ClaimHandle::step_key`), the same
//! in every attempt, and the provider answers a key it has seen with the
//! charge it made.
//!
//! `cargo run --example recovery_points` (on the memory store, with a
//! clock moved by hand: it runs in milliseconds).

use lambda_idempotency::{
    testing::ManualClock, Attempt, ClaimHandle, Engine, Error, Fingerprint, Json, MemoryStore, Mode,
};
use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tokio::sync::oneshot;

/// A payment provider that, like Stripe, answers an idempotency key it
/// has seen with the charge it made for it; `charges` counts real ones.
#[derive(Default)]
struct Provider {
    by_key: Mutex<HashMap<String, String>>,
    charges: AtomicUsize,
}

impl Provider {
    fn charge(&self, key: &str, amount: u64) -> String {
        let mut by_key = self.by_key.lock().unwrap();
        by_key
            .entry(key.to_owned())
            .or_insert_with(|| {
                let n = self.charges.fetch_add(1, Ordering::SeqCst) + 1;
                format!("ch_{n}_{amount}")
            })
            .clone()
    }
}

/// What the handler touches, each counting its calls.
#[derive(Default)]
struct Services {
    provider: Provider,
    ledger: AtomicUsize,
    receipts: AtomicUsize,
}

/// Where the attempt dies: inside a step, after its effect (before its
/// output is recorded), or after a step (its output recorded).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Crash {
    Inside(&'static str),
    After(&'static str),
}

/// The handler: three steps. With `crash`, it says so once it reaches that
/// point, and hangs there until its future is dropped (the invocation dies).
async fn pay(
    claim: ClaimHandle,
    services: Arc<Services>,
    amount: u64,
    crash: Option<(Crash, oneshot::Sender<()>)>,
) -> Result<(String, Vec<lambda_idempotency::store::memory::MemoryWrite>), Error<String>> {
    let (at, crashed) = match crash {
        Some((at, crashed)) => (Some(at), Some(crashed)),
        None => (None, None),
    };
    let crashed = Mutex::new(crashed);
    let die_if = |point: Crash| {
        let crashed = (at == Some(point))
            .then(|| crashed.lock().unwrap().take())
            .flatten();
        async move {
            if let Some(crashed) = crashed {
                let _ = crashed.send(());
                std::future::pending::<()>().await;
            }
        }
    };
    let key = claim.step_key("charge").expect("a claimed run");
    let charge = claim
        .step("charge", || async {
            let charge = services.provider.charge(&key, amount);
            die_if(Crash::Inside("charge")).await;
            Ok::<_, String>(charge)
        })
        .await?;
    die_if(Crash::After("charge")).await;
    let entry = claim
        .step("ledger", || async {
            let n = services.ledger.fetch_add(1, Ordering::SeqCst) + 1;
            die_if(Crash::Inside("ledger")).await;
            Ok::<_, String>(n)
        })
        .await?;
    die_if(Crash::After("ledger")).await;
    claim
        .step("receipt", || async {
            services.receipts.fetch_add(1, Ordering::SeqCst);
            Ok::<_, String>(())
        })
        .await?;
    die_if(Crash::After("receipt")).await;
    Ok((format!("{charge} booked as entry {entry}"), Vec::new()))
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let points = [
        Crash::Inside("charge"),
        Crash::After("charge"),
        Crash::Inside("ledger"),
        Crash::After("ledger"),
        Crash::After("receipt"),
    ];
    for point in points {
        let clock = ManualClock::new(1_700_000_000_000);
        let engine = Engine::builder(MemoryStore::new())
            .clock(clock.clone())
            .default_lease(Duration::from_secs(5))
            .build();
        let services = Arc::new(Services::default());
        let attempt = Attempt::new("payments", "order-77", Fingerprint::of_bytes(b"1250 EUR"));

        // The first attempt dies at `point`: its future is dropped there.
        let (crashed, died) = oneshot::channel();
        let first = engine.run(&attempt, Mode::Plain, &Json, |claim| {
            pay(claim, Arc::clone(&services), 1250, Some((point, crashed)))
        });
        tokio::select! {
            ended = first => panic!("the first attempt was to die: {ended:?}"),
            _ = died => {}
        }

        // Its lease passes; the retry takes the record over and resumes.
        clock.advance(Duration::from_secs(6));
        let retry = engine
            .run(&attempt, Mode::Plain, &Json, |claim| {
                assert!(claim.takeover().is_some(), "the retry takes over");
                pay(claim, Arc::clone(&services), 1250, None)
            })
            .await
            .expect("the retry completes");
        let charges = services.provider.charges.load(Ordering::SeqCst);
        let ledger = services.ledger.load(Ordering::SeqCst);
        let receipts = services.receipts.load(Ordering::SeqCst);
        println!(
            "crash {point:?}: {:?}; charged {charges}, booked {ledger}, receipts {receipts}",
            retry.value()
        );
        assert_eq!(charges, 1, "charged once");
        // A crash inside the ledger step, before its output was recorded,
        // books it again: the ledger here takes no key (a real one would
        // take `step_key("ledger")`, as the provider does).
        let expected_ledger = if point == Crash::Inside("ledger") {
            2
        } else {
            1
        };
        assert_eq!(ledger, expected_ledger);
        assert_eq!(receipts, 1, "one receipt");
    }
}
