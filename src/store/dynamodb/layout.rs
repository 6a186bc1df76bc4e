//! Where a record's id goes: the partition key of a table of its own, or
//! the sort key of one partition in a single-table design.

use super::{codec::string, codec::Item, AttributeNames};
use std::collections::HashMap;

/// Records kept in one partition of a single-table design: the partition
/// key holds a fixed value (Powertools' `static_pk_value`,
/// `idempotency#<function>` by default there) and the sort key holds the
/// record's id (Powertools' `sort_key_attr`), beside the table's other
/// items. Given to [`DynamoDbStore::single_table`](super::DynamoDbStore::single_table).
///
/// The partition key keeps its configured name
/// ([`AttributeNames::id`], `id` by default; single-table designs often
/// call it `pk`). Both keys are of type S.
///
/// ```
/// use lambda_idempotency::store::dynamodb::{AttributeNames, SingleTable};
/// # let client = aws_sdk_dynamodb::Client::from_conf(
/// #     aws_sdk_dynamodb::Config::builder()
/// #         .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
/// #         .build());
///
/// // pk = "idempotency#charges", sk = the record's id
/// let store = lambda_idempotency::DynamoDbStore::new(client, "app")
///     .attribute_names(AttributeNames::default().id("pk"))
///     .single_table(SingleTable::for_function("charges", "sk"));
/// assert_eq!(store.single_table_layout().map(SingleTable::partition_value),
///            Some("idempotency#charges"));
/// ```
///
/// One partition key value takes every write of the function: see the
/// module docs, "Single-table layout", for what that costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SingleTable {
    partition_value: String,
    sort_key: String,
}

impl SingleTable {
    /// Records under the partition key value `partition_value`, their ids
    /// in the sort key attribute `sort_key`.
    pub fn new(partition_value: impl Into<String>, sort_key: impl Into<String>) -> Self {
        Self {
            partition_value: partition_value.into(),
            sort_key: sort_key.into(),
        }
    }

    /// Powertools' default partition: `idempotency#<function_name>`, so
    /// that records written by Powertools with `sort_key_attr` and no
    /// `static_pk_value` share the partition (in Lambda, the name is in
    /// `AWS_LAMBDA_FUNCTION_NAME`).
    pub fn for_function(function_name: &str, sort_key: impl Into<String>) -> Self {
        Self::new(format!("idempotency#{function_name}"), sort_key)
    }

    /// The partition key value every record is written under.
    pub fn partition_value(&self) -> &str {
        &self.partition_value
    }

    /// The sort key attribute, which holds the record's id.
    pub fn sort_key(&self) -> &str {
        &self.sort_key
    }
}

/// The table's key, as the store uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum KeyLayout {
    /// The record's id is the partition key; no sort key.
    OwnPartition,
    /// A fixed partition key value, the record's id in the sort key.
    Single(SingleTable),
}

impl KeyLayout {
    /// The item key of the record `id`.
    pub(super) fn key(&self, names: &AttributeNames, id: &str) -> Item {
        match self {
            Self::OwnPartition => HashMap::from([(names.id.clone(), string(id))]),
            Self::Single(single) => HashMap::from([
                (names.id.clone(), string(&single.partition_value)),
                (single.sort_key.clone(), string(id)),
            ]),
        }
    }

    /// The attribute that holds a record's id.
    pub(super) fn id_attribute<'a>(&'a self, names: &'a AttributeNames) -> &'a str {
        match self {
            Self::OwnPartition => &names.id,
            Self::Single(single) => &single.sort_key,
        }
    }

    /// The key schema, in words, for error messages.
    pub(super) fn describe(&self, names: &AttributeNames) -> String {
        match self {
            Self::OwnPartition => {
                format!("a partition key `{}` of type S and no sort key", names.id)
            }
            Self::Single(single) => format!(
                "a partition key `{}` of type S and a sort key `{}` of type S (single-table \
                 layout, records under `{}`)",
                names.id, single.sort_key, single.partition_value
            ),
        }
    }

    /// Why this layout cannot work, if it cannot: DynamoDB refuses empty
    /// key values and one attribute as both keys.
    pub(super) fn problem(&self, names: &AttributeNames) -> Option<String> {
        let Self::Single(single) = self else {
            return None;
        };
        if single.partition_value.is_empty() {
            Some("the single-table partition value is empty: DynamoDB refuses empty keys".into())
        } else if single.sort_key.is_empty() {
            Some("the single-table sort key attribute has no name".into())
        } else if single.sort_key == names.id {
            Some(format!(
                "the single-table sort key and the partition key are both `{}`",
                names.id
            ))
        } else {
            None
        }
    }
}
