//! The Redis store on a Redis Cluster of three primaries: the whole
//! conformance kit, with every record on whichever node owns its slot.
//!
//! Needs `IDEMPOTENCY_TEST_REDIS_CLUSTER_URL`; `make test` starts the
//! cluster (`scripts/with-redis`) and provides it. The resharding and
//! failover race is in `redis_cluster_reshard.rs`, a binary of its own, so
//! that it never moves slots under these tests.

#[path = "support/redis_edges.rs"]
mod redis_edges;

use lambda_idempotency::{
    store::redis::RedisStore,
    testing::scenarios::{payload, Declined},
    Attempt, Engine, StoreErrorKind,
};
use std::sync::atomic::{AtomicUsize, Ordering};

fn cluster_url() -> String {
    std::env::var("IDEMPOTENCY_TEST_REDIS_CLUSTER_URL").unwrap_or_else(|_| {
        panic!(
            "IDEMPOTENCY_TEST_REDIS_CLUSTER_URL is not set: run these tests with `make test`, or \
             `scripts/with-redis cargo test --test redis_cluster` (it starts a throwaway cluster)"
        )
    })
}

static NAMESPACES: AtomicUsize = AtomicUsize::new(0);

fn namespace() -> String {
    let n = NAMESPACES.fetch_add(1, Ordering::SeqCst);
    format!("cluster-test-{}-{n}:", std::process::id())
}

async fn store() -> RedisStore {
    RedisStore::open(&cluster_url())
        .expect("url")
        .namespace(namespace())
}

lambda_idempotency::store_conformance! {
    store: store(),
    unavailable: async {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        RedisStore::open(&format!("redis+cluster://127.0.0.1:{port}")).expect("url")
    },
}

/// The completer's walk goes from primary to primary.
mod abandoned {
    use super::store;

    lambda_idempotency::store_conformance! {
        abandoned: store(),
    }
    lambda_idempotency::store_conformance! {
        abandoned_steps: store(),
    }
}

/// Recovery points: a key's steps live in its record's hash, on one slot.
mod steps {
    use super::store;

    lambda_idempotency::store_conformance! {
        steps: store(),
    }
}

#[tokio::test]
async fn records_spread_over_every_primary_and_are_found_again() {
    // Every node given as a seed, the API's way.
    let nodes = std::env::var("IDEMPOTENCY_TEST_REDIS_CLUSTER_NODES").expect("nodes");
    let urls: Vec<String> = nodes
        .split_whitespace()
        .map(|node| format!("redis://{node}"))
        .collect();
    let store = RedisStore::open_cluster(urls.iter().map(String::as_str))
        .expect("nodes")
        .namespace(namespace());
    let engine = Engine::builder(store).build();
    let runs = AtomicUsize::new(0);
    for round in 0..2 {
        for n in 0..60u64 {
            let key = format!("key-{n}");
            let attempt = Attempt::new("t", &key, payload(n));
            let outcome = engine
                .execute(&attempt, || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Declined>(n)
                })
                .await
                .expect("the cluster answers");
            assert_eq!((*outcome.value(), outcome.is_replay()), (n, round == 1));
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 60, "one run per key");

    // The 60 keys hash to slots of every primary: each answers DBSIZE > 0.
    for node in nodes.split_whitespace() {
        let mut connection = redis::Client::open(format!("redis://{node}"))
            .expect("url")
            .get_multiplexed_async_connection()
            .await
            .expect("connect");
        let role: Vec<redis::Value> = redis::cmd("ROLE")
            .query_async(&mut connection)
            .await
            .expect("role");
        if !matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
            continue;
        }
        let keys: u64 = redis::cmd("DBSIZE")
            .query_async(&mut connection)
            .await
            .expect("dbsize");
        assert!(keys > 0, "{node} holds records");
    }
}

#[test]
fn bad_urls_are_refused_at_start_up() {
    for url in [
        "memcached://127.0.0.1:11211",
        "127.0.0.1:6379",
        "redis+cluster://",
        "redis://127.0.0.1:notaport",
    ] {
        match RedisStore::open(url) {
            Err(error) => assert_eq!(
                error.kind(),
                StoreErrorKind::Misconfigured,
                "{url}: {error}"
            ),
            Ok(_) => panic!("{url} is refused"),
        }
    }
    match RedisStore::open_cluster([]) {
        Err(error) => assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}"),
        Ok(_) => panic!("a cluster without nodes is refused"),
    }
}

/// A raw connection to the cluster, to plant and read keys on whichever
/// node owns their slot.
async fn raw() -> redis::cluster_async::ClusterConnection {
    let nodes = std::env::var("IDEMPOTENCY_TEST_REDIS_CLUSTER_NODES").expect("nodes");
    redis::cluster::ClusterClient::new(
        nodes
            .split_whitespace()
            .map(|node| format!("redis://{node}"))
            .collect::<Vec<_>>(),
    )
    .expect("nodes")
    .get_async_connection()
    .await
    .expect("connect")
}

#[tokio::test]
async fn a_hash_with_a_field_no_record_holds_is_misconfigured_for_every_script() {
    redis_edges::a_hash_with_a_field_no_record_holds_is_misconfigured_for_every_script(
        &cluster_url(),
        namespace,
        &mut raw().await,
    )
    .await;
}

#[tokio::test]
async fn numbers_beyond_the_scripts_are_rejected_before_any_write() {
    redis_edges::numbers_beyond_the_scripts_are_rejected_before_any_write(
        &cluster_url(),
        &namespace(),
        &mut raw().await,
    )
    .await;
}

/// On a cluster, `DBSIZE` is asked of every primary and summed: at least
/// the records this test wrote, which hash to slots on every primary (the
/// other tests of this binary write beside it, so no exact count).
#[tokio::test]
async fn the_table_size_of_a_cluster_sums_its_primaries() {
    use lambda_idempotency::store::{Accuracy, SizeSource, Store};
    let store = store().await.owns_database();
    let engine = Engine::builder(store.clone()).build();
    for i in 0..30 {
        let key = format!("size-{i}");
        engine
            .execute(&Attempt::new("t", &key, payload(1)), || async {
                Ok::<_, Declined>(1u8)
            })
            .await
            .expect("a fresh key runs");
    }
    let size = store.table_size(0).await.unwrap().expect("counted");
    assert!(size.records >= 30, "{size:?}");
    assert_eq!(
        (size.accuracy, size.source),
        (Accuracy::Exact, SizeSource::DbSize)
    );
}
