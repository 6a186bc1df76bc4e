//! The PostgreSQL store against a real server: the whole conformance kit,
//! transactional writes, expiry and purging, bad rows, the handler inside
//! the transaction (engine, HTTP layer, consumers) and write refusals.
//!
//! Needs `IDEMPOTENCY_TEST_POSTGRES_URL`; `make test` starts a server
//! (`scripts/with-postgres`) and provides it.

#[path = "support/replays.rs"]
mod replays;
mod support;

/// The sqlx store: its tests live beside this binary's (one binary for
/// both PostgreSQL stores: CI's disk).
#[path = "postgres/sqlx.rs"]
mod sqlx_store;

/// The partitioned layout (`PostgresStore::partitioned`).
#[path = "postgres/partitioned.rs"]
mod partitioned;

/// Recovery points beyond the kit, for every SQL store of this binary.
#[path = "sql/steps.rs"]
mod steps_kit;

use lambda_idempotency::{
    store::{
        postgres::{PgWrite, PostgresStore},
        Store,
    },
    testing::scenarios::{charge, payload, Charge, Declined},
    Attempt, Engine, Error, ErrorKind, OutcomeKind, StoreErrorKind,
};
use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

fn url() -> String {
    std::env::var("IDEMPOTENCY_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!(
            "IDEMPOTENCY_TEST_POSTGRES_URL is not set: run these tests with `make test`, or \
             `scripts/with-postgres cargo test --test postgres` (it starts a throwaway server)"
        )
    })
}

fn pgbouncer_url() -> String {
    std::env::var("IDEMPOTENCY_TEST_PGBOUNCER_URL").unwrap_or_else(|_| {
        panic!(
            "IDEMPOTENCY_TEST_PGBOUNCER_URL is not set: scripts/with-postgres starts PgBouncer \
             (Debian's pgbouncer package) in front of the server"
        )
    })
}

static TABLES: AtomicUsize = AtomicUsize::new(0);

tokio::task_local! {
    /// Set by the in-transaction tests' partitioned runs (`on_both!`):
    /// their stores are the partitioned layout.
    static PARTITIONED: bool;
}

/// `store`, over the partitioned layout where the test runs as
/// `PARTITIONED`.
fn layout(store: PostgresStore) -> PostgresStore {
    match PARTITIONED.try_with(|partitioned| *partitioned) {
        Ok(true) => store.partitioned(lambda_idempotency::store::postgres::Partitioning::daily()),
        _ => store,
    }
}

/// A store over a fresh table of its own.
async fn store() -> PostgresStore {
    let n = TABLES.fetch_add(1, Ordering::SeqCst);
    let table = format!("idem_{}_{n}", std::process::id());
    let store = PostgresStore::connect(&url(), table, 8).expect("pool");
    store.create_table().await.expect("create table");
    store
}

/// A business table beside the records.
async fn charges_table(store: &PostgresStore) -> String {
    let table = format!("{}_charges", store.table());
    let probe = PgWrite::new(format!(
        "CREATE TABLE IF NOT EXISTS {table} (id text PRIMARY KEY, amount bigint NOT NULL)"
    ));
    execute(store, probe).await;
    table
}

/// Runs one statement outside the protocol, through the store's own pool.
async fn execute(store: &PostgresStore, write: PgWrite) {
    let client = tokio_postgres_client().await;
    client.batch_execute(write.sql()).await.expect("statement");
    let _ = store;
}

async fn tokio_postgres_client() -> lambda_idempotency::store::postgres::tokio_postgres::Client {
    use lambda_idempotency::store::postgres::tokio_postgres;
    let (client, connection) = tokio_postgres::connect(&url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(connection);
    client
}

async fn count(table: &str) -> i64 {
    support::postgres_rows(&url(), table).await
}

lambda_idempotency::store_conformance! {
    store: store(),
    unavailable: async {
        // A closed port: every call fails fast as unavailable.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        PostgresStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres"), "idempotency", 1)
            .expect("pool")
    },
    single_write,
}

/// The completer: abandoned claims found a bounded page at a time on the
/// primary key, settled by takeovers.
mod abandoned {
    use super::store;

    lambda_idempotency::store_conformance! {
        abandoned: store(),
    }
    lambda_idempotency::store_conformance! {
        abandoned_steps: store(),
    }
}

#[tokio::test]
async fn transactional_completion_commits_the_handlers_writes_with_the_record() {
    let store = store().await;
    let charges = charges_table(&store).await;
    let engine = Engine::builder(store.clone()).build();
    let attempt = Attempt::new("t", "k", payload(1250));
    let insert = |id: &str| {
        PgWrite::new(format!(
            "INSERT INTO {charges} (id, amount) VALUES ($1, $2)"
        ))
        .bind(id)
        .bind(1250_i64)
    };
    let first = engine
        .execute_transactional(&attempt, || async {
            Ok::<_, Declined>((
                Charge {
                    id: "ch_1".into(),
                    amount: 1250,
                },
                vec![insert("ch_1")],
            ))
        })
        .await
        .expect("committed");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    let replay = engine
        .execute_transactional(&attempt, || async {
            Ok::<_, Declined>((
                Charge {
                    id: "ch_2".into(),
                    amount: 1250,
                },
                vec![insert("ch_2")],
            ))
        })
        .await
        .expect("replayed");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value().id, "ch_1");
    assert_eq!(count(&charges).await, 1, "one charge row");

    // A write that fails rolls everything back and releases the claim.
    let other = Attempt::new("t", "dup", payload(1));
    let result = engine
        .execute_transactional(&other, || async {
            Ok::<_, Declined>((
                Charge {
                    id: "ch_1".into(),
                    amount: 1,
                },
                vec![insert("ch_1")],
            ))
        })
        .await;
    match result {
        Err(Error::Store(error)) => {
            assert_eq!(error.kind(), StoreErrorKind::WriteRejected, "{error}");
            assert!(error.to_string().contains("write 0"), "{error}");
        }
        other => panic!("expected a rejected write, got {other:?}"),
    }
    assert!(
        engine.inspect("t", "dup").await.expect("read").is_none(),
        "released"
    );
    assert_eq!(count(&charges).await, 1);
}

#[tokio::test]
async fn a_fenced_out_completion_commits_none_of_its_writes() {
    use lambda_idempotency::{
        store::{Claim, Completion, Conditional, OwnerToken, RecordId},
        Clock, SystemClock,
    };
    let store = store().await;
    let charges = charges_table(&store).await;
    let now = SystemClock.now_ms();
    let id = RecordId::new("p", "t", "zombie");
    let claim = |owner: &str, now_ms: u64| Claim {
        id: id.clone(),
        owner: OwnerToken::from_stored(owner),
        fingerprint: payload(1),
        now_ms,
        lease_until_ms: now_ms + 1_000,
        expiration_s: now_ms / 1000 + 3600,
        attempt: 1,
        first_started_ms: now_ms,
    };
    let a = claim("owner-a", now - 10_000);
    assert_eq!(store.claim(&a).await.expect("A"), Conditional::Applied);
    let b = claim("owner-b", now);
    assert_eq!(
        store.take_over(&b, &a.owner).await.expect("B"),
        Conditional::Applied
    );
    let completion = Completion {
        id: id.clone(),
        owner: a.owner.clone(),
        response: b"A".to_vec(),
        now_ms: now,
        expiration_s: now / 1000 + 3600,
        writes: vec![PgWrite::new(format!(
            "INSERT INTO {charges} (id, amount) VALUES ('zombie', 1)"
        ))],
    };
    match store.complete(completion).await.expect("A completes") {
        Conditional::Refused(Some(record)) => assert_eq!(record.owner, b.owner),
        other => panic!("A must be fenced out: {other:?}"),
    }
    assert_eq!(count(&charges).await, 0, "none of A's writes committed");
}

#[tokio::test]
async fn expired_rows_are_purged_in_batches_and_never_served() {
    let store = store().await;
    let clock = lambda_idempotency::testing::ManualClock::starting_now();
    let engine = Engine::builder(store.clone())
        .clock(clock.clone())
        .retention(std::time::Duration::from_secs(60))
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    for i in 0..25 {
        let key = format!("k{i}");
        engine
            .execute(&Attempt::new("t", &key, payload(1)), charge(&runs, 1))
            .await
            .expect("completed");
    }
    clock.advance(std::time::Duration::from_secs(61));
    let now_s = lambda_idempotency::Clock::now_ms(&clock) / 1000;
    assert!(
        engine.inspect("t", "k0").await.expect("read").is_none(),
        "expired: absent"
    );
    assert_eq!(count(store.table()).await, 25, "still stored until purged");
    let (a, b) = tokio::join!(store.purge_expired(now_s, 4), store.purge_expired(now_s, 4));
    assert_eq!(
        a.expect("purge") + b.expect("purge"),
        25,
        "concurrent purges share the work"
    );
    assert_eq!(count(store.table()).await, 0);
}

#[tokio::test]
async fn a_corrupt_row_is_an_error_never_a_replay() {
    let store = store().await;
    let engine = Engine::builder(store.clone()).build();
    let attempt = Attempt::new("t", "k", payload(1));
    engine
        .execute(&attempt, || async { Ok::<_, Declined>(1u8) })
        .await
        .expect("first");
    let client = tokio_postgres_client().await;
    client
        .execute(
            &format!("UPDATE {} SET status = 'EXPLODED'", store.table()),
            &[],
        )
        .await
        .expect_err("the CHECK constraint refuses an unknown status");
    client
        .execute(
            &format!("UPDATE {} SET response = NULL", store.table()),
            &[],
        )
        .await
        .expect("a row with its response gone");
    let result = engine
        .execute(&attempt, || async { Ok::<_, Declined>(2u8) })
        .await;
    assert_eq!(result.map_err(|e| e.kind()), Err(ErrorKind::CorruptRecord));
}

#[test]
fn a_table_name_that_is_not_an_identifier_is_refused() {
    let error = PostgresStore::connect("postgres://u@127.0.0.1/db", "t; DROP TABLE x", 1)
        .expect_err("refused");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
}

/// The whole kit again through PgBouncer in transaction mode (as RDS Proxy
/// runs): consecutive statements of one client may reach different server
/// connections, so any reliance on a named prepared statement would fail.
mod through_pgbouncer {
    use super::*;

    async fn store() -> PostgresStore {
        let url = pgbouncer_url();
        let n = TABLES.fetch_add(1, Ordering::SeqCst);
        let table = format!("bounced_{}_{n}", std::process::id());
        let store = PostgresStore::connect(&url, table, 8).expect("pool");
        store.create_table().await.expect("create table");
        store
    }

    lambda_idempotency::store_conformance! {
        store: store(),
        unavailable: async {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            PostgresStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres"), "idempotency", 1)
                .expect("pool")
        },
        single_write,
    }

