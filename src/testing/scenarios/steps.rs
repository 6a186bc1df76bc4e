//! Recovery points ([`Store::record_step`]): each step one fenced write on
//! the claim's record, kept across a takeover, read back in order, gone
//! with the claim; and, with the engine over the store, a takeover that
//! resumes after the steps that finished. For stores that record steps:
//! `store_conformance!(steps: …)`.

use super::*;
use crate::store::{RecordedStep, StepLimits, StepWrite};

fn step(claim: &Claim, clock: &ManualClock, index: u32, name: &str) -> StepWrite {
    StepWrite::new(
        claim.id.clone(),
        claim.owner.clone(),
        index,
        name,
        format!("\"{name}-output\"").into_bytes(),
        clock.now_ms(),
    )
}

fn recorded(names: &[&str]) -> Vec<RecordedStep> {
    names
        .iter()
        .map(|name| RecordedStep::new(*name, format!("\"{name}-output\"").into_bytes()))
        .collect()
}

async fn steps_of<St: Store>(store: &St, id: &RecordId, clock: &ManualClock) -> Vec<RecordedStep> {
    store.steps(id, clock.now_ms()).await.expect("steps read")
}

/// A step lands under its claim's owner, once (its retry, after it landed,
/// is refused by the owner's own record); steps read back in order; a
/// takeover keeps them; the lapsed owner's late step is refused by its
/// successor's record; a completed record refuses a step and shows none.
pub async fn steps_are_fenced_on_their_claim<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let id = RecordId::new("p", "t", "steps-fenced");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&a).await.expect("A claims"),
        Conditional::Applied
    );
    assert_eq!(steps_of(&store, &id, &clock).await, recorded(&[]));

    assert_eq!(
        store
            .record_step(&step(&a, &clock, 0, "charge"))
            .await
            .expect("A's first step"),
        Conditional::Applied
    );
    // The same write again (its answer lost, say): refused, by A's record.
    match store
        .record_step(&step(&a, &clock, 0, "charge"))
        .await
        .expect("A's retry")
    {
        Conditional::Refused(Some(record)) => assert_eq!(record.owner, a.owner),
        other => panic!("a step written twice was not refused: {other:?}"),
    }
    assert_eq!(
        store
            .record_step(&step(&a, &clock, 1, "ledger"))
            .await
            .expect("A's second step"),
        Conditional::Applied
    );
    assert_eq!(
        steps_of(&store, &id, &clock).await,
        recorded(&["charge", "ledger"])
    );

    // A's lease passes; B takes over and finds A's steps.
    clock.advance(Duration::from_secs(6));
    let mut b = claim_at(&id, &clock, "owner-b", 1, Duration::from_secs(5));
    b.attempt = 2;
    assert_eq!(
        store.take_over(&b, &a.owner).await.expect("B takes over"),
        Conditional::Applied
    );
    assert_eq!(
        steps_of(&store, &id, &clock).await,
        recorded(&["charge", "ledger"])
    );

    // A's late step is refused by B's record and never lands.
    match store
        .record_step(&step(&a, &clock, 2, "receipt"))
        .await
        .expect("A's late step")
    {
        Conditional::Refused(Some(record)) => assert_eq!(record.owner, b.owner),
        other => panic!("a zombie's step was not refused: {other:?}"),
    }
    assert_eq!(
        store
            .record_step(&step(&b, &clock, 2, "receipt"))
            .await
            .expect("B's step"),
        Conditional::Applied
    );
    assert_eq!(
        steps_of(&store, &id, &clock).await,
        recorded(&["charge", "ledger", "receipt"])
    );

    assert_eq!(
        store
            .complete(completion(&b, &clock, b"B", Vec::new()))
            .await
            .expect("B completes"),
        Conditional::Applied
    );
    match store
        .record_step(&step(&b, &clock, 3, "late"))
        .await
        .expect("a step after completion")
    {
        Conditional::Refused(Some(record)) => assert_eq!(record.status, Status::Completed),
        other => panic!("a completed record took a step: {other:?}"),
    }
    assert_eq!(steps_of(&store, &id, &clock).await, recorded(&[]));
}

