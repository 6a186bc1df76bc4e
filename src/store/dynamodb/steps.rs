//! Recovery points on DynamoDB: a step is one fenced `UpdateItem` that
//! appends to the record's `steps` list; a takeover of a record holding
//! steps is an `UpdateItem` that keeps them (`docs/recovery-points.md`).

use super::{
    codec::{number, string, Item},
    errors, Claim, Conditional, DynamoDbStore, OwnerToken, Record, RecordId, RecordedStep, Status,
    StepWrite, TAKE_OVER_CONDITION_WITH_STEPS,
};
use crate::StoreError;
use aws_sdk_dynamodb::{
    primitives::Blob,
    types::{AttributeValue, ReturnValuesOnConditionCheckFailure},
};
use std::collections::HashMap;

/// Appends the step; `:no_steps` starts the list.
const STEP_UPDATE: &str = "SET #steps = list_append(if_not_exists(#steps, :no_steps), :step)";
/// The completion's fence, and no steps yet: the first step.
const FIRST_STEP_CONDITION: &str =
    "#status = :in_progress AND #owner = :owner AND attribute_not_exists(#steps)";
/// The completion's fence, and exactly `:index` steps: a later one.
const NEXT_STEP_CONDITION: &str =
    "#status = :in_progress AND #owner = :owner AND size(#steps) = :index";
/// A claim's attributes, set in place of a lapsed claim's: what the
/// takeover's `PutItem` writes, without replacing the item.
const TAKE_OVER_UPDATE: &str = "SET #status = :in_progress, #owner = :owner, \
     #lease_until = :lease_until, #expiration = :expiration, #fingerprint = :fingerprint, \
     #created_at = :created_at, #attempt = :attempt, #first_started_at = :first_started_at";

/// A step in the list: its name and output.
const NAME: &str = "name";
const OUTPUT: &str = "output";

/// Whether `found` is a claim `claim` could take over from `lapsed`, so a
/// refused takeover was refused only for its steps.
pub(super) fn takeable(found: &Record, claim: &Claim, lapsed: &OwnerToken) -> bool {
    found.status == Status::InProgress
        && found.owner == *lapsed
        && found
            .lease_until_ms
            .is_some_and(|lease| lease < claim.now_ms)
}

impl DynamoDbStore {
    pub(super) async fn write_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let entry = AttributeValue::M(HashMap::from([
            (NAME.to_owned(), string(&step.name)),
            (
                OUTPUT.to_owned(),
                AttributeValue::B(Blob::new(step.output.clone())),
            ),
        ]));
        let mut values = Self::fence_values(&step.owner);
        values.insert(":no_steps".to_owned(), AttributeValue::L(Vec::new()));
        values.insert(":step".to_owned(), AttributeValue::L(vec![entry]));
        // DynamoDB refuses a value no expression uses: `:index` only past
        // the first step.
        let condition = if step.index == 0 {
            FIRST_STEP_CONDITION
        } else {
            values.insert(":index".to_owned(), number(u64::from(step.index)));
            NEXT_STEP_CONDITION
        };
        let result = inner
            .client
            .update_item()
            .table_name(&inner.table)
            .set_key(Some(self.key(&step.id)))
            .update_expression(STEP_UPDATE)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(inner.expression_names.step.clone()))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        self.answered(&step.id, errors::conditional(result, "UpdateItem (step)")?)
    }

    pub(super) async fn read_steps(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> Result<Vec<RecordedStep>, StoreError> {
        let Some(mut item) = self.get_item(id, true).await? else {
            return Ok(Vec::new());
        };
        let steps = item.remove(&self.inner.names.steps);
        let record = self.decode_at(id, item)?;
        if record.is_expired(now_ms) || record.status != Status::InProgress {
            return Ok(Vec::new());
        }
        match steps {
            None => Ok(Vec::new()),
            Some(AttributeValue::L(steps)) => steps
                .into_iter()
                .map(|step| decode_step(id, step))
                .collect(),
            Some(_) => Err(StoreError::corrupt(format!(
                "record {id}: its steps are not a list"
            ))),
        }
    }

    /// Takes over a lapsed claim whose record holds steps, keeping them:
    /// the claim's attributes set under the takeover's condition.
    pub(super) async fn take_over_stepped(
        &self,
        claim: &Claim,
        lapsed: &OwnerToken,
    ) -> Result<Conditional, StoreError> {
        let inner = &*self.inner;
        let values: Item = HashMap::from([
            (
                ":in_progress".to_owned(),
                string(Status::InProgress.as_str()),
            ),
            (":lapsed".to_owned(), string(lapsed.as_str())),
            (":now_ms".to_owned(), number(claim.now_ms)),
            (":owner".to_owned(), string(claim.owner.as_str())),
            (":lease_until".to_owned(), number(claim.lease_until_ms)),
            (":expiration".to_owned(), number(claim.expiration_s)),
            (
                ":fingerprint".to_owned(),
                string(claim.fingerprint.as_str()),
            ),
            (":created_at".to_owned(), number(claim.now_ms)),
            (":attempt".to_owned(), number(u64::from(claim.attempt))),
            (
                ":first_started_at".to_owned(),
                number(claim.first_started_ms),
            ),
        ]);
        let result = inner
            .client
            .update_item()
            .table_name(&inner.table)
            .set_key(Some(self.key(&claim.id)))
            .update_expression(TAKE_OVER_UPDATE)
            .condition_expression(TAKE_OVER_CONDITION_WITH_STEPS)
            .set_expression_attribute_names(Some(inner.expression_names.take_over_stepped.clone()))
            .set_expression_attribute_values(Some(values))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        let answer = errors::conditional(result, "UpdateItem (take over with steps)")?;
        self.answered_or_read(&claim.id, answer).await
    }
}

fn decode_step(id: &RecordId, step: AttributeValue) -> Result<RecordedStep, StoreError> {
    let corrupt =
        || StoreError::corrupt(format!("record {id}: a step is not a name and an output"));
    let AttributeValue::M(mut step) = step else {
        return Err(corrupt());
    };
    match (step.remove(NAME), step.remove(OUTPUT)) {
        (Some(AttributeValue::S(name)), Some(AttributeValue::B(output))) => {
            Ok(RecordedStep::new(name, output.into_inner()))
        }
        _ => Err(corrupt()),
    }
}
