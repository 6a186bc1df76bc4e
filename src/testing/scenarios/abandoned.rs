//! The completer ([`Engine::complete_abandoned`]): abandoned claims
//! listed in bounded pages ([`Store::list_abandoned`]), then reported,
//! released or failed by policy, every write a takeover fenced as a
//! retry's is. For stores that list them: `store_conformance!(abandoned: …)`.

use super::*;
use crate::{
    store::{PageCursor, StepWrite},
    AbandonedPolicy, Completer, Settled, Settlement,
};
use std::collections::BTreeSet;

/// A write of `owner`'s applied, or refused by the record it wrote (its
/// answer lost and the write sent again: [`LostAnswers`]).
fn landed(answer: Conditional, owner: &OwnerToken) {
    match answer {
        Conditional::Applied => {}
        Conditional::Refused(Some(record)) if record.owner == *owner => {}
        other => panic!("{owner:?}'s write did not land: {other:?}"),
    }
}

/// A claim under `engine`'s prefix, for `key`, written with `lease`.
async fn claimed<St: Store>(
    engine: &Engine<St>,
    clock: &ManualClock,
    key: &str,
    lease: Duration,
) -> Claim {
    let claim = claim_at(&engine.record_id("t", key), clock, key, 1, lease);
    landed(
        engine.store().claim(&claim).await.expect("claim"),
        &claim.owner,
    );
    claim
}

/// Every page of the walk, `limit` records a page at most.
async fn walk<St: Store>(
    engine: &Engine<St>,
    older_than: Duration,
    limit: usize,
) -> (Vec<String>, usize) {
    let mut cursor: Option<PageCursor> = None;
    let mut ids = Vec::new();
    // A shared server (Redis) may hold many other keys: the walk pages
    // through them all, each page a bounded call.
    for pages in 1..=100_000 {
        let page = engine
            .list_abandoned(older_than, limit, cursor)
            .await
            .expect("a page");
        assert!(
            page.records.len() <= limit,
            "a page of {} records, over its limit of {limit}",
            page.records.len()
        );
        ids.extend(page.records.iter().map(|r| r.id.as_str().to_owned()));
        cursor = page.next;
        if cursor.is_none() {
            return (ids, pages);
        }
    }
    panic!("the walk did not end")
}

/// Abandoned claims are listed a bounded page at a time, and a walk of
/// the pages finds each once it is abandoned (lease passed, by at least
/// `older_than`, not expired): never a live claim, a completed record, an
/// expired one, or another prefix's.
pub async fn abandoned_claims_are_listed_in_bounded_pages<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .key_prefix("abandoned-walk")
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    engine
        .execute(&Attempt::new("t", "done", payload(1)), charge(&runs, 1))
        .await
        .expect("completed");
    let mut abandoned = BTreeSet::new();
    for n in 0..5 {
        let claim = claimed(
            &engine,
            &clock,
            &format!("gone-{n}"),
            Duration::from_secs(5),
        )
        .await;
        abandoned.insert(claim.id.as_str().to_owned());
    }
    // Its record expires (by the engine's clock) before the walk.
    let mut expiring = claim_at(
        &engine.record_id("t", "expired"),
        &clock,
        "expired",
        1,
        Duration::from_secs(5),
    );
    expiring.expiration_s = clock.now_ms() / 1000 + 30;
    landed(
        engine.store().claim(&expiring).await.expect("claim"),
        &expiring.owner,
    );
    let elsewhere = claim_at(
        &RecordId::new("abandoned-other", "t", "x"),
        &clock,
        "elsewhere",
        1,
        Duration::from_secs(5),
    );
    landed(
        engine.store().claim(&elsewhere).await.expect("claim"),
        &elsewhere.owner,
    );
    clock.advance(Duration::from_secs(60));
    // Lapsed 1 s ago: abandoned, but not for longer than `older_than`.
    claimed(&engine, &clock, "lapsed-just-now", Duration::ZERO).await;
    claimed(&engine, &clock, "live", Duration::from_secs(600)).await;
    clock.advance(Duration::from_secs(1));

    for limit in [1, 2, 100] {
        let (ids, pages) = walk(&engine, Duration::from_secs(10), limit).await;
        let found: BTreeSet<String> = ids.iter().cloned().collect();
        assert_eq!(found, abandoned, "limit {limit}");
        if limit == 1 {
            assert!(pages >= 5, "one record a page: {pages} pages");
        }
    }
    let (ids, _) = walk(&engine, Duration::ZERO, 100).await;
    assert_eq!(ids.len(), 6, "with the one lapsed just now: {ids:?}");
}

