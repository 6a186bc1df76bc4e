//! The single-table layout on DynamoDB Local: a fixed partition key value,
//! the record id in the sort key, beside the table's other items.

use super::support;
use aws_sdk_dynamodb::{
    types::{AttributeValue, Put, TransactWriteItem},
    Client,
};
use lambda_idempotency::{
    store::{
        dynamodb::{AttributeNames, SingleTable},
        Claim, OwnerToken, Store,
    },
    testing::scenarios::{charge, payload, Charge, Declined},
    Attempt, Clock, DynamoDbStore, Engine, Error, Fingerprint, OutcomeKind, StoreErrorKind,
    SystemClock,
};
use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

/// A store of the function `function` in `table`, keyed `pk` + `sk`.
fn store_in(client: &Client, table: &str, function: &str) -> DynamoDbStore {
    DynamoDbStore::new(client.clone(), table)
        .attribute_names(AttributeNames::default().id("pk"))
        .single_table(SingleTable::for_function(function, "sk"))
}

/// A fresh single-table table, made by the store itself, holding an item
/// of the application's own.
async fn store() -> DynamoDbStore {
    let client = support::client();
    let table = support::unique_name("single-table");
    let store = store_in(&client, &table, "conformance");
    store.create_table().await.expect("create_table");
    put_application_item(&client, &table, "customer#1", "profile").await;
    store
}

lambda_idempotency::store_conformance! {
    store: store(),
    unavailable: async {
        DynamoDbStore::new(support::unreachable_client(), "idempotency")
            .single_table(SingleTable::new("idempotency#f", "sk"))
    },
    single_write,
}

/// Recovery points in the single-table layout.
/// The completer in one partition: a `Query` of it, never a scan of the
/// application's items.
mod abandoned {
    use super::store;

    lambda_idempotency::store_conformance! {
        abandoned: store(),
    }
    lambda_idempotency::store_conformance! {
        abandoned_steps: store(),
    }
}

mod steps {
    use super::store;

    lambda_idempotency::store_conformance! {
        steps: store(),
    }
}

/// The claim of an invocation that died a minute ago: stuck.
fn stuck_claim(id: lambda_idempotency::store::RecordId, now: u64) -> Claim {
    Claim {
        id,
        owner: OwnerToken::from_stored("dead"),
        fingerprint: Fingerprint::of_bytes(b"body"),
        now_ms: now - 60_000,
        lease_until_ms: now - 30_000,
        expiration_s: now / 1000 + 3600,
        attempt: 1,
        first_started_ms: now - 60_000,
    }
}

async fn put_application_item(client: &Client, table: &str, pk: &str, sk: &str) {
    client
        .put_item()
        .table_name(table)
        .item("pk", AttributeValue::S(pk.into()))
        .item("sk", AttributeValue::S(sk.into()))
        .item("name", AttributeValue::S("Ada".into()))
        .send()
        .await
        .expect("application item");
}

async fn items(
    client: &Client,
    table: &str,
) -> Vec<std::collections::HashMap<String, AttributeValue>> {
    client
        .scan()
        .table_name(table)
        .consistent_read(true)
        .send()
        .await
        .expect("scan")
        .items
        .unwrap_or_default()
}

fn s<'a>(item: &'a std::collections::HashMap<String, AttributeValue>, name: &str) -> &'a str {
    item.get(name)
        .and_then(|v| v.as_s().ok())
        .map_or("", String::as_str)
}

#[tokio::test]
async fn two_functions_keep_their_records_in_their_own_partition_beside_other_items() {
    let client = support::client();
    let table = support::unique_name("shared");
    let charges = store_in(&client, &table, "charges");
    let refunds = store_in(&client, &table, "refunds");
    charges.create_table().await.expect("create_table");
    refunds
        .create_table()
        .await
        .expect("a second create_table verifies");
    put_application_item(&client, &table, "customer#1", "profile").await;

    let runs = Arc::new(AtomicUsize::new(0));
    for store in [&charges, &refunds] {
        let engine = Engine::builder(store.clone()).build();
        let attempt = Attempt::new("tenant", "order-1", payload(100));
        let first = engine
            .execute(&attempt, charge(&runs, 100))
            .await
            .expect("first");
        assert_eq!(first.kind(), OutcomeKind::Fresh);
        let replay = engine
            .execute(&attempt, charge(&runs, 100))
            .await
            .expect("replay");
        assert_eq!(replay.kind(), OutcomeKind::Replay);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 2, "once per function");

    let items = items(&client, &table).await;
    assert_eq!(
        items.len(),
        3,
        "two records and the application's item: {items:?}"
    );
    let mut partitions: Vec<&str> = items.iter().map(|item| s(item, "pk")).collect();
    partitions.sort_unstable();
    assert_eq!(
        partitions,
        ["customer#1", "idempotency#charges", "idempotency#refunds"]
    );
    let profile = items
        .iter()
        .find(|item| s(item, "pk") == "customer#1")
        .expect("the application's item");
    assert_eq!(s(profile, "sk"), "profile");
    assert_eq!(s(profile, "name"), "Ada", "untouched");
    for item in items.iter().filter(|item| s(item, "pk") != "customer#1") {
        assert!(s(item, "sk").contains('#'), "the record id in sk: {item:?}");
        assert_eq!(s(item, "status"), "COMPLETED");
        assert!(!item.contains_key("id"), "no stray id attribute: {item:?}");
    }

    // Operators list each function's stuck claims from its partition only.
    let now = SystemClock.now_ms();
    for (store, function) in [(&charges, "charges"), (&refunds, "refunds")] {
        let engine = Engine::builder(store.clone()).build();
        let id = engine.record_id("tenant", &format!("stuck-{function}"));
        store.claim(&stuck_claim(id, now)).await.expect("claim");
    }
    for (store, function) in [(&charges, "charges"), (&refunds, "refunds")] {
        let engine = Engine::builder(store.clone()).build();
        let listed = engine.list_in_progress(10).await.expect("list");
        assert_eq!(listed.len(), 1, "{function}: {listed:?}");
        assert_eq!(
            listed[0].id,
            engine.record_id("tenant", &format!("stuck-{function}"))
        );
    }
}

