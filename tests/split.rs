//! The split protocol (`lambda_idempotency::split`, as durable functions
//! use it) at its edges, on DynamoDB Local and the in-memory store: a
//! completion retried after its record expired, a claim after giving a
//! takeover back, leases at their bounds, owners racing. (From an outside
//! review; the first two failed before their fixes.)

mod support;

use lambda_idempotency::{
    split::{self, SplitAttempt, SplitClaim},
    store::{OwnerToken, Store},
    testing::ManualClock,
    Clock, DynamoDbStore, Engine, Error, Fingerprint, Json, MemoryStore, OutcomeKind,
};
use std::time::Duration;

fn at(key: &str, owner: &str, lease: Duration) -> SplitAttempt {
    SplitAttempt::new(
        "s",
        key.to_owned(),
        Fingerprint::of_bytes(b"p"),
        OwnerToken::from_stored(owner),
        lease,
    )
}

async fn ddb() -> DynamoDbStore {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    DynamoDbStore::new(client, table)
}

/// Before the refactor, `complete_durable` (now `complete_split`) took any
/// completed record under its own token as its own landed completion
/// (Fresh); `landed()` now asks the fence, which counts an expired record
/// as absent: a retry of the completion step after the record expired
/// reports LeaseLost ("the key was taken over; its output is not stored")
/// although the output was stored and nobody took anything over.
async fn completion_retry_after_expiry<St: Store + Clone>(store: St) {
    let clock = ManualClock::new(1_800_000_000_000);
    let engine = Engine::builder(store)
        .retention(Duration::from_secs(5))
        .clock(clock.clone())
        .build();
    let a = at("k", "exec-a", Duration::from_secs(2));
    assert_eq!(
        split::claim::<_, u8>(&engine, &a, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    let v = serde_json::to_vec(&1u8).unwrap();
    assert_eq!(
        split::complete(&engine, &a, v.clone()).await.unwrap(),
        OutcomeKind::Fresh
    );
    // Within retention, the retry is Fresh.
    assert_eq!(
        split::complete(&engine, &a, v.clone()).await.unwrap(),
        OutcomeKind::Fresh
    );
    clock.advance(Duration::from_secs(10));
    // What the store answers: its own completed record, refused.
    let raw = engine
        .store()
        .complete(lambda_idempotency::store::Completion {
            id: engine.record_id("s", "k"),
            owner: OwnerToken::from_stored("exec-a"),
            response: v.clone(),
            now_ms: clock.now_ms(),
            expiration_s: clock.now_ms() / 1000 + 5,
            writes: Vec::new(),
        })
        .await
        .unwrap();
    match &raw {
        lambda_idempotency::store::Conditional::Refused(Some(r)) => {
            assert_eq!(r.owner, OwnerToken::from_stored("exec-a"));
            assert_eq!(r.status, lambda_idempotency::store::Status::Completed);
        }
        other => panic!("the store answered {other:?}"),
    }
    let again = split::complete(&engine, &a, v).await.unwrap();
    assert_eq!(
        again,
        OutcomeKind::Fresh,
        "its own completion, landed earlier (expired since); nobody took the key over"
    );
}

#[tokio::test]
async fn completion_retry_after_expiry_memory() {
    completion_retry_after_expiry(MemoryStore::new()).await;
}

#[tokio::test]
async fn completion_retry_after_expiry_dynamodb() {
    completion_retry_after_expiry(ddb().await).await;
}

/// A takeover released by `split::release` is lapsed, not deleted. The
/// same owner claiming again gets `Ours` (its own claim), but the lease is
/// still in the past: another owner takes it over at once, and both run.
/// With a first attempt (deleted on release) the same sequence gives the
/// second owner `InProgress`.
async fn reclaim_after_releasing_a_takeover<St: Store + Clone>(store: St) {
    let clock = ManualClock::new(1_800_000_000_000);
    let engine = Engine::builder(store).clock(clock.clone()).build();
    let lease = Duration::from_secs(60);
    // A first attempt (deleted on release): the reference behaviour.
    let a1 = at("first", "exec-a", lease);
    assert_eq!(
        split::claim::<_, u8>(&engine, &a1, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    split::release(&engine, &a1).await.unwrap();
    assert_eq!(
        split::claim::<_, u8>(&engine, &a1, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    let b1 = split::claim::<_, u8>(&engine, &at("first", "exec-b", lease), &Json).await;
    assert!(
        matches!(b1, Err(Error::InProgress { .. })),
        "first attempt: {b1:?}"
    );

    // A takeover: X's claim lapses, A takes over (attempt 2), releases,
    // claims again.
    let x = at("k", "exec-x", Duration::from_secs(1));
    assert_eq!(
        split::claim::<_, u8>(&engine, &x, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    clock.advance(Duration::from_secs(2));
    let a = at("k", "exec-a", lease);
    assert_eq!(
        split::claim::<_, u8>(&engine, &a, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    split::release(&engine, &a).await.unwrap();
    assert_eq!(
        split::claim::<_, u8>(&engine, &a, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    clock.advance(Duration::from_millis(10));
    let b = split::claim::<_, u8>(&engine, &at("k", "exec-b", lease), &Json).await;
    assert!(
        matches!(b, Err(Error::InProgress { .. })),
        "A holds the key (split::claim said Ours), yet B got {b:?}"
    );
}

#[tokio::test]
async fn reclaim_after_releasing_a_takeover_memory() {
    reclaim_after_releasing_a_takeover(MemoryStore::new()).await;
}

#[tokio::test]
async fn reclaim_after_releasing_a_takeover_dynamodb() {
    reclaim_after_releasing_a_takeover(ddb().await).await;
}

/// Leases at the edges: 0 is 1 s (live at +1000 ms, lapsed at +1001 ms);
/// Duration::MAX is capped at MAX_DURATION and still claims and completes.
async fn lease_edges<St: Store + Clone>(store: St) {
    let clock = ManualClock::new(1_800_000_000_000);
    let engine = Engine::builder(store).clock(clock.clone()).build();
    let a = at("zero", "exec-a", Duration::ZERO);
    assert_eq!(
        split::claim::<_, u8>(&engine, &a, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    clock.advance(Duration::from_millis(1000));
    let b = split::claim::<_, u8>(&engine, &at("zero", "exec-b", Duration::ZERO), &Json).await;
    assert!(matches!(b, Err(Error::InProgress { .. })), "{b:?}");
    clock.advance(Duration::from_millis(1));
    let b = split::claim::<_, u8>(&engine, &at("zero", "exec-b", Duration::ZERO), &Json).await;
    assert_eq!(b.unwrap(), SplitClaim::Ours);
    // A's late completion is refused.
    assert_eq!(
        split::complete(&engine, &a, serde_json::to_vec(&1u8).unwrap())
            .await
            .unwrap(),
        OutcomeKind::LeaseLost
    );

    let m = at("max", "exec-m", Duration::MAX);
    assert_eq!(
        split::claim::<_, u8>(&engine, &m, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    let rec = engine
        .store()
        .get(&engine.record_id("s", "max"), clock.now_ms())
        .await
        .unwrap()
        .expect("record");
    assert!(rec.expiration_s > rec.lease_until_ms.unwrap() / 1000);
    let other = split::claim::<_, u8>(&engine, &at("max", "exec-n", Duration::MAX), &Json).await;
    assert!(matches!(other, Err(Error::InProgress { .. })), "{other:?}");
    assert_eq!(
        split::complete(&engine, &m, serde_json::to_vec(&2u8).unwrap())
            .await
            .unwrap(),
        OutcomeKind::Fresh
    );
    let replay = split::claim::<_, u8>(&engine, &at("max", "exec-n", Duration::MAX), &Json).await;
    assert_eq!(replay.unwrap(), SplitClaim::Replay(2));
}

#[tokio::test]
async fn lease_edges_memory() {
    lease_edges(MemoryStore::new()).await;
}

#[tokio::test]
async fn lease_edges_dynamodb() {
    lease_edges(ddb().await).await;
}

/// Owners racing for one key on DynamoDB Local: exactly one Ours.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_racing_dynamodb() {
    let engine = Engine::builder(ddb().await).read_before_claim(true).build();
    for round in 0..5 {
        let key = format!("race{round}");
        let results = futures::future::join_all((0..8).map(|i| {
            let engine = engine.clone();
            let a = at(&key, &format!("exec-{i}"), Duration::from_secs(60));
            tokio::spawn(async move { split::claim::<_, u8>(&engine, &a, &Json).await })
        }))
        .await;
        let ours = results
            .iter()
            .filter(|r| matches!(r.as_ref().unwrap(), Ok(SplitClaim::Ours)))
            .count();
        let busy = results
            .iter()
            .filter(|r| matches!(r.as_ref().unwrap(), Err(Error::InProgress { .. })))
            .count();
        assert_eq!((ours, busy), (1, 7), "{results:?}");
    }
}