    /// Recovery points through the pooler too.
    mod steps {
        lambda_idempotency::store_conformance! {
            steps: super::store(),
        }
    }
}

#[tokio::test]
async fn a_schema_qualified_table_is_created_and_used() {
    let schema = format!("app_{}", std::process::id());
    let client = tokio_postgres_client().await;
    client
        .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
        .await
        .expect("schema");
    let store = PostgresStore::connect(&url(), format!("{schema}.idempotency"), 2).expect("pool");
    store
        .create_table()
        .await
        .expect("create table in the schema");
    store.create_table().await.expect("again: IF NOT EXISTS");
    let engine = Engine::builder(store.clone()).build();
    let attempt = Attempt::new("t", "k", payload(1));
    engine
        .execute(&attempt, || async { Ok::<_, Declined>(1u8) })
        .await
        .expect("first");
    let replay = engine
        .execute(&attempt, || async { Ok::<_, Declined>(2u8) })
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert_eq!(count(store.table()).await, 1);
}

/// A table of the same name that was there before, with another shape:
/// `create_table` names each difference as a misconfiguration at start-up
/// and changes nothing; a store used without that check fails every request
/// with the same kind of error, and nothing runs.
#[tokio::test]
async fn a_table_of_another_shape_is_refused_at_start_up_and_left_alone() {
    let ddl = include_str!("../src/store/pg/table.sql");
    let record_columns = &ddl[ddl.find('(').expect("(") + 1..ddl.find(");").expect(");")];
    let cases = [
        (
            "another application's table",
            "(id text PRIMARY KEY, body jsonb NOT NULL)".to_owned(),
            vec![
                "column `status` (text) is missing",
                "column `fingerprint` (text) is missing",
                "column `body` is NOT NULL without a default",
            ],
        ),
        (
            "a response stored as text",
            format!(
                "({})",
                record_columns.replace("response         bytea", "response text")
            ),
            vec!["column `response` is text, not bytea"],
        ),
        (
            "no primary key",
            format!(
                "({})",
                record_columns.replace("text    PRIMARY KEY", "text")
            ),
            vec!["`id` is not the primary key"],
        ),
    ];
    let client = tokio_postgres_client().await;
    for (n, (what, columns, expected)) in cases.into_iter().enumerate() {
        let table = format!("other_shape_{}_{n}", std::process::id());
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} {columns}"
            ))
            .await
            .expect("the other table");
        let shape = || async {
            let rows = client
                .query(
                    "SELECT column_name::text, data_type::text FROM information_schema.columns \
                     WHERE table_name = $1 ORDER BY ordinal_position",
                    &[&table],
                )
                .await
                .expect("columns");
            rows.iter()
                .map(|row| (row.get::<_, String>(0), row.get::<_, String>(1)))
                .collect::<Vec<_>>()
        };
        let before = shape().await;
        let store = PostgresStore::connect(&url(), table.as_str(), 2).expect("pool");
        let error = store.create_table().await.expect_err(what);
        assert_eq!(
            error.kind(),
            StoreErrorKind::Misconfigured,
            "{what}: {error}"
        );
        for difference in expected {
            assert!(
                error.to_string().contains(difference),
                "{what}: {difference:?} in {error}"
            );
        }
        assert_eq!(shape().await, before, "{what}: the table is left as it was");

        if n == 0 {
            let runs = AtomicUsize::new(0);
            let result = Engine::builder(store)
                .build()
                .execute(&Attempt::new("t", "k", payload(1)), || async {
                    runs.fetch_add(1, Ordering::SeqCst);
                    Ok::<_, Declined>(1u8)
                })
                .await;
            match result {
                Err(Error::Store(error)) => {
                    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}")
                }
                other => panic!("{what}: {other:?}"),
            }
            assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing runs");
        }
    }
}

