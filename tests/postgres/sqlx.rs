//! The sqlx store (feature `sqlx-postgres`) against the same server, in
//! this binary: the conformance kit (directly, with prepared statements,
//! and through PgBouncer in transaction mode), transactional writes, the
//! handler inside the transaction, and records shared with the
//! tokio-postgres store on one table.

use super::*;
use lambda_idempotency::{
    store::sqlx::postgres::{
        sqlx::{self, postgres::PgPoolOptions, PgPool},
        RefusalRules, SqlxPgTransaction, SqlxPgWrite, SqlxPostgresStore, TransactionLimits,
    },
    Outcome,
};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `base` (a server or PgBouncer URL) with its database replaced.
fn on_database(base: &str, database: &str) -> String {
    let (server, _) = base.rsplit_once('/').expect("a URL with a database");
    format!("{server}/{database}")
}

pub(crate) fn pool(url: &str, size: u32) -> PgPool {
    let mut options: sqlx::postgres::PgConnectOptions = url.parse().expect("url");
    if on_database(url, "") == on_database(&pgbouncer_url(), "") {
        // PgBouncer refuses a startup parameter it does not know, and sqlx
        // sends `extra_float_digits` (the store's docs say so; a
        // PgBouncer with `ignore_startup_parameters = extra_float_digits`
        // takes it).
        options = options.extra_float_digits(None);
    }
    PgPoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options)
}

tokio::task_local! {
    /// Set by the runs of a test with the store's statements prepared.
    static PREPARED_STORE: bool;
}

/// A sqlx store over a fresh table of its own (partitioned where the test
/// runs as `PARTITIONED`, its statements prepared where it runs as
/// `PREPARED_STORE`).
async fn store_on(url: &str, size: u32) -> SqlxPostgresStore {
    let n = TABLES.fetch_add(1, Ordering::SeqCst);
    let table = format!("sqlx_{}_{n}", std::process::id());
    let store = SqlxPostgresStore::new(pool(url, size), table).expect("store");
    let store = match PARTITIONED.try_with(|partitioned| *partitioned) {
        Ok(true) => store.partitioned(lambda_idempotency::store::postgres::Partitioning::daily()),
        _ => store,
    };
    let store = match PREPARED_STORE.try_with(|prepared| *prepared) {
        Ok(true) => store.prepared_statements(true),
        _ => store,
    };
    store.create_table().await.expect("create table");
    store
}

async fn store() -> SqlxPostgresStore {
    store_on(&url(), 8).await
}

/// A store whose every call fails fast as unavailable (a closed port).
async fn unavailable() -> SqlxPostgresStore {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .expect("pool");
    SqlxPostgresStore::new(pool, "idempotency").expect("store")
}

lambda_idempotency::store_conformance! {
    store: store(),
    unavailable: unavailable(),
    single_write,
}

/// The completer on sqlx.
mod abandoned {
    use super::store;

    lambda_idempotency::store_conformance! {
        abandoned: store(),
    }
    lambda_idempotency::store_conformance! {
        abandoned_steps: store(),
    }
}

/// The kit with the store's statements prepared and cached per
/// connection (for direct connections).
mod prepared {
    use super::*;

    async fn store() -> SqlxPostgresStore {
        super::store().await.prepared_statements(true)
    }

    lambda_idempotency::store_conformance! {
        store: store(),
        unavailable: super::unavailable(),
        single_write,
    }
}

/// The kit through PgBouncer in transaction mode: a statement sqlx parses
/// and binds in two exchanges must not lose its server connection between
/// them.
mod through_pgbouncer {
    use super::*;

    lambda_idempotency::store_conformance! {
        store: store_on(&pgbouncer_url(), 8),
        unavailable: super::unavailable(),
        single_write,
    }

    /// Recovery points through the pooler too.
    mod steps {
        use super::*;

        lambda_idempotency::store_conformance! {
            steps: store_on(&pgbouncer_url(), 8),
        }
    }
}

#[tokio::test]
async fn a_table_name_that_is_not_an_identifier_is_refused() {
    let error = SqlxPostgresStore::new(pool(&url(), 1), "t; DROP TABLE x").expect_err("refused");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
}

#[tokio::test]
async fn deferred_writes_commit_with_the_record_or_not_at_all() {
    deferred_writes().await
}

/// The same on the partitioned layout, both statement modes: the single
/// write and the fenced completion with writes take the record's lock
/// with `BEGIN`.
#[tokio::test]
async fn deferred_writes_commit_with_the_record_or_not_at_all_partitioned() {
    PARTITIONED.scope(true, deferred_writes()).await;
    PARTITIONED
        .scope(true, PREPARED_STORE.scope(true, deferred_writes()))
        .await;
}