/// `report` writes nothing; `release` deletes the record, and the next
/// request runs as a first attempt; `fail` completes it with the answer,
/// which every retry gets without running, and the zombie's late
/// completion is refused.
pub async fn the_completer_settles_abandoned_claims_by_policy<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .key_prefix("abandoned-policy")
        .build();
    let reported = claimed(&engine, &clock, "reported", Duration::from_secs(5)).await;
    clock.advance(Duration::from_secs(6));

    let report = engine
        .complete_abandoned(&Completer::new(AbandonedPolicy::Report))
        .await
        .expect("report");
    assert_eq!(report.count("reported"), 1, "{report:?}");
    assert!(report.walked_all);
    let record = engine
        .inspect("t", "reported")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(record.owner, reported.owner, "report writes nothing");

    let runs = Arc::new(AtomicUsize::new(0));
    let report = engine
        .complete_abandoned(&Completer::new(AbandonedPolicy::Release))
        .await
        .expect("release");
    assert_eq!(report.count("released"), 1, "{report:?}");
    assert_eq!(engine.inspect("t", "reported").await.expect("read"), None);
    let again = engine
        .execute(&Attempt::new("t", "reported", payload(1)), charge(&runs, 1))
        .await
        .expect("runs");
    assert_eq!(again.kind(), OutcomeKind::Fresh, "a first attempt again");

    let zombie = claimed(&engine, &clock, "failed", Duration::from_secs(5)).await;
    clock.advance(Duration::from_secs(6));
    let answer = serde_json::to_vec(&Charge {
        id: "abandoned".into(),
        amount: 0,
    })
    .expect("json");
    let report = engine
        .complete_abandoned(&Completer::new(AbandonedPolicy::Fail {
            answer: answer.clone(),
        }))
        .await
        .expect("fail");
    assert_eq!(report.count("failed"), 1, "{report:?}");
    assert_eq!(report.settled[0].record.id, zombie.id);
    let retry = engine
        .execute(&Attempt::new("t", "failed", payload(1)), charge(&runs, 1))
        .await
        .expect("replayed");
    assert_eq!(retry.kind(), OutcomeKind::Replay);
    assert_eq!(retry.into_value().id, "abandoned");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the released key ran");
    match engine
        .store()
        .complete(completion(&zombie, &clock, b"late", Vec::new()))
        .await
        .expect("the zombie's completion")
    {
        Conditional::Refused(Some(record)) => assert_eq!(record.status, Status::Completed),
        other => panic!("the zombie's completion landed: {other:?}"),
    }
    let report = engine
        .complete_abandoned(&Completer::new(AbandonedPolicy::Report))
        .await
        .expect("report");
    assert!(report.settled.is_empty(), "nothing left: {report:?}");
}

/// A claim listed as abandoned whose owner extends its lease before the
/// completer's write (its heartbeat came back) is left to it: the
/// completer's takeover is refused, and nothing is written.
pub async fn a_claim_that_came_back_is_left_alone<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .key_prefix("abandoned-back")
        .build();
    let claim = claimed(&engine, &clock, "back", Duration::from_secs(5)).await;
    clock.advance(Duration::from_secs(6));
    let listed = listed(&engine, 10).await;
    assert_eq!(listed.len(), 1);
    let now_ms = clock.now_ms();
    let extension = crate::store::Extension {
        id: claim.id.clone(),
        owner: claim.owner.clone(),
        lease_until_ms: now_ms + 30_000,
        expiration_s: claim.expiration_s,
        now_ms,
    };
    landed(
        engine.store().extend(&extension).await.expect("extend"),
        &claim.owner,
    );
    for policy in [
        AbandonedPolicy::Release,
        AbandonedPolicy::Fail {
            answer: b"{}".to_vec(),
        },
    ] {
        let settled = engine.settle_abandoned(&listed[0], &policy).await;
        assert!(
            matches!(settled.settlement, Settlement::Lost(Some(_))),
            "{policy:?}: {settled:?}"
        );
    }
    let record = engine
        .inspect("t", "back")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(record.owner, claim.owner);
    assert_eq!(record.status, Status::InProgress);
}

