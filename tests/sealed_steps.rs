//! Recovery points with at-rest encryption, on the memory store, DynamoDB
//! Local, Redis, PostgreSQL and MySQL: each step's output is sealed as a response is, bound to
//! its record, the request's fingerprint, the step's name and its index,
//! and a takeover opens it before using it.
//!
//! The steps are read and changed behind the engine's back with each
//! store's own client (the memory store through a view of its reads): a
//! byte flipped, two steps' outputs swapped, their names swapped, the
//! steps reordered, another record's steps copied in. Every one is refused
//! (`ErrorKind::UnauthenticRecord`), every time it is retried, and the
//! step is never run again. Then a rotation, the steps recorded in the
//! clear before encryption was turned on, and sealed steps read by an
//! engine without encryption (a corrupt record, the step not run again).
//!
//! Needs the servers `make test` starts, each store's module only its own:
//! `scripts/with-dynamodb-local cargo test --test sealed_steps dynamodb::`,
//! `scripts/with-redis cargo test --test sealed_steps redis::`,
//! `scripts/with-postgres cargo test --test sealed_steps postgres::`,
//! `scripts/with-mysql cargo test --test sealed_steps mysql::`.

mod support;

use lambda_idempotency::{
    encryption::{key_id_of, Encryption, RawKeys},
    store::Store,
    Attempt, Engine, Error, ErrorKind, Fingerprint, Json, Mode,
};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicUsize, Ordering};

const PREFIX: &str = "sealed-steps";
const SCOPE: &str = "payments";
const CONTEXT: &str = "tests/sealed_steps";
const CARD: &str = "4242424242424242";

/// A store's steps, read and changed behind the engine's back: what
/// someone with write access to the table can do.
trait Raw: Sized + Send + Sync {
    type St: Store + Clone;

    /// A store over a fresh table (or namespace) of its own.
    async fn fresh() -> Self;
    fn store(&self) -> Self::St;
    /// The record's steps as stored: a name and the output's bytes each.
    async fn steps(&self, id: &str) -> Vec<(String, Vec<u8>)>;
    /// Replaces the record's steps as stored.
    async fn set_steps(&self, id: &str, steps: &[(String, Vec<u8>)]);
}

/// What the first step returns: a card number a reader of the table must
/// not see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Charge {
    id: String,
    card: String,
}

/// How often each step ran.
#[derive(Default)]
struct Runs {
    charge: AtomicUsize,
    ledger: AtomicUsize,
}

impl Runs {
    fn get(&self) -> (usize, usize) {
        (
            self.charge.load(Ordering::SeqCst),
            self.ledger.load(Ordering::SeqCst),
        )
    }
}

fn keys(id: &str, byte: u8) -> RawKeys {
    RawKeys::new(id, &[byte; 32]).expect("key")
}

fn sealing(keys: RawKeys) -> Encryption {
    Encryption::new(keys, CONTEXT)
}

fn engine<St: Store>(store: St, encryption: Option<Encryption>) -> Engine<St> {
    let builder = Engine::builder(store).key_prefix(PREFIX);
    match encryption {
        Some(encryption) => builder.encryption(encryption).build(),
        None => builder.build(),
    }
}

fn id<St: Store>(engine: &Engine<St>, key: &str) -> String {
    engine.record_id(SCOPE, key).as_str().to_owned()
}

