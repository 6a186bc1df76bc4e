//! The DynamoDB store: the protocol as conditional writes.
//!
//! # The table
//!
//! One partition key of type S (`id` unless renamed with
//! [`AttributeNames`]), no sort key, TTL on `expiration`, on-demand
//! capacity; or, beside other items of a single-table design, a partition
//! key and a sort key ([`SingleTable`], see "Single-table layout" below). [`DynamoDbStore::create_table`] makes it (tests, scripts);
//! [`DynamoDbStore::verify`] checks it from `main` without writing. In
//! infrastructure code:
//!
//! ```yaml
//! # SAM / CloudFormation
//! IdempotencyTable:
//!   Type: AWS::DynamoDB::Table
//!   Properties:
//!     BillingMode: PAY_PER_REQUEST
//!     AttributeDefinitions: [{ AttributeName: id, AttributeType: S }]
//!     KeySchema: [{ AttributeName: id, KeyType: HASH }]
//!     TimeToLiveSpecification: { AttributeName: expiration, Enabled: true }
//! ```
//!
//! ```text
//! // CDK (TypeScript)
//! new dynamodb.TableV2(this, "Idempotency", {
//!   partitionKey: { name: "id", type: dynamodb.AttributeType.STRING },
//!   timeToLiveAttribute: "expiration",
//! });  // TableV2 is on-demand by default
//!
//! # Terraform
//! resource "aws_dynamodb_table" "idempotency" {
//!   name         = "idempotency"
//!   billing_mode = "PAY_PER_REQUEST"
//!   hash_key     = "id"
//!   attribute { name = "id"  type = "S" }
//!   ttl { attribute_name = "expiration"  enabled = true }
//! }
//!
//! # AWS CLI
//! aws dynamodb create-table --table-name idempotency --billing-mode PAY_PER_REQUEST \
//!     --attribute-definitions AttributeName=id,AttributeType=S \
//!     --key-schema AttributeName=id,KeyType=HASH
//! aws dynamodb update-time-to-live --table-name idempotency \
//!     --time-to-live-specification Enabled=true,AttributeName=expiration
//! ```
//!
#![doc = include_str!("docs.md")]

mod abandoned;
mod codec;
mod errors;
mod layout;
mod names;
#[cfg(feature = "powertools")]
mod powertools;
mod steps;
mod table;

pub use layout::SingleTable;
pub use names::AttributeNames;

use super::{
    Claim, Commit, Completion, Conditional, Extension, OwnerToken, Record, RecordId, RecordedStep,
    Removal, Status, StepWrite, Store,
};
use crate::{StoreError, StoreErrorKind};
use aws_sdk_dynamodb::{
    operation::transact_write_items::TransactWriteItemsError,
    primitives::Blob,
    types::{
        AttributeValue, CancellationReason, Put, ReturnValuesOnConditionCheckFailure,
        TransactWriteItem, Update,
    },
    Client,
};
use codec::{number, string, Item};
use errors::Answer;
use layout::KeyLayout;
use names::ExpressionNames;
use std::{collections::HashMap, sync::Arc};

/// Decodes an item with the default attribute names (for the fuzz targets).
#[cfg(feature = "fuzzing")]
pub(crate) fn decode_item(item: Item) -> Result<Record, StoreError> {
    let names = AttributeNames::default();
    codec::decode(&names, &names.id, item)
}

const CLAIM_CONDITION: &str = "attribute_not_exists(#id) OR #expiration < :now_s";
/// A claim's condition, and a lapsed claim: what a single-write commit may
/// replace. Not a claim that holds a response: this crate never writes
/// one, so it is a completed record whose status was changed, which is
/// never overwritten.
const COMMIT_CONDITION: &str = "attribute_not_exists(#id) OR #expiration < :now_s \
     OR (#status = :in_progress AND #lease_until < :now_ms \
         AND attribute_not_exists(#response) AND attribute_not_exists(#response_deflate))";
/// A takeover's condition, of a record without steps: one that holds
/// steps is taken over by an update that keeps them (`steps.rs`).
const TAKE_OVER_CONDITION: &str = "#status = :in_progress AND #owner = :lapsed \
     AND #lease_until < :now_ms AND attribute_not_exists(#steps)";
