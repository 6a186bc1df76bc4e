//! The Redis store against a real redis-server: the whole conformance kit
//! (no single write: Redis cannot hold the handler's writes), expiry by
//! Redis itself, bad hashes.
//!
//! Needs `IDEMPOTENCY_TEST_REDIS_URL`; `make test` starts a server
//! (`scripts/with-redis`) and provides it.

#[path = "support/redis_edges.rs"]
mod redis_edges;
#[path = "support/table_size.rs"]
mod table_size;

use lambda_idempotency::{
    store::redis::RedisStore,
    testing::{
        scenarios::{payload, Declined},
        ManualClock,
    },
    Attempt, Clock, Engine, ErrorKind, StoreErrorKind, SystemClock,
};
use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::Duration,
};

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

/// The completer: abandoned claims found by `SCAN` pages, settled by
/// takeovers.
mod abandoned {
    use super::store;

    lambda_idempotency::store_conformance! {
        abandoned: store(),
    }
    lambda_idempotency::store_conformance! {
        abandoned_steps: store(),
    }
}

/// Recovery points: each step one fenced script on the record's hash.
mod steps {
    use super::RedisStore;
    use super::{namespace, raw, store, url};
    use lambda_idempotency::{testing::scenarios::payload, Attempt, Engine, Json, Mode};
    use redis::AsyncCommands;
    use std::collections::HashMap;

    lambda_idempotency::store_conformance! {
        steps: store(),
    }

    /// The record's hash, read raw.
    async fn hash(key: &str) -> HashMap<String, Vec<u8>> {
        raw().await.hgetall(key).await.expect("HGETALL")
    }

    /// While in progress the hash holds the steps (a count, a name and an
    /// output each); the completion removes them, so a replay does not
    /// read them.
    #[tokio::test]
    async fn steps_live_in_the_hash_until_its_completion() {
        let namespace = namespace();
        let store = RedisStore::open(&url()).expect("url").namespace(&namespace);
        let engine = Engine::builder(store).build();
        let key = format!("{namespace}{}", engine.record_id("t", "k"));
        let attempt = Attempt::new("t", "k", payload(1));
        let outcome = engine
            .run(&attempt, Mode::Plain, &Json, |claim| {
                let key = key.clone();
                async move {
                    claim
                        .step("charge", || async { Ok::<_, ()>("ch_1".to_owned()) })
                        .await?;
                    let during = hash(&key).await;
                    assert_eq!(during.get("steps").map(Vec::as_slice), Some(&b"1"[..]));
                    assert_eq!(
                        during.get("step:0:name").map(Vec::as_slice),
                        Some(&b"charge"[..])
                    );
                    Ok::<_, lambda_idempotency::Error<()>>((1u8, Vec::new()))
                }
            })
            .await;
        assert!(outcome.is_ok(), "{outcome:?}");
        let completed = hash(&key).await;
        assert!(
            completed.keys().all(|field| !field.starts_with("step")),
            "{:?}",
            completed.keys().collect::<Vec<_>>()
        );
        assert!(completed.contains_key("response"));
    }
}

