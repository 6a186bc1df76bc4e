//! Randomised stress with an invariant checker, on every store: DynamoDB
//! Local behind the fault proxy (random throttling and lost answers), a
//! real PostgreSQL (through tokio-postgres and sqlx), a real MySQL
//! (MariaDB) and a real redis-server: many
//! keys, concurrent clients,
//! random delays, operations that outlive their lease, dropped futures,
//! operation errors, reused keys with other payloads.
//!
//! Size from the environment: `STRESS_KEYS` (200), `STRESS_CLIENTS` (32),
//! `STRESS_REQUESTS` (3000), `STRESS_SEED`. `make stress` runs a larger one
//! and prints the counts. Needs `AWS_ENDPOINT_URL_DYNAMODB`,
//! `IDEMPOTENCY_TEST_POSTGRES_URL`, `IDEMPOTENCY_TEST_MYSQL_URL` and
//! `IDEMPOTENCY_TEST_REDIS_URL` (`make test` provides them).

mod support;

use lambda_idempotency::{
    store::{
        postgres::PostgresStore, redis::RedisStore, sqlx::mysql::SqlxMySqlStore, Status, Store,
    },
    Attempt, Clock, Codec, DynamoDbStore, Engine, Error, Fingerprint, Json, OutcomeKind,
    SystemClock,
};
use serde::{Deserialize, Serialize};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};
use support::proxy::{Fault, FaultProxy};

/// What an execution returns, and what is stored and replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Receipt {
    key: u64,
    execution: u64,
    payload: u64,
}

/// One run of the operation.
#[derive(Debug, Clone)]
struct Execution {
    key: u64,
    id: u64,
    start_ms: u64,
    end_ms: Option<u64>,
    lease_until_ms: u64,
    /// The operation returned an error (its claim is released).
    failed: bool,
}

#[derive(Default)]
struct Log {
    executions: Vec<Execution>,
    next_execution: u64,
}

/// Marks an execution's end when its future finishes or is dropped.
struct EndGuard {
    log: Arc<Mutex<Log>>,
    index: usize,
}

impl Drop for EndGuard {
    fn drop(&mut self) {
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.executions[self.index].end_ms = Some(SystemClock.now_ms());
    }
}

#[derive(Debug, Default)]
struct Counts {
    requests: u64,
    fresh: u64,
    replays: u64,
    conflicts: u64,
    mismatches: u64,
    takeovers: u64,
    not_recorded: u64,
    dropped: u64,
    operation_errors: u64,
    store_errors: u64,
}

