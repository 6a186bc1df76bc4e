//! `EngineBuilder::read_before_claim` on DynamoDB Local (and the in-memory
//! store, for a custom store and a stale replica with clocks that
//! disagree): what is answered from the read, what goes to the claim, with
//! compression, `forget`, the cache, single write, the HTTP layer and
//! `split`. (From an outside review; the stale replica's case failed
//! before the expiry margin.)

mod support;

use lambda_http::{
    http::{self, header, StatusCode},
    Body, Request, Response,
};
use lambda_idempotency::{
    http::{CommitWith, IdempotencyLayer, REPLAYED_HEADER},
    split::{self, SplitAttempt, SplitClaim},
    store::{
        Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId, Removal,
        Store,
    },
    testing::ManualClock,
    Attempt, DynamoDbStore, Engine, Error, Fingerprint, Json, MemoryStore, OutcomeKind, StoreError,
};
use std::{
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use tower::{service_fn, Layer, ServiceExt};

#[derive(Debug)]
struct Failed;

fn fp(n: u8) -> Fingerprint {
    Fingerprint::of_bytes(&[n])
}

async fn ddb(counted: bool) -> (DynamoDbStore, Option<support::CallCounter>) {
    if counted {
        let (client, counter) = support::counted_client();
        let table = support::create_idempotency_table(&client).await;
        (DynamoDbStore::new(client, table), Some(counter))
    } else {
        let client = support::client();
        let table = support::create_idempotency_table(&client).await;
        (DynamoDbStore::new(client, table), None)
    }
}

fn counter(runs: &Arc<AtomicUsize>) -> Arc<AtomicUsize> {
    Arc::clone(runs)
}

/// A compressed 20 KB response replays from one eventually consistent
/// GetItem, no conditional write, and byte for byte.
#[tokio::test]
async fn compressed_replay_is_one_get_and_byte_exact() {
    let (store, calls) = ddb(true).await;
    let calls = calls.unwrap();
    let store = store.compress_responses_above(64);
    let engine = Engine::builder(store).read_before_claim(true).build();
    let big: String = (0..20_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("s", "big", fp(1));
    let r = counter(&runs);
    let b = big.clone();
    let first = engine
        .execute(&attempt, || async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(b)
        })
        .await
        .expect("first");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    calls.reset();
    let r = counter(&runs);
    let replay = engine
        .execute(&attempt, || async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(String::new())
        })
        .await
        .expect("replay");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value(), &big);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let ops = calls.by_operation();
    assert_eq!(ops.get("GetItem").copied(), Some(1), "{ops:?}");
    assert_eq!(ops.get("PutItem"), None, "{ops:?}");

    // Another payload: 422 from the read, nothing runs, no write.
    calls.reset();
    let reused = engine
        .execute(&Attempt::new("s", "big", fp(2)), || async {
            Ok::<_, Failed>(String::new())
        })
        .await;
    assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
    let ops = calls.by_operation();
    assert_eq!(ops.get("PutItem"), None, "{ops:?}");
}