#[tokio::test]
async fn a_business_item_in_the_same_table_commits_with_the_record_or_not_at_all() {
    let client = support::client();
    let table = support::unique_name("single-tx");
    let store = store_in(&client, &table, "charges");
    store.create_table().await.expect("create_table");
    let engine = Engine::builder(store).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let charge_put = |id: &str| {
        TransactWriteItem::builder()
            .put(
                Put::builder()
                    .table_name(&table)
                    .item("pk", AttributeValue::S(format!("charge#{id}")))
                    .item("sk", AttributeValue::S("charge".into()))
                    .item("amount", AttributeValue::N("100".into()))
                    .condition_expression("attribute_not_exists(pk)")
                    .build()
                    .expect("put"),
            )
            .build()
    };
    let run = |id: &'static str| {
        let runs = Arc::clone(&runs);
        let write = charge_put(id);
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
    let attempt = Attempt::new("t", "k", payload(100));
    let first = engine
        .execute_transactional(&attempt, run("ch_1"))
        .await
        .expect("first");
    assert_eq!(first.kind(), OutcomeKind::Fresh);
    let replay = engine
        .execute_transactional(&attempt, run("ch_2"))
        .await
        .expect("replay");
    assert_eq!(replay.kind(), OutcomeKind::Replay);
    assert_eq!(replay.value().id, "ch_1");
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    let mut partitions: Vec<String> = items(&client, &table)
        .await
        .iter()
        .map(|item| s(item, "pk").to_owned())
        .collect();
    partitions.sort_unstable();
    assert_eq!(partitions, ["charge#ch_1", "idempotency#charges"]);

    // A refused business write commits nothing, and the claim is released:
    // the same key runs again.
    let attempt = Attempt::new("t", "k2", payload(100));
    match engine.execute_transactional(&attempt, run("ch_1")).await {
        Err(Error::Store(error)) => {
            assert_eq!(error.kind(), StoreErrorKind::WriteRejected, "{error}")
        }
        other => panic!("ch_1 exists: expected a rejected write, got {other:?}"),
    }
    let again = engine
        .execute_transactional(&attempt, run("ch_3"))
        .await
        .expect("after the release");
    assert_eq!(again.kind(), OutcomeKind::Fresh);
}

#[tokio::test]
async fn verify_tells_the_two_layouts_apart() {
    let client = support::client();
    let composite = support::unique_name("composite");
    store_in(&client, &composite, "f")
        .create_table()
        .await
        .expect("create_table");
    let message = DynamoDbStore::new(client.clone(), composite.clone())
        .attribute_names(AttributeNames::default().id("pk"))
        .verify()
        .await
        .expect_err("a store without the layout on a single-table table")
        .to_string();
    assert!(
        message.contains("partition key `pk` of type S and no sort key"),
        "{message}"
    );

    let plain = support::create_table_with(&client, "plain", "pk", Some("expiration")).await;
    let error = store_in(&client, &plain, "f")
        .verify()
        .await
        .expect_err("the layout on a table without a sort key");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
    let message = error.to_string();
    assert!(message.contains("sort key `sk` of type S"), "{message}");
    assert!(message.contains("idempotency#f"), "{message}");

    for (layout, why) in [
        (SingleTable::new("", "sk"), "empty"),
        (SingleTable::new("idempotency#f", "pk"), "both `pk`"),
    ] {
        let store = DynamoDbStore::new(client.clone(), composite.clone())
            .attribute_names(AttributeNames::default().id("pk"))
            .single_table(layout);
        for result in [store.verify().await, store.create_table().await] {
            let error = result.expect_err("a layout DynamoDB would refuse");
            assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
            assert!(error.to_string().contains(why), "{error}");
        }
    }
}

