//! `ClaimHandle::step` beside what the conformance kit checks on every
//! store: a store without steps, a run without a claim, the downstream key,
//! the lease lost, a write retried after it landed, encryption.

use super::*;
use crate::{
    store::{
        memory::MemoryWrite, Claim, Completion, Conditional, Extension, OwnerToken, Record,
        RecordId, Removal, StepWrite, Store,
    },
    testing::ManualClock,
    Error, Fingerprint, MemoryStore, StoreError, StoreErrorKind,
};
use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

/// A store written before steps: it implements neither step method.
#[derive(Clone, Default)]
struct Plain(MemoryStore);

impl Store for Plain {
    type Write = MemoryWrite;
    async fn claim(&self, c: &Claim) -> Result<Conditional, StoreError> {
        self.0.claim(c).await
    }
    async fn take_over(&self, c: &Claim, o: &OwnerToken) -> Result<Conditional, StoreError> {
        self.0.take_over(c, o).await
    }
    async fn extend(&self, e: &Extension) -> Result<Conditional, StoreError> {
        self.0.extend(e).await
    }
    async fn complete(&self, c: Completion<MemoryWrite>) -> Result<Conditional, StoreError> {
        self.0.complete(c).await
    }
    async fn release(&self, i: &RecordId, o: &OwnerToken) -> Result<Conditional, StoreError> {
        self.0.release(i, o).await
    }
    async fn remove(&self, i: &RecordId, r: Removal) -> Result<Conditional, StoreError> {
        self.0.remove(i, r).await
    }
    async fn list_in_progress(&self, p: &str, l: usize) -> Result<Vec<Record>, StoreError> {
        self.0.list_in_progress(p, l).await
    }
    async fn get(&self, i: &RecordId, n: u64) -> Result<Option<Record>, StoreError> {
        self.0.get(i, n).await
    }
}

fn attempt(key: &str) -> Attempt<'_> {
    Attempt::new("s", key, Fingerprint::of_bytes(b"1250 EUR"))
}

/// A step that counts its runs and returns the count.
async fn counted(runs: &AtomicUsize) -> Result<usize, ()> {
    Ok(runs.fetch_add(1, Ordering::SeqCst) + 1)
}

#[tokio::test]
async fn a_store_without_steps_answers_unsupported_and_runs_nothing() {
    let engine = Engine::builder(Plain::default()).build();
    let runs = AtomicUsize::new(0);
    let outcome = engine
        .run(&attempt("k"), Mode::Plain, &Json, |claim| async move {
            let step = claim.step("charge", || counted(&runs)).await;
            assert!(
                matches!(&step, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unsupported),
                "{step:?}"
            );
            Ok::<_, ()>((runs.load(Ordering::SeqCst), Vec::new()))
        })
        .await;
    // Refused before the step ran (`Store::STEPS` is false).
    assert_eq!(outcome.expect("the operation completes").into_value(), 0);
}

#[tokio::test]
async fn without_a_claim_a_step_just_runs() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let runs = AtomicUsize::new(0);
    let outcome = engine
        .run_single_write(&attempt("k"), &Json, |claim| async move {
            assert!(!claim.is_claimed());
            assert_eq!(claim.step_key("charge"), None);
            let first = claim.step("charge", || counted(&runs)).await;
            let again = claim.step("charge", || counted(&runs)).await;
            Ok::<_, Error<()>>(((first?, again?), Vec::new()))
        })
        .await;
    assert_eq!(outcome.expect("committed").into_value(), (1, 2));
}

#[tokio::test]
async fn a_step_key_is_the_same_in_every_attempt_and_distinct_per_step() {
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(MemoryStore::new())
        .clock(clock.clone())
        .build();
    let keys = |claim: ClaimHandle| async move {
        let charge = claim.step_key("charge").expect("claimed");
        let receipt = claim.step_key("receipt").expect("claimed");
        Err::<(u8, Vec<MemoryWrite>), _>((charge, receipt))
    };
    let Err(Error::Operation(first)) = engine.run(&attempt("k"), Mode::Plain, &Json, keys).await
    else {
        panic!("the operation fails");
    };
    let Err(Error::Operation(second)) = engine.run(&attempt("k"), Mode::Plain, &Json, keys).await
    else {
        panic!("the operation fails");
    };
    assert_eq!(first, second);
    assert_ne!(first.0, first.1);
    let id = engine.record_id("s", "k");
    assert_eq!(first.0, crate::derive_key(id.as_str(), "charge"));
    assert_eq!(first.0.len(), 64);
}

