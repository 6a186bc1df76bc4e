//! Outside review of `DynamoDbStore::verify`'s replication check (branch
//! `review-durable`), against what DynamoDB answers, mocked with
//! aws-smithy-mocks as the crate's own tests do.

use aws_sdk_dynamodb::{
    error::ErrorMetadata,
    operation::{
        delete_item::DeleteItemError, describe_global_table::DescribeGlobalTableError,
        describe_table::DescribeTableOutput, describe_time_to_live::DescribeTimeToLiveOutput,
        get_item::GetItemOutput, put_item::PutItemError, update_item::UpdateItemError,
    },
    types::{
        error::ConditionalCheckFailedException, KeySchemaElement, KeyType, TableDescription,
        TimeToLiveDescription, TimeToLiveStatus,
    },
    Client,
};
use aws_smithy_mocks::{mock, mock_client, Rule, RuleMode};
use lambda_idempotency::{DynamoDbStore, StoreErrorKind};

/// The probes, a single-Region table, `global` for DescribeGlobalTable,
/// and TTL on.
fn rules(global: Rule) -> Vec<Rule> {
    let failed = || ConditionalCheckFailedException::builder().build();
    vec![
        mock!(Client::put_item)
            .then_error(move || PutItemError::ConditionalCheckFailedException(failed())),
        mock!(Client::update_item)
            .then_error(move || UpdateItemError::ConditionalCheckFailedException(failed())),
        mock!(Client::delete_item)
            .then_error(move || DeleteItemError::ConditionalCheckFailedException(failed())),
        mock!(Client::get_item).then_output(|| GetItemOutput::builder().build()),
        mock!(Client::describe_table).then_output(|| {
            DescribeTableOutput::builder()
                .table(
                    TableDescription::builder()
                        .table_name("idempotency")
                        .key_schema(
                            KeySchemaElement::builder()
                                .attribute_name("id")
                                .key_type(KeyType::Hash)
                                .build()
                                .expect("key"),
                        )
                        .build(),
                )
                .build()
        }),
        global,
        mock!(Client::describe_time_to_live).then_output(|| {
            DescribeTimeToLiveOutput::builder()
                .time_to_live_description(
                    TimeToLiveDescription::builder()
                        .time_to_live_status(TimeToLiveStatus::Enabled)
                        .attribute_name("expiration")
                        .build(),
                )
                .build()
        }),
    ]
}

fn store(rules: &[Rule]) -> DynamoDbStore {
    let rules: Vec<&Rule> = rules.iter().collect();
    let client = mock_client!(aws_sdk_dynamodb, RuleMode::Sequential, &rules);
    DynamoDbStore::new(client, "idempotency")
}

fn global_error(code: &'static str, message: &'static str) -> Rule {
    mock!(Client::describe_global_table).then_error(move || {
        DescribeGlobalTableError::generic(
            ErrorMetadata::builder().code(code).message(message).build(),
        )
    })
}

/// Throttled while describing the global table: verify fails with the
/// throttling's kind (transient), not as a misconfiguration, as its docs
/// say ("except an outage, which keeps its kind").
#[tokio::test]
async fn a_throttled_describe_global_table_keeps_its_kind() {
    let error = store(&rules(global_error("ThrottlingException", "Rate exceeded")))
        .verify()
        .await
        .expect_err("throttled");
    assert!(error.kind().is_transient(), "{:?} {error}", error.kind());
    assert_ne!(error.kind(), StoreErrorKind::Misconfigured);
}

/// UNCONFIRMED AGAINST AWS, FAILS TODAY (liveness). Version 2017.11.29
/// (legacy) global tables exist only in some Regions (eu-west-3,
/// eu-north-1, af-south-1, ap-southeast-3, me-south-1 and the newer ones
/// never had them); there `CreateGlobalTable` answers `ValidationException:
/// One or more parameter values were invalid: DynamoDB global tables
/// version 2017.11.29 is not supported in this region` (reported by users,
/// e.g. rrahul963/serverless-create-global-dynamodb-table#22). If
/// `DescribeGlobalTable` answers the same there, every table in such a
/// Region, replicated or not, fails `verify` with "DynamoDB
/// DescribeGlobalTable on table idempotency was refused" (Misconfigured),
/// and a function that calls `verify` in `main`, as the docs advise, never
/// starts. A Region without legacy global tables has none to find: it
/// should pass, as `GlobalTableNotFoundException` and
/// `UnknownOperationException` do. What DynamoDB really answers there
/// should be checked in such a Region before relying on either. Fixed: a
/// `ValidationException` passes as "no legacy global table here".
#[tokio::test]
async fn a_region_without_legacy_global_tables_passes() {
    store(&rules(global_error(
        "ValidationException",
        "One or more parameter values were invalid: DynamoDB global tables version 2017.11.29 \
         is not supported in this region 'eu-west-3'",
    )))
    .verify()
    .await
    .expect("no legacy global table can exist in this Region");
}
