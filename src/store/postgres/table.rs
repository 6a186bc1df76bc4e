//! Creating and checking the table over tokio-postgres (the DDL and the
//! checks are the PostgreSQL stores' shared ones).

use super::{errors, PostgresStore};
use crate::{
    store::pg::table::{
        shape_error, split_ddl, table_ddl, table_differences, COLUMNS_QUERY, ID_IS_UNIQUE_QUERY,
    },
    StoreError,
};
use deadpool_postgres::Object;
use tokio_postgres::types::Type;

impl PostgresStore {
    /// Creates the table and its expiration index if they are missing (the
    /// DDL in the module docs), then checks the table: one that was already
    /// there with another shape (a column missing or of another type, `id`
    /// not unique, a column of its own that inserts cannot leave empty) is
    /// a [`StoreErrorKind::Misconfigured`](crate::StoreErrorKind::Misconfigured) error naming each difference,
    /// and is left as it is.
    ///
    /// For the partitioned layout ([`PostgresStore::partitioned`]): the
    /// partitioned table (its DDL in the module docs), checked the same
    /// way (a plain table of the name is refused), and its partitions for
    /// today and the days ahead.
    pub async fn create_table(&self) -> Result<(), StoreError> {
        if let Some(partitions) = &self.inner.partitions {
            return self.create_partitioned_table(partitions).await;
        }
        let client = self.client().await?;
        let ddl = table_ddl(&self.inner.table);
        // The table, then its check, then its index: an index is not added to
        // a table of another shape.
        let (create_table, create_index) = split_ddl(&ddl);
        client
            .batch_execute(create_table)
            .await
            .map_err(|e| errors::from_pg("CREATE TABLE", e))?;
        self.check_table(&client).await?;
        client
            .batch_execute(create_index)
            .await
            .map_err(|e| errors::from_pg("CREATE INDEX", e))
    }

    async fn check_table(&self, client: &Object) -> Result<(), StoreError> {
        let table = &self.inner.table;
        let found = columns_of(client, table).await?;
        let id_is_unique: bool = client
            .query_typed(ID_IS_UNIQUE_QUERY, &[(table, Type::TEXT)])
            .await
            .map_err(|e| errors::from_pg("read the table's indexes", e))?
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or(false);

        match shape_error(table, &table_differences(&found, id_is_unique)) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

/// The table's columns as the server has them: name, type, nullable.
pub(super) async fn columns_of(
    client: &Object,
    table: &str,
) -> Result<Vec<(String, String, bool)>, StoreError> {
    let columns = client
        .query_typed(COLUMNS_QUERY, &[(&table, Type::TEXT)])
        .await
        .map_err(|e| errors::from_pg("read the table's columns", e))?;
    Ok(columns
        .iter()
        .filter_map(|row| {
            Some((
                row.try_get(0).ok()?,
                row.try_get(1).ok()?,
                row.try_get(2).ok()?,
            ))
        })
        .collect())
}
