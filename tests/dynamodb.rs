//! The engine on DynamoDB Local: every guarantee, plus what only a real
//! DynamoDB shows (round trips, transactions, unreachable endpoints, items
//! written by others).
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB`; `make test` provides it.

#[path = "dynamodb/single_table.rs"]
mod single_table;
mod support;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use lambda_idempotency::{
    store::dynamodb::AttributeNames,
    testing::{
        scenarios::{charge, payload, Charge, Declined},
        ManualClock,
    },
    Attempt, DynamoDbStore, Engine, Error, ErrorKind, OutcomeKind, StoreErrorKind,
};
use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::Duration,
};

async fn store() -> DynamoDbStore {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    DynamoDbStore::new(client, table)
}

lambda_idempotency::store_conformance! {
    store: store(),
    unavailable: async { DynamoDbStore::new(support::unreachable_client(), "idempotency") },
    single_write,
}

/// The completer: abandoned claims found by a paginated `Scan` with a
/// filter, settled by takeovers.
mod abandoned {
    use super::store;

    lambda_idempotency::store_conformance! {
        abandoned: store(),
    }
    lambda_idempotency::store_conformance! {
        abandoned_steps: store(),
    }
}

/// Recovery points: each step one fenced `UpdateItem` on the record.
mod steps {
    use super::{store, support};
    use aws_sdk_dynamodb::types::AttributeValue;
    use lambda_idempotency::{testing::scenarios::payload, Attempt, Engine, Json, Mode};

    lambda_idempotency::store_conformance! {
        steps: store(),
    }

    /// Every step write sent twice (its first answer lost): the engine
    /// recognises its own landed write.
    #[tokio::test]
    async fn a_takeover_resumes_after_steps_whose_answers_were_lost() {
        let store = lambda_idempotency::testing::LostAnswers(store().await);
        lambda_idempotency::testing::scenarios::a_takeover_resumes_after_the_recorded_steps(store)
            .await;
    }

    /// What steps cost in DynamoDB calls: a first run of three steps is
    /// the claim, an `UpdateItem` a step and the completion; after it
    /// failed past its first step (its key given back by ending its lease:
    /// one `UpdateItem`), the retry's takeover is the claim (refused), the
    /// takeover's `PutItem` (refused for the steps) and its `UpdateItem`,
    /// one consistent read of the steps, the two steps left, the completion.
    #[tokio::test]
    async fn what_steps_cost_in_calls() {
        use lambda_idempotency::DynamoDbStore;
        let (client, calls) = support::counted_client();
        let table = support::create_idempotency_table(&client).await;
        let engine = Engine::builder(DynamoDbStore::new(client, table)).build();
        let run = |key: &'static str, fail_after_first: bool| {
            let engine = engine.clone();
            async move {
                engine
                    .run(
                        &Attempt::new("t", key, payload(1)),
                        Mode::Plain,
                        &Json,
                        |claim| async move {
                            for (i, name) in ["charge", "ledger", "receipt"].into_iter().enumerate()
                            {
                                claim.step(name, || async { Ok::<_, ()>(i) }).await?;
                                if fail_after_first {
                                    return Err(lambda_idempotency::Error::Operation(()));
                                }
                            }
                            Ok::<_, lambda_idempotency::Error<()>>((3u8, Vec::new()))
                        },
                    )
                    .await
            }
        };
        calls.reset();
        run("fresh", false).await.expect("completed");
        assert_eq!(
            calls.by_operation().into_iter().collect::<Vec<_>>(),
            [("PutItem", 1), ("UpdateItem", 4)],
            "claim, three steps, completion"
        );
        run("resumed", true)
            .await
            .expect_err("failed after its first step");
        calls.reset();
        run("resumed", false).await.expect("resumed");
        assert_eq!(
            calls.by_operation().into_iter().collect::<Vec<_>>(),
            [("GetItem", 1), ("PutItem", 2), ("UpdateItem", 4)],
            "claim and takeover refused, the takeover's update, the steps read, two steps, completion"
        );
    }

    /// The item's attributes, read raw.
    async fn item(table: &str, id: &str) -> std::collections::HashMap<String, AttributeValue> {
        support::client()
            .get_item()
            .table_name(table)
            .key("id", AttributeValue::S(id.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .expect("get")
            .item
            .expect("the record")
    }

    /// While in progress the item holds its steps, as a list of a name and
    /// an output each; the completion removes them, so a replay (a refused
    /// claim, billed by the size of the item it returns) does not carry
    /// them.
    #[tokio::test]
    async fn steps_live_in_the_item_until_its_completion() {
        let store = store().await;
        let table = store.table().to_owned();
        let engine = Engine::builder(store).build();
        let id = engine.record_id("t", "steps-item").as_str().to_owned();
        let attempt = Attempt::new("t", "steps-item", payload(1));
        let outcome = engine
            .run(&attempt, Mode::Plain, &Json, |claim| {
                let (table, id) = (table.clone(), id.clone());
                async move {
                    claim
                        .step("charge", || async { Ok::<_, ()>("ch_1".to_owned()) })
                        .await?;
                    let during = item(&table, &id).await;
                    let Some(AttributeValue::L(steps)) = during.get("steps") else {
                        panic!("no steps list in {during:?}");
                    };
                    let AttributeValue::M(step) = &steps[0] else {
                        panic!("a step is not a map: {steps:?}");
                    };
                    assert_eq!(step.get("name"), Some(&AttributeValue::S("charge".into())));
                    assert_eq!(steps.len(), 1);
                    Ok::<_, lambda_idempotency::Error<()>>((1u8, Vec::new()))
                }
            })
            .await;
        assert!(outcome.is_ok(), "{outcome:?}");
        let completed = item(&table, &id).await;
        assert!(!completed.contains_key("steps"), "{completed:?}");
    }
}

#[tokio::test]
async fn unreachable_store_runs_the_operation_only_when_failing_open() {
    let store = DynamoDbStore::new(support::unreachable_client(), "idempotency");
    let engine = Engine::builder(store).fail_open(true).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let outcome = engine
        .execute(&Attempt::new("t", "k", payload(1)), charge(&runs, 1))
        .await
        .expect("fail-open runs the operation");
    assert_eq!(outcome.kind(), OutcomeKind::Unprotected);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn missing_table_is_a_misconfiguration_and_nothing_runs() {
    let store = DynamoDbStore::new(support::client(), "no-such-table");
    let engine = Engine::builder(store).fail_open(true).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let result = engine
        .execute(&Attempt::new("t", "k", payload(1)), charge(&runs, 1))
        .await;
    match result {
        Err(Error::Store(error)) => {
            assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}")
        }
        other => panic!("expected a store error, got {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "fail-open covers outages, not misconfiguration"
    );
}

#[tokio::test]
async fn dynamodb_calls_per_request() {
    let (client, calls) = support::counted_client();
    let table = support::create_idempotency_table(&client).await;
    let runs = Arc::new(AtomicUsize::new(0));

    let engine = Engine::builder(DynamoDbStore::new(client.clone(), table.clone())).build();
    let attempt = Attempt::new("t", "k", payload(1));
    calls.reset();
    engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("first");
    assert_eq!(
        calls.total(),
        2,
        "first call: claim + complete, {:?}",
        calls.by_operation()
    );
    assert_eq!(calls.by_operation().get("PutItem"), Some(&1));
    assert_eq!(calls.by_operation().get("UpdateItem"), Some(&1));

    calls.reset();
    let replay = engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("replay");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(
        calls.total(),
        1,
        "replay: the failed claim only, {:?}",
        calls.by_operation()
    );

    let cached = Engine::builder(DynamoDbStore::new(client, table))
        .cache(16)
        .build();
    let attempt = Attempt::new("t", "cached", payload(1));
    cached
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("first");
    calls.reset();
    let replay = cached
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("cached replay");
    assert_eq!(replay.kind(), OutcomeKind::CachedReplay);
    assert_eq!(calls.total(), 0, "cached replay: no call");
    let mismatch = cached
        .execute(&Attempt::new("t", "cached", payload(2)), charge(&runs, 2))
        .await;
    assert!(
        matches!(mismatch, Err(Error::KeyReused)),
        "the cache checks the fingerprint"
    );
    assert_eq!(calls.total(), 0);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn cache_does_not_serve_expired_records() {
    let store = store().await;
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(store)
        .clock(clock.clone())
        .retention(Duration::from_secs(60))
        .cache(16)
        .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "k", payload(1));
    engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("first");
    clock.advance(Duration::from_secs(61));
    let again = engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("after expiry");
    assert_eq!(again.kind(), OutcomeKind::Fresh);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

fn charge_item(table: &str, id: &str) -> TransactWriteItem {
    TransactWriteItem::builder()
        .put(
            Put::builder()
                .table_name(table)
                .item("id", AttributeValue::S(id.into()))
                .item("amount", AttributeValue::N("100".into()))
                .condition_expression("attribute_not_exists(id)")
                .build()
                .expect("put"),
        )
        .build()
}

async fn charge_exists(client: &aws_sdk_dynamodb::Client, table: &str, id: &str) -> bool {
    client
        .get_item()
        .table_name(table)
        .key("id", AttributeValue::S(id.into()))
        .consistent_read(true)
        .send()
        .await
        .expect("get charge")
        .item
        .is_some()
}

#[tokio::test]
async fn transactional_completion_commits_record_and_business_item_together() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let charges = support::create_table_with(&client, "charges", "id", None).await;
    let engine = Engine::builder(DynamoDbStore::new(client.clone(), table)).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("t", "k", payload(100));

    let run = |id: &'static str| {
        let runs = Arc::clone(&runs);
        let write = charge_item(&charges, id);
        move || async move {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Declined>((
                Charge {
                    id: id.into(),
                    amount: 100,
                },
                vec![write],
            ))
        }
    };
    let first = engine
        .execute_transactional(&attempt, run("ch_1"))
        .await
        .expect("first");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    assert!(
        charge_exists(&client, &charges, "ch_1").await,
        "business item committed"
    );

    let replay = engine
        .execute_transactional(&attempt, run("ch_2"))
        .await
        .expect("replay");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value().id, "ch_1");
    assert!(!charge_exists(&client, &charges, "ch_2").await);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn fenced_out_transaction_writes_neither_record_nor_business_item() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let charges = support::create_table_with(&client, "charges", "id", None).await;
    let clock = ManualClock::starting_now();
    let engine = Engine::builder(DynamoDbStore::new(client.clone(), table))
        .clock(clock.clone())
        .default_lease(Duration::from_secs(10))
        .build();
    let attempt = Attempt::new("t", "k", payload(100));

    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let zombie = {
        let engine = engine.clone();
        let write = charge_item(&charges, "ch_zombie");
        tokio::spawn(async move {
            let attempt = Attempt::new("t", "k", payload(100));
            engine
                .execute_transactional(&attempt, || async move {
                    let _ = started_tx.send(());
                    let _ = finish_rx.await;
                    Ok::<_, Declined>((
                        Charge {
                            id: "ch_zombie".into(),
                            amount: 100,
                        },
                        vec![write],
                    ))
                })
                .await
        })
    };
    started_rx.await.expect("zombie started");
    clock.advance(Duration::from_secs(11));
    let write = charge_item(&charges, "ch_successor");
    let successor = engine
        .execute_transactional(&attempt, || async move {
            Ok::<_, Declined>((
                Charge {
                    id: "ch_successor".into(),
                    amount: 100,
                },
                vec![write],
            ))
        })
        .await
        .expect("takeover");
    assert_eq!(successor.kind(), OutcomeKind::Fresh);

    finish_tx.send(()).expect("zombie waits");
    let result = zombie.await.expect("task");
    assert!(matches!(result, Err(Error::LeaseLost)), "{result:?}");
    assert!(
        !charge_exists(&client, &charges, "ch_zombie").await,
        "the zombie's write was not committed"
    );
    assert!(charge_exists(&client, &charges, "ch_successor").await);
    let replay = engine
        .execute_transactional(&attempt, || async {
            Ok::<_, Declined>((
                Charge {
                    id: "x".into(),
                    amount: 0,
                },
                vec![],
            ))
        })
        .await
        .expect("replay");
    assert_eq!(
        replay.value().id,
        "ch_successor",
        "the successor's record is intact"
    );
}

#[tokio::test]
async fn rejected_business_write_releases_the_claim() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let charges = support::create_table_with(&client, "charges", "id", None).await;
    let engine = Engine::builder(DynamoDbStore::new(client.clone(), table)).build();
    let attempt = Attempt::new("t", "k", payload(100));
    let put = |id: &'static str| {
        let write = charge_item(&charges, id);
        move || async move {
            Ok::<_, Declined>((
                Charge {
                    id: id.into(),
                    amount: 100,
                },
                vec![write],
            ))
        }
    };
    engine
        .execute_transactional(&Attempt::new("t", "other", payload(1)), put("ch_taken"))
        .await
        .expect("first charge");

    let result = engine
        .execute_transactional(&attempt, put("ch_taken"))
        .await;
    match result {
        Err(Error::Store(error)) => {
            assert_eq!(error.kind(), StoreErrorKind::WriteRejected, "{error}")
        }
        other => panic!("expected a rejected write, got {other:?}"),
    }
    let retry = engine
        .execute_transactional(&attempt, put("ch_new"))
        .await
        .expect("retry runs");
    assert_eq!(retry.kind(), OutcomeKind::Fresh, "the claim was released");
}

#[tokio::test]
async fn corrupt_record_is_an_error_not_a_replay() {
    let client = support::client();
    let table = support::create_idempotency_table(&client).await;
    let engine = Engine::builder(DynamoDbStore::new(client.clone(), table.clone())).build();
    let id = engine.record_id("t", "k");
    let far = (std::time::SystemTime::now() + Duration::from_secs(3600))
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs();
    for (status, expiration) in [
        (
            AttributeValue::S("DONE".into()),
            AttributeValue::N(far.to_string()),
        ),
        (
            AttributeValue::N("1".into()),
            AttributeValue::N(far.to_string()),
        ),
    ] {
        client
            .put_item()
            .table_name(&table)
            .item("id", AttributeValue::S(id.to_string()))
            .item("status", status)
            .item("expiration", expiration)
            .item("owner", AttributeValue::S("someone".into()))
            .item("fingerprint", AttributeValue::S(payload(1).to_string()))
            .send()
            .await
            .expect("write a corrupt item");
        let runs = Arc::new(AtomicUsize::new(0));
        let result = engine
            .execute(&Attempt::new("t", "k", payload(1)), charge(&runs, 1))
            .await;
        let error = result.expect_err("a corrupt record is never replayed");
        assert_eq!(error.kind(), ErrorKind::CorruptRecord, "{error}");
        assert_eq!(runs.load(Ordering::SeqCst), 0);
    }
}

#[tokio::test]
async fn configured_names_and_prefix_are_used_and_raw_keys_never_stored() {
    let client = support::client();
    let table = support::create_table_with(&client, "custom", "pk", Some("ttl")).await;
    let names = AttributeNames::default()
        .id("pk")
        .expiration("ttl")
        .status("state")
        .response("data")
        .fingerprint("validation");
    let engine =
        Engine::builder(DynamoDbStore::new(client.clone(), table.clone()).attribute_names(names))
            .key_prefix("charges")
            .build();
    let runs = Arc::new(AtomicUsize::new(0));
    let attempt = Attempt::new("tenant-secret", "raw-key-4f0c9a", payload(1));
    engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("first");
    let replay = engine
        .execute(&attempt, charge(&runs, 1))
        .await
        .expect("replay");
    assert_eq!(replay.kind(), OutcomeKind::Replay);

    let items = client
        .scan()
        .table_name(&table)
        .send()
        .await
        .expect("scan")
        .items
        .unwrap_or_default();
    assert_eq!(items.len(), 1);
    let item = &items[0];
    for name in [
        "pk",
        "ttl",
        "state",
        "data",
        "validation",
        "owner",
        "completed_at",
    ] {
        assert!(item.contains_key(name), "attribute {name} in {item:?}");
    }
    let pk = item["pk"].as_s().expect("pk is S");
    assert!(pk.starts_with("charges#"), "{pk}");
    let dump = format!("{item:?}");
    assert!(
        !dump.contains("raw-key-4f0c9a") && !dump.contains("tenant-secret"),
        "{dump}"
    );
}

/// The same guarantees with responses stored compressed, and records of
/// either form read by stores of either setting.
mod compressed {
    use super::{support, DynamoDbStore};
    use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
    use lambda_idempotency::{testing::scenarios::payload, Attempt, Engine, Json, OutcomeKind};

    async fn store() -> DynamoDbStore {
        super::store().await.compress_responses_above(0)
    }

    lambda_idempotency::store_conformance! {
        store: store(),
        unavailable: async {
            DynamoDbStore::new(support::unreachable_client(), "idempotency").compress_responses_above(0)
        },
        single_write,
    }

    /// The stored item of record `key` under scope `t`.
    async fn stored(
        store: &DynamoDbStore,
        key: &str,
    ) -> std::collections::HashMap<String, AttributeValue> {
        let id = Engine::builder(store.clone()).build().record_id("t", key);
        support::client()
            .get_item()
            .table_name(store.table())
            .key("id", AttributeValue::S(id.as_str().to_owned()))
            .consistent_read(true)
            .send()
            .await
            .expect("get")
            .item
            .expect("the record")
    }

    fn write(store: &DynamoDbStore, key: &str) -> TransactWriteItem {
        let put = Put::builder()
            .table_name(store.table())
            .item("id", AttributeValue::S(format!("business#{key}")))
            .build()
            .expect("put");
        TransactWriteItem::builder().put(put).build()
    }

    #[tokio::test]
    async fn large_responses_are_stored_compressed_on_every_path_and_replayed_by_either_setting() {
        let plain = super::store().await;
        let compressing = plain.clone().compress_responses_above(1024);
        let engine = Engine::builder(compressing.clone()).build();
        let body = "0123456789abcdef".repeat(1024); // 16 KiB
        let value = || {
            let body = body.clone();
            async move { Ok::<_, std::io::Error>(body) }
        };
        let with_write = |key: &'static str| {
            let (body, write) = (body.clone(), write(&compressing, key));
            async move { Ok::<_, std::io::Error>((body, vec![write])) }
        };
        let paths = ["completion", "transactional", "single", "single-with-write"];
        for key in paths {
            let attempt = Attempt::new("t", key, payload(1));
            let outcome = match key {
                "completion" => engine.execute(&attempt, value).await,
                "transactional" => {
                    engine
                        .execute_transactional(&attempt, || with_write(key))
                        .await
                }
                "single" => {
                    engine
                        .run_single_write(&attempt, &Json, |_| async {
                            Ok::<_, std::io::Error>((body.clone(), Vec::new()))
                        })
                        .await
                }
                _ => {
                    engine
                        .run_single_write(&attempt, &Json, |_| with_write(key))
                        .await
                }
            }
            .expect(key);
            assert_eq!(outcome.kind(), OutcomeKind::Fresh, "{key}");
            let item = stored(&compressing, key).await;
            assert!(!item.contains_key("response"), "{key}: stored plain");
            let Some(AttributeValue::B(compressed)) = item.get("response_deflate") else {
                panic!("{key}: no compressed response");
            };
            assert!(
                compressed.as_ref().len() < 1024,
                "{key}: {} bytes",
                compressed.as_ref().len()
            );
            // A store that does not compress replays it.
            let replay = Engine::builder(plain.clone())
                .build()
                .execute(&attempt, || async {
                    Ok::<String, std::io::Error>(String::new())
                })
                .await
                .expect("replay");
            assert_eq!(replay.kind(), OutcomeKind::Replay, "{key}");
            assert_eq!(replay.into_value(), body, "{key}");
        }
        // A record stored plain is replayed by a compressing store.
        let attempt = Attempt::new("t", "plain", payload(1));
        Engine::builder(plain.clone())
            .build()
            .execute(&attempt, value)
            .await
            .expect("plain");
        assert!(stored(&plain, "plain").await.contains_key("response"));
        let replay = engine
            .execute(&attempt, || async {
                Ok::<String, std::io::Error>(String::new())
            })
            .await
            .expect("replay");
        assert_eq!(replay.kind(), OutcomeKind::Replay);
        assert_eq!(replay.into_value(), body);
        // Below the threshold, and incompressible, stay plain.
        let small = Attempt::new("t", "small", payload(1));
        engine
            .execute(&small, || async {
                Ok::<_, std::io::Error>("ok".to_owned())
            })
            .await
            .expect("small");
        assert!(stored(&compressing, "small").await.contains_key("response"));
    }
}

/// `DescribeTable`'s count, which DynamoDB Local keeps live (AWS refreshes
/// it about every six hours: the figure is marked estimated).
#[tokio::test]
async fn the_table_size_is_describe_tables_item_count_and_bytes() {
    use lambda_idempotency::store::{Accuracy, SizeSource, Store};
    let store = store().await;
    let engine = Engine::builder(store.clone()).build();
    let empty = store.table_size(0).await.unwrap().expect("DynamoDB counts");
    assert_eq!(empty.records, 0);
    support::table_size::complete_records(&engine, 7).await;
    let size = engine
        .sample_table_size()
        .await
        .unwrap()
        .expect("DynamoDB counts");
    assert_eq!(
        (size.records, size.in_progress, size.accuracy, size.source),
        (7, None, Accuracy::Estimated, SizeSource::DescribeTable)
    );
    assert!(size.bytes.is_some_and(|bytes| bytes > 7 * 100), "{size:?}");

    let missing = DynamoDbStore::new(support::client(), "no-such-table");
    let error = missing.table_size(0).await.unwrap_err();
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
}

/// An outside review of recovery points on DynamoDB Local: the values at
/// the edge of what a step may hold, and the item's 400 KB; each finding
/// a test that fails today, ignored with its one line.
mod steps_review {
    use super::store;
    use lambda_idempotency::{
        store::{StepLimits, MAX_STEP_NAME_BYTES},
        testing::scenarios::payload,
        Attempt, ClaimHandle, Engine, Error, Json, Mode, OutcomeKind,
    };
    use std::sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    };

    /// Step names at the edge: empty, unicode, the separators DynamoDB's
    /// expressions and Redis's fields use, long. Each is recorded by a
    /// first attempt that then fails, and resumed by the takeover, whose
    /// closures never run.
    #[tokio::test]
    async fn names_at_the_edge_are_recorded_and_resumed() {
        let engine = Engine::builder(store().await).build();
        let names: Vec<String> = vec![
            String::new(),
            "é🦀\u{0}\u{200b}".to_owned(),
            "#steps.name[0]:step:0:output".to_owned(),
            ":no_steps".to_owned(),
            "x".repeat(MAX_STEP_NAME_BYTES),
        ];
        let runs = Arc::new(AtomicUsize::new(0));
        let attempt = Attempt::new("t", "edge-names", payload(1));
        let run = |fail: bool| {
            let (names, runs) = (names.clone(), Arc::clone(&runs));
            engine.run(
                &attempt,
                Mode::Plain,
                &Json,
                move |claim: ClaimHandle| async move {
                    let mut outputs = Vec::new();
                    for (i, name) in names.iter().enumerate() {
                        let output = claim
                            .step(name, || async {
                                runs.fetch_add(1, Ordering::SeqCst);
                                Ok::<_, ()>(i)
                            })
                            .await?;
                        outputs.push(output);
                    }
                    if fail {
                        return Err(Error::Operation(()));
                    }
                    Ok::<_, Error<()>>((outputs, Vec::new()))
                },
            )
        };
        run(true)
            .await
            .expect_err("the first attempt fails after its steps");
        let resumed = run(false).await.expect("the takeover completes");
        assert_eq!(resumed.into_value(), (0..names.len()).collect::<Vec<_>>());
        assert_eq!(
            runs.load(Ordering::SeqCst),
            names.len(),
            "each step ran once"
        );
    }

    /// "16 KiB a step and 16 steps a key: 256 KiB at most, under
    /// DynamoDB's 400 KB item with room for the record's attributes": with
    /// names at their bound (`MAX_STEP_NAME_BYTES`) and outputs at theirs,
    /// every step of a key is recorded; a name one byte longer is refused
    /// before its step runs. (Names were unbounded: 16 steps with 12 KB
    /// names passed 400 KB, and the step whose write failed had acted.)
    #[tokio::test]
    async fn within_the_default_bounds_every_step_is_recorded() {
        let engine = Engine::builder(store().await).build();
        let limits = StepLimits::default();
        let runs = Arc::new(AtomicUsize::new(0));
        let attempt = Attempt::new("t", "long-names", payload(1));
        let outcome = engine
            .run(&attempt, Mode::Plain, &Json, |claim: ClaimHandle| {
                let runs = Arc::clone(&runs);
                async move {
                    let too_long = "n".repeat(MAX_STEP_NAME_BYTES + 1);
                    let refused = claim
                        .step(&too_long, || async {
                            runs.fetch_add(1, Ordering::SeqCst);
                            Ok::<_, ()>(0)
                        })
                        .await;
                    match refused {
                        Err(Error::Store(error))
                            if error.kind() == lambda_idempotency::StoreErrorKind::Rejected => {}
                        other => return Err(format!("a name past the bound: {other:?}")),
                    }
                    for i in 0..limits.max_steps {
                        let name = format!("{i:02}{}", "n".repeat(MAX_STEP_NAME_BYTES - 2));
                        // A JSON string of exactly the bound.
                        let output = "o".repeat(limits.max_output_bytes - 2);
                        let step = claim
                            .step(&name, || async {
                                runs.fetch_add(1, Ordering::SeqCst);
                                Ok::<_, ()>(output)
                            })
                            .await;
                        match step {
                            Ok(_) => {}
                            Err(Error::Store(error)) => {
                                return Err(format!("step {i}: {:?}", error.kind()))
                            }
                            Err(error) => return Err(format!("step {i}: {error:?}")),
                        }
                    }
                    Ok::<_, String>((limits.max_steps, Vec::new()))
                }
            })
            .await;
        assert!(
            outcome.is_ok(),
            "{:?}",
            outcome.err().map(|e| format!("{e:?}"))
        );
        assert_eq!(
            runs.load(Ordering::SeqCst),
            limits.max_steps as usize,
            "the name past the bound did not run"
        );
    }

    /// An output exactly at the size bound is recorded, one byte past it
    /// is refused (`Rejected`) before any write.
    #[tokio::test]
    async fn an_output_at_the_bound_is_recorded_and_one_past_it_is_not() {
        let engine = Engine::builder(store().await)
            .step_limits(StepLimits::default().max_output_bytes(100).max_steps(4))
            .build();
        let attempt = Attempt::new("t", "at-the-bound", payload(1));
        let outcome = engine
            .run(
                &attempt,
                Mode::Plain,
                &Json,
                |claim: ClaimHandle| async move {
                    let at = claim
                        .step("at", || async { Ok::<_, ()>("a".repeat(98)) })
                        .await
                        .map(|s| s.len());
                    let past = claim
                        .step("past", || async { Ok::<_, ()>("a".repeat(99)) })
                        .await
                        .map_err(|e| e.kind());
                    Ok::<_, ()>(((format!("{at:?}"), format!("{past:?}")), Vec::new()))
                },
            )
            .await
            .expect("completes")
            .into_value();
        assert_eq!(outcome.0, "Ok(98)");
        assert!(outcome.1.contains("Store"), "{}", outcome.1);
    }

    /// The first attempt's claim on a shared manual clock: it records
    /// its charge (after `late` moves the clock past its 5 s lease, when
    /// set), then dies with its lease passed. What was charged.
    async fn first_dies_after_its_charge(
        engine: &Engine<lambda_idempotency::DynamoDbStore>,
        clock: &lambda_idempotency::testing::ManualClock,
        attempt: &Attempt<'_>,
        charges: &Arc<AtomicUsize>,
        late: bool,
    ) {
        let (charged, recorded) = tokio::sync::oneshot::channel::<()>();
        let first = engine.run(attempt, Mode::Plain, &Json, |claim: ClaimHandle| {
            let (charges, clock) = (Arc::clone(charges), clock.clone());
            async move {
                if late {
                    clock.advance(std::time::Duration::from_secs(6));
                }
                claim
                    .step("charge", || async {
                        Ok::<_, ()>(charges.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await
                    .expect("recorded, past the lease or not: no one took it over");
                let _ = charged.send(());
                std::future::pending::<Result<(usize, Vec<_>), Error<()>>>().await
            }
        });
        tokio::select! {
            ended = first => panic!("the first attempt was to hang: {:?}", ended.err()),
            _ = recorded => {}
        }
        if !late {
            clock.advance(std::time::Duration::from_secs(6));
        }
    }

    /// An operation's run: its charge, as the engine wants it.
    type Charged = std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<
                        (usize, Vec<aws_sdk_dynamodb::types::TransactWriteItem>),
                        Error<()>,
                    >,
                > + Send,
        >,
    >;

    fn charge_in_a_step(charges: &Arc<AtomicUsize>) -> impl FnOnce(ClaimHandle) -> Charged {
        let charges = Arc::clone(charges);
        move |claim: ClaimHandle| {
            Box::pin(async move {
                let charge = claim
                    .step("charge", || async {
                        Ok::<_, ()>(charges.fetch_add(1, Ordering::SeqCst) + 1)
                    })
                    .await?;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                Ok((charge, Vec::new()))
            })
        }
    }

    fn engine_on(
        store: lambda_idempotency::DynamoDbStore,
        clock: &lambda_idempotency::testing::ManualClock,
    ) -> Engine<lambda_idempotency::DynamoDbStore> {
        Engine::builder(store)
            .clock(clock.clone())
            .default_lease(std::time::Duration::from_secs(5))
            .build()
    }

    /// "The fence is the completion's, not the lease's": a step recorded
    /// after the lease passed, before anyone took the claim over, lands;
    /// the takeover (whose `PutItem` is then refused for the steps, and
    /// done by an `UpdateItem`) resumes after it.
    #[tokio::test]
    async fn a_step_recorded_past_the_lease_before_a_takeover_is_resumed() {
        let clock = lambda_idempotency::testing::ManualClock::starting_now();
        let store = store().await;
        let first = engine_on(store.clone(), &clock);
        let charges = Arc::new(AtomicUsize::new(0));
        let attempt = Attempt::new("t", "late-step", payload(1));
        first_dies_after_its_charge(&first, &clock, &attempt, &charges, true).await;
        let second = engine_on(store, &clock);
        let resumed = second
            .run(&attempt, Mode::Plain, &Json, charge_in_a_step(&charges))
            .await
            .expect("the takeover completes");
        assert_eq!(
            resumed.into_value(),
            1,
            "the charge recorded past the lease"
        );
        assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
    }

    /// Two processes take over one lapsed, stepped claim at once: both
    /// `PutItem`s are refused for its steps, both send the takeover's
    /// `UpdateItem`, one lands; the other is told the key is in progress
    /// (or replays, if it came after the completion). Charged once.
    #[tokio::test]
    async fn two_takeovers_racing_for_a_stepped_claim_charge_once() {
        let clock = lambda_idempotency::testing::ManualClock::starting_now();
        let store = store().await;
        let charges = Arc::new(AtomicUsize::new(0));
        let attempt = Attempt::new("t", "racing-takeovers", payload(1));
        first_dies_after_its_charge(
            &engine_on(store.clone(), &clock),
            &clock,
            &attempt,
            &charges,
            false,
        )
        .await;
        for round in 0..3 {
            let (b, c) = (
                engine_on(store.clone(), &clock),
                engine_on(store.clone(), &clock),
            );
            let (b, c) = tokio::join!(
                b.run(&attempt, Mode::Plain, &Json, charge_in_a_step(&charges)),
                c.run(&attempt, Mode::Plain, &Json, charge_in_a_step(&charges)),
            );
            let kinds = [&b, &c].map(|answer| match answer {
                Ok(outcome) => format!("{:?}", outcome.kind()),
                Err(error) => format!("{:?}", error.kind()),
            });
            if round == 0 {
                assert!(
                    kinds.iter().filter(|kind| *kind == "Fresh").count() == 1,
                    "one takeover completes: {kinds:?}"
                );
            }
            for outcome in [b, c].into_iter().flatten() {
                assert_eq!(outcome.into_value(), 1, "the recorded charge");
            }
        }
        assert_eq!(charges.load(Ordering::SeqCst), 1, "charged once");
    }

    /// A record whose `steps` attribute nobody here wrote (a string): the
    /// takeover (its `PutItem` refused for the attribute, its `UpdateItem`
    /// keeping it) fails closed at its first step (`CorruptRecord`), and
    /// the step does not run. Holds.
    #[tokio::test]
    async fn steps_of_another_type_fail_the_takeover_closed() {
        let clock = lambda_idempotency::testing::ManualClock::starting_now();
        let store = store().await;
        let table = store.table().to_owned();
        let first = engine_on(store.clone(), &clock);
        let id = first.record_id("t", "foreign-steps").as_str().to_owned();
        let attempt = Attempt::new("t", "foreign-steps", payload(1));
        let (written, foreign) = tokio::sync::oneshot::channel::<()>();
        let dies = first.run(
            &attempt,
            Mode::Plain,
            &Json,
            |_claim: ClaimHandle| async move {
                super::support::client()
                    .update_item()
                    .table_name(&table)
                    .key("id", aws_sdk_dynamodb::types::AttributeValue::S(id))
                    .update_expression("SET steps = :s")
                    .expression_attribute_values(
                        ":s",
                        aws_sdk_dynamodb::types::AttributeValue::S("charge".into()),
                    )
                    .send()
                    .await
                    .expect("a foreign write");
                let _ = written.send(());
                std::future::pending::<Result<(u8, Vec<_>), Error<()>>>().await
            },
        );
        tokio::select! {
            _ = dies => panic!("the first attempt was to hang"),
            _ = foreign => {}
        }
        clock.advance(std::time::Duration::from_secs(6));
        let charges = Arc::new(AtomicUsize::new(0));
        let second = engine_on(store, &clock)
            .run(&attempt, Mode::Plain, &Json, |claim: ClaimHandle| {
                let charges = Arc::clone(&charges);
                async move {
                    assert!(claim.takeover().is_some(), "taken over");
                    match claim
                        .step("charge", || async {
                            Ok::<_, ()>(charges.fetch_add(1, Ordering::SeqCst))
                        })
                        .await
                    {
                        Err(Error::Store(error)) => Err(error.kind()),
                        other => panic!("{other:?}"),
                    }
                    .map(|charge: usize| {
                        (
                            charge,
                            Vec::<aws_sdk_dynamodb::types::TransactWriteItem>::new(),
                        )
                    })
                }
            })
            .await;
        assert!(
            matches!(
                second,
                Err(Error::Operation(
                    lambda_idempotency::StoreErrorKind::CorruptRecord
                ))
            ),
            "{:?}",
            second.map(|o| o.into_value())
        );
        assert_eq!(charges.load(Ordering::SeqCst), 0, "the step did not run");
    }

    /// A key's steps near the default bound (15 steps of 16 KiB) and a
    /// 190 KB response: together over 400 KB, but the completion removes
    /// the steps as it sets the response, so the completed item is under
    /// it. The completion must land.
    #[tokio::test]
    async fn a_large_response_completes_a_record_holding_large_steps() {
        let engine = Engine::builder(store().await).build();
        let attempt = Attempt::new("t", "large-completion", payload(1));
        let outcome = engine
            .run(
                &attempt,
                Mode::Plain,
                &Json,
                |claim: ClaimHandle| async move {
                    for i in 0..15 {
                        claim
                            .step(&format!("s{i}"), || async {
                                Ok::<_, ()>("o".repeat(16_000))
                            })
                            .await?;
                    }
                    Ok::<_, Error<()>>(("r".repeat(190_000), Vec::new()))
                },
            )
            .await
            .expect("completes");
        assert_eq!(
            outcome.kind(),
            OutcomeKind::Fresh,
            "the completion did not land"
        );
    }
}
