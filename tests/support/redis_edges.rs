//! Redis store edges shared by the single-server and the cluster tests
//! (`tests/redis.rs`, `tests/redis_cluster.rs`): hashes that are not
//! records, numbers the scripts cannot hold. Each takes the server's URL,
//! namespaces, and a raw connection to plant and read keys with.
#![allow(dead_code)]

use lambda_idempotency::{
    store::{
        redis::RedisStore, Claim, Completion, Conditional, Extension, OwnerToken, RecordId,
        Removal, Store,
    },
    testing::scenarios::{payload, Declined},
    Attempt, Clock, Engine, StoreError, StoreErrorKind, SystemClock,
};
use redis::aio::ConnectionLike;
use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

/// Every field of a valid `IN_PROGRESS` record whose lease has passed,
/// owned by `owner-a`: what `bad_hashes` breaks one field of.
fn lapsed_record_fields(id: &RecordId, now_ms: u64) -> Vec<(&'static str, String)> {
    vec![
        ("id", id.as_str().to_owned()),
        ("status", "IN_PROGRESS".to_owned()),
        ("owner", "owner-a".to_owned()),
        ("fingerprint", payload(1).as_str().to_owned()),
        ("expiration_s", (now_ms / 1000 + 3600).to_string()),
        ("lease_until_ms", (now_ms - 60_000).to_string()),
        ("created_at_ms", (now_ms - 120_000).to_string()),
        ("attempt", "1".to_owned()),
        ("first_started_ms", (now_ms - 120_000).to_string()),
    ]
}

fn claim_for(id: &RecordId, owner: &str, now_ms: u64) -> Claim {
    Claim {
        id: id.clone(),
        owner: OwnerToken::from_stored(owner),
        fingerprint: payload(1),
        now_ms,
        lease_until_ms: now_ms + 30_000,
        expiration_s: now_ms / 1000 + 3600,
        attempt: 2,
        first_started_ms: now_ms,
    }
}

/// A hash's fields (in order: a hash table's order moves as it rehashes)
/// and its TTL.
async fn hash_and_ttl<C: ConnectionLike + Send>(connection: &mut C, key: &str) -> Hash {
    let fields: std::collections::BTreeMap<String, Vec<u8>> = redis::cmd("HGETALL")
        .arg(key)
        .query_async(connection)
        .await
        .expect("hgetall");
    let ttl: i64 = redis::cmd("PTTL")
        .arg(key)
        .query_async(connection)
        .await
        .expect("pttl");
    (fields, ttl)
}

type Hash = (std::collections::BTreeMap<String, Vec<u8>>, i64);

/// The same fields, and a TTL nobody set again: none (-1) where there was
/// none, and only counted down where there was one.
fn assert_untouched(before: &Hash, after: &Hash, what: &str) {
    assert_eq!(
        before.0, after.0,
        "{what}: the fields are left as they were"
    );
    if before.1 < 0 {
        assert_eq!(before.1, after.1, "{what}: no TTL was set");
    } else {
        assert!(
            after.1 <= before.1 && after.1 > before.1 - 5_000,
            "{what}: the TTL was not set again: {} then {}",
            before.1,
            after.1
        );
    }
}

/// A hash in the namespace with a record's fields but one of them not what
/// a record holds (an `expiration_s` or a `lease_until_ms` that is not a
/// number, an unknown status): every script and both reads answer
/// Misconfigured, nothing runs even with fail-open, and the hash is left
/// exactly as it was (no field, no TTL written).
pub async fn a_hash_with_a_field_no_record_holds_is_misconfigured_for_every_script<C>(
    url: &str,
    namespace: impl Fn() -> String,
    connection: &mut C,
) where
    C: ConnectionLike + Send,
{
    for (field, value) in [
        ("expiration_s", "soon"),
        ("lease_until_ms", "later"),
        ("status", "PAUSED"),
        ("expiration_s", "1e3"),
    ] {
        let what = format!("{field} = {value:?}");
        let namespace = namespace();
        let store = RedisStore::open(url).expect("url").namespace(&namespace);
        let engine = Engine::builder(store.clone())
            .key_prefix("bad")
            .fail_open(true)
            .build();
        let id = engine.record_id("t", "k");
        let key = format!("{namespace}{id}");
        let now_ms = SystemClock.now_ms();
        let mut plant = redis::cmd("HSET");
        plant.arg(&key);
        for (name, good) in lapsed_record_fields(&id, now_ms) {
            plant.arg(name).arg(if name == field {
                value.to_owned()
            } else {
                good
            });
        }
        let _: () = plant.query_async(connection).await.expect("plant");
        let before = hash_and_ttl(connection, &key).await;

        let runs = AtomicUsize::new(0);
        let result = engine
            .execute(&Attempt::new("t", "k", payload(1)), || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Declined>(1u8)
            })
            .await;
        match result {
            Err(lambda_idempotency::Error::Store(error)) => {
                assert_eq!(
                    error.kind(),
                    StoreErrorKind::Misconfigured,
                    "{what}: claim: {error}"
                );
                assert!(
                    error.to_string().contains("not an idempotency record"),
                    "{what}: {error}"
                );
            }
            other => panic!("{what}: claim: {other:?}"),
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "{what}: fail-open runs nothing"
        );

        let owner = OwnerToken::from_stored("owner-a");
        let claim = claim_for(&id, "owner-b", now_ms);
        let outcomes: Vec<(&str, Result<Conditional, StoreError>)> = vec![
            ("take over", store.take_over(&claim, &owner).await),
            (
                "extend",
                store
                    .extend(&Extension {
                        id: id.clone(),
                        owner: owner.clone(),
                        lease_until_ms: now_ms + 60_000,
                        expiration_s: now_ms / 1000 + 7200,
                        now_ms,
                    })
                    .await,
            ),
            (
                "complete",
                store
                    .complete(Completion {
                        id: id.clone(),
                        owner: owner.clone(),
                        response: b"{}".to_vec(),
                        now_ms,
                        expiration_s: now_ms / 1000 + 7200,
                        writes: Vec::new(),
                    })
                    .await,
            ),
            ("release", store.release(&id, &owner).await),
            ("remove", store.remove(&id, Removal::Any).await),
            (
                "remove unless in progress",
                store.remove(&id, Removal::UnlessInProgress).await,
            ),
            (
                "get",
                store.get(&id, now_ms).await.map(|_| Conditional::Applied),
            ),
            (
                "list in progress",
                store
                    .list_in_progress("", 10)
                    .await
                    .map(|_| Conditional::Applied),
            ),
        ];
        for (operation, outcome) in outcomes {
            match outcome {
                Err(error) => assert_eq!(
                    error.kind(),
                    StoreErrorKind::Misconfigured,
                    "{what}: {operation}: {error}"
                ),
                Ok(answer) => panic!("{what}: {operation} answered {answer:?}"),
            }
        }
        assert_untouched(&before, &hash_and_ttl(connection, &key).await, &what);
    }
}

