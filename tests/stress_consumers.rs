//! Randomised stress of the stream consumers, with the event source
//! mapping simulated: shards (Kinesis) and partitions (Kafka) read in
//! random batches, redelivered, retried after failures, invoked twice at
//! once (Lambda's duplicate invocations), and invocations dropped mid-flight
//! (timeouts), against DynamoDB Local behind the fault proxy (throttling,
//! lost answers, delays, server errors). Producers send some records twice
//! (a business key catches them).
//!
//! Invariants, checked once every shard is consumed to its end: each key's
//! effect (an increment committed with its idempotency record) happened
//! exactly once; and a record's handler never started before the record
//! ahead of it in its shard had completed.
//!
//! Size from the environment: `STRESS_SHARDS` (4), `STRESS_RECORDS` (120
//! per shard), `STRESS_SEED`. Needs `AWS_ENDPOINT_URL_DYNAMODB`.

mod support;

use aws_lambda_events::{
    kafka::{KafkaEvent, KafkaRecord},
    kinesis::{KinesisEvent, KinesisEventRecord},
};
use aws_sdk_dynamodb::{
    types::{AttributeValue, TransactWriteItem, Update},
    Client,
};
use lambda_idempotency::{
    consumers::{KafkaBatch, KinesisBatch},
    Clock, DynamoDbStore, Engine, SystemClock,
};
use lambda_runtime::{Context, LambdaEvent};
use serde_json::{json, Value};
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Duration,
};
use support::proxy::{Fault, FaultProxy};

/// An invocation's time limit: the lease of the records it claims.
const DEADLINE_MS: u64 = 700;

/// One record as the producer wrote it.
#[derive(Debug, Clone)]
struct Produced {
    /// The business key: a producer's second send repeats it.
    key: String,
}

/// One run of the handler.
#[derive(Debug, Clone)]
struct Execution {
    shard: usize,
    index: usize,
    start_ms: u64,
    ok_end_ms: Option<u64>,
}

#[derive(Default)]
struct Log {
    executions: Vec<Execution>,
}

#[derive(Debug, Default)]
struct Counts {
    invocations: u64,
    duplicate_invocations: u64,
    dropped: u64,
    partial: u64,
}

/// How the simulated event source mapping retries.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mapping {
    /// Kinesis: resume from the reported checkpoint.
    Checkpoint,
    /// Kafka: a failed invocation gets the same batch again.
    WholeBatch,
}

/// The stream: per shard, its records in order.
fn produce(shards: usize, per_shard: usize, rng: &mut fastrand::Rng) -> Vec<Vec<Produced>> {
    let mut next = 0u64;
    let mut streams: Vec<Vec<Produced>> = vec![Vec::new(); shards];
    for stream in &mut streams {
        for _ in 0..per_shard {
            // 5% are a producer's second send of a recent record of the
            // same shard (same business key, new sequence number).
            let key = match stream.len() {
                len if len > 0 && rng.u64(..100) < 5 => {
                    stream[len - 1 - rng.usize(..len.min(5))].key.clone()
                }
                _ => {
                    next += 1;
                    format!("order-{next}")
                }
            };
            stream.push(Produced { key });
        }
    }
    streams
}

struct Harness {
    client: Client,
    counters: String,
    log: Arc<Mutex<Log>>,
    counts: Arc<Mutex<Counts>>,
    /// Shared with the key closures, which look records up in it.
    streams: Arc<Vec<Vec<Produced>>>,
    seed: u64,
}