const LEASE_MS: u64 = 1_500;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomised_stress_keeps_every_invariant() {
    let direct = support::client();
    let table = support::create_idempotency_table(&direct).await;
    let proxy = FaultProxy::start(&support::endpoint()).await;
    proxy.chaos(
        20,
        &[
            Fault::Throttle,
            Fault::LoseAnswer,
            Fault::Delay(Duration::from_millis(30)),
            Fault::ServerError,
        ],
    );
    let (client, calls) = support::client_via(&proxy.url());
    let engine = Engine::builder(DynamoDbStore::new(client, table)).build();
    stress("DynamoDB Local behind the fault proxy", engine, || {
        format!(
            "DynamoDB calls: {}, faults injected: {} {:?}",
            calls.total(),
            proxy.injected_total(),
            proxy.injected()
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomised_stress_keeps_every_invariant_on_postgres() {
    let url = std::env::var("IDEMPOTENCY_TEST_POSTGRES_URL").expect(
        "IDEMPOTENCY_TEST_POSTGRES_URL is not set: run with make test, or under scripts/with-postgres",
    );
    let table = format!("stress_{}", std::process::id());
    let store = PostgresStore::connect(&url, table, 16).expect("pool");
    store.create_table().await.expect("table");
    stress("PostgreSQL", Engine::builder(store).build(), String::new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomised_stress_keeps_every_invariant_on_postgres_partitioned() {
    use lambda_idempotency::store::postgres::Partitioning;
    let url = std::env::var("IDEMPOTENCY_TEST_POSTGRES_URL").expect(
        "IDEMPOTENCY_TEST_POSTGRES_URL is not set: run with make test, or under scripts/with-postgres",
    );
    let table = format!("stress_parted_{}", std::process::id());
    let store = PostgresStore::connect(&url, table, 16)
        .expect("pool")
        .partitioned(Partitioning::daily());
    store.create_table().await.expect("table");
    stress(
        "PostgreSQL, partitioned",
        Engine::builder(store).build(),
        String::new,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomised_stress_keeps_every_invariant_on_postgres_through_sqlx() {
    use lambda_idempotency::store::sqlx::postgres::{
        sqlx::postgres::PgPoolOptions, SqlxPostgresStore,
    };
    let url = std::env::var("IDEMPOTENCY_TEST_POSTGRES_URL").expect(
        "IDEMPOTENCY_TEST_POSTGRES_URL is not set: run with make test, or under scripts/with-postgres",
    );
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_lazy(&url)
        .expect("pool");
    let table = format!("stress_sqlx_{}", std::process::id());
    let store = SqlxPostgresStore::new(pool, table).expect("store");
    store.create_table().await.expect("table");
    stress(
        "PostgreSQL (sqlx)",
        Engine::builder(store).build(),
        String::new,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomised_stress_keeps_every_invariant_on_postgres_partitioned_through_sqlx() {
    use lambda_idempotency::store::{
        postgres::Partitioning,
        sqlx::postgres::{sqlx::postgres::PgPoolOptions, SqlxPostgresStore},
    };
    let url = std::env::var("IDEMPOTENCY_TEST_POSTGRES_URL").expect(
        "IDEMPOTENCY_TEST_POSTGRES_URL is not set: run with make test, or under scripts/with-postgres",
    );
    let pool = PgPoolOptions::new()
        .max_connections(16)
        .connect_lazy(&url)
        .expect("pool");
    let table = format!("stress_sqlx_parted_{}", std::process::id());
    let store = SqlxPostgresStore::new(pool, table)
        .expect("store")
        .partitioned(Partitioning::daily());
    store.create_table().await.expect("table");
    stress(
        "PostgreSQL (sqlx), partitioned",
        Engine::builder(store).build(),
        String::new,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomised_stress_keeps_every_invariant_on_mysql() {
    let url = std::env::var("IDEMPOTENCY_TEST_MYSQL_URL").expect(
        "IDEMPOTENCY_TEST_MYSQL_URL is not set: run with make test, or under scripts/with-mysql",
    );
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(16)
        .connect_lazy(&url)
        .expect("pool");
    let store = SqlxMySqlStore::new(pool, format!("stress_{}", std::process::id())).expect("store");
    store.create_table().await.expect("table");
    stress("MySQL", Engine::builder(store).build(), String::new).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn randomised_stress_keeps_every_invariant_on_redis() {
    let url = std::env::var("IDEMPOTENCY_TEST_REDIS_URL").expect(
        "IDEMPOTENCY_TEST_REDIS_URL is not set: run with make test, or under scripts/with-redis",
    );
    let store = RedisStore::open(&url)
        .expect("url")
        .namespace(format!("stress-{}:", std::process::id()));
    stress("Redis", Engine::builder(store).build(), String::new).await;
}

/// Drives `engine` with the random mix, then checks every invariant.
async fn stress<St: Store>(label: &str, engine: Engine<St>, report: impl FnOnce() -> String) {
    let (keys, clients, requests, seed) = (
        support::env_or("STRESS_KEYS", 200),
        support::env_or("STRESS_CLIENTS", 32),
        support::env_or("STRESS_REQUESTS", 3000),
        support::env_or("STRESS_SEED", 0x5eed),
    );
    let log = Arc::new(Mutex::new(Log::default()));
    let counts = Arc::new(Mutex::new(Counts::default()));
    // (key, requested payload, receipt served) for every value served.
    let served = Arc::new(Mutex::new(Vec::<(u64, u64, Receipt, OutcomeKind)>::new()));
    // Executions whose invocation was dropped (a Lambda timeout) mid-flight.
    let dropped = Arc::new(Mutex::new(Vec::<u64>::new()));

    let per_client = requests / clients;
    let tasks = (0..clients).map(|client| {
        let (engine, log, counts, served, dropped) = (
            engine.clone(),
            Arc::clone(&log),
            Arc::clone(&counts),
            Arc::clone(&served),
            Arc::clone(&dropped),
        );
        tokio::spawn(async move {
            // Seeded per client, for reproducible runs.
            let mut rng =
                fastrand::Rng::with_seed(seed ^ (client + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            for _ in 0..per_client {
                let key = rng.u64(..keys);
                // 5% reuse the key with another payload.
                let payload = if rng.u64(..100) < 5 {
                    key + 1_000_000
                } else {
                    key
                };
                let sleep_ms = match rng.u64(..100) {
                    // Outlives its lease: invites a takeover, and a zombie.
                    0..=3 => LEASE_MS + 100 + rng.u64(..800),
                    // Slow: long enough to be running when a zombie wakes up.
                    4..=13 => 100 + rng.u64(..400),
                    _ => rng.u64(..20),
                };
                let fail = rng.u64(..100) < 2;
                let drop_after = (rng.u64(..100) < 3).then(|| Duration::from_millis(rng.u64(..40)));
                let key_text = key.to_string();
                let now = SystemClock.now_ms();
                let lease_until_ms = now + LEASE_MS;
                let attempt = Attempt::new(
                    "stress",
                    &key_text,
                    Fingerprint::of_bytes(&payload.to_be_bytes()),
                )
                .deadline_ms(lease_until_ms);
                let running = Arc::new(Mutex::new(None::<u64>));
                let operation = {
                    let log = Arc::clone(&log);
                    let running = Arc::clone(&running);
                    move || async move {
                        let (index, id) = {
                            let mut log = log.lock().unwrap();
                            let id = log.next_execution;
                            log.next_execution += 1;
                            log.executions.push(Execution {
                                key,
                                id,
                                start_ms: SystemClock.now_ms(),
                                end_ms: None,
                                lease_until_ms,
                                failed: fail,
                            });
                            (log.executions.len() - 1, id)
                        };
                        *running.lock().unwrap() = Some(id);
                        let _end = EndGuard { log, index };
                        tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
                        if fail {
                            return Err("operation failed");
                        }
                        Ok(Receipt {
                            key,
                            execution: id,
                            payload,
                        })
                    }
                };
                let run = engine.execute(&attempt, operation);
                let result = match drop_after {
                    Some(after) => tokio::time::timeout(after, run).await.ok(),
                    None => Some(run.await),
                };
                let mut counts = counts.lock().unwrap();
                counts.requests += 1;
                match result {
                    None => {
                        counts.dropped += 1;
                        if let Some(id) = *running.lock().unwrap() {
                            dropped.lock().unwrap().push(id);
                        }
                    }
                    Some(Ok(outcome)) => {
                        match outcome.kind() {
                            OutcomeKind::Fresh => counts.fresh += 1,
                            OutcomeKind::Replay | OutcomeKind::CachedReplay => counts.replays += 1,
                            OutcomeKind::LeaseLost => counts.takeovers += 1,
                            OutcomeKind::NotRecorded => counts.not_recorded += 1,
                            other => panic!("unexpected outcome {other:?}"),
                        }
                        served.lock().unwrap().push((
                            key,
                            payload,
                            outcome.value().clone(),
                            outcome.kind(),
                        ));
                    }
                    Some(Err(Error::InProgress { .. })) => counts.conflicts += 1,
                    // A claim answered after its 1.5 s lease had passed (an
                    // SDK's backoff after injected faults): nothing ran, and
                    // the client is told to retry, as with a 409.
                    Some(Err(Error::LeaseLost)) => counts.conflicts += 1,
                    Some(Err(Error::KeyReused)) => counts.mismatches += 1,
                    Some(Err(Error::Operation(_))) => counts.operation_errors += 1,
                    Some(Err(Error::Store(_))) => counts.store_errors += 1,
                    Some(Err(other)) => panic!("unexpected error {other:?}"),
                }
            }
        })
    });
    for task in tasks.collect::<Vec<_>>() {
        task.await.expect("no client panicked");
    }

    // Every client is done: take the results out of their locks.
    let log = std::mem::take(&mut *log.lock().unwrap());
    let counts = std::mem::take(&mut *counts.lock().unwrap());
    let served = std::mem::take(&mut *served.lock().unwrap());
    let dropped = std::mem::take(&mut *dropped.lock().unwrap());
    println!(
        "stress ({label}): {keys} keys, {clients} clients, seed {seed:#x}\n  {counts:?}\n  executions: {}  {}",
        log.executions.len(),
        report()
    );

    // 1. While a claim is live, nothing else runs its key: two executions of
    //    one key overlap only if the later one began after the earlier one's
    //    lease had passed.
    let mut by_key: HashMap<u64, Vec<&Execution>> = HashMap::new();
    for execution in &log.executions {
        by_key.entry(execution.key).or_default().push(execution);
    }
    for executions in by_key.values_mut() {
        executions.sort_by_key(|e| e.start_ms);
        for (i, a) in executions.iter().enumerate() {
            for b in &executions[i + 1..] {
                let a_end = a.end_ms.unwrap_or(u64::MAX);
                if b.start_ms < a_end {
                    assert!(
                        b.start_ms > a.lease_until_ms,
                        "key {}: execution {} started at {} while {} ran under a lease until {}",
                        a.key,
                        b.id,
                        b.start_ms,
                        a.id,
                        a.lease_until_ms
                    );
                }
            }
        }
    }

    // 2. No key ever holds two completed responses, and 3. every value
    //    served for a key is its one stored response, for the payload asked.
    let mut fresh_by_key: HashMap<u64, &Receipt> = HashMap::new();
    for (key, payload, receipt, kind) in served.iter() {
        assert_eq!(receipt.key, *key, "a response for another key");
        assert_eq!(
            receipt.payload, *payload,
            "key {key}: a response for another payload was served"
        );
        if *kind == OutcomeKind::Fresh {
            assert!(
                fresh_by_key.insert(*key, receipt).is_none(),
                "key {key} completed twice"
            );
        }
    }
    let now = SystemClock.now_ms();
    for key in 0..keys {
        let record = engine
            .store()
            .get(&engine.record_id("stress", &key.to_string()), now)
            .await
            .expect("read");
        let Some(record) = record.filter(|r| r.status == Status::Completed) else {
            continue;
        };
        let stored: Receipt = Json
            .decode(record.response.as_deref().unwrap_or_default())
            .expect("decode");
        if let Some(fresh) = fresh_by_key.get(&key) {
            assert_eq!(
                *fresh, &stored,
                "key {key}: the stored response is the fresh one"
            );
        }
        for (_, _, receipt, kind) in served.iter().filter(|(k, ..)| *k == key) {
            if matches!(kind, OutcomeKind::Replay | OutcomeKind::CachedReplay) {
                assert_eq!(
                    receipt, &stored,
                    "key {key}: a replay differs from the stored response"
                );
            }
        }
    }

    // 4. A key's operation ran once, or once more per execution that could
    //    not complete under its claim: dropped mid-flight, failed (claim
    //    released), outlived its lease, or finished but was not stored (lost
    //    lease, completion failed). Only the stored execution goes unexcused.
    let unstored: Vec<u64> = served
        .iter()
        .filter(|(.., kind)| matches!(kind, OutcomeKind::LeaseLost | OutcomeKind::NotRecorded))
        .map(|(_, _, receipt, _)| receipt.execution)
        .collect();
    let mut reruns = 0;
    for (key, executions) in &by_key {
        let unexcused: Vec<u64> = executions
            .iter()
            .filter(|e| {
                !(dropped.contains(&e.id)
                    || e.failed
                    || e.end_ms.is_none_or(|end| end > e.lease_until_ms)
                    || unstored.contains(&e.id))
            })
            .map(|e| e.id)
            .collect();
        assert!(
            unexcused.len() <= 1,
            "key {key} ran {unexcused:?} with no lease passing or failure between them"
        );
        if let Some(id) = unexcused.first() {
            let stored = fresh_by_key.get(key).map(|receipt| receipt.execution);
            assert!(
                stored.is_none() || stored == Some(*id),
                "key {key}: execution {id} ran but {stored:?} is stored"
            );
        }
        reruns += executions.len().saturating_sub(1);
    }
    println!("  {label}: keys run more than once, each excused: {reruns} extra executions");
    assert!(
        counts.replays > 0 && counts.conflicts > 0 && counts.mismatches > 0,
        "the mix exercised the protocol: {counts:?}"
    );
    assert!(counts.requests >= per_client * clients);
}