/// The CA of the test server's TLS certificate (`scripts/with-postgres`).
fn certificate_authority() -> Vec<u8> {
    let path = std::env::var("IDEMPOTENCY_TEST_POSTGRES_CA").unwrap_or_else(|_| {
        panic!(
            "IDEMPOTENCY_TEST_POSTGRES_CA is not set: run these tests with `make test`, or \
             `scripts/with-postgres cargo test --test postgres`"
        )
    });
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[tokio::test]
async fn connect_tls_runs_the_protocol_over_verified_tls() {
    use lambda_idempotency::store::postgres::{tls_connector, tokio_postgres};
    let ca = certificate_authority();
    let n = TABLES.fetch_add(1, Ordering::SeqCst);
    let table = format!("idem_tls_{}_{n}", std::process::id());
    let store = PostgresStore::connect_tls(&url(), table, 2, &ca).expect("pool");
    store.create_table().await.expect("create table over TLS");
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
    assert_eq!(
        (*first.value(), *replay.value(), replay.is_replay()),
        (1, 1, true)
    );

    // The same connector, on a connection of the test's: the server sees TLS.
    let (client, connection) = tokio_postgres::connect(
        &format!("{}?sslmode=require", url()),
        tls_connector(&ca).expect("connector"),
    )
    .await
    .expect("connect over TLS");
    tokio::spawn(connection);
    let ssl: bool = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl")
        .get(0);
    assert!(ssl, "the connection is TLS");
}

#[tokio::test]
async fn connect_tls_refuses_a_server_it_cannot_verify_or_that_has_no_tls() {
    // Another CA than the server's: the handshake fails, and the request
    // fails closed (no claim, no run), fail-open or not.
    let dir = std::env::temp_dir().join(format!("pg-other-ca-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=another-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ])
        .current_dir(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("openssl (Debian's openssl package) makes the test certificate");
    assert!(made.success());
    let other_ca = std::fs::read(dir.join("ca.pem")).expect("pem");
    let _ = std::fs::remove_dir_all(&dir);

    let runs = AtomicUsize::new(0);
    for store in [
        PostgresStore::connect_tls(&url(), "idempotency", 1, &other_ca).expect("pool"),
        // PgBouncer here speaks no TLS to clients: no fallback to plain text.
        PostgresStore::connect_tls(&pgbouncer_url(), "idempotency", 1, &certificate_authority())
            .expect("pool"),
    ] {
        // Misconfigured, not an outage (issue 21): even failing open, the
        // operation does not run without a claim.
        let engine = Engine::builder(store).fail_open(true).build();
        let refused = engine
            .execute(&Attempt::new("t", "tls", payload(1)), || async {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Declined>(0u8)
            })
            .await;
        match refused {
            Err(Error::Store(error)) => {
                assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}")
            }
            other => panic!("refused as a misconfigured store, not {other:?}"),
        }
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "nothing ran without a claim"
    );
}

#[test]
fn connect_tls_refuses_bad_configuration_at_start_up() {
    let not_pem = PostgresStore::connect_tls(&url(), "idempotency", 1, b"not a certificate");
    let disabled = PostgresStore::connect_tls(
        &format!("{}?sslmode=disable", url()),
        "idempotency",
        1,
        &certificate_authority(),
    );
    for result in [not_pem, disabled] {
        match result {
            Err(error) => assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}"),
            Ok(_) => panic!("refused at start-up"),
        }
    }
}

/// The handler inside the PostgreSQL transaction
/// (`Engine::run_in_transaction`): a balance check under a row lock, the
/// debit and the completed record in one transaction; on the server and
/// through PgBouncer in transaction mode.
mod in_transaction {
    use super::*;
    use lambda_idempotency::{
        store::{
            postgres::{
                tokio_postgres::types::Type, PgTransaction, RefusalRules, TransactionLimits,
            },
            Claim, OwnerToken,
        },
        Outcome,
    };
    use serde_json::{json, Value};
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    /// A store, an engine, and an account with a balance of 100 that may
    /// never go below 0.
    struct Bank {
        store: PostgresStore,
        engine: Engine<PostgresStore>,
        accounts: String,
        runs: Arc<AtomicUsize>,
    }

    async fn bank(url: &str, pool: usize) -> Arc<Bank> {
        let n = TABLES.fetch_add(1, Ordering::SeqCst);
        let table = format!("intx_{}_{n}", std::process::id());
        let store = PostgresStore::connect(url, table.clone(), pool).expect("pool");
        let store = match PARTITIONED.try_with(|partitioned| *partitioned) {
            Ok(true) => {
                store.partitioned(lambda_idempotency::store::postgres::Partitioning::daily())
            }
            _ => store,
        };
        store.create_table().await.expect("create table");
        let accounts = format!("{table}_accounts");
        tokio_postgres_client()
            .await
            .batch_execute(&format!(
                "CREATE TABLE {accounts} (id text PRIMARY KEY, balance bigint NOT NULL \
                 CONSTRAINT {accounts}_not_negative CHECK (balance >= 0)); \
                 INSERT INTO {accounts} VALUES ('acct', 100)"
            ))
            .await
            .expect("accounts");
        Arc::new(Bank {
            engine: Engine::builder(store.clone()).build(),
            store,
            accounts,
            runs: Arc::default(),
        })
    }

    fn limits() -> TransactionLimits {
        TransactionLimits::new()
    }

    impl Bank {
        async fn balance(&self) -> i64 {
            tokio_postgres_client()
                .await
                .query_one(
                    &format!("SELECT balance FROM {} WHERE id = 'acct'", self.accounts),
                    &[],
                )
                .await
                .expect("balance")
                .get(0)
        }

        fn runs(&self) -> usize {
            self.runs.load(Ordering::SeqCst)
        }

        /// Pays `amount`: reads the balance under a row lock, waits `pause`,
        /// refuses (a stored 409) when it is too low, else debits.
        async fn pay(
            &self,
            key: &str,
            amount: i64,
            limits: TransactionLimits,
            pause: Duration,
        ) -> Result<Outcome<Value>, Error<BoxError>> {
            let (accounts, runs) = (self.accounts.clone(), self.runs.clone());
            let attempt = Attempt::new("t", key, payload(amount as u64));
            self.engine
                .run_in_transaction(&attempt, limits, |tx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let rows = tx
                        .query_typed(
                            &format!("SELECT balance FROM {accounts} WHERE id = 'acct' FOR UPDATE"),
                            &[],
                        )
                        .await?;
                    let balance: i64 = rows.first().ok_or("no account")?.try_get(0)?;
                    tokio::time::sleep(pause).await;
                    if balance < amount {
                        return Ok(json!({ "status": 409, "refused": "insufficient funds" }));
                    }
                    tx.execute_typed(
                        &format!("UPDATE {accounts} SET balance = balance - $1 WHERE id = 'acct'"),
                        &[(&amount, Type::INT8)],
                    )
                    .await?;
                    Ok::<_, BoxError>(json!({ "status": 201, "balance": balance - amount }))
                })
                .await
        }

        /// Debits `amount` first, then runs `then` (which fails, hangs or
        /// panics).
        async fn debit_then<F, Fut>(
            &self,
            key: &str,
            limits: TransactionLimits,
            then: F,
        ) -> Result<Outcome<Value>, Error<BoxError>>
        where
            F: FnOnce(PgTransaction) -> Fut,
            Fut: std::future::Future<Output = Result<Value, BoxError>>,
        {
            let (accounts, runs) = (self.accounts.clone(), self.runs.clone());
            let attempt = Attempt::new("t", key, payload(10));
            self.engine
                .run_in_transaction(&attempt, limits, |tx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tx.execute_typed(
                        &format!("UPDATE {accounts} SET balance = balance - 10 WHERE id = 'acct'"),
                        &[],
                    )
                    .await?;
                    then(tx).await
                })
                .await
        }
    }

    async fn a_payment_commits_with_its_record_and_is_replayed(url: &str) {
        let bank = bank(url, 2).await;
        let first = bank
            .pay("k", 30, limits(), Duration::ZERO)
            .await
            .expect("paid");
        assert_eq!(first.kind(), OutcomeKind::Fresh);
        assert_eq!(first.value()["balance"], 70);
        assert_eq!(bank.balance().await, 70);
        let replay = bank
            .pay("k", 30, limits(), Duration::ZERO)
            .await
            .expect("replayed");
        assert_eq!(replay.kind(), OutcomeKind::Replay);
        assert_eq!(replay.value(), first.value());
        assert_eq!(bank.runs(), 1, "a replay runs nothing");
        assert_eq!(bank.balance().await, 70);
        let reused = bank.pay("k", 31, limits(), Duration::ZERO).await;
        assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
        // The balance check refuses, and its answer is stored.
        let (refused, _) =
            replays::sent_twice(|| bank.pay("big", 500, limits(), Duration::ZERO)).await;
        assert_eq!(refused.value()["status"], 409);
        assert_eq!(bank.balance().await, 70);
        assert_eq!(bank.runs(), 2);
    }

    async fn concurrent_duplicates_never_both_run_and_are_answered_promptly(url: &str) {
        let bank = bank(url, 4).await;
        let first = tokio::spawn({
            let bank = bank.clone();
            async move {
                bank.pay("k", 10, limits(), Duration::from_millis(1500))
                    .await
            }
        });
        while bank.runs() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = Instant::now();
        let duplicate = bank
            .pay(
                "k",
                10,
                limits().claim_wait(Duration::from_millis(100)),
                Duration::ZERO,
            )
            .await;
        let took = started.elapsed();
        assert!(
            matches!(duplicate, Err(Error::InProgress { .. })),
            "{duplicate:?}"
        );
        assert!(took < Duration::from_millis(800), "answered after {took:?}");
        let first = first.await.expect("joined").expect("paid");
        assert_eq!(first.kind(), OutcomeKind::Fresh);
        let replay = bank
            .pay("k", 10, limits(), Duration::ZERO)
            .await
            .expect("replayed");
        assert_eq!(replay.kind(), OutcomeKind::Replay);
        assert_eq!(bank.runs(), 1, "the duplicates ran nothing");
        assert_eq!(bank.balance().await, 90);

        // A burst of duplicates: one debit.
        let burst: Vec<_> = (0..8)
            .map(|_| {
                let bank = bank.clone();
                tokio::spawn(async move {
                    bank.pay("burst", 10, limits(), Duration::from_millis(50))
                        .await
                })
            })
            .collect();
        let mut fresh = 0;
        for result in futures::future::join_all(burst).await {
            match result.expect("joined") {
                Ok(outcome) if outcome.kind() == OutcomeKind::Fresh => fresh += 1,
                Ok(_) | Err(Error::InProgress { .. }) => {}
                Err(other) => panic!("{other:?}"),
            }
        }
        assert_eq!(fresh, 1);
        assert_eq!(bank.runs(), 2);
        assert_eq!(bank.balance().await, 80);
    }

    async fn a_duplicate_within_the_claim_wait_gets_the_replay(url: &str) {
        let bank = bank(url, 4).await;
        let first = tokio::spawn({
            let bank = bank.clone();
            async move {
                bank.pay("k", 10, limits(), Duration::from_millis(300))
                    .await
            }
        });
        while bank.runs() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let duplicate = bank
            .pay(
                "k",
                10,
                limits().claim_wait(Duration::from_secs(5)),
                Duration::ZERO,
            )
            .await
            .expect("replayed");
        assert_eq!(duplicate.kind(), OutcomeKind::Replay);
        assert_eq!(
            first.await.expect("joined").expect("paid").kind(),
            OutcomeKind::Fresh
        );
        assert_eq!(bank.runs(), 1);
        assert_eq!(bank.balance().await, 90);
    }

    async fn an_error_rolls_everything_back_and_frees_the_key(url: &str) {
        let bank = bank(url, 1).await;
        let failed = bank
            .debit_then("k", limits(), |_| async {
                Err::<Value, BoxError>("declined".into())
            })
            .await;
        assert!(matches!(failed, Err(Error::Operation(_))), "{failed:?}");
        assert_eq!(bank.balance().await, 100, "the debit was rolled back");
        assert!(
            bank.engine.inspect("t", "k").await.expect("read").is_none(),
            "no record"
        );
        let retry = bank
            .pay("k", 10, limits(), Duration::ZERO)
            .await
            .expect("ran");
        assert_eq!(retry.kind(), OutcomeKind::Fresh);
        assert_eq!(bank.runs(), 2);
        assert_eq!(bank.balance().await, 90);
    }

    async fn a_crash_mid_handler_rolls_back_and_leaves_the_pool_clean(url: &str) {
        // One connection: a transaction left open on it would be the next
        // request's.
        let bank = bank(url, 1).await;
        let dropped = tokio::time::timeout(
            Duration::from_millis(300),
            bank.debit_then("k", limits(), |_| async {
                tokio::time::sleep(Duration::from_secs(30)).await;
                Ok(json!({}))
            }),
        )
        .await;
        assert!(dropped.is_err(), "the caller gave up");
        let retry_with_wait = || limits().claim_wait(Duration::from_secs(5));
        assert_eq!(bank.balance().await, 100, "the debit was rolled back");
        assert!(bank.engine.inspect("t", "k").await.expect("read").is_none());
        let retry = bank
            .pay("k", 10, retry_with_wait(), Duration::ZERO)
            .await
            .expect("the retry runs, on the same connection");
        assert_eq!(retry.kind(), OutcomeKind::Fresh);
        assert_eq!(bank.balance().await, 90);

        let panicked = tokio::spawn({
            let bank = bank.clone();
            async move {
                bank.debit_then("p", limits(), |_| async { panic!("the handler crashed") })
                    .await
            }
        })
        .await;
        assert!(panicked.expect_err("panicked").is_panic());
        assert_eq!(
            bank.balance().await,
            90,
            "the panicked debit was rolled back"
        );
        assert!(bank.engine.inspect("t", "p").await.expect("read").is_none());
        let retry = bank
            .pay("p", 10, retry_with_wait(), Duration::ZERO)
            .await
            .expect("the retry runs");
        assert_eq!(retry.kind(), OutcomeKind::Fresh);
        assert_eq!(bank.balance().await, 80);
    }

    /// A handler waiting on a row lock that another connection holds past
    /// the time limit is answered with the time limit, every time: the
    /// server's own statement timeout (the same limit) raced the engine's
    /// timer, and its `57014` came back as the handler's own error (1 to 4
    /// of 8 tries once; 20 tries here fail about one run in three without
    /// the engine deciding by the limit). The abandoned statement ends at
    /// the limit too, and with it its locks (a server bound a second past
    /// the limit kept it waiting, and a retry within that second was told
    /// the key was in progress).
    async fn a_handler_waiting_on_a_lock_always_gets_the_time_limit(url: &str) {
        let bank = bank(url, 2).await;
        let holder = tokio_postgres_client().await;
        holder
            .batch_execute(&format!(
                "BEGIN; SELECT balance FROM {} WHERE id = 'acct' FOR UPDATE",
                bank.accounts
            ))
            .await
            .expect("the lock held elsewhere");
        let limit = Duration::from_millis(200);
        for try_ in 0..20 {
            let result = bank
                .pay(
                    &format!("locked-{try_}"),
                    10,
                    limits().time_limit(limit),
                    Duration::ZERO,
                )
                .await;
            match result {
                Err(Error::TimeLimitExceeded { limit: reported }) => assert_eq!(reported, limit),
                other => panic!("try {try_}: expected the time limit, got {other:?}"),
            }
        }
        // The last try's statement ended at the limit: no backend still
        // waits on the holder's lock 300 ms after the 503.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let waiting: i64 = holder
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
                 AND query LIKE '%' || $1 || '%' AND pid <> pg_backend_pid()",
                &[&bank.accounts],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        assert_eq!(waiting, 0, "an abandoned statement outlived its limit");
        holder.batch_execute("ROLLBACK").await.expect("released");
        assert_eq!(bank.balance().await, 100);
        assert_eq!(bank.runs(), 20);
        let paid = bank
            .pay("locked", 10, limits(), Duration::ZERO)
            .await
            .expect("runs once the lock is gone");
        assert_eq!(paid.kind(), OutcomeKind::Fresh, "the key was left free");
        assert_eq!(bank.balance().await, 90);
    }

    /// Duplicates in this process of a payment under way in its
    /// transaction wait on it in memory, holding no connection (the pool
    /// has two; the payment holds one), and replay it as it commits; the
    /// handler runs once.
    async fn duplicates_in_this_process_wait_on_the_transaction_in_memory(url: &str) {
        let bank = bank(url, 2).await;
        let first = {
            let bank = Arc::clone(&bank);
            tokio::spawn(async move {
                bank.pay("dup", 10, limits(), Duration::from_millis(600))
                    .await
            })
        };
        while bank.runs() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let duplicates: Vec<_> = (0..8)
            .map(|_| {
                let bank = Arc::clone(&bank);
                tokio::spawn(async move {
                    let attempt = Attempt::new("t", "dup", payload(10))
                        .wait_in_process(Duration::from_secs(10));
                    let runs = Arc::clone(&bank.runs);
                    bank.engine
                        .run_in_transaction(&attempt, limits(), |_| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, BoxError>(json!({ "ran": "again" }))
                        })
                        .await
                })
            })
            .collect();
        let first = first.await.expect("joined").expect("paid");
        assert_eq!(first.kind(), OutcomeKind::Fresh);
        for duplicate in duplicates {
            let replay = duplicate.await.expect("joined").expect("replayed");
            assert_eq!(replay.kind(), OutcomeKind::Replay);
            assert_eq!(replay.value(), first.value());
        }
        assert_eq!(bank.runs(), 1);
        assert_eq!(bank.balance().await, 90);
    }

    async fn a_long_handler_is_stopped_at_its_time_limit(url: &str) {
        let bank = bank(url, 2).await;
        let bounded = limits().time_limit(Duration::from_millis(500));
        for hang in ["sql", "rust"] {
            let started = Instant::now();
            let result = bank
                .debit_then(hang, bounded, move |tx| async move {
                    if hang == "sql" {
                        tx.batch_execute("SELECT pg_sleep(30)").await?;
                    } else {
                        tokio::time::sleep(Duration::from_secs(30)).await;
                    }
                    Ok(json!({}))
                })
                .await;
            let took = started.elapsed();
            match result {
                Err(Error::TimeLimitExceeded { limit }) => {
                    assert_eq!(limit, Duration::from_millis(500))
                }
                other => panic!("{hang}: expected the time limit, got {other:?}"),
            }
            assert!(
                took < Duration::from_secs(2),
                "{hang}: stopped after {took:?}"
            );
            // The server let go of the key and the debit.
            let retry = bank
                .pay(
                    hang,
                    10,
                    limits().claim_wait(Duration::from_secs(5)),
                    Duration::ZERO,
                )
                .await
                .expect("the retry runs");
            assert_eq!(retry.kind(), OutcomeKind::Fresh, "{hang}");
        }
        assert_eq!(bank.balance().await, 80);
    }

    async fn a_refusal_by_constraint_is_stored_without_its_writes(url: &str) {
        let bank = bank(url, 1).await;
        let rules = RefusalRules::new().constraint(format!("{}_not_negative", bank.accounts));
        let accounts = bank.accounts.clone();
        let attempt = Attempt::new("t", "k", payload(500));
        let refuse = |rules: RefusalRules, accounts: String| {
            move |tx: PgTransaction| async move {
                tx.execute_typed(
                    &format!("UPDATE {accounts} SET balance = balance - 1 WHERE id = 'acct'"),
                    &[],
                )
                .await?;
                let debit = tx
                    .execute_typed(
                        &format!("UPDATE {accounts} SET balance = balance - 500 WHERE id = 'acct'"),
                        &[],
                    )
                    .await;
                match debit {
                    Err(error) => match rules.refusal(&error) {
                        Some(refusal) => {
                            tx.roll_back_writes().await?;
                            Ok(json!({ "status": 422, "constraint": refusal.constraint }))
                        }
                        None => Err(BoxError::from(error)),
                    },
                    Ok(_) => Ok(json!({ "status": 201 })),
                }
            }
        };
        let refused = bank
            .engine
            .run_in_transaction(&attempt, limits(), refuse(rules.clone(), accounts.clone()))
            .await
            .expect("answered");
        assert_eq!(refused.kind(), OutcomeKind::Fresh);
        assert_eq!(refused.value()["status"], 422);
        assert_eq!(bank.balance().await, 100, "no write of the refused request");
        let replay = bank
            .engine
            .run_in_transaction(&attempt, limits(), refuse(rules, accounts.clone()))
            .await
            .expect("replayed");
        assert_eq!(replay.kind(), OutcomeKind::Replay);
        assert_eq!(replay.value(), refused.value());

        // A refusal not rolled back: nothing commits, and the key is free.
        let other = Attempt::new("t", "unhandled", payload(500));
        let result = bank
            .engine
            .run_in_transaction(&other, limits(), |tx| async move {
                let _ = tx
                    .execute_typed(
                        &format!("UPDATE {accounts} SET balance = balance - 500 WHERE id = 'acct'"),
                        &[],
                    )
                    .await;
                Ok::<_, BoxError>(json!({ "status": 201 }))
            })
            .await;
        match result {
            Err(Error::Store(error)) => {
                assert_eq!(error.kind(), StoreErrorKind::WriteRejected, "{error}")
            }
            other => panic!("expected a rejected write, got {other:?}"),
        }
        assert!(bank
            .engine
            .inspect("t", "unhandled")
            .await
            .expect("read")
            .is_none());
        assert_eq!(bank.balance().await, 100);
    }

    /// An event consumer's handler inside the transaction
    /// (`IdempotentEventLayer::in_transaction`), taking it with
    /// `PgTransaction::current`.
    async fn an_event_handler_runs_inside_the_transaction(url: &str) {
        use lambda_idempotency::consumers::IdempotentEventLayer;
        use lambda_runtime::{Context, LambdaEvent};
        use tower::{Layer, ServiceExt};
        let bank = bank(url, 4).await;
        let (accounts, runs) = (bank.accounts.clone(), bank.runs.clone());
        let handler = tower::service_fn(move |event: LambdaEvent<Value>| {
            let (accounts, runs) = (accounts.clone(), runs.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let tx = PgTransaction::current().ok_or("not inside a transaction")?;
                let amount = event.payload["amount"].as_i64().unwrap_or(0);
                tx.execute_typed(
                    &format!("UPDATE {accounts} SET balance = balance - $1 WHERE id = 'acct'"),
                    &[(&amount, Type::INT8)],
                )
                .await?;
                let pause = event.payload["pause_ms"].as_u64().unwrap_or(0);
                tokio::time::sleep(Duration::from_millis(pause)).await;
                if event.payload["fail"] == true {
                    return Err(BoxError::from("the handler failed"));
                }
                Ok::<_, BoxError>(json!({ "debited": amount }))
            }
        });
        let service = IdempotentEventLayer::new(bank.engine.clone(), "payments")
            .key(|event: &Value| event["id"].as_str().map(str::to_owned))
            .in_transaction(limits())
            .layer(handler);
        let deliver = |event: Value| {
            service
                .clone()
                .oneshot(LambdaEvent::new(event, Context::default()))
        };
        let event = json!({ "id": "e1", "amount": 10 });
        assert_eq!(
            deliver(event.clone()).await.expect("handled"),
            json!({ "debited": 10 })
        );
        assert_eq!(
            deliver(event).await.expect("replayed"),
            json!({ "debited": 10 })
        );
        assert_eq!((bank.runs(), bank.balance().await), (1, 90));

        // An error rolls the debit and the claim back: the redelivery runs.
        let failing = json!({ "id": "e2", "amount": 10, "fail": true });
        assert!(deliver(failing).await.is_err());
        assert_eq!(bank.balance().await, 90);
        assert!(bank
            .engine
            .inspect("payments", "e2")
            .await
            .expect("read")
            .is_none());

        // A duplicate delivery while the first runs: refused at once.
        let slow = json!({ "id": "e3", "amount": 10, "pause_ms": 1500 });
        let first = tokio::spawn(deliver(slow.clone()));
        while bank.runs() < 3 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = Instant::now();
        let duplicate = deliver(slow).await.expect_err("in progress");
        assert!(
            duplicate.to_string().contains("being processed"),
            "{duplicate}"
        );
        assert!(started.elapsed() < Duration::from_millis(800));
        assert_eq!(
            first.await.expect("joined").expect("handled"),
            json!({ "debited": 10 })
        );
        assert_eq!((bank.runs(), bank.balance().await), (3, 80));
    }

    /// `consumers::Batch::in_transaction` (issue 41, item 1): each SQS
    /// record's handler debits inside the transaction that claims its key;
    /// a duplicate in the batch runs once, a failing record rolls back its
    /// debit and its claim and is reported for redelivery, and the
    /// redelivery of the batch replays what completed.
    /// A batch inside transactions checks its pool once, at its first
    /// batch, with the concurrency it ends up with (set after
    /// `in_transaction` here): one warning when the pool is smaller, none
    /// when it holds enough. (An outside review found a warning for each
    /// setter, the first with the default concurrency.)
    #[tokio::test]
    async fn a_batch_warns_once_when_its_pool_is_smaller_than_its_concurrency() {
        use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
        use lambda_idempotency::consumers::SqsBatch;
        use lambda_runtime::{Context, LambdaEvent};
        let captured = support::Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        // This test's thread only (a current-thread runtime): the check
        // runs in `process`, polled here.
        let _only_here = tracing::subscriber::set_default(subscriber);
        let warnings = || {
            captured
                .text()
                .matches("the PostgreSQL pool is smaller")
                .count()
        };
        for (pool, concurrency, expected) in [(2, 8, 1), (2, 1, 0), (8, 8, 0)] {
            let before = warnings();
            let bank = bank(&url(), pool).await;
            let batch = SqsBatch::new(bank.engine.clone(), "debits")
                .in_transaction(limits())
                .concurrency(concurrency);
            assert_eq!(warnings(), before, "nothing logged while it is configured");
            for _ in 0..2 {
                let mut message = SqsMessage::default();
                message.message_id = Some("m1".to_owned());
                message.body = Some("{}".to_owned());
                let mut event = SqsEvent::default();
                event.records = vec![message];
                let _ = batch
                    .process(LambdaEvent::new(event, Context::default()), |_| async {
                        Ok::<_, BoxError>(())
                    })
                    .await;
            }
            assert_eq!(
                warnings() - before,
                expected,
                "pool {pool}, concurrency {concurrency}: {}",
                captured.text()
            );
        }
        assert!(
            captured.text().contains("max_size at least 8"),
            "it says what to set: {}",
            captured.text()
        );
    }

    async fn a_batch_handler_runs_each_record_inside_its_transaction(url: &str) {
        use aws_lambda_events::sqs::{SqsEvent, SqsMessage};
        use lambda_idempotency::consumers::SqsBatch;
        use lambda_runtime::{Context, LambdaEvent};
        let bank = bank(url, 4).await;
        let sqs = SqsBatch::new(bank.engine.clone(), "debits")
            .key(|message: &SqsMessage| message.body.clone())
            .concurrency(1)
            .in_transaction(limits());
        let message = |id: &str, body: &str| {
            let mut message = SqsMessage::default();
            message.message_id = Some(id.to_owned());
            message.body = Some(body.to_owned());
            message
        };
        let event = || {
            let mut event = SqsEvent::default();
            event.records = vec![
                message("m1", "debit-1"),
                message("m2", "debit-1"),
                message("m3", "debit-fails"),
                message("m4", "debit-2"),
            ];
            LambdaEvent::new(event, Context::default())
        };
        let handle = |message: SqsMessage| {
            let (accounts, runs) = (bank.accounts.clone(), bank.runs.clone());
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let tx = PgTransaction::current().ok_or("not inside a transaction")?;
                tx.execute(
                    &format!("UPDATE {accounts} SET balance = balance - 10 WHERE id = 'acct'"),
                    &[],
                )
                .await?;
                if message.body.as_deref() == Some("debit-fails") {
                    return Err(BoxError::from("the handler failed after its debit"));
                }
                Ok::<_, BoxError>(json!({ "debited": 10 }))
            }
        };
        let failed = |response: aws_lambda_events::sqs::SqsBatchResponse| {
            response
                .batch_item_failures
                .into_iter()
                .map(|failure| failure.item_identifier)
                .collect::<Vec<_>>()
        };
        let first = sqs.process(event(), handle).await.expect("a response");
        assert_eq!(failed(first), ["m3"]);
        // debit-1 once, debit-2 once; debit-fails rolled back with its claim.
        assert_eq!((bank.runs(), bank.balance().await), (3, 80));
        assert!(bank
            .engine
            .inspect("debits", "debit-fails")
            .await
            .expect("read")
            .is_none());

        let again = sqs.process(event(), handle).await.expect("a response");
        assert_eq!(failed(again), ["m3"]);
        // Only the failing record ran again, and rolled back again.
        assert_eq!((bank.runs(), bank.balance().await), (4, 80));
    }

    macro_rules! on_both {
        ($($scenario:ident),* $(,)?) => {
            mod on_the_server {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() { super::$scenario(&super::url()).await })*
            }
            mod through_pgbouncer {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() { super::$scenario(&super::pgbouncer_url()).await })*
            }
            /// The partitioned layout through PgBouncer: the record's lock
            /// is the transaction's. (Run in parallel, these caught a lock
            /// keyed by the record id alone: the tests' tables share ids,
            /// and their transactions waited on each other.)
            mod partitioned_through_pgbouncer {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    crate::PARTITIONED
                        .scope(true, super::$scenario(&super::pgbouncer_url()))
                        .await
                })*
            }
        };
    }

    on_both!(
        an_event_handler_runs_inside_the_transaction,
        a_batch_handler_runs_each_record_inside_its_transaction,
        a_payment_commits_with_its_record_and_is_replayed,
        concurrent_duplicates_never_both_run_and_are_answered_promptly,
        a_duplicate_within_the_claim_wait_gets_the_replay,
        an_error_rolls_everything_back_and_frees_the_key,
        a_crash_mid_handler_rolls_back_and_leaves_the_pool_clean,
        a_long_handler_is_stopped_at_its_time_limit,
        a_handler_waiting_on_a_lock_always_gets_the_time_limit,
        duplicates_in_this_process_wait_on_the_transaction_in_memory,
        a_refusal_by_constraint_is_stored_without_its_writes,
    );

    fn now_ms() -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as u64
    }

    /// `Engine::run_with_refusals` on the deferred form: a refused write the
    /// closure answers is stored without the write; one it releases, or does
    /// not name, leaves the key free.
    #[tokio::test]
    async fn refused_deferred_writes_are_answered_by_the_engine() {
        use lambda_idempotency::{Json, Mode, WriteRefusal};
        let bank = bank(&url(), 2).await;
        let overdraw = PgWrite::new(format!(
            "UPDATE {} SET balance = balance - 500 WHERE id = 'acct'",
            bank.accounts
        ));
        let constraint = format!("{}_not_negative", bank.accounts);
        let run = |key: &'static str, answer: Option<Result<Value, BoxError>>| {
            let (overdraw, constraint) = (overdraw.clone(), constraint.clone());
            let engine = bank.engine.clone();
            async move {
                let attempt = Attempt::new("t", key, payload(500));
                engine
                    .run_with_refusals(
                        &attempt,
                        Mode::Transactional,
                        &Json,
                        |refusal: &WriteRefusal| {
                            assert_eq!(refusal.index, 0);
                            assert_eq!(refusal.code, "23514");
                            assert_eq!(refusal.constraint.as_deref(), Some(constraint.as_str()));
                            answer
                        },
                        |_| async move { Ok::<_, BoxError>((json!({ "paid": 500 }), vec![overdraw])) },
                    )
                    .await
            }
        };
        let stored = run(
            "stored",
            Some(Ok(json!({ "refused": "insufficient funds" }))),
        )
        .await
        .expect("answered");
        assert_eq!(stored.kind(), OutcomeKind::Fresh);
        assert_eq!(stored.value()["refused"], "insufficient funds");
        let record = bank
            .engine
            .inspect("t", "stored")
            .await
            .expect("read")
            .expect("stored");
        assert_eq!(record.status, lambda_idempotency::store::Status::Completed);
        let replay = run("stored", None).await.expect("replayed");
        assert_eq!(replay.kind(), OutcomeKind::Replay);
        assert_eq!(replay.value(), stored.value());

        let released = run("released", Some(Err("declined".into()))).await;
        assert!(matches!(released, Err(Error::Operation(_))), "{released:?}");
        assert!(bank
            .engine
            .inspect("t", "released")
            .await
            .expect("read")
            .is_none());
        let fault = run("fault", None).await;
        match fault {
            Err(Error::Store(error)) => assert_eq!(error.kind(), StoreErrorKind::WriteRejected),
            other => panic!("{other:?}"),
        }
        assert!(bank
            .engine
            .inspect("t", "fault")
            .await
            .expect("read")
            .is_none());
        assert_eq!(bank.balance().await, 100);
    }

    /// The invocation's deadline bounds the transaction too.
    #[tokio::test]
    async fn the_invocations_deadline_ends_the_transaction() {
        let bank = bank(&url(), 2).await;
        let attempt = Attempt::new("t", "k", payload(10)).deadline_ms(now_ms() + 800);
        let started = Instant::now();
        let result = bank
            .engine
            .run_in_transaction(&attempt, limits(), |tx| async move {
                tx.batch_execute("SELECT pg_sleep(30)").await?;
                Ok::<_, BoxError>(json!({}))
            })
            .await;
        assert!(
            matches!(result, Err(Error::TimeLimitExceeded { .. })),
            "{result:?}"
        );
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn records_of_the_deferred_form_keep_their_meaning() {
        let bank = bank(&url(), 2).await;
        // Completed by the deferred form: replayed, never run.
        let attempt = Attempt::new("t", "done", payload(10));
        bank.engine
            .execute(&attempt, || async {
                Ok::<_, Declined>(json!({ "status": 201 }))
            })
            .await
            .expect("completed");
        let replay = bank
            .pay("done", 10, limits(), Duration::ZERO)
            .await
            .expect("replayed");
        assert_eq!(replay.kind(), OutcomeKind::Replay);
        assert_eq!(bank.runs(), 0);

        // A live claim of the deferred form: in progress; a lapsed one:
        // taken over, and the handler is told.
        let now = now_ms();
        for (key, lease_until_ms) in [("live", now + 60_000), ("lapsed", now - 1_000)] {
            let claim = Claim {
                id: bank.engine.record_id("t", key),
                owner: OwnerToken::generate().expect("token"),
                fingerprint: payload(10),
                now_ms: now - 2_000,
                lease_until_ms,
                expiration_s: now / 1000 + 3_600,
                attempt: 1,
                first_started_ms: now - 2_000,
            };
            bank.store.claim(&claim).await.expect("claimed");
        }
        let live = bank.pay("live", 10, limits(), Duration::ZERO).await;
        assert!(matches!(live, Err(Error::InProgress { .. })), "{live:?}");
        let attempt = Attempt::new("t", "lapsed", payload(10));
        let takeover = bank
            .engine
            .run_in_transaction(&attempt, limits(), |tx| async move {
                Ok::<_, Declined>(json!({ "takeover": tx.takeover().map(|t| t.attempt) }))
            })
            .await
            .expect("taken over");
        assert_eq!(takeover.kind(), OutcomeKind::Fresh);
        assert_eq!(takeover.value()["takeover"], 2);
        let record = bank
            .engine
            .inspect("t", "lapsed")
            .await
            .expect("read")
            .expect("record");
        assert_eq!(record.attempt, 2);
    }
}