/// An attempt at `key`: a charge, then a ledger entry, as steps; it fails
/// after `fail_after` steps (`None`: it completes). Its value, or the
/// kind of the error that stopped it (`Operation` for its own failure).
async fn attempt<St: Store>(
    engine: &Engine<St>,
    key: &str,
    fail_after: Option<usize>,
    runs: &Runs,
) -> Result<(Charge, usize), ErrorKind> {
    let attempt = Attempt::new(SCOPE, key, Fingerprint::of_bytes(b"1250 EUR"));
    let outcome = engine
        .run(&attempt, Mode::Plain, &Json, |claim| async move {
            let charge = claim
                .step("charge", || async {
                    let n = runs.charge.fetch_add(1, Ordering::SeqCst) + 1;
                    Ok::<_, ()>(Charge {
                        id: format!("ch_{n}"),
                        card: CARD.to_owned(),
                    })
                })
                .await?;
            if fail_after == Some(1) {
                return Err(Error::Operation(()));
            }
            let entry = claim
                .step("ledger", || async {
                    Ok::<_, ()>(runs.ledger.fetch_add(1, Ordering::SeqCst) + 1)
                })
                .await?;
            if fail_after == Some(2) {
                return Err(Error::Operation(()));
            }
            Ok::<_, Error<()>>(((charge, entry), Vec::new()))
        })
        .await;
    match outcome {
        Ok(outcome) => Ok(outcome.into_value()),
        Err(Error::Operation(inner)) => Err(inner.kind()),
        Err(other) => Err(other.kind()),
    }
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

fn charged(n: usize) -> Charge {
    Charge {
        id: format!("ch_{n}"),
        card: CARD.to_owned(),
    }
}

/// Each output is sealed at rest (under the primary key, nothing of it in
/// the clear), and a takeover resumes after the steps: neither runs again.
async fn sealed_at_rest_and_resumed<R: Raw>() {
    let raw = R::fresh().await;
    let engine = engine(raw.store(), Some(sealing(keys("k1", 1))));
    let runs = Runs::default();
    assert_eq!(
        attempt(&engine, "k", Some(2), &runs).await,
        Err(ErrorKind::Operation)
    );
    let steps = raw.steps(&id(&engine, "k")).await;
    assert_eq!(
        steps
            .iter()
            .map(|(name, _)| name.as_str())
            .collect::<Vec<_>>(),
        ["charge", "ledger"]
    );
    for (name, output) in &steps {
        assert_eq!(key_id_of(output), Some("k1"), "{name} sealed");
        assert!(
            !contains(output, CARD) && !contains(output, "ch_1"),
            "{name}"
        );
    }
    assert_eq!(
        attempt(&engine, "k", None, &runs).await,
        Ok((charged(1), 1)),
        "resumed after both steps"
    );
    assert_eq!(runs.get(), (1, 1), "each step ran once");
}

/// How a writer to the table changes the steps of record `a` (`b` holds
/// the same steps of another key, for the same payload).
#[derive(Debug, Clone, Copy)]
enum Tamper {
    /// A byte of the first step's sealed output flipped.
    FlippedByte,
    /// The two outputs swapped, each name keeping its place.
    SwappedOutputs,
    /// The two names swapped, each output keeping its place: an output
    /// opened under another step's name, at the index it was sealed for.
    SwappedNames,
    /// The two steps swapped, names and outputs together: each output
    /// under its own name, at another index.
    Reordered,
    /// Record `b`'s steps copied onto record `a`.
    FromAnotherRecord,
}

const TAMPERS: [Tamper; 5] = [
    Tamper::FlippedByte,
    Tamper::SwappedOutputs,
    Tamper::SwappedNames,
    Tamper::Reordered,
    Tamper::FromAnotherRecord,
];

/// Every tampering is refused, as a response that fails to open is: the
/// operation stops at the step with `UnauthenticRecord`, every retry
/// again, and no step runs a second time.
async fn tampered_steps_are_never_used<R: Raw>(tamper: Tamper) {
    let raw = R::fresh().await;
    let engine = engine(raw.store(), Some(sealing(keys("k1", 1))));
    let runs = Runs::default();
    for key in ["a", "b"] {
        assert_eq!(
            attempt(&engine, key, Some(2), &runs).await,
            Err(ErrorKind::Operation)
        );
    }
    let (a, b) = (id(&engine, "a"), id(&engine, "b"));
    let mut steps = raw.steps(&a).await;
    assert_eq!(steps.len(), 2);
    match tamper {
        Tamper::FlippedByte => {
            let output = &mut steps[0].1;
            let at = output.len() - 20;
            output[at] ^= 1;
        }
        Tamper::SwappedOutputs => {
            let first = steps[0].1.clone();
            steps[0].1 = std::mem::replace(&mut steps[1].1, first);
        }
        Tamper::SwappedNames => {
            let first = steps[0].0.clone();
            steps[0].0 = std::mem::replace(&mut steps[1].0, first);
        }
        Tamper::Reordered => steps.swap(0, 1),
        Tamper::FromAnotherRecord => steps = raw.steps(&b).await,
    }
    raw.set_steps(&a, &steps).await;
    let before = runs.get();
    for retry in 0..2 {
        assert_eq!(
            attempt(&engine, "a", None, &runs).await,
            Err(ErrorKind::UnauthenticRecord),
            "{tamper:?}, retry {retry}"
        );
    }
    assert_eq!(runs.get(), before, "{tamper:?}: no step ran again");
    // The other record is untouched, and resumes.
    assert_eq!(
        attempt(&engine, "b", None, &runs).await,
        Ok((charged(2), 2))
    );
}

/// A step sealed under the old key opens once a new one is the primary
/// (the old one kept beside it), and the next step is sealed under the new
/// one; without the old key it is refused, never run again.
async fn rotation<R: Raw>() {
    let raw = R::fresh().await;
    let runs = Runs::default();
    let old = engine(raw.store(), Some(sealing(keys("k1", 1))));
    assert_eq!(
        attempt(&old, "k", Some(1), &runs).await,
        Err(ErrorKind::Operation)
    );
    assert_eq!(
        attempt(&old, "gone", Some(1), &runs).await,
        Err(ErrorKind::Operation)
    );
    let rotated = engine(
        raw.store(),
        Some(sealing(
            keys("k2", 2).with_key("k1", &[1; 32]).expect("key"),
        )),
    );
    assert_eq!(
        attempt(&rotated, "k", Some(2), &runs).await,
        Err(ErrorKind::Operation)
    );
    let sealed_under: Vec<_> = raw
        .steps(&id(&rotated, "k"))
        .await
        .iter()
        .map(|(_, output)| key_id_of(output).map(str::to_owned))
        .collect();
    assert_eq!(sealed_under, [Some("k1".into()), Some("k2".into())]);
    assert_eq!(
        attempt(&rotated, "k", None, &runs).await,
        Ok((charged(1), 1))
    );
    let without_old = engine(raw.store(), Some(sealing(keys("k2", 2))));
    assert_eq!(
        attempt(&without_old, "gone", None, &runs).await,
        Err(ErrorKind::UnauthenticRecord)
    );
    assert_eq!(runs.get(), (2, 1), "no step ran twice for a key");
}

/// Steps recorded in the clear before encryption was turned on keep
/// working, as plaintext responses do, unless plaintext is refused; with
/// `open_only`, new steps are recorded in the clear.
async fn plaintext_steps_before_encryption<R: Raw>() {
    let raw = R::fresh().await;
    let runs = Runs::default();
    let plain = engine(raw.store(), None);
    for key in ["kept", "refused"] {
        assert_eq!(
            attempt(&plain, key, Some(2), &runs).await,
            Err(ErrorKind::Operation)
        );
    }
    let stored = raw.steps(&id(&plain, "kept")).await;
    assert!(contains(&stored[0].1, CARD), "in the clear");
    let sealed = engine(raw.store(), Some(sealing(keys("k1", 1))));
    assert_eq!(
        attempt(&sealed, "kept", None, &runs).await,
        Ok((charged(1), 1))
    );
    let strict = engine(raw.store(), Some(sealing(keys("k1", 1)).refuse_plaintext()));
    assert_eq!(
        attempt(&strict, "refused", None, &runs).await,
        Err(ErrorKind::UnauthenticRecord)
    );
    assert_eq!(runs.get(), (2, 2), "no step ran twice for a key");
    let open_only = engine(raw.store(), Some(sealing(keys("k1", 1)).open_only()));
    assert_eq!(
        attempt(&open_only, "clear", Some(1), &runs).await,
        Err(ErrorKind::Operation)
    );
    let stored = raw.steps(&id(&open_only, "clear")).await;
    assert!(
        contains(&stored[0].1, CARD),
        "open_only records in the clear"
    );
}

/// Encryption removed while a record holds sealed steps (a rolling
/// deployment's old instance, or `open_only` skipped): the output does not
/// decode, and is refused as a corrupt record, the step not run again.
async fn sealed_steps_without_encryption_are_corrupt<R: Raw>() {
    let raw = R::fresh().await;
    let runs = Runs::default();
    let sealed = engine(raw.store(), Some(sealing(keys("k1", 1))));
    assert_eq!(
        attempt(&sealed, "k", Some(1), &runs).await,
        Err(ErrorKind::Operation)
    );
    let plain = engine(raw.store(), None);
    assert_eq!(
        attempt(&plain, "k", None, &runs).await,
        Err(ErrorKind::CorruptRecord)
    );
    assert_eq!(runs.get(), (1, 0), "the step did not run again");
}

/// The ERROR logs of every test of this binary: one subscriber for the
/// process, installed by the first test that reads it.
fn error_logs() -> &'static support::Captured {
    static LOGS: std::sync::OnceLock<support::Captured> = std::sync::OnceLock::new();
    LOGS.get_or_init(|| {
        let captured = support::Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::ERROR)
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("the only subscriber");
        captured
    })
}

