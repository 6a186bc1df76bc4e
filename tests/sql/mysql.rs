//! The MySQL store (sqlx) against a real server (MariaDB, Debian's MySQL):
//! the whole conformance kit, transactional writes and their refusals, and
//! the handler inside the transaction (a balance check under a row lock,
//! refusals, rollbacks, the claim wait, the time limit, storms).
//!
//! Needs `IDEMPOTENCY_TEST_MYSQL_URL`; `make test` starts a server
//! (`scripts/with-mysql`) and provides it.

use lambda_idempotency::{
    store::{
        sqlx::mysql::{SqlxMySqlStore, SqlxMySqlTransaction, SqlxMySqlWrite},
        Store, TransactionLimits,
    },
    testing::scenarios::{payload, Charge, Declined},
    Attempt, Engine, Error, OutcomeKind, StoreErrorKind,
};
use sqlx::{mysql::MySqlPoolOptions, MySqlPool};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

fn charge(amount: u64) -> Charge {
    Charge {
        id: format!("ch_{amount}"),
        amount,
    }
}

fn url() -> String {
    std::env::var("IDEMPOTENCY_TEST_MYSQL_URL").unwrap_or_else(|_| {
        panic!(
            "IDEMPOTENCY_TEST_MYSQL_URL is not set: run these tests with `make test`, or \
             `scripts/with-mysql cargo test --test postgres mysql` (it starts a throwaway server)"
        )
    })
}

static TABLES: AtomicUsize = AtomicUsize::new(0);

fn pool(max: u32) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy(&url())
        .expect("pool")
}

/// A store over a fresh table of its own.
async fn store() -> SqlxMySqlStore {
    let n = TABLES.fetch_add(1, Ordering::SeqCst);
    let table = format!("idem_{}_{n}", std::process::id());
    let store = SqlxMySqlStore::new(pool(16), table).expect("store");
    store.create_table().await.expect("create table");
    store
}

async fn run(pool: &MySqlPool, sql: &str) {
    sqlx::raw_sql(sql).execute(pool).await.expect(sql);
}

async fn scalar(pool: &MySqlPool, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(pool).await.expect(sql)
}

lambda_idempotency::store_conformance! {
    store: store(),
    unavailable: async {
        // A closed port: every call fails fast as unavailable.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let pool = MySqlPoolOptions::new()
            .acquire_timeout(Duration::from_secs(2))
            .connect_lazy(&format!("mysql://root@127.0.0.1:{port}/idempotency"))
            .expect("pool");
        SqlxMySqlStore::new(pool, "idempotency").expect("store")
    },
}

/// The completer on MySQL.
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
async fn a_table_name_the_store_cannot_use_is_refused() {
    for name in ["", "a-b", "a;DROP TABLE x", &"x".repeat(65)] {
        let error = SqlxMySqlStore::new(pool(1), name).expect_err(name);
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{name}");
    }
}