/// A takeover's condition, of a record with or without steps.
const TAKE_OVER_CONDITION_WITH_STEPS: &str =
    "#status = :in_progress AND #owner = :lapsed AND #lease_until < :now_ms";
const FENCE_CONDITION: &str = "#status = :in_progress AND #owner = :owner";
const EXTEND_UPDATE: &str = "SET #lease_until = :lease_until, #expiration = :expiration";
const EXISTS_CONDITION: &str = "attribute_exists(#id)";
const EXISTS_UNLESS_IN_PROGRESS_CONDITION: &str =
    "attribute_exists(#id) AND #status <> :in_progress";
const COMPLETE_UPDATE: &str = "SET #status = :completed, #response = :response, \
     #expiration = :expiration, #completed_at = :now_ms REMOVE #lease_until, #steps";

/// Records in a DynamoDB table.
///
/// The table needs a partition key of type S (named `id` unless configured
/// otherwise with [`attribute_names`](DynamoDbStore::attribute_names)), and
/// a sort key of type S with a [single-table layout](DynamoDbStore::single_table), and,
/// to have DynamoDB delete old records, TTL enabled on `expiration`. Every
/// read and condition compares `expiration` itself, so records are never
/// served after they expire, however late TTL deletes them.
///
/// Transactional writes ([`Store::Write`]) are
/// [`TransactWriteItem`]s, committed in one `TransactWriteItems` call with
/// the completion (so at most 99 of them, none on the record's own item).
///
/// Build the client once per process, outside the handler; the store is
/// cheap to clone.
#[derive(Debug, Clone)]
pub struct DynamoDbStore {
    inner: Arc<Inner>,
}

#[derive(Debug, Clone)]
struct Inner {
    client: Client,
    table: String,
    names: AttributeNames,
    expression_names: ExpressionNames,
    layout: KeyLayout,
    /// Only one Region writes records at a time (see `single_writer_region`).
    single_writer_region: bool,
    /// Responses longer than this are stored deflate-compressed (see
    /// `compress_responses_above`).
    compress_above: Option<usize>,
}