impl Harness {
    /// The handler's effect: `count += 1` on the key's item, committed with
    /// the record. It fails 5% of its runs, and takes up to 8 ms.
    fn effect(
        &self,
        shard: usize,
        index: usize,
        rng_seed: u64,
    ) -> impl std::future::Future<Output = Result<((), Vec<TransactWriteItem>), String>> {
        let log = Arc::clone(&self.log);
        let counters = self.counters.clone();
        let key = self.streams[shard][index].key.clone();
        async move {
            let mut rng = fastrand::Rng::with_seed(rng_seed);
            let position = {
                let mut log = log.lock().unwrap();
                log.executions.push(Execution {
                    shard,
                    index,
                    start_ms: SystemClock.now_ms(),
                    ok_end_ms: None,
                });
                log.executions.len() - 1
            };
            tokio::time::sleep(Duration::from_millis(rng.u64(..8))).await;
            if rng.u64(..100) < 5 {
                return Err(format!("record {shard}/{index} failed"));
            }
            let update = Update::builder()
                .table_name(counters)
                .key("key", AttributeValue::S(key))
                .update_expression("ADD #count :one")
                .expression_attribute_names("#count", "count")
                .expression_attribute_values(":one", AttributeValue::N("1".into()))
                .build()
                .map_err(|e| e.to_string())?;
            log.lock().unwrap().executions[position].ok_end_ms = Some(SystemClock.now_ms());
            Ok((
                (),
                vec![TransactWriteItem::builder().update(update).build()],
            ))
        }
    }

