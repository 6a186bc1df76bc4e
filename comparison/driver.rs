//! The Rust side of `make bench`: one workload, run by this crate, by raw
//! DynamoDB calls (the floor: a conditional PutItem and an UpdateItem with
//! the record's shape), or by the handler without idempotency.
//!
//! Modes `single` and `floor-tx` are the transactional pair: the crate's
//! single write (`Engine::run_single_write`) against a raw
//! `TransactWriteItems` of the same two items (the completed record and a
//! charge item), its floor.
//!
//! Mode `cost` runs one scenario of the cost benchmark (`make bench-cost`,
//! `BENCH_COST_SCENARIO`): requests of a known response size
//! (`BENCH_RESPONSE_BYTES`) through the recording proxy of
//! `comparison/dynamodb_proxy.py`, each measured request between two marks.
//!
//! `bench_driver crate|cached|floor|bare|single|floor-tx|cost`, with the
//! environment of `comparison/run.py`. Prints one JSON line of results.

use aws_sdk_dynamodb::{
    config::{
        interceptors::BeforeSerializationInterceptorContextRef, ConfigBag, Credentials, Intercept,
        Region,
    },
    primitives::Blob,
    types::{AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem},
    Client,
};
use lambda_idempotency::{
    encryption::{Encryption, RawKeys},
    store::{postgres::PostgresStore, redis::RedisStore, Store},
    testing::CountingStore,
    Attempt, DynamoDbStore, Engine, Fingerprint, Json, OutcomeKind,
};
use serde::{Deserialize, Serialize};
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Instant, SystemTime, UNIX_EPOCH},
};

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Order {
    order_id: String,
    amount: u64,
    currency: String,
    customer: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct ChargeResult {
    id: String,
    amount: u64,
    currency: String,
}

fn order(key: &str) -> Order {
    Order {
        order_id: key.to_owned(),
        amount: 1250,
        currency: "EUR".into(),
        customer: "cus_42".into(),
    }
}

/// The business logic: the same in every driver.
async fn charge(order: &Order) -> Result<ChargeResult, std::io::Error> {
    Ok(ChargeResult {
        id: format!("ch_{}", order.order_id),
        amount: order.amount,
        currency: order.currency.clone(),
    })
}

#[derive(Debug, Default, Clone)]
struct Calls(Arc<AtomicU64>);

impl Intercept for Calls {
    fn name(&self) -> &'static str {
        "Calls"
    }

    fn read_before_execution(
        &self,
        _: &BeforeSerializationInterceptorContextRef<'_>,
        _: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        self.0.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

#[derive(Clone)]
enum Runner {
    Engine(Engine<DynamoDbStore>),
    Postgres(Engine<CountingStore<PostgresStore>>),
    Redis(Engine<CountingStore<RedisStore>>),
    /// The connection, the two scripts, and the run's key prefix (its
    /// table name: each run has its own keys on the shared server).
    RedisFloor(
        redis::aio::ConnectionManager,
        Arc<redis::Script>,
        Arc<redis::Script>,
        Arc<str>,
    ),
    Single(Engine<DynamoDbStore>, Arc<str>),
    Floor(Client, Arc<str>),
    FloorTransaction(Client, Arc<str>),
    Bare,
}

/// The business write both transactional drivers commit with the record.
fn charge_put(table: &str, key: &str) -> Option<TransactWriteItem> {
    let put = Put::builder()
        .table_name(table)
        .item("id", AttributeValue::S(format!("charge#{key}")))
        .item("amount", AttributeValue::N("1250".into()))
        .item("currency", AttributeValue::S("EUR".into()))
        .build()
        .ok()?;
    Some(TransactWriteItem::builder().put(put).build())
}

impl Runner {
    async fn call(&self, key: &str) -> bool {
        let order = order(key);
        match self {
            Runner::Bare => charge(&order).await.is_ok(),
            Runner::Engine(engine) => idempotent_charge(engine, key, &order).await,
            Runner::Postgres(engine) => idempotent_charge(engine, key, &order).await,
            Runner::Redis(engine) => idempotent_charge(engine, key, &order).await,
            Runner::RedisFloor(connection, claim, complete, prefix) => {
                // The two scripts the protocol cannot avoid, as bare as they
                // come, with the handler between them.
                let mut connection = connection.clone();
                let claimed: redis::RedisResult<i64> = claim
                    .key(format!("floor:{prefix}:{key}"))
                    .invoke_async(&mut connection)
                    .await;
                if claimed != Ok(1) {
                    return false;
                }
                let Ok(result) = charge(&order).await else {
                    return false;
                };
                let Ok(response) = serde_json::to_vec(&result) else {
                    return false;
                };
                let completed: redis::RedisResult<i64> = complete
                    .key(format!("floor:{prefix}:{key}"))
                    .arg(response)
                    .invoke_async(&mut connection)
                    .await;
                completed == Ok(1)
            }
            Runner::Single(engine, table) => {
                let Ok(fingerprint) = Fingerprint::of_json(&order) else {
                    return false;
                };
                let attempt = Attempt::new("bench", key, fingerprint);
                matches!(
                    engine
                        .run_single_write(&attempt, &Json, |_| async {
                            let result = charge(&order).await?;
                            let write = charge_put(table, key)
                                .ok_or_else(|| std::io::Error::other("invalid put"))?;
                            Ok::<_, std::io::Error>((result, vec![write]))
                        })
                        .await
                        .map(|o| o.kind()),
                    Ok(OutcomeKind::Fresh | OutcomeKind::Replay | OutcomeKind::CachedReplay)
                )
            }
            Runner::FloorTransaction(client, table) => {
                // The same two items in one transaction, conditioned as the
                // crate's commit is, with the handler before it.
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                let Ok(result) = charge(&order).await else {
                    return false;
                };
                let Ok(response) = serde_json::to_vec(&result) else {
                    return false;
                };
                let record = Put::builder()
                    .table_name(&**table)
                    .item("id", AttributeValue::S(format!("floor#{key}")))
                    .item("status", AttributeValue::S("COMPLETED".into()))
                    .item(
                        "expiration",
                        AttributeValue::N((now.as_secs() + 86_400).to_string()),
                    )
                    .item(
                        "owner",
                        AttributeValue::S("0123456789abcdef0123456789abcdef".into()),
                    )
                    .item("fingerprint", AttributeValue::S("f".repeat(64)))
                    .item("response", AttributeValue::B(Blob::new(response)))
                    .item("created_at", AttributeValue::N(now.as_millis().to_string()))
                    .item(
                        "completed_at",
                        AttributeValue::N(now.as_millis().to_string()),
                    )
                    .item("attempt", AttributeValue::N("1".into()))
                    .item(
                        "first_started_at",
                        AttributeValue::N(now.as_millis().to_string()),
                    )
                    .condition_expression(
                        "attribute_not_exists(#id) OR #expiration < :now_s \
                         OR (#status = :in_progress AND #lease_until < :now_ms)",
                    )
                    .expression_attribute_names("#id", "id")
                    .expression_attribute_names("#expiration", "expiration")
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_names("#lease_until", "lease_until")
                    .expression_attribute_values(
                        ":now_s",
                        AttributeValue::N(now.as_secs().to_string()),
                    )
                    .expression_attribute_values(
                        ":now_ms",
                        AttributeValue::N(now.as_millis().to_string()),
                    )
                    .expression_attribute_values(
                        ":in_progress",
                        AttributeValue::S("IN_PROGRESS".into()),
                    )
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .build();
                let (Ok(record), Some(write)) = (record, charge_put(table, key)) else {
                    return false;
                };
                client
                    .transact_write_items()
                    .transact_items(TransactWriteItem::builder().put(record).build())
                    .transact_items(write)
                    .client_request_token(format!("{:032x}", now.as_nanos()))
                    .send()
                    .await
                    .is_ok()
            }
            Runner::Floor(client, table) => {
                // The two writes the protocol cannot avoid, with the same
                // item shape, and the handler between them.
                let now = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                let id = AttributeValue::S(format!("floor#{key}"));
                let put = client
                    .put_item()
                    .table_name(&**table)
                    .item("id", id.clone())
                    .item("status", AttributeValue::S("IN_PROGRESS".into()))
                    .item(
                        "expiration",
                        AttributeValue::N((now.as_secs() + 86_400).to_string()),
                    )
                    .item(
                        "lease_until",
                        AttributeValue::N((now.as_millis() + 60_000).to_string()),
                    )
                    .item(
                        "owner",
                        AttributeValue::S("0123456789abcdef0123456789abcdef".into()),
                    )
                    .item("fingerprint", AttributeValue::S("f".repeat(64)))
                    .condition_expression("attribute_not_exists(#id)")
                    .expression_attribute_names("#id", "id")
                    .send()
                    .await;
                if put.is_err() {
                    return false;
                }
                let Ok(result) = charge(&order).await else {
                    return false;
                };
                let Ok(response) = serde_json::to_vec(&result) else {
                    return false;
                };
                client
                    .update_item()
                    .table_name(&**table)
                    .key("id", id)
                    .update_expression(
                        "SET #status = :completed, #response = :response REMOVE #lease_until",
                    )
                    .condition_expression("#status = :in_progress")
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_names("#response", "response")
                    .expression_attribute_names("#lease_until", "lease_until")
                    .expression_attribute_values(
                        ":completed",
                        AttributeValue::S("COMPLETED".into()),
                    )
                    .expression_attribute_values(
                        ":in_progress",
                        AttributeValue::S("IN_PROGRESS".into()),
                    )
                    .expression_attribute_values(
                        ":response",
                        AttributeValue::B(Blob::new(response)),
                    )
                    .send()
                    .await
                    .is_ok()
            }
        }
    }
}

/// The crate's way, on any store.
async fn idempotent_charge<St: Store>(engine: &Engine<St>, key: &str, order: &Order) -> bool {
    let Ok(fingerprint) = Fingerprint::of_json(order) else {
        return false;
    };
    let attempt = Attempt::new("bench", key, fingerprint);
    matches!(
        engine
            .execute(&attempt, || charge(order))
            .await
            .map(|o| o.kind()),
        Ok(OutcomeKind::Fresh | OutcomeKind::Replay | OutcomeKind::CachedReplay)
    )
}

fn summary(mut latencies: Vec<f64>, wall_s: f64, calls: u64, requests: usize) -> serde_json::Value {
    latencies.sort_by(f64::total_cmp);
    let n = latencies.len();
    let median = if n == 0 {
        0.0
    } else if n % 2 == 1 {
        latencies[n / 2]
    } else {
        (latencies[n / 2 - 1] + latencies[n / 2]) / 2.0
    };
    serde_json::json!({
        "median_ms": median,
        "p99_ms": latencies.get((n * 99 / 100).min(n.saturating_sub(1))).copied().unwrap_or_default(),
        "throughput_rps": requests as f64 / wall_s,
        "calls_per_request": calls as f64 / requests as f64,
    })
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run this through comparison/run.py (make bench)")
    })
}

