//! The PostgreSQL store under settings a user's server may have that the
//! other tests do not: a default isolation level above READ COMMITTED, a
//! read-only writer, reserved words as names, URLs that cannot connect
//! (issue 21). Each against the real server, directly and through PgBouncer
//! in transaction mode.
//!
//! Needs `IDEMPOTENCY_TEST_POSTGRES_URL` and `IDEMPOTENCY_TEST_PGBOUNCER_URL`
//! (`scripts/with-postgres`).

mod support;

use futures::future::join_all;
use lambda_idempotency::{
    store::postgres::{tokio_postgres, PostgresStore},
    testing::scenarios::{payload, Declined},
    Attempt, Engine, Error, OutcomeKind, StoreErrorKind,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};
use support::variable;

async fn admin() -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(
        &variable("IDEMPOTENCY_TEST_POSTGRES_URL"),
        tokio_postgres::NoTls,
    )
    .await
    .expect("connect");
    tokio::spawn(connection);
    client
}

/// A database of its own whose sessions all start with `setting` (as a
/// server, database or role default does), created once per run.
async fn database_with(name: &str, setting: &str) {
    let admin = admin().await;
    match admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await
    {
        Ok(()) => {}
        // Another test of this run made it.
        Err(error) if error.code().map(|c| c.code()) == Some("42P04") => {}
        Err(error) => panic!("CREATE DATABASE {name}: {error}"),
    }
    admin
        .batch_execute(&format!("ALTER DATABASE {name} SET {setting}"))
        .await
        .expect("ALTER DATABASE");
}

/// `base` (a server or PgBouncer URL) with its database replaced.
fn on_database(base: &str, database: &str) -> String {
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    format!("{server}/{database}")
}

async fn show(url: &str, setting: &str) -> String {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    // Simple protocol: PgBouncer in transaction mode keeps no prepared
    // statement.
    let rows = client
        .simple_query(&format!("SHOW {setting}"))
        .await
        .expect("SHOW");
    rows.iter()
        .find_map(|message| match message {
            tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_owned),
            _ => None,
        })
        .expect("a value")
}

/// The URLs of a database: direct, and through PgBouncer.
fn urls_of(database: &str) -> [(&'static str, String); 2] {
    [
        (
            "direct",
            on_database(&variable("IDEMPOTENCY_TEST_POSTGRES_URL"), database),
        ),
        (
            "PgBouncer",
            on_database(&variable("IDEMPOTENCY_TEST_PGBOUNCER_URL"), database),
        ),
    ]
}

static TABLES: AtomicUsize = AtomicUsize::new(0);

async fn store_on(url: &str) -> PostgresStore {
    let n = TABLES.fetch_add(1, Ordering::SeqCst);
    let store =
        PostgresStore::connect(url, format!("idem_{}_{n}", std::process::id()), 16).expect("pool");
    store.create_table().await.expect("create table");
    store
}

const KEYS: usize = 8;
const DUPLICATES: usize = 32;

/// Item 1: at SERIALIZABLE and REPEATABLE READ, concurrent duplicates make
/// the server abort the losers' claims (40001). Those are conflicts: the
/// claim runs again and finds the winner's record. Failing open, the
/// operation still runs once per key (it ran 34 times for 8 keys, the
/// losers unprotected); failing closed, no duplicate gets a store error
/// (7 to 11 of 256 got a 5xx).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn duplicates_at_a_stricter_isolation_level_run_once_per_key() {
    for (database, level) in [
        ("idem_serializable", "serializable"),
        ("idem_repeatable_read", "repeatable read"),
    ] {
        database_with(
            database,
            &format!("default_transaction_isolation = '{level}'"),
        )
        .await;
        for (via, url) in urls_of(database) {
            assert_eq!(show(&url, "transaction_isolation").await, level, "{via}");
            for fail_open in [true, false] {
                let store = store_on(&url).await;
                let engine = Engine::builder(store).fail_open(fail_open).build();
                let runs = Arc::new(AtomicUsize::new(0));
                let answers = join_all((0..KEYS * DUPLICATES).map(|n| {
                    let (engine, runs) = (engine.clone(), Arc::clone(&runs));
                    async move {
                        let key = format!("key-{}", n % KEYS);
                        engine
                            .execute(&Attempt::new("t", &key, payload(1)), || async {
                                runs.fetch_add(1, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                Ok::<_, Declined>(n)
                            })
                            .await
                    }
                }))
                .await;
                let mut fresh = 0;
                for answer in &answers {
                    match answer {
                        Ok(outcome) if outcome.kind() == OutcomeKind::Fresh => fresh += 1,
                        Ok(outcome) if outcome.kind() == OutcomeKind::Replay => {}
                        Err(Error::InProgress { .. }) => {}
                        other => panic!(
                            "{level} via {via}, fail_open {fail_open}: every duplicate is \
                             fresh, a replay or in progress, not {other:?}"
                        ),
                    }
                }
                assert_eq!(
                    runs.load(Ordering::SeqCst),
                    KEYS,
                    "{level} via {via}, fail_open {fail_open}: one run per key"
                );
                assert_eq!(fresh, KEYS, "{level} via {via}");
            }
        }
    }
}

/// Item 6: a writer demoted by a failover answers 25006 (read-only
/// transaction): an outage, which fails closed (503) or, failing open, runs
/// the operation as the outage it is.
#[tokio::test]
async fn a_read_only_server_is_an_outage() {
    database_with("idem_read_only", "default_transaction_read_only = on").await;
    for (via, url) in urls_of("idem_read_only") {
        let n = TABLES.fetch_add(1, Ordering::SeqCst);
        let table = format!("idem_{}_{n}", std::process::id());
        // The table is made writable first: read-only applies to sessions
        // that do not ask otherwise.
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(connection);
        client
            // The store's own DDL, so that the table is the store's shape
            // whatever columns it gains.
            .simple_query(&format!(
                "BEGIN READ WRITE; {} COMMIT",
                include_str!("../src/store/pg/table.sql").replace("idempotency", &table)
            ))
            .await
            .expect("create the table read-write");
        let store = PostgresStore::connect(&url, table, 2).expect("pool");
        // Failing open: the writer refuses, but it answers the read that
        // would confirm an outage, so nothing runs without a claim (an
        // Aurora reader endpoint given by mistake would otherwise turn
        // idempotency off for good).
        let engine = Engine::builder(store).fail_open(true).build();
        let runs = AtomicUsize::new(0);
        for _ in 0..3 {
            let refused = engine
                .execute(&Attempt::new("t", "ro", payload(1)), || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Declined>(1u8)
                })
                .await;
            match refused {
                Err(Error::Store(error)) => {
                    assert_eq!(error.kind(), StoreErrorKind::Unavailable, "{via}: {error}");
                    assert!(error.to_string().contains("25006"), "{error}");
                }
                other => panic!("{via}: a 25006 is an outage, not {other:?}"),
            }
        }
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "{via}: never ran unprotected"
        );
    }
}