/// A number the scripts cannot hold exactly (Lua numbers are doubles), or
/// an expiration whose expiry overflows: `Rejected`, and nothing written:
/// no claim left without a TTL, no record touched.
pub async fn numbers_beyond_the_scripts_are_rejected_before_any_write<C>(
    url: &str,
    namespace: &str,
    connection: &mut C,
) where
    C: ConnectionLike + Send,
{
    let store = RedisStore::open(url).expect("url").namespace(namespace);
    let now_ms = SystemClock.now_ms();
    let beyond = 1u64 << 53;

    // retention(Duration::MAX) never reaches the store: the engine refuses
    // it when it is built. The store's own check below covers every other
    // caller of the SPI.
    let refused = Engine::builder(store.clone())
        .retention(Duration::MAX)
        .try_build();
    assert!(
        refused.is_err(),
        "retention(Duration::MAX) is refused at build time"
    );

    // Each number of a claim, beyond 2^53 - 1: refused, nothing written.
    let id = RecordId::new("range", "t", "claim");
    let key = format!("{namespace}{id}");
    let good = claim_for(&id, "owner-a", now_ms);
    let mut bad_claims = Vec::new();
    for change in [
        |c: &mut Claim| c.expiration_s = u64::MAX,
        |c: &mut Claim| c.expiration_s = (1 << 53) / 1000,
        |c: &mut Claim| c.lease_until_ms = 1 << 53,
        |c: &mut Claim| c.now_ms = u64::MAX,
        |c: &mut Claim| c.first_started_ms = 1 << 53,
    ] {
        let mut claim = good.clone();
        change(&mut claim);
        bad_claims.push(claim);
    }
    for claim in &bad_claims {
        let error = store.claim(claim).await.expect_err("refused");
        assert_eq!(error.kind(), StoreErrorKind::Rejected, "{claim:?}: {error}");
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&key)
            .query_async(connection)
            .await
            .expect("exists");
        assert_eq!(exists, 0, "{claim:?}: nothing written");
    }

    // On a live claim: a takeover, an extension and a completion beyond
    // range are refused, and the claim is left as it was.
    assert_eq!(
        store.claim(&good).await.expect("claim"),
        Conditional::Applied
    );
    let before = hash_and_ttl(connection, &key).await;
    let mut takeover = claim_for(&id, "owner-b", now_ms + 60_000);
    takeover.expiration_s = u64::MAX;
    let extension = Extension {
        id: id.clone(),
        owner: good.owner.clone(),
        lease_until_ms: beyond,
        expiration_s: good.expiration_s,
        now_ms,
    };
    let completion = Completion {
        id: id.clone(),
        owner: good.owner.clone(),
        response: b"{}".to_vec(),
        now_ms,
        expiration_s: u64::MAX,
        writes: Vec::new(),
    };
    for (operation, outcome) in [
        ("take over", store.take_over(&takeover, &good.owner).await),
        ("extend", store.extend(&extension).await),
        ("complete", store.complete(completion).await),
    ] {
        match outcome {
            Err(error) => assert_eq!(
                error.kind(),
                StoreErrorKind::Rejected,
                "{operation}: {error}"
            ),
            Ok(answer) => panic!("{operation}: {answer:?}"),
        }
    }
    assert_untouched(
        &before,
        &hash_and_ttl(connection, &key).await,
        "a live claim",
    );
    assert!(before.1 > 0, "the claim has its TTL");
}