async fn deferred_writes() {
    let store = store().await;
    let charges = format!("{}_charges", store.table());
    tokio_postgres_client()
        .await
        .batch_execute(&format!(
            "CREATE TABLE {charges} (id text PRIMARY KEY, amount bigint NOT NULL)"
        ))
        .await
        .expect("charges");
    let engine = Engine::builder(store.clone()).build();
    let insert = |id: &str| {
        SqlxPgWrite::new(format!(
            "INSERT INTO {charges} (id, amount) VALUES ($1, $2)"
        ))
        .bind(id.to_owned())
        .bind(1250_i64)
    };
    let attempt = Attempt::new("t", "k", payload(1250));
    let first = engine
        .execute_transactional(&attempt, || async {
            Ok::<_, Declined>((charge("ch_1"), vec![insert("ch_1")]))
        })
        .await
        .expect("committed");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    let replay = engine
        .execute_transactional(&attempt, || async {
            Ok::<_, Declined>((charge("ch_2"), vec![insert("ch_2")]))
        })
        .await
        .expect("replayed");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(count(&charges).await, 1, "one charge row");

    // A write that fails (a duplicate id) rolls everything back, records
    // the refusal, and releases the claim.
    let other = Attempt::new("t", "k2", payload(1250));
    let failed = engine
        .execute_transactional(&other, || async {
            Ok::<_, Declined>((charge("ch_1"), vec![insert("ch_3"), insert("ch_1")]))
        })
        .await;
    match failed {
        Err(Error::Store(error)) => {
            assert_eq!(error.kind(), StoreErrorKind::WriteRejected, "{error}");
            let refusal = error.write_refusal().expect("a refusal");
            assert_eq!(refusal.index, 1);
            assert_eq!(refusal.code, "23505");
        }
        other => panic!("expected a rejected write, got {other:?}"),
    }
    assert_eq!(count(&charges).await, 1, "ch_3 rolled back with the rest");
    assert!(engine.inspect("t", "k2").await.expect("read").is_none());
}

fn charge(id: &str) -> Charge {
    Charge {
        id: id.into(),
        amount: 1250,
    }
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
    tokio_postgres_client()
        .await
        .batch_execute(&format!(
            "UPDATE {} SET response = NULL, lease_until_ms = -5",
            store.table()
        ))
        .await
        .expect("a row with its response gone");
    let result = engine
        .execute(&attempt, || async { Ok::<_, Declined>(2u8) })
        .await;
    assert_eq!(result.map_err(|e| e.kind()), Err(ErrorKind::CorruptRecord));
}

#[tokio::test]
async fn expired_rows_are_purged_in_batches() {
    let store = store().await;
    let engine = Engine::builder(store.clone()).build();
    for n in 0..5 {
        let key = format!("k{n}");
        let attempt = Attempt::new("t", &key, payload(1));
        engine
            .execute(&attempt, || async { Ok::<_, Declined>(1u8) })
            .await
            .expect("run");
    }
    let far = u64::MAX / 4_000;
    assert_eq!(store.purge_expired(0, 2).await.expect("none yet"), 0);
    assert_eq!(store.purge_expired(far, 2).await.expect("purged"), 5);
    assert_eq!(count(store.table()).await, 0);
}

/// Both stores on one table: what either completes, the other replays (or
/// refuses as a reused key), in both directions and both forms.
#[tokio::test]
async fn both_drivers_share_one_table() {
    let sqlx_store = store().await;
    let pg_store = PostgresStore::connect(&url(), sqlx_store.table(), 2).expect("pool");
    let on_sqlx = Engine::builder(sqlx_store.clone()).build();
    let on_pg = Engine::builder(pg_store).build();
    let ran = Arc::new(AtomicUsize::new(0));
    let run = |n: u8| {
        let ran = ran.clone();
        move || async move {
            ran.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Declined>(n)
        }
    };
    let a = Attempt::new("t", "by-sqlx", payload(1));
    let first = on_sqlx.execute(&a, run(1)).await.expect("ran");
    let replay = on_pg.execute(&a, run(2)).await.expect("replayed");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value(), first.value());
    let b = Attempt::new("t", "by-tokio-postgres", payload(1));
    let first = on_pg.execute(&b, run(3)).await.expect("ran");
    let replay = on_sqlx.execute(&b, run(4)).await.expect("replayed");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(*replay.value(), *first.value());
    let reused = on_sqlx
        .execute(&Attempt::new("t", "by-tokio-postgres", payload(2)), run(5))
        .await;
    assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
    // The in-transaction form's records too.
    let c = Attempt::new("t", "in-transaction", payload(1));
    on_sqlx
        .run_in_transaction(&c, TransactionLimits::new(), |_| async {
            Ok::<_, BoxError>(json!({ "paid": true }))
        })
        .await
        .expect("ran");
    let replay = on_pg
        .execute(&c, || async { Ok::<_, Declined>(json!({ "paid": false })) })
        .await
        .expect("replayed");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value()["paid"], true);
    assert_eq!(ran.load(Ordering::SeqCst), 2);
}

