//! A store error that only an operator can fix (a missing table, a role
//! without a permission, a wrong key schema) is written to the function's
//! log once per process even when no `tracing` subscriber is installed:
//! otherwise a function without one answers 500 to every request with its
//! logs empty. The adapters log every such error through `tracing` as well.

use crate::{Error, StoreErrorKind};
use std::sync::atomic::{AtomicBool, Ordering};

static WRITTEN: AtomicBool = AtomicBool::new(false);

/// Writes the first misconfiguration of this process to stderr (which
/// Lambda sends to CloudWatch), as one JSON line with `"level":"ERROR"` so
/// that Lambda's JSON log format and log-level filters keep it, unless a
/// `tracing` subscriber is there to log it.
pub(super) fn operator_must_act<T, E>(result: &Result<T, Error<E>>) {
    let Err(Error::Store(error)) = result else {
        return;
    };
    if error.kind() != StoreErrorKind::Misconfigured || tracing::dispatcher::has_been_set() {
        return;
    }
    if let Some(line) = first_line(&error.to_string()) {
        eprintln!("{line}");
    }
}

/// The line to write, the first time only.
fn first_line(error: &str) -> Option<String> {
    if WRITTEN.swap(true, Ordering::Relaxed) {
        return None;
    }
    Some(
        serde_json::json!({
            "level": "ERROR",
            "target": "lambda_idempotency",
            "message": "idempotency store misconfigured: every request that needs the store \
                        fails until an operator fixes it (logged once per process; install a \
                        tracing subscriber to see each one)",
            "error": error,
        })
        .to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_is_json_at_error_level_and_written_once() {
        let line = first_line("table t does not exist").expect("the first one");
        let value: serde_json::Value = serde_json::from_str(&line).expect("JSON");
        assert_eq!(value["level"], "ERROR");
        assert_eq!(value["error"], "table t does not exist");
        assert_eq!(first_line("again"), None);
    }
}
