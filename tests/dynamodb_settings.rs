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