/// The single write and its floor, interleaved call by call in one process
/// (alternating which goes first), so that both see the same DynamoDB Local
/// state, JIT and garbage collector: the fair side-by-side of the two.
async fn pair(client: Client, table: Arc<str>, calls: &Calls) {
    let single = Runner::Single(
        Engine::builder(DynamoDbStore::new(client.clone(), &*table)).build(),
        Arc::clone(&table),
    );
    let floor = Runner::FloorTransaction(client, table);
    let n: usize = env("BENCH_N").parse().expect("BENCH_N");
    let warmup = n / 10;
    let (mut ours, mut theirs) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let (mut our_calls, mut their_calls) = (0, 0);
    for i in 0..warmup + n {
        let order: [(&Runner, bool); 2] = if i % 2 == 0 {
            [(&floor, false), (&single, true)]
        } else {
            [(&single, true), (&floor, false)]
        };
        for (runner, is_ours) in order {
            let key = format!("pair-{i}");
            let before = calls.0.load(Ordering::Relaxed);
            let call = Instant::now();
            assert!(runner.call(&key).await, "pair {key} failed");
            let ms = call.elapsed().as_secs_f64() * 1e3;
            let made = calls.0.load(Ordering::Relaxed) - before;
            if i < warmup {
                continue;
            }
            if is_ours {
                ours.push(ms);
                our_calls += made;
            } else {
                theirs.push(ms);
                their_calls += made;
            }
        }
    }
    let ours = summary(ours, 1.0, our_calls, n);
    let theirs = summary(theirs, 1.0, their_calls, n);
    let ratio = ours["median_ms"].as_f64().unwrap_or_default()
        / theirs["median_ms"].as_f64().unwrap_or(f64::NAN);
    println!(
        "{}",
        serde_json::json!({
            "impl": "single write vs raw TransactWriteItems, interleaved",
            "single_write": { "median_ms": ours["median_ms"], "p99_ms": ours["p99_ms"], "calls_per_request": ours["calls_per_request"] },
            "raw_transaction": { "median_ms": theirs["median_ms"], "p99_ms": theirs["p99_ms"], "calls_per_request": theirs["calls_per_request"] },
            "ratio": ratio,
        })
    );
}