/// The HTTP layer's in-transaction form (`IdempotencyLayer::in_transaction`)
/// under an axum router: the handler takes the transaction from its
/// request, checks the balance under a row lock and debits it.
mod http_in_transaction {
    use super::*;
    use axum::{
        body::Body,
        extract::Extension,
        http::{Request, StatusCode},
        routing::post,
        Router,
    };
    use http_body_util::BodyExt;
    use lambda_idempotency::{
        http::IdempotencyLayer,
        store::postgres::{
            tokio_postgres::types::Type, PgTransaction, RefusalRules, TransactionLimits,
        },
    };
    use std::time::{Duration, Instant};
    use tower::ServiceExt;

    struct App {
        router: Router,
        accounts: String,
        runs: Arc<AtomicUsize>,
    }

    async fn app(url: &str, limits: TransactionLimits) -> App {
        let n = TABLES.fetch_add(1, Ordering::SeqCst);
        let table = format!("httptx_{}_{n}", std::process::id());
        let store = crate::layout(PostgresStore::connect(url, table.clone(), 4).expect("pool"));
        store.create_table().await.expect("create table");
        let accounts = format!("{table}_accounts");
        tokio_postgres_client()
            .await
            .batch_execute(&format!(
                "CREATE TABLE {accounts} (id text PRIMARY KEY, balance bigint NOT NULL \
                 CONSTRAINT {accounts}_not_negative CHECK (balance >= 0)); \
                 INSERT INTO {accounts} VALUES ('acct', 100)"
            ))
            .await
            .expect("accounts");
        let runs = Arc::new(AtomicUsize::new(0));
        let rules = RefusalRules::new().constraint(format!("{accounts}_not_negative"));
        let handler = {
            let (accounts, runs) = (accounts.clone(), runs.clone());
            move |Extension(tx): Extension<PgTransaction>, body: String| {
                let (accounts, runs, rules) = (accounts.clone(), runs.clone(), rules.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let (amount, pause_ms) = body.split_once(',').unwrap_or((&body, "0"));
                    let amount: i64 = amount.parse().unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(pause_ms.parse().unwrap_or(0))).await;
                    if amount == 999 {
                        // A fault of the handler's own: released, rolled back.
                        let _ = tx
                            .execute_typed(
                                &format!("UPDATE {accounts} SET balance = 0 WHERE id = 'acct'"),
                                &[],
                            )
                            .await;
                        return (StatusCode::INTERNAL_SERVER_ERROR, "failed".to_owned());
                    }
                    // The debit first, the constraint checks the balance.
                    let debit = tx
                        .execute_typed(
                            &format!(
                                "UPDATE {accounts} SET balance = balance - $1 WHERE id = 'acct'"
                            ),
                            &[(&amount, Type::INT8)],
                        )
                        .await;
                    match debit {
                        Ok(_) => (StatusCode::CREATED, format!("paid {amount}")),
                        Err(error) => match rules.refusal(&error) {
                            Some(_) => (
                                StatusCode::UNPROCESSABLE_ENTITY,
                                "insufficient funds".to_owned(),
                            ),
                            None => (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
                        },
                    }
                }
            }
        };
        let engine = Engine::builder(store).build();
        let router = Router::new().route("/pay", post(handler)).layer(
            IdempotencyLayer::new(engine)
                .shared_scope()
                .in_transaction(limits),
        );
        App {
            router,
            accounts,
            runs,
        }
    }

