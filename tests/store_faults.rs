//! PostgreSQL (tokio-postgres and sqlx in both its statement modes, each
//! on the plain table and the partitioned layout), MySQL
//! and Redis behind a TCP fault proxy: an outage, answers lost after the
//! server acted (the connection reset after the write), delays.
//!
//! Needs `IDEMPOTENCY_TEST_POSTGRES_URL`, `IDEMPOTENCY_TEST_MYSQL_URL` and
//! `IDEMPOTENCY_TEST_REDIS_URL`; `make test` provides them.

mod support;

use lambda_idempotency::{
    store::{
        postgres::PostgresStore,
        redis::RedisStore,
        sqlx::{mysql::SqlxMySqlStore, postgres::SqlxPostgresStore},
        Store,
    },
    testing::{
        scenarios::{charge, payload, Charge, Declined},
        ManualClock,
    },
    Attempt, Engine, Error, ErrorKind, Json, Mode, OutcomeKind,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use support::{tcp_proxy::TcpFaultProxy, variable};

/// `url` with its host and port replaced by the proxy's.
fn through(url: &str, proxy: &TcpFaultProxy) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    format!("{scheme}://{user}{}/{path}", proxy.addr())
}

fn upstream(url: &str) -> String {
    let rest = url.split_once("://").expect("a URL").1;
    let authority = rest.split('/').next().unwrap_or(rest);
    authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host)
        .to_owned()
}

static N: AtomicUsize = AtomicUsize::new(0);