#[tokio::test]
async fn a_missing_table_is_misconfigured_not_an_outage() {
    let store = SqlxMySqlStore::new(pool(1), "no_such_table").expect("store");
    let engine = Engine::builder(store).build();
    let outcome = engine
        .execute(&Attempt::new("t", "k", payload(1)), || async {
            Ok::<_, Declined>(charge(1))
        })
        .await;
    match outcome {
        Err(Error::Store(error)) => assert_eq!(error.kind(), StoreErrorKind::Misconfigured),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn transactional_writes_commit_with_the_record_and_refusals_name_their_code() {
    let store = store().await;
    let charges = format!("{}_charges", store.table());
    run(
        store.pool(),
        &format!("CREATE TABLE {charges} (id VARCHAR(64) PRIMARY KEY, amount BIGINT NOT NULL)"),
    )
    .await;
    let engine = Engine::builder(store.clone()).build();
    let insert = |id: &str| {
        SqlxMySqlWrite::new(format!("INSERT INTO {charges} (id, amount) VALUES (?, ?)"))
            .bind(id)
            .bind(1250_i64)
    };
    let first = engine
        .execute_transactional(&Attempt::new("t", "k", payload(1250)), || async {
            Ok::<_, Declined>((charge(1250), vec![insert("ch_1")]))
        })
        .await
        .expect("committed");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    assert_eq!(
        scalar(store.pool(), &format!("SELECT COUNT(*) FROM {charges}")).await,
        1
    );
    // Another key whose write is refused (the charge exists): nothing of
    // it committed, its claim released, the refusal named.
    let refused = engine
        .execute_transactional(&Attempt::new("t", "k2", payload(1250)), || async {
            Ok::<_, Declined>((charge(1250), vec![insert("ch_1")]))
        })
        .await;
    let Err(Error::Store(error)) = refused else {
        panic!("{refused:?}")
    };
    let refusal = error.write_refusal().expect("a refusal");
    assert_eq!(refusal.code, "1062");
    assert_eq!(refusal.constraint.as_deref(), Some("PRIMARY"));
    let id = engine.record_id("t", "k2");
    assert_eq!(store.get(&id, engine.now_ms()).await.expect("read"), None);
}

/// An account with a balance of 100, paid from inside the transaction that
/// holds each payment's claim.
struct Bank {
    engine: Engine<SqlxMySqlStore>,
    accounts: String,
    runs: Arc<AtomicUsize>,
}

impl Bank {
    async fn new() -> Self {
        let store = store().await;
        let accounts = format!("{}_accounts", store.table());
        run(
            store.pool(),
            &format!(
                "CREATE TABLE {accounts} (id VARCHAR(16) PRIMARY KEY, balance BIGINT NOT NULL, \
                 CONSTRAINT {accounts}_not_negative CHECK (balance >= 0)); \
                 INSERT INTO {accounts} VALUES ('acct', 100)"
            ),
        )
        .await;
        Self {
            engine: Engine::builder(store).build(),
            accounts,
            runs: Arc::default(),
        }
    }

    async fn balance(&self) -> i64 {
        let sql = format!("SELECT balance FROM {} WHERE id = 'acct'", self.accounts);
        scalar(self.engine.store().pool(), &sql).await
    }

    /// Pays `amount` under key `key`: the balance read under a row lock,
    /// `pause`, then the debit; too little is a refusal, stored.
    async fn pay(
        &self,
        key: &str,
        amount: i64,
        pause: Duration,
        limits: TransactionLimits,
    ) -> Result<lambda_idempotency::Outcome<String>, Error<sqlx::Error>> {
        let (accounts, runs) = (self.accounts.clone(), Arc::clone(&self.runs));
        let attempt = Attempt::new("bank", key, payload(amount as u64));
        self.engine
            .run_in_transaction(&attempt, limits, |tx: SqlxMySqlTransaction| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let mut connection = tx.connection().await;
                let balance: i64 = sqlx::query_scalar(&format!(
                    "SELECT balance FROM {accounts} WHERE id = 'acct' FOR UPDATE"
                ))
                .fetch_one(&mut *connection)
                .await?;
                tokio::time::sleep(pause).await;
                if balance < amount {
                    drop(connection);
                    tx.roll_back_writes().await.expect("roll back");
                    return Ok("insufficient funds".to_owned());
                }
                sqlx::query(&format!(
                    "UPDATE {accounts} SET balance = balance - ? WHERE id = 'acct'"
                ))
                .bind(amount)
                .execute(&mut *connection)
                .await?;
                Ok(format!("paid, {} left", balance - amount))
            })
            .await
    }
}

fn limits() -> TransactionLimits {
    TransactionLimits::new()
        .claim_wait(Duration::from_millis(200))
        .time_limit(Duration::from_secs(5))
}

#[tokio::test]
async fn a_payment_inside_the_transaction_commits_once_and_replays() {
    let bank = Bank::new().await;
    let paid = bank
        .pay("p1", 30, Duration::ZERO, limits())
        .await
        .expect("paid");
    assert_eq!(paid.kind(), OutcomeKind::Fresh);
    assert_eq!(paid.value(), "paid, 70 left");
    let again = bank
        .pay("p1", 30, Duration::ZERO, limits())
        .await
        .expect("replay");
    assert!(again.is_replay(), "{:?}", again.kind());
    assert_eq!(bank.balance().await, 70);
    assert_eq!(bank.runs.load(Ordering::SeqCst), 1);
    // Too little: the refusal is stored, nothing debited, and replayed.
    let refused = bank
        .pay("p2", 500, Duration::ZERO, limits())
        .await
        .expect("stored");
    assert_eq!(refused.value(), "insufficient funds");
    let other = Engine::builder(bank.engine.store().clone()).build();
    let attempt = Attempt::new("bank", "p2", payload(500));
    let replay = other
        .run_in_transaction(&attempt, limits(), |_| async {
            Ok::<_, sqlx::Error>("ran again".to_owned())
        })
        .await
        .expect("replay");
    assert_eq!(replay.value(), "insufficient funds");
    assert_eq!(bank.balance().await, 70);
    // Another payload under a key: refused, not run.
    let reused = bank.pay("p1", 31, Duration::ZERO, limits()).await;
    assert!(matches!(reused, Err(Error::KeyReused)), "{reused:?}");
}

#[tokio::test]
async fn an_error_a_panic_or_a_drop_rolls_back_and_frees_the_key() {
    let bank = Bank::new().await;
    let accounts = bank.accounts.clone();
    let attempt = Attempt::new("bank", "p", payload(10));
    let failed = bank
        .engine
        .run_in_transaction(&attempt, limits(), |tx: SqlxMySqlTransaction| async move {
            let mut connection = tx.connection().await;
            sqlx::query(&format!("UPDATE {accounts} SET balance = balance - 10"))
                .execute(&mut *connection)
                .await?;
            // The provider declined after the debit.
            Err::<String, _>(sqlx::Error::RowNotFound)
        })
        .await;
    assert!(matches!(failed, Err(Error::Operation(_))), "{failed:?}");
    assert_eq!(bank.balance().await, 100, "the debit was rolled back");
    // A run dropped mid-way (a client gone, a crash): nothing of it stays.
    let dropped = tokio::time::timeout(
        Duration::from_millis(300),
        bank.pay("p", 10, Duration::from_secs(30), limits()),
    )
    .await;
    assert!(dropped.is_err());
    let engine = bank.engine.clone();
    let accounts = bank.accounts.clone();
    let panicked = tokio::spawn(async move {
        engine
            .run_in_transaction(&attempt, limits(), |tx: SqlxMySqlTransaction| async move {
                let mut connection = tx.connection().await;
                sqlx::query(&format!("UPDATE {accounts} SET balance = balance - 10"))
                    .execute(&mut *connection)
                    .await?;
                if sqlx::Connection::ping(&mut *connection).await.is_ok() {
                    panic!("the handler's own panic");
                }
                Ok::<_, sqlx::Error>("unreachable".to_owned())
            })
            .await
    })
    .await;
    assert!(panicked.is_err_and(|e| e.is_panic()));
    assert_eq!(bank.balance().await, 100);
    let retry = bank
        .pay("p", 10, Duration::ZERO, limits())
        .await
        .expect("runs");
    assert_eq!(retry.kind(), OutcomeKind::Fresh);
    assert_eq!(bank.balance().await, 90);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_duplicate_waits_the_claim_wait_then_replays_or_is_in_progress() {
    let bank = Arc::new(Bank::new().await);
    let holding = tokio::spawn({
        let bank = Arc::clone(&bank);
        async move {
            bank.pay("p", 10, Duration::from_millis(1500), limits())
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Another process's duplicate: the store's lock keeps it out, for the
    // claim wait (200 ms, under MySQL's whole second), then in progress.
    let other = Bank {
        engine: Engine::builder(bank.engine.store().clone()).build(),
        accounts: bank.accounts.clone(),
        runs: Arc::clone(&bank.runs),
    };
    let started = std::time::Instant::now();
    let busy = other.pay("p", 10, Duration::ZERO, limits()).await;
    let waited = started.elapsed();
    assert!(matches!(busy, Err(Error::InProgress { .. })), "{busy:?}");
    assert!(waited < Duration::from_millis(900), "waited {waited:?}");
    // A longer wait sees it commit: the replay.
    let patient = limits().claim_wait(Duration::from_secs(5));
    let replay = other
        .pay("p", 10, Duration::ZERO, patient)
        .await
        .expect("replay");
    assert!(replay.is_replay());
    assert!(holding.await.unwrap().is_ok());
    assert_eq!(bank.balance().await, 90);
    assert_eq!(bank.runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn past_its_time_limit_the_handler_is_stopped_and_rolled_back() {
    let bank = Bank::new().await;
    let short = limits().time_limit(Duration::from_millis(300));
    let late = bank.pay("p", 10, Duration::from_secs(3), short).await;
    assert!(
        matches!(late, Err(Error::TimeLimitExceeded { .. })),
        "{late:?}"
    );
    assert_eq!(bank.balance().await, 100);
    // The key is free, and the row lock was let go.
    let paid = bank
        .pay("p", 10, Duration::ZERO, limits())
        .await
        .expect("paid");
    assert_eq!(paid.kind(), OutcomeKind::Fresh);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_concurrent_duplicates_inside_transactions_pay_once() {
    let bank = Arc::new(Bank::new().await);
    let patient = limits().claim_wait(Duration::from_secs(10));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            // Each its own engine: only the database keeps them apart.
            let other = Bank {
                engine: Engine::builder(bank.engine.store().clone()).build(),
                accounts: bank.accounts.clone(),
                runs: Arc::clone(&bank.runs),
            };
            tokio::spawn(async move {
                other
                    .pay("storm", 10, Duration::from_millis(5), patient)
                    .await
            })
        })
        .collect();
    let mut fresh = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(outcome) if outcome.kind() == OutcomeKind::Fresh => fresh += 1,
            Ok(outcome) => assert!(outcome.is_replay()),
            Err(Error::InProgress { .. }) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(fresh, 1);
    assert_eq!(bank.runs.load(Ordering::SeqCst), 1);
    assert_eq!(bank.balance().await, 90);
}

#[tokio::test]
async fn a_claim_outside_a_transaction_is_taken_over_inside_one_and_told() {
    let bank = Bank::new().await;
    let store = bank.engine.store().clone();
    // A claim made outside a transaction, whose lease passed (a crash).
    let short = Engine::builder(store.clone())
        .default_lease(Duration::from_secs(1))
        .build();
    let crashed = tokio::time::timeout(
        Duration::from_millis(100),
        short.execute(&Attempt::new("bank", "p", payload(10)), || async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Declined>(Charge {
                id: "x".into(),
                amount: 10,
            })
        }),
    )
    .await;
    assert!(crashed.is_err());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let told = bank
        .engine
        .run_in_transaction(
            &Attempt::new("bank", "p", payload(10)),
            limits(),
            |tx: SqlxMySqlTransaction| async move {
                Ok::<_, sqlx::Error>(tx.takeover().map(|t| t.attempt))
            },
        )
        .await
        .expect("taken over");
    assert_eq!(told.into_value(), Some(2));
}

/// Server settings other than the defaults, as managed MySQL often runs
/// them: `ANSI_QUOTES` and `NO_BACKSLASH_ESCAPES` in `sql_mode`, and
/// `READ COMMITTED`. A key prefix with quotes, backslashes and non-ASCII
/// text is written and read as it is; duplicates still run once, and the
/// handler inside its transaction still pays once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn other_server_settings_change_nothing() {
    use sqlx::Executor;
    let pool = MySqlPoolOptions::new()
        .max_connections(16)
        .after_connect(|connection, _| {
            Box::pin(async move {
                connection
                    .execute(
                        "SET SESSION sql_mode = 'ANSI_QUOTES,NO_BACKSLASH_ESCAPES,STRICT_ALL_TABLES'",
                    )
                    .await?;
                connection
                    .execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                    .await?;
                Ok(())
            })
        })
        .connect_lazy(&url())
        .expect("pool");
    let table = format!("idem_{}_settings", std::process::id());
    let store = SqlxMySqlStore::new(pool, table).expect("store");
    store.create_table().await.expect("create table");
    let prefix = r#"it's "quoted" \ été"#;
    let engine = Engine::builder(store.clone()).key_prefix(prefix).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let (engine, runs) = (
                Engine::builder(store.clone()).key_prefix(prefix).build(),
                Arc::clone(&runs),
            );
            tokio::spawn(async move {
                engine
                    .execute(&Attempt::new("t", "k", payload(1)), || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        Ok::<_, Declined>(charge(1))
                    })
                    .await
            })
        })
        .collect();
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) | Err(Error::InProgress { .. }) => {}
            Err(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1, "ran once");
    let id = engine.record_id("t", "k");
    assert!(id.as_str().starts_with(prefix));
    let record = store
        .get(&id, engine.now_ms())
        .await
        .expect("read")
        .expect("a record");
    assert_eq!(record.id, id, "the id read back as written");
    let replay = engine
        .execute(&Attempt::new("t", "k", payload(1)), || async {
            Ok::<_, Declined>(charge(2))
        })
        .await
        .expect("replay");
    assert!(replay.is_replay());
    let in_progress = store.list_in_progress(prefix, 10).await.expect("list");
    assert!(in_progress.is_empty());
}

