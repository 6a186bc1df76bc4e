//! Recovery points on MySQL: a step is one fenced `UPDATE` that appends to
//! the record's `steps` column (`JSON`), read back in order through
//! `JSON_TABLE` (`docs/recovery-points.md` says why in the record).

use super::{answered, errors::from_sqlx, int8, statements::fill, Literal::*, SqlxMySqlStore};
use crate::{
    store::{Conditional, RecordId, RecordedStep, StepWrite},
    StoreError,
};
use sqlx::{mysql::MySqlRow, Executor};

impl SqlxMySqlStore {
    pub(super) async fn write_step(&self, step: &StepWrite) -> Result<Conditional, StoreError> {
        let sql = &self.inner.sql;
        let mut connection = self.connection().await?;
        let write = fill(
            &sql.step,
            &[
                Text(&step.name),
                Bytes(&step.output),
                Text(step.id.as_str()),
                Text(step.owner.as_str()),
                UInt(u64::from(step.index)),
            ],
        );
        let written = connection
            .execute(write.as_str())
            .await
            .map_err(|e| from_sqlx("UPDATE (step)", e))?;
        // The list changes with every step: a write that matched changed
        // its row.
        answered(sql, &mut connection, written.rows_affected() > 0, &step.id).await
    }

    pub(super) async fn read_steps(
        &self,
        id: &RecordId,
        now_ms: u64,
    ) -> Result<Vec<RecordedStep>, StoreError> {
        let read = fill(
            &self.inner.sql.steps,
            &[Text(id.as_str()), Int(int8(now_ms / 1000)?)],
        );
        let rows = (&self.inner.pool)
            .fetch_all(read.as_str())
            .await
            .map_err(|e| from_sqlx("SELECT (steps)", e))?;
        rows.iter().map(|row| decode_step(id, row)).collect()
    }
}

/// A step's row: its name and output columns.
fn decode_step(id: &RecordId, row: &MySqlRow) -> Result<RecordedStep, StoreError> {
    use sqlx::Row;
    RecordedStep::from_columns(
        id,
        row.try_get("name").ok().flatten(),
        row.try_get("output").ok().flatten(),
    )
}