/// The claim taken over while a step ran: its write is refused, the step
/// answers `LeaseLost`, and the handle says the claim is lost.
#[tokio::test]
async fn a_step_recorded_after_the_claim_was_lost_is_refused() {
    let store = MemoryStore::new();
    let engine = Engine::builder(store.clone()).build();
    let outcome = engine
        .run(&attempt("k"), Mode::Plain, &Json, |claim| {
            let store = store.clone();
            let id = engine.record_id("s", "k");
            async move {
                let step = claim
                    .step("charge", || async {
                        // Another attempt takes the record over meanwhile.
                        let mut record = store.record(&id).expect("claimed");
                        record.owner = OwnerToken::from_stored("successor");
                        store.insert_record(record);
                        Ok::<_, ()>(1u8)
                    })
                    .await;
                assert!(matches!(step, Err(Error::LeaseLost)), "{step:?}");
                assert!(claim.is_lost());
                Ok::<_, ()>((0u8, Vec::new()))
            }
        })
        .await;
    assert!(outcome.is_ok(), "{outcome:?}");
    let id = engine.record_id("s", "k");
    assert!(store
        .steps(&id, u64::MAX / 2)
        .await
        .expect("read")
        .is_empty());
}

/// A store whose first step write lands and answers as refused (a retry
/// after the answer of the first was lost): the engine reads the steps
/// back, finds its own, and goes on.
#[derive(Clone, Default)]
struct LandedTwice {
    store: MemoryStore,
    writes: Arc<AtomicUsize>,
}

impl Store for LandedTwice {
    type Write = MemoryWrite;
    const STEPS: bool = true;
    async fn claim(&self, c: &Claim) -> Result<Conditional, StoreError> {
        self.store.claim(c).await
    }
    async fn take_over(&self, c: &Claim, o: &OwnerToken) -> Result<Conditional, StoreError> {
        self.store.take_over(c, o).await
    }
    async fn extend(&self, e: &Extension) -> Result<Conditional, StoreError> {
        self.store.extend(e).await
    }
    async fn complete(&self, c: Completion<MemoryWrite>) -> Result<Conditional, StoreError> {
        self.store.complete(c).await
    }
    async fn release(&self, i: &RecordId, o: &OwnerToken) -> Result<Conditional, StoreError> {
        self.store.release(i, o).await
    }
    async fn remove(&self, i: &RecordId, r: Removal) -> Result<Conditional, StoreError> {
        self.store.remove(i, r).await
    }
    async fn list_in_progress(&self, p: &str, l: usize) -> Result<Vec<Record>, StoreError> {
        self.store.list_in_progress(p, l).await
    }
    async fn get(&self, i: &RecordId, n: u64) -> Result<Option<Record>, StoreError> {
        self.store.get(i, n).await
    }
    async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        let landed = self.store.record_step(step).await?;
        assert_eq!(landed, Conditional::Applied);
        // The SDK's retry of the same write, refused by its own effect.
        self.store.record_step(step).await
    }
    async fn steps(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> Result<Vec<crate::store::RecordedStep>, StoreError> {
        self.store.steps(id, now_ms).await
    }
}

#[tokio::test]
async fn a_step_write_that_landed_before_its_retry_is_recognised() {
    let store = LandedTwice::default();
    let engine = Engine::builder(store.clone()).build();
    let runs = AtomicUsize::new(0);
    let outcome = engine
        .run(&attempt("k"), Mode::Plain, &Json, |claim| async move {
            let first = claim.step("charge", || counted(&runs)).await?;
            let second = claim.step("ledger", || counted(&runs)).await?;
            Ok::<_, Error<()>>(((first, second), Vec::new()))
        })
        .await;
    assert_eq!(outcome.expect("completed").into_value(), (1, 2));
    assert_eq!(store.writes.load(Ordering::SeqCst), 2, "one write a step");
}

