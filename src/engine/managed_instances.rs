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

/// How many store transactions this process may hold open at once when
/// each invocation runs `per_invocation` of them (at least one): one
/// invocation at a time, or a Managed Instance's count.
#[cfg_attr(not(any(feature = "http", feature = "consumers")), allow(dead_code))]
pub(crate) fn transactions_at_once(per_invocation: usize) -> usize {
    at_once(managed_instances_concurrency(), per_invocation)
}

#[cfg_attr(not(any(feature = "http", feature = "consumers")), allow(dead_code))]
fn at_once(invocations: Option<u32>, per_invocation: usize) -> usize {
    let invocations = invocations.map_or(1, |n| n as usize);
    invocations.saturating_mul(per_invocation.max(1))
}

fn concurrency_of(value: Option<&str>) -> Option<u32> {
    let value = value.filter(|value| !value.is_empty())?;
    Some(value.parse::<u32>().ok().filter(|n| *n > 0).unwrap_or(1))
}

#[cfg(test)]
mod tests {
    use super::{at_once, concurrency_of};

    #[test]
    fn the_transactions_open_at_once_are_the_invocations_times_each_ones() {
        // A function of the default kind: one invocation, one transaction.
        assert_eq!(at_once(None, 1), 1);
        // Managed Instances: eight invocations at once.
        assert_eq!(at_once(Some(8), 1), 8);
        // A batch of eight records at once, in each of eight invocations.
        assert_eq!(at_once(Some(8), 8), 64);
        assert_eq!(at_once(None, 0), 1, "a batch counts at least one");
        assert_eq!(at_once(Some(u32::MAX), usize::MAX), usize::MAX);
    }

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
