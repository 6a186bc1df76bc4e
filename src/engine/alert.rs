//! A store error that only an operator can fix (a missing table, a role
//! without a permission, a wrong key schema), and the first outage (a
//! store that cannot be reached: a wrong port, a security group), are
//! written to the function's log once per process each, even when no
//! `tracing` subscriber is installed: otherwise a function without one
//! answers 500 or 503 to every request with its logs empty. The adapters
//! log every such error through `tracing` as well.

use crate::{Error, StoreErrorKind};
use std::sync::atomic::{AtomicBool, Ordering};

/// What an operator is told, once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alert {
    Misconfigured,
    Outage,
}

static MISCONFIGURED_WRITTEN: AtomicBool = AtomicBool::new(false);
static OUTAGE_WRITTEN: AtomicBool = AtomicBool::new(false);

impl Alert {
    fn of(kind: StoreErrorKind) -> Option<Self> {
        match kind {
            StoreErrorKind::Misconfigured => Some(Alert::Misconfigured),
            kind if kind.is_transient() => Some(Alert::Outage),
            _ => None,
        }
    }

    fn written(self) -> &'static AtomicBool {
        match self {
            Alert::Misconfigured => &MISCONFIGURED_WRITTEN,
            Alert::Outage => &OUTAGE_WRITTEN,
        }
    }

    fn message(self) -> &'static str {
        match self {
            Alert::Misconfigured => {
                "idempotency store misconfigured: every request that needs the store fails until \
                 an operator fixes it (logged once per process; install a tracing subscriber to \
                 see each one)"
            }
            Alert::Outage => {
                "idempotency store unavailable: requests that need the store are refused (503, \
                 nothing run) until it answers; if this persists, check its address, port and \
                 network access (logged once per process; install a tracing subscriber to see \
                 each one)"
            }
        }
    }
}

/// Writes the first misconfiguration, and the first outage, of this
/// process to stderr (which Lambda sends to CloudWatch), as one JSON line
/// each with `"level":"ERROR"` so that Lambda's JSON log format and
/// log-level filters keep it, unless a `tracing` subscriber is there to
/// log it.
pub(super) fn operator_must_act<T, E>(result: &Result<T, Error<E>>) {
    let Err(Error::Store(error)) = result else {
        return;
    };
    let Some(alert) = Alert::of(error.kind()) else {
        return;
    };
    if tracing::dispatcher::has_been_set() {
        return;
    }
    if let Some(line) = first_line(alert, alert.written(), &error.to_string()) {
        eprintln!("{line}");
    }
}

/// The line to write, the first time only (`written` says whether it was).
fn first_line(alert: Alert, written: &AtomicBool, error: &str) -> Option<String> {
    if written.swap(true, Ordering::Relaxed) {
        return None;
    }
    Some(
        serde_json::json!({
            "level": "ERROR",
            "target": "lambda_idempotency",
            "message": alert.message(),
            "error": error,
        })
        .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_line_is_json_at_error_level_and_written_once() {
        assert_eq!(Alert::of(StoreErrorKind::Throttled), Some(Alert::Outage));
        assert_eq!(Alert::of(StoreErrorKind::Unavailable), Some(Alert::Outage));
        assert_eq!(Alert::of(StoreErrorKind::Rejected), None);
        // Flags of their own: other tests in this process raise alerts.
        let (misconfigured, outage) = (AtomicBool::new(false), AtomicBool::new(false));
        let line = first_line(
            Alert::Misconfigured,
            &misconfigured,
            "table t does not exist",
        )
        .expect("the first");
        let value: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(value["level"], "ERROR");
        assert_eq!(value["error"], "table t does not exist");
        assert_eq!(
            first_line(Alert::Misconfigured, &misconfigured, "again"),
            None
        );

        // An outage has a line of its own, once too.
        let line = first_line(Alert::Outage, &outage, "refused").expect("the first outage");
        let value: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert!(
            value["message"].as_str().unwrap().contains("unavailable"),
            "{line}"
        );
        assert_eq!(first_line(Alert::Outage, &outage, "again"), None);
    }
}
