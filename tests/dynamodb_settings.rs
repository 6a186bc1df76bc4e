//! The DynamoDB store when it is set up wrong (issue 21): each mistake is
//! misconfiguration, which fails closed even failing open, never an outage
//! that runs the operation without a claim. Against DynamoDB Local.
//!
//! Needs `AWS_ENDPOINT_URL_DYNAMODB` (`scripts/with-dynamodb-local`).

mod support;

use aws_sdk_dynamodb::{config::Region, Client};
use lambda_idempotency::{
    store::dynamodb::DynamoDbStore, testing::scenarios::payload, Attempt, Engine, Error,
    StoreErrorKind,
};
use std::sync::atomic::{AtomicUsize, Ordering};

async fn refused_even_failing_open(store: DynamoDbStore, what: &str) {
    let engine = Engine::builder(store).fail_open(true).build();
    let runs = AtomicUsize::new(0);
    let result = engine
        .execute(&Attempt::new("t", "k", payload(1)), || async {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, std::io::Error>(1u8)
        })
        .await;
    match result {
        Err(Error::Store(error)) => {
            assert_eq!(
                error.kind(),
                StoreErrorKind::Misconfigured,
                "{what}: {error}"
            )
        }
        other => panic!("{what}: refused as misconfigured, not {other:?}"),
    }
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "{what}: never ran unprotected"
    );
}

#[tokio::test]
async fn a_missing_table_is_misconfigured() {
    let store = DynamoDbStore::new(support::client(), "no-such-table");
    refused_even_failing_open(store, "a missing table").await;
}

#[tokio::test]
async fn a_client_without_credentials_is_misconfigured() {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .region(Region::new("us-east-1"))
        .endpoint_url(support::endpoint())
        .build();
    let client = Client::from_conf(config);
    let table = support::create_idempotency_table(&support::client()).await;
    refused_even_failing_open(DynamoDbStore::new(client, table), "no credentials").await;
}

#[tokio::test]
async fn a_client_without_a_region_is_misconfigured() {
    let config = aws_sdk_dynamodb::Config::builder()
        .behavior_version_latest()
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::for_tests())
        .build();
    let client = Client::from_conf(config);
    refused_even_failing_open(DynamoDbStore::new(client, "idempotency"), "no region").await;
}

// --- create_table and verify (issue 22) ------------------------------------

fn misconfigured(result: Result<(), lambda_idempotency::StoreError>, what: &str) -> String {
    match result {
        Err(error) => {
            assert_eq!(
                error.kind(),
                StoreErrorKind::Misconfigured,
                "{what}: {error}"
            );
            error.to_string()
        }
        Ok(()) => panic!("{what}: verify must refuse it"),
    }
}

#[tokio::test]
async fn create_table_makes_a_table_the_store_verifies_and_uses_and_is_idempotent() {
    let name = support::unique_name("created");
    let store = DynamoDbStore::new(support::client(), name.clone());
    store.create_table().await.expect("created");
    // Again: the existing table is verified, not an error.
    store.create_table().await.expect("created twice");
    store.verify().await.expect("verified");

    let description = support::client()
        .describe_table()
        .table_name(&name)
        .send()
        .await
        .expect("described");
    let table = description.table().expect("a table");
    let key: Vec<_> = table
        .key_schema()
        .iter()
        .map(|k| {
            (
                k.attribute_name().to_owned(),
                k.key_type().as_str().to_owned(),
            )
        })
        .collect();
    assert_eq!(key, [("id".to_owned(), "HASH".to_owned())]);
    assert_eq!(
        table
            .billing_mode_summary()
            .and_then(|b| b.billing_mode())
            .map(|m| m.as_str().to_owned()),
        Some("PAY_PER_REQUEST".to_owned())
    );

    // The probes wrote nothing.
    let scanned = support::client()
        .scan()
        .table_name(&name)
        .send()
        .await
        .expect("scanned");
    assert_eq!(scanned.count(), 0, "verify writes nothing");

    let engine = Engine::builder(store).build();
    let outcome = engine
        .execute(&Attempt::new("t", "k", payload(1)), || async {
            Ok::<_, std::io::Error>(7u8)
        })
        .await
        .expect("runs on the created table");
    assert_eq!(outcome.into_value(), 7);
}