/// Review of issue 21: a duplicate whose claim waits on its twin's row lock
/// (the twin's transactional completion) until `statement_timeout` gets
/// 57014, an outage code; a read finds the twin's claim, so the duplicate
/// is told "in progress", and never runs, failing open or not (it ran a
/// second time under fail-open, and was a 503 without).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_timing_out_on_its_twins_lock_is_in_progress() {
    use lambda_idempotency::store::postgres::PgWrite;
    database_with("idem_statement_timeout", "statement_timeout = '1s'").await;
    let url = on_database(
        &variable("IDEMPOTENCY_TEST_POSTGRES_URL"),
        "idem_statement_timeout",
    );
    let store = store_on(&url).await;
    for fail_open in [false, true] {
        let key = format!("twin-{fail_open}");
        let runs = Arc::new(AtomicUsize::new(0));
        let first = tokio::spawn({
            let (engine, runs, key) = (
                Engine::builder(store.clone()).build(),
                Arc::clone(&runs),
                key.clone(),
            );
            async move {
                engine
                    .execute_transactional(&Attempt::new("t", &key, payload(1)), || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        // Three writes under the timeout each: the completion
                        // holds the record's row lock for about 2.1 s.
                        let slow = || PgWrite::new("SELECT pg_sleep(0.7)");
                        Ok::<_, Declined>((1u8, vec![slow(), slow(), slow()]))
                    })
                    .await
                    .map(|outcome| outcome.kind())
            }
        });
        tokio::time::sleep(Duration::from_millis(400)).await;
        let duplicate = Engine::builder(store.clone())
            .fail_open(fail_open)
            .build()
            .execute(&Attempt::new("t", &key, payload(1)), || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Declined>(2u8)
            })
            .await;
        assert!(
            matches!(duplicate, Err(Error::InProgress { .. })),
            "fail_open {fail_open}: {duplicate:?}"
        );
        let first = first.await.expect("first");
        assert!(
            matches!(first, Ok(OutcomeKind::Fresh)),
            "fail_open {fail_open}: {first:?}"
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            1,
            "fail_open {fail_open}: ran once"
        );
    }
}

