//! Every write fenced on its owner: a zombie cannot touch its successor,
//! a write that landed is recognised, a refusal reports what it found.

use super::*;

/// A claims, its lease passes, B claims and completes: A's completion and
/// A's release are both refused, and B's record is intact.
pub async fn zombie_cannot_touch_its_successor<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let id = RecordId::new("p", "t", "zombie");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&a).await.expect("A claims"),
        Conditional::Applied
    );

    clock.advance(Duration::from_secs(6));
    let b = claim_at(&id, &clock, "owner-b", 1, Duration::from_secs(5));
    assert_eq!(
        store.take_over(&b, &a.owner).await.expect("B takes over"),
        Conditional::Applied
    );

    // While B is in progress, A can neither complete nor release.
    let refused_by_b = |written: Conditional, status: Status| match written {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.owner, b.owner, "refused by B's record");
            assert_eq!(record.status, status);
        }
        other => panic!("A's write was not refused by B's record: {other:?}"),
    };
    refused_by_b(
        store
            .complete(completion(&a, &clock, b"A", Vec::new()))
            .await
            .expect("A completes"),
        Status::InProgress,
    );
    refused_by_b(
        store.release(&a.id, &a.owner).await.expect("A releases"),
        Status::InProgress,
    );

    assert_eq!(
        store
            .complete(completion(&b, &clock, b"B", Vec::new()))
            .await
            .expect("B completes"),
        Conditional::Applied
    );
    // Nor once B has completed.
    refused_by_b(
        store
            .complete(completion(&a, &clock, b"A", Vec::new()))
            .await
            .expect("A completes"),
        Status::Completed,
    );
    refused_by_b(
        store.release(&a.id, &a.owner).await.expect("A releases"),
        Status::Completed,
    );

    let record = store
        .get(&id, clock.now_ms())
        .await
        .expect("read")
        .expect("B's record");
    assert_eq!(record.owner, b.owner);
    assert_eq!(record.status, Status::Completed);
    assert_eq!(record.response.as_deref(), Some(&b"B"[..]));
}

/// A write retried after it landed (its answer lost) is refused by its own
/// effect; the store reports it, and the engine recognises it.
pub async fn own_landed_writes_are_recognised<St: Store>(store: St) {
    let clock = ManualClock::starting_now();

    // What the store reports.
    let id = RecordId::new("p", "t", "retried");
    let claim = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(30));
    assert_eq!(
        store.claim(&claim).await.expect("claim"),
        Conditional::Applied
    );
    match store.claim(&claim).await.expect("the same claim again") {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.owner, claim.owner, "refused by its own record");
            assert_eq!(record.status, Status::InProgress);
        }
        other => panic!("a claim colliding with itself must report its record: {other:?}"),
    }
    let done = || completion(&claim, &clock, b"r", Vec::new());
    assert_eq!(
        store.complete(done()).await.expect("complete"),
        Conditional::Applied
    );
    match store.complete(done()).await.expect("complete again") {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.owner, claim.owner, "refused by its own completion");
            assert_eq!(record.status, Status::Completed);
        }
        other => panic!("a completion finding its own completion must report it: {other:?}"),
    }
    let id = RecordId::new("p", "t", "released");
    let claim = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(30));
    assert_eq!(
        store.claim(&claim).await.expect("claim"),
        Conditional::Applied
    );
    assert_eq!(
        store.release(&id, &claim.owner).await.expect("release"),
        Conditional::Applied
    );
    assert_eq!(
        store
            .release(&id, &claim.owner)
            .await
            .expect("release again"),
        Conditional::Refused(None),
        "a release finding no record reports none"
    );

    // What the engine decides, every write sent twice.
    let engine = engine(LostAnswers(store), &clock);
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "lost-answers", payload(1));
    let first = engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("a retried claim and completion are this attempt's");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    let replay = engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("replay");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value(), first.value());
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    let failing = Attempt::new("t", "lost-release", payload(1));
    let result = engine
        .execute(&failing, || async { Err::<Charge, _>(Declined) })
        .await;
    assert!(
        matches!(result, Err(Error::Operation(Declined))),
        "{result:?}"
    );
    let retry = engine
        .execute(&failing, charge(&runs, 1))
        .await
        .expect("a retried release released");
    assert_eq!(retry.kind(), OutcomeKind::Fresh);
}