/// The store under session settings that a user's server, database or
/// role may have and the other tests' server does not:
/// `standard_conforming_strings = off` (a backslash in a plain string
/// literal is an escape) and `bytea_output = escape` (bytea as text is not
/// hex). The store's default mode writes its values into each statement as
/// literals and reads its rows as text: neither may mean anything else
/// under them. The whole kit, directly and through PgBouncer, and values
/// that a literal could get wrong (quotes, backslashes, `$1`, non-ASCII
/// text, every byte) read back as written, and as the tokio-postgres
/// store, which binds them, reads them.
mod other_settings {
    use super::*;
    use lambda_idempotency::{
        store::{Claim, Completion, Conditional, OwnerToken, RecordId},
        Clock, Fingerprint, SystemClock,
    };

    const DATABASE: &str = "sqlx_other_settings";

    /// The database, made once per run; its sessions start with the
    /// settings, as a database default gives them.
    async fn database() {
        static MADE: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
        MADE.get_or_init(|| async {
            let admin = tokio_postgres_client().await;
            admin
                .batch_execute(&format!("CREATE DATABASE {DATABASE}"))
                .await
                .expect("CREATE DATABASE");
            admin
                .batch_execute(&format!(
                    "ALTER DATABASE {DATABASE} SET standard_conforming_strings = off; \
                     ALTER DATABASE {DATABASE} SET escape_string_warning = off; \
                     ALTER DATABASE {DATABASE} SET bytea_output = 'escape'"
                ))
                .await
                .expect("ALTER DATABASE");
        })
        .await;
    }

    async fn url() -> String {
        database().await;
        on_database(&super::url(), DATABASE)
    }

    async fn pgbouncer_url() -> String {
        database().await;
        on_database(&super::pgbouncer_url(), DATABASE)
    }

    lambda_idempotency::store_conformance! {
        store: async { store_on(&url().await, 8).await },
        unavailable: super::unavailable(),
        single_write,
    }

    mod prepared {
        use super::*;

        lambda_idempotency::store_conformance! {
            store: async { store_on(&url().await, 8).await.prepared_statements(true) },
            unavailable: super::super::unavailable(),
            single_write,
        }
    }

    mod through_pgbouncer {
        use super::*;

        lambda_idempotency::store_conformance! {
            store: async { store_on(&pgbouncer_url().await, 8).await },
            unavailable: super::super::unavailable(),
            single_write,
        }
    }

    /// The partitioned layout under the same settings, on both drivers:
    /// its catalog queries read the partitions' bounds with regular
    /// expressions, which a backslash would break.
    mod partitioned {
        use super::*;
        use lambda_idempotency::store::postgres::Partitioning;

        lambda_idempotency::store_conformance! {
            store: async {
                let n = TABLES.fetch_add(1, Ordering::SeqCst);
                let table = format!("sqlx_parted_{}_{n}", std::process::id());
                let store = SqlxPostgresStore::new(pool(&url().await, 8), table)
                    .expect("store")
                    .partitioned(Partitioning::daily());
                store.create_table().await.expect("partitioned table");
                store
            },
            unavailable: super::super::unavailable(),
            single_write,
        }

        mod tokio_postgres_store {
            use super::*;

            lambda_idempotency::store_conformance! {
                store: async {
                    let n = TABLES.fetch_add(1, Ordering::SeqCst);
                    let store = PostgresStore::connect(&url().await, format!("pg_parted_{}_{n}", std::process::id()), 8)
                        .expect("pool")
                        .partitioned(Partitioning::daily());
                    store.create_table().await.expect("partitioned table");
                    store
                },
                unavailable: async {
                    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                    PostgresStore::connect(&format!("postgres://postgres@127.0.0.1:{port}/postgres"), "idempotency", 1)
                        .expect("pool")
                },
                single_write,
            }
        }
    }

    #[tokio::test]
    async fn the_settings_are_in_force() {
        let pool = pool(&url().await, 1);
        for (setting, value) in [
            ("standard_conforming_strings", "off"),
            ("bytea_output", "escape"),
        ] {
            let shown: String = sqlx::query_scalar(&format!("SHOW {setting}"))
                .fetch_one(&pool)
                .await
                .expect("SHOW");
            assert_eq!(shown, value, "{setting}");
        }
    }