/// A step that fails to open logs one ERROR naming the record, the step
/// and the key id.
async fn the_error_log_names_the_record_the_step_and_the_key<R: Raw>() {
    let logs = error_logs();
    let raw = R::fresh().await;
    let engine = engine(raw.store(), Some(sealing(keys("k1", 1))));
    let runs = Runs::default();
    // A key of this store's own: the record id is this test's.
    let key = std::any::type_name::<R>();
    assert_eq!(
        attempt(&engine, key, Some(1), &runs).await,
        Err(ErrorKind::Operation)
    );
    let id = id(&engine, key);
    let mut steps = raw.steps(&id).await;
    let last = steps[0].1.len() - 1;
    steps[0].1[last] ^= 1;
    raw.set_steps(&id, &steps).await;
    assert_eq!(
        attempt(&engine, key, None, &runs).await,
        Err(ErrorKind::UnauthenticRecord)
    );
    let text = logs.text();
    let failed: Vec<&str> = text
        .lines()
        .filter(|line| line.contains("failed to open") && line.contains(&id))
        .collect();
    assert_eq!(failed.len(), 1, "{text}");
    assert!(failed[0].contains("ERROR"), "{text}");
    assert!(failed[0].contains("step=\"charge\""), "the step: {text}");
    assert!(failed[0].contains("key_id=\"k1\""), "the key id: {text}");
}