async fn postgres(proxy: &TcpFaultProxy) -> PostgresStore {
    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    let table = format!(
        "faults_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    // The table is made directly; the store reaches the server through the proxy.
    PostgresStore::connect(&url, table.clone(), 1)
        .expect("pool")
        .create_table()
        .await
        .expect("table");
    PostgresStore::connect(&through(&url, proxy), table, 4).expect("pool")
}

/// The tokio-postgres store's partitioned layout through the proxy: each
/// write is a pipelined transaction (`BEGIN`, the record's lock, the
/// statement, `COMMIT`), so an answer lost after the server acted is the
/// whole transaction's.
async fn postgres_partitioned(proxy: &TcpFaultProxy) -> PostgresStore {
    use lambda_idempotency::store::postgres::Partitioning;
    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    let table = format!(
        "faults_parted_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    PostgresStore::connect(&url, table.clone(), 1)
        .expect("pool")
        .partitioned(Partitioning::daily())
        .create_table()
        .await
        .expect("table");
    PostgresStore::connect(&through(&url, proxy), table, 4)
        .expect("pool")
        .partitioned(Partitioning::daily())
}

async fn mysql(proxy: &TcpFaultProxy) -> SqlxMySqlStore {
    let url = variable("IDEMPOTENCY_TEST_MYSQL_URL");
    let table = format!(
        "faults_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    // No ping before each statement (sqlx's default): the proxy's lost
    // answer is then the write's, as for the other stores, not the ping's
    // (whose failure sqlx answers by opening another connection).
    let pool = |url: &str| {
        sqlx::mysql::MySqlPoolOptions::new()
            .max_connections(4)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy(url)
            .expect("pool")
    };
    // The table is made directly; the store reaches the server through the proxy.
    SqlxMySqlStore::new(pool(&url), table.clone())
        .expect("store")
        .create_table()
        .await
        .expect("table");
    SqlxMySqlStore::new(pool(&through(&url, proxy)), table).expect("store")
}

/// The sqlx PostgreSQL store through the proxy, its statements prepared
/// and cached per connection or not (the default).
async fn sqlx_postgres(proxy: &TcpFaultProxy, prepared: bool) -> SqlxPostgresStore {
    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    let table = format!(
        "faults_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    // As for MySQL: no ping before each statement, so that the answer the
    // proxy loses is the statement's. With prepared statements, one
    // connection: each statement is prepared on it once (a round trip of
    // its own, whose lost answer would be the prepare's), and after the
    // scenario's first call the lost answer is the write's.
    let pool = |url: &str, size: u32| {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(size)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy(url)
            .expect("pool")
    };
    // The table is made directly; the store reaches the server through the proxy.
    SqlxPostgresStore::new(pool(&url, 1), table.clone())
        .expect("store")
        .create_table()
        .await
        .expect("table");
    let size = if prepared { 1 } else { 4 };
    let store = SqlxPostgresStore::new(pool(&through(&url, proxy), size), table)
        .expect("store")
        .prepared_statements(prepared);
    if prepared {
        // The claim and the completion prepared on the connection before
        // the scenario starts: its first lost answer is then a write's.
        Engine::builder(store.clone())
            .build()
            .execute(&Attempt::new("t", "prepare", payload(1)), || async {
                Ok::<_, Declined>(1u8)
            })
            .await
            .expect("up");
        settle().await;
    }
    store
}

/// The sqlx store's partitioned layout through the proxy. By default each
/// write is one simple query (the record's lock and the statement, one
/// implicit transaction): the answer lost is that query's. Prepared, each
/// is `BEGIN` with the lock, the statement and `COMMIT`: the answer lost
/// is the `COMMIT`'s.
async fn sqlx_postgres_partitioned(proxy: &TcpFaultProxy, prepared: bool) -> SqlxPostgresStore {
    use lambda_idempotency::store::postgres::Partitioning;
    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    let table = format!(
        "faults_sqlx_parted_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    let pool = |url: &str, size: u32| {
        sqlx::postgres::PgPoolOptions::new()
            .max_connections(size)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy(url)
            .expect("pool")
    };
    SqlxPostgresStore::new(pool(&url, 1), table.clone())
        .expect("store")
        .partitioned(Partitioning::daily())
        .create_table()
        .await
        .expect("table");
    let size = if prepared { 1 } else { 4 };
    let store = SqlxPostgresStore::new(pool(&through(&url, proxy), size), table)
        .expect("store")
        .prepared_statements(prepared)
        .partitioned(Partitioning::daily());
    if prepared {
        // As for the plain table: the statements prepared on the
        // connection before the scenario starts.
        Engine::builder(store.clone())
            .build()
            .execute(&Attempt::new("t", "prepare", payload(1)), || async {
                Ok::<_, Declined>(1u8)
            })
            .await
            .expect("up");
        settle().await;
    }
    store
}

fn redis(proxy: &TcpFaultProxy) -> RedisStore {
    let url = variable("IDEMPOTENCY_TEST_REDIS_URL");
    RedisStore::open(&through(&url, proxy))
        .expect("url")
        .namespace(format!(
            "faults-{}-{}:",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ))
}

async fn postgres_proxy() -> TcpFaultProxy {
    TcpFaultProxy::start(&upstream(&variable("IDEMPOTENCY_TEST_POSTGRES_URL"))).await
}

async fn mysql_proxy() -> TcpFaultProxy {
    TcpFaultProxy::start(&upstream(&variable("IDEMPOTENCY_TEST_MYSQL_URL"))).await
}

async fn redis_proxy() -> TcpFaultProxy {
    TcpFaultProxy::start(&upstream(&variable("IDEMPOTENCY_TEST_REDIS_URL"))).await
}

/// Lets the connections just used go back to their pool: sqlx pings each
/// as it goes back, and the answers a test means to lose are the next
/// statement's, not a ping's.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// An outage: nothing runs, the error says the store is unavailable; once
/// the store is back, the key runs.
async fn outage<St: Store>(store: St, proxy: &TcpFaultProxy) {
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    engine
        .execute(&Attempt::new("t", "warm", payload(1)), charge(&runs, 1))
        .await
        .expect("up");
    proxy.go_down();
    let attempt = Attempt::new("t", "k", payload(1));
    let result = engine.execute(&attempt, charge(&runs, 1)).await;
    assert_eq!(
        result.map_err(|e| e.kind()).err(),
        Some(ErrorKind::StoreUnavailable)
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "nothing ran during the outage"
    );
    proxy.heal();
    let mut outcome = None;
    for _ in 0..20 {
        match engine.execute(&attempt, charge(&runs, 1)).await {
            Ok(ran) => {
                outcome = Some(ran);
                break;
            }
            Err(Error::Store(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            Err(other) => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(outcome.expect("recovered").kind(), OutcomeKind::Fresh);
}

/// A claim whose answer was lost after the server wrote it. The read that
/// checks the outage finds the claim, under this attempt's own token: it
/// runs, once, and the retry replays. When that read's answer is lost
/// too, nothing runs (fail closed); the landed claim holds the key until
/// its lease passes; then the retry takes it over, and is told so.
async fn lost_claim_answer<St: Store>(store: St, proxy: &TcpFaultProxy) {
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .default_lease(Duration::from_secs(10))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    engine
        .execute(&Attempt::new("t", "warm", payload(1)), charge(&runs, 1))
        .await
        .expect("up");

    let recognised = Attempt::new("t", "read", payload(1));
    settle().await;
    proxy.lose_answers(1);
    let ours = engine
        .execute(&recognised, charge(&runs, 1))
        .await
        .expect("the read found this attempt's own claim");
    assert_eq!(ours.kind(), OutcomeKind::Fresh);
    assert_eq!(runs.load(Ordering::SeqCst), 2, "ran once");
    let replay = engine
        .execute(&recognised, charge(&runs, 1))
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(runs.load(Ordering::SeqCst), 2);

    // The claim's answer, the read's, and those of whatever the client
    // sends on reconnecting (Redis's INFO check): all lost.
    let attempt = Attempt::new("t", "k", payload(1));
    settle().await;
    proxy.lose_answers(5);
    let result = engine.execute(&attempt, charge(&runs, 1)).await;
    assert!(matches!(result, Err(Error::Store(_))), "{result:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "nothing ran");
    let mut busy = None;
    for _ in 0..20 {
        match engine.execute(&attempt, charge(&runs, 1)).await {
            Err(Error::Store(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            other => {
                busy = Some(other);
                break;
            }
        }
    }
    assert!(
        matches!(busy, Some(Err(Error::InProgress { .. }))),
        "the claim had landed: {busy:?}"
    );
    clock.advance(Duration::from_secs(11));
    let outcome = engine
        .run(&attempt, Mode::Plain, &Json, |claim| async move {
            Ok::<_, Declined>((claim.takeover().map(|t| t.attempt), Vec::new()))
        })
        .await
        .expect("taken over");
    assert_eq!(outcome.kind(), OutcomeKind::Fresh);
    assert_eq!(*outcome.value(), Some(2), "told it is the second attempt");
}

/// A completion whose answer was lost after the server wrote it: the caller
/// still gets its value, and the retry replays the stored one.
async fn lost_completion_answer<St: Store>(store: St, proxy: &TcpFaultProxy) {
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "k", payload(1));
    let proxy_ref = proxy;
    let outcome = engine
        .execute(&attempt, || async {
            settle().await;
            proxy_ref.lose_answers(1); // the completion's
            Ok::<_, Declined>(Charge {
                id: "ch_1".into(),
                amount: 1,
            })
        })
        .await
        .expect("the value comes back");
    assert_eq!(outcome.kind(), OutcomeKind::NotRecorded);
    let mut replay = None;
    for _ in 0..20 {
        match engine.execute(&attempt, charge(&runs, 1)).await {
            Err(Error::Store(_)) => tokio::time::sleep(Duration::from_millis(100)).await,
            other => {
                replay = Some(other);
                break;
            }
        }
    }
    let replay = replay
        .expect("answered")
        .expect("the completion had landed");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value().id, "ch_1");
    assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran again");
}

/// Delays on every request: concurrent duplicates still run once.
async fn delays<St: Store>(store: St, proxy: &TcpFaultProxy) {
    proxy.delay(Duration::from_millis(30));
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let calls: Vec<_> = (0..16)
        .map(|_| {
            let (engine, runs) = (engine.clone(), Arc::clone(&runs));
            tokio::spawn(async move {
                let attempt = Attempt::new("t", "slow", payload(1));
                engine
                    .execute(&attempt, || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Ok::<_, Declined>(1u8)
                    })
                    .await
            })
        })
        .collect();
    for call in calls {
        match call.await.expect("task") {
            Ok(_) | Err(Error::InProgress { .. }) => {}
            Err(other) => panic!("unexpected: {other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "ran once");
}

macro_rules! on_each_store {
    ($($scenario:ident),*) => {
        mod on_postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let proxy = postgres_proxy().await;
                    super::$scenario(postgres(&proxy).await, &proxy).await;
                }
            )*
        }
        mod on_postgres_partitioned {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let proxy = postgres_proxy().await;
                    // Each write is a pipelined transaction: the answer
                    // lost is its COMMIT's (BEGIN's comes first, before the
                    // server acted).
                    proxy.lose_answers_at_transaction_end();
                    super::$scenario(postgres_partitioned(&proxy).await, &proxy).await;
                }
            )*
        }
        mod on_mysql {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let proxy = mysql_proxy().await;
                    super::$scenario(mysql(&proxy).await, &proxy).await;
                }
            )*
        }
        mod on_sqlx_postgres {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let proxy = postgres_proxy().await;
                    super::$scenario(sqlx_postgres(&proxy, false).await, &proxy).await;
                }
            )*
        }
        mod on_sqlx_postgres_prepared {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let proxy = postgres_proxy().await;
                    super::$scenario(sqlx_postgres(&proxy, true).await, &proxy).await;
                }
            )*
        }
        mod on_sqlx_postgres_partitioned {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let proxy = postgres_proxy().await;
                    super::$scenario(sqlx_postgres_partitioned(&proxy, false).await, &proxy).await;
                }
            )*
        }
        mod on_sqlx_postgres_partitioned_prepared {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let proxy = postgres_proxy().await;
                    // BEGIN's answer comes first, before the server acted.
                    proxy.lose_answers_at_transaction_end();
                    super::$scenario(sqlx_postgres_partitioned(&proxy, true).await, &proxy).await;
                }
            )*
        }
        mod on_redis {
            use super::*;
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let proxy = redis_proxy().await;
                    super::$scenario(redis(&proxy), &proxy).await;
                }
            )*
        }
    };
}

on_each_store!(outage, lost_claim_answer, lost_completion_answer, delays);