/// Writes refused by a record that is no longer live (expired, or its lease
/// passed) report it, so that the engine can decide; a claim over such a
/// record applies.
pub async fn a_refused_write_reports_what_it_found<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let id = RecordId::new("p", "t", "found");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&a).await.expect("A claims"),
        Conditional::Applied
    );
    let b = claim_at(&id, &clock, "owner-b", 2, Duration::from_secs(5));
    match store.claim(&b).await.expect("B claims") {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.id, id);
            assert_eq!(record.owner, a.owner);
            assert_eq!(record.fingerprint, payload(1));
            assert_eq!(record.status, Status::InProgress);
            assert_eq!(record.lease_until_ms, Some(a.lease_until_ms));
            assert_eq!(record.expiration_s, a.expiration_s);
            assert_eq!(record.response, None);
        }
        other => panic!("B's claim must report A's live record: {other:?}"),
    }
    assert_eq!(
        store.get(&id, clock.now_ms()).await.expect("read"),
        store.get(&id, clock.now_ms()).await.expect("read again"),
        "a read changes nothing"
    );
    assert_eq!(
        store
            .complete(completion(&b, &clock, b"B", Vec::new()))
            .await
            .expect("B completes without a claim"),
        match store.get(&id, clock.now_ms()).await.expect("read") {
            Some(record) => Conditional::Refused(Some(record)),
            None => panic!("A's record is there"),
        },
        "a completion without a claim is refused by the record there"
    );
    let nothing = RecordId::new("p", "t", "nothing");
    let c = claim_at(&nothing, &clock, "owner-c", 1, Duration::from_secs(5));
    assert_eq!(
        store
            .complete(completion(&c, &clock, b"C", Vec::new()))
            .await
            .expect("complete nothing"),
        Conditional::Refused(None),
        "a completion without a record reports none"
    );
    assert_eq!(
        store.get(&nothing, clock.now_ms()).await.expect("read"),
        None,
        "a refused completion writes nothing"
    );
    clock.advance(Duration::from_secs(6));
    let b = claim_at(&id, &clock, "owner-b", 2, Duration::from_secs(5));
    match store.claim(&b).await.expect("B claims after A's lease") {
        Conditional::Refused(Some(record)) => {
            assert_eq!(
                record.owner, a.owner,
                "a lapsed claim still refuses a claim"
            );
            assert!(record.is_lapsed(clock.now_ms()));
        }
        other => panic!("B's claim must report A's lapsed record: {other:?}"),
    }
    let stranger = OwnerToken::from_stored("owner-x");
    assert!(
        matches!(
            store.take_over(&b, &stranger).await.expect("take over the wrong claim"),
            Conditional::Refused(Some(ref record)) if record.owner == a.owner
        ),
        "a takeover is fenced on the lapsed claim's owner"
    );
    assert_eq!(
        store.take_over(&b, &a.owner).await.expect("B takes over"),
        Conditional::Applied
    );
    let c = claim_at(&id, &clock, "owner-c", 2, Duration::from_secs(5));
    match store
        .take_over(&c, &a.owner)
        .await
        .expect("C takes over too")
    {
        Conditional::Refused(Some(record)) => assert_eq!(record.owner, b.owner),
        other => panic!("of two takeovers, one applies: {other:?}"),
    }
}

/// An operation's lease can be extended while the claim is its own, and
/// only then.
pub async fn extensions_are_fenced<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let id = RecordId::new("p", "t", "extended");
    let a = claim_at(&id, &clock, "owner-a", 1, Duration::from_secs(5));
    assert_eq!(
        store.claim(&a).await.expect("A claims"),
        Conditional::Applied
    );
    let extension = |claim: &Claim, lease_until_ms: u64| Extension {
        id: claim.id.clone(),
        owner: claim.owner.clone(),
        lease_until_ms,
        expiration_s: claim.expiration_s + 60,
        now_ms: clock.now_ms(),
    };
    let later = a.lease_until_ms + 30_000;
    assert_eq!(
        store
            .extend(&extension(&a, later))
            .await
            .expect("A extends"),
        Conditional::Applied
    );
    let record = store
        .get(&id, clock.now_ms())
        .await
        .expect("read")
        .expect("A's record");
    assert_eq!(record.lease_until_ms, Some(later));
    assert_eq!(record.expiration_s, a.expiration_s + 60);
    assert_eq!(record.status, Status::InProgress);

    // Past the old lease, A's claim is live: nobody takes it over.
    clock.advance(Duration::from_secs(6));
    let b = claim_at(&id, &clock, "owner-b", 1, Duration::from_secs(5));
    assert!(matches!(
        store.take_over(&b, &a.owner).await.expect("B tries"),
        Conditional::Refused(Some(ref record)) if record.owner == a.owner
    ));

    // Past the extended one, B takes over, and A can no longer extend.
    clock.advance(Duration::from_secs(30));
    let b = claim_at(&id, &clock, "owner-b", 1, Duration::from_secs(5));
    assert_eq!(
        store.take_over(&b, &a.owner).await.expect("B takes over"),
        Conditional::Applied
    );
    match store
        .extend(&extension(&a, later + 60_000))
        .await
        .expect("A extends")
    {
        Conditional::Refused(Some(record)) => {
            assert_eq!(record.owner, b.owner);
            assert_eq!(
                record.lease_until_ms,
                Some(b.lease_until_ms),
                "B's lease untouched"
            );
        }
        other => panic!("an extension of a lost claim must be refused: {other:?}"),
    }
}