/// `BENCH_RUNTIME=current_thread` runs the driver on tokio's
/// single-threaded runtime, as a Lambda function that serves one request at
/// a time can (`#[tokio::main(flavor = "current_thread")]`); the default is
/// the multi-threaded runtime of a plain `#[tokio::main]`.
fn main() {
    let current_thread = std::env::var("BENCH_RUNTIME").as_deref() == Ok("current_thread");
    let mut runtime = if current_thread {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    };
    runtime
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(drive(current_thread));
}

async fn drive(current_thread: bool) {
    let t0: u128 = env("BENCH_T0").parse().expect("BENCH_T0");
    let mode = std::env::args().nth(1).unwrap_or_else(|| "crate".into());
    let calls = Calls::default();
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("local", "local", None, None, "bench"))
        .endpoint_url(env("BENCH_ENDPOINT"))
        .interceptor(calls.clone())
        .build();
    let client = Client::from_conf(config);
    let table: Arc<str> = env("BENCH_TABLE").into();
    if mode == "pair" {
        return pair(client, table, &calls).await;
    }
    if mode == "cost" {
        return cost(client, table).await;
    }
    // Store calls, for the stores other than DynamoDB (whose calls the
    // client's interceptor counts): each is one round trip.
    let mut store_calls = None;
    let runner = match mode.as_str() {
        "postgres" => {
            let store =
                PostgresStore::connect(&env("BENCH_POSTGRES_URL"), &*table.replace('-', "_"), 16)
                    .expect("PostgreSQL URL");
            store.create_table().await.expect("create table");
            let store = CountingStore::new(store);
            let counted = store.clone();
            store_calls = Some(Box::new(move || counted.calls().total()) as Box<dyn Fn() -> u64>);
            Runner::Postgres(Engine::builder(store).build())
        }
        "redis" => {
            let store = CountingStore::new(
                RedisStore::open(&env("BENCH_REDIS_URL"))
                    .expect("Redis URL")
                    .namespace(format!("{table}:")),
            );
            let counted = store.clone();
            store_calls = Some(Box::new(move || counted.calls().total()) as Box<dyn Fn() -> u64>);
            Runner::Redis(Engine::builder(store).build())
        }
        "floor-redis" => {
            let client = redis::Client::open(env("BENCH_REDIS_URL")).expect("Redis URL");
            Runner::RedisFloor(
                redis::aio::ConnectionManager::new(client)
                    .await
                    .expect("connect"),
                Arc::new(redis::Script::new(
                    "if redis.call('HSETNX', KEYS[1], 'status', 'IN_PROGRESS') == 1 then return 1 end return 0",
                )),
                Arc::new(redis::Script::new(
                    "redis.call('HSET', KEYS[1], 'status', 'COMPLETED', 'response', ARGV[1]) return 1",
                )),
                Arc::clone(&table),
            )
        }
        "crate" => Runner::Engine(Engine::builder(DynamoDbStore::new(client, &*table)).build()),
        // The same, its responses sealed at rest (AES-256-GCM under a raw
        // key: what a data key cached by `KmsKeys` costs between two KMS
        // calls), to show the time encryption adds beside `crate`.
        "crate-encrypted" => Runner::Engine(
            Engine::builder(DynamoDbStore::new(client, &*table))
                .encryption(Encryption::new(
                    RawKeys::new("bench", &[7; 32]).expect("a 32-byte key"),
                    "bench",
                ))
                .build(),
        ),
        "cached" => Runner::Engine(
            Engine::builder(DynamoDbStore::new(client, &*table))
                .cache(4096)
                .build(),
        ),
        "floor" => Runner::Floor(client, table),
        "single" => Runner::Single(
            Engine::builder(DynamoDbStore::new(client, &*table)).build(),
            table,
        ),
        "floor-tx" => Runner::FloorTransaction(client, table),
        "bare" => Runner::Bare,
        other => panic!("unknown mode {other}"),
    };
    let count = || match &store_calls {
        Some(store_calls) => store_calls(),
        None => calls.0.load(Ordering::Relaxed),
    };

    assert!(runner.call("cold").await, "the first call failed");
    let cold_ms = (SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
        - t0) as f64
        / 1e6;

    let n: usize = env("BENCH_N").parse().expect("BENCH_N");
    let keys: Vec<String> = (0..n).map(|i| format!("{mode}-new-{i}")).collect();
    let mut results = serde_json::Map::new();
    for phase in ["new", "replay"] {
        if mode.starts_with("floor") && phase == "replay" {
            continue; // the floor has no replay: a replay is the failed claim alone
        }
        let (before, start) = (count(), Instant::now());
        let mut latencies = Vec::with_capacity(n);
        for key in &keys {
            let call = Instant::now();
            assert!(runner.call(key).await, "{phase} {key} failed");
            latencies.push(call.elapsed().as_secs_f64() * 1e3);
        }
        results.insert(
            phase.into(),
            summary(
                latencies,
                start.elapsed().as_secs_f64(),
                count() - before,
                n,
            ),
        );
    }

    let total: usize = env("BENCH_CONCURRENT").parse().expect("BENCH_CONCURRENT");
    let clients: usize = env("BENCH_CLIENTS").parse().expect("BENCH_CLIENTS");
    let mut rng = fastrand::Rng::with_seed(7);
    let mut issued: Vec<String> = Vec::with_capacity(total);
    for i in 0..total {
        let duplicate = !issued.is_empty() && rng.u32(..10) == 0 && !mode.starts_with("floor");
        issued.push(if duplicate {
            issued[rng.usize(..issued.len())].clone()
        } else {
            format!("{mode}-conc-{i}")
        });
    }
    let issued = Arc::new(issued);
    let next = Arc::new(AtomicU64::new(0));
    let (before, start) = (count(), Instant::now());
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (runner, issued, next) = (runner.clone(), Arc::clone(&issued), Arc::clone(&next));
            tokio::spawn(async move {
                let (mut latencies, mut errors) = (Vec::new(), 0);
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(key) = issued.get(i) else { break };
                    let call = Instant::now();
                    if runner.call(key).await {
                        latencies.push(call.elapsed().as_secs_f64() * 1e3);
                    } else {
                        errors += 1; // a duplicate in flight: 409
                    }
                }
                (latencies, errors)
            })
        })
        .collect();
    let (mut latencies, mut errors) = (Vec::new(), 0);
    for task in tasks {
        let (l, e) = task.await.expect("client");
        latencies.extend(l);
        errors += e;
    }
    let mut concurrent = summary(
        latencies,
        start.elapsed().as_secs_f64(),
        count() - before,
        total,
    );
    concurrent["errors"] = errors.into();
    results.insert("concurrent".into(), concurrent);

    let name = match mode.as_str() {
        "crate" => "lambda-idempotency",
        "crate-encrypted" => "lambda-idempotency (encrypted)",
        "postgres" => "lambda-idempotency (PostgreSQL)",
        "redis" => "lambda-idempotency (Redis)",
        "floor-redis" => "raw Redis scripts (floor)",
        "cached" => "lambda-idempotency (cache on)",
        "floor" => "raw DynamoDB (floor)",
        "single" => "lambda-idempotency single write (1 transaction)",
        "floor-tx" => "raw TransactWriteItems (single-write floor)",
        _ => "handler alone",
    };
    let name = if current_thread {
        format!("{name}, current-thread runtime")
    } else {
        name.to_owned()
    };
    println!(
        "{}",
        serde_json::json!({ "impl": name, "cold_start_ms": cold_ms, "results": results })
    );
}

