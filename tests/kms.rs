//! The KMS key provider against a real KMS API: moto's, over HTTP, started
//! by `scripts/with-moto` (`make test` does). Sealed and replayed through
//! the engine (the memory store, and DynamoDB Local once), data keys reused
//! within their bounds and fetched once by concurrent requests (calls
//! counted at the SDK's transmit, retries included), wrapped keys bound to
//! their context and KMS key, rotation, and a KMS outage.
//!
//! Needs `IDEMPOTENCY_TEST_KMS_ENDPOINT`
//! (`scripts/with-moto cargo test --test kms`); the DynamoDB round trip
//! also needs `AWS_ENDPOINT_URL_DYNAMODB` (`scripts/with-dynamodb-local`).
//!
//! moto 5.2.5 checks the encryption context and the `KeyId` of a `Decrypt`
//! (answering `AccessDeniedException` where KMS answers
//! `IncorrectKeyException`), but not a key's state: it decrypts under a
//! disabled key or one pending deletion. [`KeyStates`] answers for those
//! keys what KMS answers (`DisabledException`,
//! `KMSInvalidStateException`), in front of moto.

mod support;

use aws_sdk_kms::{
    config::{
        interceptors::{
            BeforeDeserializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
        },
        retry::RetryConfig,
        timeout::TimeoutConfig,
        ConfigBag, Credentials, Intercept, Region, RuntimeComponents,
    },
    Client,
};
use aws_smithy_types::{
    body::SdkBody,
    config_bag::{Storable, StoreReplace},
};
use futures::future::join_all;
use lambda_idempotency::{
    encryption::{key_id_of, KeyProvider, KmsKeys},
    store::{RecordId, Status},
    Attempt, DynamoDbStore, Engine, ErrorKind, Fingerprint, MemoryStore, OutcomeKind,
};
use std::{
    collections::{BTreeMap, HashSet},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};
use support::tcp_proxy::TcpFaultProxy;

const CARD: &str = "4242424242424242";
const CONTEXT: &str = "tests/kms";

fn endpoint() -> String {
    std::env::var("IDEMPOTENCY_TEST_KMS_ENDPOINT").unwrap_or_else(|_| {
        panic!(
            "IDEMPOTENCY_TEST_KMS_ENDPOINT is not set: run these tests with `make test`, or \
             `scripts/with-moto cargo test --test kms` (it starts a throwaway moto server)"
        )
    })
}

/// KMS calls made through a client, by operation, counted as each attempt
/// is sent (a retry counts), and the keys answered as disabled.
#[derive(Debug, Clone, Default)]
struct Kms {
    calls: Arc<Mutex<BTreeMap<String, usize>>>,
    states: KeyStates,
}

impl Kms {
    fn calls(&self, operation: &str) -> usize {
        self.calls
            .lock()
            .unwrap()
            .get(operation)
            .copied()
            .unwrap_or(0)
    }
}

impl Intercept for Kms {
    fn name(&self) -> &'static str {
        "KmsCalls"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let target = context
            .request()
            .headers()
            .get("x-amz-target")
            .unwrap_or_default();
        let operation = target.rsplit('.').next().unwrap_or_default().to_owned();
        *self.calls.lock().unwrap().entry(operation).or_default() += 1;
        Ok(())
    }
}

/// The `KeyId` a request named, kept from its transmit to its answer.
#[derive(Debug, Clone)]
struct RequestedKey(String);

impl Storable for RequestedKey {
    type Storer = StoreReplace<Self>;
}

/// What KMS answers for a disabled key, or one pending deletion, which
/// moto does not: the answer of a call naming such a key is replaced by
/// KMS's error (the call still reaches moto).
#[derive(Debug, Clone, Default)]
struct KeyStates {
    refused: Arc<Mutex<HashSet<String>>>,
}

impl KeyStates {
    /// Answers `code` (400) to every call with `key`.
    fn refuse(&self, key: &str, code: &str) {
        self.refused
            .lock()
            .unwrap()
            .insert(format!("{key}\u{0}{code}"));
    }
}

