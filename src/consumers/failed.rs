//! [`BatchFailed`]: the error that fails an invocation so that Lambda
//! delivers the batch again.

use super::{RecordStatus, Report};
use std::fmt;

/// Some records of a batch did not complete, and the source takes no
/// partial batch response (Kafka without `ReportBatchItemFailures`, Amazon
/// MQ, SNS, EventBridge), or no record completed and the batch was built
/// with [`fail_on_entire_batch_failure`](super::Batch::fail_on_entire_batch_failure):
/// return it from the handler (`?`) so that the invocation fails and Lambda
/// delivers the batch again. On that delivery the records that completed replay (their
/// handler does not run again) and the others run.
#[derive(Debug, Clone)]
pub struct BatchFailed {
    report: Report,
}

impl BatchFailed {
    pub(crate) fn new(report: Report) -> Self {
        Self { report }
    }

    /// What became of each record.
    pub fn report(&self) -> &Report {
        &self.report
    }
}

impl fmt::Display for BatchFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let report = &self.report;
        let failed: Vec<String> = report.failed().collect();
        let held_back = report.count(RecordStatus::HeldBack);
        write!(
            f,
            "{} of {} {} records failed",
            failed.len(),
            report.records.len(),
            report.source
        )?;
        const SHOWN: usize = 5;
        let shown: Vec<&str> = failed
            .iter()
            .take(SHOWN)
            .map(|id| if id.is_empty() { "(no id)" } else { id })
            .collect();
        write!(f, " ({}", shown.join(", "))?;
        if failed.len() > SHOWN {
            write!(f, ", …")?;
        }
        write!(f, ")")?;
        if held_back > 0 {
            write!(f, " and {held_back} were held back behind them")?;
        }
        write!(
            f,
            "; the invocation fails so that Lambda delivers the batch again, \
             where the records that completed replay"
        )
    }
}

impl std::error::Error for BatchFailed {}