/// Expired, in progress, lapsed and missing records all go to the claim.
#[tokio::test]
async fn expired_in_progress_and_lapsed_go_to_the_claim() {
    let (store, _) = ddb(false).await;
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store.clone())
        .read_before_claim(true)
        .retention(Duration::from_secs(10))
        .clock(clock.clone())
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let op = |v: u32| {
        let r = counter(&runs);
        move || async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(v)
        }
    };
    let a = Attempt::new("s", "exp", fp(1));
    assert_eq!(
        engine.execute(&a, op(1)).await.unwrap().kind(),
        OutcomeKind::Fresh
    );
    assert_eq!(
        engine.execute(&a, op(2)).await.unwrap().kind(),
        OutcomeKind::Replay
    );
    // Right at the edge of the expiration second: still a replay.
    let id = engine.record_id("s", "exp");
    let rec = store
        .get(&id, clock.now_ms_for_test())
        .await
        .unwrap()
        .unwrap();
    clock.set(rec.expiration_s * 1000 + 999);
    let edge = engine.execute(&a, op(3)).await.unwrap();
    assert_eq!(
        edge.kind(),
        OutcomeKind::Replay,
        "not expired until past its second"
    );
    clock.set(rec.expiration_s * 1000 + 1000);
    let after = engine
        .execute(&Attempt::new("s", "exp", fp(9)), op(4))
        .await
        .unwrap();
    assert_eq!((after.kind(), *after.value()), (OutcomeKind::Fresh, 4));

    // A lapsed claim of another owner, written raw: taken over.
    let now = clock.now_ms_for_test();
    let lapsed = Claim {
        id: engine.record_id("s", "lapsed"),
        owner: OwnerToken::from_stored("someone-else"),
        fingerprint: fp(1),
        now_ms: now - 5_000,
        lease_until_ms: now - 1_000,
        expiration_s: now / 1000 + 100,
        attempt: 1,
        first_started_ms: now - 5_000,
    };
    assert_eq!(store.claim(&lapsed).await.unwrap(), Conditional::Applied);
    let taken = engine
        .run(
            &Attempt::new("s", "lapsed", fp(1)),
            lambda_idempotency::Mode::default(),
            &Json,
            |handle| async move {
                let t = handle.takeover().map(|t| t.attempt);
                Ok::<_, Failed>((t, Vec::new()))
            },
        )
        .await
        .expect("takeover");
    assert_eq!(*taken.value(), Some(2), "told it took over");

    // A live claim of another owner: 409, the operation does not run.
    let live = Claim {
        id: engine.record_id("s", "live"),
        owner: OwnerToken::from_stored("someone-else"),
        fingerprint: fp(1),
        now_ms: now,
        lease_until_ms: now + 60_000,
        expiration_s: now / 1000 + 100,
        attempt: 1,
        first_started_ms: now,
    };
    assert_eq!(store.claim(&live).await.unwrap(), Conditional::Applied);
    let before = runs.load(Ordering::SeqCst);
    let busy = engine
        .execute(&Attempt::new("s", "live", fp(1)), op(5))
        .await;
    assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
    assert_eq!(runs.load(Ordering::SeqCst), before);
}

trait NowForTest {
    fn now_ms_for_test(&self) -> u64;
}
impl NowForTest for ManualClock {
    fn now_ms_for_test(&self) -> u64 {
        lambda_idempotency::Clock::now_ms(self)
    }
}

/// forget, then a retry: runs again (DynamoDB Local reads are consistent).
#[tokio::test]
async fn forget_then_retry_runs_again() {
    let (store, _) = ddb(false).await;
    let engine = Engine::builder(store).read_before_claim(true).build();
    let a = Attempt::new("s", "forget", fp(1));
    let v = engine
        .execute(&a, || async { Ok::<_, Failed>(1u8) })
        .await
        .unwrap();
    assert_eq!(v.kind(), OutcomeKind::Fresh);
    engine.forget("s", "forget").await.unwrap();
    let again = engine
        .execute(&a, || async { Ok::<_, Failed>(2u8) })
        .await
        .unwrap();
    assert_eq!((again.kind(), *again.value()), (OutcomeKind::Fresh, 2));
}

/// forget with the in-process cache on: the cache is cleared in this
/// process, so the retry runs.
#[tokio::test]
async fn forget_with_cache_then_retry_runs_again() {
    let (store, _) = ddb(false).await;
    let engine = Engine::builder(store)
        .read_before_claim(true)
        .cache(16)
        .build();
    let a = Attempt::new("s", "forgetc", fp(1));
    engine
        .execute(&a, || async { Ok::<_, Failed>(1u8) })
        .await
        .unwrap();
    // Replayed through the read: remembered in the cache.
    let r = engine
        .execute(&a, || async { Ok::<_, Failed>(9u8) })
        .await
        .unwrap();
    assert!(r.is_replay(), "{:?}", r.kind());
    engine.forget("s", "forgetc").await.unwrap();
    let again = engine
        .execute(&a, || async { Ok::<_, Failed>(2u8) })
        .await
        .unwrap();
    assert_eq!((again.kind(), *again.value()), (OutcomeKind::Fresh, 2));
}