    /// Text and bytes that a literal could get wrong, written and read by
    /// the store (`prepared` or not) on `url`, and read by the
    /// tokio-postgres store on `direct`.
    async fn values_read_back_as_written(url: &str, direct: &str, prepared: bool) {
        let store = store_on(url, 2).await.prepared_statements(prepared);
        let now = SystemClock.now_ms();
        let odd = "it's \"quoted\" \\ \\x41 \\' '' $1 $$ E'\\'' été 🦀";
        let id = RecordId::from_stored(format!("{odd} id"));
        let claim = Claim {
            id: id.clone(),
            owner: OwnerToken::from_stored(format!("{odd} owner")),
            fingerprint: Fingerprint::from_stored(format!("{odd} fingerprint")),
            now_ms: now,
            lease_until_ms: now + 60_000,
            expiration_s: now / 1000 + 3600,
            attempt: 1,
            first_started_ms: now,
        };
        assert_eq!(
            store.claim(&claim).await.expect("claim"),
            Conditional::Applied
        );
        let listed = store.list_in_progress(odd, 10).await.expect("list");
        assert_eq!(listed.len(), 1, "found by its prefix");
        assert_eq!(listed[0].id, id);
        assert!(store
            .list_in_progress(&format!("{odd}x"), 10)
            .await
            .expect("list")
            .is_empty());
        let response: Vec<u8> = (0..=255u8).chain(*b"\\x00\\\\'\\000").collect();
        let completion = Completion {
            id: id.clone(),
            owner: claim.owner.clone(),
            response: response.clone(),
            now_ms: now,
            expiration_s: now / 1000 + 3600,
            writes: Vec::<SqlxPgWrite>::new(),
        };
        assert_eq!(
            store.complete(completion).await.expect("complete"),
            Conditional::Applied
        );
        let record = store.get(&id, now).await.expect("read").expect("a record");
        assert_eq!(record.id, id);
        assert_eq!(record.owner, claim.owner);
        assert_eq!(record.fingerprint, claim.fingerprint);
        assert_eq!(record.response.as_deref(), Some(&response[..]));
        // What a refused claim finds is the same record (the answered
        // statement's row).
        let other = Claim {
            owner: OwnerToken::from_stored("another"),
            ..claim.clone()
        };
        assert_eq!(
            store.claim(&other).await.expect("refused"),
            Conditional::Refused(Some(record.clone()))
        );
        // The tokio-postgres store binds its values and reads rows in
        // binary: it finds the same record.
        let bound = PostgresStore::connect(direct, store.table(), 1).expect("pool");
        assert_eq!(bound.get(&id, now).await.expect("read"), Some(record));
        // A NUL is refused, as a bound one is, and nothing is written.
        let nul = Claim {
            id: RecordId::from_stored("nul \0 id"),
            ..claim.clone()
        };
        let refused = store.claim(&nul).await.expect_err("a NUL in text");
        assert_eq!(refused.kind(), StoreErrorKind::Rejected, "{refused}");
    }

    #[tokio::test]
    async fn values_read_back_as_written_directly() {
        let url = url().await;
        values_read_back_as_written(&url, &url, false).await;
    }

    #[tokio::test]
    async fn values_read_back_as_written_with_prepared_statements() {
        let url = url().await;
        values_read_back_as_written(&url, &url, true).await;
    }

    #[tokio::test]
    async fn values_read_back_as_written_through_pgbouncer() {
        values_read_back_as_written(&pgbouncer_url().await, &url().await, false).await;
    }

    #[tokio::test]
    async fn values_read_back_as_written_under_the_default_settings() {
        values_read_back_as_written(&super::url(), &super::url(), false).await;
    }

    /// Recovery points under these settings: the step's JSON built and
    /// its output read back (`bytea_output = escape`) in simple queries
    /// and prepared ones, in both layouts.
    mod steps {
        use super::*;
        use lambda_idempotency::store::postgres::Partitioning;

        lambda_idempotency::store_conformance! {
            steps: async { store_on(&url().await, 8).await },
        }

        /// The kit's values at the edges (above, in simple queries) in
        /// prepared statements and on a partitioned table.
        #[tokio::test]
        async fn steps_at_the_edges_prepared_and_partitioned() {
            lambda_idempotency::testing::scenarios::steps_at_the_edges(
                store_on(&url().await, 8).await.prepared_statements(true),
            )
            .await;
            let n = TABLES.fetch_add(1, Ordering::SeqCst);
            let parted = SqlxPostgresStore::new(
                pool(&url().await, 8),
                format!("sqlx_parted_steps_{}_{n}", std::process::id()),
            )
            .expect("store")
            .partitioned(Partitioning::daily());
            parted.create_table().await.expect("partitioned table");
            lambda_idempotency::testing::scenarios::steps_at_the_edges(parted).await;
        }
    }
}

