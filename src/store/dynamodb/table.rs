//! The table itself: [`DynamoDbStore::create_table`] for tests and scripts,
//! [`DynamoDbStore::verify`] for a function's start-up.

use super::{
    errors::{conditional, from_sdk, Answer, ConditionalError},
    layout::KeyLayout,
    DynamoDbStore,
};
use crate::{
    store::{Accuracy, SizeSource, TableSize},
    StoreError, StoreErrorKind,
};
use aws_sdk_dynamodb::{
    client::Waiters,
    config::http::HttpResponse,
    error::SdkError,
    types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, MultiRegionConsistency,
        ScalarAttributeType, TableDescription, TimeToLiveSpecification, TimeToLiveStatus,
    },
};
use std::{collections::HashMap, time::Duration};

/// The item the probes address. A condition no item can meet makes each
/// probe fail without writing, after DynamoDB has checked the table, its
/// key schema and the caller's permission for the action.
const PROBE_ID: &str = "lambda-idempotency#verify";
const NEVER: &str = "attribute_exists(#id) AND attribute_not_exists(#id)";
/// How long [`DynamoDbStore::create_table`] waits for a new table to be
/// `ACTIVE` (DynamoDB takes seconds; DynamoDB Local none).
const ACTIVE_WITHIN: Duration = Duration::from_secs(300);

