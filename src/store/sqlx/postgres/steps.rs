//! Recovery points on PostgreSQL over sqlx: the same statements as the
//! tokio-postgres store's (`pg/statements.rs`), so both drivers read and
//! write one table's steps alike.

use super::{
    codec,
    query::Value::{Bytes, Int8, Text},
    SqlxPostgresStore,
};
use crate::{
    store::{pg::int8, Conditional, RecordId, RecordedStep, StepWrite},
    StoreError,
};
use sqlx::postgres::PgRow;

impl SqlxPostgresStore {
    pub(super) async fn write_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        let values = [
            Text(step.id.as_str()),
            Text(step.owner.as_str()),
            Text(step.name.as_str()),
            Bytes(step.output.as_slice()),
            Int8(i64::from(step.index)),
            Int8(int8(step.now_ms)?),
        ];
        // The partitioned layout's step also compares the writer's now
        // with the record's expiration, as its completion does.
        let values = match self.inner.partitions {
            Some(_) => &values[..],
            None => &values[..5],
        };
        self.answer(&self.inner.sql.step, values, "UPDATE (step)", &step.id)
            .await
    }

    pub(super) async fn read_steps(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> Result<Vec<RecordedStep>, StoreError> {
        let values = [Text(id.as_str()), Int8(int8(now_ms / 1000)?)];
        let rows = self
            .rows(&self.inner.sql.steps, &values, "SELECT (steps)")
            .await?;
        rows.iter().map(|row| decode_step(id, row)).collect()
    }
}

/// A step's row: a name and an output (in either format a row comes in),
/// never NULL unless the column was written by something else than the
/// store.
fn decode_step(id: &RecordId, row: &PgRow) -> Result<RecordedStep, StoreError> {
    use sqlx::Row;
    let corrupt =
        || StoreError::corrupt(format!("record {id}: a step is not a name and an output"));
    let name: Option<String> = row.try_get("name").map_err(|e| corrupt().with_source(e))?;
    RecordedStep::from_columns(id, name, codec::bytea(row, "output")?)
}
