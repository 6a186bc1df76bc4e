//! `EngineBuilder::read_before_claim` on PostgreSQL and Redis (the default
//! `peek`, a strongly consistent get). (From an outside review.)

use lambda_idempotency::{
    store::{postgres::PostgresStore, redis::RedisStore, Claim, Conditional, OwnerToken, Store},
    testing::{CountingStore, ManualClock},
    Attempt, Clock, Engine, Error, Fingerprint, Json, OutcomeKind,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

#[derive(Debug)]
struct Failed;

fn fp(n: u8) -> Fingerprint {
    Fingerprint::of_bytes(&[n])
}

static N: AtomicUsize = AtomicUsize::new(0);

async fn pg() -> PostgresStore {
    let url =
        std::env::var("IDEMPOTENCY_TEST_POSTGRES_URL").expect("IDEMPOTENCY_TEST_POSTGRES_URL");
    let n = N.fetch_add(1, Ordering::SeqCst);
    let store =
        PostgresStore::connect(&url, format!("review_rbc_{}_{n}", std::process::id()), 4).unwrap();
    store.create_table().await.unwrap();
    store
}

fn redis() -> RedisStore {
    let url = std::env::var("IDEMPOTENCY_TEST_REDIS_URL").expect("IDEMPOTENCY_TEST_REDIS_URL");
    let n = N.fetch_add(1, Ordering::SeqCst);
    RedisStore::open(&url)
        .unwrap()
        .namespace(format!("review-rbc-{}-{n}", std::process::id()))
}

async fn everything<St: Store + Clone>(inner: St) {
    let store = CountingStore::new(inner);
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store.clone())
        .read_before_claim(true)
        .retention(Duration::from_secs(30))
        .clock(clock.clone())
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let op = |v: u32| {
        let r = Arc::clone(&runs);
        move || async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>(v)
        }
    };
    let a = Attempt::new("s", "k", fp(1));
    assert_eq!(
        engine.execute(&a, op(1)).await.unwrap().kind(),
        OutcomeKind::Fresh
    );
    let claims = store.calls().claim;
    let r = engine.execute(&a, op(2)).await.unwrap();
    assert_eq!((r.kind(), *r.value()), (OutcomeKind::Replay, 1));
    let k = engine.execute(&Attempt::new("s", "k", fp(2)), op(3)).await;
    assert!(matches!(k, Err(Error::KeyReused)), "{k:?}");
    assert_eq!(store.calls().claim, claims, "answered from the read");
    assert_eq!(runs.load(Ordering::SeqCst), 1);

    // Expired (Redis deletes on its own clock; the engine's clock decides
    // otherwise): runs again.
    clock.advance(Duration::from_secs(32));
    let e = engine
        .execute(&Attempt::new("s", "k", fp(2)), op(4))
        .await
        .unwrap();
    assert_eq!((e.kind(), *e.value()), (OutcomeKind::Fresh, 4));

    // Another's live claim: 409 through the claim.
    let now = clock.now_ms();
    let live = Claim {
        id: engine.record_id("s", "live"),
        owner: OwnerToken::from_stored("other"),
        fingerprint: fp(1),
        now_ms: now,
        lease_until_ms: now + 60_000,
        expiration_s: now / 1000 + 120,
        attempt: 1,
        first_started_ms: now,
    };
    assert_eq!(
        store.inner().claim(&live).await.unwrap(),
        Conditional::Applied
    );
    let busy = engine
        .execute(&Attempt::new("s", "live", fp(1)), op(5))
        .await;
    assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
    // Lapsed: taken over.
    clock.advance(Duration::from_secs(61));
    let t = engine
        .execute(&Attempt::new("s", "live", fp(1)), op(6))
        .await
        .unwrap();
    assert_eq!(*t.value(), 6);

    // forget, then the retry runs.
    engine.forget("s", "live").await.unwrap();
    let f = engine
        .execute(&Attempt::new("s", "live", fp(1)), op(7))
        .await
        .unwrap();
    assert_eq!((f.kind(), *f.value()), (OutcomeKind::Fresh, 7));
}

#[tokio::test]
async fn postgres_read_before_claim() {
    everything(pg().await).await;
}

#[tokio::test]
async fn redis_read_before_claim() {
    everything(redis()).await;
}

#[tokio::test]
async fn postgres_single_write_with_the_read() {
    let store = CountingStore::new(pg().await);
    let engine = Engine::builder(store.clone())
        .read_before_claim(true)
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let op = |v: u8| {
        let r = Arc::clone(&runs);
        move |_| async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Failed>((v, Vec::new()))
        }
    };
    let a = Attempt::new("s", "sw", fp(1));
    assert_eq!(
        engine
            .run_single_write(&a, &Json, op(1))
            .await
            .unwrap()
            .kind(),
        OutcomeKind::Fresh
    );
    let r = engine.run_single_write(&a, &Json, op(2)).await.unwrap();
    assert_eq!((r.kind(), *r.value()), (OutcomeKind::Replay, 1));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(store.calls().commit, 1);
}