impl DynamoDbStore {
    /// A store over `table`, with the default attribute names.
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        let names = AttributeNames::default();
        Self {
            inner: Arc::new(Inner {
                client,
                table: table.into(),
                expression_names: ExpressionNames::new(&names),
                names,
                layout: KeyLayout::OwnPartition,
                single_writer_region: false,
                compress_above: None,
            }),
        }
    }

    /// Uses other attribute names, for example to share a table laid out by
    /// another tool.
    #[must_use]
    pub fn attribute_names(self, names: AttributeNames) -> Self {
        self.reconfigured(|inner| {
            inner.expression_names = ExpressionNames::new(&names);
            inner.names = names;
        })
    }

    /// Keeps the records in one partition of a single-table design: the
    /// partition key ([`AttributeNames::id`]) holds
    /// [`SingleTable::partition_value`] and the sort key holds the record's
    /// id, like Powertools' `static_pk_value` and `sort_key_attr`. The
    /// table's key must then be that partition key and that sort key, both
    /// of type S ([`create_table`](Self::create_table) makes it so). See the
    /// module docs, "Single-table layout", for when it is worth it and what
    /// it costs.
    #[must_use]
    pub fn single_table(self, layout: SingleTable) -> Self {
        self.reconfigured(|inner| inner.layout = KeyLayout::Single(layout))
    }

    /// The single-table layout, when the store uses one.
    pub fn single_table_layout(&self) -> Option<&SingleTable> {
        match &self.inner.layout {
            KeyLayout::OwnPartition => None,
            KeyLayout::Single(single) => Some(single),
        }
    }

    /// Declares that only one Region writes records at a time (an
    /// active-passive deployment that fails over), so that
    /// [`verify`](Self::verify) accepts a global table in multi-Region
    /// eventual consistency, which it otherwise refuses: there a claim made
    /// in one Region does not stop the same key claimed in another before
    /// replication (last writer wins), and a request can run twice. See
    /// the module docs, "Global tables".
    #[must_use]
    pub fn single_writer_region(self) -> Self {
        self.reconfigured(|inner| inner.single_writer_region = true)
    }

    /// Stores responses longer than `bytes` deflate-compressed, in the
    /// attribute [`AttributeNames::response_deflate`], when that makes
    /// them smaller (off by default).
    ///
    /// DynamoDB bills a write one unit per started KB of the record, a
    /// transactional write two, a refused conditional write (a replay, a
    /// 409, a 422) the size of the record it found: a large response is
    /// paid for on its completion and on every replay. Compressed, a JSON
    /// response typically takes a third to a half of its size, and so do
    /// those units (`make bench-cost`, BENCHMARKS.md). It costs CPU on
    /// completion and on replay (tens of microseconds for 16 KB).
    ///
    /// Every version of this store reads records of both forms, so turning
    /// it on or off needs no migration; but a version that predates this
    /// option reads a compressed record as one without a response (a
    /// corrupt record: refused, never run again), so turn it on only once
    /// no older version serves the table, and not before a rollback to one.
    /// The HTTP layer already compresses bodies above 4 KiB in its own
    /// stored frame (its `compress_above`): a response it compressed is
    /// stored as it is, since deflating it again gains nothing.
    #[must_use]
    pub fn compress_responses_above(self, bytes: usize) -> Self {
        self.reconfigured(|inner| inner.compress_above = Some(bytes))
    }

    /// The response attribute's name and value: compressed when the store
    /// compresses responses of this length and it makes them smaller.
    fn stored_response(&self, response: Vec<u8>) -> (bool, AttributeValue) {
        let compressed = self
            .inner
            .compress_above
            .filter(|above| response.len() > *above)
            .and_then(|_| crate::deflate::deflate(&response, codec::DEFLATE_LEVEL));
        match compressed {
            Some(compressed) => (true, AttributeValue::B(Blob::new(compressed))),
            None => (false, AttributeValue::B(Blob::new(response))),
        }
    }

    /// The store with one setting changed; stores cloned before keep theirs.
    fn reconfigured(self, change: impl FnOnce(&mut Inner)) -> Self {
        let mut inner = Arc::unwrap_or_clone(self.inner);
        change(&mut inner);
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The table's name.
    pub fn table(&self) -> &str {
        &self.inner.table
    }

    /// The attribute names in use.
    pub fn names(&self) -> &AttributeNames {
        &self.inner.names
    }

    fn key(&self, id: &RecordId) -> Item {
        self.inner.layout.key(&self.inner.names, id.as_str())
    }

    fn fence_values(owner: &OwnerToken) -> Item {
        HashMap::from([
            (
                ":in_progress".to_owned(),
                string(Status::InProgress.as_str()),
            ),
            (":owner".to_owned(), string(owner.as_str())),
        ])
    }

    fn decode(&self, item: Item) -> Result<Record, StoreError> {
        let inner = &*self.inner;
        codec::decode(&inner.names, inner.layout.id_attribute(&inner.names), item)
    }

    /// The record stored at `id`'s key, decoded. A record of another id
    /// there means the table's key is not the store's (a single-table
    /// layout on a table without its sort key stores every record in one
    /// item): never served as `id`'s.
    fn decode_at(&self, id: &RecordId, item: Item) -> Result<Record, StoreError> {
        let record = self.decode(item)?;
        if record.id != *id {
            return Err(StoreError::new(
                StoreErrorKind::Misconfigured,
                format!(
                    "table {}: the item at the key of record {id} holds record {}: the table's \
                     key is not {} (DynamoDbStore::verify says what it is)",
                    self.inner.table,
                    record.id,
                    self.inner.layout.describe(&self.inner.names)
                ),
            ));
        }
        Ok(record)
    }

    /// The record a refused write reports: the item DynamoDB returned
    /// with the failure, decoded.
    fn refused(&self, id: &RecordId, item: Option<Item>) -> Result<Conditional, StoreError> {
        Ok(Conditional::Refused(
            item.map(|item| self.decode_at(id, item)).transpose()?,
        ))
    }

    /// A conditional write's answer, with the record found when refused.
    fn answered(&self, id: &RecordId, answer: Answer) -> Result<Conditional, StoreError> {
        match answer {
            Answer::Applied => Ok(Conditional::Applied),
            Answer::ConditionFailed(item) => self.refused(id, item),
        }
    }

    /// The answer of a write that puts a record where another may be: a
    /// refusal that carried no item is read back, strongly consistent, so
    /// that the engine learns what holds the key.
    async fn answered_or_read(
        &self,
        id: &RecordId,
        answer: Answer,
    ) -> Result<Conditional, StoreError> {
        match answer {
            Answer::ConditionFailed(None) => self.refused(id, self.get_item(id, true).await?),
            answer => self.answered(id, answer),
        }
    }

    /// A fenced `UpdateItem` of the record (`#status = IN_PROGRESS AND
    /// #owner = :owner`), read as a [`Conditional`].
    async fn fenced_update(
        &self,
        id: &RecordId,
        update: &'static str,
        names: &HashMap<String, String>,
        values: Item,
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let result = inner
            .client
            .update_item()
            .table_name(&inner.table)
            .set_key(Some(self.key(id)))
            .update_expression(update)
            .condition_expression(FENCE_CONDITION)
            .set_expression_attribute_names(Some(names.clone()))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        self.answered(id, errors::conditional(result, operation)?)
    }

    /// A conditional `PutItem` of a whole record (a claim, a takeover, a
    /// commit without writes), read as a [`Conditional`]; a refusal that
    /// carried no item is read back.
    async fn conditional_put(
        &self,
        id: &RecordId,
        item: Item,
        condition: &'static str,
        names: &HashMap<String, String>,
        values: Item,
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let result = inner
            .client
            .put_item()
            .table_name(&inner.table)
            .set_item(Some(item))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names.clone()))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let answer = errors::conditional(result, operation)?;
        self.answered_or_read(id, answer).await
    }

    /// The values of the completion update, and its attribute names (the
    /// response's attribute depends on whether it is stored compressed);
    /// the response moves into them, so a large body is not copied.
    fn completion_values(
        &self,
        completion: &mut Completion<TransactWriteItem>,
    ) -> (Item, &HashMap<String, String>) {
        let mut values = Self::fence_values(&completion.owner);
        values.insert(":completed".to_owned(), string(Status::Completed.as_str()));
        let (compressed, response) = self.stored_response(std::mem::take(&mut completion.response));
        values.insert(":response".to_owned(), response);
        values.insert(":expiration".to_owned(), number(completion.expiration_s));
        values.insert(":now_ms".to_owned(), number(completion.now_ms));
        let names = &self.inner.expression_names;
        let names = if compressed {
            &names.complete_deflated
        } else {
            &names.complete
        };
        (values, names)
    }

    async fn complete_alone(
        &self,
        mut completion: Completion<TransactWriteItem>,
    ) -> Result<Conditional, StoreError> {
        let (values, names) = self.completion_values(&mut completion);
        self.fenced_update(
            &completion.id,
            COMPLETE_UPDATE,
            names,
            values,
            "UpdateItem (complete)",
        )
        .await
    }

    async fn complete_in_transaction(
        &self,
        mut completion: Completion<TransactWriteItem>,
    ) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let (values, names) = self.completion_values(&mut completion);
        let key = self.key(&completion.id);
        let update = Update::builder()
            .table_name(&inner.table)
            .set_key(Some(key))
            .update_expression(COMPLETE_UPDATE)
            .condition_expression(FENCE_CONDITION)
            .set_expression_attribute_names(Some(names.clone()))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| {
                StoreError::new(StoreErrorKind::Misconfigured, "invalid completion update")
                    .with_source(e)
            })?;
        let mut items = Vec::with_capacity(completion.writes.len() + 1);
        items.push(TransactWriteItem::builder().update(update).build());
        items.extend(completion.writes);
        self.transact(
            &completion.id,
            items,
            &completion.owner,
            "TransactWriteItems (complete)",
        )
        .await
    }

    /// Sends a transaction whose first action is the record's, and reads
    /// its answer.
    async fn transact(
        &self,
        id: &RecordId,
        items: Vec<TransactWriteItem>,
        owner: &OwnerToken,
        operation: &'static str,
    ) -> Result<Conditional, StoreError> {
        let result = self
            .inner
            .client
            .transact_write_items()
            .set_transact_items(Some(items))
            // One transaction per owner token: the token makes it
            // idempotent, so an SDK retry of one that landed succeeds
            // instead of failing its own condition.
            .client_request_token(owner.as_str())
            .send()
            .await;
        match result {
            Ok(_) => Ok(Conditional::Applied),
            Err(error) => match error.as_service_error() {
                Some(e) if e.is_transaction_canceled_exception() => {
                    match error.into_service_error() {
                        TransactWriteItemsError::TransactionCanceledException(cancelled) => {
                            self.cancelled(id, cancelled.cancellation_reasons.unwrap_or_default())
                        }
                        other => Err(StoreError::new(
                            StoreErrorKind::Other,
                            "DynamoDB TransactWriteItems failed",
                        )
                        .with_source(other)),
                    }
                }
                _ => Err(errors::from_transaction_sdk(operation, error)),
            },
        }
    }

    /// Reads why a transaction was cancelled: the record's own action (the
    /// first) failing its condition is a refusal, with the record found;
    /// anything else is about the operation's own writes.
    fn cancelled(
        &self,
        id: &RecordId,
        reasons: Vec<CancellationReason>,
    ) -> Result<Conditional, StoreError> {
        let mut reasons = reasons.into_iter();
        if let Some(fence) = reasons.next() {
            if fence.code() == Some("ConditionalCheckFailed") {
                return self.refused(id, fence.item);
            }
            if let Some(code) = fence.code().filter(|c| *c != "None") {
                return Err(StoreError::new(
                    errors::kind_of_code(Some(code)),
                    format!(
                        "DynamoDB TransactWriteItems cancelled: the completion failed with {code}"
                    ),
                ));
            }
        }
        let (index, code, message) = reasons
            .enumerate()
            .find_map(|(index, reason)| {
                let message = reason.message.unwrap_or_default();
                reason
                    .code
                    .filter(|c| c != "None")
                    .map(|c| (index, c, message))
            })
            .unwrap_or((0, String::from("an unknown reason"), String::new()));
        let kind = match errors::kind_of_code(Some(&code)) {
            StoreErrorKind::Other => StoreErrorKind::WriteRejected,
            kind => kind,
        };
        let error = StoreError::new(
            kind,
            format!("DynamoDB TransactWriteItems cancelled: the operation's write {index} failed with {code}"),
        );
        // A condition on a business item: the application may expect it.
        Err(if code == "ConditionalCheckFailed" {
            error.with_write_refusal(crate::WriteRefusal::new(index, code, message))
        } else {
            error
        })
    }
}

