//! The Redis store against a real redis-server: the whole conformance kit
//! (no single write: Redis cannot hold the handler's writes), expiry by
//! Redis itself, bad hashes.
//!
//! Needs `IDEMPOTENCY_TEST_REDIS_URL`; `make test` starts a server
//! (`scripts/with-redis`) and provides it.

use lambda_idempotency::{
    store::redis::RedisStore,
    testing::scenarios::{payload, Declined},
    Attempt, Engine, ErrorKind,
};
use std::sync::atomic::{AtomicUsize, Ordering};

fn url() -> String {
    std::env::var("IDEMPOTENCY_TEST_REDIS_URL").unwrap_or_else(|_| {
        panic!(
            "IDEMPOTENCY_TEST_REDIS_URL is not set: run these tests with `make test`, or \
             `scripts/with-redis cargo test --test redis` (it starts a throwaway server)"
        )
    })
}

static NAMESPACES: AtomicUsize = AtomicUsize::new(0);

/// A namespace of its own on the shared server.
fn namespace() -> String {
    let n = NAMESPACES.fetch_add(1, Ordering::SeqCst);
    format!("test-{}-{n}:", std::process::id())
}

async fn store() -> RedisStore {
    RedisStore::open(&url())
        .expect("url")
        .namespace(namespace())
}

async fn raw() -> redis::aio::MultiplexedConnection {
    redis::Client::open(url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect")
}

lambda_idempotency::store_conformance! {
    store: store(),
    unavailable: async {
        // A closed port: the first call cannot connect.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        RedisStore::open(&format!("redis://127.0.0.1:{port}")).expect("url")
    },
}

#[tokio::test]
async fn records_expire_in_redis_itself() {
    let namespace = namespace();
    let store = RedisStore::open(&url()).expect("url").namespace(&namespace);
    let engine = Engine::builder(store).key_prefix("ttl").build();
    engine
        .execute(&Attempt::new("t", "k", payload(1)), || async {
            Ok::<_, Declined>(1u8)
        })
        .await
        .expect("completed");
    let key = format!("{namespace}{}", engine.record_id("t", "k"));
    let mut connection = raw().await;
    let expire_at_ms: i64 = redis::cmd("PEXPIRETIME")
        .arg(&key)
        .query_async(&mut connection)
        .await
        .expect("pexpiretime");
    let record = engine
        .inspect("t", "k")
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(
        expire_at_ms,
        ((record.expiration_s + 1) * 1000) as i64,
        "Redis deletes it when it expires"
    );
}

#[tokio::test]
async fn a_corrupt_hash_is_an_error_never_a_replay() {
    let namespace = namespace();
    let store = RedisStore::open(&url()).expect("url").namespace(&namespace);
    let engine = Engine::builder(store).key_prefix("bad").build();
    let attempt = Attempt::new("t", "k", payload(1));
    engine
        .execute(&attempt, || async { Ok::<_, Declined>(1u8) })
        .await
        .expect("first");
    let key = format!("{namespace}{}", engine.record_id("t", "k"));
    let mut connection = raw().await;
    let _: () = redis::cmd("HDEL")
        .arg(&key)
        .arg("response")
        .query_async(&mut connection)
        .await
        .expect("hdel");
    let result = engine
        .execute(&attempt, || async { Ok::<_, Declined>(2u8) })
        .await;
    assert_eq!(result.map_err(|e| e.kind()), Err(ErrorKind::CorruptRecord));
}