/// A fresh claim starts without steps: after a release, and over an
/// expired record that held some.
pub async fn a_claim_starts_without_steps<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let id = RecordId::new("p", "t", "steps-fresh");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&a).await.expect("A claims"),
        Conditional::Applied
    );
    assert_eq!(
        store
            .record_step(&step(&a, &clock, 0, "charge"))
            .await
            .expect("A's step"),
        Conditional::Applied
    );
    assert_eq!(
        store.release(&id, &a.owner).await.expect("A releases"),
        Conditional::Applied
    );
    let b = claim_at(&id, &clock, "owner-b", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&b).await.expect("B claims"),
        Conditional::Applied
    );
    assert_eq!(steps_of(&store, &id, &clock).await, recorded(&[]));
    assert_eq!(
        store
            .record_step(&step(&b, &clock, 0, "charge"))
            .await
            .expect("B's step"),
        Conditional::Applied
    );

    // B's record expires (an hour after its claim) with B's step on it.
    clock.advance(Duration::from_secs(3602));
    assert_eq!(steps_of(&store, &id, &clock).await, recorded(&[]));
    let c = claim_at(&id, &clock, "owner-c", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&c).await.expect("C claims"),
        Conditional::Applied
    );
    assert_eq!(steps_of(&store, &id, &clock).await, recorded(&[]));
}

/// With the engine over the store: an attempt that dies after its first
/// step (its future dropped, as a crashed invocation's) leaves the step
/// recorded; the takeover after its lease resumes after it, and each
/// step's effect happened once.
pub async fn a_takeover_resumes_after_the_recorded_steps<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .default_lease(Duration::from_secs(5))
        .build();
    let charges = Arc::new(AtomicUsize::new(0));
    let receipts = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "steps-resume", payload(100));
    // With `crashed`, the operation says so once its first step is
    // recorded and hangs, until its future is dropped.
    let operation = |claim: crate::ClaimHandle, crashed: Option<oneshot::Sender<()>>| {
        let (charges, receipts) = (Arc::clone(&charges), Arc::clone(&receipts));
        async move {
            let charge = claim
                .step("charge", || async {
                    Ok::<_, Declined>(format!("ch_{}", charges.fetch_add(1, Ordering::SeqCst) + 1))
                })
                .await?;
            if let Some(crashed) = crashed {
                let _ = crashed.send(());
                std::future::pending::<()>().await;
            }
            let receipt = claim
                .step("receipt", || async {
                    Ok::<_, Declined>(receipts.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await?;
            Ok::<_, Error<Declined>>(((charge, receipt), Vec::new()))
        }
    };

    // The first attempt records its charge, then its invocation dies.
    let (crashed, charged) = oneshot::channel();
    let first = engine.run(&attempt, Mode::Plain, &Json, |claim| {
        operation(claim, Some(crashed))
    });
    tokio::select! {
        ended = first => panic!("the first attempt was to hang: {ended:?}"),
        _ = charged => {}
    }
    assert_eq!(charges.load(Ordering::SeqCst), 1);

    clock.advance(Duration::from_secs(6));
    let second = engine
        .run(&attempt, Mode::Plain, &Json, |claim: crate::ClaimHandle| {
            assert!(claim.takeover().is_some(), "the retry takes over");
            operation(claim, None)
        })
        .await
        .expect("the takeover completes");
    assert_eq!(second.into_value(), ("ch_1".to_owned(), 1));
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
    assert_eq!(receipts.load(Ordering::SeqCst), 1);
}

/// An operation that fails after a step gives its key back without
/// deleting the step: the retry takes the record over and resumes.
pub async fn a_failure_after_a_step_keeps_it<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = engine(store, &clock);
    let charges = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "steps-failed", payload(100));
    let operation = |claim: crate::ClaimHandle, fail: bool| {
        let charges = Arc::clone(&charges);
        async move {
            let charge = claim
                .step("charge", || async {
                    Ok::<_, Declined>(charges.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await?;
            if fail {
                return Err(Error::Operation(Declined));
            }
            Ok::<_, Error<Declined>>((charge, Vec::new()))
        }
    };
    let failed = engine
        .run(&attempt, Mode::Plain, &Json, |claim| operation(claim, true))
        .await;
    assert!(
        matches!(failed, Err(Error::Operation(Error::Operation(Declined)))),
        "{failed:?}"
    );
    let retried = engine
        .run(&attempt, Mode::Plain, &Json, |claim: crate::ClaimHandle| {
            assert!(claim.takeover().is_some(), "the retry resumes the record");
            operation(claim, false)
        })
        .await
        .expect("the retry completes");
    assert_eq!(retried.into_value(), 1);
    assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
}

/// The engine's bounds hold on every store: a step's output over the size
/// limit is not recorded, and a step past the count is not run.
pub async fn step_limits_are_enforced<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .step_limits(StepLimits::default().max_output_bytes(8).max_steps(2))
        .build();
    let attempt = Attempt::new("t", "steps-bounded", payload(100));
    let id = engine.record_id("t", "steps-bounded");
    let runs = Arc::new(AtomicUsize::new(0));
    let store = engine.store();
    let outcome = engine
        .run(&attempt, Mode::Plain, &Json, |claim: crate::ClaimHandle| {
            let runs = Arc::clone(&runs);
            async move {
                let big = claim
                    .step("big", || async { Ok::<_, Declined>(String::from("more than eight bytes")) })
                    .await;
                assert!(
                    matches!(&big, Err(Error::Store(e)) if e.kind() == crate::StoreErrorKind::Rejected),
                    "{big:?}"
                );
                let now_ms = clock.now_ms();
                assert_eq!(store.steps(&id, now_ms).await.expect("read"), recorded(&[]));
                for name in ["one", "two"] {
                    claim.step(name, || async { Ok::<_, Declined>(1u8) }).await?;
                }
                let third = claim
                    .step("three", || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, Declined>(3u8)
                    })
                    .await;
                assert!(
                    matches!(&third, Err(Error::Store(e)) if e.kind() == crate::StoreErrorKind::Rejected),
                    "{third:?}"
                );
                Ok::<_, Error<Declined>>((0u8, Vec::new()))
            }
        })
        .await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "a step past the bound did not run"
    );
}