#[tokio::test]
async fn verify_names_a_missing_table() {
    let store = DynamoDbStore::new(support::client(), "no-such-table-verify");
    let message = misconfigured(store.verify().await, "a missing table");
    assert!(
        message.contains("no-such-table-verify does not exist"),
        "{message}"
    );
}

#[tokio::test]
async fn verify_names_a_wrong_key_schema() {
    let client = support::client();
    let table = support::create_table_with(&client, "wrong-key", "pk", Some("expiration")).await;
    let message = misconfigured(
        DynamoDbStore::new(client, table.clone()).verify().await,
        "a table keyed on pk",
    );
    assert!(
        message.contains("key is not what the store needs"),
        "{message}"
    );
    assert!(message.contains("`id`"), "{message}");
}

/// Review of issue 22: a sort key, or a partition key of another type, is
/// named as a wrong key; and the SDK's error is said once (it used to be in
/// the message and again as its source: twice the SDK's dump).
#[tokio::test]
async fn verify_names_a_sort_key_or_a_number_key_and_says_the_sdk_error_once() {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let client = support::client();
    for (prefix, id_type, sort_key) in [
        ("sorted", ScalarAttributeType::S, true),
        ("number-key", ScalarAttributeType::N, false),
    ] {
        let name = support::unique_name(prefix);
        let mut create = client
            .create_table()
            .table_name(&name)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name("id")
                    .attribute_type(id_type)
                    .build()
                    .expect("definition"),
            )
            .key_schema(
                KeySchemaElement::builder()
                    .attribute_name("id")
                    .key_type(KeyType::Hash)
                    .build()
                    .expect("key"),
            );
        if sort_key {
            create = create
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name("sk")
                        .attribute_type(ScalarAttributeType::S)
                        .build()
                        .expect("definition"),
                )
                .key_schema(
                    KeySchemaElement::builder()
                        .attribute_name("sk")
                        .key_type(KeyType::Range)
                        .build()
                        .expect("key"),
                );
        }
        create.send().await.expect("created");
        let message = misconfigured(
            DynamoDbStore::new(client.clone(), name.clone())
                .verify()
                .await,
            prefix,
        );
        assert!(
            message.contains("key is not what the store needs"),
            "{prefix}: {message}"
        );
        assert_eq!(
            message.matches("DynamoDB PutItem failed").count(),
            1,
            "{prefix}: the SDK's error once: {message}"
        );
    }
}

#[tokio::test]
async fn verify_names_ttl_off_or_on_another_attribute() {
    let client = support::client();
    let without = support::create_table_with(&client, "no-ttl", "id", None).await;
    let message = misconfigured(
        DynamoDbStore::new(client.clone(), without.clone())
            .verify()
            .await,
        "TTL off",
    );
    assert!(message.contains("TTL is not enabled on table"), "{message}");

    let other = support::create_table_with(&client, "other-ttl", "id", Some("ttl")).await;
    let message = misconfigured(
        DynamoDbStore::new(client.clone(), other).verify().await,
        "TTL on ttl",
    );
    assert!(message.contains("deletes by `ttl`"), "{message}");

    // create_table on the table without TTL enables it.
    let store = DynamoDbStore::new(client, without);
    store.create_table().await.expect("TTL enabled");
    store.verify().await.expect("verified after");
}