mod in_transaction {
    use super::*;

    /// A store, an engine, and an account with a balance of 100 that may
    /// never go below 0.
    struct Bank {
        engine: Engine<SqlxPostgresStore>,
        /// Another engine on the same store, as in another execution
        /// environment: its duplicates meet the first's on the server (an
        /// engine answers its own duplicates in memory).
        elsewhere: Engine<SqlxPostgresStore>,
        pool: PgPool,
        accounts: String,
        runs: Arc<AtomicUsize>,
    }

    async fn bank(url: &str, size: u32) -> Arc<Bank> {
        let store = store_on(url, size).await;
        let accounts = format!("{}_accounts", store.table());
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
            pool: store.pool().clone(),
            elsewhere: Engine::builder(store.clone()).build(),
            engine: Engine::builder(store).build(),
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

        /// Pays `amount` with sqlx queries: reads the balance under a row
        /// lock, waits `pause`, refuses (a stored 409) when it is too low,
        /// else debits.
        async fn pay(
            &self,
            key: &str,
            amount: i64,
            limits: TransactionLimits,
            pause: Duration,
        ) -> Result<Outcome<Value>, Error<BoxError>> {
            self.pay_through(&self.engine, key, amount, limits, pause)
                .await
        }

        async fn pay_through(
            &self,
            engine: &Engine<SqlxPostgresStore>,
            key: &str,
            amount: i64,
            limits: TransactionLimits,
            pause: Duration,
        ) -> Result<Outcome<Value>, Error<BoxError>> {
            let (accounts, runs) = (self.accounts.clone(), self.runs.clone());
            let attempt = Attempt::new("t", key, payload(amount as u64));
            engine
                .run_in_transaction(&attempt, limits, |tx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // Unnamed statements: PgBouncer before 1.21 keeps no
                    // named one from one transaction to the next.
                    let balance: i64 = sqlx::query_scalar(&format!(
                        "SELECT balance FROM {accounts} WHERE id = $1 FOR UPDATE"
                    ))
                    .bind("acct")
                    .persistent(false)
                    .fetch_one(&mut *tx.lock().await)
                    .await?;
                    tokio::time::sleep(pause).await;
                    if balance < amount {
                        return Ok(json!({ "status": 409, "refused": "insufficient funds" }));
                    }
                    debit(&mut *tx.lock().await, &accounts, amount).await?;
                    Ok::<_, BoxError>(json!({ "status": 201, "balance": balance - amount }))
                })
                .await
        }

