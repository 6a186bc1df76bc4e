//! Recovery points, as a store keeps them: the outputs of an operation's
//! finished steps, recorded on its `IN_PROGRESS` record so that a takeover
//! resumes after them ([`ClaimHandle::step`](crate::ClaimHandle::step)).
//!
//! A step is one fenced write on the record, like a completion: it lands
//! if and only if the record is still `IN_PROGRESS` under the writer's
//! owner token, so a zombie's late step never lands on its successor's
//! record. The steps live in the record itself, not beside it: they are
//! claimed, taken over, expired and deleted with it, and need no second
//! fence (`docs/recovery-points.md` weighs the two).
//!
//! The capability is optional: [`Store::record_step`](super::Store::record_step)
//! and [`Store::steps`](super::Store::steps) answer
//! [`StoreErrorKind::Unsupported`](crate::StoreErrorKind::Unsupported)
//! unless the store implements them, so a store written before them keeps
//! compiling and working for every operation that records no step.

use super::{OwnerToken, RecordId};

/// A request to record one finished step on a claim's record
/// ([`Store::record_step`](super::Store::record_step)).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StepWrite {
    /// The claimed record.
    pub id: RecordId,
    /// The claim's fencing token.
    pub owner: OwnerToken,
    /// How many steps the record holds before this one: the write lands
    /// only then, so a write retried after it landed (its answer lost)
    /// never records the step twice.
    pub index: u32,
    /// The step's name, unique within the operation.
    pub name: String,
    /// The step's encoded output.
    pub output: Vec<u8>,
    /// The current time, epoch milliseconds.
    pub now_ms: u64,
}

impl StepWrite {
    /// The write of step `name`'s `output`, the `index`-th on `id`'s record
    /// under `owner`, at `now_ms`.
    pub fn new(
        id: RecordId,
        owner: OwnerToken,
        index: u32,
        name: impl Into<String>,
        output: Vec<u8>,
        now_ms: u64,
    ) -> Self {
        Self {
            id,
            owner,
            index,
            name: name.into(),
            output,
            now_ms,
        }
    }
}

/// One step recorded on a record: its name and encoded output.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordedStep {
    /// The step's name.
    pub name: String,
    /// The step's encoded output, as it was written.
    pub output: Vec<u8>,
}

impl RecordedStep {
    /// A step named `name` whose output is `output`: what a store decodes.
    pub fn new(name: impl Into<String>, output: Vec<u8>) -> Self {
        Self {
            name: name.into(),
            output,
        }
    }

    /// A SQL store's step row (a name and an output column, never NULL
    /// unless something else than the store wrote them), or why it is not
    /// one: `CorruptRecord`.
    #[cfg(any(
        feature = "postgres",
        feature = "sqlx-postgres",
        feature = "sqlx-mysql"
    ))]
    pub(crate) fn from_columns(
        id: &RecordId,
        name: Option<String>,
        output: Option<Vec<u8>>,
    ) -> Result<Self, crate::StoreError> {
        match (name, output) {
            (Some(name), Some(output)) => Ok(Self::new(name, output)),
            _ => Err(crate::StoreError::corrupt(format!(
                "record {id}: a step is not a name and an output"
            ))),
        }
    }
}

/// The longest step name, in bytes (UTF-8). A step named longer is
/// refused (`Rejected`) before it runs: with names unbounded, steps within
/// [`StepLimits`] could pass DynamoDB's 400 KB item, and the step whose
/// write failed would have acted first.
pub const MAX_STEP_NAME_BYTES: usize = 256;

/// The bounds on an operation's steps, checked by the engine before any
/// write: a step's encoded output, and how many steps one key records.
///
/// The defaults (16 KiB a step, 16 steps) keep every step of a key within
/// 256 KiB, and with their names (at most [`MAX_STEP_NAME_BYTES`] each)
/// within 260 KiB, so a DynamoDB record holding all of them stays under the
/// item's 400 KB with room for its other attributes. The size is the
/// output's before it is sealed (at-rest encryption): sealing adds at
/// most 1,316 bytes a step (the envelope's 37, a key id and a wrapped key
/// at their longest), 283 KB for 16 steps at the default bounds.
///
/// ```
/// use lambda_idempotency::store::StepLimits;
///
/// let limits = StepLimits::default().max_output_bytes(64 * 1024).max_steps(4);
/// assert_eq!((limits.max_output_bytes, limits.max_steps), (65_536, 4));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepLimits {
    /// The largest encoded output of one step, in bytes.
    pub max_output_bytes: usize,
    /// The most steps one key records.
    pub max_steps: u32,
}

impl StepLimits {
    /// These bounds with `bytes` as the largest encoded output of one step.
    #[must_use]
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// These bounds with `steps` as the most steps one key records.
    #[must_use]
    pub fn max_steps(mut self, steps: u32) -> Self {
        self.max_steps = steps;
        self
    }
}

impl Default for StepLimits {
    fn default() -> Self {
        Self {
            max_output_bytes: 16 * 1024,
            max_steps: 16,
        }
    }
}

#[cfg(all(
    test,
    any(
        feature = "postgres",
        feature = "sqlx-postgres",
        feature = "sqlx-mysql"
    )
))]
mod tests {
    use super::*;

    /// A step row with a NULL column (written by something else than the
    /// store) is a corrupt record, never a step with an empty name or
    /// output.
    #[test]
    fn a_step_row_with_a_null_column_is_corrupt() {
        let id = RecordId::from_stored("p#k");
        let step = RecordedStep::from_columns(&id, Some("charge".into()), Some(b"1".to_vec()));
        assert_eq!(step.unwrap(), RecordedStep::new("charge", b"1".to_vec()));
        for (name, output) in [(None, Some(b"1".to_vec())), (Some("charge".into()), None)] {
            let error = RecordedStep::from_columns(&id, name, output).unwrap_err();
            assert_eq!(error.kind(), crate::StoreErrorKind::CorruptRecord);
            assert!(error.to_string().contains("record p#k"), "{error}");
        }
    }
}