/// A missing table over HTTP: a 500 problem that says an operator must act,
/// never a 503 asking the client to retry.
#[tokio::test]
async fn a_missing_table_answers_500_over_http() {
    use lambda_http::{Body, Request};
    use lambda_idempotency::http::IdempotencyLayer;
    use tower::{Layer, ServiceExt};

    let layer = IdempotencyLayer::new(
        Engine::builder(DynamoDbStore::new(support::client(), "no-such-table-http")).build(),
    )
    .shared_scope();
    let runs = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let service = layer.layer(tower::service_fn(move |_: Request| {
        counted.fetch_add(1, Ordering::SeqCst);
        async { Ok::<_, std::convert::Infallible>(lambda_http::Response::new(Body::Empty)) }
    }));
    let request = lambda_http::http::Request::builder()
        .method("POST")
        .uri("/v1/charges")
        .header("idempotency-key", "k-1")
        .header("content-type", "application/json")
        .body(Body::from("{}"))
        .expect("request");
    let response = service.oneshot(request).await.expect("answered");
    assert_eq!(response.status(), 500);
    assert!(response.headers().get("retry-after").is_none());
    let body = match response.body() {
        Body::Text(text) => text.clone(),
        Body::Binary(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Body::Empty => String::new(),
        _ => String::new(),
    };
    assert!(body.contains("idempotency-store-failed"), "{body}");
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

/// Run in a child process (no tracing subscriber there): two requests on a
/// missing table.
#[tokio::test]
async fn child_two_requests_on_a_missing_table() {
    if std::env::var_os("LAMBDA_IDEMPOTENCY_ALERT_CHILD").is_none() {
        return;
    }
    let engine =
        Engine::builder(DynamoDbStore::new(support::client(), "no-such-table-log")).build();
    for key in ["a", "b"] {
        let result = engine
            .execute(&Attempt::new("t", key, payload(1)), || async {
                Ok::<_, std::io::Error>(1u8)
            })
            .await;
        assert!(matches!(result, Err(Error::Store(_))), "{result:?}");
    }
}

/// Without a tracing subscriber, a function on a missing table would answer
/// 500s with empty logs: the first misconfiguration of the process is written
/// to stderr, once.
#[test]
fn without_a_subscriber_a_misconfiguration_is_logged_once() {
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_two_requests_on_a_missing_table",
            "--nocapture",
        ])
        .env("LAMBDA_IDEMPOTENCY_ALERT_CHILD", "1")
        .output()
        .expect("child runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let alerts: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|v: &serde_json::Value| v["target"] == "lambda_idempotency")
        .collect();
    assert_eq!(alerts.len(), 1, "once per process: {stderr}");
    assert_eq!(alerts[0]["level"], "ERROR");
    let error = alerts[0]["error"].as_str().unwrap_or_default();
    assert!(error.contains("ResourceNotFoundException"), "{error}");
}

/// Run in a child process (no tracing subscriber there): two requests on a
/// store that cannot be reached (a closed port).
#[tokio::test]
async fn child_two_requests_on_an_unreachable_store() {
    if std::env::var_os("LAMBDA_IDEMPOTENCY_OUTAGE_CHILD").is_none() {
        return;
    }
    let engine = Engine::builder(DynamoDbStore::new(
        support::unreachable_client(),
        "idempotency",
    ))
    .build();
    for key in ["a", "b"] {
        let result = engine
            .execute(&Attempt::new("t", key, payload(1)), || async {
                Ok::<_, std::io::Error>(1u8)
            })
            .await;
        assert!(
            matches!(&result, Err(Error::Store(e)) if e.kind() == StoreErrorKind::Unavailable),
            "{result:?}"
        );
    }
}

/// Issue 38, item 6: without a tracing subscriber, a store that cannot be
/// reached (a wrong port) answered 503s with empty logs: the first outage
/// of the process is written to stderr, once.
#[test]
fn without_a_subscriber_the_first_outage_is_logged_once() {
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "child_two_requests_on_an_unreachable_store",
            "--nocapture",
        ])
        .env("LAMBDA_IDEMPOTENCY_OUTAGE_CHILD", "1")
        .output()
        .expect("child runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let alerts: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .filter(|v: &serde_json::Value| v["target"] == "lambda_idempotency")
        .collect();
    assert_eq!(alerts.len(), 1, "once per process: {stderr}");
    assert_eq!(alerts[0]["level"], "ERROR");
    let message = alerts[0]["message"].as_str().unwrap_or_default();
    assert!(message.contains("store unavailable"), "{message}");
}