/// Values at the edges, through the store alone: as many steps as the
/// engine's default bound, each output exactly its default size and
/// holding every byte value, names with quotes, backslashes, JSON and
/// characters outside ASCII; all read back as written, in order. The last
/// index again is refused by the record. A NUL in a name is either kept or
/// refused as `Rejected` (PostgreSQL's `text` cannot hold one), never a
/// panic.
pub async fn steps_at_the_edges<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let limits = StepLimits::default();
    let id = RecordId::new("p", "t", "steps-edges");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(60));
    assert_eq!(store.claim(&a).await.expect("claim"), Conditional::Applied);
    let name = |i: u32| match i {
        0 => "it's \"quoted\", \\ back\\slashed, $1 ? %s".to_owned(),
        1 => "🦀 ünïcödé 名前 \u{200b}".to_owned(),
        2 => "{\"name\": \"not json\"}".to_owned(),
        i => format!("step-{i}"),
    };
    let output = |i: u32| -> Vec<u8> {
        (0..limits.max_output_bytes)
            .map(|k| (k as u32 * 7 + i) as u8)
            .collect()
    };
    let write = |index: u32, name: String, output: Vec<u8>| {
        StepWrite::new(
            id.clone(),
            a.owner.clone(),
            index,
            name,
            output,
            clock.now_ms(),
        )
    };
    for i in 0..limits.max_steps {
        assert_eq!(
            store
                .record_step(&write(i, name(i), output(i)))
                .await
                .expect("step"),
            Conditional::Applied,
            "step {i}"
        );
    }
    let read = steps_of(&store, &id, &clock).await;
    assert_eq!(read.len(), limits.max_steps as usize);
    for (i, read) in (0..).zip(&read) {
        assert_eq!(read.name, name(i), "step {i}'s name");
        assert!(read.output == output(i), "step {i}'s output differs");
    }
    // The last index again: refused, the record holds one more.
    assert!(matches!(
        store
            .record_step(&write(limits.max_steps - 1, "again".into(), b"1".to_vec()))
            .await
            .expect("again"),
        Conditional::Refused(Some(_))
    ));
    match store
        .record_step(&write(limits.max_steps, "nul\0name".into(), b"1".to_vec()))
        .await
    {
        Ok(Conditional::Applied) => {
            let read = steps_of(&store, &id, &clock).await;
            assert_eq!(read.last().map(|s| s.name.as_str()), Some("nul\0name"));
        }
        Err(error) => assert_eq!(error.kind(), crate::StoreErrorKind::Rejected, "{error}"),
        Ok(other) => panic!("{other:?}"),
    }
}