impl Store for DynamoDbStore {
    type Write = TransactWriteItem;

    const SINGLE_WRITE: bool = true;
    const DB_SYSTEM: &'static str = "aws.dynamodb";
    const STEPS: bool = true;

    async fn commit(
        &self,
        mut commit: Commit<TransactWriteItem>,
    ) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let mut item = codec::commit_item(&inner.names, self.key(&commit.id), &mut commit);
        if let Some(AttributeValue::B(response)) = item.remove(&inner.names.response) {
            let (compressed, response) = self.stored_response(response.into_inner());
            let name = if compressed {
                &inner.names.response_deflate
            } else {
                &inner.names.response
            };
            item.insert(name.clone(), response);
        }
        let values = HashMap::from([
            (":now_s".to_owned(), number(commit.now_ms / 1000)),
            (":now_ms".to_owned(), number(commit.now_ms)),
            (
                ":in_progress".to_owned(),
                string(Status::InProgress.as_str()),
            ),
        ]);
        if commit.writes.is_empty() {
            let names = &inner.expression_names.commit;
            return self
                .conditional_put(
                    &commit.id,
                    item,
                    COMMIT_CONDITION,
                    names,
                    values,
                    "PutItem (commit)",
                )
                .await;
        }
        let put = Put::builder()
            .table_name(&inner.table)
            .set_item(Some(item))
            .condition_expression(COMMIT_CONDITION)
            .set_expression_attribute_names(Some(inner.expression_names.commit.clone()))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(|e| {
                StoreError::new(StoreErrorKind::Misconfigured, "invalid commit put").with_source(e)
            })?;
        let mut items = Vec::with_capacity(commit.writes.len() + 1);
        items.push(TransactWriteItem::builder().put(put).build());
        items.extend(commit.writes);
        self.transact(
            &commit.id,
            items,
            &commit.owner,
            "TransactWriteItems (commit)",
        )
        .await
    }

    async fn claim(&self, claim: &Claim) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let item = codec::claim_item(&inner.names, self.key(&claim.id), claim);
        let values = HashMap::from([(":now_s".to_owned(), number(claim.now_ms / 1000))]);
        let names = &inner.expression_names.claim;
        self.conditional_put(
            &claim.id,
            item,
            CLAIM_CONDITION,
            names,
            values,
            "PutItem (claim)",
        )
        .await
    }

    async fn take_over(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let item = codec::claim_item(&inner.names, self.key(&claim.id), claim);
        let values = HashMap::from([
            (
                ":in_progress".to_owned(),
                string(Status::InProgress.as_str()),
            ),
            (":lapsed".to_owned(), string(lapsed.as_str())),
            (":now_ms".to_owned(), number(claim.now_ms)),
        ]);
        let names = &inner.expression_names.take_over;
        let answer = self
            .conditional_put(
                &claim.id,
                item,
                TAKE_OVER_CONDITION,
                names,
                values,
                "PutItem (take over)",
            )
            .await?;
        match answer {
            // Refused only for its steps: taken over by an update that
            // keeps them.
            Conditional::Refused(Some(found)) if steps::takeable(&found, claim, lapsed) => {
                self.take_over_stepped(claim, lapsed).await
            }
            answer => Ok(answer),
        }
    }

    async fn record_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        self.write_step(step).await
    }

    async fn steps(&self, id: &RecordId, now_ms: u64) -> Result<Vec<RecordedStep>, StoreError> {
        self.read_steps(id, now_ms).await
    }

    async fn extend(&self, extension: &Extension) -> Result<Conditional, StoreError> {
        let mut values = Self::fence_values(&extension.owner);
        values.insert(":lease_until".to_owned(), number(extension.lease_until_ms));
        values.insert(":expiration".to_owned(), number(extension.expiration_s));
        let names = &self.inner.expression_names.extend;
        self.fenced_update(
            &extension.id,
            EXTEND_UPDATE,
            names,
            values,
            "UpdateItem (extend)",
        )
        .await
    }

    async fn complete(
        &self,
        completion: Completion<TransactWriteItem>,
    ) -> Result<Conditional, StoreError> {
        if completion.writes.is_empty() {
            self.complete_alone(completion).await
        } else {
            self.complete_in_transaction(completion).await
        }
    }

    async fn release(&self, id: &RecordId, owner: &OwnerToken) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let result = inner
            .client
            .delete_item()
            .table_name(&inner.table)
            .set_key(Some(self.key(id)))
            .condition_expression(FENCE_CONDITION)
            .set_expression_attribute_names(Some(inner.expression_names.fence.clone()))
            .set_expression_attribute_values(Some(Self::fence_values(owner)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        // No item: the fence failed because there is no record.
        self.answered(id, errors::conditional(result, "DeleteItem (release)")?)
    }

    async fn remove(&self, id: &RecordId, removal: Removal) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let request = inner
            .client
            .delete_item()
            .table_name(&inner.table)
            .set_key(Some(self.key(id)))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        let request = match removal {
            Removal::Any => request
                .condition_expression(EXISTS_CONDITION)
                .set_expression_attribute_names(Some(inner.expression_names.exists.clone())),
            Removal::UnlessInProgress => request
                .condition_expression(EXISTS_UNLESS_IN_PROGRESS_CONDITION)
                .set_expression_attribute_names(Some(
                    inner.expression_names.exists_unless_in_progress.clone(),
                ))
                .expression_attribute_values(":in_progress", string(Status::InProgress.as_str())),
        };
        self.answered(
            id,
            errors::conditional(request.send().await, "DeleteItem (remove)")?,
        )
    }

    async fn list_in_progress(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut records = Vec::new();
        let mut start = None;
        while records.len() < limit {
            let (items, next) = self.in_progress_page(prefix, start).await?;
            for item in items {
                // An item of the application's that looks like a claim (a
                // single-table partition is shared) is named and passed over,
                // not allowed to hide every other claim from the operator.
                let key = self.describe_key(&item);
                match self.decode(item) {
                    Ok(record) => records.push(record),
                    Err(error) => {
                        tracing::warn!(table = %self.inner.table, item = %key, %error,
                            "an item that is not a record was passed over while listing claims in progress");
                    }
                }
            }
            start = next;
            if start.is_none() {
                break;
            }
        }
        records.truncate(limit);
        Ok(records)
    }

    /// One eventually consistent `Scan` (a `Query` of a single-table
    /// layout's partition) of at most `query.limit` items a page: 128 read
    /// units per MB scanned (the `abandoned` module).
    async fn list_abandoned(
        &self,
        query: &super::AbandonedQuery,
    ) -> Result<super::AbandonedPage, StoreError> {
        self.abandoned_page(query).await
    }

    async fn get(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let Some(item) = self.get_item(id, true).await? else {
            return Ok(None);
        };
        let record = self.decode_at(id, item)?;
        Ok((!record.is_expired(now_ms)).then_some(record))
    }

    /// An eventually consistent `GetItem`: half the read units.
    async fn peek(&self, id: &RecordId, now_ms: u64) -> Result<Option<Record>, StoreError> {
        let Some(item) = self.get_item(id, false).await? else {
            return Ok(None);
        };
        let record = self.decode_at(id, item)?;
        Ok((!record.is_expired(now_ms)).then_some(record))
    }

    /// `DescribeTable`'s `ItemCount` and `TableSizeBytes`: see
    /// [`size`](Self::size).
    async fn table_size(&self, _now_ms: u64) -> Result<Option<super::TableSize>, StoreError> {
        self.size().await.map(Some)
    }
}