impl Intercept for KeyStates {
    fn name(&self) -> &'static str {
        "KeyStates"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let body = context.request().body().bytes().unwrap_or_default();
        let request: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let key = request["KeyId"].as_str().unwrap_or_default().to_owned();
        cfg.interceptor_state().store_put(RequestedKey(key));
        Ok(())
    }

    fn modify_before_deserialization(
        &self,
        context: &mut BeforeDeserializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let key = cfg
            .load::<RequestedKey>()
            .map(|requested| requested.0.clone())
            .unwrap_or_default();
        let refused = self.refused.lock().unwrap().iter().find_map(|entry| {
            let (refused_key, code) = entry.split_once('\u{0}')?;
            (refused_key == key).then(|| code.to_owned())
        });
        if let Some(code) = refused {
            let response = context.response_mut();
            *response.status_mut() = 400.try_into().unwrap();
            *response.body_mut() = SdkBody::from(format!(
                r#"{{"__type":"{code}","message":"{key} is not usable (KeyStates)"}}"#
            ));
        }
        Ok(())
    }
}

/// A KMS client for `endpoint` (moto, or a proxy in front of it), with
/// short timeouts and the SDK's standard retries, counted.
fn client_via(endpoint: &str) -> (Client, Kms) {
    let kms = Kms::default();
    let config = aws_sdk_kms::Config::builder()
        .behavior_version_latest()
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::for_tests())
        .endpoint_url(endpoint)
        .retry_config(RetryConfig::standard().with_initial_backoff(Duration::from_millis(5)))
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_millis(500))
                .operation_timeout(Duration::from_secs(3))
                .build(),
        )
        .interceptor(kms.clone())
        .interceptor(kms.states.clone())
        .build();
    (Client::from_conf(config), kms)
}

fn kms_client() -> (Client, Kms) {
    client_via(&endpoint())
}

/// A new KMS key in moto, by its ARN.
async fn create_key() -> String {
    let (client, _) = kms_client();
    let created = client.create_key().send().await.expect("CreateKey");
    created.key_metadata().unwrap().arn().unwrap().to_owned()
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of_bytes(b"1250 EUR")
}

/// What `key` charged, and whether it was run now, on `engine`; `runs`
/// counts the runs.
async fn charge<St: lambda_idempotency::store::Store>(
    engine: &Engine<St>,
    key: &str,
    runs: &AtomicUsize,
) -> Result<(String, OutcomeKind), ErrorKind> {
    engine
        .execute(&Attempt::new("s", key, fingerprint()), || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, ()>(format!("charged {CARD}"))
        })
        .await
        .map(|outcome| {
            let kind = outcome.kind();
            (outcome.into_value(), kind)
        })
        .map_err(|error| error.kind())
}

fn engine(store: &MemoryStore, keys: &KmsKeys) -> Engine<MemoryStore> {
    Engine::builder(store.clone())
        .encryption(keys.encryption())
        .build()
}