/// Single write on DynamoDB: a retry of a completed key does not run.
#[tokio::test]
async fn single_write_retry_does_not_run() {
    let (store, calls) = ddb(true).await;
    let calls = calls.unwrap();
    let engine = Engine::builder(store).read_before_claim(true).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let op = |v: u8| {
        let r = counter(&runs);
        move |_| async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>((v, Vec::new()))
        }
    };
    let a = Attempt::new("s", "sw", fp(1));
    let first = engine.run_single_write(&a, &Json, op(1)).await.unwrap();
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    calls.reset();
    let replay = engine.run_single_write(&a, &Json, op(2)).await.unwrap();
    assert_eq!((replay.kind(), *replay.value()), (OutcomeKind::Replay, 1));
    let reused = engine
        .run_single_write(&Attempt::new("s", "sw", fp(2)), &Json, op(3))
        .await;
    assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let ops = calls.by_operation();
    assert_eq!(ops.get("PutItem"), None, "{ops:?}");
    assert_eq!(ops.get("TransactWriteItems"), None, "{ops:?}");
}

fn post(key: &str, body: &str) -> Request {
    http::Request::post("/v1/charges")
        .header("idempotency-key", key)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::Text(body.to_owned()))
        .expect("request")
}

/// The HTTP layer over DynamoDB Local with the read: replay, 422, 409,
/// the handler runs once; and with the layer's single write, the retry
/// does not run the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_layer_with_the_read() {
    for single in [false, true] {
        let (store, calls) = ddb(true).await;
        let calls = calls.unwrap();
        let engine = Engine::builder(store).read_before_claim(true).build();
        let runs = Arc::new(AtomicUsize::new(0));
        let r = counter(&runs);
        let handler = service_fn(move |_req: Request| {
            let r = Arc::clone(&r);
            async move {
                let n = r.fetch_add(1, Ordering::SeqCst) + 1;
                tokio::time::sleep(Duration::from_millis(300)).await;
                let mut resp = Response::builder()
                    .status(201)
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::Text(format!(
                        "{{\"run\":{n},\"pad\":\"{}\"}}",
                        "x".repeat(6000)
                    )))
                    .unwrap();
                if single {
                    resp.extensions_mut().insert(CommitWith::<
                        aws_sdk_dynamodb::types::TransactWriteItem,
                    >(Vec::new()));
                }
                Ok::<_, lambda_http::Error>(resp)
            }
        });
        let layer = IdempotencyLayer::new(engine).shared_scope();
        let layer = if single { layer.single_write() } else { layer };
        let service = layer.layer(handler);
        // Concurrent duplicates first: one runs (without single write).
        let both = futures::future::join_all((0..3).map(|_| {
            let s = service.clone();
            async move { s.oneshot(post("k", r#"{"a":1}"#)).await.unwrap() }
        }))
        .await;
        let statuses: Vec<u16> = both.iter().map(|r| r.status().as_u16()).collect();
        if !single {
            assert_eq!(runs.load(Ordering::SeqCst), 1, "{statuses:?}");
            assert!(statuses.contains(&409), "{statuses:?}");
        }
        let runs_before = runs.load(Ordering::SeqCst);
        calls.reset();
        let replay = service
            .clone()
            .oneshot(post("k", r#"{ "a": 1 }"#))
            .await
            .unwrap();
        assert_eq!(replay.status(), StatusCode::CREATED, "single={single}");
        assert_eq!(replay.headers()[REPLAYED_HEADER], "true");
        let reused = service
            .clone()
            .oneshot(post("k", r#"{"a":2}"#))
            .await
            .unwrap();
        assert_eq!(
            reused.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "single={single}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            runs_before,
            "single={single}: nothing ran"
        );
        let ops = calls.by_operation();
        assert_eq!(ops.get("PutItem"), None, "single={single} {ops:?}");
        assert_eq!(
            ops.get("TransactWriteItems"),
            None,
            "single={single} {ops:?}"
        );
    }
}

/// split on DynamoDB with the read: own/other completed replays, own in
/// progress is ours, another's live claim is 409, release after completion
/// keeps the record, complete after release.
#[tokio::test]
async fn split_with_the_read() {
    let (store, _) = ddb(false).await;
    let engine = Engine::builder(store.clone())
        .read_before_claim(true)
        .build();
    let at = |key: &str, owner: &str| {
        SplitAttempt::new(
            "s",
            key.to_owned(),
            fp(1),
            OwnerToken::from_stored(owner),
            Duration::from_secs(30),
        )
    };
    let a = at("k", "exec-a");
    assert_eq!(
        split::claim::<_, u8>(&engine, &a, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    assert_eq!(
        split::claim::<_, u8>(&engine, &a, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    let b = at("k", "exec-b");
    let busy = split::claim::<_, u8>(&engine, &b, &Json).await;
    assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
    assert_eq!(
        split::complete(&engine, &a, serde_json::to_vec(&7u8).unwrap())
            .await
            .unwrap(),
        OutcomeKind::Fresh
    );
    // The retry of the completion (lost answer) is Fresh too.
    assert_eq!(
        split::complete(&engine, &a, serde_json::to_vec(&7u8).unwrap())
            .await
            .unwrap(),
        OutcomeKind::Fresh
    );
    assert_eq!(
        split::claim::<_, u8>(&engine, &a, &Json).await.unwrap(),
        SplitClaim::Replay(7)
    );
    assert_eq!(
        split::claim::<_, u8>(&engine, &b, &Json).await.unwrap(),
        SplitClaim::Replay(7)
    );
    // A release after completion leaves it.
    split::release(&engine, &a).await.unwrap();
    assert_eq!(
        split::claim::<_, u8>(&engine, &b, &Json).await.unwrap(),
        SplitClaim::Replay(7)
    );
    // Another fingerprint: 422.
    let other = SplitAttempt::new(
        "s",
        "k",
        fp(2),
        OwnerToken::from_stored("exec-c"),
        Duration::from_secs(30),
    );
    let reused = split::claim::<_, u8>(&engine, &other, &Json).await;
    assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");

    // complete after release: nothing stored, reported as not stored.
    let c = at("k2", "exec-c");
    assert_eq!(
        split::claim::<_, u8>(&engine, &c, &Json).await.unwrap(),
        SplitClaim::Ours
    );
    split::release(&engine, &c).await.unwrap();
    let late = split::complete(&engine, &c, serde_json::to_vec(&1u8).unwrap())
        .await
        .unwrap();
    assert_eq!(late, OutcomeKind::LeaseLost);
    assert!(store
        .get(
            &engine.record_id("s", "k2"),
            lambda_idempotency::Clock::now_ms(&lambda_idempotency::SystemClock)
        )
        .await
        .unwrap()
        .is_none());
}

/// A store implemented outside the crate, without `peek`: compiles, and
/// the read before the claim goes through its `get`.
#[derive(Clone, Default)]
struct Outside {
    inner: MemoryStore,
    gets: Arc<AtomicU64>,
    claims: Arc<AtomicU64>,
}

impl Store for Outside {
    type Write = lambda_idempotency::store::memory::MemoryWrite;
    const SINGLE_WRITE: bool = true;
    async fn claim(&self, c: &Claim) -> Result<Conditional, StoreError> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        self.inner.claim(c).await
    }
    async fn take_over(&self, c: &Claim, lapsed: &OwnerToken) -> Result<Conditional, StoreError> {
        self.inner.take_over(c, lapsed).await
    }
    async fn complete(&self, c: Completion<Self::Write>) -> Result<Conditional, StoreError> {
        self.inner.complete(c).await
    }
    async fn commit(&self, c: Commit<Self::Write>) -> Result<Conditional, StoreError> {
        self.inner.commit(c).await
    }
    async fn extend(&self, e: &Extension) -> Result<Conditional, StoreError> {
        self.inner.extend(e).await
    }
    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        self.inner.release(id, owner).await
    }
    async fn remove(&self, id: &RecordId, r: Removal) -> Result<Conditional, StoreError> {
        self.inner.remove(id, r).await
    }
    async fn list_in_progress(&self, p: &str, l: usize) -> Result<Vec<Record>, StoreError> {
        self.inner.list_in_progress(p, l).await
    }
    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        self.inner.get(id, now_ms).await
    }
}

#[tokio::test]
async fn a_store_outside_the_crate_reads_through_get() {
    let store = Outside::default();
    let engine = Engine::builder(store.clone())
        .read_before_claim(true)
        .build();
    let a = Attempt::new("s", "k", fp(1));
    engine
        .execute(&a, || async { Ok::<_, Failed>(1u8) })
        .await
        .unwrap();
    assert_eq!(store.claims.load(Ordering::SeqCst), 1);
    let r = engine
        .execute(&a, || async { Ok::<_, Failed>(2u8) })
        .await
        .unwrap();
    assert_eq!((r.kind(), *r.value()), (OutcomeKind::Replay, 1));
    assert_eq!(
        store.claims.load(Ordering::SeqCst),
        1,
        "no claim for the replay"
    );
    assert_eq!(store.gets.load(Ordering::SeqCst), 2);
}

/// A replica that lags: `peek` answers what `get` answered when the
/// snapshot was taken (DynamoDB's eventually consistent read).
#[derive(Clone, Default)]
struct Lagging {
    inner: MemoryStore,
    stale: Arc<Mutex<Option<Record>>>,
}

impl Store for Lagging {
    type Write = lambda_idempotency::store::memory::MemoryWrite;
    const SINGLE_WRITE: bool = true;
    async fn claim(&self, c: &Claim) -> Result<Conditional, StoreError> {
        self.inner.claim(c).await
    }
    async fn take_over(&self, c: &Claim, lapsed: &OwnerToken) -> Result<Conditional, StoreError> {
        self.inner.take_over(c, lapsed).await
    }
    async fn complete(&self, c: Completion<Self::Write>) -> Result<Conditional, StoreError> {
        self.inner.complete(c).await
    }
    async fn commit(&self, c: Commit<Self::Write>) -> Result<Conditional, StoreError> {
        self.inner.commit(c).await
    }
    async fn extend(&self, e: &Extension) -> Result<Conditional, StoreError> {
        self.inner.extend(e).await
    }
    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        self.inner.release(id, owner).await
    }
    async fn remove(&self, id: &RecordId, r: Removal) -> Result<Conditional, StoreError> {
        self.inner.remove(id, r).await
    }
    async fn list_in_progress(&self, p: &str, l: usize) -> Result<Vec<Record>, StoreError> {
        self.inner.list_in_progress(p, l).await
    }
    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        self.inner.get(id, now_ms).await
    }
    async fn peek(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let stale = self.stale.lock().unwrap().clone();
        match stale {
            Some(record) => Ok((!record.is_expired(now_ms)).then_some(record)),
            None => self.inner.get(id, now_ms).await,
        }
    }
}

/// Two processes whose clocks disagree by 3 s, over a replica that lags by
/// less than a second. The fast process sees record F1 expired, and writes
/// F2 in its place; a retry of F2 at the slow process a moment later reads
/// the stale F1 (unexpired by its clock) and gets a 422, where the claim
/// alone (which reads the primary) replays F2. "A stale read can only miss
/// a completed record" does not hold when the record was replaced after it
/// expired by another clock.
#[tokio::test]
async fn stale_read_with_skewed_clocks_answers_from_a_replaced_record() {
    let store = Lagging::default();
    let t0 = 1_800_000_000_000u64;
    let fast = ManualClock::new(t0 + 3_000);
    let slow = ManualClock::new(t0);
    let retention = Duration::from_secs(10);
    let build = |clock: &ManualClock, read: bool| {
        Engine::builder(store.clone())
            .retention(retention)
            .read_before_claim(read)
            .clock(clock.clone())
            .build()
    };
    let fast_engine = build(&fast, true);
    let a1 = Attempt::new("s", "k", fp(1));
    fast_engine
        .execute(&a1, || async { Ok::<_, Failed>(1u8) })
        .await
        .unwrap();
    let id = fast_engine.record_id("s", "k");
    let old = store
        .inner
        .get(&id, fast.now_ms_for_test())
        .await
        .unwrap()
        .unwrap();
    // Real time moves on 11.5 s: the fast clock says F1 expired.
    fast.advance(Duration::from_millis(11_500));
    slow.advance(Duration::from_millis(11_500));
    let a2 = Attempt::new("s", "k", fp(2));
    let fresh = fast_engine
        .execute(&a2, || async { Ok::<_, Failed>(2u8) })
        .await
        .unwrap();
    assert_eq!(fresh.kind(), OutcomeKind::Fresh);
    // The replica still holds F1 for a few hundred milliseconds.
    *store.stale.lock().unwrap() = Some(old);
    slow.advance(Duration::from_millis(200));
    let without = build(&slow, false)
        .execute(&a2, || async { Ok::<_, Failed>(99u8) })
        .await;
    let with = build(&slow, true)
        .execute(&a2, || async { Ok::<_, Failed>(99u8) })
        .await;
    let without = without.map(|o| (o.kind(), *o.value()));
    let with = with.map(|o| (o.kind(), *o.value()));
    assert!(
        matches!(without, Ok((OutcomeKind::Replay, 2))),
        "without the read: {without:?}"
    );
    assert!(
        matches!(with, Ok((OutcomeKind::Replay, 2))),
        "with the read: {with:?} (without it: {without:?})"
    );
}