/// The scenarios, on one store.
macro_rules! sealed_steps_on {
    ($raw:ty) => {
        #[tokio::test]
        async fn sealed_at_rest_and_resumed() {
            super::sealed_at_rest_and_resumed::<$raw>().await;
        }

        #[tokio::test]
        async fn tampered_steps_are_never_used() {
            for tamper in super::TAMPERS {
                super::tampered_steps_are_never_used::<$raw>(tamper).await;
            }
        }

        #[tokio::test]
        async fn rotation() {
            super::rotation::<$raw>().await;
        }

        #[tokio::test]
        async fn plaintext_steps_before_encryption() {
            super::plaintext_steps_before_encryption::<$raw>().await;
        }

        #[tokio::test]
        async fn sealed_steps_without_encryption_are_corrupt() {
            super::sealed_steps_without_encryption_are_corrupt::<$raw>().await;
        }

        #[tokio::test]
        async fn the_error_log_names_the_record_the_step_and_the_key() {
            super::the_error_log_names_the_record_the_step_and_the_key::<$raw>().await;
        }
    };
}

mod memory {
    use super::Raw;
    use lambda_idempotency::{
        store::{
            memory::MemoryWrite, Claim, Completion, Conditional, Extension, OwnerToken, Record,
            RecordId, RecordedStep, Removal, StepWrite, Store,
        },
        MemoryStore, StoreError,
    };
    use std::{
        collections::HashMap,
        sync::{Arc, Mutex},
    };

    /// The memory store, with the steps a table editor wrote in place of
    /// a record's: the engine reads them as it would read a changed table.
    /// (The memory store has no way in to its steps but its own writes.)
    #[derive(Clone, Default)]
    pub struct Edited {
        store: MemoryStore,
        edits: Arc<Mutex<HashMap<String, Vec<RecordedStep>>>>,
    }

