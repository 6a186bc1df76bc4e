//! Abandoned claims on Redis, for the completer: a page is one `SCAN`
//! (`MATCH` the prefix, `COUNT` the page's limit) and an `HGETALL` of each
//! key it returned, filtered in the process. On a cluster, the primaries
//! are walked one after another, in address order.
//!
//! Redis keeps no index of records by status or lease, so a walk reads
//! every record under the prefix once. `SCAN`'s `COUNT` is a hint (a call
//! may return a few more keys, or none); the keys a call returned past the
//! page's limit are carried in the cursor and read first by the next
//! page, so a page never holds more than its limit. `SCAN` may return a
//! key twice in one walk, and a key that moved slot during a resharding
//! may be missed: the completer's writes are fenced, and its next run
//! finds what it missed.

use super::{codec::decode, codec::glob_escape, RedisStore};
use crate::{
    store::{AbandonedPage, AbandonedQuery, PageCursor},
    StoreError, StoreErrorKind,
};
use serde::{Deserialize, Serialize};

/// Where a walk is: the node (`None`: the one server) and its `SCAN`
/// cursor, and the keys a call returned that no page has read yet.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Walk {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    #[serde(default)]
    scan: u64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    keys: Vec<String>,
    /// The `SCAN`s are over: only `keys` are left.
    #[serde(default)]
    scanned: bool,
}

impl RedisStore {
    pub(super) async fn abandoned_page(
        &self,
        query: &AbandonedQuery,
    ) -> Result<AbandonedPage, StoreError> {
        let mut walk = match &query.cursor {
            None => Walk::default(),
            Some(cursor) => serde_json::from_str(cursor.as_str()).map_err(|_| {
                StoreError::new(
                    StoreErrorKind::Rejected,
                    format!("{:?} is not a cursor of this store's", cursor.as_str()),
                )
            })?,
        };
        let mut keys = std::mem::take(&mut walk.keys);
        if keys.is_empty() && !walk.scanned {
            let pattern = format!(
                "{}{}*",
                glob_escape(&self.inner.namespace),
                glob_escape(&query.prefix)
            );
            let mut leased = self.leased().await?;
            let step = leased
                .connection
                .scan_once(&pattern, walk.node.as_deref(), walk.scan, query.limit)
                .await?;
            keys = step.keys;
            match step.next {
                Some((node, scan)) => (walk.node, walk.scan) = (node, scan),
                None => walk.scanned = true,
            }
        }
        let mut records = Vec::new();
        let mut keys = keys.into_iter();
        for key in keys.by_ref() {
            let fields = self.hgetall(&key).await?;
            if let Some(record) = decode(&fields)? {
                if query.matches(&record) {
                    records.push(record);
                }
            }
            if records.len() == query.limit {
                break;
            }
        }
        walk.keys = keys.collect();
        let next = if walk.scanned && walk.keys.is_empty() {
            None
        } else {
            let cursor = serde_json::to_string(&walk).map_err(|error| {
                StoreError::new(StoreErrorKind::Other, format!("a cursor: {error}"))
            })?;
            Some(PageCursor::from_stored(cursor))
        };
        Ok(AbandonedPage::new(records, next))
    }
}