/// `count` claims written, then abandoned, and the walk that lists them.
async fn abandoned_claims<St: Store>(
    engine: &Engine<St>,
    clock: &ManualClock,
    count: usize,
) -> Vec<crate::store::Record> {
    for n in 0..count {
        claimed(engine, clock, &format!("race-{n}"), Duration::from_secs(5)).await;
    }
    clock.advance(Duration::from_secs(6));
    let listed = listed(engine, count).await;
    assert_eq!(listed.len(), count);
    listed
}

/// Every abandoned claim of `engine`'s, walked in pages of `limit`: a page
/// may hold fewer than its limit (Redis's `SCAN`; a cluster's first
/// primary may hold none of them), and `SCAN` may list one twice.
async fn listed<St: Store>(engine: &Engine<St>, limit: usize) -> Vec<crate::store::Record> {
    let (mut listed, mut cursor) = (Vec::new(), None);
    loop {
        let page = engine
            .list_abandoned(Duration::ZERO, limit, cursor)
            .await
            .expect("list");
        listed.extend(page.records);
        cursor = page.next;
        if cursor.is_none() {
            break;
        }
    }
    listed.sort_by(|a, b| a.id.as_str().cmp(b.id.as_str()));
    listed.dedup_by(|a, b| a.id == b.id);
    listed
}

/// What became of one key when the completer and its retry raced.
struct Race {
    key: String,
    settled: Settled,
    outcome: Result<OutcomeKind, Error<Declined>>,
    runs: usize,
}

/// How many keys the completer races their retries on.
const KEYS: usize = 16;

/// `KEYS` claims abandoned, then for each at once the completer settling it
/// by `policy` and its retry taking it over, each on a task of its own: on
/// a multi-threaded runtime they run at once, interleaving at every store
/// call; which is spawned first alternates from key to key.
async fn raced<St: Store>(
    engine: &Engine<St>,
    clock: &ManualClock,
    policy: AbandonedPolicy,
) -> Vec<Race> {
    let mut races = Vec::new();
    for (n, record) in abandoned_claims(engine, clock, KEYS)
        .await
        .into_iter()
        .enumerate()
    {
        // The claims are written with their key as their owner token.
        let key = record.owner.as_str().to_owned();
        let (engine, policy) = (engine.clone(), policy.clone());
        races.push(tokio::spawn(async move {
            let runs = Arc::new(AtomicUsize::new(0));
            let completer = {
                let engine = engine.clone();
                async move { engine.settle_abandoned(&record, &policy).await }
            };
            let retry = {
                let (engine, runs, key) = (engine.clone(), Arc::clone(&runs), key.clone());
                async move {
                    let attempt = Attempt::new("t", &key, payload(1));
                    engine.execute(&attempt, charge(&runs, 1)).await
                }
            };
            let (completer, retry) = if n % 2 == 0 {
                let completer = tokio::spawn(completer);
                (completer, tokio::spawn(retry))
            } else {
                let retry = tokio::spawn(retry);
                (tokio::spawn(completer), retry)
            };
            let retried = retry.await.expect("the retry");
            let settled = completer.await.expect("the completer");
            Race {
                key,
                settled,
                outcome: retried.map(|outcome| outcome.kind()),
                runs: runs.load(Ordering::SeqCst),
            }
        }));
    }
    let mut finished = Vec::new();
    for race in races {
        finished.push(race.await.expect("a race"));
    }
    assert_eq!(finished.len(), KEYS);
    finished
}