    impl Store for Edited {
        type Write = MemoryWrite;
        const STEPS: bool = true;
        async fn claim(&self, c: &Claim) -> Result<Conditional, StoreError> {
            self.store.claim(c).await
        }
        async fn take_over(&self, c: &Claim, o: &OwnerToken) -> Result<Conditional, StoreError> {
            self.store.take_over(c, o).await
        }
        async fn extend(&self, e: &Extension) -> Result<Conditional, StoreError> {
            self.store.extend(e).await
        }
        async fn complete(&self, c: Completion<MemoryWrite>) -> Result<Conditional, StoreError> {
            self.store.complete(c).await
        }
        async fn release(&self, i: &RecordId, o: &OwnerToken) -> Result<Conditional, StoreError> {
            self.store.release(i, o).await
        }
        async fn remove(&self, i: &RecordId, r: Removal) -> Result<Conditional, StoreError> {
            self.store.remove(i, r).await
        }
        async fn list_in_progress(&self, p: &str, l: usize) -> Result<Vec<Record>, StoreError> {
            self.store.list_in_progress(p, l).await
        }
        async fn get(&self, i: &RecordId, n: u64) -> Result<Option<Record>, StoreError> {
            self.store.get(i, n).await
        }
        async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
            self.store.record_step(step).await
        }
        async fn steps(&self, id: &RecordId, now_ms: u64) -> Result<Vec<RecordedStep>, StoreError> {
            let edited = self.edits.lock().expect("edits").get(id.as_str()).cloned();
            match edited {
                Some(steps) => Ok(steps),
                None => self.store.steps(id, now_ms).await,
            }
        }
    }

    impl Raw for Edited {
        type St = Edited;

        async fn fresh() -> Self {
            Self::default()
        }

        fn store(&self) -> Edited {
            self.clone()
        }

        async fn steps(&self, id: &str) -> Vec<(String, Vec<u8>)> {
            Store::steps(self, &RecordId::from_stored(id), super::support_now_ms())
                .await
                .expect("steps")
                .into_iter()
                .map(|step| (step.name, step.output))
                .collect()
        }

        async fn set_steps(&self, id: &str, steps: &[(String, Vec<u8>)]) {
            let steps = steps
                .iter()
                .map(|(name, output)| RecordedStep::new(name.clone(), output.clone()))
                .collect();
            self.edits
                .lock()
                .expect("edits")
                .insert(id.to_owned(), steps);
        }
    }

    sealed_steps_on!(Edited);
}

/// Now, epoch milliseconds: the engines' clock.
fn support_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

mod dynamodb {
    use super::Raw;
    use aws_sdk_dynamodb::{
        primitives::Blob,
        types::{AttributeValue, ReturnValue},
        Client,
    };
    use lambda_idempotency::DynamoDbStore;
    use std::collections::HashMap;

    pub struct Dynamo {
        client: Client,
        table: String,
    }

    impl Dynamo {
        fn key(id: &str) -> HashMap<String, AttributeValue> {
            HashMap::from([("id".to_owned(), AttributeValue::S(id.to_owned()))])
        }
    }

    impl Raw for Dynamo {
        type St = DynamoDbStore;

        async fn fresh() -> Self {
            let client = super::support::client();
            let table = super::support::create_idempotency_table(&client).await;
            Self { client, table }
        }

        fn store(&self) -> DynamoDbStore {
            DynamoDbStore::new(self.client.clone(), self.table.clone())
        }

        async fn steps(&self, id: &str) -> Vec<(String, Vec<u8>)> {
            let item = self
                .client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(Self::key(id)))
                .consistent_read(true)
                .send()
                .await
                .expect("GetItem")
                .item
                .expect("the record");
            let Some(AttributeValue::L(steps)) = item.get("steps") else {
                panic!("no steps in {item:?}");
            };
            steps
                .iter()
                .map(|step| {
                    let AttributeValue::M(step) = step else {
                        panic!("a step is not a map: {step:?}");
                    };
                    match (step.get("name"), step.get("output")) {
                        (Some(AttributeValue::S(name)), Some(AttributeValue::B(output))) => {
                            (name.clone(), output.clone().into_inner())
                        }
                        _ => panic!("a step is not a name and an output: {step:?}"),
                    }
                })
                .collect()
        }