    impl App {
        async fn pay(&self, key: &str, body: &str) -> (StatusCode, bool, String) {
            let request = Request::post("/pay")
                .header("idempotency-key", key)
                .body(Body::from(body.to_owned()))
                .expect("request");
            let response = self
                .router
                .clone()
                .oneshot(request)
                .await
                .expect("infallible");
            let status = response.status();
            let replayed = response.headers().contains_key("idempotent-replayed");
            let bytes = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            (
                status,
                replayed,
                String::from_utf8_lossy(&bytes).into_owned(),
            )
        }

        async fn balance(&self) -> i64 {
            tokio_postgres_client()
                .await
                .query_one(
                    &format!("SELECT balance FROM {} WHERE id = 'acct'", self.accounts),
                    &[],
                )
                .await
                .expect("balance")
                .get(0)
        }

        fn runs(&self) -> usize {
            self.runs.load(Ordering::SeqCst)
        }
    }

    async fn a_balance_check_inside_the_transaction(url: &str) {
        let app = Arc::new(app(url, TransactionLimits::new()).await);
        assert_eq!(
            app.pay("a", "30").await,
            (StatusCode::CREATED, false, "paid 30".into())
        );
        assert_eq!(
            app.pay("a", "30").await,
            (StatusCode::CREATED, true, "paid 30".into())
        );
        assert_eq!(app.balance().await, 70);
        assert_eq!(app.runs(), 1);

        // The constraint refuses: a 422 the application chose, stored and
        // replayed, without the debit; never a 500.
        let refused = app.pay("big", "500").await;
        assert_eq!(
            refused,
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                false,
                "insufficient funds".into()
            )
        );
        assert!(app.pay("big", "500").await.1, "replayed");
        assert_eq!(app.balance().await, 70);