/// With encryption on, a step's output is sealed before it is recorded
/// and opened when a retry resumes (`tests/sealed_steps.rs` has the
/// tampering, the rotation and the plaintext steps, on every store).
#[cfg(feature = "encryption")]
#[tokio::test]
async fn with_encryption_on_a_step_is_sealed_and_resumed() {
    use crate::encryption::{key_id_of, Encryption, RawKeys};
    let store = MemoryStore::new();
    let keys = RawKeys::new("k1", &[7; 32]).expect("a key");
    let clock = ManualClock::new(1_700_000_000_000);
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .encryption(Encryption::new(keys, "prod/idempotency"))
        .build();
    let runs = AtomicUsize::new(0);
    let attempt = attempt("k");
    let run = |fail: bool| {
        let runs = &runs;
        engine.run(&attempt, Mode::Plain, &Json, move |claim| async move {
            let charge = claim.step("charge", || counted(runs)).await?;
            if fail {
                return Err(Error::Operation(()));
            }
            Ok::<_, Error<()>>((charge, Vec::new()))
        })
    };
    run(true).await.expect_err("failed after its step");
    let id = engine.record_id("s", "k");
    let stored = store.steps(&id, 1_700_000_000_000).await.expect("read");
    assert_eq!(key_id_of(&stored[0].output), Some("k1"), "sealed");
    assert_eq!(run(false).await.expect("resumed").into_value(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the step ran once");
}

/// A claim is marked as stepped while its run lasts, and no longer: the
/// marks of finished runs do not pile up in a long-lived process.
#[tokio::test]
async fn a_stepped_mark_ends_with_its_run() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let runs = AtomicUsize::new(0);
    for key in ["a", "b", "c"] {
        let marked = engine
            .run(&attempt(key), Mode::Plain, &Json, |claim| {
                let engine = engine.clone();
                let runs = &runs;
                async move {
                    claim.step("charge", || counted(runs)).await?;
                    Ok::<_, Error<()>>((engine.inner.stepped_claims.len(), Vec::new()))
                }
            })
            .await;
        assert_eq!(
            marked.expect("completed").into_value(),
            1,
            "marked while it runs"
        );
    }
    assert_eq!(engine.inner.stepped_claims.len(), 0, "and not after");
}

/// An operation not handed its handle (an event consumer's handler, or
/// `Engine::execute`'s) reaches its steps through `ClaimHandle::current()`,
/// and a retry after its failure resumes after them.
#[tokio::test]
async fn steps_through_the_current_claim_resume_too() {
    let engine = Engine::builder(MemoryStore::new()).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let operation = |fail: bool| {
        let runs = Arc::clone(&runs);
        move || async move {
            let claim = ClaimHandle::current().expect("inside the operation");
            let charge = claim
                .step("charge", || counted(&runs))
                .await
                .map_err(|error| format!("{error:?}"))?;
            if fail {
                return Err("the ledger is down".to_owned());
            }
            Ok(charge)
        }
    };
    let failed = engine.execute(&attempt("k"), operation(true)).await;
    assert!(matches!(failed, Err(Error::Operation(_))), "{failed:?}");
    let retried = engine.execute(&attempt("k"), operation(false)).await;
    assert_eq!(retried.expect("resumed").into_value(), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "charged once");
}

/// `testing::CountingStore` counts the step calls: one write a step, and
/// one read of the steps by a takeover, at its first step only.
#[tokio::test]
async fn a_counting_store_counts_step_writes_and_reads() {
    let store = crate::testing::CountingStore::new(MemoryStore::new());
    let engine = Engine::builder(store.clone()).build();
    let attempt = attempt("k");
    let run = |fail: bool| {
        engine.run(&attempt, Mode::Plain, &Json, move |claim| async move {
            for name in ["charge", "ledger"] {
                claim.step(name, || async { Ok::<_, ()>(1u8) }).await?;
                if fail {
                    return Err(Error::Operation(()));
                }
            }
            Ok::<_, Error<()>>((1u8, Vec::new()))
        })
    };
    run(true).await.expect_err("failed after its first step");
    run(false).await.expect("resumed");
    let calls = store.calls();
    assert_eq!((calls.record_step, calls.steps), (2, 1));
}

/// Inside a store transaction a step just runs and nothing is recorded:
/// the claim commits or rolls back with the operation, so a retry after a
/// failure has nothing to resume and runs the step again.
#[tokio::test]
async fn inside_a_store_transaction_a_step_is_not_recorded() {
    use crate::store::TransactionLimits;
    use std::time::Duration;
    let engine = Engine::builder(MemoryStore::new()).build();
    let runs = AtomicUsize::new(0);
    let attempt = attempt("k");
    let run = |fail: bool| {
        let runs = &runs;
        let limits = TransactionLimits::new()
            .claim_wait(Duration::from_millis(100))
            .time_limit(Duration::from_secs(5));
        engine.run_in_transaction(&attempt, limits, move |_transaction| async move {
            let claim = ClaimHandle::current().expect("inside the operation");
            assert!(claim.is_claimed());
            let charge = claim
                .step("charge", || counted(runs))
                .await
                .map_err(|error| format!("{error:?}"))?;
            if fail {
                return Err("the ledger is down".to_owned());
            }
            Ok(charge)
        })
    };
    run(true).await.expect_err("rolled back");
    assert_eq!(run(false).await.expect("committed").into_value(), 2);
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "ran again: nothing recorded"
    );
}