    /// Consumes one shard to its end with `invoke`, which returns the
    /// position to resume from (`None`: the invocation failed as a whole).
    async fn consume<F, Fut>(&self, shard: usize, mapping: Mapping, invoke: F)
    where
        F: Fn(usize, usize, u64) -> Fut,
        Fut: std::future::Future<Output = Option<usize>>,
    {
        let mut rng = fastrand::Rng::with_seed(self.seed ^ ((shard as u64 + 1) * 0x9e37_79b9));
        let total = self.streams[shard].len();
        let mut position = 0;
        let mut invocations = 0;
        while position < total {
            invocations += 1;
            assert!(
                invocations < 5_000,
                "shard {shard} makes no progress at {position}"
            );
            let end = (position + 1 + rng.usize(..10)).min(total);
            let seed = rng.u64(..);
            let duplicate = rng.u64(..100) < 8;
            let drop_after = (rng.u64(..100) < 5).then(|| Duration::from_millis(rng.u64(..30)));
            let run = async {
                if duplicate {
                    // Lambda invokes the same batch twice at once.
                    let (a, b) =
                        tokio::join!(invoke(position, end, seed), invoke(position, end, seed ^ 1));
                    a.min(b)
                } else {
                    invoke(position, end, seed).await
                }
            };
            let result = match drop_after {
                Some(after) => tokio::time::timeout(after, run).await.ok().flatten(),
                None => run.await,
            };
            {
                let mut counts = self.counts.lock().unwrap();
                counts.invocations += 1;
                counts.duplicate_invocations += u64::from(duplicate);
                counts.dropped += u64::from(drop_after.is_some());
            }
            match result {
                Some(resume) if resume == end => position = end,
                Some(resume) => {
                    self.counts.lock().unwrap().partial += 1;
                    assert!(
                        mapping == Mapping::Checkpoint,
                        "only checkpoints resume midway"
                    );
                    assert!(
                        resume >= position && resume < end,
                        "checkpoint {resume} outside {position}..{end}"
                    );
                    position = resume;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                None => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    }

    /// Every key counted once; no record started before the one ahead of
    /// it in its shard had completed.
    async fn check(&self, label: &str) {
        let counts: HashMap<String, u64> = scan(&self.client, &self.counters).await;
        let keys: std::collections::HashSet<&String> =
            self.streams.iter().flatten().map(|p| &p.key).collect();
        for key in &keys {
            assert_eq!(
                counts.get(*key).copied(),
                Some(1),
                "{label}: {key} took effect {:?} times",
                counts.get(*key)
            );
        }
        assert_eq!(counts.len(), keys.len(), "{label}: effects of unknown keys");

        let log = self.log.lock().unwrap();
        // The first time each (shard, index) ended well, and each key.
        let mut key_done: HashMap<&str, u64> = HashMap::new();
        for execution in &log.executions {
            if let Some(end) = execution.ok_end_ms {
                let key = self.streams[execution.shard][execution.index].key.as_str();
                let done = key_done.entry(key).or_insert(end);
                *done = (*done).min(end);
            }
        }
        for execution in &log.executions {
            if execution.index == 0 {
                continue;
            }
            let ahead = &self.streams[execution.shard][execution.index - 1].key;
            let ready = key_done.get(ahead.as_str()).copied().unwrap_or(u64::MAX);
            assert!(
                ready <= execution.start_ms,
                "{label}: record {}/{} started at {} before the record ahead of it completed ({ready})",
                execution.shard,
                execution.index,
                execution.start_ms
            );
        }
        let counts = self.counts.lock().unwrap();
        eprintln!(
            "{label}: {} records in {} shards, {} keys; {} handler runs; {counts:?}",
            self.streams.iter().map(Vec::len).sum::<usize>(),
            self.streams.len(),
            keys.len(),
            log.executions.len(),
        );
    }
}

async fn scan(client: &Client, table: &str) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    let mut start = None;
    loop {
        let page = client
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
            .expect("scan");
        for item in page.items() {
            let key = item["key"].as_s().expect("S").clone();
            let count = item["count"].as_n().expect("N").parse().expect("a count");
            counts.insert(key, count);
        }
        start = page.last_evaluated_key().cloned();
        if start.is_none() {
            return counts;
        }
    }
}

async fn harness() -> (Harness, Engine<DynamoDbStore>, FaultProxy) {
    let (shards, per_shard, seed) = (
        support::env_or("STRESS_SHARDS", 4) as usize,
        support::env_or("STRESS_RECORDS", 120) as usize,
        support::env_or("STRESS_SEED", 0x5eed),
    );
    let direct = support::client();
    let table = support::create_idempotency_table(&direct).await;
    let counters = support::create_table_with(&direct, "counters", "key", None).await;
    let proxy = FaultProxy::start(&support::endpoint()).await;
    proxy.chaos(
        15,
        &[
            Fault::Throttle,
            Fault::LoseAnswer,
            Fault::Delay(Duration::from_millis(20)),
            Fault::ServerError,
        ],
    );
    let (client, _calls) = support::client_via(&proxy.url());
    let engine = Engine::builder(DynamoDbStore::new(client, table)).build();
    let mut rng = fastrand::Rng::with_seed(seed);
    let harness = Harness {
        client: direct,
        counters,
        log: Arc::default(),
        counts: Arc::default(),
        streams: Arc::new(produce(shards, per_shard, &mut rng)),
        seed,
    };
    (harness, engine, proxy)
}

fn context() -> Context {
    let mut context = Context::default();
    context.deadline = SystemClock.now_ms() + DEADLINE_MS;
    context
}

const STREAM_ARN: &str = "arn:aws:kinesis:eu-west-1:123456789012:stream/orders";

fn kinesis_event(shard: usize, from: usize, to: usize) -> KinesisEvent {
    let records: Vec<Value> = (from..to)
        .map(|index| {
            json!({
                "eventID": format!("shardId-{shard:012}:{index:020}"),
                "eventSourceARN": STREAM_ARN,
                "kinesis": {
                    "approximateArrivalTimestamp": 1_700_000_000.0,
                    "data": "",
                    // The same on a producer's second send: the fingerprint
                    // covers it.
                    "partitionKey": format!("pk-{shard}"),
                    "sequenceNumber": format!("{index:020}")
                }
            })
        })
        .collect();
    serde_json::from_value(json!({ "Records": records })).expect("a Kinesis event")
}

/// `shard/index` from a record's `eventID` (the simulator numbers shards
/// from 0 and sequence numbers by position).
fn place(record: &KinesisEventRecord) -> Option<(usize, usize)> {
    let (shard, sequence) = record.event_id.as_deref()?.split_once(':')?;
    let shard = shard.strip_prefix("shardId-")?;
    Some((shard.parse().ok()?, sequence.parse().ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kinesis_consumer_stress_takes_effect_once_per_key_in_order() {
    let (harness, engine, proxy) = harness().await;
    let harness = Arc::new(harness);
    let streams = Arc::clone(&harness.streams);
    let batch = KinesisBatch::new(engine, "stress-kinesis").key(move |record| {
        let (shard, index) = place(record)?;
        Some(streams.get(shard)?.get(index)?.key.clone())
    });
    let shards = (0..harness.streams.len()).map(|shard| {
        let (harness, batch) = (Arc::clone(&harness), batch.clone());
        tokio::spawn(async move {
            let invoke = |from: usize, to: usize, seed: u64| {
                let (harness, batch) = (Arc::clone(&harness), batch.clone());
                async move {
                    let event = LambdaEvent::new(kinesis_event(shard, from, to), context());
                    let handler = |record: KinesisEventRecord| {
                        let (shard, index) = place(&record).unwrap_or((0, 0));
                        harness.effect(shard, index, seed ^ index as u64)
                    };
                    let response = batch
                        .process_transactional(event, handler)
                        .await
                        .expect("Kinesis answers with a partial batch response");
                    // Resume from the reported sequence number, if any.
                    Some(match response.batch_item_failures.first() {
                        Some(failure) => failure
                            .item_identifier
                            .as_deref()
                            .and_then(|seq| seq.parse().ok())
                            .unwrap_or(from),
                        None => to,
                    })
                }
            };
            harness.consume(shard, Mapping::Checkpoint, invoke).await;
        })
    });
    for shard in shards.collect::<Vec<_>>() {
        shard.await.expect("shard consumer");
    }
    harness.check("Kinesis").await;
    eprintln!("faults injected: {:?}", proxy.injected());
}

fn kafka_event(partition: usize, from: usize, to: usize) -> KafkaEvent {
    let records: Vec<Value> = (from..to)
        .map(|offset| {
            json!({
                "topic": "orders", "partition": partition, "offset": offset,
                "timestamp": 1_763_800_000_000_i64, "timestampType": "CREATE_TIME",
                "value": "", "headers": []
            })
        })
        .collect();
    serde_json::from_value(json!({
        "eventSource": "aws:kafka",
        "records": { format!("orders-{partition}"): records }
    }))
    .expect("a Kafka event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_consumer_stress_takes_effect_once_per_key_in_order() {
    let (harness, engine, proxy) = harness().await;
    let harness = Arc::new(harness);
    let streams = Arc::clone(&harness.streams);
    let batch = KafkaBatch::new(engine, "stress-kafka").key(move |record: &KafkaRecord| {
        let partition = usize::try_from(record.partition).ok()?;
        let offset = usize::try_from(record.offset).ok()?;
        Some(streams.get(partition)?.get(offset)?.key.clone())
    });
    let partitions = (0..harness.streams.len()).map(|partition| {
        let (harness, batch) = (Arc::clone(&harness), batch.clone());
        tokio::spawn(async move {
            let invoke = |from: usize, to: usize, seed: u64| {
                let (harness, batch) = (Arc::clone(&harness), batch.clone());
                async move {
                    let event = LambdaEvent::new(kafka_event(partition, from, to), context());
                    let handler = |record: KafkaRecord| {
                        let offset = usize::try_from(record.offset).unwrap_or(0);
                        harness.effect(partition, offset, seed ^ offset as u64)
                    };
                    // A failed invocation: the mapping delivers the batch again.
                    batch
                        .process_transactional(event, handler)
                        .await
                        .ok()
                        .map(|()| to)
                }
            };
            harness
                .consume(partition, Mapping::WholeBatch, invoke)
                .await;
        })
    });
    for partition in partitions.collect::<Vec<_>>() {
        partition.await.expect("partition consumer");
    }
    harness.check("Kafka").await;
    eprintln!("faults injected: {:?}", proxy.injected());
}