/// A completer failing abandoned claims while their retries take them
/// over, at once: for each key one of the two wins the takeover, never
/// both. A key the completer failed never ran again and replays its
/// answer; a key whose retry won ran once and the completer wrote nothing.
pub async fn the_completer_and_a_retry_never_both_own_a_claim<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .key_prefix("abandoned-race")
        .build();
    let answer = serde_json::to_vec(&Charge {
        id: "abandoned".into(),
        amount: 0,
    })
    .expect("json");
    let races = raced(&engine, &clock, AbandonedPolicy::Fail { answer }).await;
    let (mut failed, mut retried) = (0, 0);
    for Race {
        key,
        settled,
        outcome,
        runs,
    } in races
    {
        match settled.settlement {
            Settlement::Failed => {
                failed += 1;
                assert_eq!(runs, 0, "{key}: failed by the completer, and ran");
                assert!(
                    matches!(
                        outcome.as_ref().map_err(|error| error.kind()),
                        Ok(OutcomeKind::Replay) | Err(ErrorKind::InProgress)
                    ),
                    "{key}: {outcome:?}"
                );
            }
            Settlement::Lost(_) => {
                retried += 1;
                assert_eq!(runs, 1, "{key}: the retry won, and did not run");
                assert!(
                    matches!(outcome, Ok(OutcomeKind::Fresh)),
                    "{key}: {outcome:?}"
                );
            }
            other => panic!("{key}: {other:?}"),
        }
        let record = engine
            .inspect("t", &key)
            .await
            .expect("read")
            .expect("kept");
        assert_eq!(record.status, Status::Completed, "{key}");
        let stored: Charge =
            serde_json::from_slice(record.response.as_deref().expect("a response"))
                .expect("a charge");
        assert_eq!(
            stored.id == "abandoned",
            runs == 0,
            "{key}: the record holds the winner's answer"
        );
    }
    assert_eq!(failed + retried, KEYS);
}

/// `release` never deletes a record that holds steps: it is left lapsed,
/// unwritten, and the next request takes it over and resumes after them.
/// For stores that record steps.
pub async fn release_keeps_a_record_with_steps<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .key_prefix("abandoned-steps")
        .build();
    let claim = claimed(&engine, &clock, "stepped", Duration::from_secs(5)).await;
    let step = StepWrite::new(
        claim.id.clone(),
        claim.owner.clone(),
        0,
        "charge",
        b"\"ch_1\"".to_vec(),
        clock.now_ms(),
    );
    landed(
        engine.store().record_step(&step).await.expect("a step"),
        &claim.owner,
    );
    clock.advance(Duration::from_secs(6));
    let report = engine
        .complete_abandoned(&Completer::new(AbandonedPolicy::Release))
        .await
        .expect("release");
    assert_eq!(report.count("kept_for_steps"), 1, "{report:?}");
    assert_eq!(report.settled[0].steps, ["charge"]);
    let record = engine
        .inspect("t", "stepped")
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(record.owner, claim.owner, "nothing written");

    let charges = Arc::new(AtomicUsize::new(0));
    let outcome = engine
        .run(
            &Attempt::new("t", "stepped", payload(1)),
            Mode::Plain,
            &Json,
            |handle| {
                let charges = Arc::clone(&charges);
                async move {
                    let charge: String = handle
                        .step("charge", || async move {
                            charges.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, Declined>("ch_2".to_owned())
                        })
                        .await?;
                    Ok::<_, Error<Declined>>((charge, Vec::new()))
                }
            },
        )
        .await
        .expect("resumed");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    assert_eq!(outcome.into_value(), "ch_1", "the recorded step's output");
    assert_eq!(
        charges.load(Ordering::SeqCst),
        0,
        "the step did not run again"
    );
}

/// A completer releasing abandoned claims while their retries take them
/// over, at once: the delete is fenced on the completer's own takeover, so
/// it never deletes the claim of a retry that won, whose completion then
/// lands. A retry runs at most once, and when it ran its record holds its
/// outcome.
pub async fn the_completer_releasing_never_deletes_a_retrys_claim<St: Store>(store: St) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .key_prefix("abandoned-release-race")
        .build();
    for Race {
        key,
        settled,
        outcome,
        runs,
    } in raced(&engine, &clock, AbandonedPolicy::Release).await
    {
        assert!(
            matches!(
                settled.settlement,
                Settlement::Released | Settlement::Lost(_)
            ),
            "{key}: {settled:?}"
        );
        match outcome.as_ref().map_err(|error| error.kind()) {
            Ok(OutcomeKind::Fresh) => assert_eq!(runs, 1, "{key}"),
            // The completer held the key when the retry came.
            Err(ErrorKind::InProgress) => assert_eq!(runs, 0, "{key}"),
            other => panic!("{key}: {other:?} ({settled:?})"),
        }
        let record = engine.inspect("t", &key).await.expect("read");
        if runs == 1 {
            let record = record.expect("the retry's record");
            assert_eq!(record.status, Status::Completed, "{key}");
        } else {
            assert_eq!(record, None, "{key}: released");
        }
    }
}