/// The cost benchmark's response: the charge, padded with a receipt of hex
/// digits (the same generator in every driver) to `BENCH_RESPONSE_BYTES` of
/// compact JSON.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct PaddedCharge {
    id: String,
    amount: u64,
    currency: String,
    receipt: String,
}

fn hex_padding(len: usize) -> String {
    let mut seed: u64 = 7;
    (0..len)
        .map(|_| {
            seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648;
            b"0123456789abcdef"[((seed >> 16) & 15) as usize] as char
        })
        .collect()
}

fn padded_charge(order: &Order, bytes: usize, padding: &str) -> PaddedCharge {
    let mut charge = PaddedCharge {
        id: format!("ch_{}", order.order_id),
        amount: order.amount,
        currency: order.currency.clone(),
        receipt: String::new(),
    };
    let bare = serde_json::to_vec(&charge).map_or(0, |json| json.len());
    charge.receipt = padding[..bytes.saturating_sub(bare).min(padding.len())].to_owned();
    charge
}

/// Tells the recording proxy where a measured request starts or ends: a
/// plain HTTP request to it, outside the SDK, answered before the next call.
fn mark(endpoint: &str, label: &str) {
    use std::io::{Read, Write};
    let address = endpoint.trim_start_matches("http://").trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(address).expect("the recording proxy");
    write!(
        stream,
        "GET /__mark/{label} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .expect("mark");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
}

/// One scenario of the cost benchmark, `BENCH_N` measured requests.
async fn cost(client: Client, table: Arc<str>) {
    let scenario = env("BENCH_COST_SCENARIO");
    let n: usize = env("BENCH_N").parse().expect("BENCH_N");
    let bytes: usize = env("BENCH_RESPONSE_BYTES")
        .parse()
        .expect("BENCH_RESPONSE_BYTES");
    let endpoint = env("BENCH_ENDPOINT");
    let padding = hex_padding(bytes);
    let store = DynamoDbStore::new(client, &*table);
    // BENCH_COMPRESS_ABOVE: responses longer than this are stored compressed.
    let store = match std::env::var("BENCH_COMPRESS_ABOVE") {
        Ok(bytes) => store.compress_responses_above(bytes.parse().expect("BENCH_COMPRESS_ABOVE")),
        Err(_) => store,
    };
    // BENCH_READ_FIRST: the engine reads before it claims.
    let builder =
        Engine::builder(store).read_before_claim(std::env::var("BENCH_READ_FIRST").is_ok());
    let engine = if scenario == "cached" {
        builder.cache(4096).build()
    } else {
        builder.build()
    };
    let run_id = env("BENCH_T0");
    let mut outcomes: std::collections::BTreeMap<String, u64> = Default::default();
    for i in 0..n {
        let key = format!("{scenario}-{i}-{run_id}");
        let order = order(&key);
        let fingerprint = Fingerprint::of_json(&order).expect("fingerprint");
        let attempt = Attempt::new("bench", &key, fingerprint);
        let charge = || {
            let value = padded_charge(&order, bytes, &padding);
            async move { Ok::<_, std::io::Error>(value) }
        };
        let with_write = || {
            let value = padded_charge(&order, bytes, &padding);
            let write = charge_put(&table, &key);
            async move {
                let write = write.ok_or_else(|| std::io::Error::other("invalid put"))?;
                Ok::<_, std::io::Error>((value, vec![write]))
            }
        };
        // The set-up a scenario needs, outside the marks.
        let mut held = None;
        match scenario.as_str() {
            "replay" | "cached" | "mismatch" => {
                engine.execute(&attempt, charge).await.expect("set-up");
            }
            "in-progress" => {
                // A first request that holds its claim until told.
                let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
                let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
                let (engine, key, order, padding) =
                    (engine.clone(), key.clone(), order.clone(), padding.clone());
                let first = tokio::spawn(async move {
                    let fingerprint = Fingerprint::of_json(&order).expect("fingerprint");
                    let attempt = Attempt::new("bench", &key, fingerprint);
                    engine
                        .execute(&attempt, || async move {
                            let _ = entered_tx.send(());
                            let _ = release_rx.await;
                            Ok::<_, std::io::Error>(padded_charge(&order, bytes, &padding))
                        })
                        .await
                        .map(|o| o.kind())
                });
                entered_rx
                    .await
                    .expect("the first request entered its operation");
                held = Some((first, release_tx));
            }
            _ => {}
        }
        mark(&endpoint, "start");
        let outcome = match scenario.as_str() {
            "new" | "replay" | "cached" | "in-progress" => engine
                .execute(&attempt, charge)
                .await
                .map(|o| o.kind().as_str().to_owned()),
            "mismatch" => {
                let mut changed = order.clone();
                changed.amount += 1;
                let fingerprint = Fingerprint::of_json(&changed).expect("fingerprint");
                engine
                    .execute(&Attempt::new("bench", &key, fingerprint), charge)
                    .await
                    .map(|o| o.kind().as_str().to_owned())
            }
            "transactional" => engine
                .execute_transactional(&attempt, with_write)
                .await
                .map(|o| o.kind().as_str().to_owned()),
            "single" => engine
                .run_single_write(&attempt, &Json, |_| with_write())
                .await
                .map(|o| o.kind().as_str().to_owned()),
            other => panic!("unknown cost scenario {other}"),
        };
        mark(&endpoint, "end");
        let label = match outcome {
            Ok(kind) => kind,
            Err(error) => format!("{:?}", error.kind()),
        };
        *outcomes.entry(label).or_default() += 1;
        if let Some((first, release)) = held {
            let _ = release.send(());
            first.await.expect("first").expect("the held request");
        }
    }
    println!(
        "{}",
        serde_json::json!({ "impl": "lambda-idempotency", "scenario": scenario, "requests": n,
                            "response_bytes": bytes, "outcomes": outcomes })
    );
}
