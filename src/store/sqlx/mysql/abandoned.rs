//! Abandoned claims on MySQL, for the completer: as on PostgreSQL
//! (`pg::abandoned`), a page is two statements on the primary key, each
//! bounded by the page's limit: the ids of the next `limit` rows after the
//! cursor, then the abandoned records among them. No other index is
//! needed; a walk reads every row's primary-key entry once.

use super::{
    codec::decode,
    errors::from_sqlx,
    statements::{fill, Literal::*, COLUMNS},
    SqlxMySqlStore,
};
use crate::{
    store::{AbandonedPage, AbandonedQuery, PageCursor},
    StoreError,
};
use sqlx::{Executor, Row};

impl SqlxMySqlStore {
    pub(super) async fn abandoned_page(
        &self,
        query: &AbandonedQuery,
    ) -> Result<AbandonedPage, StoreError> {
        let t = &self.inner.table;
        let after = query.cursor.as_ref().map_or("", |c| c.as_str());
        let limit = u64::try_from(query.limit).unwrap_or(u64::MAX);
        let read = fill(
            &format!(
                "SELECT MAX(id), COUNT(*) FROM (SELECT id FROM `{t}` WHERE id > ? \
                 ORDER BY id LIMIT ?) page"
            ),
            &[Text(after), UInt(limit)],
        );
        let row = (&self.inner.pool)
            .fetch_one(read.as_str())
            .await
            .map_err(|e| from_sqlx("SELECT (list abandoned)", e))?;
        // Bytes: MariaDB types `MAX` of a `utf8mb4_bin` column `VARBINARY`.
        let last: Option<Vec<u8>> = row
            .try_get(0)
            .map_err(|e| from_sqlx("SELECT (list abandoned)", e))?;
        let last = last.map(|id| String::from_utf8_lossy(&id).into_owned());
        let count: i64 = row
            .try_get(1)
            .map_err(|e| from_sqlx("SELECT (list abandoned)", e))?;
        let Some(last) = last else {
            return Ok(AbandonedPage::default());
        };
        let rows = fill(
            &format!(
                "SELECT {COLUMNS} FROM `{t}` WHERE id > ? AND id <= ? \
                 AND LEFT(id, CHAR_LENGTH(?)) = ? AND status = 'IN_PROGRESS' \
                 AND lease_until_ms < ? AND expiration_s >= ? ORDER BY id"
            ),
            &[
                Text(after),
                Text(&last),
                Text(&query.prefix),
                Text(&query.prefix),
                UInt(query.lease_before_ms),
                UInt(query.now_ms / 1000),
            ],
        );
        let rows = (&self.inner.pool)
            .fetch_all(rows.as_str())
            .await
            .map_err(|e| from_sqlx("SELECT (list abandoned)", e))?;
        let records = rows.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        let next =
            (u64::try_from(count).unwrap_or(0) >= limit).then(|| PageCursor::from_stored(last));
        Ok(AbandonedPage::new(records, next))
    }
}