        // A released response (a 500) rolls its writes and its claim back.
        assert_eq!(
            app.pay("fault", "999").await.0,
            StatusCode::INTERNAL_SERVER_ERROR
        );
        assert_eq!(app.balance().await, 70);
        assert!(!app.pay("fault", "999").await.1, "ran again, not replayed");
        assert_eq!(app.runs(), 4);

        // A duplicate while the first holds the key: a prompt 409.
        let first = tokio::spawn({
            let app = app.clone();
            async move { app.pay("slow", "10,1500").await }
        });
        while app.runs() == 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = Instant::now();
        let duplicate = app.pay("slow", "10,1500").await;
        assert_eq!(duplicate.0, StatusCode::CONFLICT, "{duplicate:?}");
        assert!(
            started.elapsed() < Duration::from_millis(800),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(first.await.expect("joined").0, StatusCode::CREATED);
        assert!(app.pay("slow", "10,1500").await.1);
        assert_eq!(app.runs(), 5);
        assert_eq!(app.balance().await, 60);
    }

    async fn a_handler_past_its_time_limit_is_rolled_back(url: &str) {
        let app = app(
            url,
            TransactionLimits::new().time_limit(Duration::from_millis(300)),
        )
        .await;
        let (status, _, body) = app.pay("k", "10,2000").await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        assert!(body.contains("idempotency-time-limit-exceeded"), "{body}");
        assert_eq!(app.balance().await, 100);
        assert_eq!(app.pay("k", "10").await.0, StatusCode::CREATED);
        assert_eq!(app.balance().await, 90);
    }

    /// Through the layer, a handler whose debit waits on a row lock held
    /// elsewhere past the time limit: the documented 503, every time (the
    /// server's statement timeout once raced the engine's timer, and the
    /// handler answered its `57014` as a 500).
    async fn a_handler_waiting_on_a_lock_is_answered_503_every_time(url: &str) {
        let app = app(
            url,
            TransactionLimits::new().time_limit(Duration::from_millis(200)),
        )
        .await;
        let holder = tokio_postgres_client().await;
        holder
            .batch_execute(&format!(
                "BEGIN; SELECT balance FROM {} WHERE id = 'acct' FOR UPDATE",
                app.accounts
            ))
            .await
            .expect("the lock held elsewhere");
        for try_ in 0..20 {
            let (status, _, body) = app.pay(&format!("locked-{try_}"), "10").await;
            assert_eq!(
                status,
                StatusCode::SERVICE_UNAVAILABLE,
                "try {try_}: {body}"
            );
            assert!(body.contains("idempotency-time-limit-exceeded"), "{body}");
        }
        holder.batch_execute("ROLLBACK").await.expect("released");
        assert_eq!(app.balance().await, 100);
        assert_eq!(app.pay("locked-0", "10").await.0, StatusCode::CREATED);
        assert_eq!(app.balance().await, 90);
    }

    /// Served by axum::serve, a client that hangs up while its handler runs
    /// inside the transaction: the work is detached from the request, so
    /// the handler finishes and its transaction commits; the retry replays.
    async fn a_client_that_leaves_mid_handler_is_charged_once(url: &str) {
        use tokio::io::AsyncWriteExt;
        let app = app(url, TransactionLimits::new()).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a free port");
        let addr = listener.local_addr().expect("bound");
        let server = tokio::spawn(std::future::IntoFuture::into_future(axum::serve(
            listener,
            app.router.clone(),
        )));
        let mut client = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connected");
        let body = "10,800";
        client
            .write_all(
                format!(
                    "POST /pay HTTP/1.1\r\nhost: localhost\r\nidempotency-key: leaves\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await
            .expect("sent");
        while app.runs() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(client);
        // The handler sleeps 800 ms after its start, then debits and commits.
        let deadline = Instant::now() + Duration::from_secs(5);
        while app.balance().await != 90 {
            assert!(
                Instant::now() < deadline,
                "the left request's work never committed"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let retry = app.pay("leaves", body).await;
        assert_eq!((retry.0, retry.1), (StatusCode::CREATED, true), "{retry:?}");
        assert_eq!(app.runs(), 1);
        assert_eq!(app.balance().await, 90);
        server.abort();
    }

    /// The deferred form (`CommitWith`): a constraint the application names
    /// is its chosen 422, stored and replayed, without the write; an
    /// unnamed one stays a 500 that releases the key.
    async fn a_refused_deferred_write_is_the_applications_answer(url: &str) {
        for in_transaction in [false, true] {
            a_refused_commit_with_write(url, in_transaction).await;
        }
    }

    async fn a_refused_commit_with_write(url: &str, in_transaction: bool) {
        use lambda_idempotency::http::{CommitWith, StoredBody};
        let probe = app(url, TransactionLimits::new()).await;
        let accounts = probe.accounts.clone();
        let store = crate::layout(
            PostgresStore::connect(url, format!("{accounts}_records"), 2).expect("pool"),
        );
        store.create_table().await.expect("create table");
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (accounts, runs) = (accounts.clone(), runs.clone());
            move |body: String| {
                let (accounts, runs) = (accounts.clone(), runs.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let amount: i64 = body.parse().unwrap_or(0);
                    let debit = PgWrite::new(format!(
                        "UPDATE {accounts} SET balance = balance - $1 WHERE id = 'acct'"
                    ))
                    .bind(amount);
                    let mut response = axum::response::IntoResponse::into_response((
                        StatusCode::CREATED,
                        format!("paid {amount}"),
                    ));
                    response.extensions_mut().insert(CommitWith(vec![debit]));
                    response
                }
            }
        };
        let constraint = format!("{accounts}_not_negative");
        let layer = IdempotencyLayer::new(Engine::builder(store).build())
            .shared_scope()
            .on_write_refusal(move |refusal| {
                (refusal.constraint.as_deref() == Some(constraint.as_str()))
                    .then(|| {
                        http::Response::builder()
                            .status(StatusCode::UNPROCESSABLE_ENTITY)
                            .header("content-type", "application/problem+json")
                            .body(StoredBody::from(
                                r#"{"type":"insufficient-funds","status":422}"#,
                            ))
                            .ok()
                    })
                    .flatten()
            });
        let layer = match in_transaction {
            true => layer.in_transaction(TransactionLimits::new()),
            false => layer,
        };
        let app = App {
            router: Router::new().route("/pay", post(handler)).layer(layer),
            accounts,
            runs,
        };
        assert_eq!(app.pay("a", "30").await.0, StatusCode::CREATED);
        assert_eq!(app.balance().await, 70);
        let refused = app.pay("big", "500").await;
        assert_eq!(refused.0, StatusCode::UNPROCESSABLE_ENTITY, "{refused:?}");
        assert!(refused.2.contains("insufficient-funds"), "{refused:?}");
        let replay = app.pay("big", "500").await;
        assert_eq!(
            (replay.0, replay.1),
            (StatusCode::UNPROCESSABLE_ENTITY, true)
        );
        assert_eq!(app.balance().await, 70);
        assert_eq!(
            app.runs(),
            2,
            "the refusal was stored: its replay ran nothing"
        );
    }

    macro_rules! on_both {
        ($($scenario:ident),* $(,)?) => {
            mod on_the_server {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() { super::$scenario(&super::url()).await })*
            }
            mod through_pgbouncer {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() { super::$scenario(&super::pgbouncer_url()).await })*
            }
            /// The partitioned layout on the server: the record's lock is
            /// the transaction's. (Through PgBouncer, run in parallel, these
            /// hung and failed on 2026-11-29: open, see the store docs.)
            mod partitioned_through_pgbouncer {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    crate::PARTITIONED
                        .scope(true, super::$scenario(&super::pgbouncer_url()))
                        .await
                })*
            }
        };
    }

    on_both!(
        a_refused_deferred_write_is_the_applications_answer,
        a_balance_check_inside_the_transaction,
        a_handler_past_its_time_limit_is_rolled_back,
        a_handler_waiting_on_a_lock_is_answered_503_every_time,
        a_client_that_leaves_mid_handler_is_charged_once,
    );
}

/// The MySQL store on sqlx, in this binary of the SQL stores' tests.
#[path = "sql/mysql.rs"]
mod mysql;

/// Outside review of redaction in the in-transaction form, on both
/// drivers (tokio-postgres and sqlx): the handler's writes and its
/// redacted record commit together; a stored refusal (a 4xx the handler
/// answers, an `on_write_refusal` answer to a refused `CommitWith`) is
/// redacted as any response; a hook that fails keeps the status and the
/// digest, and the run is never repeated.
mod redaction_in_transaction {
    use super::*;
    use axum::{
        body::Body,
        extract::Extension,
        http::{Request, StatusCode},
        routing::post,
        Router,
    };
    use http_body_util::BodyExt;
    use lambda_idempotency::{
        http::{CommitWith, IdempotencyLayer, StoredBody},
        store::{
            postgres::{PgTransaction, TransactionLimits},
            sqlx::postgres::{
                sqlx::{self, postgres::PgPoolOptions},
                SqlxPgTransaction, SqlxPgWrite, SqlxPostgresStore,
            },
            TransactionalStore,
        },
        JsonPointer, JsonRedaction,
    };
    use tower::ServiceExt;

    const SECRET: &str = "pi_1_secret_Xq9";

    struct App {
        router: Router,
        table: String,
        accounts: String,
        runs: Arc<AtomicUsize>,
    }