impl DynamoDbStore {
    /// Creates the table the store needs: on-demand capacity, the partition
    /// key (`id`, type S, or the configured name), the sort key of a
    /// [single-table layout](Self::single_table) (type S), and TTL on the expiration
    /// attribute, then waits until it is `ACTIVE` and [verifies](Self::verify)
    /// it. An existing table keeps its key schema and capacity; TTL is
    /// enabled on it when it has none (so a second call racing the first
    /// still finds TTL on); then it is verified. Safe to call from a test
    /// set-up or a script more than once.
    ///
    /// For production, declare the table in your infrastructure code (the
    /// [module docs](super) have SAM, CDK, Terraform and AWS CLI forms). Needs
    /// `dynamodb:CreateTable`, `dynamodb:DescribeTable`,
    /// `dynamodb:UpdateTimeToLive` and what [`verify`](Self::verify) needs.
    ///
    /// ```no_run
    /// # async fn create() -> Result<(), lambda_idempotency::StoreError> {
    /// use lambda_idempotency::DynamoDbStore;
    ///
    /// let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let store = DynamoDbStore::new(aws_sdk_dynamodb::Client::new(&config), "idempotency");
    /// store.create_table().await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_table(&self) -> Result<(), StoreError> {
        let inner = &*self.inner;
        self.check_layout()?;
        let mut keys = vec![(inner.names.id.as_str(), KeyType::Hash)];
        if let KeyLayout::Single(single) = &inner.layout {
            keys.push((single.sort_key(), KeyType::Range));
        }
        let mut create = inner
            .client
            .create_table()
            .table_name(&inner.table)
            .billing_mode(BillingMode::PayPerRequest);
        for (name, key_type) in keys {
            create = create
                .attribute_definitions(
                    AttributeDefinition::builder()
                        .attribute_name(name)
                        .attribute_type(ScalarAttributeType::S)
                        .build()
                        .map_err(invalid)?,
                )
                .key_schema(
                    KeySchemaElement::builder()
                        .attribute_name(name)
                        .key_type(key_type)
                        .build()
                        .map_err(invalid)?,
                );
        }
        let created = create.send().await;
        if let Err(error) = created {
            // An existing table (or our own create, retried after its answer
            // was lost) is verified below like any other.
            let exists = error
                .as_service_error()
                .is_some_and(|e| e.is_resource_in_use_exception());
            if !exists {
                return Err(from_sdk("CreateTable", error));
            }
        }
        inner
            .client
            .wait_until_table_exists()
            .table_name(&inner.table)
            .wait(ACTIVE_WITHIN)
            .await
            .map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Unavailable,
                    format!("table {} did not become ACTIVE: {e}", inner.table),
                )
                .with_source(e)
            })?;
        if self.time_to_live().await?.is_none() {
            inner
                .client
                .update_time_to_live()
                .table_name(&inner.table)
                .time_to_live_specification(
                    TimeToLiveSpecification::builder()
                        .attribute_name(&inner.names.expiration)
                        .enabled(true)
                        .build()
                        .map_err(invalid)?,
                )
                .send()
                .await
                .map_err(|e| from_sdk("UpdateTimeToLive", e))?;
        }
        self.verify().await
    }

    /// Checks, without writing anything, that the table exists, that its key
    /// is the store's (the partition key of type S, and the sort key of type S
    /// of a [single-table layout](Self::single_table)), that the caller may make every
    /// call the store makes, and that TTL deletes expired records. Call it
    /// once in `main`, before serving, to fail a deployment at its first cold
    /// start with the cause in the error rather than answer every request
    /// 500:
    ///
    /// ```no_run
    /// # async fn start() -> Result<(), lambda_idempotency::StoreError> {
    /// # let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    /// let store = lambda_idempotency::DynamoDbStore::new(
    ///     aws_sdk_dynamodb::Client::new(&config),
    ///     "idempotency",
    /// );
    /// store.verify().await?; // e.g. "TTL is not enabled on table idempotency …"
    /// # Ok(()) }
    /// ```
    ///
    /// Each of `PutItem`, `UpdateItem`, `DeleteItem` is probed with a
    /// condition no item can meet, so DynamoDB checks the table, the key and
    /// the permission and then refuses to write (each probe is billed as a
    /// one-unit write); `GetItem` reads an item that never exists. TTL is
    /// read with `DescribeTimeToLive`, and replication with `DescribeTable`
    /// and, for a table it shows without replicas, `DescribeGlobalTable`
    /// (a global table with multi-Region eventual consistency, or a
    /// replicated version 2017.11.29 (legacy) global table, is refused
    /// unless [`single_writer_region`](Self::single_writer_region): see the
    /// module docs, "Global tables"): the three actions beyond the store's
    /// own that the function's role needs for this check.
    ///
    /// Every failure is [`StoreErrorKind::Misconfigured`] with a message
    /// that names the table and the cause (a missing table, a wrong key, a
    /// missing permission with the action, TTL off or on another attribute,
    /// replicas that can each accept a duplicate),
    /// except an outage, which keeps its kind.
    pub async fn verify(&self) -> Result<(), StoreError> {
        let inner = &*self.inner;
        self.check_layout()?;
        let key = inner.layout.key(&inner.names, PROBE_ID);
        let names = HashMap::from([("#id".to_owned(), inner.names.id.clone())]);

        let put = inner
            .client
            .put_item()
            .table_name(&inner.table)
            .set_item(Some(key.clone()))
            .condition_expression(NEVER)
            .set_expression_attribute_names(Some(names.clone()))
            .send()
            .await;
        self.refused_by_condition("PutItem", put)?;
        let update = inner
            .client
            .update_item()
            .table_name(&inner.table)
            .set_key(Some(key.clone()))
            .update_expression("REMOVE #id_probe")
            .condition_expression(NEVER)
            .set_expression_attribute_names(Some(
                names
                    .clone()
                    .into_iter()
                    .chain([("#id_probe".to_owned(), format!("{PROBE_ID}#none"))])
                    .collect(),
            ))
            .send()
            .await;
        self.refused_by_condition("UpdateItem", update)?;
        let delete = inner
            .client
            .delete_item()
            .table_name(&inner.table)
            .set_key(Some(key.clone()))
            .condition_expression(NEVER)
            .set_expression_attribute_names(Some(names))
            .send()
            .await;
        self.refused_by_condition("DeleteItem", delete)?;
        inner
            .client
            .get_item()
            .table_name(&inner.table)
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.explain("GetItem", from_sdk("GetItem", e)))?;

        self.check_description().await?;
        match self.time_to_live().await? {
            Some(attribute) if attribute == inner.names.expiration => Ok(()),
            Some(attribute) => Err(self.misconfigured(format!(
                "TTL on table {} deletes by `{attribute}`, but the records expire by `{}`: \
                 expired records would stay forever. Enable TTL on `{}` (a table has one TTL \
                 attribute), or name the store's expiration attribute `{attribute}` \
                 (AttributeNames::expiration)",
                inner.table, inner.names.expiration, inner.names.expiration
            ))),
            None => Err(self.misconfigured(format!(
                "TTL is not enabled on table {}: expired records are never deleted and the \
                 table grows without end. Enable it on `{}` (aws dynamodb update-time-to-live \
                 --table-name {} --time-to-live-specification \
                 Enabled=true,AttributeName={})",
                inner.table, inner.names.expiration, inner.table, inner.names.expiration
            ))),
        }
    }

    /// A single-table layout DynamoDB would refuse on every call.
    fn check_layout(&self) -> Result<(), StoreError> {
        match self.inner.layout.problem(&self.inner.names) {
            Some(problem) => {
                Err(self.misconfigured(format!("table {}: {problem}", self.inner.table)))
            }
            None => Ok(()),
        }
    }

    /// Checks, with one `DescribeTable` and without writing, that the
    /// table's key is the store's (its partition key, and the sort key of a
    /// [single-table layout](Self::single_table)) and that no index keys
    /// on a record attribute with another type: for tools that read the
    /// records (the operator tool does, before it lists or looks up), where
    /// a wrong layout would otherwise answer "no record". [`verify`](Self::verify)
    /// checks it too.
    pub async fn check_key_schema(&self) -> Result<(), StoreError> {
        self.check_layout()?;
        match self.describe().await? {
            Some(table) => self.check_keys(table.key_schema(), table.attribute_definitions()),
            None => Ok(()),
        }
    }

    /// The table's items and bytes as `DescribeTable` gives them
    /// (`ItemCount`, `TableSizeBytes`): estimates that AWS refreshes about
    /// every six hours (DynamoDB Local's are live), of the whole table (a
    /// single table's other items, every prefix's records, and expired
    /// records TTL has not deleted yet). One control-plane call, no read
    /// units; needs `dynamodb:DescribeTable`.
    pub async fn size(&self) -> Result<TableSize, StoreError> {
        let table = self.describe().await?.ok_or_else(|| {
            StoreError::new(
                StoreErrorKind::Other,
                "DescribeTable answered without the table's description",
            )
        })?;
        let count = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok());
        let size = TableSize::new(
            count(table.item_count()).unwrap_or(0),
            Accuracy::Estimated,
            SizeSource::DescribeTable,
        );
        Ok(match count(table.table_size_bytes()) {
            Some(bytes) => size.bytes(bytes),
            None => size,
        })
    }

    async fn describe(&self) -> Result<Option<TableDescription>, StoreError> {
        let inner = &*self.inner;
        inner
            .client
            .describe_table()
            .table_name(&inner.table)
            .send()
            .await
            .map(|described| described.table)
            .map_err(|e| self.explain("DescribeTable", from_sdk("DescribeTable", e)))
    }

    /// What `DescribeTable` says: the table's key and its indexes' key
    /// types are the store's, and, for a global table, that it keeps the
    /// guarantees (multi-Region strong consistency, or one Region writing
    /// at a time).
    async fn check_description(&self) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let Some(table) = self.describe().await? else {
            return Ok(());
        };
        self.check_keys(table.key_schema(), table.attribute_definitions())?;
        let mut regions: Vec<String> = table
            .replicas()
            .iter()
            .filter_map(|replica| replica.region_name())
            .map(str::to_owned)
            .collect();
        let mut consistency = table.multi_region_consistency();
        // A version 2017.11.29 (legacy) global table shows no replicas in
        // DescribeTable: only DescribeGlobalTable knows it, and it only
        // ever replicates asynchronously.
        let legacy = regions.is_empty();
        if legacy {
            regions = self.legacy_replication_group().await?;
            consistency = None;
        }
        let regions: Vec<&str> = regions.iter().map(String::as_str).collect();
        match replication_risk(&regions, consistency, inner.single_writer_region) {
            ReplicationRisk::None => Ok(()),
            ReplicationRisk::Accepted => {
                tracing::warn!(
                    table = %inner.table,
                    regions = ?regions,
                    "global table with multi-Region eventual consistency: idempotency holds only while \
                     one Region writes records at a time (single_writer_region)"
                );
                Ok(())
            }
            ReplicationRisk::DuplicatesAcrossRegions if legacy => Err(self.misconfigured(format!(
                "table {} is a version 2017.11.29 (legacy) global table replicated to {}: \
                 legacy global tables replicate asynchronously (last writer wins), so a claim \
                 written in one Region does not stop the same key claimed in another before \
                 replication, and a request retried into another Region can run twice. Upgrade \
                 it to version 2019.11.21 and use a table with multi-Region strong consistency \
                 (MRSC), or route every request to one Region at a time and declare it with \
                 DynamoDbStore::single_writer_region()",
                inner.table,
                regions.join(", ")
            ))),
            ReplicationRisk::DuplicatesAcrossRegions => Err(self.misconfigured(format!(
                "table {} is a global table replicated to {} with multi-Region eventual \
                 consistency: a claim written in one Region does not stop the same key claimed \
                 in another before replication (last writer wins), so a request retried into \
                 another Region can run twice. Use a table with multi-Region strong consistency \
                 (MRSC), or route every request to one Region at a time and declare it with \
                 DynamoDbStore::single_writer_region()",
                inner.table,
                regions.join(", ")
            ))),
        }
    }

    /// The Regions of the table's version 2017.11.29 (legacy) global table,
    /// if it belongs to one that replicates (more than its own Region).
    /// An endpoint without legacy global tables has none to replicate to:
    /// DynamoDB Local answers `UnknownOperationException`, and Regions that
    /// never had them (eu-west-3 and later ones) refuse the version with a
    /// `ValidationException` (DescribeTable has found the table by this
    /// name, so the name is not what it refuses).
    async fn legacy_replication_group(&self) -> Result<Vec<String>, StoreError> {
        let inner = &*self.inner;
        let described = inner
            .client
            .describe_global_table()
            .global_table_name(&inner.table)
            .send()
            .await;
        let description = match described {
            Ok(described) => described.global_table_description,
            Err(error) => {
                use aws_sdk_dynamodb::error::ProvideErrorMetadata;
                let none = error.as_service_error().is_some_and(|service| {
                    service.is_global_table_not_found_exception()
                        || matches!(
                            service.code(),
                            Some("UnknownOperationException" | "ValidationException")
                        )
                });
                if none {
                    return Ok(Vec::new());
                }
                return Err(self.explain(
                    "DescribeGlobalTable",
                    from_sdk("DescribeGlobalTable", error),
                ));
            }
        };
        let regions: Vec<String> = description
            .iter()
            .flat_map(|description| description.replication_group())
            .filter_map(|replica| replica.region_name())
            .map(str::to_owned)
            .collect();
        // Its own Region alone replicates nowhere.
        Ok(if regions.len() > 1 {
            regions
        } else {
            Vec::new()
        })
    }

    /// The table's key is the store's, and no index keys on a record
    /// attribute with another type than the store writes (DynamoDB would
    /// refuse every write of a record).
    fn check_keys(
        &self,
        key_schema: &[KeySchemaElement],
        definitions: &[AttributeDefinition],
    ) -> Result<(), StoreError> {
        let inner = &*self.inner;
        let key = |key_type: KeyType| {
            key_schema
                .iter()
                .find(|element| element.key_type() == &key_type)
                .map(|element| element.attribute_name())
        };
        let expected_range = match &inner.layout {
            KeyLayout::OwnPartition => None,
            KeyLayout::Single(single) => Some(single.sort_key()),
        };
        let (hash, range) = (key(KeyType::Hash), key(KeyType::Range));
        if hash != Some(inner.names.id.as_str()) || range != expected_range {
            let actual = match (hash, range) {
                (Some(hash), Some(range)) => {
                    format!("partition key `{hash}` and sort key `{range}`")
                }
                (Some(hash), None) => format!("partition key `{hash}` and no sort key"),
                _ => "unreadable".to_owned(),
            };
            return Err(self.misconfigured(format!(
                "table {}'s key is not what the store needs: it has {actual}, the store needs {}",
                inner.table,
                inner.layout.describe(&inner.names)
            )));
        }
        for definition in definitions {
            let name = definition.attribute_name();
            let Some(written) = self.written_type(name) else {
                continue;
            };
            if definition.attribute_type() != &written {
                return Err(self.misconfigured(format!(
                    "table {} (or one of its indexes) keys on `{name}` as type {}, but the store \
                     writes `{name}` as type {}: DynamoDB would refuse every record. Rename the \
                     store's attribute (AttributeNames) or the index's key",
                    inner.table,
                    definition.attribute_type().as_str(),
                    written.as_str()
                )));
            }
        }
        Ok(())
    }

    /// The type the store writes the attribute `name` as, if it writes it.
    fn written_type(&self, name: &str) -> Option<ScalarAttributeType> {
        let inner = &*self.inner;
        let names = &inner.names;
        let sort_key = match &inner.layout {
            KeyLayout::Single(single) => Some(single.sort_key()),
            KeyLayout::OwnPartition => None,
        };
        if name == names.response || name == names.response_deflate {
            Some(ScalarAttributeType::B)
        } else if [
            &names.expiration,
            &names.lease_until,
            &names.created_at,
            &names.completed_at,
            &names.attempt,
            &names.first_started_at,
        ]
        .iter()
        .any(|number| *number == name)
        {
            Some(ScalarAttributeType::N)
        } else if [&names.id, &names.status, &names.owner, &names.fingerprint]
            .iter()
            .any(|text| *text == name)
            || sort_key == Some(name)
        {
            Some(ScalarAttributeType::S)
        } else {
            None
        }
    }

    /// The attribute TTL deletes by, when TTL is enabled or being enabled.
    async fn time_to_live(&self) -> Result<Option<String>, StoreError> {
        let inner = &*self.inner;
        let described = inner
            .client
            .describe_time_to_live()
            .table_name(&inner.table)
            .send()
            .await
            .map_err(|e| self.explain("DescribeTimeToLive", from_sdk("DescribeTimeToLive", e)))?;
        let Some(description) = described.time_to_live_description() else {
            return Ok(None);
        };
        Ok(match description.time_to_live_status() {
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling) => {
                description.attribute_name().map(str::to_owned)
            }
            _ => None,
        })
    }

    /// A probe must fail on its condition: anything else says what is wrong.
    fn refused_by_condition<O, E: ConditionalError>(
        &self,
        operation: &'static str,
        result: Result<O, SdkError<E, HttpResponse>>,
    ) -> Result<(), StoreError> {
        match conditional(result, operation) {
            Ok(Answer::ConditionFailed(_)) => Ok(()),
            Ok(Answer::Applied) => Err(self.misconfigured(format!(
                "DynamoDB {operation} on table {} met a condition no item can meet: this is \
                 not DynamoDB's conditional-write behaviour (a proxy or an emulator in front?)",
                self.inner.table
            ))),
            Err(error) => Err(self.explain(operation, error)),
        }
    }

    /// Names the cause of a failed check, keeping the SDK's error as source.
    fn explain(&self, operation: &str, error: StoreError) -> StoreError {
        if error.kind() != StoreErrorKind::Misconfigured {
            return error;
        }
        let table = &self.inner.table;
        let text = error.to_string();
        let cause = if text.contains("ResourceNotFoundException") {
            format!(
                "table {table} does not exist (in this account, region and endpoint): create it \
                 with {}",
                self.inner.layout.describe(&self.inner.names)
            )
        } else if text.contains("AccessDenied") {
            format!(
                "the caller may not call dynamodb:{operation} on table {table}: grant it in the \
                 function's role"
            )
        } else if text.contains("ValidationException") && text.contains("key") {
            format!(
                "table {table}'s key is not what the store needs: {}",
                self.inner.layout.describe(&self.inner.names)
            )
        } else {
            format!("DynamoDB {operation} on table {table} was refused")
        };
        // The SDK's error is the source, which `Display` appends: said once.
        StoreError::new(StoreErrorKind::Misconfigured, cause).with_source(error)
    }

    fn misconfigured(&self, message: String) -> StoreError {
        StoreError::new(StoreErrorKind::Misconfigured, message)
    }
}