/// A record id longer than the table holds (a long key prefix) is refused
/// before any write, as a value out of the store's range, and nothing runs:
/// on a server that is not strict (an empty `sql_mode`), MySQL would cut
/// the id to fit, and two keys would share a record.
#[tokio::test]
async fn an_id_longer_than_the_table_holds_is_rejected_before_any_write() {
    use sqlx::Executor;
    let pool = MySqlPoolOptions::new()
        .max_connections(2)
        .after_connect(|connection, _| {
            Box::pin(async move {
                connection.execute("SET SESSION sql_mode = ''").await?;
                Ok(())
            })
        })
        .connect_lazy(&url())
        .expect("pool");
    let table = format!("idem_{}_lax", std::process::id());
    let store = SqlxMySqlStore::new(pool, table).expect("store");
    store.create_table().await.expect("create table");
    let engine = Engine::builder(store.clone())
        .key_prefix("p".repeat(500))
        .build();
    let ran = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&ran);
    let outcome = engine
        .execute(&Attempt::new("t", "k", payload(1)), || async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Declined>(charge(1))
        })
        .await;
    match outcome {
        Err(Error::Store(error)) => assert_eq!(error.kind(), StoreErrorKind::Rejected, "{error}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(ran.load(Ordering::SeqCst), 0);
}

/// InnoDB's estimate from `information_schema.TABLES`, once analyzed (a
/// small table's estimate is its count; MySQL 8 caches it for
/// `information_schema_stats_expiry`, which `ANALYZE TABLE` refreshes).
#[tokio::test]
async fn the_table_size_is_information_schemas_estimate() {
    use lambda_idempotency::store::{Accuracy, SizeSource};
    let store = store().await;
    let engine = Engine::builder(store.clone()).build();
    crate::support::table_size::complete_records(&engine, 8).await;
    run(store.pool(), &format!("ANALYZE TABLE `{}`", store.table())).await;
    let size = engine.sample_table_size().await.unwrap().expect("counted");
    let bytes = scalar(
        store.pool(),
        &format!(
            "SELECT CAST(DATA_LENGTH + INDEX_LENGTH AS SIGNED) FROM information_schema.TABLES \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{}'",
            store.table()
        ),
    )
    .await;
    assert_eq!(
        (size.records, size.bytes, size.accuracy, size.source),
        (
            8,
            Some(bytes as u64),
            Accuracy::Estimated,
            SizeSource::InformationSchema
        )
    );
    let missing = SqlxMySqlStore::new(pool(1), "no_such_table").expect("store");
    let error = missing.table_size(0).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
}

/// Recovery points: each step one fenced `UPDATE` of the record's `steps`
/// column (`JSON`).
mod steps {
    use super::*;
    use crate::steps_kit;
    use lambda_idempotency::{
        store::{Completion, Conditional, OwnerToken, RecordId, StepWrite},
        testing::{scenarios, LostAnswers},
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
    async fn raw(table: String, id: String) -> Option<serde_json::Value> {
        let text: Option<String> = sqlx::query_scalar(&format!(
            "SELECT CAST(steps AS CHAR) FROM `{table}` WHERE id = ?"
        ))
        .bind(id)
        .fetch_one(&pool(1))
        .await
        .expect("the record");
        text.map(|text| serde_json::from_str(&text).expect("JSON"))
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

    /// A store whose connections have another SQL mode (double quotes
    /// name identifiers, backslashes are characters) and another
    /// collation than sqlx's.
    async fn store_with_other_settings() -> SqlxMySqlStore {
        use sqlx::Executor;
        let pool = MySqlPoolOptions::new()
            .max_connections(4)
            .after_connect(|connection, _| {
                Box::pin(async move {
                    connection
                        .execute(
                            "SET SESSION sql_mode = 'ANSI_QUOTES,NO_BACKSLASH_ESCAPES,STRICT_ALL_TABLES'",
                        )
                        .await?;
                    connection
                        .execute("SET collation_connection = utf8mb4_general_ci")
                        .await?;
                    Ok(())
                })
            })
            .connect_lazy(&url())
            .expect("pool");
        let n = TABLES.fetch_add(1, Ordering::SeqCst);
        let table = format!("idem_{}_{n}_steps_settings", std::process::id());
        let store = SqlxMySqlStore::new(pool, table).expect("store");
        store.create_table().await.expect("create table");
        store
    }

    mod other_settings {
        lambda_idempotency::store_conformance! {
            steps: super::store_with_other_settings(),
        }
    }

    #[tokio::test]
    async fn a_step_inside_the_transaction_just_runs() {
        let store = store().await;
        let table = store.table().to_owned();
        steps_kit::a_step_inside_the_transaction_just_runs(store, move |id| raw(table.clone(), id))
            .await;
    }

    /// A table made before the `steps` column: `create_table` names the
    /// migration, and so does each statement that needs the column (a
    /// completion, a step), before it writes anything. The migration is
    /// instant (`ALGORITHM=INSTANT` or an error), its conditional form
    /// (for MySQL 8, which has no `ADD COLUMN IF NOT EXISTS`) may run
    /// twice, and the record an earlier version left in progress (its
    /// `steps` NULL) is taken over, steps on and completes.
    #[tokio::test]
    async fn a_table_made_before_the_steps_column() {
        let pool = pool(2);
        let table = format!("before_column_{}", std::process::id());
        run(&pool, &format!("DROP TABLE IF EXISTS `{table}`")).await;
        run(
            &pool,
            &format!(
                "CREATE TABLE `{table}` (\
                   id VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, \
                   status VARCHAR(16) NOT NULL, owner VARCHAR(1024) NOT NULL, \
                   fingerprint VARCHAR(1024) NOT NULL, expiration_s BIGINT NOT NULL, \
                   lease_until_ms BIGINT NULL, response LONGBLOB NULL, \
                   created_at_ms BIGINT NULL, completed_at_ms BIGINT NULL, \
                   attempt INT NOT NULL DEFAULT 1, first_started_ms BIGINT NULL, \
                   PRIMARY KEY (id)) ENGINE=InnoDB"
            ),
        )
        .await;
        let store = SqlxMySqlStore::new(pool.clone(), table.as_str()).expect("store");
        let said = "ADD COLUMN steps JSON NULL, ALGORITHM=INSTANT";
        let error = store.create_table().await.expect_err("refused");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
        assert!(error.to_string().contains(said), "{error}");

        // A claim fails before anything runs; a completion and a step of
        // a claim made before (by an earlier version) fail too.
        let fresh = steps_kit::claim(&RecordId::new("p", "t", "fresh"), "owner-f");
        let error = store.claim(&fresh).await.expect_err("no column");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
        assert!(error.to_string().contains(said), "{error}");
        let earlier = |claim: &lambda_idempotency::store::Claim| {
            format!(
                "INSERT INTO `{table}` (id, status, owner, fingerprint, expiration_s, \
                 lease_until_ms, created_at_ms, attempt, first_started_ms) \
                 VALUES ('{}', 'IN_PROGRESS', '{}', '{}', {}, {}, {}, 1, {})",
                claim.id.as_str(),
                claim.owner.as_str(),
                claim.fingerprint.as_str(),
                claim.expiration_s,
                claim.lease_until_ms,
                claim.now_ms,
                claim.now_ms
            )
        };
        run(&pool, &earlier(&fresh)).await;
        let step = StepWrite::new(
            fresh.id.clone(),
            fresh.owner.clone(),
            0,
            "charge",
            b"1".to_vec(),
            fresh.now_ms,
        );
        let error = store.record_step(&step).await.expect_err("no column");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
        assert!(error.to_string().contains(said), "{error}");
        let completion = Completion {
            id: fresh.id.clone(),
            owner: fresh.owner.clone(),
            response: b"done".to_vec(),
            expiration_s: fresh.expiration_s,
            now_ms: fresh.now_ms,
            writes: Vec::new(),
        };
        let error = store.complete(completion).await.expect_err("no column");
        assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
        assert!(error.to_string().contains(said), "{error}");

        // The record an earlier version wrote, its lease lapsed.
        let id = RecordId::new("p", "t", "before-steps");
        let mut a = steps_kit::claim(&id, "owner-a");
        a.lease_until_ms = a.now_ms - 1;
        run(&pool, &earlier(&a)).await;

        // MySQL 8's way to add it only where it is missing: twice.
        let mut connection = pool.acquire().await.expect("connection");
        for _ in 0..2 {
            for statement in [
                format!(
                    "SET @add_steps = IF((SELECT COUNT(*) FROM information_schema.COLUMNS \
                       WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{table}' \
                       AND COLUMN_NAME = 'steps') = 0, \
                     'ALTER TABLE `{table}` ADD COLUMN steps JSON NULL, ALGORITHM=INSTANT', \
                     'DO 0')"
                ),
                "PREPARE add_steps FROM @add_steps".to_owned(),
                "EXECUTE add_steps".to_owned(),
                "DEALLOCATE PREPARE add_steps".to_owned(),
            ] {
                sqlx::raw_sql(&statement)
                    .execute(&mut *connection)
                    .await
                    .expect(&statement);
            }
        }
        // The plain statement, once more: refused, nothing changed.
        let again = sqlx::raw_sql(&format!(
            "ALTER TABLE `{table}` ADD COLUMN steps JSON NULL, ALGORITHM=INSTANT"
        ))
        .execute(&mut *connection)
        .await
        .expect_err("the column is there");
        assert_eq!(
            again
                .as_database_error()
                .and_then(|e| e.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>())
                .map(|e| e.number()),
            Some(1060),
            "{again}"
        );
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
        let completion = Completion {
            id: id.clone(),
            owner: b.owner.clone(),
            response: b"done".to_vec(),
            expiration_s: b.expiration_s,
            now_ms: b.now_ms,
            writes: Vec::new(),
        };
        assert_eq!(
            store.complete(completion).await.expect("complete"),
            Conditional::Applied
        );
        assert_eq!(raw(table, id.as_str().to_owned()).await, None);
    }
}