    /// A record table and an account of 100 that never goes below 0.
    async fn tables(prefix: &str) -> (String, String) {
        let n = TABLES.fetch_add(1, Ordering::SeqCst);
        let table = format!("{prefix}_{}_{n}", std::process::id());
        let accounts = format!("{table}_accounts");
        tokio_postgres_client()
            .await
            .batch_execute(&format!(
                "CREATE TABLE {accounts} (id text PRIMARY KEY, balance bigint NOT NULL \
                 CONSTRAINT {accounts}_not_negative CHECK (balance >= 0)); \
                 INSERT INTO {accounts} VALUES ('acct', 100)"
            ))
            .await
            .expect("accounts");
        (table, accounts)
    }

    /// What the handler answers for `body`: `pay` (debited, 201), `refuse`
    /// (debited, then a 422 the handler chose: its debit rolled back), or
    /// `commit` (a 201 whose `CommitWith` debit of 1,000 the constraint
    /// refuses). Each body holds the secret.
    fn answer(body: &str) -> (StatusCode, String) {
        match body {
            "refuse" => (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!(r#"{{"error":"declined","client_secret":"{SECRET}"}}"#),
            ),
            _ => (
                StatusCode::CREATED,
                format!(r#"{{"id":"ch_1","client_secret":"{SECRET}"}}"#),
            ),
        }
    }

    fn respond<W: Clone + Send + Sync + 'static>(
        body: &str,
        commit: Option<W>,
    ) -> axum::response::Response {
        let (status, json) = answer(body);
        let mut response = axum::response::IntoResponse::into_response((
            status,
            [("content-type", "application/json")],
            json,
        ));
        if let Some(write) = commit {
            response.extensions_mut().insert(CommitWith(vec![write]));
        }
        response
    }

    /// The layer: in the transaction, the JSON redaction (or a hook that
    /// fails), and the application's answer to the refused debit: a 422
    /// with the secret in it.
    fn layer<St: TransactionalStore>(
        store: St,
        accounts: &str,
        failing_hook: bool,
    ) -> IdempotencyLayer<St> {
        let constraint = format!("{accounts}_not_negative");
        let layer = IdempotencyLayer::new(Engine::builder(store).build())
            .shared_scope()
            .in_transaction(TransactionLimits::new())
            .on_write_refusal(move |refusal| {
                (refusal.constraint.as_deref() == Some(constraint.as_str()))
                    .then(|| {
                        http::Response::builder()
                            .status(StatusCode::UNPROCESSABLE_ENTITY)
                            .header("content-type", "application/json")
                            .body(StoredBody::from(format!(
                                r#"{{"error":"insufficient funds","client_secret":"{SECRET}"}}"#
                            )))
                            .ok()
                    })
                    .flatten()
            });
        match failing_hook {
            true => layer.redact(|_| Err("cannot redact".into())),
            false => layer.redact_json(
                JsonRedaction::new().remove(JsonPointer::new("/client_secret").unwrap()),
            ),
        }
    }

    async fn tokio_postgres_app(url: &str, failing_hook: bool) -> App {
        let (table, accounts) = tables("redact_pg").await;
        let store = PostgresStore::connect(url, table.clone(), 4).expect("pool");
        store.create_table().await.expect("create table");
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (accounts, runs) = (accounts.clone(), runs.clone());
            move |Extension(tx): Extension<PgTransaction>, body: String| {
                let (accounts, runs) = (accounts.clone(), runs.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let debit =
                        format!("UPDATE {accounts} SET balance = balance - 10 WHERE id = 'acct'");
                    if body == "commit" {
                        let refused = PgWrite::new(debit.replace("- 10", "- 1000"));
                        return respond(&body, Some(refused));
                    }
                    tx.execute_typed(&debit, &[]).await.expect("debited");
                    respond::<PgWrite>(&body, None)
                }
            }
        };
        let layer = layer(store, &accounts, failing_hook);
        App {
            router: Router::new().route("/pay", post(handler)).layer(layer),
            table,
            accounts,
            runs,
        }
    }