fn stored(store: &MemoryStore, id: &RecordId) -> Vec<u8> {
    store
        .record(id)
        .and_then(|record| record.response)
        .expect("a stored response")
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

#[tokio::test]
async fn a_response_is_sealed_under_a_kms_data_key_and_replayed_by_another_process() {
    let arn = create_key().await;
    let store = MemoryStore::new();
    let runs = AtomicUsize::new(0);
    let (client, first_kms) = kms_client();
    let first = engine(
        &store,
        &KmsKeys::builder(client, &arn, CONTEXT).build().unwrap(),
    );
    let (value, kind) = charge(&first, "k", &runs).await.unwrap();
    assert_eq!(
        (value.as_str(), kind),
        ("charged 4242424242424242", OutcomeKind::Fresh)
    );
    let sealed = stored(&store, &first.record_id("s", "k"));
    assert!(!contains(&sealed, CARD), "sealed in the store");
    assert_eq!(
        key_id_of(&sealed),
        Some(arn.as_str()),
        "named by its key ARN"
    );
    assert_eq!(first_kms.calls("GenerateDataKey"), 1);
    assert_eq!(first_kms.calls("Decrypt"), 0);
    // The same process replays with the key it sealed with: no call.
    let (_, kind) = charge(&first, "k", &runs).await.unwrap();
    assert_eq!(kind, OutcomeKind::Replay);
    assert_eq!(first_kms.calls("Decrypt"), 0);

    // Another process (empty caches) unwraps it once, then replays freely.
    let (client, second_kms) = kms_client();
    let second = engine(
        &store,
        &KmsKeys::builder(client, &arn, CONTEXT).build().unwrap(),
    );
    for _ in 0..3 {
        let (value, kind) = charge(&second, "k", &runs).await.unwrap();
        assert_eq!(
            (value.as_str(), kind),
            ("charged 4242424242424242", OutcomeKind::Replay)
        );
    }
    assert_eq!(second_kms.calls("Decrypt"), 1);
    assert_eq!(second_kms.calls("GenerateDataKey"), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_alias_primary_seals_under_the_key_arn_it_names() {
    let arn = create_key().await;
    let (client, _) = kms_client();
    let alias = format!("alias/tests-kms-{}", std::process::id());
    client
        .create_alias()
        .alias_name(&alias)
        .target_key_id(&arn)
        .send()
        .await
        .expect("CreateAlias");
    let store = MemoryStore::new();
    let runs = AtomicUsize::new(0);
    let sealer = engine(
        &store,
        &KmsKeys::builder(client, &alias, CONTEXT).build().unwrap(),
    );
    charge(&sealer, "k", &runs).await.unwrap();
    let sealed = stored(&store, &sealer.record_id("s", "k"));
    assert_eq!(key_id_of(&sealed), Some(arn.as_str()));
    // A process that has not sealed learns the ARN (one GenerateDataKey).
    let (client, kms) = kms_client();
    let reader = engine(
        &store,
        &KmsKeys::builder(client, &alias, CONTEXT).build().unwrap(),
    );
    let (_, kind) = charge(&reader, "k", &runs).await.unwrap();
    assert_eq!(kind, OutcomeKind::Replay);
    assert_eq!((kms.calls("GenerateDataKey"), kms.calls("Decrypt")), (1, 1));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// N requests make ⌈N / max_records⌉ GenerateDataKey calls; concurrent
/// first requests make one, and concurrent requests never use a data key
/// past its bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn data_keys_are_reused_within_their_bounds_and_fetched_once_by_concurrent_requests() {
    let arn = create_key().await;
    let store = MemoryStore::new();
    let runs = AtomicUsize::new(0);
    let (client, kms) = kms_client();
    let keys = KmsKeys::builder(client, &arn, CONTEXT)
        .max_records(10)
        .build()
        .unwrap();
    let sequential = engine(&store, &keys);
    for n in 0..45 {
        charge(&sequential, &format!("seq-{n}"), &runs)
            .await
            .unwrap();
    }
    assert_eq!(kms.calls("GenerateDataKey"), 5, "⌈45 / 10⌉");
    let wrapped: HashSet<Vec<u8>> = (0..45)
        .map(|n| {
            let sealed = stored(&store, &sequential.record_id("s", &format!("seq-{n}")));
            wrapped_key(&sealed)
        })
        .collect();
    assert_eq!(wrapped.len(), 5, "five data keys");

    // Concurrent first requests on a fresh process: one call between them.
    for (max_records, requests, calls) in [(1_000, 32, 1), (8, 32, 4)] {
        let (client, kms) = kms_client();
        let keys = KmsKeys::builder(client, &arn, CONTEXT)
            .max_records(max_records)
            .build()
            .unwrap();
        let concurrent = Arc::new(engine(&store, &keys));
        let runs = Arc::new(AtomicUsize::new(0));
        let tasks = (0..requests).map(|n| {
            let (engine, runs) = (Arc::clone(&concurrent), Arc::clone(&runs));
            tokio::spawn(async move {
                charge(&engine, &format!("burst-{max_records}-{n}"), &runs).await
            })
        });
        for answer in join_all(tasks).await {
            assert_eq!(answer.unwrap().unwrap().1, OutcomeKind::Fresh);
        }
        assert_eq!(
            kms.calls("GenerateDataKey"),
            calls,
            "{requests} concurrent requests, max_records {max_records}"
        );
        let mut per_key: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for n in 0..requests {
            let id = concurrent.record_id("s", &format!("burst-{max_records}-{n}"));
            *per_key
                .entry(wrapped_key(&stored(&store, &id)))
                .or_default() += 1;
        }
        assert!(
            per_key.values().all(|&sealed| sealed <= max_records),
            "{per_key:?}"
        );
    }
}

/// The wrapped data key of an envelope (version 1: magic, version, flags,
/// key id length and id, wrapped length and key).
fn wrapped_key(sealed: &[u8]) -> Vec<u8> {
    let id_len = usize::from(sealed[6]);
    let at = 7 + id_len;
    let len = usize::from(u16::from_be_bytes([sealed[at], sealed[at + 1]]));
    sealed[at + 2..at + 2 + len].to_vec()
}

/// A wrapped data key is bound to its context and its KMS key by KMS
/// itself, before the envelope's own check.
#[tokio::test]
async fn kms_refuses_a_wrapped_key_from_another_context_or_under_another_key() {
    let (arn, other) = (create_key().await, create_key().await);
    let (client, _) = kms_client();
    let here = KmsKeys::builder(client.clone(), &arn, CONTEXT)
        .build()
        .unwrap();
    let key = here.sealing_key().resolve().await.unwrap();
    // Another context, same KMS key.
    let elsewhere = KmsKeys::builder(client.clone(), &arn, "another/table")
        .build()
        .unwrap();
    let refused = elsewhere
        .opening_key(&arn, key.wrapped())
        .resolve()
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("InvalidCiphertextException"),
        "{refused}"
    );
    // The same context, but named as another KMS key's.
    let both = KmsKeys::builder(client, &other, CONTEXT)
        .with_key(&arn)
        .build()
        .unwrap();
    let refused = both
        .opening_key(&other, key.wrapped())
        .resolve()
        .await
        .unwrap_err();
    assert!(refused.to_string().contains("AccessDenied"), "{refused}");
    // And its own opens.
    let opened = both
        .opening_key(&arn, key.wrapped())
        .resolve()
        .await
        .unwrap();
    assert_eq!(opened.id(), arn);
}

#[tokio::test]
async fn rotation_keeps_older_records_open_until_their_key_is_removed_or_disabled() {
    let (old, new) = (create_key().await, create_key().await);
    let store = MemoryStore::new();
    let runs = AtomicUsize::new(0);
    let (client, _) = kms_client();
    let before = engine(
        &store,
        &KmsKeys::builder(client, &old, CONTEXT).build().unwrap(),
    );
    charge(&before, "old", &runs).await.unwrap();
    let old_record = store.record(&before.record_id("s", "old")).unwrap();

    // The new key is the primary; the old one still opens.
    let (client, kms) = kms_client();
    let rotated = engine(
        &store,
        &KmsKeys::builder(client, &new, CONTEXT)
            .with_key(&old)
            .build()
            .unwrap(),
    );
    assert_eq!(
        charge(&rotated, "old", &runs).await.unwrap().1,
        OutcomeKind::Replay
    );
    charge(&rotated, "new", &runs).await.unwrap();
    let sealed = stored(&store, &rotated.record_id("s", "new"));
    assert_eq!(key_id_of(&sealed), Some(new.as_str()));
    assert_eq!((kms.calls("Decrypt"), kms.calls("GenerateDataKey")), (1, 1));

    // The old key removed from the configuration: refused, without a call.
    let (client, kms) = kms_client();
    let after = engine(
        &store,
        &KmsKeys::builder(client, &new, CONTEXT).build().unwrap(),
    );
    assert_eq!(
        charge(&after, "old", &runs).await,
        Err(ErrorKind::UnauthenticRecord)
    );
    assert_eq!(kms.calls("Decrypt"), 0);
    assert_eq!(
        charge(&after, "new", &runs).await.unwrap().1,
        OutcomeKind::Replay
    );

    // The old key disabled, then scheduled for deletion, in KMS: refused by
    // KMS, for a process that has not unwrapped it yet.
    let key_id = old.rsplit('/').next().unwrap();
    for (code, in_moto) in [
        ("DisabledException", "disable"),
        ("KMSInvalidStateException", "delete"),
    ] {
        let (client, kms) = kms_client();
        match in_moto {
            "disable" => drop(
                client
                    .disable_key()
                    .key_id(key_id)
                    .send()
                    .await
                    .expect("DisableKey"),
            ),
            _ => drop(
                client
                    .schedule_key_deletion()
                    .key_id(key_id)
                    .pending_window_in_days(7)
                    .send()
                    .await
                    .expect("ScheduleKeyDeletion"),
            ),
        }
        kms.states.refuse(&old, code);
        let still = engine(
            &store,
            &KmsKeys::builder(client, &new, CONTEXT)
                .with_key(&old)
                .build()
                .unwrap(),
        );
        assert_eq!(
            charge(&still, "old", &runs).await,
            Err(ErrorKind::UnauthenticRecord),
            "{code}"
        );
        assert_eq!(kms.calls("Decrypt"), 1, "{code}");
        assert_eq!(
            charge(&still, "new", &runs).await.unwrap().1,
            OutcomeKind::Replay
        );
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "each key run once, never again"
    );
    assert_eq!(store.record(&old_record.id), Some(old_record), "untouched");
}

/// KMS unreachable: a claim needs no key, a completion with a cached data
/// key is sealed, one without is not stored, and a replay without its key
/// is an outage, never a run; all replay once KMS answers again.
#[tokio::test]
async fn a_kms_outage_stores_nothing_unsealed_and_runs_nothing_again() {
    let arn = create_key().await;
    let proxy = TcpFaultProxy::start(endpoint().trim_start_matches("http://")).await;
    let via = format!("http://{}", proxy.addr());
    let store = MemoryStore::new();
    let runs = AtomicUsize::new(0);

    let (client, _) = client_via(&via);
    let warm = engine(
        &store,
        &KmsKeys::builder(client, &arn, CONTEXT).build().unwrap(),
    );
    charge(&warm, "before", &runs).await.unwrap();
    let before = store.record(&warm.record_id("s", "before")).unwrap();

    proxy.go_down();
    // A warm process within its data key's bounds seals without KMS.
    let (_, kind) = charge(&warm, "warm", &runs).await.unwrap();
    assert_eq!(kind, OutcomeKind::Fresh);
    assert!(key_id_of(&stored(&store, &warm.record_id("s", "warm"))).is_some());

    // A process without a data key: the claim is written and the operation
    // runs; its response cannot be sealed and is not stored (the caller
    // still gets it); the claim stays until its lease passes.
    let (client, kms) = client_via(&via);
    let cold = engine(
        &store,
        &KmsKeys::builder(client, &arn, CONTEXT).build().unwrap(),
    );
    let (value, kind) = charge(&cold, "cold", &runs).await.unwrap();
    assert_eq!(
        (value.as_str(), kind),
        ("charged 4242424242424242", OutcomeKind::NotRecorded)
    );
    let claim = store.record(&cold.record_id("s", "cold")).unwrap();
    assert_eq!((claim.status, claim.response), (Status::InProgress, None));
    assert!(kms.calls("GenerateDataKey") >= 1);
    // A retry meanwhile is in progress, not run.
    assert_eq!(
        charge(&cold, "cold", &runs).await,
        Err(ErrorKind::InProgress)
    );

    // A replay that needs a key it does not have: an outage (503), not run,
    // the record untouched.
    assert_eq!(
        charge(&cold, "before", &runs).await,
        Err(ErrorKind::StoreUnavailable)
    );
    assert_eq!(store.record(&before.id), Some(before.clone()));
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "before, warm, cold: once each"
    );

    // KMS back: the same process replays.
    proxy.heal();
    let (_, kind) = charge(&cold, "before", &runs).await.unwrap();
    assert_eq!(kind, OutcomeKind::Replay);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

/// The stored bytes on a real DynamoDB table (Local): sealed, and replayed
/// by another process.
#[tokio::test]
async fn a_sealed_response_round_trips_through_dynamodb_local() {
    let arn = create_key().await;
    let dynamodb = support::client();
    let table = support::create_idempotency_table(&dynamodb).await;
    let runs = AtomicUsize::new(0);
    let on_dynamodb = |client: Client| {
        Engine::builder(DynamoDbStore::new(dynamodb.clone(), &table))
            .encryption(
                KmsKeys::builder(client, &arn, CONTEXT)
                    .build()
                    .unwrap()
                    .encryption(),
            )
            .build()
    };
    let first = on_dynamodb(kms_client().0);
    assert_eq!(
        charge(&first, "k", &runs).await.unwrap().1,
        OutcomeKind::Fresh
    );
    let item = dynamodb
        .get_item()
        .table_name(&table)
        .key(
            "id",
            aws_sdk_dynamodb::types::AttributeValue::S(
                first.record_id("s", "k").as_str().to_owned(),
            ),
        )
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    let response = item.item().unwrap()["response"]
        .as_b()
        .unwrap()
        .as_ref()
        .to_vec();
    assert!(!contains(&response, CARD));
    assert_eq!(key_id_of(&response), Some(arn.as_str()));
    let (client, kms) = kms_client();
    let second = on_dynamodb(client);
    let (value, kind) = charge(&second, "k", &runs).await.unwrap();
    assert_eq!(
        (value.as_str(), kind),
        ("charged 4242424242424242", OutcomeKind::Replay)
    );
    assert_eq!(kms.calls("Decrypt"), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// A step's output (a recovery point) sealed under a KMS data key: at
/// rest it names the key ARN and holds nothing in the clear; another
/// process resumes after it (one `Decrypt`), and the step does not run
/// again.
#[tokio::test]
async fn a_step_sealed_under_a_kms_data_key_resumes_in_another_process() {
    use lambda_idempotency::{store::Store, Clock, Error, Json, Mode, SystemClock};
    let arn = create_key().await;
    let store = MemoryStore::new();
    let runs = AtomicUsize::new(0);
    let attempt = Attempt::new("s", "k", fingerprint());
    let run = |engine: Engine<MemoryStore>, fail: bool| {
        let (runs, attempt) = (&runs, &attempt);
        async move {
            engine
                .run(attempt, Mode::Plain, &Json, |claim| async move {
                    let charge = claim
                        .step("charge", || async {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, ()>(format!("charged {CARD}"))
                        })
                        .await?;
                    if fail {
                        return Err(Error::Operation(()));
                    }
                    Ok::<_, Error<()>>((charge, Vec::new()))
                })
                .await
        }
    };
    let (client, _) = kms_client();
    let first = engine(
        &store,
        &KmsKeys::builder(client, &arn, CONTEXT).build().unwrap(),
    );
    let id = first.record_id("s", "k");
    run(first, true).await.expect_err("failed after its step");
    let steps = store
        .steps(&id, SystemClock.now_ms())
        .await
        .expect("the steps");
    assert!(!contains(&steps[0].output, CARD), "sealed in the store");
    assert_eq!(key_id_of(&steps[0].output), Some(arn.as_str()));

    let (client, kms) = kms_client();
    let second = engine(
        &store,
        &KmsKeys::builder(client, &arn, CONTEXT).build().unwrap(),
    );
    let resumed = run(second, false).await.expect("resumed");
    assert_eq!(resumed.into_value(), format!("charged {CARD}"));
    assert_eq!(kms.calls("Decrypt"), 1, "the step's data key unwrapped");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the step ran once");
}