        async fn set_steps(&self, id: &str, steps: &[(String, Vec<u8>)]) {
            let list = steps
                .iter()
                .map(|(name, output)| {
                    AttributeValue::M(HashMap::from([
                        ("name".to_owned(), AttributeValue::S(name.clone())),
                        (
                            "output".to_owned(),
                            AttributeValue::B(Blob::new(output.clone())),
                        ),
                    ]))
                })
                .collect();
            self.client
                .update_item()
                .table_name(&self.table)
                .set_key(Some(Self::key(id)))
                .update_expression("SET #steps = :steps")
                .expression_attribute_names("#steps", "steps")
                .expression_attribute_values(":steps", AttributeValue::L(list))
                .return_values(ReturnValue::None)
                .send()
                .await
                .expect("UpdateItem");
        }
    }

    sealed_steps_on!(Dynamo);
}

mod redis {
    use super::Raw;
    use lambda_idempotency::store::redis::RedisStore;
    use redis::AsyncCommands;
    use std::{
        collections::HashMap,
        sync::atomic::{AtomicUsize, Ordering},
    };

    static NAMESPACES: AtomicUsize = AtomicUsize::new(0);

    pub struct Redis {
        connection: redis::aio::MultiplexedConnection,
        namespace: String,
        store: RedisStore,
    }

    impl Redis {
        fn key(&self, id: &str) -> String {
            format!("{}{id}", self.namespace)
        }
    }

    impl Raw for Redis {
        type St = RedisStore;

        async fn fresh() -> Self {
            let url = super::support::variable("IDEMPOTENCY_TEST_REDIS_URL");
            let namespace = format!(
                "sealed-steps-{}-{}:",
                std::process::id(),
                NAMESPACES.fetch_add(1, Ordering::SeqCst)
            );
            let connection = redis::Client::open(url.as_str())
                .expect("url")
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let store = RedisStore::open(&url).expect("url").namespace(&namespace);
            Self {
                connection,
                namespace,
                store,
            }
        }

        fn store(&self) -> RedisStore {
            self.store.clone()
        }

        async fn steps(&self, id: &str) -> Vec<(String, Vec<u8>)> {
            let mut connection = self.connection.clone();
            let hash: HashMap<String, Vec<u8>> =
                connection.hgetall(self.key(id)).await.expect("HGETALL");
            let count: usize = std::str::from_utf8(&hash["steps"])
                .expect("a count")
                .parse()
                .expect("a count");
            (0..count)
                .map(|i| {
                    let name =
                        String::from_utf8(hash[&format!("step:{i}:name")].clone()).expect("a name");
                    (name, hash[&format!("step:{i}:output")].clone())
                })
                .collect()
        }

        async fn set_steps(&self, id: &str, steps: &[(String, Vec<u8>)]) {
            let mut fields = vec![("steps".to_owned(), steps.len().to_string().into_bytes())];
            for (i, (name, output)) in steps.iter().enumerate() {
                fields.push((format!("step:{i}:name"), name.clone().into_bytes()));
                fields.push((format!("step:{i}:output"), output.clone()));
            }
            let mut connection = self.connection.clone();
            let () = connection
                .hset_multiple(self.key(id), &fields)
                .await
                .expect("HSET");
        }
    }

    sealed_steps_on!(Redis);
}

/// The steps in the row's `steps` column (`jsonb`), as a JSON list of
/// `{name, output}` with the output in base64, for both SQL stores.
fn steps_json(steps: &[(String, Vec<u8>)]) -> String {
    use base64::Engine as _;
    serde_json::Value::Array(
        steps
            .iter()
            .map(|(name, output)| {
                serde_json::json!({
                    "name": name,
                    "output": base64::engine::general_purpose::STANDARD.encode(output),
                })
            })
            .collect(),
    )
    .to_string()
}