/// Redis deletes a record by itself, `retention` (and the second that
/// `expiration_s` rounds up to) after the engine's now, on its own clock:
/// an engine clock two days behind the server's or ahead of it changes
/// nothing (an absolute `PEXPIREAT` deleted the record at once, or kept it
/// two days too long).
#[tokio::test]
async fn records_expire_in_redis_itself_relative_to_the_engines_now() {
    let day_ms = 24 * 3600 * 1000;
    for (what, offset_ms) in [
        ("in step", 0i64),
        ("two days behind", -2 * day_ms),
        ("two days ahead", 2 * day_ms),
    ] {
        let namespace = namespace();
        let store = RedisStore::open(&url()).expect("url").namespace(&namespace);
        let clock = ManualClock::new(SystemClock.now_ms().saturating_add_signed(offset_ms));
        let engine = Engine::builder(store)
            .key_prefix("ttl")
            .clock(clock)
            .retention(Duration::from_secs(3600))
            .build();
        engine
            .execute(&Attempt::new("t", "k", payload(1)), || async {
                Ok::<_, Declined>(1u8)
            })
            .await
            .expect("completed");
        let key = format!("{namespace}{}", engine.record_id("t", "k"));
        let mut connection = raw().await;
        let ttl_ms: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(&mut connection)
            .await
            .expect("pttl");
        assert!(
            (3_595_000..=3_601_000).contains(&ttl_ms),
            "{what}: Redis keeps the record for the retention, not {ttl_ms} ms"
        );
        let replay = engine
            .execute(&Attempt::new("t", "k", payload(1)), || async {
                Ok::<_, Declined>(2u8)
            })
            .await
            .expect("replayed");
        assert_eq!((*replay.value(), replay.is_replay()), (1, true), "{what}");
    }
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

/// A redis-server with TLS only, on a free port, with a throwaway
/// self-signed certificate; stopped on drop.
struct TlsServer {
    child: std::process::Child,
    port: u16,
    certificate: Vec<u8>,
    _dir: TempDir,
}

/// A temporary directory, deleted on drop.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tls_server() -> TlsServer {
    use std::process::{Command, Stdio};
    let dir = scratch_dir("tls");
    // A throwaway CA, and the server's certificate signed by it.
    let made = Command::new("sh")
        .arg("-c")
        .arg(
            "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca \
               -keyout ca.key -out ca.pem \
             && openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout key.pem -out req.csr \
             && printf 'subjectAltName=IP:127.0.0.1' > ext.cnf \
             && openssl x509 -req -in req.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 \
               -extfile ext.cnf -out cert.pem",
        )
        .current_dir(&dir.0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("openssl (Debian's openssl package) makes the test certificates");
    assert!(made.success(), "openssl failed");
    let port = free_port();
    let child = start_redis(
        &dir,
        port,
        &[
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--tls-cert-file",
            "cert.pem",
            "--tls-key-file",
            "key.pem",
            "--tls-auth-clients",
            "no",
        ],
    );
    let certificate = std::fs::read(dir.0.join("ca.pem")).expect("the CA's certificate");
    TlsServer {
        child,
        port,
        certificate,
        _dir: dir,
    }
}

#[tokio::test]
async fn a_tls_server_is_reached_with_rediss() {
    let server = tls_server();
    // The certificate is self-signed: the store trusts it as its root, and
    // refuses it otherwise.
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let untrusted = Engine::builder(RedisStore::open(&url).expect("url")).build();
    let refused = untrusted
        .execute(&Attempt::new("t", "tls", payload(1)), || async {
            Ok::<_, Declined>(0u8)
        })
        .await;
    assert!(
        matches!(refused, Err(lambda_idempotency::Error::Store(_))),
        "an unknown certificate is refused: {refused:?}"
    );
    let store = RedisStore::open_with_root_certificate(&url, &server.certificate).expect("url");
    runs_once_then_replays(Engine::builder(store).build(), "over TLS").await;
}

/// A key in the store's namespace that holds someone else's data (a
/// string, a list, a hash that is not a record): a typed error that names
/// the problem, nothing runs, and the data is left as it was.
#[tokio::test]
async fn a_key_holding_something_else_is_an_error_and_is_left_alone() {
    let mut connection = raw().await;
    for (what, plant, read) in [
        (
            "a string",
            vec!["SET", "{key}", "hello"],
            vec!["GET", "{key}"],
        ),
        (
            "a list",
            vec!["RPUSH", "{key}", "a", "b"],
            vec!["LRANGE", "{key}", "0", "-1"],
        ),
        (
            "a hash that is not a record",
            vec!["HSET", "{key}", "name", "someone else's"],
            vec!["HGETALL", "{key}"],
        ),
    ] {
        let namespace = namespace();
        let store = RedisStore::open(&url()).expect("url").namespace(&namespace);
        let engine = Engine::builder(store).key_prefix("foreign").build();
        let key = format!("{namespace}{}", engine.record_id("t", "k"));
        let command = |parts: &[&str]| {
            let mut command = redis::cmd(parts[0]);
            for part in &parts[1..] {
                command.arg(if *part == "{key}" { key.as_str() } else { part });
            }
            command
        };
        let _: redis::Value = command(&plant)
            .query_async(&mut connection)
            .await
            .expect("plant");
        let before: redis::Value = command(&read)
            .query_async(&mut connection)
            .await
            .expect("read");

        let runs = AtomicUsize::new(0);
        let result = engine
            .execute(&Attempt::new("t", "k", payload(1)), || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Declined>(1u8)
            })
            .await;
        let error = match result {
            Err(lambda_idempotency::Error::Store(error)) => error,
            other => panic!("{what}: {other:?}"),
        };
        assert_eq!(
            error.kind(),
            lambda_idempotency::StoreErrorKind::Misconfigured,
            "{what}: {error}"
        );
        assert!(
            error.to_string().contains("not an idempotency record"),
            "{what}: {error}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 0, "{what}: nothing runs");
        let after: redis::Value = command(&read)
            .query_async(&mut connection)
            .await
            .expect("read");
        assert_eq!(before, after, "{what}: left as it was");
        // Reads fail too (a hash that is not a record reads as a corrupt
        // one), and never report a record.
        let read_error = engine.inspect("t", "k").await.expect_err(what);
        assert!(
            matches!(
                read_error.kind(),
                lambda_idempotency::StoreErrorKind::Misconfigured
                    | lambda_idempotency::StoreErrorKind::CorruptRecord
            ),
            "{what}: {read_error}"
        );
    }
}

#[tokio::test]
async fn a_hash_with_a_field_no_record_holds_is_misconfigured_for_every_script() {
    redis_edges::a_hash_with_a_field_no_record_holds_is_misconfigured_for_every_script(
        &url(),
        namespace,
        &mut raw().await,
    )
    .await;
}

#[tokio::test]
async fn numbers_beyond_the_scripts_are_rejected_before_any_write() {
    redis_edges::numbers_beyond_the_scripts_are_rejected_before_any_write(
        &url(),
        &namespace(),
        &mut raw().await,
    )
    .await;
}

/// A redis-server of the test's own on a free port of 127.0.0.1, nothing
/// persisted, with `args` (a configuration the shared server must not
/// get); stopped on drop.
struct OwnServer {
    child: std::process::Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn own_server(args: &[&str]) -> OwnServer {
    let dir = scratch_dir("own");
    let port = free_port();
    let child = start_redis(
        &dir,
        port,
        &[&["--bind", "127.0.0.1", "--port", &port.to_string()], args].concat(),
    );
    OwnServer {
        child,
        port,
        _dir: dir,
    }
}

/// A directory of the test's own, removed on drop.
fn scratch_dir(kind: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!(
        "redis-{kind}-{}-{}",
        std::process::id(),
        NAMESPACES.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    TempDir(dir)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("a free port")
        .local_addr()
        .expect("its address")
        .port()
}

/// A redis-server in `dir` with `args`, nothing persisted, once `port`
/// accepts connections.
fn start_redis(dir: &TempDir, port: u16, args: &[&str]) -> std::process::Child {
    use std::process::{Command, Stdio};
    let child = Command::new("redis-server")
        .args(args)
        .args(["--save", "", "--appendonly", "no"])
        .current_dir(&dir.0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child
}

/// A response of about 16 KiB, so that a few hundred fill 4 MB.
fn bulky(n: u64) -> String {
    format!("{n:0>16384}")
}

/// `maxmemory 4mb` with `maxmemory-policy volatile-lru` (ElastiCache's
/// default): every record has a TTL, so the server evicts completed
/// records and their keys run again. The store refuses such a server
/// (Misconfigured, naming the policy and the fix; nothing runs, even with
/// fail-open); with `allow_eviction()` it works, keys do run again, and
/// `server_report` counts the evictions.
#[tokio::test]
async fn a_server_that_evicts_is_refused_unless_allowed() {
    let server = own_server(&["--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru"]);
    let url = format!("redis://127.0.0.1:{}", server.port);

    let refused = Engine::builder(RedisStore::open(&url).expect("url"))
        .fail_open(true)
        .build();
    let runs = AtomicUsize::new(0);
    let result = refused
        .execute(&Attempt::new("t", "k", payload(1)), || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Declined>(1u8)
        })
        .await;
    match result {
        Err(lambda_idempotency::Error::Store(error)) => {
            assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
            let message = error.to_string();
            for needle in [
                "volatile-lru",
                "maxmemory-policy noeviction",
                "allow_eviction",
            ] {
                assert!(message.contains(needle), "{needle}: {message}");
            }
        }
        other => panic!("a server that evicts is refused: {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "nothing runs, even with fail-open"
    );

    // Accepted: records are evicted, their keys run again, and the report
    // says so.
    let store = RedisStore::open(&url).expect("url").allow_eviction();
    let engine = Engine::builder(store.clone()).build();
    let keys = 400u64;
    for n in 0..keys {
        engine
            .execute(&Attempt::new("t", &format!("k{n}"), payload(n)), || async {
                Ok::<_, Declined>(bulky(n))
            })
            .await
            .expect("accepted");
    }
    let mut ran_again = 0;
    for n in 0..keys {
        let outcome = engine
            .execute(&Attempt::new("t", &format!("k{n}"), payload(n)), || async {
                Ok::<_, Declined>(bulky(n))
            })
            .await
            .expect("accepted");
        if !outcome.is_replay() {
            ran_again += 1;
        }
    }
    assert!(ran_again > 0, "evicted completed keys run again");
    let report = store.server_report().await.expect("report");
    assert_eq!(report.nodes.len(), 1);
    assert_eq!(
        report.nodes[0].maxmemory_policy.as_deref(),
        Some("volatile-lru")
    );
    assert!(report.evicts());
    assert!(
        report.evicted_keys() >= ran_again,
        "{} evicted, {ran_again} ran again",
        report.evicted_keys()
    );
}

/// Under `noeviction` a full server refuses writes (OOM): an outage of
/// capacity, `Throttled`, with nothing written.
#[tokio::test]
async fn a_full_server_under_noeviction_is_throttled() {
    let server = own_server(&["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]);
    let url = format!("redis://127.0.0.1:{}", server.port);
    let engine = Engine::builder(RedisStore::open(&url).expect("url")).build();
    let mut full = None;
    for n in 0..1000u64 {
        match engine
            .execute(&Attempt::new("t", &format!("k{n}"), payload(n)), || async {
                Ok::<_, Declined>(bulky(n))
            })
            .await
        {
            Ok(_) => {}
            Err(lambda_idempotency::Error::Store(error)) => {
                full = Some((n, error));
                break;
            }
            Err(other) => panic!("{other:?}"),
        }
    }
    let (n, error) = full.expect("4 MB fill up");
    assert_eq!(error.kind(), StoreErrorKind::Throttled, "{error}");
    assert!(error.kind().is_outage());
    let key = engine.record_id("t", &format!("k{n}")).to_string();
    let mut connection = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut connection)
        .await
        .expect("exists");
    assert_eq!(exists, 0, "the refused claim left nothing");
}

/// A cluster whose primary evicts is refused the same way: the policy is
/// read from every primary (a one-node cluster of the test's own, so the
/// shared cluster keeps its configuration).
#[tokio::test]
async fn a_cluster_whose_primary_evicts_is_refused() {
    let server = own_server(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--maxmemory",
        "4mb",
        "--maxmemory-policy",
        "allkeys-lru",
    ]);
    let url = format!("redis://127.0.0.1:{}", server.port);
    let mut connection = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query_async(&mut connection)
        .await
        .expect("slots");
    for _ in 0..100 {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut connection)
            .await
            .expect("cluster info");
        if info.contains("cluster_state:ok") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store =
        RedisStore::open(&format!("redis+cluster://127.0.0.1:{}", server.port)).expect("url");
    let engine = Engine::builder(store.clone()).build();
    let error = engine
        .execute(&Attempt::new("t", "k", payload(1)), || async {
            Ok::<_, Declined>(1u8)
        })
        .await
        .expect_err("refused");
    assert_eq!(error.kind(), ErrorKind::StoreFailed, "{error}");
    assert!(error.to_string().contains("allkeys-lru"), "{error}");
    let report = store.server_report().await.expect("report");
    assert_eq!(report.nodes.len(), 1, "{report:?}");
    assert!(report.nodes[0].node.is_some(), "named by address");
    assert!(report.evicts());
}

/// An ACL user without `INFO` (a locked-down ElastiCache user): the policy
/// cannot be read, the store warns once and works.
#[tokio::test]
async fn a_server_that_refuses_info_is_used_unchecked() {
    let server = own_server(&["--maxmemory", "4mb", "--maxmemory-policy", "volatile-lru"]);
    let admin = format!("redis://127.0.0.1:{}", server.port);
    let mut connection = redis::Client::open(admin.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "app", "on", ">secret", "~*", "+@all", "-info"][..])
        .query_async(&mut connection)
        .await
        .expect("acl");
    let url = format!("redis://app:secret@127.0.0.1:{}", server.port);
    let engine = Engine::builder(RedisStore::open(&url).expect("url")).build();
    runs_once_then_replays(engine, "works unchecked").await;
}

/// One key run, then replayed: the store works.
async fn runs_once_then_replays(engine: Engine<RedisStore>, what: &str) {
    let attempt = Attempt::new("t", "k", payload(1));
    let first = engine
        .execute(&attempt, || async { Ok::<_, Declined>(1u8) })
        .await
        .expect(what);
    let replay = engine
        .execute(&attempt, || async { Ok::<_, Declined>(2u8) })
        .await
        .expect(what);
    assert_eq!((*first.value(), replay.is_replay()), (1, true), "{what}");
}

/// Review of issue 21: `maxmemory-policy` is a dynamic setting (an
/// ElastiCache parameter group change reaches a live cluster). A server
/// set to evict after the store connected is refused once the store
/// reads its settings again: at once after an operator's
/// `server_report`, and every minute on its own (it went on working).
#[tokio::test]
async fn an_eviction_policy_set_after_connecting_is_refused() {
    let server = own_server(&[]);
    let url = format!("redis://127.0.0.1:{}", server.port);
    let engine = Engine::builder(RedisStore::open(&url).expect("url"))
        .fail_open(true)
        .build();
    let runs = AtomicUsize::new(0);
    let run = |key: &'static str| {
        let (engine, runs) = (&engine, &runs);
        async move {
            engine
                .execute(&Attempt::new("t", key, payload(1)), || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Declined>(1u8)
                })
                .await
        }
    };
    run("before").await.expect("noeviction is accepted");

    let mut admin = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    for (name, value) in [("maxmemory", "500mb"), ("maxmemory-policy", "allkeys-lru")] {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(name)
            .arg(value)
            .query_async(&mut admin)
            .await
            .expect("CONFIG SET");
    }
    let report = engine.store().server_report().await.expect("report");
    assert!(report.evicts(), "{report:?}");
    match run("after").await {
        Err(lambda_idempotency::Error::Store(error)) => {
            assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
            assert!(error.to_string().contains("allkeys-lru"), "{error}");
        }
        other => panic!("refused once the policy was read again, not {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "nothing ran after the change"
    );
}

/// Redis keeps no count of a prefix's keys: the store answers `None`
/// unless it owns its database, and then `DBSIZE` counts its records
/// exactly (a server of the test's own, so that nothing else is in it).
#[tokio::test]
async fn the_table_size_is_dbsize_only_where_the_store_owns_the_database() {
    use lambda_idempotency::store::{Accuracy, SizeSource, Store};
    let server = own_server(&[]);
    let url = format!("redis://127.0.0.1:{}", server.port);
    let shared = RedisStore::open(&url).expect("url").namespace("app:");
    assert_eq!(shared.table_size(0).await.unwrap(), None);

    let owned = shared.clone().owns_database();
    let engine = Engine::builder(owned.clone()).build();
    table_size::complete_records(&engine, 9).await;
    assert_eq!(
        shared.table_size(0).await.unwrap(),
        None,
        "the first is as it was"
    );
    let size = engine.sample_table_size().await.unwrap().expect("counted");
    assert_eq!(
        (
            size.records,
            size.in_progress,
            size.bytes,
            size.accuracy,
            size.source
        ),
        (9, None, None, Accuracy::Exact, SizeSource::DbSize)
    );
    // A record forgotten is a key fewer.
    engine.forget("table-size", "k0").await.unwrap();
    assert_eq!(owned.table_size(0).await.unwrap().unwrap().records, 8);
}

/// An outside review of recovery points on a real redis-server: names at
/// the edge, and hashes nobody here wrote; each finding a test that fails
/// today, ignored with its one line.
mod steps_review {
    use super::{namespace, raw, url, RedisStore};
    use lambda_idempotency::{
        testing::scenarios::payload, Attempt, ClaimHandle, Engine, Error, Json, Mode, OutcomeKind,
    };
    use redis::AsyncCommands;
    use std::{
        collections::HashMap,
        sync::{
            atomic::{AtomicUsize, Ordering},
            Arc,
        },
    };

    /// Step names at the edge (empty, unicode, the hash's own field names
    /// and separators, long): recorded by a first attempt that then fails,
    /// resumed by the takeover, whose closures never run.
    #[tokio::test]
    async fn names_at_the_edge_are_recorded_and_resumed() {
        let store = RedisStore::open(&url())
            .expect("url")
            .namespace(namespace());
        let engine = Engine::builder(store).build();
        let names: Vec<String> = vec![
            String::new(),
            "é🦀\u{0}\u{200b}".to_owned(),
            "step:0:name".to_owned(),
            "steps".to_owned(),
            "x".repeat(lambda_idempotency::store::MAX_STEP_NAME_BYTES),
        ];
        let runs = Arc::new(AtomicUsize::new(0));
        let attempt = Attempt::new("t", "edge-names", payload(1));
        let run = |fail: bool| {
            let (names, runs) = (names.clone(), Arc::clone(&runs));
            engine.run(
                &attempt,
                Mode::Plain,
                &Json,
                move |claim: ClaimHandle| async move {
                    let mut outputs = Vec::new();
                    for (i, name) in names.iter().enumerate() {
                        let output = claim
                            .step(name, || async {
                                runs.fetch_add(1, Ordering::SeqCst);
                                Ok::<_, ()>(i)
                            })
                            .await?;
                        outputs.push(output);
                    }
                    if fail {
                        return Err(Error::Operation(()));
                    }
                    Ok::<_, Error<()>>((outputs, Vec::new()))
                },
            )
        };
        run(true)
            .await
            .expect_err("the first attempt fails after its steps");
        let resumed = run(false).await.expect("the takeover completes");
        assert_eq!(resumed.into_value(), (0..names.len()).collect::<Vec<_>>());
        assert_eq!(
            runs.load(Ordering::SeqCst),
            names.len(),
            "each step ran once"
        );
    }

    /// Every step write sent twice (its first answer lost), as the memory
    /// store's and DynamoDB's tests run it: `step.lua` refuses the second
    /// (the count moved), and the engine recognises its own landed write.
    #[tokio::test]
    async fn a_takeover_resumes_after_steps_whose_answers_were_lost() {
        let store = RedisStore::open(&url())
            .expect("url")
            .namespace(namespace());
        lambda_idempotency::testing::scenarios::a_takeover_resumes_after_the_recorded_steps(
            lambda_idempotency::testing::LostAnswers(store),
        )
        .await;
    }

    #[tokio::test]
    async fn a_failure_after_a_step_whose_answer_was_lost_keeps_it() {
        let store = RedisStore::open(&url())
            .expect("url")
            .namespace(namespace());
        lambda_idempotency::testing::scenarios::a_failure_after_a_step_keeps_it(
            lambda_idempotency::testing::LostAnswers(store),
        )
        .await;
    }

    /// Runs one step, lets `meddle` change the record's hash (a writer
    /// that is not this crate), then completes: the outcome's kind, and
    /// the hash's fields after it.
    async fn complete_after(
        meddle: &'static [(&'static str, &'static str)],
    ) -> (OutcomeKind, HashMap<String, Vec<u8>>) {
        let namespace = namespace();
        let store = RedisStore::open(&url()).expect("url").namespace(&namespace);
        let engine = Engine::builder(store).build();
        let key = format!("{namespace}{}", engine.record_id("t", "meddled"));
        let attempt = Attempt::new("t", "meddled", payload(1));
        let outcome = engine
            .run(&attempt, Mode::Plain, &Json, |claim: ClaimHandle| {
                let key = key.clone();
                async move {
                    claim.step("charge", || async { Ok::<_, ()>(1u8) }).await?;
                    let _: () = raw().await.hset_multiple(&key, meddle).await.expect("HSET");
                    Ok::<_, Error<()>>((1u8, Vec::new()))
                }
            })
            .await
            .expect("the operation succeeds");
        let hash: HashMap<String, Vec<u8>> = raw().await.hgetall(&key).await.expect("HGETALL");
        (outcome.kind(), hash)
    }

    /// A hash whose `steps` count is not a number: `complete.lua` did
    /// arithmetic on `tonumber(nil)` and failed halfway (the status and
    /// response set, the lease, steps and new TTL not), and the engine
    /// reported the outcome `NotRecorded`. (Fixed on `steps-review`: the
    /// completion deletes the step fields by the hash's own fields.)
    #[tokio::test]
    async fn a_step_count_that_is_not_a_number_does_not_stop_the_completion() {
        let (kind, hash) = complete_after(&[("steps", "one")]).await;
        assert_eq!(
            kind,
            OutcomeKind::Fresh,
            "the completion failed: {:?}",
            hash.keys()
        );
    }

    /// A hash whose `steps` count is below its step fields: the
    /// completion deleted by the count, and the fields past it stayed on
    /// the completed record (read by every replay's `HGETALL` until it
    /// expires); a count far above them made the completion loop as many
    /// `HDEL`s inside one script, blocking the server. (Fixed.)
    #[tokio::test]
    async fn a_step_count_below_the_fields_leaves_none_on_the_completed_record() {
        let (kind, hash) =
            complete_after(&[("step:1:name", "ledger"), ("step:1:output", "7")]).await;
        assert_eq!(kind, OutcomeKind::Fresh);
        let left: Vec<_> = hash
            .keys()
            .filter(|field| field.starts_with("step"))
            .collect();
        assert!(left.is_empty(), "left on the completed record: {left:?}");
    }
}
