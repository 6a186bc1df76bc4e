//! Recovery points on PostgreSQL over tokio-postgres: a step is one fenced
//! `UPDATE` that appends to the record's `steps` column, read back in
//! order by one `SELECT` (the statements are both PostgreSQL stores',
//! `pg/statements.rs`; `docs/recovery-points.md` says why in the record).

use super::{errors, PostgresStore};
use crate::{
    store::{pg::int8, Conditional, RecordId, RecordedStep, StepWrite},
    StoreError,
};
use tokio_postgres::{
    types::{ToSql, Type},
    Row,
};

impl PostgresStore {
    pub(super) async fn write_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        let (index, now) = (i64::from(step.index), int8(step.now_ms)?);
        let params: [(&(dyn ToSql + Sync), Type); 6] = [
            (&step.id.as_str(), Type::TEXT),
            (&step.owner.as_str(), Type::TEXT),
            (&step.name.as_str(), Type::TEXT),
            (&step.output, Type::BYTEA),
            (&index, Type::INT8),
            (&now, Type::INT8),
        ];
        // The partitioned layout's step also compares the writer's now
        // with the record's expiration, as its completion does.
        let params = match self.inner.partitions {
            Some(_) => &params[..],
            None => &params[..5],
        };
        self.answer(&self.inner.sql.step, params, "UPDATE (step)", &step.id)
            .await
    }

    pub(super) async fn read_steps(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> Result<Vec<RecordedStep>, StoreError> {
        let client = self.client().await?;
        let now_s = int8(now_ms / 1000)?;
        let rows = client
            .query_typed(
                &self.inner.sql.steps,
                &[(&id.as_str(), Type::TEXT), (&now_s, Type::INT8)],
            )
            .await
            .map_err(|e| errors::from_pg("SELECT (steps)", e))?;
        rows.iter().map(|row| decode_step(id, row)).collect()
    }
}

/// A step's row: its name and output columns.
fn decode_step(id: &RecordId, row: &Row) -> Result<RecordedStep, StoreError> {
    RecordedStep::from_columns(
        id,
        row.try_get("name").ok().flatten(),
        row.try_get("output").ok().flatten(),
    )
}