fn invalid(error: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::new(StoreErrorKind::Misconfigured, error.to_string()).with_source(error)
}

/// What replication means for the guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplicationRisk {
    /// One Region's table, or a global table whose conditional writes are
    /// strongly consistent across Regions (MRSC).
    None,
    /// Eventual consistency across Regions, with one Region writing at a time.
    Accepted,
    /// Eventual consistency across Regions, any of which may write.
    DuplicatesAcrossRegions,
}

fn replication_risk(
    replica_regions: &[&str],
    consistency: Option<&MultiRegionConsistency>,
    single_writer_region: bool,
) -> ReplicationRisk {
    if replica_regions.is_empty() || consistency == Some(&MultiRegionConsistency::Strong) {
        ReplicationRisk::None
    } else if single_writer_region {
        ReplicationRisk::Accepted
    } else {
        ReplicationRisk::DuplicatesAcrossRegions
    }
}

#[cfg(test)]
mod replication_tests {
    use super::*;

    #[test]
    fn only_eventual_consistency_across_regions_is_refused() {
        let eventual = Some(&MultiRegionConsistency::Eventual);
        let strong = Some(&MultiRegionConsistency::Strong);
        let two = ["us-east-1", "eu-west-1"];
        assert_eq!(replication_risk(&[], None, false), ReplicationRisk::None);
        assert_eq!(replication_risk(&two, strong, false), ReplicationRisk::None);
        // Absent: a global table made before MRSC existed is eventual.
        for consistency in [eventual, None] {
            assert_eq!(
                replication_risk(&two, consistency, false),
                ReplicationRisk::DuplicatesAcrossRegions
            );
            assert_eq!(
                replication_risk(&two, consistency, true),
                ReplicationRisk::Accepted
            );
        }
    }
}