    async fn sqlx_app(url: &str, failing_hook: bool) -> App {
        let (table, accounts) = tables("redact_sqlx").await;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_lazy(url)
            .expect("pool");
        let store = SqlxPostgresStore::new(pool, table.clone()).expect("store");
        store.create_table().await.expect("create table");
        let runs = Arc::new(AtomicUsize::new(0));
        let handler = {
            let (accounts, runs) = (accounts.clone(), runs.clone());
            move |Extension(tx): Extension<SqlxPgTransaction>, body: String| {
                let (accounts, runs) = (accounts.clone(), runs.clone());
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    let debit =
                        format!("UPDATE {accounts} SET balance = balance - 10 WHERE id = 'acct'");
                    if body == "commit" {
                        let refused = SqlxPgWrite::new(debit.replace("- 10", "- 1000"));
                        return respond(&body, Some(refused));
                    }
                    sqlx::query(&debit)
                        .persistent(false)
                        .execute(&mut *tx.lock().await)
                        .await
                        .expect("debited");
                    respond::<SqlxPgWrite>(&body, None)
                }
            }
        };
        let layer = layer(store, &accounts, failing_hook);
        App {
            router: Router::new().route("/pay", post(handler)).layer(layer),
            table,
            accounts,
            runs,
        }
    }

    impl App {
        async fn pay(&self, key: &str, body: &str) -> (StatusCode, bool, serde_json::Value) {
            let request = Request::post("/pay")
                .header("idempotency-key", key)
                .body(Body::from(body.to_owned()))
                .expect("request");
            let response = self
                .router
                .clone()
                .oneshot(request)
                .await
                .expect("infallible");
            let status = response.status();
            let replayed = response.headers().contains_key("idempotent-replayed");
            let bytes = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            (status, replayed, json)
        }

        async fn balance(&self) -> i64 {
            tokio_postgres_client()
                .await
                .query_one(
                    &format!("SELECT balance FROM {} WHERE id = 'acct'", self.accounts),
                    &[],
                )
                .await
                .expect("balance")
                .get(0)
        }

        /// The committed records' responses: none holds the secret.
        async fn never_stored(&self) {
            let rows = tokio_postgres_client()
                .await
                .query(&format!("SELECT response FROM {}", self.table), &[])
                .await
                .expect("records");
            assert!(!rows.is_empty(), "a record");
            for row in rows {
                let response: Option<Vec<u8>> = row.get(0);
                let response = response.expect("completed");
                assert!(
                    !response
                        .windows(SECRET.len())
                        .any(|w| w == SECRET.as_bytes()),
                    "the committed record holds the secret"
                );
            }
        }

        fn runs(&self) -> usize {
            self.runs.load(Ordering::SeqCst)
        }
    }

    async fn redacted_records_commit_with_the_writes(app: App) {
        // Paid: the debit and the redacted record commit together.
        let first = app.pay("pay", "pay").await;
        assert_eq!((first.0, first.1), (StatusCode::CREATED, false));
        assert_eq!(first.2["client_secret"], SECRET);
        assert_eq!(app.balance().await, 90);
        app.never_stored().await;
        let retry = app.pay("pay", "pay").await;
        assert_eq!((retry.0, retry.1), (StatusCode::CREATED, true));
        assert_eq!(retry.2, serde_json::json!({ "id": "ch_1" }));

        // A 422 the handler chose: its debit rolled back, its answer
        // stored redacted.
        let first = app.pay("refuse", "refuse").await;
        assert_eq!(first.0, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(first.2["client_secret"], SECRET);
        let retry = app.pay("refuse", "refuse").await;
        assert_eq!((retry.0, retry.1), (StatusCode::UNPROCESSABLE_ENTITY, true));
        assert_eq!(retry.2, serde_json::json!({ "error": "declined" }));
        assert_eq!(app.balance().await, 90);

        // A refused `CommitWith` debit: the application's 422, stored
        // redacted, without the write.
        let first = app.pay("commit", "commit").await;
        assert_eq!(first.0, StatusCode::UNPROCESSABLE_ENTITY, "{first:?}");
        assert_eq!(first.2["client_secret"], SECRET);
        let retry = app.pay("commit", "commit").await;
        assert_eq!((retry.0, retry.1), (StatusCode::UNPROCESSABLE_ENTITY, true));
        assert_eq!(
            retry.2,
            serde_json::json!({ "error": "insufficient funds" })
        );
        assert_eq!(app.balance().await, 90);

        app.never_stored().await;
        assert_eq!(app.runs(), 3, "nothing ran twice");
    }

    /// A hook that fails inside the transaction: the handler's debit
    /// commits with a record of the status and the digest (never the
    /// whole response), and the retry is told so without running.
    async fn a_failed_redaction_commits_the_writes_with_status_and_digest(app: App) {
        let first = app.pay("pay", "pay").await;
        assert_eq!(first.0, StatusCode::CREATED);
        assert_eq!(first.2["client_secret"], SECRET);
        assert_eq!(app.balance().await, 90);
        app.never_stored().await;
        let retry = app.pay("pay", "pay").await;
        assert_eq!((retry.0, retry.1), (StatusCode::CREATED, true));
        assert!(
            retry.2["type"]
                .as_str()
                .is_some_and(|t| t.ends_with("idempotency-response-not-stored")),
            "{retry:?}"
        );
        assert!(retry.2["response_digest"].is_string());
        assert_eq!(app.runs(), 1);
        assert_eq!(app.balance().await, 90);
    }

    /// The engine's form (`run_in_transaction_with` and a `RedactedJson`):
    /// the debit commits with the redacted value, which another engine
    /// (another process) replays; a redaction the value's type cannot
    /// read back rolls the debit back with the claim (the caller gets a
    /// store error, and its retry runs as a first attempt).
    async fn the_engine_s_redacted_value_commits_with_its_writes<St, F, Fut>(
        store: St,
        accounts: String,
        table: String,
        debit: F,
    ) where
        St: TransactionalStore + Clone,
        F: Fn(St::Transaction, String) -> Fut + Clone,
        Fut: std::future::Future<Output = Result<(), BoxError>>,
    {
        use lambda_idempotency::{Attempt, Fingerprint, RedactedJson};
        let app = App {
            router: Router::new(),
            table,
            accounts: accounts.clone(),
            runs: Arc::default(),
        };
        let engine = Engine::builder(store.clone()).build();
        let codec =
            RedactedJson(JsonRedaction::new().remove(JsonPointer::new("/client_secret").unwrap()));
        let pay = |engine: Engine<St>, codec: RedactedJson, key: &'static str| {
            let (debit, accounts, runs) = (debit.clone(), accounts.clone(), app.runs.clone());
            async move {
                let attempt = Attempt::new("t", key, Fingerprint::of_bytes(b"10"));
                engine
                    .run_in_transaction_with(
                        &attempt,
                        TransactionLimits::new(),
                        &codec,
                        |tx| async move {
                            runs.fetch_add(1, Ordering::SeqCst);
                            debit(tx, accounts).await?;
                            Ok::<_, BoxError>(serde_json::json!({
                                "id": "ch_1",
                                "client_secret": SECRET,
                            }))
                        },
                    )
                    .await
            }
        };
        let first = pay(engine.clone(), codec.clone(), "k").await.expect("paid");
        assert_eq!(first.kind(), OutcomeKind::Fresh);
        assert_eq!(first.value()["client_secret"], SECRET);
        assert_eq!(app.balance().await, 90);
        app.never_stored().await;
        let elsewhere = Engine::builder(store).build();
        let retry = pay(elsewhere, codec, "k").await.expect("replayed");
        assert_eq!(retry.kind(), OutcomeKind::Replay);
        assert_eq!(retry.value(), &serde_json::json!({ "id": "ch_1" }));
        assert_eq!(app.runs(), 1);

        // A redaction the value's type cannot read back (a required field
        // removed): refused at the commit, the debit rolled back with the
        // claim.
        #[derive(serde::Serialize, serde::Deserialize)]
        struct Charge {
            id: String,
        }
        let unreadable =
            RedactedJson(JsonRedaction::new().remove(JsonPointer::new("/id").unwrap()));
        let attempt = Attempt::new("t", "unreadable", Fingerprint::of_bytes(b"10"));
        let (debit, accounts) = (debit.clone(), accounts.clone());
        let refused = engine
            .run_in_transaction_with(
                &attempt,
                TransactionLimits::new(),
                &unreadable,
                |tx| async move {
                    debit(tx, accounts).await?;
                    Ok::<_, BoxError>(Charge { id: "ch_2".into() })
                },
            )
            .await;
        assert!(
            matches!(refused, Err(Error::Store(_))),
            "{:?}",
            refused.err()
        );
        assert_eq!(app.balance().await, 90, "the debit rolled back");
    }

    type BoxError = Box<dyn std::error::Error + Send + Sync>;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokio_postgres_engine_commits_the_redacted_value() {
        let (table, accounts) = tables("redact_engine_pg").await;
        let store = PostgresStore::connect(&url(), table.clone(), 4).expect("pool");
        store.create_table().await.expect("create table");
        the_engine_s_redacted_value_commits_with_its_writes(
            store,
            accounts,
            table,
            |tx: PgTransaction, accounts: String| async move {
                tx.execute_typed(
                    &format!("UPDATE {accounts} SET balance = balance - 10 WHERE id = 'acct'"),
                    &[],
                )
                .await?;
                Ok(())
            },
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlx_engine_commits_the_redacted_value() {
        let (table, accounts) = tables("redact_engine_sqlx").await;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_lazy(&url())
            .expect("pool");
        let store = SqlxPostgresStore::new(pool, table.clone()).expect("store");
        store.create_table().await.expect("create table");
        the_engine_s_redacted_value_commits_with_its_writes(
            store,
            accounts,
            table,
            |tx: SqlxPgTransaction, accounts: String| async move {
                sqlx::query(&format!(
                    "UPDATE {accounts} SET balance = balance - 10 WHERE id = 'acct'"
                ))
                .persistent(false)
                .execute(&mut *tx.lock().await)
                .await?;
                Ok(())
            },
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokio_postgres_commits_the_redacted_record_with_the_writes() {
        redacted_records_commit_with_the_writes(tokio_postgres_app(&url(), false).await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlx_commits_the_redacted_record_with_the_writes() {
        redacted_records_commit_with_the_writes(sqlx_app(&url(), false).await).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tokio_postgres_commits_a_failed_redaction_as_status_and_digest() {
        a_failed_redaction_commits_the_writes_with_status_and_digest(
            tokio_postgres_app(&url(), true).await,
        )
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlx_commits_a_failed_redaction_as_status_and_digest() {
        a_failed_redaction_commits_the_writes_with_status_and_digest(sqlx_app(&url(), true).await)
            .await;
    }
}

/// The table size from the catalog: `reltuples` once the table is
/// analyzed (autovacuum's job; the test runs `ANALYZE`), and its bytes,
/// indexes included, as `pg_total_relation_size` says. Before any
/// analysis (a new table: autovacuum analyzes after 50 rows changed), the
/// live rows the statistics system counted, which a backend reports
/// within seconds of going idle.
#[tokio::test]
async fn the_table_size_is_the_catalogs_estimate() {
    use lambda_idempotency::store::{Accuracy, SizeSource};
    let store = store().await;
    let engine = Engine::builder(store.clone()).build();
    support::table_size::complete_records(&engine, 6).await;
    let unanalyzed = async {
        loop {
            let size = engine.sample_table_size().await.unwrap().expect("counted");
            if size.records == 6 {
                return size;
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    };
    let unanalyzed = tokio::time::timeout(std::time::Duration::from_secs(30), unanalyzed)
        .await
        .expect("the six rows counted before any ANALYZE");
    assert_eq!(unanalyzed.accuracy, Accuracy::Estimated);
    let client = tokio_postgres_client().await;
    client
        .batch_execute(&format!("ANALYZE {}", store.table()))
        .await
        .expect("analyze");
    let size = engine.sample_table_size().await.unwrap().expect("counted");
    let bytes: i64 = client
        .query_one(
            "SELECT pg_total_relation_size(to_regclass($1))",
            &[&store.table()],
        )
        .await
        .expect("size")
        .get(0);
    assert_eq!(
        (
            size.records,
            size.in_progress,
            size.bytes,
            size.accuracy,
            size.source
        ),
        (
            6,
            None,
            Some(bytes as u64),
            Accuracy::Estimated,
            SizeSource::PgClass
        )
    );
    let missing = PostgresStore::connect(&url(), "no_such_table", 1).expect("pool");
    let error = missing.table_size(0).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
}

/// Recovery points: each step one fenced `UPDATE` of the record's `steps`
/// column.
mod steps {
    use super::{steps_kit, store, tokio_postgres_client, url};
    use lambda_idempotency::{
        store::{postgres::PostgresStore, Conditional, OwnerToken, RecordId, StepWrite, Store},
        testing::{scenarios, LostAnswers},
        StoreErrorKind,
    };

    lambda_idempotency::store_conformance! {
        steps: store(),
    }

    /// Every step write sent twice (its first answer lost): the engine
    /// recognises its own landed write.
    #[tokio::test]
    async fn a_takeover_resumes_after_steps_whose_answers_were_lost() {
        scenarios::a_takeover_resumes_after_the_recorded_steps(LostAnswers(store().await)).await;
        scenarios::a_failure_after_a_step_keeps_it(LostAnswers(store().await)).await;
    }

    /// The `steps` column of `id` in `table`, as JSON; `None` for NULL.
    pub(crate) async fn raw(table: String, id: String) -> Option<serde_json::Value> {
        let row = tokio_postgres_client()
            .await
            .query_one(
                &format!("SELECT steps::text FROM {table} WHERE id = $1"),
                &[&id],
            )
            .await
            .expect("the record");
        row.get::<_, Option<String>>(0)
            .map(|text| serde_json::from_str(&text).expect("JSON"))
    }

    #[tokio::test]
    async fn steps_live_in_the_row_until_its_completion() {
        let store = store().await;
        let table = store.table().to_owned();
        steps_kit::steps_live_in_the_row_until_its_completion(store, move |id| {
            raw(table.clone(), id)
        })
        .await;
    }

    #[tokio::test]
    async fn a_step_inside_the_transaction_just_runs() {
        let store = store().await;
        let table = store.table().to_owned();
        steps_kit::a_step_inside_the_transaction_just_runs(store, move |id| raw(table.clone(), id))
            .await;
    }

    /// A table made before the `steps` column: `create_table` names the
    /// migration, and so does every statement that needs the column,
    /// before anything is written. The migration changes the catalog only
    /// (the table's file is the same), may run twice, and the record an
    /// earlier version left in progress (its `steps` NULL) is taken over
    /// and steps on.
    #[tokio::test]
    async fn a_table_made_before_the_steps_column() {
        let client = tokio_postgres_client().await;
        let table = format!("before_column_{}", std::process::id());
        let ddl = include_str!("../src/store/pg/table.sql");
        let old = ddl
            .replace(",\n    steps            jsonb", "")
            .replace("idempotency", &table);
        assert!(!old.contains("steps"), "{old}");
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}; {old}"))
            .await
            .expect("the table as it was");
        let store = PostgresStore::connect(&url(), table.as_str(), 2).expect("pool");
        let migration = format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS steps jsonb");
        let said = "ALTER TABLE <table> ADD COLUMN IF NOT EXISTS steps jsonb";

        let error = store.create_table().await.expect_err("refused");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
        assert!(error.to_string().contains(said), "{error}");
        let id = RecordId::new("p", "t", "before-steps");
        let mut a = steps_kit::claim(&id, "owner-a");
        let error = store.claim(&a).await.expect_err("no column");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
        assert!(error.to_string().contains(said), "{error}");

        // The record an earlier version wrote, its lease lapsed.
        a.lease_until_ms = a.now_ms - 1;
        client
            .execute(
                &format!(
                    "INSERT INTO {table} (id, status, owner, fingerprint, expiration_s, \
                     lease_until_ms, created_at_ms, attempt, first_started_ms) \
                     VALUES ($1, 'IN_PROGRESS', 'owner-a', $2, $3, $4, $5, 1, $5)"
                ),
                &[
                    &id.as_str(),
                    &a.fingerprint.as_str(),
                    &(a.expiration_s as i64),
                    &(a.lease_until_ms as i64),
                    &(a.now_ms as i64),
                ],
            )
            .await
            .expect("the earlier record");
        let file = || async {
            client
                .query_one(
                    "SELECT pg_relation_filenode($1::text::regclass)::text",
                    &[&table],
                )
                .await
                .expect("file")
                .get::<_, String>(0)
        };
        let before = file().await;
        client.batch_execute(&migration).await.expect("migrated");
        client.batch_execute(&migration).await.expect("again");
        assert_eq!(file().await, before, "no rewrite");
        store.create_table().await.expect("the migrated table");

        assert_eq!(store.steps(&id, a.now_ms).await.expect("read"), vec![]);
        let mut b = steps_kit::claim(&id, "owner-b");
        b.attempt = 2;
        let lapsed = OwnerToken::from_stored("owner-a");
        assert_eq!(
            store.take_over(&b, &lapsed).await.expect("take over"),
            Conditional::Applied
        );
        let step = StepWrite::new(
            id.clone(),
            b.owner.clone(),
            0,
            "charge",
            b"1".to_vec(),
            b.now_ms,
        );
        assert_eq!(
            store.record_step(&step).await.expect("step"),
            Conditional::Applied
        );
        assert_eq!(store.steps(&id, b.now_ms).await.expect("read").len(), 1);
    }
}
