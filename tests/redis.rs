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
    let dir = std::env::temp_dir().join(format!(
        "redis-tls-{}-{}",
        std::process::id(),
        NAMESPACES.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).expect("dir");
    let dir = TempDir(dir);
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
        ])
        .args([
            "--tls-cert-file",
            "cert.pem",
            "--tls-key-file",
            "key.pem",
            "--tls-auth-clients",
            "no",
        ])
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
    let engine = Engine::builder(store).build();
    let attempt = Attempt::new("t", "tls", payload(1));
    let first = engine
        .execute(&attempt, || async { Ok::<_, Declined>(1u8) })
        .await
        .expect("over TLS");
    let replay = engine
        .execute(&attempt, || async { Ok::<_, Declined>(2u8) })
        .await
        .expect("over TLS");
    assert_eq!((*first.value(), replay.is_replay()), (1, true));
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