/// Item 3: every word the server reserves is refused as a table name at
/// construction (every statement would fail with 42601, which used to be
/// retried as transient); qualified with a schema, such a name works.
#[tokio::test]
async fn reserved_words_are_refused_as_table_names_and_work_qualified() {
    let admin = admin().await;
    let reserved: Vec<String> = admin
        .query(
            "SELECT word FROM pg_get_keywords() WHERE catcode IN ('R', 'T') ORDER BY word",
            &[],
        )
        .await
        .expect("keywords")
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert!(reserved.len() > 90, "{reserved:?}");
    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    for word in &reserved {
        for name in [word.clone(), word.to_uppercase(), format!("{word}.records")] {
            match PostgresStore::connect(&url, name.as_str(), 1) {
                Err(error) => {
                    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{name}");
                    assert!(error.to_string().contains("reserved word"), "{error}");
                }
                Ok(_) => panic!("{name}: a reserved word is refused at construction"),
            }
        }
    }

    admin
        .batch_execute("CREATE SCHEMA IF NOT EXISTS idem_keywords")
        .await
        .expect("schema");
    let store = PostgresStore::connect(&url, "idem_keywords.order", 2).expect("qualified");
    store.create_table().await.expect("create table");
    let engine = Engine::builder(store).build();
    for expected in [OutcomeKind::Fresh, OutcomeKind::Replay] {
        let outcome = engine
            .execute(&Attempt::new("t", "k", payload(1)), || async {
                Ok::<_, Declined>(1u8)
            })
            .await
            .expect("the protocol runs on idem_keywords.order");
        assert_eq!(outcome.kind(), expected);
    }
}

/// Item 4: a URL that cannot connect is refused at construction, not
/// reported as an outage on every call (which fail-open ran through).
#[test]
fn a_url_that_cannot_connect_is_refused_at_construction() {
    for url in [
        "postgresql://",
        "postgresql:///postgres",
        "postgres://127.0.0.1/db",
    ] {
        match PostgresStore::connect(url, "idempotency", 1) {
            Err(error) => assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{url}"),
            Ok(_) => panic!("{url} is refused at construction"),
        }
    }
}

/// Item 2: a number beyond PostgreSQL's bigint is refused before anything
/// is written, as rejected, not retried as transient.
#[tokio::test]
async fn a_value_beyond_bigint_is_rejected_before_any_write() {
    use lambda_idempotency::store::{Claim, OwnerToken, RecordId, Store};
    let store = store_on(&variable("IDEMPOTENCY_TEST_POSTGRES_URL")).await;
    let id = RecordId::new("p", "s", "k");
    let claim = Claim {
        id: id.clone(),
        owner: OwnerToken::generate().expect("token"),
        fingerprint: payload(1),
        now_ms: 1_700_000_000_000,
        lease_until_ms: u64::MAX,
        expiration_s: u64::MAX,
        attempt: 1,
        first_started_ms: 1_700_000_000_000,
    };
    let error = store.claim(&claim).await.expect_err("refused");
    assert_eq!(error.kind(), StoreErrorKind::Rejected, "{error}");
    assert!(!error.kind().is_outage());
    assert_eq!(
        store.get(&id, 0).await.expect("read"),
        None,
        "nothing written"
    );
}

/// Review of issue 21: a table named like a name the store's statements
/// use for themselves (`w` was one) runs the protocol; the longest name
/// accepted still gets its expiration index, and a longer one is refused
/// (PostgreSQL would cut the index's name to the table's and skip it).
#[tokio::test]
async fn short_and_long_table_names_work_or_are_refused_at_construction() {
    let url = variable("IDEMPOTENCY_TEST_POSTGRES_URL");
    // Padded past 50 whatever the process id's width (a container's first
    // processes have ids of three digits), then cut to exactly 50.
    let long = format!("idem_{}_{}", std::process::id(), "x".repeat(50));
    let long = &long[..50];
    for table in ["w", "one", "r", long] {
        let store = PostgresStore::connect(&url, table, 2).expect(table);
        store.create_table().await.expect("create table");
        let engine = Engine::builder(store).build();
        for expected in [OutcomeKind::Fresh, OutcomeKind::Replay] {
            let outcome = engine
                .execute(
                    &Attempt::new("t", &format!("names-{}", std::process::id()), payload(1)),
                    || async { Ok::<_, Declined>(1u8) },
                )
                .await
                .unwrap_or_else(|error| panic!("{table}: {error}"));
            assert_eq!(outcome.kind(), expected, "{table}");
        }
    }
    let indexes: i64 = admin()
        .await
        .query_one(
            "SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexname = $2",
            &[&long, &format!("{long}_expiration_s")],
        )
        .await
        .expect("pg_indexes")
        .get(0);
    assert_eq!(indexes, 1, "the longest name keeps its expiration index");
    let longer = format!("{long}y");
    match PostgresStore::connect(&url, longer.as_str(), 1) {
        Err(error) => assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}"),
        Ok(_) => panic!("a name over 50 characters is refused"),
    }
}