        /// Debits 10 first, then runs `then` (which fails, hangs or
        /// panics).
        async fn debit_then<F, Fut>(
            &self,
            key: &str,
            limits: TransactionLimits,
            then: F,
        ) -> Result<Outcome<Value>, Error<BoxError>>
        where
            F: FnOnce(SqlxPgTransaction) -> Fut,
            Fut: std::future::Future<Output = Result<Value, BoxError>>,
        {
            let (accounts, runs) = (self.accounts.clone(), self.runs.clone());
            let attempt = Attempt::new("t", key, payload(10));
            self.engine
                .run_in_transaction(&attempt, limits, |tx| async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    debit(&mut *tx.lock().await, &accounts, 10).await?;
                    then(tx).await
                })
                .await
        }
    }

    /// A function of the application's own, taking `&mut PgConnection`.
    async fn debit(
        connection: &mut sqlx::PgConnection,
        accounts: &str,
        amount: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&format!(
            "UPDATE {accounts} SET balance = balance - $1 WHERE id = 'acct'"
        ))
        .bind(amount)
        .persistent(false)
        .execute(connection)
        .await?;
        Ok(())
    }

    async fn a_balance_check_commits_with_its_record_and_is_replayed(url: &str) {
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
        let reused = bank.pay("k", 31, limits(), Duration::ZERO).await;
        assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
        // The balance check refuses, and its answer is stored.
        let refused = bank
            .pay("big", 500, limits(), Duration::ZERO)
            .await
            .expect("answered");
        assert_eq!(refused.value()["status"], 409);
        let replay = bank
            .pay("big", 500, limits(), Duration::ZERO)
            .await
            .expect("replayed");
        assert_eq!(replay.kind(), OutcomeKind::Replay);
        assert_eq!(bank.balance().await, 70);
        assert_eq!(bank.runs(), 2);
    }

    async fn concurrent_duplicates_run_once(url: &str) {
        let bank = bank(url, 8).await;
        // Half through each engine: the server's row lock decides between
        // the two environments.
        let burst: Vec<_> = (0..40)
            .map(|n| {
                let bank = bank.clone();
                tokio::spawn(async move {
                    let engine = if n % 2 == 0 {
                        &bank.engine
                    } else {
                        &bank.elsewhere
                    };
                    bank.pay_through(engine, "burst", 10, limits(), Duration::from_millis(50))
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
        assert_eq!(bank.runs(), 1);
        assert_eq!(bank.balance().await, 90);

        // A duplicate of a running payment, from elsewhere, is answered
        // within the claim wait (the server's lock_timeout), not when the
        // payment ends.
        let first = tokio::spawn({
            let bank = bank.clone();
            async move {
                bank.pay("slow", 10, limits(), Duration::from_millis(1500))
                    .await
            }
        });
        while bank.runs() == 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let started = Instant::now();
        let duplicate = bank
            .pay_through(
                &bank.elsewhere,
                "slow",
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
        first.await.expect("joined").expect("paid");
        assert_eq!(bank.balance().await, 80);
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
        assert!(bank.engine.inspect("t", "k").await.expect("read").is_none());
        let retry = bank
            .pay("k", 10, limits(), Duration::ZERO)
            .await
            .expect("ran");
        assert_eq!(retry.kind(), OutcomeKind::Fresh);
        assert_eq!(bank.balance().await, 90);
    }

    async fn a_dropped_future_or_a_panic_rolls_back_and_leaves_the_pool_clean(url: &str) {
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
        // Nothing of the dropped run is visible, and the pool's next
        // connection is not inside its transaction.
        // One simple query: outside a transaction, it starts its own, so
        // the transaction's start is the statement's.
        let row = sqlx::raw_sql("SELECT now() <> statement_timestamp()")
            .fetch_one(&bank.pool)
            .await
            .expect("a query on the pool");
        let in_transaction: bool = sqlx::Row::get(&row, 0);
        assert!(
            !in_transaction,
            "the pool handed out a connection mid-transaction"
        );
        assert_eq!(bank.balance().await, 100, "the debit was rolled back");
        assert!(bank.engine.inspect("t", "k").await.expect("read").is_none());
        let retry_with_wait = || limits().claim_wait(Duration::from_secs(5));
        let retry = bank
            .pay("k", 10, retry_with_wait(), Duration::ZERO)
            .await
            .expect("the retry runs");
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
        let retry = bank
            .pay("p", 10, retry_with_wait(), Duration::ZERO)
            .await
            .expect("the retry runs");
        assert_eq!(retry.kind(), OutcomeKind::Fresh);
        assert_eq!(bank.balance().await, 80);
    }

    async fn a_long_handler_is_stopped_at_its_time_limit(url: &str) {
        let bank = bank(url, 2).await;
        let bounded = limits().time_limit(Duration::from_millis(500));
        for hang in ["sql", "rust"] {
            let started = Instant::now();
            let result = bank
                .debit_then(hang, bounded, move |tx| async move {
                    if hang == "sql" {
                        sqlx::raw_sql("SELECT pg_sleep(30)")
                            .execute(&mut *tx.lock().await)
                            .await?;
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
            move |tx: SqlxPgTransaction| async move {
                debit(&mut *tx.lock().await, &accounts, 1).await?;
                let refused = debit(&mut *tx.lock().await, &accounts, 500).await;
                match refused {
                    Err(error) => match rules.refusal(&error) {
                        Some(refusal) => {
                            tx.roll_back_writes().await?;
                            Ok(json!({ "status": 422, "constraint": refusal.constraint }))
                        }
                        None => Err(BoxError::from(error)),
                    },
                    Ok(()) => Ok(json!({ "status": 201 })),
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
                let _ = debit(&mut *tx.lock().await, &accounts, 500).await;
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

    /// The handler takes the transaction from the task
    /// (`SqlxPgTransaction::current`), as an event consumer's does.
    async fn the_current_transaction_is_the_handlers(url: &str) {
        let bank = bank(url, 2).await;
        let accounts = bank.accounts.clone();
        let attempt = Attempt::new("t", "current", payload(10));
        bank.engine
            .run_in_transaction(&attempt, limits(), |_| async move {
                let tx = SqlxPgTransaction::current().ok_or("no current transaction")?;
                let mut connection = tx.lock().await;
                debit(&mut connection, &accounts, 10).await?;
                // Rolling back while the connection is lent is an error at
                // once, not a wait on itself until the time limit.
                let lent = tx.roll_back_writes().await.expect_err("lent");
                assert_eq!(lent.kind(), StoreErrorKind::Misconfigured, "{lent}");
                drop(connection);
                Ok::<_, BoxError>(json!({ "status": 201 }))
            })
            .await
            .expect("paid");
        assert!(SqlxPgTransaction::current().is_none());
        assert_eq!(bank.balance().await, 90);
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
            /// The partitioned layout: the record's lock is the
            /// transaction's, taken with the claim.
            mod partitioned {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    crate::PARTITIONED.scope(true, super::$scenario(&super::url())).await
                })*
            }
            mod partitioned_through_pgbouncer {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    crate::PARTITIONED
                        .scope(true, super::$scenario(&super::pgbouncer_url()))
                        .await
                })*
            }
            /// With prepared statements, the lock and the claim are two
            /// round trips.
            mod partitioned_prepared {
                $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $scenario() {
                    let url = super::url();
                    let run = super::$scenario(&url);
                    crate::PARTITIONED
                        .scope(true, crate::sqlx_store::PREPARED_STORE.scope(true, run))
                        .await
                })*
            }
        };
    }

    on_both!(
        a_balance_check_commits_with_its_record_and_is_replayed,
        concurrent_duplicates_run_once,
        an_error_rolls_everything_back_and_frees_the_key,
        a_dropped_future_or_a_panic_rolls_back_and_leaves_the_pool_clean,
        a_long_handler_is_stopped_at_its_time_limit,
        a_refusal_by_constraint_is_stored_without_its_writes,
        the_current_transaction_is_the_handlers,
    );
}

/// The two PostgreSQL stores side by side (BENCHMARKS.md, "PostgreSQL:
/// tokio-postgres and sqlx"): interleaved rounds of sequential new keys
/// and replays on one server, each store on its own table and pool of 4,
/// the order of the stores rotated each round. The sqlx store in both its
/// modes, each over a pool with sqlx's default options (a ping before each
/// connection is handed out, `test_before_acquire`) and over one without
/// that ping. Not a test: `scripts/with-postgres cargo test --profile
/// bench --test postgres stores_side_by_side -- --ignored --nocapture`
/// (BENCH_ROUNDS, default 5; BENCH_N keys a round, default 500).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a benchmark: run it by name with --ignored"]
async fn stores_side_by_side() {
    let rounds: usize =
        std::env::var("BENCH_ROUNDS").map_or(5, |v| v.parse().expect("BENCH_ROUNDS"));
    let n: usize = std::env::var("BENCH_N").map_or(500, |v| v.parse().expect("BENCH_N"));
    let tokio_pg = {
        let n = TABLES.fetch_add(1, Ordering::SeqCst);
        let store =
            PostgresStore::connect(&url(), format!("bench_pg_{}_{n}", std::process::id()), 4)
                .expect("pool");
        store.create_table().await.expect("table");
        Engine::builder(store).build()
    };
    async fn sqlx_engine(ping: bool, prepared: bool) -> Engine<SqlxPostgresStore> {
        let store = store_on(&url(), 1).await;
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .test_before_acquire(ping)
            .connect_lazy(&url())
            .expect("pool");
        let store = SqlxPostgresStore::new(pool, store.table())
            .expect("store")
            .prepared_statements(prepared);
        Engine::builder(store).build()
    }
    let sqlx = [
        sqlx_engine(true, false).await,
        sqlx_engine(true, true).await,
        sqlx_engine(false, false).await,
        sqlx_engine(false, true).await,
    ];
    async fn run<S: lambda_idempotency::store::Store>(
        engine: &Engine<S>,
        round: usize,
        n: usize,
    ) -> (f64, f64) {
        let mut new = Vec::with_capacity(n);
        let mut replay = Vec::with_capacity(n);
        for (times, _) in [(&mut new, "new"), (&mut replay, "replay")] {
            for i in 0..n {
                let key = format!("r{round}-{i}");
                let attempt = Attempt::new("t", &key, payload(1));
                let started = Instant::now();
                engine
                    .execute(&attempt, || async { Ok::<_, Declined>(1u8) })
                    .await
                    .expect("ran");
                times.push(started.elapsed().as_secs_f64() * 1e3);
            }
        }
        let median = |times: &mut Vec<f64>| {
            times.sort_by(f64::total_cmp);
            times[times.len() / 2]
        };
        (median(&mut new), median(&mut replay))
    }
    // Warm-up: connections opened, statements cached.
    run(&tokio_pg, 1000, 50).await;
    for engine in &sqlx {
        run(engine, 1000, 50).await;
    }
    println!(
        "medians in ms, new / replay; ratios to tokio-postgres, new, replay\n\
         round | tokio-postgres | sqlx | sqlx prepared | sqlx, no ping | sqlx prepared, no ping \
         | sqlx / t-p | prepared / t-p | sqlx, no ping / t-p | prepared, no ping / t-p"
    );
    let stores = 1 + sqlx.len();
    for round in 0..rounds {
        let mut results = vec![(0.0, 0.0); stores];
        for turn in 0..stores {
            let which = (round + turn) % stores;
            results[which] = match which {
                0 => run(&tokio_pg, round, n).await,
                _ => run(&sqlx[which - 1], round, n).await,
            };
        }
        let (pn, pr) = results[0];
        let medians: Vec<String> = results
            .iter()
            .map(|(new, replay)| format!("{new:.3} / {replay:.3}"))
            .collect();
        let ratios: Vec<String> = results[1..]
            .iter()
            .map(|(new, replay)| format!("{:.2}, {:.2}", new / pn, replay / pr))
            .collect();
        println!("{round} | {} | {}", medians.join(" | "), ratios.join(" | "));
    }
}

/// The same catalog estimate as the tokio-postgres store's, over sqlx.
#[tokio::test]
async fn the_table_size_is_the_catalogs_estimate_over_sqlx() {
    use lambda_idempotency::store::{Accuracy, SizeSource};
    let store = store().await;
    let engine = Engine::builder(store.clone()).build();
    support::table_size::complete_records(&engine, 5).await;
    sqlx::raw_sql(&format!("ANALYZE {}", store.table()))
        .execute(store.pool())
        .await
        .expect("analyze");
    let size = engine.sample_table_size().await.unwrap().expect("counted");
    let bytes: i64 = sqlx::query_scalar("SELECT pg_total_relation_size(to_regclass($1))")
        .bind(store.table())
        .fetch_one(store.pool())
        .await
        .expect("size");
    assert_eq!(
        (size.records, size.bytes, size.accuracy, size.source),
        (
            5,
            Some(bytes as u64),
            Accuracy::Estimated,
            SizeSource::PgClass
        )
    );
}

/// Recovery points on the sqlx store, directly and with its statements
/// prepared (the steps column in the database: `crate::steps`).
mod steps {
    use super::*;

    lambda_idempotency::store_conformance! {
        steps: store(),
    }

    mod prepared {
        use super::*;

        lambda_idempotency::store_conformance! {
            steps: async { store().await.prepared_statements(true) },
        }
    }

    /// Every step write sent twice (its first answer lost): the engine
    /// recognises its own landed write.
    #[tokio::test]
    async fn a_takeover_resumes_after_steps_whose_answers_were_lost() {
        use lambda_idempotency::testing::{scenarios, LostAnswers};
        scenarios::a_takeover_resumes_after_the_recorded_steps(LostAnswers(store().await)).await;
        scenarios::a_failure_after_a_step_keeps_it(LostAnswers(store().await)).await;
    }

    #[tokio::test]
    async fn steps_live_in_the_row_until_its_completion() {
        for prepared in [false, true] {
            let store = store().await.prepared_statements(prepared);
            let table = store.table().to_owned();
            crate::steps_kit::steps_live_in_the_row_until_its_completion(store, move |id| {
                crate::steps::raw(table.clone(), id)
            })
            .await;
        }
    }

    #[tokio::test]
    async fn a_step_inside_the_transaction_just_runs() {
        let store = store().await;
        let table = store.table().to_owned();
        crate::steps_kit::a_step_inside_the_transaction_just_runs(store, move |id| {
            crate::steps::raw(table.clone(), id)
        })
        .await;
    }

    /// A table made before the `steps` column: the same check and the
    /// same words as the tokio-postgres store's.
    #[tokio::test]
    async fn a_table_made_before_the_steps_column_is_named_with_its_migration() {
        let table = format!("sqlx_before_column_{}", std::process::id());
        let old = include_str!("../../src/store/pg/table.sql")
            .replace(",\n    steps            jsonb", "")
            .replace("idempotency", &table);
        tokio_postgres_client()
            .await
            .batch_execute(&format!("DROP TABLE IF EXISTS {table}; {old}"))
            .await
            .expect("the table as it was");
        let store = SqlxPostgresStore::new(pool(&url(), 2), table.as_str()).expect("store");
        let said = "ALTER TABLE <table> ADD COLUMN IF NOT EXISTS steps jsonb";
        let error = store.create_table().await.expect_err("refused");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
        assert!(error.to_string().contains(said), "{error}");
        let id = lambda_idempotency::store::RecordId::new("p", "t", "before-steps");
        let error = store
            .claim(&crate::steps_kit::claim(&id, "owner-a"))
            .await
            .expect_err("no column");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
        assert!(error.to_string().contains(said), "{error}");
    }
}