impl DynamoDbStore {
    /// One page of claims in progress whose ids start with `prefix`: a
    /// scan of a table of records, a query of the one partition of a
    /// single-table layout (never the table's other items).
    async fn in_progress_page(
        &self,
        prefix: &str,
        start: Option<Item>,
    ) -> Result<(Vec<Item>, Option<Item>), StoreError> {
        let inner = &*self.inner;
        let in_progress = string(Status::InProgress.as_str());
        match &inner.layout {
            KeyLayout::OwnPartition => {
                let page = inner
                    .client
                    .scan()
                    .table_name(&inner.table)
                    .consistent_read(true)
                    .filter_expression("#status = :in_progress AND begins_with(#id, :prefix)")
                    .expression_attribute_names("#status", &inner.names.status)
                    .expression_attribute_names("#id", &inner.names.id)
                    .expression_attribute_values(":in_progress", in_progress)
                    .expression_attribute_values(":prefix", string(prefix))
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| errors::from_sdk("Scan (list in progress)", e))?;
                Ok((page.items.unwrap_or_default(), page.last_evaluated_key))
            }
            KeyLayout::Single(single) => {
                let page = inner
                    .client
                    .query()
                    .table_name(&inner.table)
                    .consistent_read(true)
                    .key_condition_expression("#pk = :partition AND begins_with(#sk, :prefix)")
                    .filter_expression("#status = :in_progress")
                    .expression_attribute_names("#pk", &inner.names.id)
                    .expression_attribute_names("#sk", single.sort_key())
                    .expression_attribute_names("#status", &inner.names.status)
                    .expression_attribute_values(":partition", string(single.partition_value()))
                    .expression_attribute_values(":prefix", string(prefix))
                    .expression_attribute_values(":in_progress", in_progress)
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| errors::from_sdk("Query (list in progress)", e))?;
                Ok((page.items.unwrap_or_default(), page.last_evaluated_key))
            }
        }
    }

    /// An item's key attributes, for a log line.
    fn describe_key(&self, item: &Item) -> String {
        let inner = &*self.inner;
        let value = |name: &str| match item.get(name) {
            Some(AttributeValue::S(text)) => format!("{name}={text:?}"),
            Some(other) => format!("{name}={other:?}"),
            None => format!("{name} missing"),
        };
        match &inner.layout {
            KeyLayout::OwnPartition => value(&inner.names.id),
            KeyLayout::Single(single) => {
                format!("{} {}", value(&inner.names.id), value(single.sort_key()))
            }
        }
    }

    async fn get_item(&self, id: &RecordId, consistent: bool) -> Result<Option<Item>, StoreError> {
        let inner = &*self.inner;
        inner
            .client
            .get_item()
            .table_name(&inner.table)
            .set_key(Some(self.key(id)))
            .consistent_read(consistent)
            .send()
            .await
            .map(|output| output.item)
            .map_err(|e| errors::from_sdk("GetItem", e))
    }
}

#[cfg(test)]
mod tests;
