//! The store's branches that DynamoDB Local cannot be made to take, on a
//! mocked client: conditional failures without the old item, throttling,
//! transaction cancellation reasons.

use super::*;
use crate::{Fingerprint, OwnerToken, RecordId};
use aws_sdk_dynamodb::{
    error::ErrorMetadata,
    operation::{
        get_item::GetItemOutput, put_item::PutItemOutput,
        transact_write_items::TransactWriteItemsError,
    },
    types::{
        error::{
            ConditionalCheckFailedException, ProvisionedThroughputExceededException,
            TransactionCanceledException,
        },
        CancellationReason,
    },
};
use aws_smithy_mocks::{mock, mock_client, Rule, RuleMode};

const NOW_MS: u64 = 1_700_000_000_000;

fn claim() -> Claim {
    Claim {
        id: RecordId::new("p", "s", "k"),
        owner: OwnerToken::from_stored("me"),
        fingerprint: Fingerprint::of_bytes(b"payload"),
        now_ms: NOW_MS,
        lease_until_ms: NOW_MS + 30_000,
        expiration_s: NOW_MS / 1000 + 3600,
    }
}

fn completed_item(owner: &str) -> Item {
    HashMap::from([
        ("id".to_owned(), string(claim().id.as_str())),
        ("status".to_owned(), string("COMPLETED")),
        ("expiration".to_owned(), number(NOW_MS / 1000 + 3600)),
        ("owner".to_owned(), string(owner)),
        (
            "fingerprint".to_owned(),
            string(Fingerprint::of_bytes(b"payload").as_str()),
        ),
        (
            "response".to_owned(),
            AttributeValue::B(Blob::new(b"42".to_vec())),
        ),
    ])
}

fn conditional_failure_without_item() -> Rule {
    mock!(Client::put_item).then_error(|| {
        PutItemError::ConditionalCheckFailedException(
            ConditionalCheckFailedException::builder().build(),
        )
    })
}

fn store(rules: &[&Rule]) -> DynamoDbStore {
    store_in(RuleMode::Sequential, rules)
}

fn store_in(mode: RuleMode, rules: &[&Rule]) -> DynamoDbStore {
    let client = mock_client!(aws_sdk_dynamodb, mode, rules);
    DynamoDbStore::new(client, "idempotency")
}

#[tokio::test]
async fn claim_falls_back_to_a_consistent_read_when_the_failure_has_no_item() {
    let put = conditional_failure_without_item();
    let get = mock!(Client::get_item)
        .match_requests(|req| req.consistent_read() == Some(true))
        .then_output(|| {
            GetItemOutput::builder()
                .set_item(Some(completed_item("other")))
                .build()
        });
    let outcome = store(&[&put, &get]).claim(&claim()).await.expect("claim");
    match outcome {
        ClaimOutcome::Existing(record) => {
            assert_eq!(record.status, Status::Completed);
            assert_eq!(record.response.as_deref(), Some(&b"42"[..]));
        }
        other => panic!("expected the existing record, got {other:?}"),
    }
    assert_eq!(get.num_calls(), 1);
}

#[tokio::test]
async fn claim_retries_when_the_conflicting_record_vanished() {
    let put = conditional_failure_without_item();
    let get = mock!(Client::get_item).then_output(|| GetItemOutput::builder().build());
    let put_again = mock!(Client::put_item).then_output(|| PutItemOutput::builder().build());
    let outcome = store(&[&put, &get, &put_again])
        .claim(&claim())
        .await
        .expect("claim");
    assert_eq!(outcome, ClaimOutcome::Claimed);
    assert_eq!(put_again.num_calls(), 1);
}

#[tokio::test]
async fn claim_read_back_as_our_own_record_is_ours() {
    let put = conditional_failure_without_item();
    let mine = {
        let mut item = completed_item("me");
        item.insert("status".into(), string("IN_PROGRESS"));
        item.remove("response");
        item.insert("lease_until".into(), number(NOW_MS + 30_000));
        item
    };
    let get = mock!(Client::get_item).then_output(move || {
        GetItemOutput::builder()
            .set_item(Some(mine.clone()))
            .build()
    });
    let outcome = store(&[&put, &get]).claim(&claim()).await.expect("claim");
    assert_eq!(outcome, ClaimOutcome::Claimed);
}

