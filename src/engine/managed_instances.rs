//! Lambda Managed Instances: one execution environment serving several
//! invocations at once, none of them stopped at its deadline.
//!
//! In a Lambda function of the default kind, an invocation that reaches its
//! timeout is stopped with its execution environment, so a lease that ends
//! at the deadline ends with the work. Under Managed Instances Lambda marks
//! the invocation failed at its deadline and lets its code run on: its
//! retry can arrive (in another worker of the same process, or another
//! process) while it still runs. A lease that ended at the deadline would
//! then let the retry take the key over beside it, so the engine keeps the
//! lease following the work there ([`EngineBuilder::heartbeat`] on by
//! default).
//!
//! [`EngineBuilder::heartbeat`]: crate::EngineBuilder::heartbeat

/// The environment variable Lambda sets in a Managed Instances execution
/// environment: how many invocations it serves at once
/// (`PerExecutionEnvironmentMaxConcurrency`). `lambda_runtime` and
/// `lambda_http`'s `run_concurrent` read it too.
pub const MAX_CONCURRENCY_VARIABLE: &str = "AWS_LAMBDA_MAX_CONCURRENCY";

/// How many invocations this execution environment serves at once when it
/// is a Lambda Managed Instance ([`MAX_CONCURRENCY_VARIABLE`] is set);
/// `None` elsewhere (a Lambda function of the default kind, a server, a
/// test).
///
/// The count is read as `lambda_runtime` reads it (a positive whole number,
/// nothing around it), so that it is the number of invocations its
/// `run_concurrent` serves at once; any other value still marks a Managed
/// Instance (Lambda sets the variable only there), counted as one, as the
/// runtime then serves one at a time.
///
/// ```
/// // Outside a Managed Instance (as in this doc test):
/// assert_eq!(lambda_idempotency::managed_instances_concurrency(), None);
/// ```
pub fn managed_instances_concurrency() -> Option<u32> {
    concurrency_of(std::env::var(MAX_CONCURRENCY_VARIABLE).ok().as_deref())
}

fn concurrency_of(value: Option<&str>) -> Option<u32> {
    let value = value.filter(|value| !value.is_empty())?;
    Some(value.parse::<u32>().ok().filter(|n| *n > 0).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::concurrency_of;

    #[test]
    fn a_managed_instance_is_told_by_its_variable_alone() {
        assert_eq!(concurrency_of(None), None);
        assert_eq!(concurrency_of(Some("")), None);
        assert_eq!(concurrency_of(Some("8")), Some(8));
        assert_eq!(concurrency_of(Some("64")), Some(64));
        // As lambda_runtime reads it: with spaces, it serves one at a time.
        assert_eq!(concurrency_of(Some(" 8 ")), Some(1));
        assert_eq!(concurrency_of(Some("  ")), Some(1));
        assert_eq!(concurrency_of(Some("1")), Some(1));
        // Set, but not a count the runtime would use: still a Managed
        // Instance, whose invocations outlive their deadlines.
        assert_eq!(concurrency_of(Some("0")), Some(1));
        assert_eq!(concurrency_of(Some("lots")), Some(1));
        assert_eq!(concurrency_of(Some("99999999999")), Some(1));
    }
}
