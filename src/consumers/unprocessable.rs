//! What a batch does with a record that cannot be processed as it is, and
//! never will be: delivered again (the default), or given up as final.

use std::fmt;

/// What a [`Batch`](super::Batch) does with a record it cannot process as
/// it is, however often it comes: one whose key was already used with
/// another payload, one without the fields its key is made of (or whose
/// key closure panicked), and one whose fingerprint cannot be computed
/// (a body the fingerprint closure cannot read).
///
/// | | `Redeliver` (default) | `Final` |
/// |---|---|---|
/// | the record | reported as failed: delivered again | reported as done: not delivered again |
/// | SQS | retried until `maxReceiveCount` moves it to the dead-letter queue | deleted with the batch |
/// | a FIFO message group, a shard, a partition | held up behind it until then | goes on with the next record |
/// | seen as | a WARN or ERROR line per delivery | one ERROR line (`outcome="unprocessable_final"`, the record's id, the reason) and, with [`metrics`](super::Batch::metrics), an `UnprocessableRecords` count |
///
/// Choose `Final` when such a record must not hold up the ones after it (a
/// FIFO group, a stream shard) and the ERROR line or metric is where you
/// look for them; keep `Redeliver` when a dead-letter queue is where such
/// messages are inspected and replayed, since `Final` records never reach
/// it. Powertools behaves as `Redeliver`.
///
/// Nothing transient is ever final: a handler's error, a key in progress
/// elsewhere, a store outage, a record Powertools holds in progress are
/// delivered again whatever this says.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unprocessable {
    /// Fail the record, so that it is delivered again (and, on SQS, ends
    /// in the dead-letter queue).
    #[default]
    Redeliver,
    /// Report it as done, with an ERROR line and a metric: it is not
    /// delivered again, and the records after it go on.
    Final,
}

/// Why a record cannot be processed as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    /// Its key was used before with another payload.
    KeyReused,
    /// It has none of the fields its key is made of.
    KeyMissing,
    /// Its fingerprint cannot be computed.
    Unreadable,
}

impl Reason {
    /// A stable snake_case name: a log field and the metric's dimension.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::KeyReused => "key_reused",
            Reason::KeyMissing => "key_missing",
            Reason::Unreadable => "unreadable",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