/// Review of issue 28: a single-table store on a table keyed by its
/// partition key alone puts every claim in one item (DynamoDB takes the
/// sort key for an ordinary attribute there). The record found at a key
/// must be that key's: never another key's response, never a run.
#[tokio::test]
async fn a_record_of_another_id_at_a_key_is_a_misconfiguration_not_a_replay() {
    let client = support::client();
    let table = support::create_table_with(&client, "no-sort-key", "pk", Some("expiration")).await;
    let engine = Engine::builder(store_in(&client, &table, "charges")).build();
    let runs = Arc::new(AtomicUsize::new(0));
    let first = engine
        .execute(
            &Attempt::new("tenant-a", "a-1", payload(1)),
            charge(&runs, 1),
        )
        .await
        .expect("the first claim lands in the one item");
    // Its completion, addressed by both keys, is refused: not recorded.
    assert_eq!(first.kind(), OutcomeKind::NotRecorded);
    let other_tenant = engine
        .execute(
            &Attempt::new("tenant-b", "b-9", payload(1)),
            charge(&runs, 1),
        )
        .await;
    match other_tenant {
        Err(Error::Store(error)) => {
            assert_eq!(error.kind(), StoreErrorKind::Misconfigured, "{error}");
            assert!(error.to_string().contains("holds record"), "{error}");
        }
        other => panic!("tenant b got {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "tenant b's handler never ran"
    );
}

#[tokio::test]
async fn verify_names_swapped_keys_and_an_index_on_a_record_attribute_of_another_type() {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType,
        Projection, ProjectionType, ScalarAttributeType,
    };
    let client = support::client();
    let definition = |name: &str, kind: ScalarAttributeType| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(kind)
            .build()
            .expect("definition")
    };
    let key = |name: &str, kind: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(kind)
            .build()
            .expect("key")
    };
    // Keys pk + sk; a store told the partition key is `sk` and the sort
    // key `pk` writes every probe happily, and would file records wrongly.
    let app = support::unique_name("swapped");
    store_in(&client, &app, "f")
        .create_table()
        .await
        .expect("table");
    let swapped = DynamoDbStore::new(client.clone(), app.clone())
        .attribute_names(AttributeNames::default().id("sk"))
        .single_table(SingleTable::new("idempotency#f", "pk"));
    let message = swapped.verify().await.expect_err("swapped").to_string();
    assert!(
        message.contains("it has partition key `pk` and sort key `sk`"),
        "{message}"
    );

    // An index keyed on `created_at` as a string: every claim would fail.
    let indexed = support::unique_name("indexed");
    client
        .create_table()
        .table_name(&indexed)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(definition("pk", ScalarAttributeType::S))
        .attribute_definitions(definition("sk", ScalarAttributeType::S))
        .attribute_definitions(definition("created_at", ScalarAttributeType::S))
        .key_schema(key("pk", KeyType::Hash))
        .key_schema(key("sk", KeyType::Range))
        .global_secondary_indexes(
            GlobalSecondaryIndex::builder()
                .index_name("by-created")
                .key_schema(key("created_at", KeyType::Hash))
                .projection(
                    Projection::builder()
                        .projection_type(ProjectionType::KeysOnly)
                        .build(),
                )
                .build()
                .expect("index"),
        )
        .send()
        .await
        .expect("create the indexed table");
    let store = store_in(&client, &indexed, "f");
    let error = store
        .create_table()
        .await
        .expect_err("the index's key type");
    assert_eq!(error.kind(), StoreErrorKind::Misconfigured);
    let message = error.to_string();
    assert!(
        message.contains("`created_at` as type S") && message.contains("as type N"),
        "{message}"
    );
}

/// Review of issue 28: an item of the application's in the records'
/// partition that looks like a claim in progress must not hide the real
/// ones from an operator.
#[tokio::test]
async fn listing_passes_over_an_item_that_is_not_a_record() {
    let client = support::client();
    let table = support::unique_name("odd-item");
    let store = store_in(&client, &table, "charges");
    store.create_table().await.expect("create_table");
    let engine = Engine::builder(store.clone()).build();
    let now = SystemClock.now_ms();
    let stuck = engine.record_id("tenant", "stuck");
    store
        .claim(&stuck_claim(stuck.clone(), now))
        .await
        .expect("claim");
    let lookalike = format!(
        "{}#not-a-record",
        stuck.as_str().split('#').next().unwrap_or("")
    );
    client
        .put_item()
        .table_name(&table)
        .item("pk", AttributeValue::S("idempotency#charges".into()))
        .item("sk", AttributeValue::S(lookalike))
        .item("status", AttributeValue::S("IN_PROGRESS".into()))
        .send()
        .await
        .expect("the application's item");
    let listed = engine.list_in_progress(10).await.expect("listed");
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, stuck);
}