/// The steps of a JSON list of `{name, output}`.
fn steps_of_json(json: &str) -> Vec<(String, Vec<u8>)> {
    use base64::Engine as _;
    let steps: Vec<serde_json::Value> = serde_json::from_str(json).expect("a JSON list");
    steps
        .iter()
        .map(|step| {
            let name = step["name"].as_str().expect("a name").to_owned();
            let output = base64::engine::general_purpose::STANDARD
                .decode(step["output"].as_str().expect("an output"))
                .expect("base64");
            (name, output)
        })
        .collect()
}

mod postgres {
    use super::Raw;
    use lambda_idempotency::store::postgres::{tokio_postgres, PostgresStore};
    use std::sync::atomic::{AtomicUsize, Ordering};

    static TABLES: AtomicUsize = AtomicUsize::new(0);

    pub struct Postgres {
        client: tokio_postgres::Client,
        store: PostgresStore,
    }

    impl Raw for Postgres {
        type St = PostgresStore;

        async fn fresh() -> Self {
            let url = super::support::variable("IDEMPOTENCY_TEST_POSTGRES_URL");
            let table = format!(
                "sealed_steps_{}_{}",
                std::process::id(),
                TABLES.fetch_add(1, Ordering::SeqCst)
            );
            let store = PostgresStore::connect(&url, table, 2).expect("pool");
            store.create_table().await.expect("create table");
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(connection);
            Self { client, store }
        }

        fn store(&self) -> PostgresStore {
            self.store.clone()
        }

        async fn steps(&self, id: &str) -> Vec<(String, Vec<u8>)> {
            let row = self
                .client
                .query_one(
                    &format!(
                        "SELECT steps::text FROM {} WHERE id = $1",
                        self.store.table()
                    ),
                    &[&id],
                )
                .await
                .expect("the record");
            super::steps_of_json(&row.get::<_, String>(0))
        }

        async fn set_steps(&self, id: &str, steps: &[(String, Vec<u8>)]) {
            self.client
                .execute(
                    &format!(
                        "UPDATE {} SET steps = $2::text::jsonb WHERE id = $1",
                        self.store.table()
                    ),
                    &[&id, &super::steps_json(steps)],
                )
                .await
                .expect("UPDATE");
        }
    }

    sealed_steps_on!(Postgres);
}

mod mysql {
    use super::Raw;
    use lambda_idempotency::store::sqlx::mysql::SqlxMySqlStore;
    use sqlx::MySqlPool;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static TABLES: AtomicUsize = AtomicUsize::new(0);

    pub struct MySql {
        pool: MySqlPool,
        store: SqlxMySqlStore,
    }

    impl Raw for MySql {
        type St = SqlxMySqlStore;

        async fn fresh() -> Self {
            let url = super::support::variable("IDEMPOTENCY_TEST_MYSQL_URL");
            let pool = MySqlPool::connect_lazy(&url).expect("pool");
            let table = format!(
                "sealed_steps_{}_{}",
                std::process::id(),
                TABLES.fetch_add(1, Ordering::SeqCst)
            );
            let store = SqlxMySqlStore::new(pool.clone(), table).expect("store");
            store.create_table().await.expect("create table");
            Self { pool, store }
        }

        fn store(&self) -> SqlxMySqlStore {
            self.store.clone()
        }

        async fn steps(&self, id: &str) -> Vec<(String, Vec<u8>)> {
            let json: String = sqlx::query_scalar(&format!(
                "SELECT CAST(steps AS CHAR) FROM `{}` WHERE id = ?",
                self.store.table()
            ))
            .bind(id)
            .fetch_one(&self.pool)
            .await
            .expect("the record");
            super::steps_of_json(&json)
        }

        async fn set_steps(&self, id: &str, steps: &[(String, Vec<u8>)]) {
            sqlx::query(&format!(
                "UPDATE `{}` SET steps = ? WHERE id = ?",
                self.store.table()
            ))
            .bind(super::steps_json(steps))
            .bind(id)
            .execute(&self.pool)
            .await
            .expect("UPDATE");
        }
    }

    sealed_steps_on!(MySql);
}