#[tokio::test]
async fn claim_gives_up_when_the_record_keeps_changing() {
    let put = mock!(Client::put_item)
        .sequence()
        .error(|| {
            PutItemError::ConditionalCheckFailedException(
                ConditionalCheckFailedException::builder().build(),
            )
        })
        .times(CLAIM_TRIES)
        .build();
    let get = mock!(Client::get_item)
        .sequence()
        .output(|| GetItemOutput::builder().build())
        .times(CLAIM_TRIES)
        .build();
    let error = store_in(RuleMode::MatchAny, &[&put, &get])
        .claim(&claim())
        .await
        .expect_err("bounded");
    assert_eq!(error.kind(), StoreErrorKind::Other);
    assert_eq!(put.num_calls(), CLAIM_TRIES);
}

#[tokio::test]
async fn throttling_is_a_throttled_store_error() {
    let put = mock!(Client::put_item)
        .sequence()
        .error(|| {
            PutItemError::ProvisionedThroughputExceededException(
                ProvisionedThroughputExceededException::builder()
                    .message("slow down")
                    .meta(
                        ErrorMetadata::builder()
                            .code("ProvisionedThroughputExceededException")
                            .message("slow down")
                            .build(),
                    )
                    .build(),
            )
        })
        .repeatedly()
        .build();
    let error = store(&[&put]).claim(&claim()).await.expect_err("throttled");
    assert_eq!(error.kind(), StoreErrorKind::Throttled, "{error}");
    assert!(error.to_string().contains("PutItem"), "{error}");
}

fn cancelled(reasons: Vec<CancellationReason>) -> Rule {
    mock!(Client::transact_write_items).then_error(move || {
        TransactWriteItemsError::TransactionCanceledException(
            TransactionCanceledException::builder()
                .set_cancellation_reasons(Some(reasons.clone()))
                .build(),
        )
    })
}

fn transactional_completion() -> Completion<TransactWriteItem> {
    let claim = claim();
    Completion {
        id: claim.id,
        owner: claim.owner,
        response: b"42".to_vec(),
        now_ms: NOW_MS,
        expiration_s: NOW_MS / 1000 + 3600,
        writes: vec![TransactWriteItem::builder().build()],
    }
}

fn reason(code: &str) -> CancellationReason {
    CancellationReason::builder().code(code).build()
}

#[tokio::test]
async fn transaction_fenced_out_is_lost_ownership() {
    let rule = cancelled(vec![
        CancellationReason::builder()
            .code("ConditionalCheckFailed")
            .set_item(Some(completed_item("successor")))
            .build(),
        reason("None"),
    ]);
    let fenced = store(&[&rule])
        .complete(transactional_completion())
        .await
        .expect("complete");
    assert_eq!(fenced, Fenced::Lost);
}

#[tokio::test]
async fn transaction_that_had_landed_is_applied() {
    let rule = cancelled(vec![
        CancellationReason::builder()
            .code("ConditionalCheckFailed")
            .set_item(Some(completed_item("me")))
            .build(),
        reason("None"),
    ]);
    let fenced = store(&[&rule])
        .complete(transactional_completion())
        .await
        .expect("complete");
    assert_eq!(fenced, Fenced::Applied);
}

#[tokio::test]
async fn transaction_cancelled_by_a_business_write_names_it() {
    let rule = cancelled(vec![
        reason("None"),
        reason("None"),
        reason("ConditionalCheckFailed"),
    ]);
    let error = store(&[&rule])
        .complete(transactional_completion())
        .await
        .expect_err("rejected");
    assert_eq!(error.kind(), StoreErrorKind::WriteRejected);
    assert!(error.to_string().contains("write 1"), "{error}");

    let rule = cancelled(vec![reason("None"), reason("ThrottlingError")]);
    let error = store(&[&rule])
        .complete(transactional_completion())
        .await
        .expect_err("throttled");
    assert_eq!(error.kind(), StoreErrorKind::Throttled);
}
